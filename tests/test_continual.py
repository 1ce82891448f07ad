import json

import numpy as np
import pytest
from _counter_draws import counter_releases

from sparsedp import BudgetExceededError, InvalidPrivacyParameterError, NonFiniteInputError, ShapeError, SparseDPError
from sparsedp.continual import (
    ContinualCounter,
    FenwickWeights,
    column_counts,
    expected_error,
    fenwick_matrices,
    optimal_weights,
    weights_sensitivity,
)
from sparsedp.continual import counter as counter_module
from sparsedp.continual.fenwick import prefix_chain_sum
from sparsedp.continual.weights import sqp_weights

EPS = 1.0


def objective(N, lam):
    return float(np.sum(column_counts(N) / lam**2))


@pytest.mark.parametrize("N", [1, 2, 3, 7, 8, 100, 1000, 1023, 1024, 4095, 4096])
def test_theorems_5_1_and_5_2(N):
    M, B = fenwick_matrices(N)
    col = np.asarray(abs(M).sum(axis=0)).ravel()
    assert col.max() == np.floor(np.log2(N)) + 1 == col[0]  # Theorem 5.1, attained at column 1
    ones = np.diff(B.indptr)
    assert np.array_equal(ones, [bin(p).count("1") for p in range(1, N + 1)])  # Theorem 5.2
    assert M.nnz <= N * (np.log2(N) + 1) and B.nnz <= N * (np.log2(N) + 1)


@pytest.mark.parametrize("N", [1, 5, 64, 300, 4096])
def test_factorisation_is_exact(N):
    M, B = fenwick_matrices(N)
    W = (B @ M).toarray()
    assert np.array_equal(W, np.tril(np.ones((N, N))))
    np.testing.assert_array_equal(np.asarray(B.multiply(B).sum(axis=0)).ravel(), column_counts(N))


def test_seed_n3_example():
    unweighted = expected_error(3, np.ones(3), epsilon=EPS)
    doubled = expected_error(3, [1.0, 1.0, 2.0], epsilon=EPS)
    assert unweighted.total == pytest.approx(32.0) and doubled.total == pytest.approx(26.0)
    assert expected_error(3, [1.0, 1.0, 2.0], epsilon=2.0).total == pytest.approx(26.0 / 4)
    assert doubled.sensitivity == 2.0


@pytest.mark.parametrize("N", [3, 7, 15, 31, 63, 127, 5, 10, 20, 50, 100, 200])
def test_fda_equals_sqp(N):
    fda = optimal_weights(N, "fda")
    sqp = optimal_weights(N, "sqp")
    assert objective(N, fda) <= objective(N, sqp) * (1 + 1e-9)
    assert objective(N, sqp) == pytest.approx(objective(N, fda), rel=1e-6)
    np.testing.assert_allclose(fda, sqp, atol=1e-4)
    assert weights_sensitivity(fda) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("N", [3, 7, 10, 31])
def test_fda_equals_sqp_gaussian_norm(N):
    fda = optimal_weights(N, "fda", norm=2)
    sqp = sqp_weights(N, norm=2)
    np.testing.assert_allclose(fda, sqp, atol=1e-4)
    assert weights_sensitivity(fda, 2) == pytest.approx(1.0, abs=1e-12)


def test_fda_recursion_of_theorem_5_4():
    # Sigma*_{2^m-1} = diag(alpha Sigma*_{2^{m-1}-1}, 1 - alpha, Sigma*_{2^{m-1}-1}), closed-form alpha
    err = 0.0
    for m in range(1, 12):
        N = 2**m - 1
        w = FenwickWeights.build(N)
        lam, half = w.array(), 2 ** (m - 1)
        if m > 1:
            prev = optimal_weights(half - 1)
            alpha = err ** (1 / 3) / (err ** (1 / 3) + half ** (1 / 3))
            np.testing.assert_allclose(lam[: half - 1], alpha * prev, rtol=1e-12)
            np.testing.assert_allclose(lam[half:], prev, rtol=1e-12)
            assert lam[half - 1] == pytest.approx(1 - alpha)
        err = (err ** (1 / 3) + half ** (1 / 3)) ** 3 + err
        assert w.objective == pytest.approx(err, rel=1e-12)
        assert objective(N, lam) == pytest.approx(err, rel=1e-12)


