"""Test helper (not collected): many independent releases of :func:`sparsedp.marginals.release_marginals`,
cheaply.

``marginal_releases(R, seed, records, domain, marginals, rho, **kw)`` returns ``(release, tables,
plans)``: one real release (seeded with ``seed``), for each marginal key the ``(R, cells)`` tables of
``R`` independent releases, and the release's plans, as ``R`` calls would make them, with one set of plans.  A release builds its
residual plans (~50-120 ms on small domains: the exact sampler's certified loss), measures them
(~10 ms) and reconstructs the marginals (linear in the residuals).  Here the one real release's plans
and residual tables are recorded from its own ``plan.measure`` calls, ``R`` noisy measurements of
each come in one call from the plan's batched release (:func:`sparsedp.audit.plan_release`: the
plan's own ``measure`` on a block-diagonal copy, the only noise drawer), and each draw is
reconstructed by the release's own :func:`sparsedp.marginals.release._reconstruct_batch`.  The real
release is first checked to be exactly that reconstruction of the residuals its plans drew, so an
error in the release's steps still fails the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import sparsedp.marginals.release as release_mod
from sparsedp.audit import plan_release
from sparsedp.measure import MeasurementPlan


def _marginals(domain, sets, y: dict) -> dict:
    out = {}
    by_shape: dict[tuple, list] = {}
    for S in sets:
        by_shape.setdefault(domain.shape(S), []).append(S)
    for group in by_shape.values():
        for S, tab in zip(group, release_mod._reconstruct_batch(domain, group, y)):
            out[tuple(domain.names[i] for i in S)] = tab
    return out


def marginal_releases(R: int, seed: int, records: Any, domain: Any, marginals: Any, rho: float, **kw):
    calls = []
    real = MeasurementPlan.measure

    def spy(self, x, **mkw):
        m = real(self, x, **mkw)
        calls.append((self, np.array(x, copy=True), mkw.get("counts", True), m.y))
        return m

    MeasurementPlan.measure = spy
    try:
        rel = release_mod.release_marginals(records, domain, marginals, rho, rng=seed, **kw)
    finally:
        MeasurementPlan.measure = real
    keys = list(rel.residuals)  # in the order the release filled them: plan by plan, chunk order
    sizes = [int(np.asarray(rel.residuals[A]).size) for A in keys]
    np.testing.assert_array_equal(np.concatenate([y for *_, y in calls]),
                                  np.concatenate([np.asarray(rel.residuals[A]).ravel() for A in keys]))
    sets = list(rel.selection.marginals)
    again = _marginals(domain, sets, rel.residuals)
    assert again.keys() == rel.marginals.keys()
    for key, tab in again.items():
        np.testing.assert_allclose(rel.marginals[key], tab, rtol=1e-12, atol=1e-9)
    gen = np.random.default_rng(seed + 1)
    Y = np.hstack([plan_release(plan, counts=counts)(x, gen, R) for plan, x, counts, _ in calls])
    parts = np.split(Y, np.cumsum(sizes)[:-1], axis=1)
    tables: dict[tuple, list] = {key: [] for key in rel.marginals}
    for r in range(R):
        for key, tab in _marginals(domain, sets, {A: p[r] for A, p in zip(keys, parts)}).items():
            tables[key].append(np.ravel(tab))
    return rel, {key: np.array(v) for key, v in tables.items()}, [plan for plan, *_ in calls]
