"""Audit of the online counters with the bit-for-bit reproduction distinguisher (the post-processing
rule, docs/privacy.md).

For each counter, a release of ``trials`` outputs from ``x0 = 0`` and from its neighbour ``x1 = e_1``
is audited (:func:`sparsedp.audit.audit`) together with two features computed from the output
alone: whether the counter's own code, fed the noise recovered from ``o - s_h`` under the
hypothesis ``h`` (``x0`` or ``x1``), reproduces ``o`` bit for bit.  A release ``s_t + e_t`` with
float offsets reproduces only under the truth (the audited bound then exceeds the claim); a
post-processing of the measurement reproduces under both.  The distinguisher and the noise
recovery are the test module's (``tests/test_postprocessing_rule.py``: ``NoiseRecovery``,
``counter_audit``), so this script measures exactly what the tests assert.

    python benchmarks/audit_counters.py [--out FILE]

Claims: pure DP ``epsilon = 1``; zCDP ``rho = 0.005``, audited as ``(eps(1e-5), 1e-5)`` =
``(0.485, 1e-5)``.  400 trials per input (the largest bound 400 trials can show is about 3.98).
One BLAS thread.  Results in ``benchmarks/results/audit_counters.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from threadpoolctl import threadpool_limits  # noqa: E402

import test_postprocessing_rule as rule  # noqa: E402

COUNTERS = ("sqrt", "blt", "toeplitz", "gls-tree", "gls-tree-gauss")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "audit_counters.json"))
    args = ap.parse_args(argv)
    rows = {}
    print(f"{'counter':<16} {'N':>4} {'claim':>7} {'audited lower bound':>20} {'reproduced':>11} {'seconds':>8}")
    with threadpool_limits(1):
        for name in COUNTERS:
            make, kind = rule.COUNTERS[name]
            N = rule.AUDIT_N.get(name, 13)
            t0 = time.perf_counter()
            res, claim, rec, stats = rule.counter_audit(make, N, kind)
            sec = time.perf_counter() - t0
            rows[name] = {"N": N, "noise": kind, "claim": claim, "epsilon_lower": res.epsilon_lower,
                          "noise_recovered": stats["recovered"], "outputs": stats["rows"], "seconds": sec,
                          "verdict": "violation" if res.epsilon_lower > claim else "no violation seen"}
            print(f"{name:<16} {N:>4} {claim:>7.3f} {res.epsilon_lower:>20.3f} "
                  f"{stats['recovered']:>5}/{stats['rows']:<5} {sec:>8.1f}", flush=True)
    Path(args.out).write_text(json.dumps({"blas_threads": 1, "trials_per_input": 400, "counters": rows}, indent=1))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
