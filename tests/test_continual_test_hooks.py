"""The private test hooks of the online counters (``_offsets_for``, ``_offset_matrix``,
``_draw_offsets``): the empirical-variance tests draw many independent releases of one counter's
plan through them, so they must be the counter's own releases (suite speed)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from _counter_draws import drawn_noise

from sparsedp import continual as c
from sparsedp.audit import plan_release
from sparsedp.errors import SparseDPError

N = 21


@cache
def _blt():
    return c.fit_blt(N, 3)  # ~3.5 s: fitted once for the module


def _counters():
    blt = _blt()
    return {
        "fenwick": lambda r, s: c.ContinualCounter(N, epsilon=1.0, rng=r, secure=s),
        "fenwick-gauss": lambda r, s: c.ContinualCounter(N, rho=0.5, noise="gaussian", rng=r, secure=s),
        "naive": lambda r, s: c.NaiveCounter(N, 1.0, rng=r, secure=s),
        "binary": lambda r, s: c.BinaryMechanism(N, 1.0, rng=r, secure=s),
        "honaker": lambda r, s: c.HonakerCounter(N, 1.0, rng=r, secure=s),
        "kary": lambda r, s: c.KaryCounter(N, 1.0, k=3, weights=c.kary_weights(N, 3), rng=r, secure=s),
        "negdigit": lambda r, s: c.NegDigitCounter(N, 1.0, k=3, rng=r, secure=s),
        "gls": lambda r, s: c.GLSTreeCounter(N, 1.0, rng=r, secure=s),
        "gls-gauss": lambda r, s: c.GLSTreeCounter(N, rho=0.5, rng=r, secure=s),
        "sqrt": lambda r, s: c.SqrtCounter(N, 0.5, rng=r, secure=s),
        "blt": lambda r, s: c.BLTCounter(N, 0.5, blt=blt, rng=r, secure=s),
        "toeplitz": lambda r, s: c.ToeplitzCounter(N, 0.5, blt.decoder(N), blt.strategy_sq_sum(N), rng=r, secure=s),
    }


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("name", list(_counters()))
def test_offset_hooks_are_the_counters_own_releases(name, secure):
    make = _counters()[name]
    x = np.random.default_rng(0).poisson(3, N).astype(float)
    ctr = make(5, secure)
    out = ctr.run(x)
    fresh = make(5, secure)
    B = fresh._offset_matrix()
    assert B.shape == (N, fresh.plan.rows) and np.all(np.isfinite(B))
    z = drawn_noise(make(5, secure), 5)  # the noise the seeded counter drew
    scale = np.abs(out - np.cumsum(x)).max() + 1.0
    np.testing.assert_allclose(out - np.cumsum(x), B @ z, rtol=1e-9, atol=1e-9 * scale)
    np.testing.assert_allclose(fresh._offsets_for(z), B @ z, rtol=1e-9, atol=1e-9 * scale)
    assert fresh.t == 0  # the hooks work on copies
    # k releases at once: k noise vectors of the plan from its batched release (audit.plan_release)
    many = fresh._draw_offsets(3, np.random.default_rng(11))
    Z = plan_release(fresh.plan, counts=False)(np.zeros(fresh.plan.measured.shape[1]), np.random.default_rng(11), 3)
    assert Z.shape == (3, fresh.plan.rows)
    np.testing.assert_allclose(many, Z @ B.T, rtol=1e-9, atol=1e-9 * (np.abs(many).max() + 1.0))
    assert not np.allclose(many[0], many[1])
    if secure:  # exact noise: on the plan's lattice
        np.testing.assert_array_equal(Z / fresh.plan.grid, np.round(Z / fresh.plan.grid))


def test_offset_hooks_refuse_a_started_counter_and_reuse_no_noise():
    ctr = c.ContinualCounter(8, epsilon=1.0, rng=0, secure=False)
    ctr.update(1.0)
    with pytest.raises(SparseDPError, match="before its first step"):
        ctr._offsets_for(np.zeros(ctr.plan.rows))
    fresh = c.NaiveCounter(8, 1.0, rng=0, secure=False)
    with pytest.raises(SparseDPError, match="every noise row"):
        fresh._offsets_for(np.zeros(fresh.plan.rows - 1))
