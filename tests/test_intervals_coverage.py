"""Empirical coverage of the default 95% confidence intervals on every release kind that gives them.

For each kind, 2,000 independent releases (batched: the plan's own measurement on a block-diagonal
copy, mapped by the release's own linear steps; see tests/_mechanism_draws.py, _counter_draws.py)
of fixed data with exact noise (the default).  The default (``method="auto"``) intervals must cover
the truth in [0.945, 0.965] of all (release, answer) pairs -- widened by three binomial standard
errors of that many pairs (the seeds are fixed, so the check is deterministic; the widening only
keeps a change of seed from failing it) -- and the certified methods (``exact-tail``,
``chebyshev``) at least 0.95 less that.  Answers that are one noise value get the exact quantile of
its law (checked against the pmf, and their median half-width against the exact one).

Scales are chosen so that the integer lattice of the exact noise is fine (scale >= 5 grid units):
on a coarse lattice no interval ``answer +- h`` can have coverage near 95% (one discrete Laplace term
of scale 1: 0.927 or 0.973), and the exact quantile's coverage is the first value at or above it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import sparsedp
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.accuracy import ErrorReport, ErrorShape, error_shape, expected_error

from _counter_draws import counter_offset_shape, counter_releases
from _mechanism_draws import mechanism_answers
from _restaurant_draws import restaurant_affine, restaurant_errors

R = 2000
LEVEL = 0.95


def _coverage(errs: np.ndarray, h: np.ndarray) -> tuple[float, float]:
    """Coverage over all (release, answer) pairs and three binomial standard errors of it."""
    inside = np.abs(errs) <= h
    return float(inside.mean()), 3.0 * math.sqrt(LEVEL * (1 - LEVEL) / inside.size)


def _check(rep: ErrorReport, errs: np.ndarray, label: str, certified: bool = True) -> float:
    h = rep.half_widths(LEVEL)
    cov, tol = _coverage(errs, h)
    assert 0.945 - tol <= cov <= 0.965 + tol, f"{label}: default ({rep.interval_method()}) covers {cov:.4f}"
    if certified:
        for method in ("exact-tail", "chebyshev"):
            c, t = _coverage(errs, rep.half_widths(LEVEL, method))
            assert c >= LEVEL - t, f"{label}: {method} covers {c:.4f}"
        assert np.all(rep.half_widths(LEVEL, "exact-tail") <= rep.half_widths(LEVEL, "chebyshev") * (1 + 1e-12))
    return cov


# -- one noise value: the exact quantile -------------------------------------------------------------


def _exact_k(pmf_abs: np.ndarray) -> int:
    """Smallest k with P(|K| <= k) >= LEVEL from the pmf of |K| (index k)."""
    return int(np.searchsorted(np.cumsum(pmf_abs), LEVEL - 1e-15))


@pytest.mark.parametrize("t", [0.7, 3.0, 10.0, 123.4])
def test_one_discrete_laplace_value_gets_its_exact_quantile(t):
    q = math.exp(-1 / t)
    k = np.arange(0, int(60 * t) + 50)
    p = (1 - q) / (1 + q) * q**k
    p[1:] *= 2
    var_unit = float((p * k * k).sum())
    for c, g in ((1.0, 1.0), (-2.5, 0.25)):  # the answer is c z, z = g K
        sigma2 = c * c * g * g * var_unit
        rep = ErrorReport(sigma2, sigma2, "x", variances=np.array([sigma2]), noise="laplace", secure=True,
                          shape=ErrorShape(kurtosis=3.0, lead=1.0, unit=t))
        h = rep.half_widths(LEVEL)[0]
        assert h == pytest.approx(_exact_k(p) * abs(c) * g, rel=1e-5, abs=1e-5 * abs(c) * g)
        assert h >= _exact_k(p) * abs(c) * g  # the lattice point itself is inside
        assert rep.half_widths(LEVEL, "exact-tail")[0] == pytest.approx(h)  # exact is certified
    # the same from a mechanism's scales: identity rows, grid 0.5, scale t (grid units)
    v = np.full(4, 0.25 * var_unit)
    rep = expected_error(wl.identity(4), st.identity(4), v, noise="laplace", secure=True, scales=0.5 * t)
    np.testing.assert_allclose(rep.half_widths(LEVEL), (_exact_k(p) + 1e-6) * 0.5, rtol=1e-9)


@pytest.mark.parametrize("sigma", [0.6, 2.0, 7.5])
def test_one_discrete_gaussian_value_gets_its_exact_quantile(sigma):
    k = np.arange(0, int(40 * sigma) + 20)
    w = np.exp(-k * k / (2 * sigma * sigma))
    w[1:] *= 2
    p = w / w.sum()
    var_unit = float((p * k * k).sum())
    rep = expected_error(wl.identity(3), st.identity(3), var_unit, noise="gaussian", secure=True, unit_scales=sigma)
    assert rep.interval_method() == "accurate"
    np.testing.assert_allclose(rep.half_widths(LEVEL), _exact_k(p) + 1e-6, rtol=1e-9)


def test_one_float_laplace_value_gets_its_exact_quantile():
    v = np.array([2.0, 8.0])
    rep = expected_error(wl.identity(2), st.identity(2), v, noise="laplace")
    np.testing.assert_allclose(rep.half_widths(LEVEL), np.sqrt(v / 2) * math.log(20), rtol=1e-12)
    # a sum of float Gaussian noise is normal: the normal quantile, whatever the strategy
    g = expected_error(wl.prefix(8), st.hierarchical(8, 2), 1.0, noise="gaussian")
    assert g.interval_method() == "gaussian"


# -- the matrix mechanism ----------------------------------------------------------------------------


def _mechanisms():
    dims = (4, 5, 6)
    return {
        "identity": (wl.identity(64), lambda W: st.identity(64), 0.1),
        "tree": (wl.prefix(64), lambda W: st.hierarchical(64, 2), 1.0),
        "optimized": (wl.prefix(64), lambda W: sparsedp.optimize(W), 1.0),
        "marginals-identity": (wl.marginals(dims, k=2), lambda W: st.identity(int(np.prod(dims))), 0.2),
    }


@pytest.mark.parametrize("name", list(_mechanisms()))
def test_matrix_mechanism_default_intervals_cover(name):
    W, make_M, eps = _mechanisms()[name]
    n = W.shape[1]
    x = np.random.default_rng(0).poisson(20, n)
    mech = sparsedp.MatrixMechanism(W, make_M(W), epsilon=eps)  # exact discrete Laplace noise
    truth = W.matvec(x)
    errs = mechanism_answers(mech, x, R, seed=11) - truth
    rel = mech.run(x, rng=3)
    rep = rel.error_report()
    lo, hi = rel.confidence_intervals(LEVEL)
    np.testing.assert_allclose(hi - rel.answers, rep.half_widths(LEVEL))
    np.testing.assert_allclose(rel.answers - lo, rep.half_widths(LEVEL))
    _check(rep, errs, name)
    # with the measurement's scales the exact law of the noise is used (single values exactly)
    full = rel.error_report(scales=rel.measurement.scales)
    _check(full, errs, name + " (scales)")


def test_single_row_answers_have_the_exact_quantile_width():
    n = 64
    mech = sparsedp.MatrixMechanism(wl.identity(n), st.identity(n), epsilon=0.1)
    rel = mech.run(np.zeros(n, dtype=int), rng=0)
    t = float(rel.measurement.scales[0])  # grid 1: the sampler scale
    q = math.exp(-1 / t)
    exact_k = math.ceil(t * math.log(2 / ((1 - LEVEL) * (1 + q)))) - 1  # P(|K| > k) = 2 q^{k+1} / (1 + q)
    assert 2 * q ** (exact_k + 1) / (1 + q) <= 1 - LEVEL < 2 * q**exact_k / (1 + q)
    for rep in (rel.error_report(), rel.error_report(scales=rel.measurement.scales)):
        ratio = np.median(rep.half_widths(LEVEL)) / exact_k
        assert 0.98 <= ratio <= 1.05, ratio
    assert np.median(rel.error_report(scales=rel.measurement.scales).half_widths(LEVEL)) == pytest.approx(exact_k)


# -- tree publishers ---------------------------------------------------------------------------------

PAIRS = np.array([[0, 9], [3, 3], [10, 39], [5, 25], [0, 39], [17, 18], [30, 30], [0, 0]])


def _publishers():
    from sparsedp import trees

    return {
        "lue": lambda: trees.LUEDPTree(1.0),
        "lue-inconsistent": lambda: trees.LUEDPTree(1.0, consistency=False),
        "boost": lambda: trees.Boost(1.0),
        "privelet": lambda: trees.Privelet(1.0),
        "dwork": lambda: trees.Dwork(0.2),
    }


@pytest.mark.parametrize("name", list(_publishers()))
def test_tree_publisher_default_intervals_cover(name):
    make = _publishers()[name]
    x = np.random.default_rng(0).poisson(5, 40)
    truth = np.array([x[a : b + 1].sum() for a, b in PAIRS])
    prepared = make()
    plan = prepared._prepare(x)  # the data-independent plan fit makes; published R times
    errs = np.array([prepared._publish(x, plan, 1000 + r).ranges(PAIRS) - truth for r in range(R)])
    pub = make().fit(x, rng=1000)
    np.testing.assert_array_equal(pub.ranges(PAIRS), truth + errs[0])
    rep = pub._release().error_report(PAIRS)
    assert rep.interval_method() == "accurate"
    _check(rep, errs, name)
    lo, hi = pub.confidence_intervals(PAIRS)
    np.testing.assert_allclose((hi - lo) / 2, rep.half_widths(LEVEL))


# -- continual counters ------------------------------------------------------------------------------


def _counters():
    from sparsedp import continual as c

    return {
        "fenwick": lambda r: c.ContinualCounter(256, epsilon=1.0, rng=r),
        "gls-tree": lambda r: c.GLSTreeCounter(256, 1.0, rng=r),
        "binary": lambda r: c.BinaryMechanism(256, 1.0, rng=r),
    }


@pytest.mark.parametrize("name", list(_counters()))
def test_counter_default_intervals_cover(name):
    make = _counters()[name]
    x = np.random.default_rng(0).poisson(3, 256)
    errs = counter_releases(make, x, R, 7) - np.cumsum(x)
    ctr = make(7)
    ctr.run(x)
    rep = ctr.error_report()
    # the shape a counter knows: its released values are cumsum(x) + B z (B: the counter's own
    # offset matrix), with the plan's noise
    shape = counter_offset_shape(make, rep.variances)
    _check(dataclasses.replace(rep, shape=shape), errs, name + " (offset-matrix shape)")
    # the counter's own report carries that shape (computed on the first interval request)
    assert rep.shape is not None and rep.interval_method() == "accurate"
    got = rep.error_shape()
    for f in ("kurtosis", "lead", "unit", "unit_min", "lattice"):
        np.testing.assert_allclose(getattr(got, f), getattr(shape, f), rtol=1e-9, atol=1e-12, err_msg=f)
    _check(rep, errs, name)
    lo, hi = ctr.confidence_intervals(LEVEL)
    np.testing.assert_allclose((hi - lo) / 2, rep.half_widths(LEVEL))


# -- consistency releases: restaurant and flows ------------------------------------------------------


def test_restaurant_default_intervals_cover():
    from sparsedp.consistency.restaurant import restaurant, restaurant_release

    T = 16
    sales = restaurant(T, 5)
    # the consistent release is affine in the noisy values
    plan, items, truth, P, c0 = restaurant_affine(sales, T, True)
    rel = restaurant_release(sales=sales, epsilon=1.0, seed=0)
    np.testing.assert_allclose(rel.x, P @ rel.noisy + c0, rtol=1e-7, atol=1e-7)
    errs = restaurant_errors(plan, items, truth, P, c0, R)
    rep = rel.error_report()
    assert rep.interval_method() == "accurate"
    _check(rep, errs, "restaurant")
    # the report's shape (P_tree (x) P_span) is that of the solver's own affine map P
    shape = error_shape(P, "laplace", secure=True, variances=plan.variances(), scales=plan.scales,
                        answer_variances=rep.variances)
    for f in ("kurtosis", "lead", "unit", "unit_min"):
        np.testing.assert_allclose(getattr(rep.error_shape(), f), getattr(shape, f), rtol=1e-6, atol=1e-9, err_msg=f)
    _check(dataclasses.replace(rep, shape=shape), errs, "restaurant (projection shape)")


@pytest.mark.parametrize("fixed", [False, True])
def test_flows_default_intervals_cover(fixed):
    from sparsedp.audit import plan_release
    from sparsedp.flows import random_trips, release_flows, road_grid
    from sparsedp.flows.release import _prepare, _project_after_draw

    road = road_grid(5, 5)
    trips = random_trips(road, 300, seed=1, max_edges=8)
    prep = _prepare(road, trips, 1.0, "auto", fixed, 1e-8, None, True)
    project = lambda y: _project_after_draw(y, prep.system, prep.how, prep.reason, prep.tol).x  # noqa: E731
    c0 = project(np.zeros(prep.truth.size))
    P = np.column_stack([project(e) - c0 for e in np.eye(prep.truth.size)])
    rel = release_flows(road, trips, epsilon=1.0, rng=3, fixed_endpoints=fixed)
    np.testing.assert_allclose(rel.consistent, P @ rel.noisy + c0, rtol=1e-7, atol=1e-7)
    errs = plan_release(prep.plan)(prep.truth, np.random.default_rng(100), R) @ P.T + c0 - prep.truth
    rep = rel.error_report()
    assert rep.interval_method() == "accurate"
    _check(rep, errs, f"flows fixed={fixed}")