def test_fda_is_locally_optimal_for_general_n():
    # no feasible perturbation along the active constraints improves a large general N
    N = 1000
    lam = optimal_weights(N)
    f0 = objective(N, lam)
    rng = np.random.default_rng(0)
    for _ in range(20):
        trial = lam * np.exp(0.01 * rng.standard_normal(N))
        trial /= weights_sensitivity(trial)  # rescale to feasibility
        assert objective(N, trial) >= f0


def test_weight_lookup_is_exact_and_validated():
    w = FenwickWeights.build(77)
    lam = w.array()
    assert all(w.at(i) == lam[i - 1] for i in range(1, 78))
    with pytest.raises(SparseDPError):
        w.at(78)
    with pytest.raises(SparseDPError):
        optimal_weights(10, method="newton")
    with pytest.raises(ShapeError):
        optimal_weights(0)


def test_brute_force_sensitivity_of_weighted_strategy():
    for N in (7, 12, 33):
        for norm in (1, 2):
            lam = optimal_weights(N, norm=norm)
            M, _ = fenwick_matrices(N)
            SM = np.diag(lam) @ M.toarray()
            x = np.arange(N, dtype=float)
            worst = max(np.linalg.norm(SM @ (x + e) - SM @ x, norm) for e in np.eye(N))  # neighbours
            assert worst <= 1 + 1e-12
            assert worst == pytest.approx(weights_sensitivity(lam, norm))


def test_expected_error_matches_dense_formula():
    N = 45
    lam = optimal_weights(N)
    M, B = fenwick_matrices(N)
    res = expected_error(N, lam, epsilon=0.5)
    Bd = B.toarray() @ np.diag(1 / lam)
    np.testing.assert_allclose(res.per_step, 2 / 0.25 * (Bd**2).sum(axis=1))
    assert res.total == pytest.approx(2 / 0.25 * objective(N, lam))
    g = expected_error(N, optimal_weights(N, norm=2), rho=0.5)
    assert g.noise_variance == pytest.approx(1.0) and g.sensitivity == pytest.approx(1.0)


def test_expected_error_validation():
    with pytest.raises(InvalidPrivacyParameterError):
        expected_error(5, np.ones(5), epsilon=0)
    with pytest.raises(InvalidPrivacyParameterError):
        expected_error(5, np.ones(5), epsilon=1, rho=1)
    with pytest.raises(ShapeError):
        expected_error(5, np.ones(4), epsilon=1)
    with pytest.raises(NonFiniteInputError):
        expected_error(2, [1.0, np.nan], epsilon=1)


def node_variances(counter):
    """Var of each node's estimate y_i / w_i from the plan's per-row variances (rows weighted w_i)."""
    return counter.plan.variances() / counter.plan.measured.weights**2


def close_to_analytic(exact, analytic, secure):
    exact, analytic = np.atleast_1d(exact), np.atleast_1d(analytic)
    if secure:
        assert np.all(exact <= analytic * 1.0222) and np.all(exact >= analytic * 0.9)
    else:
        np.testing.assert_allclose(exact, analytic, rtol=1e-5)


def run_counter(counter, x):
    out, z = [], []
    for a in x:
        out.append(counter.update(a))
        z.append(counter.last_noise)
    return np.array(out), np.array(z)


@pytest.mark.parametrize("kw", [dict(epsilon=0.7), dict(rho=0.3, noise="gaussian"),
                                dict(epsilon=1.0, weights="uniform")])
