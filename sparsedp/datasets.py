"""Example data: the DPBench 1-D histograms from the shared datasets folder, and a synthetic fallback.

The shared folder is found at ``$SPARSEDP_SHARED/datasets`` if that variable is set, else at
``../shared/datasets`` beside the repository checkout.  DPBench: Hay, Machanavajjhala, Miklau, Chen,
Zhang, "Principled Evaluation of Differentially Private Algorithms using DPBench", SIGMOD 2016.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import SparseDPError

__all__ = [
    "shared_datasets_dir",
    "dpbench_names",
    "load_dpbench",
    "synthetic_histogram",
    "demo_histogram",
    "road_grid",
    "helsinki_roads",
    "restaurant",
]

# Data sets that belong to a subsystem live there and are re-exported here on first use.
_ELSEWHERE = {
    "road_grid": "sparsedp.flows.network",
    "helsinki_roads": "sparsedp.flows.osm",
    "restaurant": "sparsedp.consistency.restaurant",
}


def __getattr__(name: str):
    if name in _ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

DEFAULT_DPBENCH = "HEPTH.n4096.npy"


def shared_datasets_dir() -> Path | None:
    """The shared datasets folder, or ``None`` when it is absent."""
    env = os.environ.get("SPARSEDP_SHARED")
    candidates = [Path(env) / "datasets"] if env else []
    candidates.append(Path(__file__).resolve().parent.parent.parent / "shared" / "datasets")
    for path in candidates:
        if path.is_dir():
            return path
    return None


def dpbench_names() -> list[str]:
    """File names of the available DPBench 1-D histograms (empty if the folder is absent)."""
    root = shared_datasets_dir()
    if root is None or not (root / "dpbench_1d").is_dir():
        return []
    return sorted(p.name for p in (root / "dpbench_1d").glob("*.npy"))


def load_dpbench(name: str = DEFAULT_DPBENCH) -> np.ndarray:
    """Load one DPBench histogram (4096 bins, int64) as a float64 count vector."""
    root = shared_datasets_dir()
    if root is None:
        raise SparseDPError("the shared datasets folder was not found (set SPARSEDP_SHARED)")
    path = root / "dpbench_1d" / name
    if not path.is_file():
        raise SparseDPError(f"no DPBench histogram {name!r}; available: {dpbench_names()}")
    return np.load(path, allow_pickle=False).astype(np.float64)


def synthetic_histogram(n: int = 4096, seed: int = 0) -> np.ndarray:
    """A built-in histogram: a few log-normal bumps over a sparse background, integer counts."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 1.0, n)
    density = np.full(n, 0.05)
    for centre, width, height in zip(rng.uniform(0.1, 0.9, 4), rng.uniform(0.01, 0.08, 4), rng.uniform(20, 200, 4)):
        density += height * np.exp(-0.5 * ((grid - centre) / width) ** 2)
    return rng.poisson(density).astype(np.float64)


def demo_histogram(name: str = DEFAULT_DPBENCH) -> tuple[np.ndarray, str]:
    """A DPBench histogram when the shared folder is present, else the synthetic one; and its label."""
    try:
        return load_dpbench(name), f"DPBench {name}"
    except SparseDPError:
        return synthetic_histogram(), "synthetic (shared datasets not found)"
