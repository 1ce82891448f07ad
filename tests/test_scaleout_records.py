"""Records for the scale-out release (issue 14): Parquet / CSV binned part by part == np.histogram of all records."""

import json

import numpy as np
import pytest

from sparsedp.errors import BudgetExceededError, NonFiniteInputError, SparseDPError
from sparsedp.executors import DaskExecutor, ThreadExecutor
from sparsedp.io import Bins, bin_records
from sparsedp.measure import MeasurementPlan
from sparsedp.privacy import Accountant
from sparsedp.scaleout import bin_to_histogram, record_parts, release_hierarchical, release_records

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

BINS = Bins(0.0, 1000.0, 2.5)  # 400 leaves


def _values(size, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(300, 40, size // 2), rng.uniform(0, 1000, size - size // 2)]).clip(0, 999.9)


def _edges(bins):
    return bins.start + bins.width * np.arange(bins.count + 1)


@pytest.fixture()
def records(tmp_path):
    """Records split over a Parquet file of several row groups, a directory of two more and a CSV."""
    v = _values(12000, 1)
    pq.write_table(pa.table({"x": v[:5000], "id": np.arange(5000)}), tmp_path / "a.parquet", row_group_size=1100)
    d = tmp_path / "dataset"
    d.mkdir()
    pq.write_table(pa.table({"x": v[5000:9000]}), d / "part-0.parquet", row_group_size=1500)
    pq.write_table(pa.table({"x": v[9000:11000].astype(np.float32).astype(np.float64)}), d / "part-1.parquet")
    (d / "_SUCCESS").write_text("")  # ignored: not a record file
    np.savetxt(d / "part-2.csv", v[11000:], header="x", comments="", fmt="%.17g")
    return tmp_path, v


def test_binned_histogram_equals_np_histogram(records, tmp_path):
    root, v = records
    assert len(record_parts(root / "a.parquet", "x")) == 5  # one part per row group
    for source, vals in ((root / "a.parquet", v[:5000]), (root / "dataset", v[5000:])):
        for chunk in (16, 64, 400):
            h = tmp_path / f"h{chunk}.npy"
            info = bin_to_histogram(source, "x", BINS, h, chunk=chunk)
            got = np.load(h)
            assert got.dtype == np.int64 and info["records"] == vals.size
            np.testing.assert_array_equal(got, np.histogram(vals, bins=_edges(BINS))[0])
            np.testing.assert_array_equal(got, bin_records(vals, BINS))


def test_clip_puts_outside_records_in_the_end_bins(tmp_path):
    v = np.array([-5.0, 0.0, 3.2, 999.0, 1000.0, 1e30, -1e30])
    pq.write_table(pa.table({"x": v}), tmp_path / "o.parquet")
    with pytest.raises(SparseDPError, match="outside"):
        bin_to_histogram(tmp_path / "o.parquet", "x", BINS, tmp_path / "h.npy", chunk=16)
    bin_to_histogram(tmp_path / "o.parquet", "x", BINS, tmp_path / "h.npy", chunk=16, clip=True)
    got = np.load(tmp_path / "h.npy")
    np.testing.assert_array_equal(got, bin_records(v, BINS, clip=True))  # the rule of sparsedp histogram --clip
    assert got[0] == 3 and got[-1] == 3 and got[1] == 1


def test_release_equals_in_process_release_of_the_histogram(records):
    root, v = records
    x = np.histogram(v[5000:], bins=_edges(BINS))[0]
    base = release_hierarchical(x, 1.0, k=4, chunk=64, rng=7)
    threads = ThreadExecutor(2)
    try:
        r = release_records(root / "dataset", "x", BINS, 1.0, k=4, chunk=64, rng=7, executor=threads)
    finally:
        threads.close()
    np.testing.assert_array_equal(r.estimate, base.estimate)
    np.testing.assert_array_equal(r.top_values, base.top_values)
    assert r.loss == base.loss <= 1.0 and not r.private and {"bin", "assemble", "measure+upward"} <= set(r.timings)


def test_on_a_local_cluster_written_to_npy(records, tmp_path):
    pytest.importorskip("dask.distributed")
    root, v = records
    x = np.histogram(v[:5000], bins=_edges(BINS))[0]
    ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=False)  # worker threads: a quick start
    try:
        acc = Accountant(epsilon=1.0)
        r = release_records(root / "a.parquet", "x", BINS, 0.5, k=4, chunk=16, rng=2, executor=ex,
                            out=tmp_path / "out.npy", accountant=acc)
    finally:
        ex.close()
    np.testing.assert_array_equal(r.load(), release_hierarchical(x, 0.5, k=4, chunk=16, rng=2).estimate)
    assert acc.spent == 0.5 and len(acc.ledger) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("sparsedp-")]  # scratch removed


