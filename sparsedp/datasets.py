"""Example data: the DPBench 1-D histograms from the shared datasets folder, a real categorical
table (Palmer penguins) for marginal releases, and synthetic fallbacks for both.

The shared folder is found at ``$SPARSEDP_SHARED/datasets`` if that variable is set, else at
``../shared/datasets`` beside the repository checkout.  DPBench: Hay, Machanavajjhala, Miklau, Chen,
Zhang, "Principled Evaluation of Differentially Private Algorithms using DPBench", SIGMOD 2016.

The penguins table is read from the CSV that the ``palmerpenguins`` wheel ships inside its package
(the ``data`` extra: ``pip install 'sparsedp[data]'``; the package is MIT-licensed, the data CC0,
Gorman, Williams & Fraser, PLoS ONE 9(3): e90081, 2014); nothing is fetched at run time.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import SparseDPError
from .marginals.domain import Domain

__all__ = [
    "shared_datasets_dir",
    "dpbench_names",
    "load_dpbench",
    "synthetic_histogram",
    "demo_histogram",
    "CategoricalTable",
    "PENGUIN_BINS",
    "PENGUIN_CATEGORIES",
    "PENGUIN_COLUMNS",
    "penguins",
    "penguins_csv",
    "demo_table",
    "road_grid",
    "helsinki_roads",
    "restaurant",
]

# Data sets that belong to a subsystem live there and are re-exported here on first use.
_ELSEWHERE = {
    "road_grid": "sparsedp.flows.network",
    "helsinki_roads": "sparsedp.flows.osm",
    "restaurant": "sparsedp.consistency.restaurant",
}


def __getattr__(name: str):
    if name in _ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

DEFAULT_DPBENCH = "HEPTH.n4096.npy"


def shared_datasets_dir() -> Path | None:
    """The shared datasets folder, or ``None`` when it is absent."""
    env = os.environ.get("SPARSEDP_SHARED")
    candidates = [Path(env) / "datasets"] if env else []
    candidates.append(Path(__file__).resolve().parent.parent.parent / "shared" / "datasets")
    for path in candidates:
        if path.is_dir():
            return path
    return None


def dpbench_names() -> list[str]:
    """File names of the available DPBench 1-D histograms (empty if the folder is absent)."""
    root = shared_datasets_dir()
    if root is None or not (root / "dpbench_1d").is_dir():
        return []
    return sorted(p.name for p in (root / "dpbench_1d").glob("*.npy"))


def load_dpbench(name: str = DEFAULT_DPBENCH) -> np.ndarray:
    """Load one DPBench histogram (4096 bins, int64) as a float64 count vector."""
    root = shared_datasets_dir()
    if root is None:
        raise SparseDPError("the shared datasets folder was not found (set SPARSEDP_SHARED)")
    path = root / "dpbench_1d" / name
    if not path.is_file():
        raise SparseDPError(f"no DPBench histogram {name!r}; available: {dpbench_names()}")
    return np.load(path, allow_pickle=False).astype(np.float64)


def synthetic_histogram(n: int = 4096, seed: int = 0) -> np.ndarray:
    """A built-in histogram: a few log-normal bumps over a sparse background, integer counts."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 1.0, n)
    density = np.full(n, 0.05)
    for centre, width, height in zip(rng.uniform(0.1, 0.9, 4), rng.uniform(0.01, 0.08, 4), rng.uniform(20, 200, 4)):
        density += height * np.exp(-0.5 * ((grid - centre) / width) ** 2)
    return rng.poisson(density).astype(np.float64)


def demo_histogram(name: str = DEFAULT_DPBENCH) -> tuple[np.ndarray, str]:
    """A DPBench histogram when the shared folder is present, else the synthetic one; and its label."""
    try:
        return load_dpbench(name), f"DPBench {name}"
    except SparseDPError:
        return synthetic_histogram(), "synthetic (shared datasets not found)"


@dataclass(frozen=True)
class CategoricalTable:
    """Records as integer codes on a public :class:`~sparsedp.Domain`, ready for
    :func:`~sparsedp.marginals.release_marginals`; ``categories[name][code]`` labels each code."""

    records: np.ndarray  # (n, d) integer codes, Domain.encode's dtype
    domain: Domain
    categories: dict  # {attribute name: tuple of labels, one per code}
    source: str  # where the records came from (a label for printing)


