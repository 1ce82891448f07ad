"""The 2-D rounding of the TopDown release (sparsedp.topdown.rounding): the transport projection
against a slow reference, family independence, edge cases, and the controlled rounding's
objective against an integer program."""

from __future__ import annotations

import numpy as np
import pytest

from sparsedp.topdown.rounding import (
    project_children,
    project_marginal,
    project_transport,
    round_transport,
)


def reference_projection(est, w, parents, parent_counts, c2m, values, passes=100000):
    """Plain Dykstra (sort-based simplex projections, no stopping rule) for many passes: the
    weighted projection onto the transportation polytope to about machine precision."""
    x = est.astype(np.float64, copy=True)
    p, q = np.zeros_like(x), np.zeros_like(x)
    for _ in range(passes):
        y = project_children(x + p, w, parents, parent_counts)
        p = x + p - y
        xn = project_marginal(y + q, w, c2m, values)
        q = y + q - xn
        if np.abs(xn - x).max() <= 1e-13 * max(1.0, np.abs(x).max()):
            return xn
        x = xn
    return x


def random_instance(gen, families, C=4, groups=1, noise=2.0, max_kids=6):
    """Families of 1..max_kids children x C cells with integer truths; the parents' counts and the
    children's grouped row sums (``groups`` marginal cells) from the truth, a noisy estimate."""
    kids = gen.integers(1, max_kids + 1, families)
    parents = np.repeat(np.arange(families), kids)
    n = parents.size
    truth = gen.integers(0, 6, (n, C))
    parent_counts = np.zeros((families, C), dtype=np.int64)
    np.add.at(parent_counts, parents, truth)
    c2m = np.arange(C) % groups
    values = np.stack([truth[:, c2m == k].sum(axis=1) for k in range(groups)], axis=1)
    est = truth + gen.normal(0, noise, (n, C))
    w = gen.uniform(0.5, 2.0, (n, C))
    return est, w, parents, parent_counts, c2m, values


@pytest.mark.parametrize("groups", [1, 2])
def test_the_transport_projection_is_the_weighted_projection(groups):
    """Against many passes of plain Dykstra: within the stopping rule's tolerance (a relative
    1e-9 gap per element; the sums of a family meet its counts to that times its size)."""
    gen = np.random.default_rng(11 + groups)
    for _ in range(6):
        est, w, parents, parent_counts, c2m, values = random_instance(gen, 8, C=4, groups=groups)
        x = project_transport(est, w, parents, parent_counts, c2m, values)
        ref = reference_projection(est, w, parents, parent_counts, c2m, values)
        np.testing.assert_allclose(x, ref, atol=1e-6)
        assert x.min() >= 0
        col = np.zeros(parent_counts.shape)
        np.add.at(col, parents, x)
        np.testing.assert_allclose(col, parent_counts, atol=1e-6)
        rows = np.stack([x[:, c2m == k].sum(axis=1) for k in range(groups)], axis=1)
        np.testing.assert_allclose(rows, values, atol=1e-9)


def test_the_transport_projection_meets_the_optimality_conditions():
    """KKT of min sum w (x - e)^2 on the polytope: x = max(0, e - (a_i + b_j) / w) for one a per
    child and one b per (parent, cell); recovered from the active entries by least squares."""
    gen = np.random.default_rng(5)
    est, w, parents, parent_counts, c2m, values = random_instance(gen, 1, C=4, max_kids=5)
    est[:] += 3.0  # mostly positive: a connected active graph
    x = project_transport(est, w, parents, parent_counts, c2m, values, tol=1e-13)
    n, C = x.shape
    act = x > 1e-9
    i, j = np.nonzero(act)
    M = np.zeros((i.size, n + C))
    M[np.arange(i.size), i] = 1.0
    M[np.arange(i.size), n + j] = 1.0
    rhs = ((est - x) * w)[act]
    sol, *_ = np.linalg.lstsq(M, rhs, rcond=None)
    np.testing.assert_allclose(M @ sol, rhs, atol=1e-7)
    lam = sol[:n, None] + sol[None, n:]
    assert np.all(est[~act] * w[~act] <= lam[~act] + 1e-7)


