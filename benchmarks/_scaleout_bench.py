"""Shared pieces of the scale-out benchmarks (bench_scaleout.py, bench_scaleout_treespan.py): peak
memory, a release on a fresh LocalCluster with the workers' own counters, one configuration in its
own subprocess, and the timings a chunked release reports."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sparsedp.executors import DaskExecutor  # noqa: E402
from _results import peak_rss_mib  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

peak_rss_mb = peak_rss_mib  # the name the scale-out benchmarks import


class CountingDask(DaskExecutor):
    """A DaskExecutor that adds up the pickled size of every task's arguments (what the driver sends)."""

    sent = 0

    def map(self, fn, *iterables, callback=None):
        args = [list(it) for it in iterables]
        for row in zip(*args):
            self.sent += len(pickle.dumps(row, protocol=5))
        return super().map(fn, *args, callback=callback)


def worker_stats(dask_worker=None) -> dict:
    """Run on every worker (``client.run``): its peak RSS and transfer counters."""
    return {
        "peak_rss_mb": peak_rss_mib(),
        "outgoing_bytes": int(getattr(dask_worker, "transfer_outgoing_bytes_total", 0)),
        "incoming_bytes": int(sum(e.get("total", 0) for e in getattr(dask_worker, "transfer_incoming_log", []))),
    }


def on_local_cluster(release: Callable[[Any], Any], res: dict, workers: int, memory: str) -> tuple[Any, dict, Any]:
    """``release(ex)`` on a fresh LocalCluster of ``workers`` worker processes (1 thread, ``memory``
    limit each; its start time goes to ``res["cluster_start_seconds"]``, not into the release's);
    returns ``(release result, {worker: worker_stats}, the closed executor)``;
    ``res["worker_peak_rss_mb"]`` is the largest worker peak."""
    t0 = time.perf_counter()
    ex = CountingDask.local(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=memory)
    res["cluster_start_seconds"] = time.perf_counter() - t0
    try:
        r = release(ex)
        stats = ex.client.run(worker_stats)
    finally:
        ex.close()
    res["worker_peak_rss_mb"] = max(s["peak_rss_mb"] for s in stats.values())
    return r, stats, ex


def record_release(res: dict, r: Any) -> None:
    """The chunked release's total seconds, its phases and its chunking."""
    res["seconds"] = r.timings["total"]
    res["phases"] = r.timings
    res["chunks"], res["chunk"] = r.chunks, r.chunk


def spawn(script: str, mode: str, argv: list[str], env: dict | None = None) -> dict:
    """``python script --one mode argv...`` in its own process (its peak RSS is its own); the JSON dict
    it prints last, or ``{"mode", "error"}``."""
    cmd = [sys.executable, script, "--one", mode, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1", **(env or {})})
    if proc.returncode != 0:
        return {"mode": mode, "error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def remove_dir(base: Path) -> None:
    """Delete the benchmark's files and its directory."""
    for p in base.glob("*"):
        p.unlink(missing_ok=True)
    base.rmdir()
