"""Large releases end to end: release -> report -> save -> load -> query, each step timed.

Every release kind runs at its large size in a fresh subprocess (so memory peaks do not mix), BLAS
pinned to one thread (threadpoolctl).  Per step: wall seconds and the process's maximum resident
set so far (``resource.getrusage``, monotone: the peak of the whole run up to the end of that
step).  The machine's load average is recorded at the start and end of each kind (2 shared cores:
a kind is marked ``contended`` above 1.5).

Kinds:

* ``prefix`` (``n = 2^20``): ``res = sparsedp.optimize(workloads.prefix(n))`` (defaults) ->
  ``MatrixMechanism(W, res.strategy, epsilon=1).run(x)`` -> ``error_report()`` ->
  ``confidence_intervals()`` twice (the second reuses the report) -> ``to_release()`` (its
  variances checked against the optimiser's report: ``rel_diff``) -> ``save`` (``.npz``) ->
  ``sparsedp.load_release`` -> a range of answers with their intervals (``table(rows=...)``).
* ``prefix-gaussian`` (``n = 2^20``): the same with ``noise="gaussian"`` (``rho = 1``): the
  optimiser's Toeplitz factorisation (``exact-toeplitz`` variances).
* ``topdown``: the 2020 voting-district table (``../shared/datasets/census2020_vtd``: 157,050
  districts, 16 cells, 4 levels) read, released by ``topdown(rho=1)``, reported, saved, loaded and
  1,600 answers (100 districts x 16 cells) queried with their intervals.
* ``marginals``: all 2- and 3-way marginals of 4 attributes of 100 values, 10^6 synthetic records,
  ``release_marginals(rho=1/2)`` (ResidualPlanner, exact discrete Gaussian noise).
* ``histogram`` (``n = 2^22``): ``MatrixMechanism(range_queries(n, 10,000 random ranges),
  hierarchical(n, 16), epsilon=1).run(x)`` -> report -> intervals -> to_release ->
  save -> load -> query.

Baselines (``baseline_seconds``, ``prefix`` only): what the same step took on main before the
report was exact and cached (measured there, 2 cores: ``expected_error`` 1,037 s, ``to_release``
1,043 s, both a stochastic estimate); ``ratio`` is baseline over now.

    python benchmarks/bench_scale_e2e.py [--kinds prefix prefix-gaussian histogram topdown marginals] [--out benchmarks/results/scale_e2e.json]
    python benchmarks/bench_scale_e2e.py --one prefix --log-n 12      # one kind, in this process
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _results import peak_rss_mib  # noqa: E402

#: Steps measured on main at fd01cb5 (2 cores) for ``prefix(2^20)``: seconds.  ``error_report`` is
#: the mechanism's ``expected_error()`` there (a stochastic estimate); ``to_release()`` took 1,043 s,
#: its report included (here the report is the step before and ``to_release`` reuses it).
PREFIX_BASELINE = {"optimize": 50.5, "run": 17.8, "error_report": 1037.0}
DEFAULT_LOG_N = {"prefix": 20, "prefix-gaussian": 20, "histogram": 22, "topdown": 0, "marginals": 0}


class Steps:
    """Times each step and records the peak RSS after it."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def __call__(self, name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        dt = time.perf_counter() - t0
        self.rows.append({"step": name, "seconds": round(dt, 4), "peak_rss_mib": round(peak_rss_mib(), 1)})
        print(f"  {name:<26} {dt:9.3f} s   peak RSS {peak_rss_mib():8.0f} MiB", flush=True)
        return out


def _reports(steps: Steps, rel):
    """error_report -> confidence_intervals (twice: the second reuses the report): what a user
    reads first, on a live release or a ReleaseResult."""
    rep = steps("error_report", rel.error_report)
    steps("confidence_intervals", rel.confidence_intervals)
    steps("confidence_intervals again", rel.confidence_intervals)
    return rep


def _query_roundtrip(steps: Steps, rel, tmp: Path, rows: slice) -> dict:
    """to_release -> save -> load -> query: the shared tail of every kind."""
    return _save_load_query(steps, steps("to_release", rel.to_release), tmp, rows)


