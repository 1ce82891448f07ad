"""Streaming counters one update at a time: seconds and peak memory at 2^16 and 2^20 steps.

Every Toeplitz counter (square root, BLT, a generic ``ToeplitzCounter`` given a decoder and its
strategy) with exact noise (the default), fed one increment per ``update`` call, next to the tree
counters (``ContinualCounter``, ``GLSTreeCounter``).  Each case runs in a fresh process (its peak
resident memory is ``ru_maxrss``, the interpreter and numpy included).  At ``2^16`` the Toeplitz
counters also run as implemented before the online convolution (``sparsedp.continual._online``):
the module ``sparsedp/continual/toeplitz.py`` of commit ``OLD_COMMIT`` (``O(t)`` per step), loaded
from git into the same package -- the ratio old / new is measured in the same run.  ``--coupling`` checks at ``2^20`` that the
release is a function of the measurement ``y = M' x + z`` alone: a stream and its neighbour (one
step + 1), with the noise moved by ``M' (x0 - x1)``, release the same bits at sampled steps.

    python benchmarks/bench_streaming.py [--sizes 65536 1048576] [--coupling] [--out benchmarks/results/streaming.json]

BLAS is pinned to one thread.  Timings on a shared machine are inflated by contention.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

RHO = 0.5
EPS = 1.0
COUNTERS = ("sqrt", "blt", "toeplitz", "fenwick", "gls-tree")
TOEPLITZ = ("sqrt", "blt", "toeplitz")
#: The last commit with the ``O(t)`` exact Toeplitz release.
OLD_COMMIT = "658e717"


def old_module():
    """``sparsedp.continual.toeplitz`` as of :data:`OLD_COMMIT` (read with ``git show``)."""
    import importlib.util

    import sparsedp.continual  # noqa: F401  (the package the old module's relative imports need)

    src = subprocess.run(["git", "show", f"{OLD_COMMIT}:sparsedp/continual/toeplitz.py"], cwd=HERE.parent,
                         check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("sparsedp.continual._toeplitz_before", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "sparsedp.continual"
    exec(compile(src, "toeplitz.py@" + OLD_COMMIT, "exec"), mod.__dict__)
    return mod


def make(name: str, N: int, old: bool = False):
    """The counter ``name`` over ``N`` steps, exact noise, fresh OS entropy (``old``: the Toeplitz
    counters of :data:`OLD_COMMIT`)."""
    from sparsedp import continual as c

    if old:
        c = old_module()

    if name == "sqrt":
        return c.SqrtCounter(N, RHO)
    if name == "blt":
        return c.BLTCounter(N, RHO)
    if name == "toeplitz":  # a user-supplied decoder (a fitted 3-buffer BLT) with its strategy
        blt = c.fit_blt(N, 3)
        return c.ToeplitzCounter(N, RHO, blt.decoder(N), strategy=blt.strategy(N))
    if name == "fenwick":
        return c.ContinualCounter(N, epsilon=EPS)
    if name == "gls-tree":
        return c.GLSTreeCounter(N, EPS)
    raise ValueError(name)


def case(name: str, N: int, old: bool) -> dict:
    """One run (in this process): build, then ``N`` updates of counts 0..4 (imports not timed)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    import sparsedp.continual  # noqa: F401

    if old:
        old_module()
    with threadpool_limits(1):
        t0 = time.perf_counter()
        ctr = make(name, N, old)
        t1 = time.perf_counter()
        for a in np.random.default_rng(1).integers(0, 5, N).tolist():
            ctr.update(a)
        t2 = time.perf_counter()
    return {"counter": name, "n": N, "implementation": f"before ({OLD_COMMIT})" if old else "online", "build_s": t1 - t0, "stream_s": t2 - t1,
            "total_s": t2 - t0, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def coupling(name: str, N: int, samples: int = 64) -> dict:
    """The coupling check at ``N`` (module docstring): ``_release_for`` of a stream and of its
    neighbour with the noise moved so that ``y`` is the same; equal bits at ``samples`` steps."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        ctr = make(name, N)
        gen = np.random.default_rng(7)
        x0 = gen.integers(0, 4, N).astype(float)
        j = int(gen.integers(N // 2))
        x1 = x0.copy()
        x1[j] += 1.0
        g = ctr.plan.grid
        z0 = g * np.rint(gen.normal(0.0, ctr.sigma / g, N))
        z1 = z0.copy()
        z1[j:] -= ctr._mf[: N - j]  # + M' (x0 - x1): column j of the rounded Toeplitz strategy
        t0 = time.perf_counter()
        a, b = ctr._release_for(x0, z0), ctr._release_for(x1, z1)
        steps = np.unique(np.concatenate([gen.integers(0, N, samples), [j, N - 1]]))
        same = bool(a[steps].tobytes() == b[steps].tobytes())
        return {"counter": name, "n": N, "sampled_steps": int(steps.size), "same_bits": same,
                "all_steps_same_bits": bool(a.tobytes() == b.tobytes()), "seconds": time.perf_counter() - t0}


def run_child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True,
                         env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                              "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 16, 1 << 20])
    ap.add_argument("--counters", nargs="+", default=list(COUNTERS))
    ap.add_argument("--coupling", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results" / "streaming.json"))
    ap.add_argument("--child", nargs="+")
    a = ap.parse_args()
    if a.child:
        kind, name, N = a.child[0], a.child[1], int(a.child[2])
        res = coupling(name, N) if kind == "coupling" else case(name, N, kind == "old")
        print(json.dumps(res))
        return
    rows, checks = [], []
    print(f"{'counter':10} {'n':>8} {'impl':>7} {'build s':>8} {'stream s':>9} {'peak MB':>8} {'old/new':>8}")
    for N in a.sizes:
        for name in a.counters:
            r = run_child(["online", name, str(N)])
            if name in TOEPLITZ and N <= 1 << 16:
                old = run_child(["old", name, str(N)])
                rows.append(old)
                r["old_over_new"] = old["stream_s"] / r["stream_s"]
                print(f"{name:10} {N:>8} {'before':>7} {old['build_s']:8.2f} {old['stream_s']:9.2f} "
                      f"{old['peak_rss_mb']:8.0f}")
            rows.append(r)
            ratio = f"{r['old_over_new']:8.1f}" if "old_over_new" in r else ""
            print(f"{name:10} {N:>8} {'online':>7} {r['build_s']:8.2f} {r['stream_s']:9.2f} {r['peak_rss_mb']:8.0f} "
                  f"{ratio}", flush=True)
    if a.coupling:
        for name in TOEPLITZ:
            c = run_child(["coupling", name, str(max(a.sizes))])
            checks.append(c)
            print(f"coupling {name} n = {c['n']}: same bits at {c['sampled_steps']} sampled steps: {c['same_bits']} "
                  f"(all steps: {c['all_steps_same_bits']}; {c['seconds']:.1f} s)", flush=True)
    out = {"rows": rows, "coupling": checks, "rho": RHO, "epsilon": EPS, "python": platform.python_version(),
           "machine": platform.machine(), "note": "exact noise; one update() call per step; fresh process per case"}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