def _write(tmp_path, name, table):
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text(table)
    else:
        pq.write_table(table, path, row_group_size=2)
    return path


@pytest.mark.parametrize("name,table,column,err,match", [
    ("m.parquet", {"x": [1.0, 2.0]}, "y", SparseDPError, "no column 'y'"),
    ("s.parquet", {"x": ["a", "b"]}, "x", SparseDPError, "not numeric"),
    ("n.parquet", {"x": [1.0, 2.0, float("nan")]}, "x", NonFiniteInputError, "NaN"),
    ("null.parquet", {"x": [1, None, 3]}, "x", NonFiniteInputError, "NaN"),
    ("o.parquet", {"x": [1.0, 2.0, 5.0, 1000.0]}, "x", SparseDPError, "outside"),
    ("e.parquet", {"x": pa.array([], pa.float64())}, "x", SparseDPError, "no records"),
    ("t.csv", "x\n1\n2\nabc\n", "x", SparseDPError, "row 4 of column 'x' is not numeric"),
    ("m.csv", "x\n1\n", "y", SparseDPError, "no column 'y'"),
    ("b.csv", "x\n1\n\n2\n,\n", "x", SparseDPError, "not numeric"),
    ("i.csv", "x\n1\ninf\n", "x", NonFiniteInputError, "NaN or infinite"),
])
def test_bad_records_refused_before_charge_and_noise(tmp_path, monkeypatch, name, table, column, err, match):
    path = _write(tmp_path, name, table if isinstance(table, str) else pa.table(table))
    calls = []
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **kw: calls.append(1))
    acc = Accountant(epsilon=5.0)
    with pytest.raises(err, match=match):
        release_records(path, column, BINS, 1.0, k=4, chunk=16, rng=1, accountant=acc)
    assert calls == [] and acc.spent == 0 and acc.ledger == ()


def test_parameters_and_sources_checked(tmp_path, monkeypatch):
    path = _write(tmp_path, "ok.parquet", pa.table({"x": [1.0, 2.0]}))
    for kw in ({"chunk": 100}, {"chunk": "64"}, {"chunk": 16.0}, {"k": 1}, {"clip": 1}):
        with pytest.raises(SparseDPError):
            release_records(path, "x", BINS, 1.0, **{"k": 4, "chunk": 16, **kw})
    for bad in ((path, "x", (0, 10, 1), 1.0), (path, "x", BINS, 0.0), (tmp_path / "none.parquet", "x", BINS, 1.0),
                (tmp_path / "x.txt", "x", BINS, 1.0)):
        if str(bad[0]).endswith(".txt"):
            bad[0].write_text("x\n1\n")
        with pytest.raises(SparseDPError):
            release_records(*bad, k=4, chunk=16)
    with pytest.raises(SparseDPError, match="positive integer"):
        bin_to_histogram(path, "x", BINS, tmp_path / "h.npy", chunk=True)
    acc = Accountant(epsilon=0.5)
    with pytest.raises(BudgetExceededError):
        release_records(path, "x", BINS, 1.0, k=4, chunk=16, accountant=acc)
    assert acc.ledger == ()


