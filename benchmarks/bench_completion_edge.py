"""Why nothing beats the zero matrix at b = 10 (seed 003's Table 2 setting): the detection edge.

Setting of ``bench_completion.py``: ``X = U V^T`` (1000 x 1000, rank 10, standard normal factors),
15% of entries observed with Laplace noise of scale ``b``.  The zero-filled, rescaled release
``Y = P_Omega(M) / p`` is ``X`` plus a noise matrix whose entries have variance
``sigma_e^2 = (2 b^2 + (1 - p) P) / p`` (``P`` = mean squared signal entry, estimated from the
release as ``mean(M_Omega^2) - 2 b^2``).  In units of ``sigma_e sqrt(n)`` the noise spectrum of a
square matrix ends at 2 (Marchenko-Pastur); a rank-one component is detectable only above the
BBP threshold: a signal singular value ``s`` (here about ``sqrt(m n P / r)``) appears as an outlier
only if ``theta = s / (sigma_e sqrt(n)) > 1`` (then at ``y = theta + 1/theta``), and below it no
estimator beats the zero matrix asymptotically.  The script prints, per ``b`` and seed, ``theta``
of the rms signal singular value, the top normalised singular values ``y`` of ``Y``, how many exceed the edge, the
RSE of Gavish-Donoho optimal shrinkage of those components
(``eta(y) = sqrt((y^2 - 2)^2 - 4) / y``, Gavish & Donoho 2017), the RSE of the noise-calibrated
DLNM-QR fit (the library default), and the zero matrix (RSE 1, the baseline).

    python benchmarks/bench_completion_edge.py [--seeds 6] [--out benchmarks/results/completion_edge.json]

BLAS pinned to one thread (threadpoolctl).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import scipy.sparse.linalg as sla
from threadpoolctl import threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sparsedp.completion import dlnm_qr, synthetic_problem  # noqa: E402

N, RANK, P = 1000, 10, 0.15


def edge_row(scale: float, seed: int) -> dict:
    observed, (U, V) = synthetic_problem(N, rank=RANK, p=P, noise_scale=scale, rng=seed)
    truth_norm = math.sqrt(float(np.sum((U.T @ U) * (V.T @ V))))
    sigma2 = 2.0 * scale * scale
    power = max(float(np.mean(observed.data**2)) - sigma2, 0.0)
    sigma_e = math.sqrt((sigma2 + (1 - P) * power) / P)
    theta = math.sqrt(N * N * power / RANK) / (sigma_e * math.sqrt(N))
    u, s, vt = sla.svds(observed / P, k=RANK)
    y = s / (sigma_e * math.sqrt(N))
    eta = np.where(y > 2.0, np.sqrt(np.maximum((y**2 - 2.0) ** 2 - 4.0, 0.0)) / np.maximum(y, 1e-300), 0.0)
    est = (u * (eta * sigma_e * math.sqrt(N))) @ vt
    gd_rse = float(np.linalg.norm(est - U @ V.T) / truth_norm)
    fit = dlnm_qr(observed, RANK, noise_std=math.sqrt(sigma2), truth=(U, V))
    return {"scale": scale, "seed": seed, "theta": theta, "top_y": sorted(map(float, y), reverse=True)[:4],
            "above_edge": int(np.sum(y > 2.0)), "rse_gavish_donoho": gd_rse, "rse_dlnm_calibrated": fit.rse,
            "rse_zero": 1.0, "gd_over_zero": gd_rse / 1.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=6, help="random problems per noise scale (default 6)")
    ap.add_argument("--out", default=str(HERE / "results" / "completion_edge.json"), help="JSON results file")
    args = ap.parse_args(argv)
    rows = []
    with threadpool_limits(1):
        print("BLAS threads: 1")
        print(f"{'b':>4}{'seed':>5}{'theta':>7}{'top normalised singular values (edge 2.0)':>44}{'above':>6}"
              f"{'RSE GD':>9}{'RSE DLNM':>10}{'GD/zero':>9}")
        for scale in (2.0, 5.0, 10.0):
            for seed in range(args.seeds):
                r = edge_row(scale, seed)
                rows.append(r)
                tops = " ".join(f"{v:.3f}" for v in r["top_y"])
                print(f"{scale:>4g}{seed:>5}{r['theta']:>7.3f}{tops:>44}{r['above_edge']:>6}{r['rse_gavish_donoho']:>9.4f}"
                      f"{r['rse_dlnm_calibrated']:>10.4f}{r['gd_over_zero']:>9.4f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"n": N, "rank": RANK, "p": P, "blas_threads": 1, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
