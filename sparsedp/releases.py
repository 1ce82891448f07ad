"""One release model: every release path returns, or converts to, a :class:`ReleaseResult`.

As ``scipy.optimize`` returns one ``OptimizeResult`` from every minimiser, every sparsedp release
(the matrix mechanism, the tree histograms, marginals, Kronecker releases, the restaurant and flow
releases, the chunked scale-out releases, the continual counters) converts to one frozen record
with ``.to_release()``, and :func:`load_release` reads every release file the library writes back
into one.  What every release has:

* ``answers``: the released values, one 1-D array (a memory-mapped ``.npy`` for a chunked release);
* ``labels``: what each answer is, as columns of the same length (``bin``; ``lo`` / ``hi``
  inclusive ranges; a marginal's attributes; ``day`` and ``item``; ``part`` and ``id`` of a flow
  variable; ...);
* ``variances``: each answer's variance, exact for the noise drawn (``variance_method`` says how it
  was computed; ``"bound"`` marks a guaranteed upper bound), or ``None`` when unknown;
  ``covariance``: the answers' covariance as an operator, where the release has one;
* :meth:`ReleaseResult.confidence_intervals` ``(level=0.95, method="auto")``: ``(lower, upper)``
  through :meth:`sparsedp.accuracy.ErrorReport.confidence_intervals` (the same signature for every
  kind);
* ``strategy`` (what was measured, in words), ``ledger`` (one dict per measurement, the
  :class:`~sparsedp.privacy.LedgerEntry` fields), ``private``, ``kind``, ``noise``, ``secure``,
  ``description`` (public parameters) and ``arrays`` (other released arrays: an estimate, a tree);
* :meth:`ReleaseResult.save` and :meth:`ReleaseResult.to_pandas` (one row per answer: the label
  columns, ``answer``, ``variance``, ``lower`` and ``upper`` at 95%).

File layouts (both carry the same ``__sparsedp__`` record of :mod:`sparsedp.release_file`, whose
``model`` names the answers' array, the labels and the variances):

* ``.npz`` (every in-memory release): the arrays and the record;
* a ``.npy`` or ``.zarr`` array of the answers (a chunked release, written block by block) with the
  record in ``ARRAY.release.json`` next to it.  Its labels are the axes of the array and its
  variances one constant (a guaranteed bound) or none.

Files written by earlier versions (no ``model``) load too: histogram, matrix-mechanism,
restaurant, flows, completion and spec ``.npz`` files, the chunked ``.release.json`` files, and the
marginals command's JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ._tails import ErrorShape
from .errors import SparseDPError
from .noise import discrete_laplace_variance
from .release_file import FORMAT, ReleaseFile, load_release_file, release_record, save_release
from .safe_files import open_zarr, refuse_existing, resolve_inside

__all__ = [
    "AxisLabel",
    "ReleaseMethods",
    "ReleaseResult",
    "SIDE_SUFFIX",
    "axis_labels",
    "load_release",
    "register_reader",
    "workload_labels",
]

#: The record of a chunked release: ``OUT.npy`` / ``OUT.zarr`` has its record in ``OUT.release.json``.
SIDE_SUFFIX = ".release.json"
#: Completion releases are loaded as their ``left @ right.T`` entries up to this many.
MAX_COMPLETION_ENTRIES = 2**24
_VARIANCES = "variances"
_LABEL = "label."


# -- labels ----------------------------------------------------------------------------------------


class AxisLabel:
    """A label column that is the index along one axis of the answers' array, flattened in C order
    (``shape``; ``values``: the names of the indices, e.g. the items; ``None``: the index itself).
    Nothing of length ``prod(shape)`` is stored: ``np.asarray(label)`` builds the column."""

    def __init__(self, shape: Sequence[int], axis: int, values: Sequence[Any] | None = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.axis = int(axis)
        if not 0 <= self.axis < len(self.shape):
            raise SparseDPError(f"axis {axis} of an array of shape {self.shape}")
        self.values = None if values is None else list(values)
        if self.values is not None and len(self.values) != self.shape[self.axis]:
            raise SparseDPError(f"{len(self.values)} values for an axis of length {self.shape[self.axis]}")

    def __len__(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def _index(self, flat: np.ndarray) -> np.ndarray:
        inner = int(np.prod(self.shape[self.axis + 1:], dtype=np.int64))
        return (flat // inner) % self.shape[self.axis]

    def __getitem__(self, key: Any) -> Any:
        idx = self._index(np.arange(len(self))[key])
        return idx if self.values is None else np.asarray(self.values)[idx]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def spec(self) -> dict[str, Any]:
        """The JSON form kept in a file's ``model``."""
        return {"axis": self.axis} if self.values is None else {"axis": self.axis, "values": self.values}

    def __repr__(self) -> str:
        return f"AxisLabel(shape={self.shape}, axis={self.axis}{'' if self.values is None else ', values=...'})"


