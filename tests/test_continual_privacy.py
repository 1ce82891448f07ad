"""Issue 19 regression tests for the continual counters (#6 state file, #7 increments and accountant,
#10 budget range, and the audit of the measured strategy against the budget charged)."""

import io
import json
import os
import stat
import sys
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from _counter_draws import memoise_fit_blt

from sparsedp import BudgetExceededError, InvalidPrivacyParameterError, NonFiniteInputError, SparseDPError
from sparsedp.cli import main
from sparsedp.continual import (
    BinaryMechanism,
    BLTCounter,
    ContinualCounter,
    GLSTreeCounter,
    HonakerCounter,
    KaryCounter,
    NaiveCounter,
    NegDigitCounter,
    SqrtCounter,
    ToeplitzCounter,
    mixed_layout,
    sqrt_coefficients,
)
from sparsedp.errors import InputBoundError
from sparsedp.privacy import Accountant
from sparsedp.validation import MAX_EPSILON, MAX_RHO, MIN_EPSILON, MIN_RHO

N = 12


def root_unmeasured(n):
    """Level weights 4, 3, 3, ... with the root (if there is one above the leaves) left unmeasured."""
    levels = mixed_layout(n, (2, 2)).levels
    return [4.0] + [3.0] * (levels - 2) + [0.0] if levels > 1 else [1.0]

PURE = {
    "fenwick": lambda n, eps, **kw: ContinualCounter(n, epsilon=eps, **kw),
    "fenwick-uniform": lambda n, eps, **kw: ContinualCounter(n, epsilon=eps, weights="uniform", **kw),
    "naive": lambda n, eps, **kw: NaiveCounter(n, eps, **kw),
    "binary": lambda n, eps, **kw: BinaryMechanism(n, eps, **kw),
    "honaker": lambda n, eps, **kw: HonakerCounter(n, eps, **kw),
    "kary": lambda n, eps, **kw: KaryCounter(n, eps, k=3, **kw),
    "negdigit": lambda n, eps, **kw: NegDigitCounter(n, eps, k=3, **kw),
    "gls-tree": lambda n, eps, **kw: GLSTreeCounter(n, eps, radices=(3, 2), **kw),
    "gls-tree-root": lambda n, eps, **kw: GLSTreeCounter(n, eps, radices=(2, 2), weights=root_unmeasured(n), **kw),
}
ZCDP = {
    "fenwick-gauss": lambda n, rho, **kw: ContinualCounter(n, rho=rho, **kw),
    "gls-tree-gauss": lambda n, rho, **kw: GLSTreeCounter(n, rho=rho, radices=(3, 2), **kw),
    "sqrt": lambda n, rho, **kw: SqrtCounter(n, rho, **kw),
    "blt": lambda n, rho, **kw: BLTCounter(n, rho, buffers=2, **kw),
    "toeplitz": lambda n, rho, **kw: ToeplitzCounter(n, rho, sqrt_coefficients(n), **kw),
}
ALL = {**{k: (v, 1.0) for k, v in PURE.items()}, **{k: (v, 0.5) for k, v in ZCDP.items()}}


@pytest.fixture(autouse=True)
def _fit_each_blt_once(monkeypatch):
    memoise_fit_blt(monkeypatch)  # tests/_counter_draws.py: one fit per (N, buffers) for this module


def make(name, n=N, **kw):
    factory, budget = ALL[name]
    return factory(n, budget, **kw)


# ---- #7: increments are bounded by a documented rule ----------------------------------------------

@pytest.mark.parametrize("name", sorted(ALL))
def test_out_of_domain_increments_are_refused_before_anything_changes(name):
    c, twin = make(name, rng=3), make(name, rng=3)
    assert c.update(1) == twin.update(1)
    for bad in (-5, 0.5, 1e18, 1e308, 10**18 + 64, -1e-300):
        with pytest.raises(InputBoundError):
            c.update(bad)
        assert c.t == 1
    for bad in (float("nan"), float("inf"), "abc", None):
        with pytest.raises(NonFiniteInputError):
            c.update(bad)
    assert c.t == 1
    assert c.update(2) == twin.update(2)  # nothing was drawn and no state moved by the refusals


