"""Record data for a scale-out release: Parquet / CSV records binned into the leaf histogram, part by part.

:func:`release_records` publishes the hierarchical histogram of one numeric column of a table of
records, binned on a public :class:`~sparsedp.io.Bins` domain, without ever holding the records (or
the histogram) on one process.  Two passes of small tasks build the leaf histogram, then
:func:`~sparsedp.scaleout.release.release_hierarchical` publishes it:

1. **bin** (:func:`bin_part`, one task per *part*: a Parquet row group, or one CSV file read in
   batches of ``2^20`` rows): read the column, check it (numeric, no missing / NaN / infinite
   value, inside ``[start, stop)`` unless ``clip``: the rule of :func:`~sparsedp.io.bin_records`
   and ``sparsedp histogram --clip`` -- refused by default, clipped into the end bins with
   ``clip=True``), bin it (:func:`~sparsedp.io.bin_indices`), reduce it to compact counts (the
   distinct bins and their counts, sorted), and write them to scratch with the offsets where each
   histogram chunk's bins begin.  Only a :class:`PartCounts` (the chunks it touches and the file)
   goes back to the driver;
2. **assemble** (:func:`assemble_chunk`, one task per histogram chunk of ``chunk`` leaves): add the
   slices of every part that touches the chunk into a dense block and write it to the leaf
   histogram (a ``.npy`` in scratch, written block by block through a memory map);
3. **release**: :func:`~sparsedp.scaleout.release.release_hierarchical` on that file, with the same
   chunks, executor and arguments: it validates every block, charges the budget once and measures.

Every check on the records happens in pass 1, before the release is called: bad input raises a
:class:`~sparsedp.errors.SparseDPError` before any budget is charged or any noise drawn.  The
binning is deterministic, so a task Dask runs again (a worker died) writes the same counts.
Memory per task: one part's records (a row group) or one chunk's block; the driver holds the list
of parts and their touched chunks only.  On a real cluster the data and ``scratch`` must live on
storage every worker reaches.
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..executors import get_executor
from ..io import Bins, bin_indices
from ..validation import check_epsilon
from .release import ScaleoutRelease, _run, make_scratch, release_hierarchical
from .tree import ChunkedTree, default_chunk

__all__ = ["RecordPart", "PartCounts", "record_parts", "bin_part", "assemble_chunk", "bin_to_histogram", "release_records",
           "unit_histogram_records"]

#: rows per batch when a task streams a CSV file
CSV_BATCH = 2**20

_PARQUET = (".parquet", ".pq")


@dataclass(frozen=True)
class RecordPart:
    """One task's share of the records: row group ``row_group`` of a Parquet file, or a whole CSV
    file (``row_group`` ``None``, read in batches of :data:`CSV_BATCH` rows)."""

    kind: str  # "parquet" or "csv"
    path: str
    row_group: int | None = None


@dataclass(frozen=True)
class PartCounts:
    """A binned part: its number of ``records``; the histogram ``chunks`` it touches (sorted) and,
    for each, ``[starts[i], starts[i + 1])``, the slice of its compact counts (``path`` + ``.idx.npy``:
    global bins, sorted; ``path`` + ``.cnt.npy``: their counts) in that chunk."""

    part: int
    records: int
    chunks: tuple[int, ...]
    starts: tuple[int, ...]
    path: str | None


def _pq():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - the io extra
        raise SparseDPError("reading Parquet needs pyarrow: pip install 'sparsedp[io]'") from exc
    return pa, pq


def _parquet_parts(p: Path, column: str) -> list[RecordPart]:
    pa, pq = _pq()
    try:
        f = pq.ParquetFile(str(p))
    except Exception as exc:  # pyarrow raises its own error types for a bad file
        raise SparseDPError(f"cannot read {p} as Parquet: {exc}") from exc
    schema = f.schema_arrow
    if column not in schema.names:
        raise SparseDPError(f"{p} has no column {column!r}; columns: {', '.join(schema.names)}")
    t = schema.field(column).type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise SparseDPError(f"{p}: column {column!r} is not numeric (type {t})")
    return [RecordPart("parquet", str(p.resolve()), g) for g in range(f.num_row_groups)]


def _csv_part(p: Path, column: str) -> list[RecordPart]:
    with open(p, newline="") as fh:
        header = next(csv.reader(fh), None)
    if header is None:
        raise SparseDPError(f"{p} is empty")
    if column not in header:
        raise SparseDPError(f"{p} has no column {column!r}; columns: {', '.join(header)}")
    return [RecordPart("csv", str(p.resolve()))]


def record_parts(source: str | Path, column: str) -> list[RecordPart]:
    """The parts of a Parquet file (one per row group), a CSV file (one), or a directory of such
    files (searched recursively, in sorted order); the column is checked in every file's header or
    schema (present; numeric for Parquet) without reading any record."""
    if not isinstance(column, str) or not column:
        raise SparseDPError(f"column must name a column of the records, got {column!r}")
    p = Path(source)
    if not p.exists():
        raise SparseDPError(f"no such file or directory: {p}")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in (*_PARQUET, ".csv"))
        if not files:
            raise SparseDPError(f"{p} holds no .parquet / .pq / .csv file")
    else:
        files = [p]
    parts: list[RecordPart] = []
    for f in files:
        suffix = f.suffix.lower()
        if suffix in _PARQUET:
            parts.extend(_parquet_parts(f, column))
        elif suffix == ".csv":
            parts.extend(_csv_part(f, column))
        else:
            raise SparseDPError(f"unsupported record file {f.name}: use .parquet, .pq or .csv (or a directory of them)")
    return parts


def _csv_values(path: str, column: str, batch: Any, first_row: int) -> np.ndarray:
    import pandas as pd

    series = batch[column]
    if pd.api.types.is_float_dtype(series.dtype) or pd.api.types.is_integer_dtype(series.dtype):
        return series.to_numpy(dtype=np.float64)
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
    for i in np.flatnonzero(np.isnan(values)):  # only the suspicious rows, one by one
        text = series.iloc[i]
        try:
            float(text)
        except (TypeError, ValueError):
            raise SparseDPError(f"{path}: row {first_row + int(i) + 2} of column {column!r} is not numeric: text "
                                "where numbers are expected") from None  # its position, never its value
    return values


def _read_batches(part: RecordPart, column: str):
    """The column's values of one part, as float64 batches (missing values are ``NaN``)."""
    if part.kind == "parquet":
        pa, pq = _pq()
        col = pq.ParquetFile(part.path).read_row_group(part.row_group, columns=[column]).column(0)
        yield col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        return
    import pandas as pd

    row = 0
    for batch in pd.read_csv(part.path, usecols=[column], na_filter=False, chunksize=CSV_BATCH):
        yield _csv_values(part.path, column, batch, row)
        row += len(batch)