@pytest.mark.parametrize("N", [1, 13, 64, 100])
@pytest.mark.parametrize("secure", [True, False])
def test_counter_equals_batch_formula(N, kw, secure):
    x = np.random.default_rng(N).integers(0, 9, N).astype(float)
    c = ContinualCounter(N, rng=5, secure=secure, **kw)
    out, z = run_counter(c, x)
    M, B = fenwick_matrices(N)
    # the weighted node lambda_i x(node) + Lap(b) is measured as x(node) + z_i, z_i of scale b / lambda_i
    np.testing.assert_allclose(out, B @ (M @ x + z), rtol=1e-12, atol=1e-9)
    if secure:  # exact noise on the lattice: y = m c + z is an integer for integer weights m
        w = c.plan.measured.weights
        y = w * (M @ x) + w * np.asarray(z)
        assert np.array_equal(w, np.round(w)) and np.allclose(y, np.round(y), rtol=0, atol=1e-6)
        if kw.get("weights") == "uniform":
            assert np.array_equal(out, np.round(out))
    np.testing.assert_allclose([c.last_variance], [prefix_chain_sum(node_variances(c))[-1]], rtol=1e-12)
    # the analytic float-noise formula; exact noise: integer weights round(2^20 lambda) and a discrete
    # Laplace, whose variance is below 2 t^2
    close_to_analytic(c.last_variance, c.expected_error().per_step[-1], secure)


@pytest.mark.parametrize("secure", [True, False])
def test_counter_noise_calibration_and_empirical_variance(secure):
    N, R = 31, 6000
    # R releases of one counter's plan (tests/_counter_draws.py: noise in one call, the counter's own steps)
    runs = counter_releases(lambda rng: ContinualCounter(N, epsilon=EPS, rng=rng, secure=secure), np.ones(N), R, 11)
    err = runs - np.arange(1, N + 1)
    formula = prefix_chain_sum(node_variances(ContinualCounter(N, epsilon=EPS, rng=0, secure=secure)))  # the plan's exact per-row variances
    np.testing.assert_array_less(np.abs(err.var(axis=0) / formula - 1), 0.10)
    analytic = expected_error(N, optimal_weights(N), epsilon=EPS).per_step
    close_to_analytic(formula, analytic, secure)
    c = ContinualCounter(N, epsilon=0.5)
    assert c.sensitivity == pytest.approx(1.0) and c.scale == pytest.approx(2.0)  # Lap(Delta_1 / eps)
    u = ContinualCounter(N, epsilon=0.5, weights="uniform")
    assert u.sensitivity == 5 and u.scale == 10  # floor(log2 31) + 1 = 5


@pytest.mark.parametrize("secure", [True, False])
def test_counter_gaussian_empirical_variance(secure):
    N, R = 20, 4000
    runs = counter_releases(lambda rng: ContinualCounter(N, rho=0.5, rng=rng, secure=secure), np.zeros(N), R, 3)
    formula = prefix_chain_sum(node_variances(ContinualCounter(N, rho=0.5, rng=0, secure=secure)))
    np.testing.assert_array_less(np.abs(runs.var(axis=0) / formula - 1), 0.10)
    analytic = expected_error(N, optimal_weights(N, norm=2), rho=0.5).per_step
    close_to_analytic(formula, analytic, secure)


def test_counter_refuses_step_n_plus_1_and_bad_input_before_noise():
    c = ContinualCounter(3, epsilon=1.0, rng=0)
    ref = ContinualCounter(3, epsilon=1.0, rng=0)
    with pytest.raises(NonFiniteInputError):
        c.update(float("nan"))
    with pytest.raises(NonFiniteInputError):
        c.update("abc")
    assert c.t == 0
    assert [c.update(1) for _ in range(3)] == [ref.update(1) for _ in range(3)]  # nothing was drawn
    with pytest.raises(BudgetExceededError):
        c.update(1)
    assert c.t == 3
    with pytest.raises(InvalidPrivacyParameterError):
        ContinualCounter(3, epsilon=0.0)
    with pytest.raises(InvalidPrivacyParameterError):
        ContinualCounter(3, epsilon=-1.0)
    with pytest.raises(SparseDPError):
        ContinualCounter(3, epsilon=1.0, noise="gaussian")
    with pytest.raises(ShapeError):
        ContinualCounter(0, epsilon=1.0)
    with pytest.raises(ShapeError):
        ContinualCounter(3, epsilon=1.0, weights=[1.0, 1.0])