@pytest.mark.parametrize("name", sorted(ALL))
def test_unit_increments_are_reals_in_zero_one(name):
    c = make(name, rng=0, increments="unit")
    for a in (0.5, 0.0, 1.0, 0.25):
        assert np.isfinite(c.update(a))
    for bad in (1.5, -0.1, 2, 1 + 2**-52):
        with pytest.raises(InputBoundError):
            c.update(bad)
    assert c.t == 4
    with pytest.raises(SparseDPError):
        make(name, increments="reals")


def test_running_sum_above_the_magnitude_bound_is_refused():
    c = ContinualCounter(4, epsilon=1.0, rng=0)
    c.update(2**50 - 1)
    c.update(1)  # the running sum reaches 2^50: still exact
    with pytest.raises(InputBoundError):
        c.update(1)
    assert c.t == 2
    assert c.state()["s"] == 2**50


# ---- #7: counters are connected to an Accountant (charged once, at creation) ----------------------

@pytest.mark.parametrize("name", sorted(ALL))
def test_accountant_charged_once_at_creation_before_any_noise(name):
    factory, budget = ALL[name]
    acc = Accountant(epsilon=1.5) if name in PURE else Accountant(rho=0.75)
    c = factory(N, budget, rng=np.random.default_rng(0), accountant=acc)
    assert acc.spent == budget and len(acc.history) == 1
    assert c.privacy_cost.epsilon == (budget if name in PURE else 0.0)
    c.run(np.ones(N))
    assert acc.spent == budget and len(acc.history) == 1  # the stream is one release
    gen = np.random.default_rng(1)
    before = gen.bit_generator.state
    with pytest.raises(BudgetExceededError):
        factory(N, budget, rng=gen, accountant=acc)  # only half the budget is left
    assert gen.bit_generator.state == before and acc.spent == budget
    with pytest.raises(SparseDPError):
        factory(N, budget, accountant="not an accountant")


def test_restored_counter_is_not_charged_again(tmp_path):
    acc = Accountant(epsilon=1.0)
    c = ContinualCounter(N, epsilon=1.0, rng=0, accountant=acc)
    c.update(1)
    c.save(tmp_path / "s.json")
    ContinualCounter.load(tmp_path / "s.json").update(1)
    assert acc.spent == 1.0 and len(acc.history) == 1


# ---- #10 (and #5 of the brief): the budget range, and finite outputs at both of its ends ------------

