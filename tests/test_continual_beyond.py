import io
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
from _counter_draws import counter_releases

from sparsedp import BudgetExceededError, InvalidPrivacyParameterError, SparseDPError
from sparsedp.cli import main
from sparsedp.continual import (
    BLT,
    BinaryMechanism,
    BLTCounter,
    HonakerCounter,
    KaryCounter,
    NaiveCounter,
    SqrtCounter,
    ToeplitzCounter,
    binary_variance,
    expected_error,
    fit_blt,
    honaker_variance,
    kary_error,
    kary_weights,
    naive_variance,
    sqrt_coefficients,
    sqrt_error,
    unweighted_fenwick,
)
from sparsedp.continual.kary import kary_levels


def empirical_var(make, N, R, seed, x=None):
    """Per-step variance of ``R`` independent releases of ``make(rng)`` on ``x``: one counter's plan,
    ``R`` noise vectors drawn in one call, offsets by the counter's own steps (tests/_counter_draws.py)."""
    x = np.ones(N) if x is None else x
    return (counter_releases(make, x, R, seed) - np.cumsum(x)).var(axis=0)


def assert_variance(v, exact, secure):
    """Empirical per-step variances against the counter's exact ones: within 10% at every step (float
    noise, 5000 runs), or -- exact noise, whose sampler costs ~2 ms per counter, so fewer runs -- within
    10% on average over the steps and 15% at every step."""
    ratio = v / exact - 1
    if secure:
        assert abs(v.mean() / exact.mean() - 1) < 0.10
        np.testing.assert_array_less(np.abs(ratio), 0.15)
    else:
        np.testing.assert_array_less(np.abs(ratio), 0.10)


def step_variances(counter, x):
    """``last_variance`` after every step: the counter's exact per-step variance (from its plan)."""
    out = []
    for a in x:
        counter.update(a)
        out.append(counter.last_variance)
    return np.array(out)


@pytest.mark.parametrize("N, binary, honaker",
                         [(2**10 - 1, 1001, 581), (2**16 - 1, 4096, 2254), (2**20 - 1, 8000, 4321)])
def test_issue_reference_values(N, binary, honaker):
    assert binary_variance(N, 1.0).mean() == pytest.approx(binary, abs=0.5)
    assert honaker_variance(N, 1.0).mean() == pytest.approx(honaker, abs=0.5)


def test_binary_mechanism_is_unweighted_fenwick():
    N = 77
    x = np.random.default_rng(0).integers(0, 3, N).astype(float)
    binary = BinaryMechanism(N, 1.0, rng=4)
    a = binary.run(x)
    z = binary.plan.noise_stream(rng=4, chunk=N).all()  # the noise the binary mechanism drew
    fenwick = unweighted_fenwick(N, 1.0, rng=4)  # its own noise is keyed: given the binary mechanism's
    np.testing.assert_allclose(a, fenwick._release_for(x, z), atol=1e-9)
    np.testing.assert_allclose(binary_variance(N, 1.0), expected_error(N, np.ones(N), epsilon=1.0).per_step)


@pytest.mark.parametrize("cls, formula", [(NaiveCounter, naive_variance), (BinaryMechanism, binary_variance),
                                          (HonakerCounter, honaker_variance)])
