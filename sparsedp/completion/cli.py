"""``sparsedp complete``: DP matrix completion on a synthetic problem or on a user's sparse matrix."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import ShapeError, SparseDPError
from ..io import load_entries
from ..release_file import save_release
from . import METHODS
from ._loop import check_iteration_args
from ._observed import as_pattern
from .metrics import oracle_rse
from .oracle import oracle_least_squares
from .privacy import privatize_observations
from .synthetic import synthetic_problem

HELP = """Complete a low-rank matrix from (privatized) observed entries.

Synthetic (the seed's experiment): X = U V^T, U and V standard normal of rank --rank, a random
fraction --observed of the --size x --size entries observed with Laplace noise of scale --noise-scale;
prints and saves the RSE against X, the asymptotic oracle floor (oracle_rse) and the exact oracle
(oracle_exact: least squares over the true tangent space, same noise draw).

User data: DATA holds the observed entries as (row, column, value) records: a CSV or Parquet file
with the columns named by --row, --col and --value (default row, col, value; 0-based integer
indices), an .npz holding a scipy.sparse matrix saved with scipy.sparse.save_npz (its stored
entries are the observations) or arrays of those names (numpy.savez), or a 2-D .npy array whose NaN
entries are the unobserved ones.  --shape ROWS COLS fixes the size (default: the largest indices
+ 1; the pattern of observed entries is public in this model).  A missing column, non-numeric,
missing or infinite values, negative, fractional or out-of-range indices, an entry given twice or
an empty file stop the command before any noise is drawn.  With --epsilon and --bounds the entries are first clipped and protected with
Laplace noise of scale (hi - lo) / epsilon per entry (entry-level DP; --max-per-row k for user-level
DP), exact discrete Laplace noise on a grid (--grid; the default) from fresh operating-system
entropy; --float-noise switches to float64 Laplace noise (an explicit opt-out for experiments: it
can leak through its low bits).
Without --epsilon the command refuses to run unless --no-privacy is given: the values are then
fitted as given and every output (printed report, --json, --save) is marked NOT private.
--save writes the factors (left, right) to a sparsedp release file (.npz) with the fields private
(bool) and privacy (a description; epsilon, unit and bounds too for a release) and the privacy
ledger of the measurement (`sparsedp ledger FILE` prints it); never the observed values.  --seed-noise makes the noise reproducible
from --seed, and the outputs are then marked NOT private as well.  All parameters of the fit are
checked before the noise is drawn.

Whenever the noise level is known (synthetic data, or --epsilon), every method fits the
noise-calibrated nuclear-norm penalised model (see docs/completion.md); --plain forces the
unregularised rank-r least-squares fit of DLNM-QR, SOR and AM instead."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("complete", help="DP low-rank matrix completion (DLNM-QR, SOR, AM, Soft-Impute)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default=None,
                   help="observed entries: CSV / Parquet records (--row, --col, --value), .npz (scipy.sparse.save_npz, "
                   "or arrays row, col, value), or a 2-D .npy with NaN = unobserved; omit for a synthetic problem")
    p.add_argument("--row", default="row", help="user data: column (or .npz array) of 0-based row indices (default row)")
    p.add_argument("--col", default="col", help="user data: column (or .npz array) of 0-based column indices (default col)")
    p.add_argument("--value", default="value", help="user data: column (or .npz array) of the observed values (default value)")
    p.add_argument("--shape", type=int, nargs=2, metavar=("ROWS", "COLS"), default=None,
                   help="user data: matrix size (default: the largest indices + 1)")
    p.add_argument("--size", type=int, default=1000, help="synthetic: number of rows and columns (default 1000)")
    p.add_argument("--rank", type=int, default=10,
                   help="rank of the fit, the maximum rank for --method soft (and the synthetic truth's rank) (default 10)")
    p.add_argument("--observed", type=float, default=0.15, help="synthetic: fraction of entries observed (default 0.15)")
    p.add_argument("--noise-scale", type=float, default=1.0,
                   help="synthetic: Laplace scale b of the noise on observed entries (default 1); "
                        "also calibrates --method soft on user data without --epsilon")
    p.add_argument("--method", choices=sorted(METHODS), default="dlnm-qr", help="completion method (default dlnm-qr)")
    p.add_argument("--max-iter", type=int, default=500, help="iteration cap (default 500)")
    p.add_argument("--tol", type=float, default=1e-4, help="stopping tolerance on the relative change (default 1e-4)")
    p.add_argument("--epsilon", type=float, default=None, help="user data: privatize with this epsilon first")
    p.add_argument("--bounds", type=float, nargs=2, metavar=("LO", "HI"), default=None,
                   help="user data: clipping bounds of the values (required with --epsilon)")
    p.add_argument("--max-per-row", type=int, default=None, help="user data: user-level DP, keep at most k entries per row")
    p.add_argument("--secure", action="store_true",
                   help="user data: exact discrete Laplace noise on a grid (the default; kept for compatibility)")
    p.add_argument("--float-noise", action="store_true",
                   help="user data: float64 Laplace noise instead of the default exact discrete noise (an explicit "
                        "opt-out for experiments: float noise can leak through its low bits)")
    p.add_argument("--grid", type=float, default=None,
                   help="user data: grid step of the released values with exact noise (default (HI - LO) / 1024)")
    p.add_argument("--no-privacy", action="store_true",
                   help="user data without --epsilon: fit the raw values as given (the outputs are marked NOT "
                        "private; without this flag such a run is refused)")
    p.add_argument("--seed-noise", action="store_true",
                   help="user data: draw the privacy noise from --seed (reproducible but NOT private: anyone "
                        "who knows the seed can subtract the noise; default: fresh operating-system entropy)")
    p.add_argument("--plain", action="store_true",
                   help="fit rank-r least squares even when the noise level is known (no calibrated shrinkage)")
    p.add_argument("--seed", type=int, default=0, help="random seed (data, noise, initialisation) (default 0)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON to FILE")
    p.add_argument("--save", default=None, metavar="FILE", help="write the factors left, right (X_hat = left @ right.T) to FILE.npz")
    p.set_defaults(func=_complete)