@pytest.mark.parametrize("name", sorted(ALL))
def test_budget_outside_the_range_is_refused(name):
    factory, _ = ALL[name]
    lo, hi = (MIN_EPSILON, MAX_EPSILON) if name in PURE else (MIN_RHO, MAX_RHO)
    for bad in (1e300, 5e-324, lo / 2, hi * 2, "1", True, float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(InvalidPrivacyParameterError):
            factory(N, bad)


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("end", ["low", "high"])
def test_outputs_are_finite_at_both_ends_of_the_budget_range(name, end):
    factory, _ = ALL[name]
    budget = {("low", True): MIN_EPSILON, ("high", True): MAX_EPSILON,
              ("low", False): MIN_RHO, ("high", False): MAX_RHO}[end, name in PURE]
    c = factory(N, budget, rng=7)
    x = np.array([0, 1, 2**40, 3, 0, 0, 5, 1, 2**45, 0, 1, 1], dtype=float)
    out = c.run(x)
    assert np.all(np.isfinite(out)) and np.isfinite(c.last_variance)
    if end == "high":  # almost no noise: the running sums come back
        np.testing.assert_allclose(out, np.cumsum(x), rtol=1e-9, atol=1e-2)


def test_gls_tree_issue_values():
    for eps in (1e300, 5e-324):
        with pytest.raises(InvalidPrivacyParameterError):
            GLSTreeCounter(50, eps, rng=0)


# ---- audit: the epsilon charged covers the brute-force loss of the measured matrix ----------------

def exact_loss(M, scales, p):
    """``max_j sum_i |M_ij|^p / (p b_i^p)``, in exact rational arithmetic over the float entries
    (``p = 1``: the Laplace epsilon; ``p = 2``: the Gaussian rho)."""
    M = sp.csc_matrix(M)
    b = [Fraction(float(s)) for s in np.asarray(scales, dtype=float)]
    worst = Fraction(0)
    for j in range(M.shape[1]):
        lo, hi = M.indptr[j], M.indptr[j + 1]
        col = sum((abs(Fraction(float(v))) ** p / b[i] ** p for i, v in zip(M.indices[lo:hi], M.data[lo:hi])),
                  Fraction(0))
        worst = max(worst, col / p)
    return worst


@pytest.mark.parametrize("name", sorted(PURE))
@pytest.mark.parametrize("n", [1, 2, 5, 12, 17, 30])
def test_epsilon_charged_covers_the_loss_of_the_measured_matrix(name, n):
    eps = 0.7
    acc = Accountant(epsilon=10.0)
    c = PURE[name](n, eps, rng=0, accountant=acc)
    M, b = c.measured_strategy(), c.noise_scales()
    assert M.shape[1] == n and b.shape == (M.shape[0],) and np.all(b > 0)
    assert np.all(np.asarray(abs(M).sum(axis=0)).ravel() > 0)  # every step is measured
    loss = exact_loss(M, b, 1)
    assert Fraction(acc.spent) >= loss
    assert Fraction(c.privacy_cost.epsilon) >= loss
    assert loss >= Fraction(eps) * Fraction(999, 1000)  # and the noise is not wastefully large


@pytest.mark.parametrize("name", sorted(ZCDP))
@pytest.mark.parametrize("n", [1, 2, 5, 12, 30])
def test_rho_charged_covers_the_loss_of_the_measured_matrix(name, n):
    rho = 0.3
    acc = Accountant(rho=10.0)
    c = ZCDP[name](n, rho, rng=0, accountant=acc)
    M, sigma = c.measured_strategy(), c.noise_scales()
    assert M.shape[1] == n and sigma.shape == (M.shape[0],)
    loss = exact_loss(M, sigma, 2)
    assert Fraction(acc.spent) >= loss and Fraction(c.privacy_cost.rho) >= loss
    assert loss >= Fraction(rho) * Fraction(999, 1000)


@pytest.mark.parametrize("secure", [True, False])
def test_fenwick_measured_strategy_is_what_the_counter_measures(secure):
    n = 21
    x = np.random.default_rng(2).integers(0, 7, n).astype(float)
    for kw in (dict(epsilon=0.9), dict(rho=0.4), dict(epsilon=1.0, weights="uniform")):
        c = ContinualCounter(n, rng=4, secure=secure, **kw)
        out, z = [], []
        for a in x:
            out.append(c.update(a))
            z.append(c.last_noise)
        M = c.measured_strategy()
        from sparsedp.continual import fenwick_matrices

        M_N, B = fenwick_matrices(n)
        w = np.asarray(M.max(axis=1).todense()).ravel()  # one weight per row
        assert abs(M - sp.diags(w) @ M_N).max() == 0  # the Fenwick nodes, weighted
        np.testing.assert_allclose(out, B @ (M_N @ x + np.array(z)), atol=1e-9)
        np.testing.assert_array_equal(c.noise_scales(), np.full(n, c.scale * c.weight_unit))  # one scale for all
        lam = c.weights_array()
        if secure and "weights" not in kw:  # integer weights on the lattice, proportional to lambda
            assert np.array_equal(w, np.maximum(1, np.round(lam * 2.0**20)))
        else:
            np.testing.assert_array_equal(w, lam)


# ---- #6: the state file is secret, and a resume must repeat the parameters ------------------------

@pytest.fixture
def loose_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_library_save_writes_an_owner_only_file(tmp_path, loose_umask):
    path = tmp_path / "st.json"
    path.write_text("{}")
    os.chmod(path, 0o644)  # an older, world-readable state file is replaced by an owner-only one
    c = ContinualCounter(N, epsilon=1.0, rng=0)
    c.update(3)
    c.save(path)
    assert mode(path) == 0o600
    assert json.loads(path.read_text())["t"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["st.json"]  # no temporary file left behind


def run_cli(monkeypatch, argv, lines):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{v}\n" for v in lines)))
    return main(["continual", *argv])


def test_cli_state_file_is_owner_only(monkeypatch, capsys, tmp_path, loose_umask):
    state = tmp_path / "st.json"
    assert run_cli(monkeypatch, ["--horizon", "5", "--state", str(state)], [1, 1]) == 0
    assert mode(state) == 0o600
    assert json.loads(state.read_text())["t"] == 2


@pytest.mark.parametrize("flag, first, second", [
    ("--epsilon", ["--epsilon", "1"], ["--epsilon", "0.01"]),
    ("--rho", ["--rho", "0.5"], ["--rho", "0.01"]),
    ("--epsilon", ["--epsilon", "1"], ["--rho", "0.5"]),
    ("--weights", ["--weights", "optimal"], ["--weights", "uniform"]),
    ("--increments", ["--increments", "counts"], ["--increments", "unit"]),
    ("--horizon", [], ["--horizon", "9"]),
])
def test_cli_resume_with_other_parameters_is_refused(monkeypatch, capsys, tmp_path, flag, first, second):
    state = tmp_path / "st.json"
    assert run_cli(monkeypatch, ["--horizon", "5", "--state", str(state), *first], [1, 0]) == 0
    saved = state.read_text()
    capsys.readouterr()
    argv = ["--state", str(state), *second]
    if "--horizon" not in second:
        argv = ["--horizon", "5", *argv]
    assert run_cli(monkeypatch, argv, [1]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing released
    name = flag.lstrip("-")
    assert name in captured.err or (flag == "--epsilon" and "rho" in captured.err)
    assert state.read_text() == saved  # the state is untouched


def test_cli_resume_with_the_same_parameters_continues(monkeypatch, capsys, tmp_path):
    state = tmp_path / "st.json"
    argv = ["--horizon", "4", "--rho", "0.5", "--weights", "uniform", "--state", str(state)]
    assert run_cli(monkeypatch, argv, [1, 0]) == 0
    assert run_cli(monkeypatch, argv, [1, 1]) == 0
    assert json.loads(state.read_text())["t"] == 4
    assert len(capsys.readouterr().out.split()) == 4


def test_library_load_refuses_disagreeing_parameters(tmp_path):
    path = tmp_path / "st.json"
    c = ContinualCounter(N, epsilon=1.0, rng=0)
    c.update(1)
    c.save(path)
    with pytest.raises(SparseDPError, match=r"epsilon.*1\.0.*0\.01|epsilon.*0\.01.*1\.0"):
        ContinualCounter.load(path, epsilon=0.01)
    with pytest.raises(SparseDPError, match="rho"):
        ContinualCounter.load(path, rho=0.5)
    with pytest.raises(SparseDPError, match="horizon"):
        ContinualCounter.load(path, horizon=N + 1)
    with pytest.raises(SparseDPError, match="weights"):
        ContinualCounter.load(path, weights="uniform")
    with pytest.raises(SparseDPError, match="increments"):
        ContinualCounter.load(path, increments="unit")
    assert ContinualCounter.load(path, horizon=N, epsilon=1.0, weights="optimal", increments="counts").t == 1


def test_tampered_state_with_out_of_domain_sum_is_refused(tmp_path):
    c = ContinualCounter(N, epsilon=1.0, rng=0)
    c.update(2)
    state = c.state()
    for bad in (0.5, -3, 2.0**60, float("nan")):
        state["s"] = bad
        with pytest.raises(SparseDPError):
            ContinualCounter.from_state(state)


def test_cli_help_says_the_state_file_is_secret(capsys):
    with pytest.raises(SystemExit):
        main(["continual", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "0600" in out and "secret" in out and "--increments" in out


# ---- noise from OS entropy unless a seed is given, and then the run says it is not private ---------

def test_cli_seed_warns_not_private_and_default_noise_is_fresh(monkeypatch, capsys):
    assert run_cli(monkeypatch, ["--horizon", "3", "--seed", "1"], [1, 1]) == 0
    assert "NOT private" in capsys.readouterr().err
    outs = []
    for _ in range(2):
        assert run_cli(monkeypatch, ["--horizon", "3"], [1, 1]) == 0
        captured = capsys.readouterr()
        assert "NOT private" not in captured.err
        outs.append(captured.out)
    assert outs[0] != outs[1]


def test_cli_refuses_out_of_domain_lines(monkeypatch, capsys):
    assert run_cli(monkeypatch, ["--horizon", "5", "--seed", "1"], [1, 0.5]) == 2
    captured = capsys.readouterr()
    assert len(captured.out.split()) == 1 and "integer" in captured.err
    assert run_cli(monkeypatch, ["--horizon", "5", "--increments", "unit", "--seed", "1"], [1, 0.5]) == 0
    assert run_cli(monkeypatch, ["--horizon", "5", "--epsilon", "1e300"], [1]) == 2