def axis_labels(shape: Sequence[int], names: Sequence[str], values: Mapping[str, Sequence[Any]] | None = None
                ) -> dict[str, AxisLabel]:
    """One :class:`AxisLabel` per axis of an answers array of ``shape`` (``names[i]`` for axis
    ``i``; ``values[name]``: that axis' index names)."""
    if len(names) != len(shape):
        raise SparseDPError(f"{len(names)} label names for an array of {len(shape)} axes")
    values = values or {}
    return {name: AxisLabel(shape, i, values.get(name)) for i, name in enumerate(names)}


def workload_labels(W: Any) -> dict[str, Any]:
    """What each answer of workload ``W`` is: ``lo`` / ``hi`` (inclusive, 0-based) for range
    workloads (prefix, all ranges, range lists, total), ``bin`` for the identity, else the row
    index ``query``."""
    from .workloads import AllRangesWorkload, PrefixWorkload, RangeQueriesWorkload

    m, n = (int(s) for s in W.shape)
    if isinstance(W, PrefixWorkload):
        return {"lo": np.zeros(m, dtype=np.int64), "hi": np.arange(m, dtype=np.int64)}
    if isinstance(W, AllRangesWorkload):
        a, b = np.triu_indices(W.n + 1, k=1)
        return {"lo": a.astype(np.int64), "hi": (b - 1).astype(np.int64)}
    if isinstance(W, RangeQueriesWorkload):
        return {"lo": np.asarray(W.lo, dtype=np.int64).copy(), "hi": np.asarray(W.hi, dtype=np.int64).copy()}
    structure = getattr(W, "structure", None)
    if structure == "identity" and m == n:
        return axis_labels((m,), ["bin"])
    if structure == "total" and m == 1:
        return {"lo": np.zeros(1, dtype=np.int64), "hi": np.full(1, n - 1, dtype=np.int64)}
    return axis_labels((m,), ["query"])


# -- the record ------------------------------------------------------------------------------------


def _ledger_tuple(ledger: Any) -> tuple[dict[str, Any], ...]:
    if ledger is None:
        return ()
    items = ledger if isinstance(ledger, (list, tuple)) else (ledger,)
    out = []
    for e in items:
        if e is None:
            continue
        out.append(e.as_dict() if hasattr(e, "as_dict") else dict(e))
    return tuple(out)


def _length(answers: Any) -> int:
    shape = getattr(answers, "shape", None)
    if shape is None or len(shape) != 1:
        raise SparseDPError(f"a release's answers are one 1-D array, got shape {shape}")
    return int(shape[0])


def _constant(v: Any) -> float | None:
    """The value of a variance array that is one constant broadcast (a bound), else ``None``."""
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.size and v.strides == (0,):
        return float(v[0])
    return None


def _own_intervals(report: Any) -> bool:
    """Whether ``report`` computes its intervals otherwise than ``answer -+ half-width`` (it
    overrides :meth:`ErrorReport.confidence_intervals <sparsedp.accuracy.ErrorReport.confidence_intervals>`,
    as a TopDown release's report of its published counts does)."""
    from .accuracy import ErrorReport

    own = getattr(type(report), "confidence_intervals", None)
    return own is not None and own is not ErrorReport.confidence_intervals


