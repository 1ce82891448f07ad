"""p-Identity (HDMM): the Woodbury objective equals the dense error, its gradient finite differences."""

from fractions import Fraction

import numpy as np
import pytest

from sparsedp import expected_error
from sparsedp import workloads as wl
from sparsedp.calibration import sensitivity_bound
from sparsedp.optimize.calibrate import (
    integer_pidentity,
    integer_weights,
    noise_model,
    unit_variance,
)
from sparsedp.optimize.gram import Gram
from sparsedp.optimize.pidentity import (
    PIdentityObjective,
    default_p,
    pidentity_strategy,
)
from sparsedp.optimize.pidentity_family import pidentity_candidates

N, P = 20, 3
RNG = np.random.default_rng(11)
WORKLOADS = [wl.prefix(N), wl.all_ranges(N), wl.range_queries(N, [(0, 4), (3, 19), (8, 8)]), wl.from_matrix(RNG.normal(size=(6, N)))]


def dense_f(W: np.ndarray, M: np.ndarray) -> float:
    return float(np.trace(np.linalg.solve(M.T @ M, W.T @ W)))


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_objective_and_gradient(W, noise):
    model = noise_model(noise)
    obj = PIdentityObjective(Gram(W), model, P)
    x = RNG.uniform(0.0, 1.0, P * N) * (1 if noise == "laplace" else RNG.choice([-1, 1], P * N))
    theta = x.reshape(P, N)
    d = 1.0 / obj.delta(theta)
    M = pidentity_strategy(d, theta * d, "p").toarray()
    # columns normalised: L1 = 1 (Laplace) or L2 = 1 (Gaussian)
    np.testing.assert_allclose(np.abs(M).sum(0) if noise == "laplace" else np.sqrt((M * M).sum(0)), 1.0, rtol=1e-14)
    f, g = obj(x)
    assert f == pytest.approx(dense_f(W.toarray(), M), rel=1e-10)
    for i in (0, 7, P * N - 1):
        e = np.zeros_like(x)
        e[i] = 1e-6
        num = (obj(x + e)[0] - obj(x - e)[0]) / 2e-6
        assert g[i] == pytest.approx(num, rel=1e-5, abs=1e-6 * abs(f))


def test_candidate_is_normalised_exact_and_beats_identity():
    W = wl.all_ranges(32)
    model = noise_model("laplace")
    (cand,) = pidentity_candidates(W, Gram(W), model, p=2, maxiter=300, rng=np.random.default_rng(0))
    M = cand.strategy
    # an integer matrix with Delta_1 = 2^20 (up to the rounding), certified exactly
    A = M.tosparse().tocsc()
    assert np.all(A.data == np.round(A.data))
    exact = max(sum((Fraction(abs(v)) for v in A.data[A.indptr[j] : A.indptr[j + 1]]), Fraction(0)) for j in range(32))
    assert exact <= 2**20 and float(exact) == pytest.approx(2**20, rel=1e-4)
    assert sensitivity_bound(A, 1) == exact
    # the reported error is the GLS error the mechanism's calibration gives, computed independently
    var = unit_variance(M, model)
    assert cand.total == pytest.approx(expected_error(W, M, var, method="exact").total, rel=1e-8)
    identity = 2.0 * sum((j + 1) * (32 - j) for j in range(32))
    assert cand.total < 0.95 * identity


def test_default_p():
    # the internal nodes of the 16-ary tree: 16 + 1, 64 + 4 + 1, 256 + 16 + 1; capped
    assert default_p(256) == 17 and default_p(1024) == 69 and default_p(4096) == 273
    assert default_p(8) == 1 and default_p(1) == 1 and default_p(1 << 16) == 300


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_integer_rounding_keeps_the_bound(noise):
    model = noise_model(noise)
    theta = RNG.uniform(0, 1, (4, 30))
    obj = PIdentityObjective(Gram(wl.prefix(30)), model, 4)
    d = 1.0 / obj.delta(theta)
    a, B = integer_pidentity(d, theta * d, model)
    assert np.all(a >= 1) and np.all(a == np.round(a)) and np.all(B == np.round(B))
    norms = a + B.sum(0) if noise == "laplace" else a * a + (B * B).sum(0)
    assert norms.max() <= model.scale ** model.p and norms.min() >= 0.999 * model.scale ** model.p


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_integer_tree_weights_keep_every_path(noise):
    from sparsedp.optimize.params import NodeSplit
    from sparsedp.strategies import TreeLayout

    model = noise_model(noise)
    layout = TreeLayout.balanced(40, 3)
    split = NodeSplit(layout)
    x = RNG.uniform(0.0, 1.0, split.inner)
    x[:3] = split.lower  # shares that round to 0 are kept at weight 1
    q = split.shares(x)
    w = integer_weights(q, layout.matrix(), model)
    assert np.all(w >= 1) and np.all(w == np.round(w))
    T = layout.matrix()
    paths = T.T @ (w if noise == "laplace" else w * w)
    assert paths.max() <= model.scale ** model.p and paths.min() >= (1 - 1e-4) * model.scale ** model.p


def test_score_is_stable_for_a_low_rank_workload():
    # three ranges: p-Identity nearly answers them exactly and the Woodbury form tr(X) - <A, Y>
    # cancels (f / tr(X) ~ 1e-8); the returned score comes from a QR of the returned matrix
    W = wl.range_queries(300, [(0, 5), (3, 250), (10, 299)])
    model = noise_model("laplace")
    g = Gram(W)
    (cand,) = pidentity_candidates(W, g, model, maxiter=400, rng=np.random.default_rng(0))
    A = cand.strategy.toarray()
    Wd = W.toarray()
    dense = unit_variance(cand.strategy, model) * np.trace(Wd @ np.linalg.solve(A.T @ A, Wd.T))
    assert cand.method == "pidentity-qr"
    assert cand.total == pytest.approx(dense, rel=1e-9)