def test_the_transport_projection_of_a_family_depends_on_that_family_alone_with_totals():
    """Totals as the row sums (the totals-first release), families of one child and of a zero
    parent among them: the same bits whole as in three parts."""
    gen = np.random.default_rng(8)
    est, w, parents, parent_counts, c2m, values = random_instance(gen, 30, C=5, max_kids=7, noise=3.0)
    zero = parents == 4
    parent_counts[4] = 0
    values[zero] = 0
    whole = project_transport(est, w, parents, parent_counts, c2m, values)
    cuts = [0, int(np.searchsorted(parents, 9)), int(np.searchsorted(parents, 21)), parents.size]
    parts = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        p = parents[a:b]
        parts.append(project_transport(est[a:b], w[a:b], p - p[0], parent_counts[p[0]:p[-1] + 1], c2m, values[a:b]))
    assert np.array_equal(whole, np.concatenate(parts))
    assert np.all(whole[zero] == 0)


def test_transport_edge_cases():
    gen = np.random.default_rng(2)
    # one child: its cells are its parent's
    pc = np.array([[3, 0, 5, 1]])
    x = project_transport(np.array([[1.2, 0.7, 6.1, -0.4]]), np.ones((1, 4)), np.array([0]), pc, np.zeros(4, int),
                          np.array([[9]]))
    np.testing.assert_allclose(x, pc, atol=1e-9)
    assert np.array_equal(round_transport(x, np.ones((1, 4)), np.array([0]), pc, np.zeros(4, int), np.array([[9]])), pc)
    # an integral table meeting its sums is its own projection and rounding
    truth = gen.integers(0, 7, (6, 3))
    parents = np.array([0, 0, 0, 1, 1, 1])
    pc = np.stack([truth[:3].sum(axis=0), truth[3:].sum(axis=0)])
    vals = truth.sum(axis=1, keepdims=True)
    w = gen.uniform(0.5, 2, truth.shape)
    x = project_transport(truth.astype(float), w, parents, pc, np.zeros(3, int), vals)
    np.testing.assert_allclose(x, truth, atol=1e-9)
    assert np.array_equal(round_transport(x, w, parents, pc, np.zeros(3, int), vals), truth)
    # no rows
    assert project_transport(np.zeros((0, 3)), np.ones((0, 3)), np.zeros(0, int), np.zeros((0, 3), int),
                             np.zeros(3, int), np.zeros((0, 1), int)).shape == (0, 3)