@dataclass(frozen=True, eq=False)
class ReleaseResult:
    """A release: labelled answers, their variances, the strategy, the ledger (module docstring).

    Made by every release class's ``.to_release()`` and by :func:`load_release`; ``source`` is
    the object it was made from (``None`` when loaded from a file, except histogram files, whose
    :class:`~sparsedp.trees.HistogramRelease` answers any range), ``report`` the
    :class:`~sparsedp.accuracy.ErrorReport` that source computed (its intervals then use what the
    source knows beyond the variances), ``path`` the file it was loaded from."""

    kind: str
    answers: Any
    labels: Mapping[str, Any] = field(default_factory=dict)
    variances: np.ndarray | None = field(default=None, repr=False)
    noise: str | None = None
    secure: bool = True
    strategy: str = ""
    ledger: tuple = ()
    private: bool = True
    description: Mapping[str, Any] = field(default_factory=dict, repr=False)
    arrays: Mapping[str, Any] = field(default_factory=dict, repr=False)
    variance_method: str | None = None
    covariance: Any = field(default=None, repr=False)
    report: Any = field(default=None, repr=False)
    source: Any = field(default=None, repr=False)
    path: str | None = None
    error_shape: Any = field(default=None, repr=False)  # saved ErrorShape of a loaded release (its intervals)

    def __post_init__(self) -> None:
        n = _length(self.answers)
        labels = dict(self.labels) if self.labels else axis_labels((n,), ["index"])
        for name, col in labels.items():
            if not isinstance(col, AxisLabel):
                col = np.asarray(col)
                labels[name] = col
            if len(col) != n or (isinstance(col, np.ndarray) and col.ndim != 1):
                raise SparseDPError(f"label {name!r} has {len(col)} entries for {n} answers")
        object.__setattr__(self, "labels", labels)
        if self.variances is not None:
            v = self.variances
            if not isinstance(v, np.ndarray) or v.dtype != np.float64:
                v = np.asarray(v, dtype=np.float64)
            if v.ndim == 0:
                v = np.broadcast_to(v, (n,))
            if v.shape != (n,):
                raise SparseDPError(f"{v.shape} variances for {n} answers")
            object.__setattr__(self, "variances", v)
        ledger = _ledger_tuple(self.ledger)
        object.__setattr__(self, "ledger", ledger)
        if not ledger or any(e.get("private") is False for e in ledger):
            # no measurement recorded: nothing says noise was added, so it is not reported private
            object.__setattr__(self, "private", False)
        object.__setattr__(self, "description", dict(self.description or {}))
        object.__setattr__(self, "arrays", dict(self.arrays or {}))

    def __len__(self) -> int:
        return _length(self.answers)

    def to_release(self) -> "ReleaseResult":
        """This release (every release class has ``to_release``)."""
        return self

    @property
    def epsilon(self) -> float:
        """Total pure-DP epsilon of the ledger (sequential composition)."""
        return float(sum(e.get("epsilon") or 0.0 for e in self.ledger))

    @property
    def rho(self) -> float:
        """Total zCDP rho of the ledger."""
        return float(sum(e.get("rho") or 0.0 for e in self.ledger))

    @property
    def exact_disclosures(self) -> tuple[dict, ...]:
        """What the release publishes exactly, NOT under differential privacy (a TopDown invariant:
        ``{"what": "state:total", "units": 50, "values": 50, ...}``), as its description records it;
        empty for a release that publishes nothing exactly.  ``private`` speaks of the noise only."""
        return tuple(dict(d) for d in (self.description.get("exact_disclosures") or ()))

    # -- accuracy ------------------------------------------------------------------------------
    def error_report(self) -> Any:
        """The answers' :class:`~sparsedp.accuracy.ErrorReport`: the source's, or one made from
        :attr:`variances` with the release's noise."""
        if self.report is not None:
            return self.report
        make = getattr(self.source, "error_report", None)
        if make is not None:  # a file's source object (a histogram): what it knows beyond the variances
            try:
                rep = make()
            except SparseDPError:
                rep = None
            if rep is not None and rep.variances is not None and np.shape(rep.variances) == (len(self),):
                object.__setattr__(self, "report", rep)  # computed once
                return rep
        if self.variances is None:
            why = f" ({self.variance_method})" if self.variance_method else ""
            raise SparseDPError(f"this {self.kind} release has no per-answer variances{why}")
        from .accuracy import ErrorReport

        var = np.asarray(self.variances, dtype=np.float64)
        total = float(var.sum())
        return ErrorReport(total, total / max(var.size, 1), self.variance_method or "stored", variances=var,
                           noise=self.noise, secure=bool(self.secure), shape=self.error_shape)

    def _shape_to_save(self) -> Any:
        """The :class:`~sparsedp.accuracy.ErrorShape` the intervals use (saved with the release, so
        that a loaded release gives the same intervals), or ``None``."""
        if self.variances is None:
            return None
        try:
            return self.error_report().error_shape()
        except SparseDPError:
            return None

    def confidence_intervals(self, level: float = 0.95, method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around every answer at confidence ``level``:
        :meth:`ErrorReport.confidence_intervals <sparsedp.accuracy.ErrorReport.confidence_intervals>`
        (``method``: ``"auto"`` or any method named there).  With ``variance_method="bound"`` the
        variances are upper bounds and the intervals conservative."""
        return self.error_report().confidence_intervals(np.asarray(self.answers, dtype=np.float64), level, method)

    # -- tables ----------------------------------------------------------------------------------
    def table(self, level: float = 0.95, method: str = "auto", rows: Any = None) -> dict[str, np.ndarray]:
        """The columns of :meth:`to_pandas` as arrays (``rows``: a slice or index array of the
        answers; all by default); ``variance``, ``lower`` and ``upper`` are ``nan`` when the
        release has no variances.  ``lower`` / ``upper`` are :meth:`confidence_intervals`'
        ends: ``answer -+ half-width``, or, when the release's report gives its own intervals
        (a TopDown release: integer, never below 0, for the published counts --
        :mod:`sparsedp.topdown.intervals`), those."""
        sel = slice(None) if rows is None else rows
        out: dict[str, np.ndarray] = {}
        for name, col in self.labels.items():
            out[name if name not in ("answer", "variance", "lower", "upper") else f"label_{name}"] = (
                np.asarray(col[sel]))
        ans = np.asarray(self.answers[sel], dtype=np.float64)
        out["answer"] = ans
        nan = np.full(ans.shape, np.nan)
        out["variance"], out["lower"], out["upper"] = nan, nan.copy(), nan.copy()
        try:
            rep = self.error_report()
        except SparseDPError:  # no variances: nan
            return out
        out["variance"] = np.asarray(rep.variances, dtype=np.float64)[sel]
        try:
            if _own_intervals(rep):  # intervals that are not answer -+ half-width: all answers, then the rows
                lo, hi = rep.confidence_intervals(np.asarray(self.answers, dtype=np.float64), level, method)
                out["lower"], out["upper"] = np.asarray(lo)[sel], np.asarray(hi)[sel]
                return out
            half = np.asarray(rep.half_widths(level, method), dtype=np.float64)[sel]
        except SparseDPError:  # e.g. the noise is not known: no interval
            return out
        out["lower"], out["upper"] = ans - half, ans + half
        return out

    def to_pandas(self, level: float = 0.95, method: str = "auto") -> Any:
        """One row per answer: the label columns, ``answer``, ``variance``, and the ``lower`` /
        ``upper`` ends of its interval at ``level`` (``nan`` without variances).  Needs pandas.
        A release whose source publishes a table of units (a TopDown release: one row per
        geographic unit, its level and codes, one column per cell) gives that table instead;
        :meth:`table` stays one row per answer."""
        units = getattr(self.source, "unit_table", None)
        if callable(units):
            return units()
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - the io extra
            raise SparseDPError("to_pandas needs pandas: pip install 'sparsedp[io]'") from exc
        return pd.DataFrame(self.table(level, method))

    # -- files -----------------------------------------------------------------------------------
    def _model(self) -> dict[str, Any]:
        return {"noise": self.noise, "secure": bool(self.secure), "strategy": self.strategy,
                "variance_method": self.variance_method}

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the release: an ``.npz`` release file (any other suffix than ``.npy`` / ``.zarr``
        is written as one), or for ``.npy`` / ``.zarr`` the answers as that array (skipped when
        they already are that file: a chunked release) and the record in ``PATH.release.json``.
        The array layout holds no label or variance arrays: labels must be axes
        (:class:`AxisLabel`) and the variances none or one constant; save anything else as
        ``.npz``.  A file that exists already is replaced only with ``overwrite=True`` (else
        :class:`~sparsedp.errors.ReleaseExistsError`, nothing written), as the command line
        replaces one only with ``--force``.  Returns the path written."""
        p = Path(path)
        if p.suffix in (".npy", ".zarr"):
            return self._save_array(p, overwrite)
        arrays = dict(self.arrays)
        model = self._model()
        key = next((k for k, v in arrays.items() if v is self.answers), None)
        if key is None:
            key = "answers"
            if key in arrays:
                raise SparseDPError("the release's arrays hold another 'answers'")
            arrays[key] = np.asarray(self.answers)
        model["answers"] = key
        model["labels"] = {}
        shape = None
        for name, col in self.labels.items():
            if isinstance(col, AxisLabel):
                model["labels"][name] = col.spec()
                shape = col.shape
            else:
                arrays[_LABEL + name] = np.asarray(col)
                model["labels"][name] = _LABEL + name
        if shape is not None:
            model["shape"] = list(shape)
        const = _constant(self.variances)
        if self.variances is None:
            model["variances"] = None
        elif const is not None:
            model["variances"] = {"constant": const}
        else:
            if _VARIANCES in arrays and arrays[_VARIANCES] is not self.variances:
                raise SparseDPError("the release's arrays hold another 'variances'")
            arrays[_VARIANCES] = self.variances
            model["variances"] = _VARIANCES
        shape_spec = _shape_spec(self._shape_to_save(), arrays)
        if shape_spec is not None:
            model["error_shape"] = shape_spec
        return save_release(p, self.kind, arrays, ledger=self.ledger, description=dict(self.description),
                            private=self.private, model=model, overwrite=overwrite)

    def _save_array(self, p: Path, overwrite: bool) -> Path:
        n = len(self)
        shapes = {col.shape for col in self.labels.values() if isinstance(col, AxisLabel)}
        if any(not isinstance(col, AxisLabel) for col in self.labels.values()) or len(shapes) > 1:
            raise SparseDPError(f"{p.name}: the labels of this {self.kind} release are not the axes of one array: "
                                "save it as .npz")
        shape = shapes.pop() if shapes else (n,)
        const = _constant(self.variances)
        if self.variances is not None and const is None:
            raise SparseDPError(f"{p.name}: this {self.kind} release has one variance per answer: save it as .npz "
                                "(a .npy / .zarr release holds the answers and a constant variance bound only)")
        side = Path(str(p) + SIDE_SUFFIX)
        own = self.path is not None and _same_path(self.path, p)  # a chunked release's own array: kept
        refuse_existing([side] if own else [p, side], overwrite)
        if not own:
            _write_array(p, self.answers, shape)
        model = self._model()
        model.update(answers=p.name, shape=list(shape),
                     labels={name: col.spec() for name, col in self.labels.items()},
                     variances=None if const is None else {"constant": const})
        shape_spec = _shape_spec(self._shape_to_save(), None)  # constant fields only (no arrays here)
        if shape_spec is not None:
            model["error_shape"] = shape_spec
        record = release_record(self.kind, ledger=self.ledger, description=dict(self.description),
                                private=self.private, model=model)
        # the description's fields also at the top level: the layout of the side files of earlier versions
        flat = {k: v for k, v in record["description"].items() if k not in record}
        side.write_text(json.dumps({**flat, **record}, indent=1, allow_nan=True) + "\n")
        return p


def _same_path(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:  # pragma: no cover
        return False


def _write_array(p: Path, answers: Any, shape: tuple[int, ...], block: int = 2**22) -> None:
    """Write ``answers`` (1-D, possibly memory-mapped) as a ``.npy`` / ``.zarr`` array of ``shape``,
    block by block."""
    n = _length(answers)
    rows = max(1, block // max(1, int(np.prod(shape[1:], dtype=np.int64))))
    step = rows * int(np.prod(shape[1:], dtype=np.int64))
    if p.suffix == ".npy":
        out = np.lib.format.open_memmap(p, mode="w+", dtype=np.float64, shape=shape)
        flat = out.reshape(-1)
        for a in range(0, n, step):
            flat[a:a + step] = np.asarray(answers[a:a + step], dtype=np.float64)
        out.flush()
        del out, flat
        return
    z = open_zarr(p, mode="w", shape=shape, chunks=(min(rows, shape[0]), *shape[1:]), dtype="f8")
    for a in range(0, shape[0], rows):
        lo, hi = a * (step // rows), min(n, (a + rows) * (step // rows))
        z[a:a + rows] = np.asarray(answers[lo:hi], dtype=np.float64).reshape((-1, *shape[1:]))


# -- the mix-in of the subsystem classes -----------------------------------------------------------


_SHAPE_FIELDS = ("kurtosis", "lead", "unit", "unit_min", "lattice")
_SHAPE = "error_shape."


def _shape_spec(shape: Any, arrays: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record of an :class:`~sparsedp.accuracy.ErrorShape`: each field a constant, or (when
    ``arrays`` is given) the name of an array added to ``arrays``; ``None`` when a field varies and
    there is no room for arrays (a chunked release: its intervals then use the variances only)."""
    if shape is None:
        return None
    spec: dict[str, Any] = {}
    for name in _SHAPE_FIELDS:
        v = getattr(shape, name)
        if v is None:
            continue
        v = np.asarray(v, dtype=np.float64)
        const = _constant(v) if v.ndim else float(v)
        if const is not None:
            spec[name] = {"constant": const}
        elif arrays is None:
            return None
        else:
            arrays[_SHAPE + name] = np.ascontiguousarray(v)
            spec[name] = _SHAPE + name
    return spec


def _shape_from_spec(spec: Any, arrays: dict[str, Any]) -> Any:
    """The :class:`~sparsedp.accuracy.ErrorShape` a release file saved (its arrays taken out of
    ``arrays``), or ``None``."""
    if not isinstance(spec, Mapping):
        return None
    fields = {}
    for name in _SHAPE_FIELDS:
        s = spec.get(name)
        if isinstance(s, str):
            fields[name] = np.asarray(arrays.pop(s), dtype=np.float64)
        elif isinstance(s, Mapping):
            fields[name] = float(s["constant"])
    if "kurtosis" not in fields:
        return None
    return ErrorShape(**fields)


class ReleaseMethods:
    """What every release class offers through its :meth:`to_release` (a :class:`ReleaseResult`):
    ``confidence_intervals(level=0.95, method="auto")``, ``save(path, overwrite=False)`` and
    ``to_pandas()``.  A class that defines one of them itself keeps its own (with the same call)."""

    def to_release(self) -> ReleaseResult:  # pragma: no cover - every class defines it
        raise NotImplementedError

    def confidence_intervals(self, level: float = 0.95, method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around every answer of :meth:`to_release`
        (:meth:`ReleaseResult.confidence_intervals`)."""
        return self.to_release().confidence_intervals(level, method)

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write :meth:`to_release` (:meth:`ReleaseResult.save`; an existing file is replaced only
        with ``overwrite=True``)."""
        return self.to_release().save(path, overwrite=overwrite)

    def to_pandas(self, level: float = 0.95, method: str = "auto") -> Any:
        """:meth:`ReleaseResult.to_pandas` of :meth:`to_release`."""
        return self.to_release().to_pandas(level, method)


# -- loading ---------------------------------------------------------------------------------------
#: What the subsystems add to :func:`load_release`: each registers its readers when imported
#: (:func:`register_reader`), so this module, which they all build on, imports none of them.
_READERS: dict[str, Callable[..., Any]] = {}


def register_reader(name: str, reader: Callable[..., Any]) -> None:
    """Let a subsystem read its files in :func:`load_release`: ``name`` is one of
    ``"histogram.load"`` (an ``.npz`` of the first histogram layout -> ``HistogramRelease``),
    ``"histogram.from_release"`` (a histogram :class:`ReleaseResult` -> its ``HistogramRelease``),
    ``"restaurant.result"``, ``"flows.result"`` (earlier files' arrays -> :class:`ReleaseResult`),
    ``"marginals.from_json"`` (the marginals command's JSON), ``"topdown.from_release"`` (a TopDown
    :class:`ReleaseResult` -> ``TopDownRelease``) and ``"topdown.load_directory"`` (a chunked
    TopDown directory -> ``ChunkedTopDownRelease``).  Called by those modules at import."""
    _READERS[name] = reader


def _reader(name: str) -> Callable[..., Any]:
    try:
        return _READERS[name]
    except KeyError:  # every subsystem is imported with sparsedp; a stripped import may lack one
        raise SparseDPError(f"reading this release needs sparsedp.{name.split('.')[0]}: import it first") from None




def load_release(path: str | Path) -> ReleaseResult:
    """Read any release file sparsedp writes as a :class:`ReleaseResult`: an ``.npz`` release file
    (every kind, this version's and earlier ones), a chunked ``.npy`` / ``.zarr`` array (give the
    array or its ``.release.json`` record), a TopDown table (``.csv`` / ``.parquet`` with its
    ``.release.json``), a chunked TopDown directory, or the JSON of ``sparsedp marginals``.  Anything else
    (a summary written by ``--json``, a continual counter's state) raises
    :class:`~sparsedp.errors.SparseDPError` naming what it is."""
    p = Path(path)
    if p.name.endswith(SIDE_SUFFIX):
        if not p.is_file():
            raise SparseDPError(f"no such release record: {p}")
        data = Path(str(p)[: -len(SIDE_SUFFIX)])
        if data.suffix.lower() in _TABLE_SUFFIXES:
            return _load_table(data, p)
        return _load_side(p, data)
    if not p.exists():
        raise SparseDPError(f"no such release file: {p}")
    if p.suffix.lower() in _TABLE_SUFFIXES:  # a table of units (TopDown) with its record next to it
        side = Path(str(p) + SIDE_SUFFIX)
        if not side.is_file():
            raise SparseDPError(f"{p} is a table, not a release: a table sparsedp publishes has its release record "
                                f"{side.name} next to it (an input table of counts or records has none)")
        return _load_table(p, side)
    if p.is_dir() and (p / "topdown.json").is_file():  # a TopDown release chunked by subtree (a directory)
        return _reader("topdown.load_directory")(p).to_release()
    head = b"" if p.is_dir() else _head(p)
    if p.is_dir() or p.suffix in (".npy", ".zarr") or head.startswith(b"\x93NUMPY"):
        side = Path(str(p) + SIDE_SUFFIX)
        if not side.is_file():
            raise SparseDPError(f"{p} is an array without its release record {side.name} (written next to it by the "
                                "chunked release): it cannot say what it holds")
        return _load_side(side, p)
    if head.lstrip()[:1] == b"{":
        return _load_json(p)
    try:
        rf = load_release_file(p)
    except SparseDPError:
        old = _oldest_histogram(p)
        if old is None:
            raise
        return old
    return _from_file(rf, p)


def _oldest_histogram(p: Path) -> ReleaseResult | None:
    """A histogram ``.npz`` of the first layout (fields as arrays, no ``__sparsedp__`` record)."""
    try:
        with np.load(p, allow_pickle=False) as f:
            names = set(f.files)
    except (OSError, ValueError):
        return None
    if not {"estimate", "method"} <= names:
        return None
    return _reader("histogram.load")(p).to_release(path=str(p))


def _head(p: Path) -> bytes:
    try:
        with open(p, "rb") as fh:
            return fh.read(64)
    except OSError as exc:
        raise SparseDPError(f"cannot read release {p}: {exc}") from exc


def _noise_of(ledger: Sequence[dict], description: Mapping[str, Any]) -> tuple[str | None, bool]:
    noise = next((e.get("noise") for e in ledger if e.get("noise")), None)
    secure = description.get("secure")
    if secure is None:
        secure = next((e.get("secure") for e in ledger if e.get("secure") is not None), True)
    return noise, bool(secure)


def _labels_from_model(spec: Mapping[str, Any], shape: Sequence[int] | None, arrays: Mapping[str, Any],
                       n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, s in spec.items():
        if isinstance(s, str):
            out[name] = arrays[s]
        else:
            out[name] = AxisLabel(shape if shape is not None else (n,), int(s["axis"]), s.get("values"))
    return out


def _variances_from_model(spec: Any, arrays: Mapping[str, Any], n: int) -> np.ndarray | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        return np.asarray(arrays[spec], dtype=np.float64)
    return np.broadcast_to(np.float64(spec["constant"]), (n,))


def _from_file(rf: ReleaseFile, p: Path) -> ReleaseResult:
    """A release from an ``.npz`` release file: its ``model``, or (earlier files) the kind's layout."""
    if not rf.model:
        return _legacy_file(rf, p)
    m = rf.model
    arrays = dict(rf.arrays)
    answers = arrays.get(m.get("answers", "answers"))
    if answers is None:
        raise SparseDPError(f"{p}: the release's answers ({m.get('answers')!r}) are missing")
    answers = answers.reshape(-1)
    n = answers.size
    labels = _labels_from_model(m.get("labels") or {}, m.get("shape"), arrays, n)
    for name, s in (m.get("labels") or {}).items():
        if isinstance(s, str):
            arrays.pop(s, None)
    var = _variances_from_model(m.get("variances"), arrays, n)
    if isinstance(m.get("variances"), str):
        arrays.pop(m["variances"], None)
    shape = _shape_from_spec(m.get("error_shape"), arrays)
    arrays = {k: (answers if k == m.get("answers") else v) for k, v in arrays.items()}
    rel = ReleaseResult(kind=rf.kind, answers=answers, labels=labels, variances=var, noise=m.get("noise"),
                        secure=bool(m.get("secure", True)), strategy=m.get("strategy") or "", ledger=rf.ledger,
                        private=rf.private, description=rf.description, arrays=arrays,
                        variance_method=m.get("variance_method"), path=str(p), error_shape=shape)
    return _attach_source(rel)


def _attach_source(rel: ReleaseResult) -> ReleaseResult:
    """Histogram files: the :class:`~sparsedp.trees.HistogramRelease` (any range, exactly)."""
    if rel.kind == "histogram" and "method" in rel.description and "estimate" in rel.arrays:
        return replace(rel, source=_reader("histogram.from_release")(rel))
    if rel.kind == "topdown":  # its per-level tables (to_pandas: one row per unit)
        return replace(rel, source=_reader("topdown.from_release")(rel))
    return rel


def _legacy_file(rf: ReleaseFile, p: Path) -> ReleaseResult:
    """An ``.npz`` release file of an earlier version (no ``model``): each kind's arrays."""
    desc, arrays, kind = dict(rf.description), dict(rf.arrays), rf.kind
    noise, secure = _noise_of(rf.ledger, desc)
    common = dict(kind=kind, ledger=rf.ledger, private=rf.private, description=desc, noise=noise, secure=secure,
                  path=str(p))
    if kind == "histogram":
        base = ReleaseResult(answers=arrays["estimate"], labels=axis_labels((arrays["estimate"].size,), ["bin"]),
                             arrays=arrays, **{**common, "noise": "laplace"})
        h = _reader("histogram.from_release")(base)
        return h.to_release(private=rf.private, ledger=rf.ledger, description=desc, arrays=arrays, path=str(p))
    if kind == "restaurant":
        var = desc.get("noise_variance")
        if var is None and desc.get("laplace_scale") is not None:  # the CLI's files: from the scale
            b = float(desc["laplace_scale"])
            var = discrete_laplace_variance(b) if secure else 2.0 * b * b
        return _reader("restaurant.result")(arrays["x"], int(desc["days"]), var, **common, arrays=arrays)
    if kind == "flows":
        return _reader("flows.result")(arrays["x"], desc, **{k: v for k, v in common.items() if k != "description"},
                            arrays=arrays)
    if kind == "completion":
        left, right = arrays["left"], arrays["right"]
        size = left.shape[0] * right.shape[0]
        if size > MAX_COMPLETION_ENTRIES:
            raise SparseDPError(f"{p}: a completed {left.shape[0]} x {right.shape[0]} matrix has more than "
                                f"{MAX_COMPLETION_ENTRIES} entries: read its factors with "
                                "sparsedp.release_file.load_release_file")
        shape = (left.shape[0], right.shape[0])
        return ReleaseResult(answers=(left @ right.T).reshape(-1), labels=axis_labels(shape, ["row", "col"]),
                             arrays=arrays, strategy="low-rank completion of Laplace-noised entries",
                             variance_method="unknown: no per-entry variance for a completion", **common)
    if "answers" in arrays:  # matrix-mechanism, spec and unknown kinds
        answers = arrays["answers"].reshape(-1)
        var = arrays.get(_VARIANCES)
        return ReleaseResult(answers=answers, labels={}, variances=var, arrays=arrays,
                             strategy=str(desc.get("strategy", "")),
                             variance_method="stored" if var is not None else "unavailable: not in the file",
                             **common)
    raise SparseDPError(f"{p}: a {kind!r} release file without answers this version can read")


def _read_array(p: Path) -> Any:
    if p.suffix == ".npy" or (p.is_file() and _head(p).startswith(b"\x93NUMPY")):
        try:
            return np.load(p, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SparseDPError(f"cannot read {p} as a .npy array: {exc}") from exc
    try:  # open_zarr checks the metadata first: plain numbers under numeric codecs, or nothing is decoded
        return np.asarray(open_zarr(p)[:])
    except SparseDPError:
        raise
    except Exception as exc:  # zarr's errors: not a Zarr array
        raise SparseDPError(f"cannot read {p} as a Zarr array: {exc}") from exc


def _array_path(side: Path, meta: Mapping[str, Any], given: Path | None) -> Path:
    """The answers' array of a record: the array it was given with, or the one its ``model`` names,
    or (earlier records, which kept the path written to) the file of its ``estimate``'s name.  Every
    candidate must resolve inside the record's own directory (:func:`~sparsedp.safe_files.resolve_inside`):
    a record that names a file elsewhere (an absolute path, ``..``, a symlink leading out) is refused."""
    name = (meta.get("model") or {}).get("answers")
    if name is not None and not isinstance(name, str):
        raise SparseDPError(f"{side}: the release's array is not named by a string: {name!r}")
    candidates = []
    if given is not None:  # next to the record by construction (OUT and OUT.release.json)
        candidates.append(given.name)
    if name:
        candidates.append(name)
    est = meta.get("estimate") or (meta.get("description") or {}).get("estimate")
    if isinstance(est, str) and Path(est).name:
        candidates.append(Path(est).name)  # earlier records: where the array was written, read next to the record
    for c in candidates:
        if resolve_inside(side.parent, c).exists():
            return side.parent / c
    raise SparseDPError(f"{side}: the release's array ({name or est}) is missing")


def _json_object(p: Path, what: str) -> dict:
    """The JSON object in ``p`` (:class:`SparseDPError` if it cannot be read or is not one)."""
    try:
        meta = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise SparseDPError(f"cannot read {what} {p}: {exc}") from exc
    if not isinstance(meta, dict):
        raise SparseDPError(f"{p} is not a sparsedp {what}")
    return meta


#: Tables a release can be published as (TopDown: one row per unit), each with ``PATH.release.json``.
_TABLE_SUFFIXES = (".csv", ".parquet", ".pq")


def _load_table(table: Path, side: Path) -> ReleaseResult:
    """A published table and its release record (the TopDown reader, registered by
    :mod:`sparsedp.topdown.table_file`)."""
    if not table.is_file():
        raise SparseDPError(f"{side.name}: the table it describes ({table.name}) is missing")
    meta = _json_object(side, "release record")
    if meta.get("kind") != "topdown":
        raise SparseDPError(f"{side.name} records a {meta.get('kind')!r} release, not a table of units")
    return _reader("topdown.load_table")(table, meta)


def _load_side(side: Path, given: Path | None) -> ReleaseResult:
    meta = _json_object(side, "release record")
    arr_path = _array_path(side, meta, given if given is not None and given.exists() else None)
    raw = _read_array(arr_path)
    answers = raw.reshape(-1)
    if meta.get("format") == FORMAT and meta.get("model"):
        m = meta["model"]
        n = answers.shape[0]
        return ReleaseResult(kind=meta["kind"], answers=answers,
                             labels=_labels_from_model(m.get("labels") or {}, m.get("shape") or raw.shape, {}, n),
                             variances=_variances_from_model(m.get("variances"), {}, n), noise=m.get("noise"),
                             secure=bool(m.get("secure", True)), strategy=m.get("strategy") or "",
                             ledger=meta.get("ledger") or (), private=bool(meta.get("private", True)),
                             description=meta.get("description") or {}, variance_method=m.get("variance_method"),
                             path=str(arr_path))
    if meta.get("format") is not None and meta.get("format") != FORMAT:
        raise SparseDPError(f"{side}: unknown release format {meta.get('format')!r}")
    return _legacy_side(meta, raw, answers, arr_path)


def _legacy_side(meta: dict, raw: Any, answers: Any, arr_path: Path) -> ReleaseResult:
    """A chunked release's record of an earlier version (flat keys, no ``model``)."""
    ledger = tuple(meta.get("ledger") or ())
    desc = {k: v for k, v in meta.items() if k not in ("ledger", "private", "seconds")}
    secure = bool(meta.get("secure", True))
    common = dict(ledger=ledger, private=bool(meta.get("private", True)), description=desc, noise="laplace",
                  secure=secure, path=str(arr_path))
    n = answers.shape[0]
    if "items" in meta:  # the chunked restaurant: (days, 5)
        return _restaurant_side(meta, raw, answers, common)
    if "method" in meta:
        bound = _histogram_side_bound(meta)
        return ReleaseResult(kind="histogram", answers=answers, labels=axis_labels((n,), ["bin"]),
                             variances=None if bound is None else np.broadcast_to(np.float64(bound), (n,)),
                             variance_method="bound" if bound is not None else None,
                             strategy=f"{meta['method']} tree, chunk by chunk", **common)
    raise SparseDPError(f"{arr_path}: its release record names no kind this version can read")


def _restaurant_side(meta: dict, raw: Any, answers: Any, common: dict) -> ReleaseResult:
    n = answers.shape[0]
    var = meta.get("noise_variance")
    return ReleaseResult(kind="restaurant", answers=answers,
                         labels=axis_labels(raw.shape, ["day", "item"], {"item": meta["items"]}),
                         variances=None if var is None else np.broadcast_to(np.float64(var), (n,)),
                         variance_method="bound" if var is not None else None,
                         strategy="item trees x combo span, chunk by chunk", **common)


def _histogram_side_bound(meta: Mapping[str, Any]) -> float | None:
    """A guaranteed bound on every leaf estimate's variance: the leaf's own noise variance (boost),
    ``2 max_scale^2`` (LUE; the discrete Laplace's variance is below ``2 t^2``)."""
    if meta.get("level_variances"):
        return float(meta["level_variances"][-1])
    if meta.get("max_scale") is not None:
        return 2.0 * float(meta["max_scale"]) ** 2
    return None


def _load_json(p: Path) -> ReleaseResult:
    meta = _json_object(p, "release")
    if "marginals" in meta and "domain" in meta:
        return _reader("marginals.from_json")(meta, str(p))
    if "stack" in meta and "horizon" in meta:
        raise SparseDPError(f"{p} is a continual counter's state (it holds the exact running sums: SECRET), not a "
                            "release; the counter's released sums are ContinualCounter.to_release()")
    if "published" in meta and "version" in meta:
        raise SparseDPError(f"{p} is a continual counter's list of the steps it printed (STATE.published), not a "
                            "release")
    if (meta.get("model") or meta.get("estimate")) and meta.get("ledger") is not None:
        return _load_side(p, None)  # a copy of a chunked release's record (restaurant --json)
    raise SparseDPError(f"{p} is the summary of a run (--json), not a release file: load the file written by --out "
                        "(or --save)")
