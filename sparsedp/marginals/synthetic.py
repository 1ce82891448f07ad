"""Synthetic records for examples and benchmarks (simulation data, never privacy noise).

A latent-class model: each record belongs to one of ``classes`` hidden classes (weights from a
Dirichlet(1) draw), and given its class its attributes are independent with per-class
Dirichlet(``concentration``) distributions.  So every marginal is a mixture of product tables:
correlated, skewed, with empty and full cells -- a harder and more realistic test than uniform codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ShapeError
from ..noise import as_generator
from .domain import Domain

__all__ = ["synthetic_records"]


def synthetic_records(domain: Domain, n: int, *, classes: int = 8, concentration: float = 0.5,
                      rng: Any = None, chunk: int = 2**18) -> np.ndarray:
    """``n`` records on ``domain`` as an ``(n, d)`` array of codes (the :meth:`Domain.encode` dtype).

    ``rng``: seed or generator (the data are a simulation: reproducible by design).  Memory
    ``O(n d)`` for the output plus ``O(chunk * max size)`` temporaries."""
    n = int(n)
    if n < 0 or classes < 1 or not concentration > 0:
        raise ShapeError("n >= 0, classes >= 1 and concentration > 0 are required")
    gen = as_generator(rng)
    weights = gen.dirichlet(np.ones(classes))
    cdfs = [np.cumsum(gen.dirichlet(np.full(s, concentration), size=classes), axis=1) for s in domain.sizes]
    dt = domain.encode(np.zeros((0, len(domain)), dtype=np.int64)).dtype
    out = np.empty((n, len(domain)), dtype=dt)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        k = np.searchsorted(np.cumsum(weights), gen.random(b - a), side="right").clip(0, classes - 1)
        for i, C in enumerate(cdfs):
            u = gen.random(b - a)
            v = (u[:, None] >= C[k]).sum(axis=1)
            out[a:b, i] = np.minimum(v, domain.sizes[i] - 1)
    return out
