"""Histograms of records per privacy unit at scale: truncation on a Dask LocalCluster.

Target: 10^8 synthetic rows of 10^6 units on a 2-worker ``LocalCluster`` in under 10 minutes,
under 2 GB per worker, and the same release as in one process on a 10^6-row slice with one seed.

Data (Parquet, one file per 10^7 rows, row groups of 2^21 rows): column ``x`` uniform integers on
``[0, 2^16)`` (the public bins: ``Bins(0, 2^16, 1)``), column ``uid`` the unit, skewed (``floor(U
* r^2)`` for ``r`` uniform: a few units have many rows, most have few).  Generated once into
``--data`` (kept for a second run).

Runs (BLAS pinned to 1 thread in every process):

1. ``dask``: :func:`sparsedp.scaleout.release_records` with ``privacy_unit=PrivacyUnit("uid",
   max_rows=K)`` on a new ``LocalCluster`` (2 worker processes, 1 thread each, ``--worker-memory``
   limit): read, bin, shuffle by unit, truncate each partition, add the counts, release (boost,
   ``k = 16``).  Wall seconds (cluster start excluded) and every worker's peak RSS
   (``ru_maxrss``, read on the workers after the run).
2. ``slice``: the first 10^6 rows (a file of their own): in this process what ``sparsedp histogram
   --method boost --seed S --privacy-unit uid --max-rows K`` runs (``read_unit_histogram``, then
   ``release_hierarchical`` at the per-row budget), and ``release_records`` on the same cluster
   with the same seed; ``identical`` says whether the answers are equal bit for bit.

    python benchmarks/bench_privacy_unit_scale.py [--rows 1e8] [--units 1e6] [--max-rows 200]
        [--worker-memory 2GB] [--data /tmp/sparsedp-pu-bench] [--out benchmarks/results/privacy_unit_scale.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

LOG_N = 16
FILE_ROWS = 10**7
ROW_GROUP = 2**21
SLICE = 10**6


def _generate(where: Path, rows: int, units: int, seed: int = 0) -> tuple[Path, Path]:
    """The records directory and the 10^6-row slice file (made once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, piece = where / "records", where / "slice.parquet"
    stamp = where / f"done-{rows}-{units}"
    if stamp.exists():
        return data, piece
    data.mkdir(parents=True, exist_ok=True)
    for old in data.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(seed)
    for i, start in enumerate(range(0, rows, FILE_ROWS)):
        m = min(FILE_ROWS, rows - start)
        t = pa.table({"x": rng.integers(0, 2**LOG_N, m, dtype=np.int64),
                      "uid": np.floor(units * rng.random(m) ** 2).astype(np.int64)})
        pq.write_table(t, data / f"part{i:04d}.parquet", row_group_size=ROW_GROUP)
        if i == 0:
            pq.write_table(t.slice(0, min(SLICE, m)), piece, row_group_size=SLICE // 4)
    stamp.touch()
    return data, piece


def _pin_blas() -> None:
    """On a worker: BLAS on one thread (the workers share 2 cores)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def _worker_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=float, default=1e8)
    ap.add_argument("--units", type=float, default=1e6)
    ap.add_argument("--max-rows", type=int, default=200)
    ap.add_argument("--worker-memory", default="2GB")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "sparsedp-pu-bench"))
    ap.add_argument("--out", default=str(HERE / "results" / "privacy_unit_scale.json"))
    a = ap.parse_args()

    from sparsedp._threads import blas_threads
    from sparsedp.executors import DaskExecutor
    from sparsedp.io import Bins
    from sparsedp.privacy_unit import PrivacyUnit
    from sparsedp.scaleout import release_hierarchical, release_records
    from sparsedp.unit_records import read_unit_histogram

    rows, units = int(a.rows), int(a.units)
    where = Path(a.data)
    where.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    data, piece = _generate(where, rows, units)
    gen = time.perf_counter() - t
    bins = Bins(0, 2**LOG_N, 1)
    unit = PrivacyUnit("uid", max_rows=a.max_rows)
    out: dict = {"benchmark": "privacy_unit_scale", "rows": rows, "units": units, "bins": 2**LOG_N,
                 "max_rows": a.max_rows, "worker_memory": a.worker_memory, "workers": 2, "threads_per_worker": 1,
                 "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                 "load_start": os.getloadavg()[0], "generate_seconds": gen}
    with blas_threads(1):
        ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=True, memory_limit=a.worker_memory)
        try:
            ex.client.run(_pin_blas)
            scratch = where / "out"
            scratch.mkdir(exist_ok=True)
            t = time.perf_counter()
            r = release_records(data, "x", bins, 1.0, privacy_unit=unit, executor=ex, rng=a.seed, k=16,
                                out=scratch / "full.npy")
            out["dask_seconds"] = time.perf_counter() - t
            out["dask_timings"] = {k: float(v) for k, v in r.timings.items()}
            out["worker_peak_mb"] = sorted(ex.client.run(_worker_peak_mb).values())
            print(f"dask: {out['dask_seconds']:.1f} s, worker peaks {out['worker_peak_mb']} MB", flush=True)
            (where / "partial.json").write_text(json.dumps(out, indent=1, default=float))  # if a later step fails
            t = time.perf_counter()
            rs = release_records(piece, "x", bins, 1.0, privacy_unit=unit, executor=ex, rng=a.seed, k=16,
                                 out=scratch / "slice.npy")
            out["slice_dask_seconds"] = time.perf_counter() - t
            dask_answers = np.asarray(rs.to_release().answers).copy()
        finally:
            ex.close()
        t = time.perf_counter()  # in this process: what sparsedp histogram --method boost --seed S runs
        x, concrete, _, rest = read_unit_histogram(piece, "x", bins, unit, epsilon=1.0, rng=a.seed)
        ri = release_hierarchical(x, concrete.row_budget("laplace", rest), k=16, rng=a.seed)
        out["slice_inprocess_seconds"] = time.perf_counter() - t
        inproc = np.asarray(ri.to_release().answers)
    out["slice_identical"] = bool(np.array_equal(inproc, dask_answers))
    out["load_end"] = os.getloadavg()[0]
    out["meets_target"] = bool(out["dask_seconds"] < 600 and max(out["worker_peak_mb"]) < 2048
                               and out["slice_identical"])
    print(f"{'rows':>12} {'units':>9} {'max_rows':>8} {'dask s':>8} {'worker peak MB':>16} {'slice same':>10}")
    print(f"{rows:>12,} {units:>9,} {a.max_rows:>8} {out['dask_seconds']:>8.1f} "
          f"{max(out['worker_peak_mb']):>16.0f} {str(out['slice_identical']):>10}")
    print("phases (s):", ", ".join(f"{k} {v:.1f}" for k, v in out["dask_timings"].items()))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
