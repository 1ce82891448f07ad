import math
import time
import tracemalloc

import numpy as np
import pytest
from _coverage import assert_certified_coverage, assert_default_coverage

from sparsedp import MatrixMechanism, SparseDPError, expected_error
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.accuracy import ErrorReport, ErrorShape, MemoryLimitError, interval_multiplier
from sparsedp.inference import linear_estimator


def dense_cov(M: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(M^T V^-1 M)^+, the covariance of the GLS estimate."""
    return np.linalg.pinv(M.T @ (M / v[:, None]))


def dense_variances(W: np.ndarray, M: np.ndarray, v: np.ndarray) -> np.ndarray:
    """diag(W (M^T V^-1 M)^+ W^T): the variance of every answer."""
    return np.einsum("ij,jk,ik->i", W, dense_cov(M, v), W)


WORKLOADS = [wl.prefix(16), wl.all_ranges(16), wl.identity(16), wl.total(16),
             wl.range_queries(16, [(0, 3), (4, 15), (7, 7), (0, 15), (15, 15)]),
             wl.marginals([4, 4], k=1)]
STRATEGIES = [st.identity(16), st.fenwick(16), st.haar(16), st.hierarchical(16, 2), st.hierarchical(16, 3),
              st.weighted(st.hierarchical(16, 4), np.linspace(0.5, 2.0, 21)),
              st.from_matrix(np.tril(np.ones((16, 16)))),
              st.from_matrix(np.vstack([np.eye(16), np.ones((1, 16))]))]


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
@pytest.mark.parametrize("M", STRATEGIES, ids=repr)
def test_per_query_variances_match_dense(W, M):
    rng = np.random.default_rng(0)
    v = rng.uniform(0.5, 3.0, M.shape[0])  # per-row (per-node) variances
    rep = expected_error(W, M, v)
    ref = dense_variances(W.toarray(), M.toarray(), v)
    assert rep.exact
    assert rep.total == pytest.approx(ref.sum(), rel=1e-9)
    assert rep.per_query == pytest.approx(ref.mean(), rel=1e-9)
    assert rep.variances is not None and rep.variances.shape == (W.shape[0],)
    np.testing.assert_allclose(rep.variances, ref, rtol=1e-9)
    if M.structure != "general" and M.structure != "lower_triangular":
        assert rep.method == f"exact-{M.structure}"


def test_seed_000_fenwick_3():
    # prefix(3) with fenwick(3): (2 Delta^2 / eps^2) trace(B^T B) = 2 * 4 * 4 = 32 at eps = 1
    assert expected_error(wl.prefix(3), st.fenwick(3), 2 * 2.0**2).total == 32
    # doubling row 3 (seed: 32/eps^2 -> 26/eps^2): Delta stays 2, row 3 noise variance / 4
    M = st.weighted(st.fenwick(3), [1.0, 1.0, 2.0])
    assert expected_error(wl.prefix(3), M, 2 * 2.0**2).total == pytest.approx(26)


def test_estimate_agrees_with_exact():
    W, M = wl.prefix(64), st.hierarchical(64, 2)
    v = np.full(M.shape[0], 2.0)
    exact = expected_error(W, M, v)
    est = expected_error(W, M, v, method="estimate", probes=4000, rng=1)
    assert not est.exact and est.stderr > 0
    assert abs(est.total - exact.total) < 5 * est.stderr
    np.testing.assert_allclose(est.variances, exact.variances, rtol=0.15)


def test_large_sparse_inverse_paths_are_fast():
    n = 1 << 18
    rep = expected_error(wl.all_ranges(n), st.fenwick(n), 1.0)
    assert rep.method == "exact-fenwick" and rep.total > 0 and rep.variances is None  # too many to list
    # identity strategy: per-entry variance times the number of ranges containing it
    j = np.arange(n, dtype=float)
    ident = expected_error(wl.all_ranges(n), st.identity(n), 1.0).total
    assert ident == pytest.approx(((j + 1) * (n - j)).sum(), rel=1e-12)


def test_shape_mismatch_and_bad_variances():
    with pytest.raises(SparseDPError):
        expected_error(wl.prefix(4), st.identity(5), 1.0)
    with pytest.raises(SparseDPError, match="> 0"):
        expected_error(wl.prefix(4), st.identity(4), [1.0, 0.0, 1.0, 1.0])
    with pytest.raises(SparseDPError, match="noise"):
        expected_error(wl.prefix(4), st.identity(4), 1.0, noise="cauchy")


# -- issue 20, item 3: exact per-query variances in bounded memory ----------------------------


def test_issue20_random_ranges_on_a_2_20_tree_are_exact_fast_and_small():
    # was: 4.9 s, 1.95 GB and only an estimate (standard error 14%)
    n = 1 << 20
    rng = np.random.default_rng(0)
    W = wl.range_queries(n, np.sort(rng.integers(0, n, (10_000, 2)), axis=1))
    M = st.hierarchical(n, 16)
    v = np.full(M.shape[0], 2 * (M.meta["layout"].levels / 0.5) ** 2)
    tracemalloc.start()
    t0 = time.perf_counter()
    rep = expected_error(W, M, v)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rep.exact and rep.method == "exact-tree" and rep.stderr == 0
    assert rep.variances.shape == (10_000,) and np.all(rep.variances > 0)
    assert seconds < 5.0 and peak < 200 * 2**20


def test_all_ranges_total_on_a_large_tree_is_exact_without_the_n_log_n_profiles():
    n = 1 << 18
    M = st.hierarchical(n, 16)
    v = np.random.default_rng(1).uniform(1.0, 2.0, M.shape[0])
    tracemalloc.start()
    rep = expected_error(wl.all_ranges(n), M, v)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    from sparsedp.tree_estimator import tree_impulse_norms

    assert rep.total == pytest.approx(float(tree_impulse_norms(M.meta["layout"], v, "all_ranges") @ v), rel=1e-9)
    assert peak < 12 * 8 * M.shape[0]


def test_generic_fallback_refuses_with_the_memory_it_needs():
    n = 4096
    rng = np.random.default_rng(2)
    M = st.from_matrix(np.vstack([np.eye(n)[:: 1], np.ones((1, n))]))  # general: no structured path
    W = wl.range_queries(n, np.sort(rng.integers(0, n, (50, 2)), axis=1))
    tracemalloc.start()
    for method in ("exact", "estimate"):
        with pytest.raises(MemoryLimitError, match=r"needs about .* more than memory_limit"):
            expected_error(W, M, 1.0, method=method, memory_limit=1e5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20  # refused before allocating the blocks


def test_structured_path_also_checks_its_memory():
    n = 1 << 16
    W = wl.prefix(n)
    with pytest.raises(MemoryLimitError):
        expected_error(W, st.hierarchical(n, 16), 1.0, memory_limit=1e5)


def test_blocks_shrink_to_fit_the_memory_limit():
    n = 200
    M = st.from_matrix(np.vstack([np.eye(n), np.ones((1, n))]))
    W = wl.prefix(n)
    big = expected_error(W, M, 1.0, method="exact")
    small = expected_error(W, M, 1.0, method="exact", memory_limit=2e5)  # a few columns at a time
    assert small.total == pytest.approx(big.total, rel=1e-10)


# -- reported variances are the real ones ---------------------------------------------------------


@pytest.mark.parametrize("M", [st.hierarchical(48, 4), st.fenwick(48), st.haar(48), st.identity(48),
                               st.weighted(st.hierarchical(48, 3), np.linspace(0.5, 2.0, 73))], ids=repr)
def test_empirical_variance_of_answers_matches_reported(M):
    n = M.shape[1]
    rng = np.random.default_rng(3)
    W = wl.range_queries(n, np.sort(rng.integers(0, n, (40, 2)), axis=1))
    scales = rng.uniform(1.0, 3.0, M.shape[0])  # Laplace per row: Var = 2 b^2
    rep = expected_error(W, M, 2 * scales**2)
    apply, _ = linear_estimator(M, 2 * scales**2)
    R = 20_000
    errors = W.matmat(apply(rng.laplace(0.0, 1.0, (M.shape[0], R)) * scales[:, None]))
    emp = (errors**2).mean(axis=1)
    np.testing.assert_allclose(emp, rep.variances, rtol=0.10)


def test_matrix_mechanism_runs_match_the_reported_variances():
    n = 32
    rng = np.random.default_rng(4)
    W = wl.range_queries(n, np.sort(rng.integers(0, n, (20, 2)), axis=1))
    mech = MatrixMechanism(W, st.hierarchical(n, 4), epsilon=1.0)
    rep = mech.error_report(noise="laplace")
    x = rng.integers(0, 50, n)
    truth = W.matvec(x)
    err = np.array([mech.run(x, rng=s).answers - truth for s in range(1500)])
    emp = (err**2).mean(axis=0)
    assert emp.sum() == pytest.approx(rep.total, rel=0.10)
    np.testing.assert_allclose(emp, rep.variances, rtol=0.25)
    lo, hi = rep.confidence_intervals(err + truth, level=0.9)  # every run's answers
    assert ((lo <= truth) & (truth <= hi)).mean() >= 0.9


# -- confidence intervals ---------------------------------------------------------------------------


def test_interval_multipliers():
    assert interval_multiplier(0.95, "gaussian") == pytest.approx(1.959964, abs=1e-6)
    assert interval_multiplier(0.75, "chebyshev") == pytest.approx(2.0)
    for level in (0.8, 0.9, 0.95, 0.99, 0.999):
        single = math.log(1 / (1 - level)) / math.sqrt(2)  # one Laplace term: P(|L| > k sigma) = e^{-k sqrt 2}
        k = interval_multiplier(level, "laplace")
        assert single <= k <= 1.13 * single
        assert k < interval_multiplier(level, "chebyshev")
    assert interval_multiplier(0.95, "laplace") == pytest.approx(2.1568, abs=2e-3)
    with pytest.raises(SparseDPError):
        interval_multiplier(1.0, "gaussian")
    with pytest.raises(SparseDPError):
        interval_multiplier(0.9, "bogus")


@pytest.mark.parametrize("coefs", [[1.0], [1.0, 1.0], [3.0, 1.0, 0.5], [1.0] * 2 + [0.2] * 30])
def test_laplace_intervals_cover_sums_of_laplace(coefs):
    rng = np.random.default_rng(5)
    c = np.array(coefs)
    z = rng.laplace(0.0, 1.0, (400_000, c.size)) @ c
    sigma = math.sqrt(2 * (c * c).sum())
    for level in (0.9, 0.95, 0.99):
        cover = (np.abs(z) <= interval_multiplier(level, "laplace") * sigma).mean()
        assert cover >= level - 3 * math.sqrt(level * (1 - level) / z.size)


def test_report_intervals_need_the_noise_and_use_the_right_method():
    v = np.array([4.0, 9.0])
    with pytest.raises(SparseDPError, match="noise"):
        ErrorReport(13.0, 6.5, "exact-identity", variances=v).half_widths()
    g = ErrorReport(13.0, 6.5, "exact-identity", variances=v, noise="gaussian")
    np.testing.assert_allclose(g.half_widths(0.95), 1.959964 * np.sqrt(v), rtol=1e-6)
    lo, hi = g.confidence_intervals([10.0, 20.0], 0.95)
    np.testing.assert_allclose(hi - lo, 2 * 1.959964 * np.sqrt(v), rtol=1e-6)
    # Laplace noise (float or exact) with only the variances known: the normal quantile by default;
    # with the error's shape: "accurate" (exact quantile for one noise value)
    lap = ErrorReport(13.0, 6.5, "x", variances=v, noise="laplace")
    assert lap.interval_method() == "normal"
    np.testing.assert_allclose(lap.half_widths(0.95), 1.959964 * np.sqrt(v), rtol=1e-6)
    assert ErrorReport(13.0, 6.5, "x", variances=v, noise="laplace", secure=True).interval_method() == "normal"
    one = ErrorReport(13.0, 6.5, "x", variances=v, noise="laplace", shape=ErrorShape(kurtosis=3.0, lead=1.0))
    assert one.interval_method() == "accurate"
    np.testing.assert_allclose(one.half_widths(0.95), np.sqrt(v / 2) * math.log(20), rtol=1e-12)
    # the certified and textbook methods stay available by name
    assert lap.interval_method("laplace") == "laplace" and lap.interval_method("chebyshev") == "chebyshev"
    np.testing.assert_allclose(lap.half_widths(0.95, "chebyshev"), math.sqrt(20) * np.sqrt(v), rtol=1e-12)
    np.testing.assert_allclose(lap.half_widths(0.95, "laplace"), interval_multiplier(0.95, "laplace") * np.sqrt(v))
    assert g.interval_method("normal") == "normal"
    with pytest.raises(SparseDPError):
        g.confidence_intervals([1.0, 2.0, 3.0])


def test_gaussian_mechanism_intervals_have_their_coverage():
    n = 64
    rng = np.random.default_rng(6)
    W = wl.range_queries(n, np.sort(rng.integers(0, n, (50, 2)), axis=1))
    mech = MatrixMechanism(W, st.hierarchical(n, 4), rho=0.5, noise="gaussian", secure=False)
    rep = mech.error_report(noise="gaussian", secure=False)
    assert rep.interval_method() == "gaussian"
    x = rng.integers(0, 50, n)
    truth = W.matvec(x)
    answers = np.array([mech.run(x, rng=100 + s).answers for s in range(400)])
    lo, hi = rep.confidence_intervals(answers, 0.95)
    assert ((lo <= truth) & (truth <= hi)).mean() == pytest.approx(0.95, abs=0.02)
    # exact discrete Gaussian noise: the default is "accurate" (the error's shape, with the sampler's
    # scales from the mechanism), coverage about the level; the certified methods at least the level
    exact = MatrixMechanism(W, st.hierarchical(n, 4), rho=0.5, noise="gaussian", secure=True)
    rep = exact.error_report()
    assert rep.interval_method() == "accurate"
    answers = np.array([exact.run(x, rng=900 + s).answers for s in range(400)])
    lo, hi = rep.confidence_intervals(answers, 0.95)
    assert_default_coverage((lo <= truth) & (truth <= hi), "discrete Gaussian")
    for method in ("exact-tail", "chebyshev"):
        lo, hi = rep.confidence_intervals(answers, 0.95, method)
        assert_certified_coverage((lo <= truth) & (truth <= hi), 0.95, method)
    # without the sampler's scales the report knows the shape of the sum but not the noise's lattice
    bare = expected_error(W, exact.M, exact.variances(), noise="gaussian", secure=True)
    assert bare.interval_method() == "accurate"
