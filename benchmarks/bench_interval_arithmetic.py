"""Would mpmath's interval arithmetic keep the exact samplers exact and no slower? (issue 15)

Usage::

    python benchmarks/bench_interval_arithmetic.py [--reps 3] [--out FILE]

The exact discrete Laplace / Gaussian samplers (``sparsedp.noise``) use interval arithmetic only
to build their tables: the 64-bit thresholds ``floor(b_i 2^64)`` of the CDF boundaries, and on the
rare exact ties (probability ~2^-64 per draw) ``floor(b_i 2^(64 r))``.  Drawing a sample compares
random bits with those integers and never touches the intervals.  This script swaps the present
backend (``noise._IA``: ``decimal`` contexts with directed rounding, ``Decimal.exp`` correctly
rounded and widened by 2 ulps) for two mpmath backends, in this process only (``noise.py`` is not
changed):

* ``libmpi``: ``mpmath.libmp.libmpi`` functions with an explicit precision (thread-safe, but an
  internal module of mpmath);
* ``iv``: the public ``mpmath.iv`` context (its precision ``iv.prec`` is global state).

``mpmath``'s ``mpf_exp`` rounds a fixed-point approximation with 14 guard bits (no Ziv loop), so
its directed rounding is not guaranteed in hard cases: both mpmath backends widen ``exp`` by
2 ulps, as the ``decimal`` backend does.  For every case the script checks that the three
backends give bitwise identical tables, and times the table build (best of ``--reps``) and one
exact tie resolution at 128-512 bits.  Results: printed, and JSON (default
``benchmarks/results/interval_arithmetic.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import mpmath
from mpmath import iv
from mpmath.libmp import (
    from_int,
    from_rational,
    fzero,
    libmpi,
    mpf_lt,
    mpf_shift,
    round_ceiling,
    round_floor,
    to_int,
)

import sparsedp.noise as N

LOG2_10 = math.log2(10)
CASES = [("laplace", 1.0, False), ("laplace", 10.0, False), ("laplace", 1000.0, False),
         ("laplace", 10.0, True), ("laplace", 1000.0, True), ("laplace", 0.1, False),
         ("laplace", 2.0**40, False), ("gaussian", 10.0, False), ("gaussian", 1000.0, False)]


def _mp(x: Any) -> tuple:
    """An interval given with Decimal ends (the plans' constant ``one``) as an mpmath interval."""
    if isinstance(x[0], Decimal):
        a, b = x[0].as_integer_ratio(), x[1].as_integer_ratio()
        return from_rational(*a, 4096, round_floor), from_rational(*b, 4096, round_ceiling)
    return x


def _widen(pair: tuple, prec: int) -> tuple:
    """Widen an mpmath ``exp`` result by 2 ulps at ``prec`` bits (lower end kept >= 0)."""
    lo, hi = pair

    def two_ulps(v: tuple) -> tuple:
        return mpf_shift(from_int(2), v[2] + v[3] - prec)

    if lo != fzero:
        lo = libmpi.mpf_sub(lo, two_ulps(lo), prec, round_floor)
        lo = fzero if mpf_lt(lo, fzero) else lo
    return lo, libmpi.mpf_add(hi, two_ulps(hi), prec, round_ceiling)


class LibmpiIA:
    """``noise._IA``'s interface on ``mpmath.libmp.libmpi`` (explicit precision)."""

    def __init__(self, digits: int) -> None:
        self.prec = math.ceil(digits * LOG2_10) + 4

    def const(self, f: Any) -> tuple:
        f = Fraction(f)
        return (from_rational(f.numerator, f.denominator, self.prec, round_floor),
                from_rational(f.numerator, f.denominator, self.prec, round_ceiling))

    def exp_neg(self, x: Any) -> tuple:
        return _widen(libmpi.mpi_exp(libmpi.mpi_neg(_mp(x)), self.prec), self.prec)

    def mul(self, a: Any, b: Any) -> tuple:
        return libmpi.mpi_mul(_mp(a), _mp(b), self.prec)

    def div(self, a: Any, b: Any) -> tuple:
        return libmpi.mpi_div(_mp(a), _mp(b), self.prec)

    def add(self, a: Any, b: Any) -> tuple:
        return libmpi.mpi_add(_mp(a), _mp(b), self.prec)

    def sub(self, a: Any, b: Any) -> tuple:
        lo, hi = libmpi.mpi_sub(_mp(a), _mp(b), self.prec)
        return (fzero if mpf_lt(lo, fzero) else lo), hi

    def _pair(self, x: Any) -> tuple:
        return _mp(x)

    def floor_scaled(self, x: Any, nbits: int) -> int | None:
        lo_, hi_ = self._pair(x)
        m = 1 << nbits
        lo = min(max(to_int(mpf_shift(lo_, nbits), round_floor), 0), m - 1)
        hi = min(max(to_int(mpf_shift(hi_, nbits), round_floor), 0), m - 1)
        return lo if lo == hi else None

    def ceil_scaled(self, x: Any, nbits: int) -> int:
        return to_int(mpf_shift(self._pair(x)[1], nbits), round_ceiling)

    def floor_lower(self, x: Any, nbits: int) -> int:
        return max(to_int(mpf_shift(self._pair(x)[0], nbits), round_floor), 0)


class IvIA(LibmpiIA):
    """The same on the public ``mpmath.iv`` context (sets the global ``iv.prec``)."""

    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        iv.prec = self.prec

    def _v(self, x: Any) -> Any:
        return x if isinstance(x, iv.mpf) else iv.make_mpf(_mp(x))

    def const(self, f: Any) -> Any:
        f = Fraction(f)
        return iv.mpf(f.numerator) / f.denominator

    def exp_neg(self, x: Any) -> Any:
        return iv.make_mpf(_widen(iv.exp(-self._v(x))._mpi_, self.prec))

    def mul(self, a: Any, b: Any) -> Any:
        return self._v(a) * self._v(b)

    def div(self, a: Any, b: Any) -> Any:
        return self._v(a) / self._v(b)

    def add(self, a: Any, b: Any) -> Any:
        return self._v(a) + self._v(b)

    def sub(self, a: Any, b: Any) -> Any:
        lo, hi = (self._v(a) - self._v(b))._mpi_
        return iv.make_mpf((fzero if mpf_lt(lo, fzero) else lo, hi))

    def _pair(self, x: Any) -> tuple:
        return x._mpi_ if isinstance(x, iv.mpf) else _mp(x)


BACKENDS = {"decimal": N._IA, "libmpi": LibmpiIA, "iv": IvIA}


def tables(plan: Any) -> list[np.ndarray]:
    if isinstance(plan, N._LaplacePlan):
        return [plan.main.c64] + [t.c64 for t in plan.low] + [plan.geo.c64]
    return [plan.lo64, plan.hm64] + tables(plan.lap)


def build(kind: str, scale: float, light: bool, backend: Any, reps: int) -> tuple[float, list[np.ndarray]]:
    original = N._IA
    N._IA = backend
    try:
        best = math.inf
        for _ in range(reps):
            N._PLAN_CACHE.clear()
            t = time.perf_counter()
            plan = N._LaplacePlan(scale, light) if kind == "laplace" else N._GaussPlan(scale)
            if kind == "laplace":
                plan.geo  # noqa: B018 (built on first use: include it)
            best = min(best, time.perf_counter() - t)
        return best, tables(plan)
    finally:
        N._IA = original
        N._PLAN_CACHE.clear()


def tie_seconds(backend: Any) -> tuple[float, list[int]]:
    original = N._IA
    plan = N._LaplacePlan(10.0, False)
    N._IA = backend
    try:
        t = time.perf_counter()
        vals = [plan.main.floor_bits(i, nb) for i in (0, 5, 17) for nb in (128, 256, 512)]
        return (time.perf_counter() - t) / len(vals), vals
    finally:
        N._IA = original


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "interval_arithmetic.json"))
    args = ap.parse_args(argv)
    rows = []
    print(f"{'table build':<22}" + "".join(f"{name:>10}" for name in BACKENDS) + "  identical")
    for kind, scale, light in CASES:
        row: dict[str, Any] = {"kind": kind, "scale": scale, "light": light}
        ref = None
        same = True
        for name, backend in BACKENDS.items():
            seconds, tabs = build(kind, scale, light, backend, args.reps)
            row[f"{name}_ms"] = round(seconds * 1e3, 2)
            if ref is None:
                ref = tabs
            else:
                same &= len(ref) == len(tabs) and all(np.array_equal(a, b) for a, b in zip(ref, tabs))
        row["identical_tables"] = bool(same)
        rows.append(row)
        label = f"{kind} {scale:g}" + (" light" if light else "")
        print(f"{label:<22}" + "".join(f"{row[f'{n}_ms']:>8.1f}ms" for n in BACKENDS) + f"  {same}")
    ties = {}
    ref_vals = None
    for name, backend in BACKENDS.items():
        seconds, vals = tie_seconds(backend)
        ref_vals = vals if ref_vals is None else ref_vals
        ties[name] = {"us_per_exact_floor": round(seconds * 1e6, 1), "identical": vals == ref_vals}
        print(f"tie resolution ({name}): {seconds * 1e6:.0f} us per exact floor, identical {vals == ref_vals}")
    out = {"benchmark": "interval arithmetic backends of the exact samplers' tables",
           "command": "python benchmarks/bench_interval_arithmetic.py", "reps": args.reps,
           "mpmath": mpmath.__version__, "python": platform.python_version(), "numpy": np.__version__,
           "note": "best-of-reps build times on a shared 2-core machine; sampling speed does not depend "
                   "on the backend (samples compare random bits with the precomputed 64-bit thresholds)",
           "rows": rows, "ties": ties}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