def bin_part(part: RecordPart, q: int, column: str, bins: Bins, clip: bool, chunk: int, scratch: str) -> PartCounts:
    """Read, check and bin one part (see the module docstring); its compact counts go to ``scratch``."""
    where = part.path if part.row_group is None else f"{part.path} (row group {part.row_group})"
    idx_parts, cnt_parts, records = [], [], 0
    for values in _read_batches(part, column):
        try:
            idx = bin_indices(values, bins, clip)
        except SparseDPError as exc:
            raise type(exc)(f"{where}, column {column!r}: {exc}") from None
        u, c = np.unique(idx, return_counts=True)
        idx_parts.append(u)
        cnt_parts.append(c.astype(np.int64))
        records += int(values.size)
    if records == 0:
        return PartCounts(q, 0, (), (), None)
    u = np.concatenate(idx_parts)
    c = np.concatenate(cnt_parts)
    if len(idx_parts) > 1:  # several CSV batches: merge their counts
        u, inv = np.unique(u, return_inverse=True)
        c = np.bincount(inv, weights=c, minlength=u.size).astype(np.int64)
    owner = u // chunk
    chunks, starts = np.unique(owner, return_index=True)
    base = os.path.join(scratch, f"part{q:07d}-{uuid.uuid4().hex}")
    for suffix, arr in ((".idx.npy", u), (".cnt.npy", c)):
        with open(base + suffix + ".part", "wb") as fh:
            np.save(fh, arr)
        os.replace(base + suffix + ".part", base + suffix)
    return PartCounts(q, records, tuple(int(v) for v in chunks), tuple(int(v) for v in starts) + (int(u.size),), base)


