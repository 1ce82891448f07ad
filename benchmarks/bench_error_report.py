"""Issue 20, items 3 and 4: the error report of a 2^24-bin tree, and one path per job.

Item 3 (``error``): ``expected_error(range_queries(n, 10,000 random ranges), hierarchical(n, 16),
Var = 2 b^2)`` with ``b = levels / eps`` (float Laplace; ``MatrixMechanism``'s default exact
discrete Laplace has variance 391.9 instead of 392 at ``b = 14``, the same computation): the exact per-query variances (``exact-tree``), against the Hutchinson estimate with 64
probes that ``error_report()`` used to fall back to (run at 2^20; at 2^24 its planned memory is
printed and a ``memory_limit`` below it is refused).  Also the exact ``all_ranges`` total (the old
closed form needed 9.4 GiB at 2^24).

Item 4 (``mm`` / ``boost``): ``MatrixMechanism(range_queries, hierarchical(n, 16),
epsilon=0.5).run(x)`` against ``trees.Boost(0.5, k=16).fit(x).ranges(pairs)`` (the same tree for
``n`` a power of 16; both draw exact discrete Laplace noise, their default), each phase timed, with the traced peak (``tracemalloc``: numpy's buffers)
and the process's maximum RSS.  At 2^20 both run in one process with the same seed to check that
the answers agree.

Every case runs in a fresh subprocess (so RSS peaks do not mix), BLAS pinned to one thread with
threadpoolctl.  The machine has 2 cores shared with other users: the load average at the start
and end of each case is recorded, and a case is marked ``contended`` when it exceeds 1.5.

    python benchmarks/bench_error_report.py [--log-n 20 24] [--out benchmarks/results/error_report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

EPS = 0.5
QUERIES = 10_000
K = 16


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _setup(n: int):
    from sparsedp import workloads as wl

    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, n)
    pairs = np.sort(rng.integers(0, n, (QUERIES, 2)), axis=1)
    return x, pairs, wl.range_queries(n, pairs)


class _Phases:
    """Wall time of each phase and the traced peak over all of them."""

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.out: dict[str, float] = {}
        tracemalloc.start()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.out[name] = round(now - self.t, 3)
        self.t = now

    def done(self) -> dict:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return {"phases_s": self.out, "total_s": round(sum(self.out.values()), 3),
                "traced_peak_mib": round(peak / 2**20, 1), "max_rss_mib": round(_rss_mib(), 1)}


def case_error(n: int) -> dict:
    from sparsedp import expected_error
    from sparsedp import strategies as st
    from sparsedp import workloads as wl
    from sparsedp.accuracy import MemoryLimitError, _block_size
    from sparsedp.calibration import laplace_scale
    from sparsedp.inference import linear_estimator

    _, _, W = _setup(n)
    M = st.hierarchical(n, K)
    levels = M.meta["layout"].levels
    v = np.full(M.shape[0], 2.0 * laplace_scale(float(levels), EPS) ** 2)
    out: dict = {"n": n, "queries": QUERIES, "levels": levels, "nodes": int(M.shape[0])}
    rss0 = _rss_mib()
    tracemalloc.start()
    t0 = time.perf_counter()
    rep = expected_error(W, M, v)
    sec = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out["exact"] = {"method": rep.method, "seconds": round(sec, 3), "traced_peak_mib": round(peak / 2**20, 1),
                    "total": rep.total, "per_query": rep.per_query,
                    "variance_min": float(rep.variances.min()), "variance_max": float(rep.variances.max()),
                    "rss_before_mib": round(rss0, 1), "max_rss_mib": round(_rss_mib(), 1)}
    # the old fallback: Hutchinson with 64 probes at once
    _, solver = linear_estimator(M, v)
    planned = None
    try:
        _block_size(W, M, solver, 64, 1e30, "", True)
        m = M.shape[0]
        planned = 8.0 * 64 * (m + 4 * m + 2 * n + 2 * QUERIES + 2) + 8.0 * QUERIES
    except MemoryLimitError:
        pass
    est: dict = {"probes": 64, "planned_mib_all_probes_at_once": round(planned / 2**20, 1) if planned else None}
    if n <= 1 << 20:
        tracemalloc.start()
        t0 = time.perf_counter()
        e = expected_error(W, M, v, method="estimate", probes=64, rng=0)
        est.update(seconds=round(time.perf_counter() - t0, 3),
                   traced_peak_mib=round(tracemalloc.get_traced_memory()[1] / 2**20, 1),
                   total=e.total, stderr=e.stderr, rel_stderr=round(e.stderr / e.total, 4),
                   rel_error_vs_exact=round(e.total / rep.total - 1, 4),
                   per_query_median_rel_error=round(float(np.median(np.abs(e.variances / rep.variances - 1))), 4))
        tracemalloc.stop()
    else:
        t0 = time.perf_counter()
        try:
            expected_error(W, M, v, method="estimate", probes=64, rng=0, memory_limit=5e8)
            est["refused"] = None
        except MemoryLimitError as exc:
            est["refused"] = str(exc)
            est["refusal_seconds"] = round(time.perf_counter() - t0, 4)
    out["estimate"] = est
    tracemalloc.start()
    t0 = time.perf_counter()
    allr = expected_error(wl.all_ranges(n), M, v)
    out["all_ranges"] = {"method": allr.method, "seconds": round(time.perf_counter() - t0, 3),
                         "traced_peak_mib": round(tracemalloc.get_traced_memory()[1] / 2**20, 1),
                         "per_query": allr.per_query}
    tracemalloc.stop()
    out["max_rss_mib"] = round(_rss_mib(), 1)
    return out


def case_mm(n: int) -> dict:
    import sparsedp
    from sparsedp import strategies as st

    x, _, W = _setup(n)
    p = _Phases()
    M = st.hierarchical(n, K)
    p.mark("strategy (implicit IntervalRows)")
    mech = sparsedp.MatrixMechanism(W, M, epsilon=EPS)
    p.mark("plan (calibration from the entries)")
    meas = mech.measure(x, rng=1)
    p.mark("measure (M x + noise)")
    rec = sparsedp.reconstruct(meas)
    p.mark("reconstruct (two-pass)")
    ans = W.matvec(rec.x)
    p.mark("answer")
    out = p.done()
    held = (M.lo.nbytes + M.hi.nbytes + M.weights.nbytes) if hasattr(M, "lo") else \
        (M.matrix.data.nbytes + M.matrix.indices.nbytes + M.matrix.indptr.nbytes)
    out.update(n=n, solver=rec.solver, strategy_mib=round(held / 2**20, 1),
               answers_head=[float(a) for a in ans[:3]])
    return out


def case_boost(n: int) -> dict:
    from sparsedp.trees import Boost

    x, pairs, _ = _setup(n)
    p = _Phases()
    pub = Boost(EPS, k=K)
    pub.fit(x, rng=1)
    p.mark("fit")
    ans = pub.ranges(pairs)
    p.mark("answer")
    out = p.done()
    out.update(n=n, answers_head=[float(a) for a in ans[:3]])
    return out


def case_same(n: int) -> dict:
    """Both paths in one process with the same seed: do the answers agree?"""
    import sparsedp
    from sparsedp import strategies as st
    from sparsedp.trees import Boost

    x, pairs, W = _setup(n)
    a = W.matvec(sparsedp.reconstruct(sparsedp.MatrixMechanism(W, st.hierarchical(n, K), epsilon=EPS)
                                      .measure(x, rng=1)).x)
    b = Boost(EPS, k=K).fit(x, rng=1).ranges(pairs)
    return {"n": n, "max_abs_diff": float(np.abs(a - b).max()), "max_abs_answer": float(np.abs(a).max())}


CASES = {"error": case_error, "mm": case_mm, "boost": case_boost, "same": case_same}


def _child(case: str, log_n: int) -> None:
    with threadpool_limits(1):
        load0 = os.getloadavg()[0]
        res = CASES[case](1 << log_n)
        res["load_avg_1min"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        res["contended"] = max(res["load_avg_1min"]) > 1.5
    print(json.dumps(res))


def _run(case: str, log_n: int) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__, "--child", case, str(log_n)], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode:
        return {"case": case, "log_n": log_n, "failed": proc.stderr[-2000:]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {case} 2^{log_n}: {json.dumps(res)[:400]}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log-n", type=int, nargs="+", default=[20, 24])
    ap.add_argument("--out", default=str(HERE / "results" / "error_report.json"))
    ap.add_argument("--child", nargs=2, metavar=("CASE", "LOG_N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    with threadpool_limits(1):
        blas = [{k: i.get(k) for k in ("internal_api", "num_threads")} for i in threadpool_info()]
    results: dict = {"machine": {"python": platform.python_version(), "numpy": np.__version__,
                                 "cpus": os.cpu_count(), "blas_threads": blas,
                                 "note": "2 cores shared with other engineers; see load_avg_1min per case"},
                     "epsilon": EPS, "queries": QUERIES, "branching": K, "item3": {}, "item4": {}}
    for log_n in args.log_n:
        print(f"n = 2^{log_n}", flush=True)
        results["item3"][str(log_n)] = _run("error", log_n)
        results["item4"][str(log_n)] = {"matrix_mechanism": _run("mm", log_n), "boost": _run("boost", log_n)}
        if log_n <= 20:
            results["item4"][str(log_n)]["same_answers"] = _run("same", log_n)
        mm, bo = results["item4"][str(log_n)]["matrix_mechanism"], results["item4"][str(log_n)]["boost"]
        if "total_s" in mm and "total_s" in bo:
            results["item4"][str(log_n)]["ratio_mm_over_boost"] = {
                "time": round(mm["total_s"] / bo["total_s"], 2),
                "max_rss": round(mm["max_rss_mib"] / bo["max_rss_mib"], 2),
                "traced_peak": round(mm["traced_peak_mib"] / bo["traced_peak_mib"], 2)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
