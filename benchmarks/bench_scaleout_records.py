"""Scale-out release of record data (issue 14): Parquet records binned part by part vs the in-memory path.

``records``: :func:`sparsedp.scaleout.release_records` on the in-process executor (the records are
read one row group at a time, binned into compact per-chunk counts, assembled chunk by chunk);
``memory`` (the baseline): the whole column read with pyarrow, :func:`sparsedp.io.bin_records`,
:func:`sparsedp.scaleout.release_hierarchical`.  Same seed, so both must write the same bytes
(checked).  Each run is its own process (peak RSS = ``VmHWM``); the modes alternate, medians are
reported.  ``--dask`` adds runs of the ``records`` path on a new ``LocalCluster`` (2 worker
processes, 4 GB limit each; cluster start included in the process time, not in ``seconds``).

    python benchmarks/bench_scaleout_records.py --records 3.2e7 --log-n 24 --reps 2 [--dask]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BLAS_THREADS = 1


def _child(mode: str, path: str, log_n: int, out: str) -> None:
    from sparsedp._threads import blas_threads
    from sparsedp.io import Bins, bin_records
    from sparsedp.scaleout import release_hierarchical, release_records

    b = Bins(0, 2**log_n, 1)
    with blas_threads(BLAS_THREADS):
        ex = None
        if mode == "dask":
            from sparsedp.executors import DaskExecutor

            ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=True, memory_limit="4GB")
        t = time.perf_counter()
        if mode in ("records", "dask"):
            r = release_records(path, "x", b, 1.0, k=16, rng=1, out=out, executor=ex)
        else:
            import pyarrow.parquet as pq

            h = bin_records(pq.read_table(path).column("x").to_numpy(), b).astype(np.int64)
            r = release_hierarchical(h, 1.0, k=16, rng=1, out=out)
        seconds = time.perf_counter() - t
        if ex is not None:
            ex.close()
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"mode": mode, "seconds": seconds, "driver_peak_mb": hwm / 1024, "chunks": r.chunks,
                      "timings": {k: round(v, 3) for k, v in r.timings.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=float, default=3.2e7)
    ap.add_argument("--log-n", type=int, default=24)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dask", action="store_true")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child[0], a.child[1], int(a.child[2]), a.child[3])
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = Path(tempfile.mkdtemp(prefix="bench-records-"))
    data = work / "records.parquet"
    v = np.random.default_rng(0).uniform(0, 2**a.log_n, int(a.records))
    pq.write_table(pa.table({"x": v}), data, row_group_size=2**20)
    del v
    modes = ["records", "memory"] + (["dask"] if a.dask else [])
    rows: dict[str, list] = {m: [] for m in modes}
    outs = {}
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(BLAS_THREADS)}
    for _ in range(a.reps):
        for m in modes:
            out = str(work / f"{m}.npy")
            res = subprocess.run([sys.executable, __file__, "--child", m, str(data), str(a.log_n), out], env=env,
                                 capture_output=True, text=True, check=True)
            rows[m].append(json.loads(res.stdout.strip().splitlines()[-1]))
            outs[m] = Path(out).read_bytes()
    same = all(outs[m] == outs["memory"] for m in modes)
    load = os.getloadavg()[0]
    print(f"{int(a.records)} records, n = 2^{a.log_n} leaves, {pq.ParquetFile(data).num_row_groups} row groups, "
          f"BLAS threads {BLAS_THREADS}, load average {load:.1f} (shared 2-core machine)")
    print(f"{'mode':8} {'median s':>9} {'driver MB':>10}  runs")
    summary = {}
    for m in modes:
        s = float(np.median([r["seconds"] for r in rows[m]]))
        mb = float(np.median([r["driver_peak_mb"] for r in rows[m]]))
        summary[m] = {"median_seconds": s, "median_driver_peak_mb": mb, "runs": rows[m]}
        print(f"{m:8} {s:9.2f} {mb:10.0f}  {[round(r['seconds'], 2) for r in rows[m]]}")
    ratio = summary["records"]["median_seconds"] / summary["memory"]["median_seconds"]
    mem = summary["memory"]["median_driver_peak_mb"] / summary["records"]["median_driver_peak_mb"]
    print(f"records / memory time: {ratio:.2f}x; memory / records peak RSS: {mem:.1f}x; identical outputs: {same}")
    result = {"records": int(a.records), "log_n": a.log_n, "blas_threads": BLAS_THREADS, "load_average": load,
              "identical_outputs": same, "time_ratio_records_over_memory": ratio,
              "memory_ratio_memory_over_records": mem, "modes": summary,
              "command": "python benchmarks/bench_scaleout_records.py " + " ".join(sys.argv[1:])}
    dest = Path(__file__).parent / "results" / "scaleout_records.json"
    dest.write_text(json.dumps(result, indent=1))
    print(f"-> {dest}")
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