@pytest.mark.parametrize("secure", [True, False])
def test_baseline_empirical_variance(cls, formula, secure):
    N, R = 24, 2500 if secure else 5000
    v = empirical_var(lambda rng: cls(N, 1.0, rng=rng, secure=secure), N, R, seed=7)
    exact = step_variances(cls(N, 1.0, rng=0, secure=secure), np.ones(N))  # from the plan's variances
    assert_variance(v, exact, secure)
    if secure:  # discrete Laplace: variance 2 q / (1 - q)^2 < 2 t^2 (t = 1: 8% less here)
        assert np.all(exact < formula(N, 1.0)) and np.all(exact > 0.9 * formula(N, 1.0))
    else:
        np.testing.assert_allclose(exact, formula(N, 1.0), rtol=1e-12)
    c = cls(N, 1.0, rng=0, secure=secure)
    c.run(np.ones(N))
    with pytest.raises(BudgetExceededError):
        c.update(1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        cls(N, 0.0)


def test_honaker_is_unbiased_on_data():
    N = 40
    x = np.random.default_rng(2).integers(0, 10, N).astype(float)
    runs = np.array([HonakerCounter(N, 1e6, rng=s).run(x) for s in range(3)])  # almost no noise
    np.testing.assert_allclose(runs, np.tile(np.cumsum(x), (3, 1)), atol=1e-2)


def test_kary_uniform_binary_is_honaker_and_weights_help():
    for N in (31, 1023, 5000):
        np.testing.assert_allclose(kary_error(N, 2, 1.0, "uniform").per_step, honaker_variance(N, 1.0))
        for k in (2, 3, 8):
            assert kary_error(N, k, 1.0).mean <= kary_error(N, k, 1.0, "uniform").mean * (1 + 1e-9)
    lam = kary_weights(1000, 4)
    assert lam.sum() == pytest.approx(1.0) and np.all(lam > 0)
    assert kary_levels(1000, 10) == 4 and kary_levels(999, 10) == 3


@pytest.mark.parametrize("secure", [True, False])
def test_kary_counter_matches_formula_and_privacy_scale(secure):
    N, R, k = 40, 2500 if secure else 5000, 3
    lam = kary_weights(N, k)
    v = empirical_var(lambda rng: KaryCounter(N, 1.0, k=k, weights=lam, rng=rng, secure=secure), N, R, seed=1)
    exact = step_variances(KaryCounter(N, 1.0, k=k, weights=lam, rng=0, secure=secure), np.ones(N))
    assert_variance(v, exact, secure)
    formula = kary_error(N, k, 1.0).per_step
    np.testing.assert_allclose(exact, formula, rtol=1e-5 if not secure else 0.05)
    c = KaryCounter(N, 1.0, k=k)
    assert c.sensitivity == pytest.approx(1.0)  # one node per level, weights summing to 1
    x = np.random.default_rng(0).integers(0, 4, N).astype(float)
    quiet = KaryCounter(N, 1e6, k=k, rng=0).run(x)
    np.testing.assert_allclose(quiet, np.cumsum(x), atol=1e-2)
    with pytest.raises(SparseDPError):
        KaryCounter(N, 1.0, k=1)
    with pytest.raises(SparseDPError):
        KaryCounter(N, 1.0, k=3, weights=[1.0])


def test_sqrt_factorisation_is_exact_and_reference_values():
    N = 200
    c = sqrt_coefficients(N)
    L = scipy.linalg.toeplitz(c, np.zeros(N))
    np.testing.assert_allclose(L @ L, np.tril(np.ones((N, N))), atol=1e-12)
    for n, ref in [(2**10 - 1, 9.67), (2**16 - 1, 19.66), (2**20 - 1, 28.28)]:
        assert sqrt_error(n, 0.5).mean == pytest.approx(ref, abs=0.01)


def test_blt_closed_forms_against_dense():
    blt = BLT(np.array([0.3, 0.2, 0.5]), np.array([0.99, 0.5, 0.9]))
    N = 150
    b, m = blt.decoder(N), blt.strategy(N)
    Bm = scipy.linalg.toeplitz(b, np.zeros(N))
    Mm = scipy.linalg.toeplitz(m, np.zeros(N))
    np.testing.assert_allclose(Bm @ Mm, np.tril(np.ones((N, N))), atol=1e-10)
    assert blt.strategy_sq_sum(N) == pytest.approx(np.max((Mm**2).sum(axis=0)), rel=1e-10)
    assert blt.decoder_sq_total(N) == pytest.approx(((Bm**2).sum(axis=1)).sum(), rel=1e-10)
    assert blt.mean_error(N, 0.5) == pytest.approx(blt.error(N, 0.5).mean, rel=1e-10)
    with pytest.raises(SparseDPError):
        BLT(np.array([1.0]), np.array([1.5]))


def test_blt_fit_within_5_percent_of_sqrt():
    N = 2**16 - 1
    blt = fit_blt(N, 5)
    assert blt.mean_error(N, 0.5) <= 1.05 * sqrt_error(N, 0.5).mean


@cache
def _blt(N, buffers):
    return fit_blt(N, buffers)  # ~3.5 s: fitted once for both noise kinds


@pytest.mark.parametrize("secure", [True, False])
def test_streaming_toeplitz_counters(secure):
    N, R = 30, 2000 if secure else 3000
    blt = _blt(N, 3)
    v_blt = empirical_var(lambda rng: BLTCounter(N, 0.5, blt=blt, rng=rng, secure=secure), N, R, seed=2)
    exact = step_variances(BLTCounter(N, 0.5, blt=blt, rng=0, secure=secure), np.ones(N))
    assert_variance(v_blt, exact, secure)
    np.testing.assert_allclose(exact, blt.error(N, 0.5).per_step, rtol=1e-5 if not secure else 1e-3)
    v_sqrt = empirical_var(lambda rng: SqrtCounter(N, 0.5, rng=rng, secure=secure), N, R, seed=3)
    exact = step_variances(SqrtCounter(N, 0.5, rng=0, secure=secure), np.ones(N))
    assert_variance(v_sqrt, exact, secure)
    np.testing.assert_allclose(exact, sqrt_error(N, 0.5).per_step, rtol=1e-5 if not secure else 1e-3)
    # the O(d) buffer recursion is the generic Toeplitz convolution with the same noise (float noise;
    # exact noise measures the rounded strategy through the same generic path)
    x = np.arange(N, dtype=float)
    a = BLTCounter(N, 0.5, blt=blt, rng=9, secure=secure).run(x)
    b = ToeplitzCounter(N, 0.5, blt.decoder(N), blt.strategy_sq_sum(N), rng=9, secure=secure).run(x)
    np.testing.assert_allclose(a, b, atol=1e-6)
    c = BLTCounter(N, 0.5, blt=blt, secure=secure)
    assert c.sigma == pytest.approx(np.sqrt(blt.strategy_sq_sum(N)), rel=1e-3)  # Delta_2 / sqrt(2 rho), rho = 1/2


def test_cli_streams_and_flushes(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n0\n\n2\n"))
    assert main(["continual", "--horizon", "5", "--epsilon", "1", "--seed", "3", "--std"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all(len(line.split("\t")) == 2 for line in lines)
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n1\n1\n"))
    assert main(["continual", "--horizon", "2", "--seed", "3"]) == 2
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 2 and "refused" in captured.err
    monkeypatch.setattr(sys, "stdin", io.StringIO("x\n"))
    assert main(["continual", "--horizon", "2"]) == 2


def test_cli_state_file_resumes(monkeypatch, capsys, tmp_path):
    state = str(tmp_path / "s.json")
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n1\n"))
    assert main(["continual", "--horizon", "3", "--state", state, "--seed", "1"]) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n1\n"))
    assert main(["continual", "--horizon", "3", "--state", state, "--seed", "2"]) == 2  # step 4 refused
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3


def test_cli_report(capsys):
    assert main(["continual", "--report", "1023"]) == 0
    out = capsys.readouterr().out
    assert "435.51" in out and "580.85" in out and "9.67" in out
    assert main(["continual", "--report", "0"]) == 2


def test_example_runs():
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, str(root / "examples" / "continual_counter.py")], capture_output=True,
                         text=True, env=env, check=True, timeout=120).stdout
    assert "refused" in out and "FDA" in out


def test_balanced_digits_represent_t():
    from sparsedp.continual import balanced_digits
    from sparsedp.continual.negdigit import negdigit_levels

    for k in (3, 5, 19):
        N = 3000
        L = negdigit_levels(N, k)
        t = np.arange(1, N + 1)
        d = balanced_digits(t, k, L)
        assert np.array_equal((d * (k ** np.arange(L))[:, None]).sum(axis=0), t)
        assert np.abs(d).max() <= (k - 1) // 2
    with pytest.raises(SparseDPError):
        balanced_digits(5, 4, 3)  # even k has no balanced digits


def test_negdigit_counter_formula_privacy_and_exactness():
    from sparsedp.continual import NegDigitCounter, balanced_digits, negdigit_error, negdigit_weights
    from sparsedp.continual.negdigit import negdigit_levels

    N, k = 60, 5
    lam = negdigit_weights(N, k)
    assert lam.sum() == pytest.approx(1.0)
    for secure, R in ((True, 2500), (False, 5000)):  # (at 20000 runs both are within 3% of the formula)
        v = empirical_var(lambda rng: NegDigitCounter(N, 1.0, k=k, weights=lam, rng=rng, secure=secure), N, R, 4)
        exact = step_variances(NegDigitCounter(N, 1.0, k=k, weights=lam, rng=0, secure=secure), np.ones(N))
        assert_variance(v, exact, secure)
        np.testing.assert_allclose(exact, negdigit_error(N, k, 1.0).per_step, rtol=1e-5 if not secure else 0.05)
    # noise-free limit returns the exact running sums: the signed blocks tile [0, t)
    x = np.random.default_rng(1).integers(0, 5, N).astype(float)
    np.testing.assert_allclose(NegDigitCounter(N, 1e6, k=k, rng=1).run(x), np.cumsum(x), atol=1e-4)
    # brute force: rebuild B and M (all blocks used by some t) and check W = B M and Delta_1(Sigma M) = 1
    L = negdigit_levels(N, k)
    d = balanced_digits(np.arange(1, N + 1), k, L)
    rows, B = {}, np.zeros((N, 0))
    for t in range(1, N + 1):
        p_above = 0
        for level in reversed(range(L)):
            size = k**level
            p = p_above + d[level, t - 1] * size
            lo, hi = sorted((p_above // size, p // size))
            for j in range(lo, hi):
                if (level, j) not in rows:
                    rows[(level, j)] = len(rows)
                    B = np.hstack([B, np.zeros((N, 1))])
                B[t - 1, rows[(level, j)]] += np.sign(d[level, t - 1])
            p_above = p
    M = np.zeros((len(rows), N))
    for (level, j), r in rows.items():
        M[r, j * k**level: min(N, (j + 1) * k**level)] = lam[level]
    inv_sigma = np.diag(1 / np.array([lam[lv] for lv, _ in rows]))
    np.testing.assert_allclose(B @ inv_sigma @ M, np.tril(np.ones((N, N))), atol=1e-12)
    assert np.abs(M).sum(axis=0).max() == pytest.approx(1.0)
    # optimal level weights never lose to uniform, and beat Honaker by > 3x at N = 2^20 - 1
    for n in (1023, 2**16 - 1):
        assert negdigit_error(n, 19, 1.0).mean <= negdigit_error(n, 19, 1.0, "uniform").mean
    assert negdigit_error(2**20 - 1, 19, 1.0).mean < honaker_variance(2**20 - 1, 1.0).mean() / 3
    c = NegDigitCounter(5000, 1.0, k=7, rng=0)
    c.run(np.ones(5000))
    assert sum(len(z) for z in c._z) <= 7 * negdigit_levels(5000, 7) * 2  # O(k log_k N) state