def test_cli_histogram_records_with_executor(records, tmp_path, capsys):
    from sparsedp.cli import main

    root, v = records
    out = tmp_path / "out.npy"
    args = ["histogram", str(root / "a.parquet"), "--epsilon", "1", "--executor", "threads", "--workers", "2",
            "--k", "4", "--chunk", "64", "--seed", "5", "--force"]
    assert main(args + ["--column", "x", "--bins", "0", "1000", "2.5", "--out", str(out)]) == 0
    x = np.histogram(v[:5000], bins=_edges(BINS))[0]
    np.testing.assert_array_equal(np.load(out), release_hierarchical(x, 1.0, k=4, chunk=64, rng=5).estimate)
    meta = json.loads((tmp_path / "out.npy.release.json").read_text())
    assert meta["column"] == "x" and meta["bins"] == {"start": 0.0, "stop": 1000.0, "width": 2.5}
    assert meta["n"] == 400 and meta["private"] is False
    capsys.readouterr()
    assert main(args + ["--out", str(out)]) == 2  # records without --column / --bins
    assert "--column and --bins" in capsys.readouterr().err
    assert main(args + ["--column", "x", "--out", str(out)]) == 2  # --bins missing
    assert main(args + ["--column", "x", "--bins", "0", "100", "1", "--out", str(out)]) == 2  # outside: refused
    assert "outside" in capsys.readouterr().err
    assert main(args + ["--column", "x", "--bins", "0", "100", "1", "--clip", "--out", str(out)]) == 0


def test_a_seeded_release_does_not_depend_on_the_samplers_built_before():
    """The top nodes (a few rows: small sampler tables) share their scale with the chunks (many rows:
    large tables, built later in the same call); a seeded release must give the same noise whether
    or not the large tables already exist in this process."""
    from sparsedp import noise

    x = np.random.default_rng(4).integers(0, 5, 4 * 4096)
    noise._PLAN_CACHE.clear()
    first = release_hierarchical(x, 1.0, k=16, chunk=4096, rng=9)
    second = release_hierarchical(x, 1.0, k=16, chunk=4096, rng=9)
    np.testing.assert_array_equal(first.top_values, second.top_values)
    np.testing.assert_array_equal(first.estimate, second.estimate)


def test_a_rerun_bin_or_assemble_task_writes_the_same_counts(records, tmp_path):
    """Dask runs a task again when its worker dies: binning draws no noise, so both attempts agree."""
    from sparsedp.scaleout.records import assemble_chunk, bin_part

    root, v = records
    part = record_parts(root / "a.parquet", "x")[2]
    first = bin_part(part, 2, "x", BINS, False, 64, str(tmp_path))
    second = bin_part(part, 2, "x", BINS, False, 64, str(tmp_path))
    assert first.path != second.path and (first.chunks, first.starts, first.records) == (
        second.chunks, second.starts, second.records)
    for suffix in (".idx.npy", ".cnt.npy"):
        np.testing.assert_array_equal(np.load(first.path + suffix), np.load(second.path + suffix))
    h = tmp_path / "h.npy"
    np.lib.format.open_memmap(h, mode="w+", dtype=np.int64, shape=(BINS.count,)).flush()
    q = first.chunks[0]
    pieces = [(first.path, first.starts[0], first.starts[1])]
    totals = [assemble_chunk(q * 64, (q + 1) * 64, pieces, str(h)) for _ in range(2)]
    want = np.histogram(v[2200:3300], bins=_edges(BINS))[0][q * 64:(q + 1) * 64]  # row group 2 of 1100 rows
    np.testing.assert_array_equal(np.load(h)[q * 64:(q + 1) * 64], want)
    assert totals == [int(want.sum())] * 2


def test_csv_streamed_in_batches(tmp_path, monkeypatch):
    """A CSV file is read in batches: their counts merge, and an error names the file's own row."""
    from sparsedp.scaleout import records as rec

    monkeypatch.setattr(rec, "CSV_BATCH", 7)
    v = _values(100, 5)
    text = "id,x\n" + "".join(f"{i},{float(x)!r}\n" for i, x in enumerate(v))
    (tmp_path / "r.csv").write_text(text)
    bin_to_histogram(tmp_path / "r.csv", "x", BINS, tmp_path / "h.npy", chunk=16)
    np.testing.assert_array_equal(np.load(tmp_path / "h.npy"), bin_records(v, BINS))
    lines = text.splitlines()
    lines[51] = "50,oops"  # data row 50 = line 52 of the file
    (tmp_path / "bad.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(SparseDPError, match="row 52 of column 'x' is not numeric: text where numbers are expected") as info:
        bin_to_histogram(tmp_path / "bad.csv", "x", BINS, tmp_path / "h.npy", chunk=16)
    assert "oops" not in str(info.value)  # the position, never the value