def _warn(message: str) -> None:
    print(f"sparsedp: warning: {message}", file=sys.stderr, flush=True)


def _check_fit_args(args: argparse.Namespace) -> None:
    """Everything the fit and the output files need, checked before any noise is drawn."""
    check_iteration_args(args.tol, 1e-12, args.max_iter)
    if args.rank < 1:
        raise ShapeError(f"--rank must be >= 1, got {args.rank}")
    for flag, target in (("--json", args.json), ("--save", args.save)):
        if target is not None and not Path(target).resolve().parent.is_dir():
            raise ShapeError(f"{flag}: the directory of {target} does not exist")


def _load(path: Path, args: argparse.Namespace) -> sp.csr_matrix:
    """The observed entries of a user's file (:func:`sparsedp.io.load_entries`)."""
    if not path.is_file():
        raise ShapeError(f"no such file: {path}")
    return load_entries(path, row=args.row, col=args.col, value=args.value,
                        shape=tuple(args.shape) if args.shape is not None else None)


def _complete(args: argparse.Namespace) -> int:
    _check_fit_args(args)
    truth, floor, known = None, None, False
    report: dict[str, Any] = {"method": args.method, "rank": args.rank}
    saved: dict[str, Any] = {}
    if args.data is None and args.shape is not None:
        raise ShapeError("--shape is for a DATA file (the synthetic problem takes --size)")
    if args.data is None:
        observed, truth = synthetic_problem(args.size, rank=args.rank, p=args.observed,
                                            noise_scale=args.noise_scale, rng=args.seed)
        floor = oracle_rse(args.size, rank=args.rank, p=args.observed, scale=args.noise_scale) if args.noise_scale > 0 else 0.0
        report["oracle_exact"] = oracle_least_squares(observed, truth).rse
        noise_std = math.sqrt(2) * args.noise_scale
        known = args.noise_scale > 0
        report.update(size=args.size, observed=args.observed, noise_scale=args.noise_scale,
                      private=False, privacy="synthetic problem: no private data (its noise is simulated)")
    else:
        path = Path(args.data)
        observed = _load(path, args)
        noise_std = math.sqrt(2) * args.noise_scale
        if args.epsilon is None:
            if not args.no_privacy:
                raise SparseDPError(
                    "refusing to fit the raw values of a user's matrix without a privacy budget: give --epsilon "
                    "and --bounds LO HI, or --no-privacy to fit the values as given (the outputs are NOT private)")
            _warn("--no-privacy: the fit and every output are computed from the raw values: NOT private")
            report.update(private=False, privacy="NOT private: fitted to the raw values (--no-privacy)")
        else:
            if args.no_privacy:
                raise SparseDPError("--no-privacy contradicts --epsilon: give one of them")
            if args.bounds is None:
                raise ShapeError("--epsilon needs --bounds LO HI")
            as_pattern(observed, args.rank)  # the rank must fit the matrix: checked before the release
            if args.float_noise and (args.secure or args.grid is not None):
                raise SparseDPError("--float-noise contradicts --secure and --grid (exact noise on a grid)")
            noise_rng = args.seed if args.seed_noise else None  # a known seed would let anyone remove the noise
            release = privatize_observations(observed, args.epsilon, tuple(args.bounds), rng=noise_rng,
                                             max_entries_per_row=args.max_per_row, secure=not args.float_noise,
                                             grid=args.grid)
            if args.float_noise:
                _warn("--float-noise: float64 Laplace noise can leak through its low bits (Mironov 2012); the "
                      "default exact discrete noise does not")
            observed, noise_std = release.matrix, release.noise_std
            private = not args.seed_noise
            privacy = (f"{release.epsilon:g}-DP per {release.unit} (Laplace on the values clipped to "
                       f"[{release.bounds[0]:g}, {release.bounds[1]:g}]; the pattern is public)")
            if not private:
                privacy = "NOT private: the noise was drawn from --seed (--seed-noise); it would be " + privacy
                _warn("--seed-noise: anyone who knows --seed can subtract the noise: the outputs are NOT private")
            report.update(epsilon=release.epsilon, laplace_scale=release.scale, unit=release.unit, dropped=release.dropped,
                          secure=release.secure, grid=release.grid, private=private, privacy=privacy,
                          ledger=release.entry.as_dict() if release.entry is not None else None)
            saved.update(epsilon=release.epsilon, unit=release.unit, bounds=np.array(release.bounds))
            known = True
        report.update(data=str(path), shape=list(observed.shape), nnz=int(observed.nnz))
    kwargs: dict[str, Any] = {"truth": truth, "max_iter": args.max_iter, "tol": args.tol, "rng": args.seed}
    if args.method == "soft" or (known and not args.plain):
        kwargs["noise_std"] = noise_std
    report["shrinkage"] = "noise-calibrated" if "noise_std" in kwargs and args.method != "soft" else None
    res = METHODS[args.method](observed, args.rank, **kwargs)
    report.update(rse=res.rse, oracle_rse=floor, seconds=res.seconds, iterations=res.iterations,
                  converged=res.converged, residual=res.residual)
    for key in ("rse", "oracle_rse", "oracle_exact", "seconds", "iterations", "converged", "residual", "private"):
        if key not in report:
            continue
        value = report[key]
        print(f"{key:>11}: {value:.6g}" if isinstance(value, float) else f"{key:>11}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.save:  # a sparsedp release file: the factors, the privacy description and the ledger
        ledger = [report["ledger"]] if report.get("ledger") else []
        description = {k: report[k] for k in ("method", "rank", "privacy", "epsilon", "unit", "secure", "grid")
                       if k in report}
        save_release(args.save, "completion", {"left": res.left, "right": res.right,
                                               "private": np.bool_(report["private"]),
                                               "privacy": np.str_(report["privacy"]), **saved},
                     ledger=ledger, description=description, private=bool(report["private"]),
                     overwrite=bool(getattr(args, "force", False)))
    return 0
