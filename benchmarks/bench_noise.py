"""Throughput of the noise samplers (samples per second, best of 3), with opendp as the reference.

Usage::

    python benchmarks/bench_noise.py [--n N] [--opendp-n M] [--big B] [--out FILE]

BLAS/OpenMP threads are pinned to one with ``threadpoolctl.threadpool_limits(1)`` (the samplers
are single-threaded numpy code anyway).  Each timing is the best of 3 repeats after a warm-up
call (which builds and caches the exact sampler's tables; its time, table build included, is
reported as "1st call").  Samplers reading secure bits through the shared default source
(OpenSSL's CTR_DRBG via ``ssl.RAND_bytes``, seeded by the OS; it buffers 1 MiB) or through
``SecureRandomBits(source="os")`` (``os.urandom``) make enough calls per repeat to read at least
8 MiB, so buffered bytes cannot inflate the rate.

The completion entry-level release (issue 13) draws ``--big`` (default 4e6) exact discrete Laplace
values at scale ``t = 1024``: those rows compare the exact sampler (both sources) with numpy's float
Laplace at the same size, as medians of 7 interleaved repetitions (``ratio_vs_float``).
opendp's integer Laplace (``make_laplace`` on ``vector_domain(atom_domain(T=int))``) is timed
on a vector of ``--opendp-n`` zeros.  If opendp is not installed its rows are skipped.

Other scripts can reuse the measurement::

    sys.path.insert(0, "benchmarks"); from bench_noise import run; results = run(10**6)

Results are printed as a table and written as JSON (default ``benchmarks/results/noise.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import ssl
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
try:  # run from a checkout without installing
    import sparsedp  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(HERE.parent))

from sparsedp import noise as nz  # noqa: E402

try:
    from threadpoolctl import threadpool_info, threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = threadpool_info = None

DEFAULT_OUT = HERE / "results" / "noise.json"


def _best(f: Callable[[], Any], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def _opendp_laplace(scale: float) -> Callable[[list], Any] | None:
    try:
        import opendp.prelude as dp
    except ImportError:
        return None
    dp.enable_features("contrib")
    return dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=scale)


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:
        return None


BIG_SCALE = 1024.0  # the completion entry-level release's discrete scale (issue 13)


def _big_draw(n: int, gen: np.random.Generator, os_bits: Any, reps: int = 7) -> list[dict]:
    """Exact (OpenSSL / os.urandom bits) against numpy's float Laplace, ``n`` draws at ``t = 1024``:
    medians of ``reps`` interleaved repetitions (order rotating) and their ratios to the float time."""
    fs: dict[str, Callable[[], Any]] = {
        "numpy Generator.laplace (float)": lambda: gen.laplace(0.0, BIG_SCALE, n),
        "sparsedp discrete_laplace, CSPRNG bits (OpenSSL)": lambda: nz.discrete_laplace(BIG_SCALE, n),
        "sparsedp discrete_laplace, os.urandom bits": lambda: nz.discrete_laplace(BIG_SCALE, n, rng=os_bits),
    }
    names = list(fs)
    times: dict[str, list[float]] = {k: [] for k in names}
    for f in fs.values():
        f()  # warm-up (tables)
    for r in range(reps):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t = time.perf_counter()
            fs[k]()
            times[k].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) for k, v in times.items()}
    ref = med[names[0]]
    return [{"name": k, "scale": BIG_SCALE, "n": n, "reps": reps, "seconds": times[k], "median_s": med[k],
             "samples_per_s": n / med[k], "ratio_vs_float": med[k] / ref} for k in names]


def run(n: int = 1_000_000, opendp_n: int = 200_000, repeats: int = 3, big: int = 4_000_000) -> dict:
    """Measure every sampler on ``n`` draws (opendp on ``opendp_n``) and the ``big`` draw at
    ``t = 1024`` (skipped if 0), and return the results dict."""
    n = int(n)
    limits = threadpool_limits(1) if threadpool_limits is not None else None
    try:
        rows: list[dict] = []

        def add(
            name: str, f: Callable[[], Any], count: int, scale: float | None, warm: bool = True, reps: int = 1
        ) -> None:
            """Time ``f`` (``count`` samples): best of ``repeats`` runs of ``reps`` calls, per call."""
            build = None
            if warm:
                t = time.perf_counter()
                f()  # warm-up: builds/caches tables
                build = time.perf_counter() - t

            def many() -> None:
                for _ in range(reps):
                    f()

            sec = _best(many, repeats) / reps
            rows.append(
                {
                    "name": name,
                    "scale": scale,
                    "n": count,
                    "seconds": sec,
                    "calls_per_repeat": reps,
                    "samples_per_s": count / sec,
                    "first_call_s": build,
                }
            )

        gen = np.random.default_rng(0)
        add("numpy Generator.laplace (float)", lambda: gen.laplace(0.0, 10.0, n), n, 10.0)
        add("sparsedp laplace (float)", lambda: nz.laplace(10.0, n, rng=gen), n, 10.0)
        # The default OS source buffers 1 MiB for small requests, so one small call may be
        # served from bytes read earlier.  Each timed repeat therefore makes enough calls to
        # read at least 8 MiB from the OS, and the time is divided by the number of calls.
        reps = max(1, -(-(8 << 20) // (2 * n)))
        for s in (1.0, 10.0, 1000.0):
            nz._PLAN_CACHE.clear()  # so that first_call_s includes the table build
            add("sparsedp discrete_laplace, CSPRNG bits (OpenSSL)", lambda s=s: nz.discrete_laplace(s, n), n, s, reps=reps)
        os_bits = nz.SecureRandomBits(source="os")
        for s in (10.0, 1000.0):
            add("sparsedp discrete_laplace, os.urandom bits", lambda s=s: nz.discrete_laplace(s, n, rng=os_bits), n, s,
                reps=reps)
        seeded = nz.SecureRandomBits(np.random.default_rng(1))
        add(
            "sparsedp discrete_laplace, numpy bits (not secure)",
            lambda: nz.discrete_laplace(10.0, n, rng=seeded),
            n,
            10.0,
        )
        nz._PLAN_CACHE.clear()
        add("sparsedp discrete_gaussian, CSPRNG bits (OpenSSL)", lambda: nz.discrete_gaussian(10.0, n), n, 10.0,
            reps=reps)
        chunk = 1 << 20
        nbytes = max(8 * chunk, 2 * n)
        nchunks = nbytes // chunk
        add("os.urandom (bytes/s)", lambda: [os.urandom(chunk) for _ in range(nchunks)], nchunks * chunk, None, warm=False)
        add("ssl.RAND_bytes (bytes/s)", lambda: [ssl.RAND_bytes(chunk) for _ in range(nchunks)], nchunks * chunk, None,
            warm=False)
        big_rows = _big_draw(int(big), gen, os_bits) if big else []

        opendp: dict[float, float] = {}
        have_opendp = _opendp_laplace(10.0) is not None
        if have_opendp:
            zeros = [0] * int(opendp_n)
            for s in (1.0, 10.0, 1000.0):
                meas = _opendp_laplace(s)
                add("opendp make_laplace, int vector", lambda meas=meas: meas(zeros), int(opendp_n), s, warm=False)
                opendp[s] = rows[-1]["samples_per_s"]
        for r in rows:
            ref = opendp.get(r["scale"]) if r["scale"] is not None else None
            r["ratio_vs_opendp_same_scale"] = (r["samples_per_s"] / ref) if ref and "bytes" not in r["name"] else None
        info = threadpool_info() if limits is not None else None
        return {
            "benchmark": "noise samplers, samples per second (best of %d)" % repeats,
            "command": "python benchmarks/bench_noise.py --n %d --opendp-n %d --big %d" % (n, opendp_n, big),
            "n": n,
            "opendp_n": int(opendp_n),
            "threads": "threadpoolctl.threadpool_limits(1)" if limits is not None else "threadpoolctl not installed",
            "threadpool_info": [
                {"api": d.get("internal_api"), "num_threads": d.get("num_threads")} for d in (info or [])
            ],
            "opendp_available": have_opendp,
            "versions": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                "opendp": _version("opendp"),
            },
            "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
            "results": rows,
            "big": big_rows,
        }
    finally:
        if limits is not None:
            limits.restore_original_limits()


def format_table(res: dict) -> str:
    lines = [f"{'sampler':52s} {'scale':>7s} {'samples/s':>11s} {'vs opendp':>10s} {'1st call':>9s}"]
    for r in res["results"]:
        scale = "" if r["scale"] is None else f"{r['scale']:g}"
        ratio = "" if r["ratio_vs_opendp_same_scale"] is None else f"{r['ratio_vs_opendp_same_scale']:.0f}x"
        first = "" if r["first_call_s"] is None else f"{r['first_call_s'] * 1e3:.0f} ms"
        rate = f"{r['samples_per_s']:.3g}" if "bytes" not in r["name"] else f"{r['samples_per_s'] / 1e6:.0f} MB/s"
        lines.append(f"{r['name']:52s} {scale:>7s} {rate:>11s} {ratio:>10s} {first:>9s}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="draws per timed call (default 1e6)")
    ap.add_argument("--opendp-n", type=int, default=200_000, help="vector length for opendp (default 2e5)")
    ap.add_argument("--big", type=int, default=4_000_000,
                    help="draws at t = 1024 against numpy's float Laplace (default 4e6; 0 skips)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output file")
    args = ap.parse_args(argv)
    if threadpool_limits is not None:
        print("threadpoolctl: BLAS/OpenMP threads pinned to 1 (threadpool_limits(1))")
    else:
        print("threadpoolctl not installed: threads NOT pinned")
    res = run(args.n, args.opendp_n, big=args.big)
    if not res["opendp_available"]:
        print("opendp is not installed: skipping the opendp reference")
    v = res["versions"]
    print(f"n = {res['n']}, opendp n = {res['opendp_n']}, python {v['python']}, numpy {v['numpy']}, opendp {v['opendp']}")
    print(format_table(res))
    if res["big"]:
        print(f"\n{res['big'][0]['n']:.3g} draws at t = {BIG_SCALE:g}, medians of {res['big'][0]['reps']} interleaved reps:")
        for r in res["big"]:
            print(f"  {r['name']:52s} {r['median_s']:.3f} s  {r['ratio_vs_float']:.2f}x float")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
