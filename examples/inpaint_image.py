"""Inpaint a picture from a random 40% of its pixels, each protected by Laplace noise (entry-level DP).

The picture is generated here (no download): smooth shading plus a few plaid/stripe patterns, so it is
close to low rank, plus a soft disc, which is not.  Pixel values lie in [0, 1]; each observed pixel is
clipped to [0, 1] and released with Laplace noise of scale 1/epsilon (epsilon-DP for any single pixel
value; the set of observed positions is public): exact discrete Laplace noise on the grid 1/1024 (the
default of ``privatize_observations``; ``secure=False`` would use float64 noise).  The private pixels are completed with DLNM-QR
(rank fixed; given the release it reads the published noise level and fits the noise-calibrated
nuclear-norm penalised model) and with Soft-Impute (safe threshold at the published noise level),
and the before/after pictures are saved as PNGs.  (Measured at 256 x 256, 40% observed, rank 4:
RSE 0.096 / 0.048 / 0.323 for epsilon = 10 / 20 / 3, against 0.100 / 0.049 / 0.457 for the
unregularised rank-4 fit.)

The picture and the observed pixels come from --seed; the privacy noise comes from fresh
operating-system entropy unless --seed-noise is given (reproducible, and then NOT private: anyone who
knows the seed can subtract the noise).  The DLNM-QR picture ends in the common release model: a
``ReleaseResult`` of kind ``completion`` (one answer per pixel, labels ``row`` and ``col``, the
factors, the ledger entry of the noisy pixels; a completion has no per-pixel variance, so no
intervals), saved to a release file in a temporary directory and read back with
``sparsedp.load_release``.  The RSEs against the original picture are an evaluation, so the release
is marked ``private=False``.

    python examples/inpaint_image.py [--out examples/output] [--epsilon 10] [--observed 0.4] [--rank 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sparsedp  # noqa: E402
from sparsedp.completion import dlnm_qr, privatize_observations, rse, soft_impute  # noqa: E402
from sparsedp.releases import ReleaseResult, axis_labels  # noqa: E402


def make_picture(size: int = 256) -> np.ndarray:
    """A near-low-rank test picture in [0, 1]: shading, plaid, stripes and a soft disc."""
    t = np.linspace(0.0, 1.0, size)
    y, x = t[:, None], t[None, :]
    img = 0.35 + 0.25 * np.outer(np.cos(2.5 * t), np.sin(1.5 * t + 0.3))          # smooth shading
    img = img + 0.12 * np.outer(np.sign(np.sin(9 * t)), np.sign(np.sin(7 * t)))   # plaid
    img = img + 0.08 * np.outer(np.ones(size), np.sin(30 * t))                   # vertical stripes
    disc = np.exp(-(((x - 0.65) ** 2 + (y - 0.4) ** 2) / 0.02) ** 4)              # a soft disc (not low rank)
    img = img + 0.25 * disc
    return np.clip(img, 0.0, 1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "output"), help="directory for the PNGs")
    ap.add_argument("--epsilon", type=float, default=10.0, help="privacy budget per pixel value (default 10)")
    ap.add_argument("--observed", type=float, default=0.4, help="fraction of pixels observed (default 0.4)")
    ap.add_argument("--rank", type=int, default=4, help="rank of the DLNM-QR fit (default 4)")
    ap.add_argument("--size", type=int, default=256, help="picture size in pixels (default 256)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the observed pixels (default 0)")
    ap.add_argument("--seed-noise", action="store_true",
                    help="draw the privacy noise from --seed too: reproducible, and NOT private")
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(args.seed)
    truth = make_picture(args.size)
    i, j = np.nonzero(rng.random(truth.shape) < args.observed)
    observed = sp.csr_matrix((truth[i, j], (i, j)), shape=truth.shape)
    # OS entropy unless --seed-noise: whoever knows a seed can subtract the noise it drew
    release = privatize_observations(observed, args.epsilon, bounds=(0.0, 1.0), rng=rng if args.seed_noise else None)
    print(f"{observed.nnz} of {truth.size} pixels observed; exact discrete Laplace, scale {release.scale:.3g} "
          f"on the grid {release.grid:.3g} (epsilon = {release.epsilon:g} per pixel value)"
          + ("; noise drawn from --seed: NOT private" if args.seed_noise else ""))

    fixed = dlnm_qr(release, args.rank, truth=truth)  # the release carries its noise level
    soft = soft_impute(release, 3 * args.rank, truth=truth)
    shown = np.full(truth.shape, np.nan)
    shown[i, j] = np.clip(release.matrix[i, j].A1, 0, 1)
    pictures = {
        "original": truth,
        "observed_private": shown,
        "dlnm_qr": np.clip(fixed.to_dense(), 0, 1),
        "soft_impute": np.clip(soft.to_dense(), 0, 1),
    }
    print(f"DLNM-QR rank {args.rank} (lam {fixed.extra['lam']:.3g}): RSE {rse(fixed, truth):.4f}, {fixed.iterations} iterations, {fixed.seconds:.2f} s")
    print(f"Soft-Impute (rank {soft.extra['rank']}): RSE {rse(soft, truth):.4f}, {soft.iterations} iterations, {soft.seconds:.2f} s")

    # the completed picture in the common release model (post-processing of the noisy pixels)
    rel = ReleaseResult(kind="completion", answers=(fixed.left @ fixed.right.T).reshape(-1),
                        labels=axis_labels(truth.shape, ["row", "col"]), noise="laplace", secure=release.secure,
                        arrays={"left": fixed.left, "right": fixed.right}, ledger=[release.entry],
                        strategy=f"DLNM-QR rank {args.rank} of Laplace-noised pixels",
                        variance_method="unknown: no per-entry variance for a completion",
                        private=False)  # evaluated against the original above: not a publication
    with tempfile.TemporaryDirectory() as tmp:
        back = sparsedp.load_release(rel.save(Path(tmp) / "dlnm_qr.npz"))
        print(f"dlnm_qr.npz: {back.kind}, {len(back)} pixels, ledger total epsilon {back.epsilon:g} per pixel value, "
              f"private={back.private}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmap = plt.get_cmap("gray").copy()
    cmap.set_bad("black")
    for name, picture in pictures.items():
        path = out / f"{name}.png"
        plt.imsave(path, np.ma.masked_invalid(picture), cmap=cmap, vmin=0.0, vmax=1.0)
        print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