# Public binning of the penguins' measurements: fixed interior edges, open end bins
# (-inf, e_0), [e_0, e_1), ..., [e_last, inf).  Constants of the code, never computed from the table:
# edges taken from the data (quantiles, min / max) would depend on the records and leak them.
PENGUIN_BINS: dict[str, tuple[float, ...]] = {
    "bill_length_mm": (35.0, 40.0, 45.0, 50.0, 55.0),
    "bill_depth_mm": (14.0, 16.0, 18.0, 20.0),
    "flipper_length_mm": (180.0, 190.0, 200.0, 210.0, 220.0),
    "body_mass_g": (3000.0, 3500.0, 4000.0, 4500.0, 5000.0, 5500.0),
}
# Public category lists of the categorical columns (the study's design: three species, three
# islands, both sexes, seasons 2007-2009); a value outside its list is an error.
PENGUIN_CATEGORIES: dict[str, tuple[str, ...]] = {
    "species": ("Adelie", "Chinstrap", "Gentoo"),
    "island": ("Biscoe", "Dream", "Torgersen"),
    "sex": ("female", "male"),
    "year": ("2007", "2008", "2009"),
}
PENGUIN_COLUMNS = ("species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g",
                   "sex", "year")
# Columns the data's documentation says may be missing ("NA"): they get a last code "missing".
_MAY_BE_MISSING = frozenset(PENGUIN_BINS) | {"sex"}
_MISSING = frozenset({"", "NA", "NaN", "nan"})


def _bin_labels(edges: Sequence[float]) -> tuple[str, ...]:
    e = [f"{x:g}" for x in edges]
    return (f"<{e[0]}",) + tuple(f"{a}-{b}" for a, b in zip(e, e[1:])) + (f">={e[-1]}",)


def penguins_csv() -> Path:
    """Path of ``penguins.csv`` inside the installed ``palmerpenguins`` package (found without
    importing it, so pandas is not loaded); :class:`SparseDPError` naming the extra if it is absent."""
    spec = find_spec("palmerpenguins")
    if spec is None or not spec.submodule_search_locations:
        raise SparseDPError("the penguins table needs the palmerpenguins package: pip install 'sparsedp[data]' "
                            "(or pip install palmerpenguins)")
    for root in spec.submodule_search_locations:
        path = Path(root) / "data" / "penguins.csv"
        if path.is_file():
            return path
    raise SparseDPError(f"palmerpenguins is installed but holds no data/penguins.csv (in {list(spec.submodule_search_locations)})")