def test_counter_state_is_logarithmic():
    N = 4095
    c = ContinualCounter(N, epsilon=1.0, rng=0)
    biggest = 0
    for _ in range(N):
        c.update(1.0)
        biggest = max(biggest, len(c.state()["stack"]))
    assert biggest <= N.bit_length()


def test_save_restore_keeps_published_noise(tmp_path):
    N = 50
    x = np.random.default_rng(0).integers(0, 5, N).astype(float)
    c = ContinualCounter(N, epsilon=1.0, rng=1)
    first, z1 = run_counter(c, x[:20])
    path = tmp_path / "counter.json"
    c.save(path)
    assert json.loads(path.read_text())["t"] == 20
    restored = ContinualCounter.load(path)
    rest, z2 = run_counter(restored, x[20:])
    # the continuation is the batch formula with the published noise kept, fresh noise after
    M, B = fenwick_matrices(N)
    z = np.concatenate([z1, z2])
    np.testing.assert_allclose(np.concatenate([first, rest]), B @ (M @ x + z), atol=1e-9)
    with pytest.raises(BudgetExceededError):
        restored.update(1.0)
    # a restored counter draws from the key saved in the state, never from a new generator
    with pytest.raises(SparseDPError, match="key saved in its state"):
        ContinualCounter.from_state(c.state(), rng=1)
    bad = c.state()
    bad["stack"] = []
    with pytest.raises(SparseDPError):
        ContinualCounter.from_state(bad)
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "junk.json").chmod(0o600)
    with pytest.raises(SparseDPError):
        ContinualCounter.load(tmp_path / "junk.json")


RESUMABLE = [dict(epsilon=1.0), dict(rho=0.5), dict(epsilon=1.0, secure=False), dict(epsilon=1.0, weights="uniform"),
             dict(epsilon=1.0, increments="unit"), dict(epsilon=1.0, weights=list(np.linspace(1.0, 0.2, 40)))]


@pytest.mark.parametrize("kw", RESUMABLE)
def test_loading_one_state_many_times_publishes_one_value_per_step(tmp_path, kw):
    # the replay attack: load the same state again and again and average the next step's values
    c = ContinualCounter(40, **kw)  # fresh operating-system entropy: a private run
    c.run([1, 0, 1])
    path = tmp_path / "state.json"
    c.save(path)
    published = c.update(1)  # step 4, published once
    replays = {ContinualCounter.load(path).update(1) for _ in range(30)}
    assert replays == {published}  # bit for bit: averaging the replays recovers nothing
    # the noise is the step's, whatever the increment replayed: a changed increment moves the value by itself
    other = ContinualCounter.load(path)
    assert other.update(0) == pytest.approx(published - 1, abs=1e-9)
    assert other.last_noise == pytest.approx(c.last_noise, abs=1e-9)  # the same noise, up to the division's rounding
    # and the steps after it continue the same release
    again = ContinualCounter.load(path)
    again.update(1)
    assert again.run([0, 1, 1]).tolist() == c.run([0, 1, 1]).tolist()


def test_a_resumed_run_equals_the_uninterrupted_run_across_noise_blocks():
    # keyed blocks of 7 rows: a resume at any step (inside a block or at its edge) draws the same noise
    N = 30
    x = np.random.default_rng(3).integers(0, 4, N).astype(float)
    c = ContinualCounter(N, epsilon=1.0, _noise_block=7)
    states = [c.state()]
    whole = []
    for a in x:
        whole.append(c.update(a))
        states.append(c.state())
    for t in (0, 1, 6, 7, 8, 13, 14, 29):
        r = ContinualCounter.from_state(states[t])
        assert r.run(x[t:]).tolist() == whole[t:], t
    assert states[5]["noise_block"] == 7 and len(bytes.fromhex(states[5]["noise_key"])) == 32


@pytest.mark.parametrize("kw", [dict(epsilon=0.5), dict(rho=0.1)])
@pytest.mark.parametrize("block", [1, 64])
def test_keyed_noise_has_the_plans_exact_variance(kw, block):
    # the keyed rows (blocks of 1 and of 64 rows) are the plan's exact discrete noise: mean 0, variance exact
    c = ContinualCounter(4095, weights="uniform", _noise_block=block, rng=17, **kw)  # a key from a seed: repeatable
    z = c._noise.all()
    var = c.plan.variances()
    assert np.all(var == var[0]) and np.all(z == np.round(z))  # one scale; integers (grid 1)
    assert abs(z.var() / var[0] - 1) < 0.15 and abs(z.mean()) < 5 * np.sqrt(var[0] / z.size)