def milp_objective(x, w, parents, parent_counts, c2m, values):
    """The integer optimum of sum w (X - x)^2 over the tables with both sums, each value at its
    floor or its ceiling, by branch and bound (scipy's milp on dense constraints: no reliance on
    total unimodularity): X = floor(x) + d, d in {0, 1}, cost w (1 - 2 frac(x)) per unit of d."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, C = x.shape
    fl = np.floor(x + 1e-9)
    free = (x - fl > 1e-9).ravel()
    cost = (w * (1.0 - 2.0 * (x - fl))).ravel()
    rows = np.zeros((n * (int(c2m.max()) + 1), n * C))
    cols = np.zeros((parent_counts.size, n * C))
    for i in range(n):
        for j in range(C):
            rows[i * (int(c2m.max()) + 1) + c2m[j], i * C + j] = 1.0
            cols[parents[i] * C + j, i * C + j] = 1.0
    fl_rows, fl_cols = rows @ fl.ravel(), cols @ fl.ravel()
    A = np.vstack([rows, cols])
    b = np.concatenate([values.ravel() - fl_rows, parent_counts.ravel() - fl_cols])
    res = milp(cost, constraints=LinearConstraint(A, b, b), integrality=np.ones(n * C),
               bounds=Bounds(np.zeros(n * C), free.astype(float)))
    assert res.status == 0
    X = fl + np.round(res.x).reshape(n, C)
    return float((w * (X - x) ** 2).sum())


@pytest.mark.parametrize("seed", range(4))
def test_the_controlled_rounding_is_the_integer_optimum(seed):
    """The rounding of the projection (linear programs by blocks of parents): integral, both sums
    exact, each value at its floor or ceiling, and its objective the integer optimum's (1e-9
    relative; weights of 1e-3, as 1 / variance are, too)."""
    gen = np.random.default_rng(100 + seed)
    est, w, parents, parent_counts, c2m, values = random_instance(gen, 12, C=5, max_kids=7, noise=2.5)
    w = w * (1e-3 if seed % 2 else 1.0)
    x = project_transport(est, w, parents, parent_counts, c2m, values)
    X = round_transport(x, w, parents, parent_counts, c2m, values, block=40)
    col = np.zeros(parent_counts.shape, dtype=np.int64)
    np.add.at(col, parents, X)
    assert np.array_equal(col, parent_counts) and np.array_equal(X.sum(axis=1, keepdims=True), values)
    assert np.all((X == np.floor(x + 1e-9)) | (X == np.ceil(x - 1e-9)))
    best = milp_objective(x, w, parents, parent_counts, c2m, values)
    got = float((w * (X - x) ** 2).sum())
    assert abs(got - best) <= 1e-9 * max(1.0, best)


def test_newton_groups_that_do_not_settle_are_projected_exactly():
    """A large group (thousands of children, counts ~1e6) started cold needs several Newton steps;
    when the step budget runs out before its active set settles, it must still come out as the
    exact simplex projection, and the groups that did settle must keep theirs (the Newton version
    without a safeguard returned its scratch buffer for every group: gaps of thousands in a
    totals-first census release)."""
    from sparsedp.topdown.rounding import _newton_groups, simplex_project

    gen = np.random.default_rng(3)
    sizes = np.array([2600, 3])
    starts = np.r_[0, np.cumsum(sizes)]
    z = np.concatenate([gen.normal(800.0, 900.0, sizes[0]), [5.0, 1.0, -2.0]])[None, :]
    iw = 1.0 / gen.uniform(0.5, 2.0, z.shape)
    totals = np.array([[2.27e6, 4.0]])

    def gsum(a):
        return np.add.reduceat(a, starts[:-1], axis=1)

    def spread(lam):
        return np.repeat(lam, sizes, axis=1)

    want = simplex_project(z.ravel(), 1.0 / iw.ravel(), starts, totals.ravel())
    for steps in (1, 2, 64):
        x, act, A = _newton_groups(z, iw, totals, np.zeros(z.shape, dtype=bool), None, gsum, spread,
                                   np.empty_like(z), max_steps=steps)
        assert np.allclose(x.ravel(), want, rtol=0, atol=1e-6 * 2.27e6)
        assert np.allclose(gsum(x), totals, rtol=1e-12)
        assert np.array_equal(act, x > 0)


def test_each_family_alone_gives_the_same_bits_as_the_level_with_many_cells():
    """Many families of 16 cells with counts in the thousands converge at different passes, so the
    working arrays are compacted while some families still run: each family projected alone must
    give the same bits (the compacted arrays once came back Fortran-ordered and were summed in
    another order)."""
    gen = np.random.default_rng(5)
    est, w, parents, parent_counts, c2m, values = random_instance(gen, 60, C=16, max_kids=40, noise=3.0)
    scale = gen.integers(1, 400, parents.size)[:, None]
    truth = np.rint(np.maximum(est, 0)).astype(np.int64) * scale
    parent_counts = np.zeros_like(parent_counts)
    np.add.at(parent_counts, parents, truth)
    values = truth.sum(axis=1, keepdims=True)
    est = truth + gen.normal(0, 30.0, truth.shape)
    whole = project_transport(est, w, parents, parent_counts, c2m, values)
    for f in range(60):
        rows = np.flatnonzero(parents == f)
        alone = project_transport(est[rows], w[rows], np.zeros(rows.size, dtype=np.int64), parent_counts[f:f + 1],
                                  c2m, values[rows])
        assert np.array_equal(alone, whole[rows])