def assemble_chunk(lo: int, hi: int, pieces: list[tuple[str, int, int]], histogram: str) -> int:
    """Add the compact counts ``pieces`` (``(path, start, end)`` slices of parts' files) of leaves
    ``[lo, hi)`` into a dense block, write it into the ``.npy`` ``histogram``; the block's total."""
    block = np.zeros(hi - lo, dtype=np.int64)
    for path, s, e in pieces:
        idx = np.load(path + ".idx.npy", mmap_mode="r")[s:e]
        cnt = np.load(path + ".cnt.npy", mmap_mode="r")[s:e]
        block[np.asarray(idx) - lo] += cnt  # the bins of one part are distinct
    out = np.load(histogram, mmap_mode="r+", allow_pickle=False)
    out[lo:hi] = block
    out.flush()
    del out
    return int(block.sum())


def _positive_int(v: Any, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
        raise SparseDPError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def bin_to_histogram(
    source: str | Path,
    column: str,
    bins: Bins,
    histogram: str | Path,
    *,
    clip: bool = False,
    chunk: int | None = None,
    executor: Any = None,
    scratch: str | Path | None = None,
    progress: bool | None = None,
    _parts: list[RecordPart] | None = None,
) -> dict[str, float]:
    """Bin the records of ``source`` (column ``column``, public ``bins``) into the int64 ``.npy``
    ``histogram`` of ``bins.count`` leaves, part by part and ``chunk`` leaves per assembling task
    (default: the largest power of 16 up to ``2^20``), never holding the records on one process
    (passes 1 and 2 of the module docstring).  No privacy: the exact histogram, for a release.
    Returns the seconds of the two passes (``"bin"``, ``"assemble"``) and the number of
    ``"records"``; raises :class:`~sparsedp.errors.SparseDPError` on bad records."""
    if not isinstance(bins, Bins):
        raise SparseDPError(f"bins must be a sparsedp.io.Bins, got {type(bins).__name__}")
    if not isinstance(clip, (bool, np.bool_)):
        raise SparseDPError(f"clip must be True or False, got {clip!r}")
    n = bins.count
    c = default_chunk(n, 16) if chunk is None else _positive_int(chunk, "chunk")
    parts = record_parts(source, column) if _parts is None else _parts
    m = -(-n // c)
    ex = get_executor(executor)
    owns = isinstance(executor, str)
    work = tempfile.mkdtemp(prefix="sparsedp-bin-", dir=None if scratch is None else str(scratch))
    try:
        t0 = time.perf_counter()
        counts = _run(ex, bin_part, [parts, range(len(parts)), [column] * len(parts), [bins] * len(parts),
                                     [bool(clip)] * len(parts), [c] * len(parts), [work] * len(parts)],
                      len(parts), "bin", progress)
        records = sum(pc.records for pc in counts)
        if records == 0:
            raise SparseDPError(f"{source} holds no records")
        t1 = time.perf_counter()
        pieces: list[list[tuple[str, int, int]]] = [[] for _ in range(m)]
        for pc in counts:
            for i, q in enumerate(pc.chunks):
                pieces[q].append((pc.path, pc.starts[i], pc.starts[i + 1]))
        histogram = str(Path(histogram).resolve())
        np.lib.format.open_memmap(histogram, mode="w+", dtype=np.int64, shape=(n,)).flush()
        los = [q * c for q in range(m)]
        his = [min((q + 1) * c, n) for q in range(m)]
        totals = _run(ex, assemble_chunk, [los, his, pieces, [histogram] * m], m, "assemble", progress)
        if sum(totals) != records:
            raise SparseDPError("the assembled histogram does not hold every binned record once (a chunk was lost or "
                                "written twice)")
        return {"bin": t1 - t0, "assemble": time.perf_counter() - t1, "records": float(records)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if owns:
            ex.close()


def _check_unit_column(parts: list[RecordPart], unit_column: str) -> None:
    """Every file of ``parts`` has the privacy unit's column (header / schema only)."""
    from ..io import table_columns

    for f in dict.fromkeys(part.path for part in parts):
        names = table_columns(f)
        if unit_column not in names:
            raise SparseDPError(f"{f} has no column {unit_column!r} (the privacy unit); columns: {', '.join(names)}")


def _records_frame(parts: list[RecordPart], column: str, unit_column: str) -> Any:
    """A dask DataFrame of the value and unit-id columns of every part (Parquet, or CSV as text)."""
    import dask.dataframe as dd

    files = list(dict.fromkeys(part.path for part in parts))
    frames = []
    pq_files = [f for f in files if Path(f).suffix.lower() in _PARQUET]
    csv_files = [f for f in files if Path(f).suffix.lower() == ".csv"]
    if pq_files:
        frames.append(dd.read_parquet(pq_files, columns=[column, unit_column], split_row_groups=True))
    if csv_files:
        frames.append(dd.read_csv(csv_files, usecols=[column, unit_column], dtype={unit_column: str, column: str},
                                  keep_default_na=False, blocksize="64MB"))
    return frames[0] if len(frames) == 1 else dd.concat(frames)


def _bin_ids(df: Any, column: str, unit_column: str, bins: Bins, clip: bool) -> Any:
    """One partition of records: checked and binned (``cell``), the unit ids as read (``uid``) and
    ``part``, a hash of their text (:func:`~sparsedp.io.id_text`) to shuffle on: the same text, the
    same partition, whatever the column's type in each file; the ids travel in their own compact
    type, not as Python strings."""
    import pandas as pd

    from ..io import id_text

    v = df[column]
    values = v.to_numpy(dtype=np.float64, na_value=np.nan) if pd.api.types.is_numeric_dtype(v.dtype) and not \
        pd.api.types.is_bool_dtype(v.dtype) else pd.to_numeric(v, errors="coerce").to_numpy(dtype=np.float64)
    try:
        cells = bin_indices(values, bins, clip)
    except SparseDPError as exc:
        raise type(exc)(f"column {column!r}: {exc} (a record's number within its part)") from None
    part = pd.util.hash_array(id_text(df[unit_column]), categorize=True)
    return pd.DataFrame({"cell": cells, "uid": df[unit_column].to_numpy(), "part": part.astype(np.uint64)},
                        index=df.index)


def _unit_ids(df: Any, unit_column: Any, drop_missing: bool) -> np.ndarray:
    """The text ids of one shuffled partition; a missing id refused unless ``drop_missing``."""
    from ..io import id_text
    from ..privacy_unit import _codes

    ids = id_text(df["uid"])
    _codes(ids, f"the privacy unit column {unit_column!r}", drop_missing)
    return ids


def _rows_per_unit(df: Any, unit_column: str, drop_missing: bool) -> Any:
    """One shuffled partition (every unit's rows in it): the number of rows of each unit (no ids)."""
    import pandas as pd

    ids = _unit_ids(df, unit_column, drop_missing)
    present = ids[~pd.isna(ids)].astype(str)
    _, counts = np.unique(present, return_counts=True)
    return pd.Series(counts.astype(np.int64))


def _truncate_part(df: Any, unit: Any, key: str, drop_missing: bool) -> Any:
    """One partition after the shuffle by unit (every unit's rows in it): the compact histogram
    (``cell``, ``count``) of the rows :func:`~sparsedp.unit_records.kept_rows` keeps."""
    import pandas as pd

    from ..unit_records import kept_rows

    if len(df) == 0:
        return pd.DataFrame({"cell": np.zeros(0, np.int64), "count": np.zeros(0, np.int64)})
    cells = df["cell"].to_numpy(dtype=np.int64)
    keep = kept_rows(cells, _unit_ids(df, unit.column, drop_missing), unit, key, drop_missing)
    u, cnt = np.unique(cells[keep], return_counts=True)
    return pd.DataFrame({"cell": u.astype(np.int64), "count": cnt.astype(np.int64)})


def _compute(ex: Any, obj: Any) -> Any:
    """Compute a dask collection on the executor: its Dask client, threads, or this thread."""
    from ..executors import DaskExecutor, ThreadExecutor

    if isinstance(ex, DaskExecutor):
        return ex.client.compute(obj, sync=True)
    if isinstance(ex, ThreadExecutor):
        return obj.compute(scheduler="threads")
    return obj.compute(scheduler="sync")


def unit_histogram_records(
    source: str | Path,
    column: str,
    bins: Bins,
    privacy_unit: Any,
    *,
    clip: bool = False,
    drop_missing_units: bool = False,
    key: str,
    executor: Any = None,
    epsilon: float | None = None,
    accountant: Any = None,
    rng: Any = None,
    _parts: list[RecordPart] | None = None,
) -> tuple[np.ndarray, Any, Any, float | None]:
    """``(histogram, concrete unit, bound choice, epsilon left)``: the int64 histogram of the
    records of ``source`` truncated to ``privacy_unit`` (the bins as groups), computed on
    ``executor`` with dask.dataframe: read and bin each part (every check), shuffle by the unit id
    (a unit's rows in one partition), truncate each partition with the partition-independent
    priorities of :func:`~sparsedp.unit_records.cell_priorities` (keyed by ``key``: the same rows
    as in one process), and add the compact counts.  ``max_rows="auto"`` first counts every unit's
    rows on the workers and spends ``auto_share`` of ``epsilon`` on the bound (charged to
    ``accountant``, after every check).  No loop over units in Python; the driver holds the
    histogram and (for ``auto``) one count per unit."""
    from ..contribution_bound import resolve_unit

    parts = record_parts(source, column) if _parts is None else _parts
    _check_unit_column(parts, privacy_unit.column)
    ex = get_executor(executor)
    import pandas as pd

    frame = _records_frame(parts, column, privacy_unit.column)
    meta = pd.DataFrame({"cell": np.zeros(0, np.int64), "uid": frame._meta[privacy_unit.column].to_numpy(),
                         "part": np.zeros(0, np.uint64)})
    binned = frame.map_partitions(_bin_ids, column, privacy_unit.column, bins, bool(clip), meta=meta)
    shuffled = binned.shuffle(on="part")
    choice, rest = None, epsilon
    unit = privacy_unit
    if unit.is_auto:  # every record checked while counting; then the (charged) choice
        per_unit = _compute(ex, shuffled.map_partitions(_rows_per_unit, unit.column, bool(drop_missing_units),
                                                        meta=pd.Series(np.zeros(0, np.int64))))
        unit, choice, rest = resolve_unit(unit, None, epsilon=epsilon, accountant=accountant, rng=rng,
                                          drop_missing=drop_missing_units,
                                          rows_per_unit=np.asarray(per_unit, dtype=np.int64))
    counts = shuffled.map_partitions(_truncate_part, unit, key, bool(drop_missing_units),
                                     meta={"cell": np.int64, "count": np.int64})
    total = _compute(ex, counts.groupby("cell")["count"].sum())
    hist = np.zeros(bins.count, dtype=np.int64)
    hist[np.asarray(total.index, dtype=np.int64)] = np.asarray(total.to_numpy(), dtype=np.int64)
    return hist, unit, choice, rest


def release_records(
    source: str | Path,
    column: str,
    bins: Bins,
    epsilon: float,
    *,
    privacy_unit: Any = None,
    drop_missing_units: bool = False,
    clip: bool = False,
    k: int = 16,
    chunk: int | None = None,
    executor: Any = None,
    scratch: str | Path | None = None,
    out: str | Path | None = None,
    progress: bool | None = None,
    **release: Any,
) -> ScaleoutRelease:
    """Publish the hierarchical histogram of the records in ``source`` (a Parquet / CSV file or a
    directory of them), column ``column`` binned on the public ``bins``, chunk by chunk.

    The mechanism, its sensitivity (one record moves one leaf by one: one node per level) and its
    calibration are those of :func:`~sparsedp.scaleout.release.release_hierarchical` on the
    ``bins.count`` leaves; the records are binned by the rule of :func:`~sparsedp.io.bin_records`
    (values outside ``[start, stop)`` refused, or put into the end bins when ``clip``), part by part
    (see the module docstring), and checked before any charge or noise.  ``executor``, ``chunk``,
    ``k``, ``out``, ``progress`` and the other keyword arguments (``accountant``, ``rng``,
    ``secure``, ``level_weights``) are as in ``release_hierarchical``; ``scratch`` holds the compact
    counts and the leaf histogram (default: a temporary directory next to ``out``), removed at the
    end.  ``timings`` gains ``"bin"`` and ``"assemble"``.

    ``privacy_unit`` (a :class:`~sparsedp.privacy_unit.PrivacyUnit` naming a column of the records)
    makes ``epsilon`` the budget per unit: the records are truncated to the unit's bounds on the
    executor (:func:`unit_histogram_records`: a shuffle by unit, no loop over units), then released
    at ``privacy_unit.row_budget("laplace", epsilon)``; ``drop_missing_units`` drops rows without
    an id (else refused).  With the same ``rng`` seed the truncation and the noise are those of
    ``sparsedp histogram`` in one process.  The release's :meth:`to_release` records the unit.
    """
    t0 = time.perf_counter()
    check_epsilon(epsilon, "epsilon")
    if not isinstance(bins, Bins):
        raise SparseDPError(f"bins must be a sparsedp.io.Bins, got {type(bins).__name__}")
    if not isinstance(clip, (bool, np.bool_)):
        raise SparseDPError(f"clip must be True or False, got {clip!r}")
    if isinstance(k, (bool, np.bool_)) or int(k) != k or k < 2:
        raise SparseDPError(f"k must be an integer >= 2, got {k!r}")
    n = bins.count
    c = default_chunk(n, int(k)) if chunk is None else _positive_int(chunk, "chunk")
    ChunkedTree(n, int(k), c)  # a power of k in [1, n], or a clear error
    parts = record_parts(source, column)  # the headers / schemas, before any work
    if privacy_unit is not None and not privacy_unit.is_row:
        return _release_unit_records(source, column, bins, epsilon, parts, privacy_unit, drop_missing_units, clip,
                                     int(k), c, executor, scratch, out, progress, release, t0)

    ex = get_executor(executor)
    owns = isinstance(executor, str)
    work = make_scratch(scratch, None if out is None else str(out), "sparsedp-records-")
    try:
        # 1-2. bin every part (all checks on the records happen here), assemble the leaf histogram
        histogram = os.path.join(work, "histogram.npy")
        timings = bin_to_histogram(source, column, bins, histogram, clip=clip, chunk=c, executor=ex, scratch=work,
                                   progress=progress, _parts=parts)
        # 3. the release (validates the blocks, charges once, measures)
        r = release_hierarchical(histogram, epsilon, k=int(k), chunk=c, executor=ex, out=out, scratch=work,
                                 progress=progress, **release)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if owns:
            ex.close()
    r.timings.update({"bin": timings["bin"], "assemble": timings["assemble"], "total": time.perf_counter() - t0})
    return r


def _release_unit_records(source: Any, column: str, bins: Bins, epsilon: float, parts: list[RecordPart], unit: Any,
                          drop: bool, clip: bool, k: int, c: int, executor: Any, scratch: Any, out: Any,
                          progress: Any, release: dict, t0: float) -> ScaleoutRelease:
    """:func:`release_records` with a privacy unit: truncate on the executor, write the histogram,
    release it at the per-row budget, and mark the release with the unit (and the bound's choice)."""
    import dataclasses

    from ..unit_records import choice_rng, unit_key

    rng = release.get("rng")
    if rng is not None and not isinstance(rng, (int, np.integer)):
        raise SparseDPError("with a privacy unit, rng is an integer seed (the truncation key is derived from it) "
                            "or None (secure)")
    ex = get_executor(executor)
    owns = isinstance(executor, str)
    work = make_scratch(scratch, None if out is None else str(out), "sparsedp-records-")
    try:
        t1 = time.perf_counter()
        hist, concrete, choice, rest = unit_histogram_records(
            source, column, bins, unit, clip=clip, drop_missing_units=drop, key=unit_key(rng), executor=ex,
            epsilon=epsilon, accountant=release.get("accountant"),
            rng=choice_rng(rng), _parts=parts)
        histogram = os.path.join(work, "histogram.npy")
        np.save(histogram, hist)
        t2 = time.perf_counter()
        r = release_hierarchical(histogram, concrete.row_budget("laplace", rest), k=k, chunk=c, executor=ex, out=out,
                                 scratch=work, progress=progress, **release)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if owns:
            ex.close()
    r = dataclasses.replace(r, privacy_unit=concrete, bound_choice=choice)
    r.timings.update({"truncate": t2 - t1, "total": time.perf_counter() - t0})
    return r