def test_the_noise_scheme_is_pinned():
    # a saved key must give the same noise in every later version, else a replay from an old state
    # releases new noise: a change to the block layout, KeyedRandomBits or the exact samplers' use of
    # its bytes fails here -- then bump counter.NOISE_SCHEME (old states are refused) and re-pin
    assert counter_module.NOISE_SCHEME == 1
    pinned = {
        "laplace": ([61.83755488010807, 21.322700467182354, 31.126163245517574, -17.233884323344686,
                     -14.04539544464714, -60.93369777315813], [-403131.0, 32038.0, 626670.0]),
        "gaussian": ([10.896248626589232, 5.330009437137446, 2.89765413390434, 4.440816138009076,
                      9.089374909420771, 2.957646463887099], [-1508744.0, 626670.0, -1540287.0]),
    }
    for kind, (released, rows) in pinned.items():
        kw = dict(epsilon=1.0) if kind == "laplace" else dict(rho=0.5)
        assert ContinualCounter(70000, rng=123, **kw).run(np.ones(6)).tolist() == released
        c = ContinualCounter(70000, rng=123, **kw)
        c._noise.skip_to(65535)  # the last row of block 0 and the first rows of block 1
        assert [c._noise.draw() for _ in range(3)] == rows
    state = ContinualCounter(20, epsilon=1.0).state()
    state["noise_scheme"] = 0
    with pytest.raises(SparseDPError, match="scheme"):
        ContinualCounter.from_state(state)


def test_noise_keys_are_secret_fresh_or_seeded():
    a, b = ContinualCounter(20, epsilon=1.0), ContinualCounter(20, epsilon=1.0)
    assert a.private and a.state()["private"] is True
    assert a.state()["noise_key"] != b.state()["noise_key"]  # fresh 256-bit keys
    seeded = ContinualCounter(20, epsilon=1.0, rng=5)
    assert not seeded.private and seeded.state()["private"] is False
    assert seeded.state()["noise_key"] == ContinualCounter(20, epsilon=1.0, rng=5).state()["noise_key"]
    seeded.update(2)
    restored = ContinualCounter.from_state(seeded.state())
    assert not restored.private  # a seeded run stays marked not private after a resume
    tampered = seeded.state()
    tampered["noise_key"] = "00"
    with pytest.raises(SparseDPError, match="noise_key"):
        ContinualCounter.from_state(tampered)


def test_a_state_without_a_key_resumes_with_a_warning():
    c = ContinualCounter(20, epsilon=1.0, rng=0)
    c.update(1)
    old = c.state()
    old["version"] = 3
    for key in ("noise_key", "noise_block", "private"):
        del old[key]
    with pytest.warns(UserWarning, match="no noise key"):
        r = ContinualCounter.from_state(old)
    assert r.t == 1 and r.state()["version"] == 4 and "noise_key" in r.state()


def test_dpcrpy_weights_agree_if_installed():
    fda_mod = pytest.importorskip("dpcrpy.bitMethods.fda")
    for k in (3, 6, 10):
        ref = fda_mod.FDA(kOrder=k, isInit=False)
        N = 2**k - 1
        theirs = np.array([ref.getCof(t) for t in range(1, N + 1)])
        np.testing.assert_allclose(optimal_weights(N), theirs, rtol=1e-10)


@pytest.mark.parametrize("bad", [1.5, -3, 2**51 + 7, 12345678901234567890123])
def test_a_refused_increment_is_not_echoed_in_the_error(bad):
    """An error names the bound, never the data's value (the increment)."""
    c = ContinualCounter(8, epsilon=1.0)
    c.update(5)
    with pytest.raises(SparseDPError) as err:
        c.update(bad)
    assert str(bad) not in str(err.value) and repr(bad) not in str(err.value)