def _save_load_query(steps: Steps, rr, tmp: Path, rows: slice) -> dict:
    """save -> load -> query of a ReleaseResult ``rr``."""
    import sparsedp

    path = steps("save", rr.save, tmp / "release.npz")
    loaded = steps("load_release", sparsedp.load_release, path)
    table = steps("query (rows + intervals)", loaded.table, 0.95, "auto", rows)
    same = bool(np.array_equal(np.asarray(loaded.answers), np.asarray(rr.answers)))
    return {"release": rr, "file_mib": round(path.stat().st_size / 2**20, 1), "loaded_equal": same,
            "query_rows": int(table["answer"].size)}


def run_prefix(log_n: int, tmp: Path, noise: str = "laplace") -> dict:
    import sparsedp
    from sparsedp import workloads

    n = 1 << log_n
    steps = Steps()
    W = workloads.prefix(n)
    res = steps("optimize", sparsedp.optimize, W, **({} if noise == "laplace" else {"noise": noise}))
    x = np.random.default_rng(0).integers(0, 100, n)
    budget = {"epsilon": 1} if noise == "laplace" else {"rho": 1, "noise": noise}
    mech = steps("plan (MatrixMechanism)", sparsedp.MatrixMechanism, W, res.strategy, **budget)
    rel = steps("run", mech.run, x)
    rep = _reports(steps, rel)
    tail = _query_roundtrip(steps, rel, tmp, slice(n // 2, n // 2 + 1000))
    total = float(np.sum(tail["release"].variances))
    opt = float(res.error.total)
    return {"kind": "prefix" if noise == "laplace" else f"prefix-{noise}", "n": n, "strategy": res.name, "family": res.family,
            "solver": rel.reconstruction.solver, "variance_method": tail["release"].variance_method,
            "report_method": rep.method, "optimizer_total": opt, "release_total": total,
            "rel_diff": abs(total - opt) / opt, "file_mib": tail["file_mib"], "loaded_equal": tail["loaded_equal"],
            "steps": steps.rows, "baseline_seconds": PREFIX_BASELINE if noise == "laplace" else {}}


def run_prefix_gaussian(log_n: int, tmp: Path) -> dict:
    return run_prefix(log_n, tmp, "gaussian")


def run_histogram(log_n: int, tmp: Path) -> dict:
    import sparsedp
    from sparsedp import strategies, workloads

    n = 1 << log_n
    steps = Steps()
    rng = np.random.default_rng(0)
    pairs = np.sort(rng.integers(0, n, (10_000, 2)), axis=1)
    W = workloads.range_queries(n, pairs)
    x = rng.integers(0, 100, n)
    mech = steps("plan (MatrixMechanism)", sparsedp.MatrixMechanism, W, strategies.hierarchical(n, 16), epsilon=1)
    rel = steps("run", mech.run, x)
    rep = _reports(steps, rel)
    tail = _query_roundtrip(steps, rel, tmp, slice(0, 1000))
    return {"kind": "histogram", "n": n, "strategy": "hierarchical(k=16)", "queries": int(pairs.shape[0]),
            "solver": rel.reconstruction.solver, "report_method": rep.method,
            "variance_method": tail["release"].variance_method, "file_mib": tail["file_mib"],
            "loaded_equal": tail["loaded_equal"], "steps": steps.rows}


TOPDOWN_DATA = HERE.parent.parent / "shared" / "datasets" / "census2020_vtd" / "us2020_vtd_race_eth_age.csv.gz"


def run_topdown(log_n: int, tmp: Path) -> dict:
    """The 2020 voting-district table (157,050 districts x 16 cells; ``log_n`` unused): read ->
    ``topdown(rho=1)`` -> to_release -> report -> intervals -> save -> load -> the last 1,600
    answers (100 districts x 16 cells)."""
    from sparsedp.topdown import read_table, topdown

    steps = Steps()
    table = steps("read_table", read_table, TOPDOWN_DATA, "state_fips,county_fips,vtd_code", "vap_*,u18_*",
                  attributes=("age", "race"), root="nation")
    rel = steps("topdown (rho = 1)", topdown, table, rho=1.0, rng=np.random.default_rng(0))
    rr = steps("to_release", rel.to_release)
    rep = _reports(steps, rr)
    n = len(rr)
    tail = _save_load_query(steps, rr, tmp, slice(n - 1600, n))
    return {"kind": "topdown", "n": n, "strategy": "TopDown, 4 levels", "report_method": rep.method,
            "variance_method": rr.variance_method, "file_mib": tail["file_mib"], "loaded_equal": tail["loaded_equal"],
            "query_rows": tail["query_rows"], "steps": steps.rows}


def run_marginals(log_n: int, tmp: Path) -> dict:
    """All 2- and 3-way marginals of 4 attributes of 100 values (``log_n`` unused), 10^6 synthetic
    records, ``rho = 1/2``: release -> report -> intervals -> to_release -> save -> load -> query."""
    from sparsedp.marginals import Domain, marginals_up_to, release_marginals, synthetic_records

    steps = Steps()
    dom = Domain.uniform(4, 100)
    X = synthetic_records(dom, 1_000_000, rng=1)
    work = [S for S in marginals_up_to(dom, 3) if len(S) >= 2]
    rel = steps("release_marginals (rho = 1/2)", release_marginals, X, dom, work, 0.5)
    rr = steps("to_release", rel.to_release)
    rep = _reports(steps, rr)
    tail = _save_load_query(steps, rr, tmp, slice(0, 10_000))
    return {"kind": "marginals", "n": len(rr), "strategy": f"residuals of {len(work)} marginals, 4 x 100",
            "report_method": rep.method, "variance_method": rr.variance_method, "file_mib": tail["file_mib"],
            "loaded_equal": tail["loaded_equal"], "query_rows": tail["query_rows"], "steps": steps.rows}


KINDS = {"prefix": run_prefix, "prefix-gaussian": run_prefix_gaussian, "histogram": run_histogram,
         "topdown": run_topdown, "marginals": run_marginals}


def one(kind: str, log_n: int) -> dict:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        out = KINDS[kind](log_n, Path(d))
    out["total_seconds"] = round(time.perf_counter() - t0, 3)
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    load1 = os.getloadavg()[0]
    out["load"] = [round(load0, 2), round(load1, 2)]
    out["contended"] = max(load0, load1) > 1.5
    return out


def _size(n: int) -> str:
    n = int(n)
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else f"{n:,}"


def _table(rows: list[dict]) -> str:
    lines = ["| kind | n | step | seconds | peak RSS (MiB) | baseline (s) | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        base = r.get("baseline_seconds") or {}
        for s in r["steps"]:
            b = base.get(s["step"])
            ratio = f"{b / s['seconds']:.0f}x" if b and s["seconds"] > 0 else ""
            lines.append(f"| {r['kind']} | {_size(r['n'])} | {s['step']} | {s['seconds']:.3f} | "
                         f"{s['peak_rss_mib']:.0f} | {b if b else ''} | {ratio} |")
        lines.append(f"| {r['kind']} | {_size(r['n'])} | **total** | {r['total_seconds']:.1f} | "
                     f"{r['peak_rss_mib']:.0f} | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--log-n", type=int, default=None, help="log2 n for every kind (default: each kind's large size)")
    ap.add_argument("--one", choices=list(KINDS), help="run one kind in this process, print its JSON")
    ap.add_argument("--out", default=str(HERE / "results" / "scale_e2e.json"))
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.log_n or DEFAULT_LOG_N[args.one]), default=float))
        return
    rows = []
    for kind in args.kinds:
        print(f"{kind}:", flush=True)
        cmd = [sys.executable, __file__, "--one", kind] + ([] if args.log_n is None else ["--log-n", str(args.log_n)])
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        sys.stdout.write("".join(l + "\n" for l in proc.stdout.splitlines() if not l.startswith("RESULT ")))
        if proc.returncode:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"{kind} failed")
        rows.append(json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:]))
    print(_table(rows))
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "blas_threads": 1, "rows": rows}
    from _results import write_rows

    write_rows(args.out, out, merge=True, key=("kind", "n"))


if __name__ == "__main__":
    main()