def penguins(columns: Sequence[str] | None = None, *, path: str | Path | None = None) -> CategoricalTable:
    """The Palmer penguins table (344 records) as integer codes on a public domain.

    Read with the standard library from the CSV inside the installed ``palmerpenguins`` wheel
    (:func:`penguins_csv`; no network, no pandas), or from ``path`` (a CSV with the same columns).
    ``columns``: the attributes to keep, in order (default all eight: species, island, bill length,
    bill depth, flipper length, body mass, sex, year).

    Encoding, all by public rules fixed in the code (nothing about the domain is read from the data):

    * numeric columns are binned on the fixed edges :data:`PENGUIN_BINS` with open end bins
      (``code = number of edges <= value``), so every value has a bin and the bins do not depend on
      the records (data-dependent edges -- quantiles, observed min / max -- would leak them);
    * categorical columns use the fixed lists :data:`PENGUIN_CATEGORIES` (``year`` as text);
    * a missing value (``NA`` or empty) in a measurement or in ``sex`` gets that attribute's last
      code, labelled ``"missing"``; a missing species / island / year, a value outside its category
      list, or a non-numeric measurement raises :class:`SparseDPError` naming the row.

    Domain sizes: species 3, island 3, bill length 7, bill depth 6, flipper length 7, body mass 8,
    sex 3, year 3 (190,512 cells).  Neighbouring tables differ by one penguin (add / remove one
    record), the unit of :mod:`sparsedp.marginals`.
    """
    cols = tuple(PENGUIN_COLUMNS if columns is None else columns)
    unknown = [c for c in cols if c not in PENGUIN_COLUMNS]
    if unknown or not cols or len(set(cols)) != len(cols):
        raise SparseDPError(f"columns must be distinct names among {', '.join(PENGUIN_COLUMNS)}; got {list(cols)}")
    p = penguins_csv() if path is None else Path(path)
    if not p.is_file():
        raise SparseDPError(f"no such file: {p}")
    with open(p, newline="") as fh:
        reader = csv.DictReader(fh)
        missing_cols = [c for c in cols if c not in (reader.fieldnames or [])]
        if missing_cols:
            raise SparseDPError(f"{p} has no column(s) {', '.join(missing_cols)}")
        rows = [[row[c] for c in cols] for row in reader]
    if not rows:
        raise SparseDPError(f"{p} holds no records")
    text = np.array(rows, dtype=object).reshape(len(rows), len(cols))
    codes = np.empty(text.shape, dtype=np.int64)
    labels: dict[str, tuple[str, ...]] = {}
    for j, c in enumerate(cols):  # vectorised per column: unique values, then one lookup each
        uniq, where, inverse = np.unique(np.char.strip(text[:, j].astype(str)), return_index=True, return_inverse=True)
        inverse = inverse.ravel()
        first = where + 2  # the file row (after the header) where each value first occurs
        is_missing = np.array([u in _MISSING for u in uniq], dtype=bool)
        miss = is_missing[inverse]
        if np.any(miss) and c not in _MAY_BE_MISSING:
            raise SparseDPError(f"{p}: row {int(np.argmax(miss)) + 2} has no {c!r} (it may not be missing)")
        ucode = np.zeros(uniq.size, dtype=np.int64)
        if c in PENGUIN_BINS:
            edges = np.asarray(PENGUIN_BINS[c])
            for k, u in enumerate(uniq):
                if is_missing[k]:
                    continue
                try:
                    v = float(u)
                except ValueError:
                    raise SparseDPError(f"{p}: row {first[k]} of {c!r} is not numeric: text where numbers are "
                                        "expected") from None
                if not np.isfinite(v):
                    raise SparseDPError(f"{p}: row {first[k]} of {c!r} is not finite")
                ucode[k] = np.searchsorted(edges, v, side="right")
            base = _bin_labels(PENGUIN_BINS[c])
        else:
            base = PENGUIN_CATEGORIES[c]
            index = {v: k for k, v in enumerate(base)}
            for k, u in enumerate(uniq):
                if not is_missing[k] and u not in index:
                    raise SparseDPError(f"{p}: row {first[k]} of {c!r} is not one of {', '.join(base)}")
                ucode[k] = index.get(str(u), 0)
        codes[:, j] = ucode[inverse]
        if c in _MAY_BE_MISSING:
            codes[miss, j] = len(base)
            base = base + ("missing",)
        labels[c] = base
    dom = Domain(cols, [len(labels[c]) for c in cols])
    return CategoricalTable(dom.encode(codes), dom, labels, f"Palmer penguins ({p.name}, {len(rows)} records)")


def demo_table(columns: Sequence[str] | None = None, n: int = 344, seed: int = 0) -> CategoricalTable:
    """The penguins table when ``palmerpenguins`` is installed, else ``n`` synthetic records
    (:func:`~sparsedp.marginals.synthetic_records`, a seeded latent-class simulation) on the same
    public domain and labels; ``source`` says which."""
    try:
        return penguins(columns)
    except SparseDPError as exc:
        if find_spec("palmerpenguins") is not None:
            raise  # installed but unreadable: not a case for the fallback
        reason = str(exc)
    from .marginals.synthetic import synthetic_records

    cols = tuple(PENGUIN_COLUMNS if columns is None else columns)
    labels = {c: (_bin_labels(PENGUIN_BINS[c]) if c in PENGUIN_BINS else PENGUIN_CATEGORIES[c])
              + (("missing",) if c in _MAY_BE_MISSING else ()) for c in cols if c in PENGUIN_COLUMNS}
    if len(labels) != len(cols):
        raise SparseDPError(f"columns must be names among {', '.join(PENGUIN_COLUMNS)}; got {list(cols)}")
    dom = Domain(cols, [len(labels[c]) for c in cols])
    return CategoricalTable(synthetic_records(dom, n, rng=seed), dom, labels,
                            f"synthetic, {n} records on the penguins domain ({reason.split(':')[0]})")
