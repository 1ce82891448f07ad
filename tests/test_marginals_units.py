"""Marginals of a table with a privacy unit (sparsedp.marginals.units): brute-force unit-level
neighbours on small random tables (the loss of removing any one whole unit is within the charge,
and reaches it), bad declarations refused before any charge, max_rows="auto", the id-like column
warning, the command line and the spec; and the answers in the order of the workload passed."""

from __future__ import annotations

import contextlib
import io
import json
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sparsedp.errors import SparseDPError
from sparsedp.marginals import (Domain, nonnegative_marginals, optimize_marginals_laplace, release_marginals,
                                release_marginals_laplace)
from sparsedp.marginals.residual import residual_operator
from sparsedp.marginals.units import prepare_unit
from sparsedp.privacy import Accountant, PrivacyCost
from sparsedp.privacy_unit import IdColumnWarning, PrivacyUnit
from sparsedp.releases import load_release

DOM = Domain(["a", "b", "c"], [3, 2, 4])
WORK = [("a", "b"), ("c",), ("b", "c")]
UNITS = [PrivacyUnit("u", max_rows=3), PrivacyUnit("u", max_groups=2, max_rows_per_group=2),
         PrivacyUnit("u", max_rows=3, max_groups=2, max_rows_per_group=2)]


def _table(seed: int, units: int = 6, rows: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Random records (codes) and unit ids; a few units have many rows, some in one cell."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, s, rows) for s in DOM.sizes])
    ids = rng.integers(0, units, rows)
    ids[:4] = 0
    X[ids == 0] = X[ids == 0][0]  # unit 0: all its rows in one cell (the worst case)
    return X, ids


def _kept(X: np.ndarray, ids: np.ndarray, unit: PrivacyUnit, seed: int) -> np.ndarray:
    """The records the release measures: the truncation :func:`release_marginals` runs, same seed."""
    return prepare_unit(X, DOM, ids, unit, noise="gaussian", budget=1.0, accountant=None,
                        rng=np.random.default_rng(seed), drop_missing=False).X


def _tables(X: np.ndarray, sets) -> dict:
    out = {}
    for A in sets:
        t = np.zeros(DOM.shape(A))
        if not A:  # the total
            t = np.array(float(X.shape[0]))
        elif X.shape[0]:
            np.add.at(t, tuple(X[:, i] for i in A), 1.0)
        out[A] = t
    return out


def _neighbours(X: np.ndarray, ids: np.ndarray):
    """For every unit: (the table without it, the table with its rows appended last)."""
    for u in np.unique(ids):
        others = ids != u
        yield (X[others], ids[others]), (np.vstack([X[others], X[~others]]), np.r_[ids[others], ids[~others]])


@pytest.mark.parametrize("unit", UNITS, ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_removing_any_unit_costs_at_most_rho_per_unit_gaussian(unit, seed):
    """The exact zCDP loss of the residual measurements for one whole unit's change is within the
    charged rho (with the noise the release planned), its L2 change within the ledger's sensitivity,
    and the worst unit (all its rows in one cell) reaches the charge: the one-row calibration would
    not hold."""
    X, ids = _table(seed)
    rho = 0.5
    rel = release_marginals(pd.DataFrame(X, columns=DOM.names).assign(u=ids), DOM, WORK, rho, rng=seed,
                            privacy_unit=unit)
    row = release_marginals(X, DOM, WORK, rho, rng=seed)
    sel, L = rel.selection, unit.l1_bound()
    assert rel.entry.cost.rho == rho and rel.loss <= rho and rel.entry.privacy_unit == str(unit)[len("privacy unit: "):]
    worst, worst_row = 0.0, 0.0
    for (Xa, ia), (Xb, ib) in _neighbours(X, ids):
        ka, kb = _kept(Xa, ia, unit, seed), _kept(Xb, ib, unit, seed)
        assert ka.shape[0] <= kb.shape[0] <= ka.shape[0] + L
        ta, tb = _tables(ka, sel.residuals), _tables(kb, sel.residuals)
        diffs = [residual_operator(DOM.shape(A)).matvec((tb[A] - ta[A]).ravel()) for A in sel.residuals]
        loss = sum(float(d @ d) / (2 * s2) for d, s2 in zip(diffs, sel.sigma2))
        loss_row = sum(float(d @ d) / (2 * s2) for d, s2 in zip(diffs, row.selection.sigma2))
        change = math.sqrt(sum(float(d @ d) for d in diffs))
        assert loss <= rho * (1 + 1e-9)
        assert change <= rel.entry.sensitivity * (1 + 1e-9)
        worst, worst_row = max(worst, loss), max(worst_row, loss_row)
    if not unit.grouped:  # unit 0 keeps L rows of one cell: the bound is reached
        assert worst >= 0.99 * rho
    # (a unit's groups are distinct cells of the full domain: some marginal separates them, so the
    # grouped bound is not reached on every marginal at once, but a one-cell marginal can merge them)
    assert worst_row > 2 * rho  # calibrated to one row, the same release would not protect the unit


@pytest.mark.parametrize("unit", UNITS[:2], ids=str)
def test_removing_any_unit_costs_at_most_epsilon_per_unit_laplace(unit):
    """Weighted marginals: the pure-DP loss sum_S ||t_S - t'_S||_1 / b_S for one whole unit is within
    the charged epsilon, and reached by the worst unit."""
    X, ids = _table(7)
    eps = 1.0
    with np.errstate(all="ignore"):
        strategy = optimize_marginals_laplace(DOM, WORK, eps, restarts=1, rng=0)
    rel = release_marginals_laplace(pd.DataFrame(X, columns=DOM.names).assign(u=ids), strategy, rng=3,
                                    privacy_unit=unit)
    eps_row = unit.row_budget("laplace", eps)
    assert rel.cost.epsilon == eps and rel.loss <= eps and rel.entry.privacy_unit is not None
    worst = 0.0
    for (Xa, ia), (Xb, ib) in _neighbours(X, ids):
        ka, kb = _kept(Xa, ia, unit, 3), _kept(Xb, ib, unit, 3)
        ta, tb = _tables(ka, strategy.measured), _tables(kb, strategy.measured)
        loss = sum(float(np.abs(tb[S] - ta[S]).sum()) * th * eps_row for S, th in zip(strategy.measured,
                                                                                          strategy.weights))
        assert loss <= eps * (1 + 1e-9)
        worst = max(worst, loss)
    if not unit.grouped:  # any unit keeping L rows reaches the charge
        assert worst >= 0.99 * eps


def test_auto_spends_its_share_first_and_the_ledger_adds_up():
    rng = np.random.default_rng(2)
    n = 4000
    df = pd.DataFrame({"a": rng.integers(0, 3, n), "b": rng.integers(0, 2, n), "c": rng.integers(0, 4, n),
                       "CustomerID": rng.integers(0, 400, n)})
    acc = Accountant(rho=1.0)
    rel = release_marginals(df, DOM, WORK, 1.0, accountant=acc, rng=1,
                            privacy_unit=PrivacyUnit("CustomerID", max_rows="auto"))
    assert not rel.privacy_unit.is_auto and rel.bound_choice is not None
    assert [e.label for e in acc.ledger][0].startswith("privacy unit: bound")
    assert acc.spent == pytest.approx(1.0) and acc.remaining >= 0
    res = rel.to_release()
    assert res.ledger[0]["label"].startswith("privacy unit: bound") and len(res.ledger) == 2
    assert res.description["rho"] == pytest.approx(1.0)
    assert res.description["privacy_unit_bound"]["max_rows"] == rel.privacy_unit.max_rows
    assert res.description["privacy_unit"]["privacy_unit"] == "CustomerID"


def test_a_release_without_a_unit_says_one_row_and_warns_of_an_id_column():
    X, ids = _table(0)
    df = pd.DataFrame(X, columns=DOM.names).assign(user_id=ids)
    with pytest.warns(IdColumnWarning, match="user_id"):
        rel = release_marginals(df, DOM, WORK, 1.0, rng=0)
    assert rel.to_release().description["privacy_unit"] == {"privacy_unit": "one row"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdColumnWarning)
        release_marginals(df, DOM, WORK, 1.0, rng=0, privacy_unit=PrivacyUnit("user_id", max_rows=2))


@pytest.mark.parametrize("case", ["no column", "short ids", "missing ids", "drop without unit", "not a unit",
                                  "counts", "auto over budget", "auto tiny budget", "bad ids and auto"])
def test_bad_declarations_are_refused_before_any_charge(case):
    X, ids = _table(1)
    df = pd.DataFrame(X, columns=DOM.names).assign(u=ids.astype(object))
    unit, rho, acc = PrivacyUnit("u", max_rows=2), 1.0, Accountant(rho=1.0)
    kw: dict = {"privacy_unit": unit}
    data: object = df
    if case == "no column":
        kw["privacy_unit"] = PrivacyUnit("v", max_rows=2)
    elif case == "short ids":
        data, kw["unit_ids"] = X, ids[:-1]
    elif case in ("missing ids", "bad ids and auto"):
        df.loc[3, "u"] = None
        if case == "bad ids and auto":
            kw["privacy_unit"] = PrivacyUnit("u", max_rows="auto")
    elif case == "drop without unit":
        data, kw = X, {"drop_missing_units": True}
    elif case == "not a unit":
        kw["privacy_unit"] = "u"
    elif case == "counts":
        data, kw["counts"] = None, np.ones(math.prod(DOM.sizes))
    elif case == "auto over budget":
        acc.spend(PrivacyCost(rho=0.5), label="earlier")
        kw["privacy_unit"] = PrivacyUnit("u", max_rows="auto")
    elif case == "auto tiny budget":
        rho, acc = 1e-11, Accountant(rho=1e-11)
        kw["privacy_unit"] = PrivacyUnit("u", max_rows="auto")
    spent = acc.spent
    with pytest.raises(SparseDPError):
        release_marginals(data, DOM, WORK, rho, accountant=acc, rng=0, **kw)
    assert acc.spent == spent and len(acc.ledger) == (1 if case == "auto over budget" else 0)


def test_a_secure_generator_draws_the_priorities_the_bound_and_the_noise():
    from sparsedp.noise import SecureRandomBits

    X, ids = _table(2)
    rel = release_marginals(pd.DataFrame(X, columns=DOM.names).assign(u=ids), DOM, WORK, 1.0,
                            rng=SecureRandomBits(), privacy_unit=PrivacyUnit("u", max_rows=2))
    assert rel.private and rel.entry.privacy_unit == "u (max_rows 2)"


def test_missing_ids_dropped_when_asked():
    X, ids = _table(1)
    df = pd.DataFrame(X, columns=DOM.names).assign(u=ids.astype(object))
    df.loc[3, "u"] = None
    rel = release_marginals(df, DOM, WORK, 1.0, rng=0, privacy_unit=PrivacyUnit("u", max_rows=2),
                            drop_missing_units=True)
    assert rel.entry.privacy_unit == "u (max_rows 2)"


def _cli(*args: str) -> SimpleNamespace:
    """``sparsedp ARGS`` in process: its exit code and what it wrote on stderr."""
    from sparsedp.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the bound's choice: unreliable with few units
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
    return SimpleNamespace(returncode=code, stderr=err.getvalue())


def test_cli_with_a_unit_records_it_and_publishes_nothing_about_truncation(tmp_path):
    X, ids = _table(3, rows=200, units=20)
    df = pd.DataFrame(X, columns=DOM.names).assign(CustomerID=ids)
    df.to_csv(tmp_path / "t.csv", index=False)
    base = ["marginals", str(tmp_path / "t.csv"), "--columns", "a,b,c", "--sizes", "3,2,4", "--rho", "1",
            "--seed", "0"]
    plain = _cli(*base, "--out", str(tmp_path / "plain.json"))
    assert plain.returncode == 0 and "warning: column 'CustomerID' looks like an identifier" in plain.stderr
    r = _cli(*base, "--privacy-unit", "CustomerID", "--max-rows", "4", "--out", str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stderr
    assert "identifier" not in r.stderr
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["privacy_unit"] == {"privacy_unit": "CustomerID", "max_rows": 4}
    assert meta["ledger"][0]["privacy_unit"] == "CustomerID (max_rows 4)"
    assert "CustomerID" in meta["privacy"]["neighbours"]
    text = json.dumps(meta)
    assert "dropped" not in text and "kept" not in text and "max_contribution" not in text
    # the library at the same seed gives the same release
    lib = release_marginals(X, DOM, [("a", "b"), ("a", "c"), ("b", "c")], 1.0, rng=0, unit_ids=ids.astype(str),
                            privacy_unit=PrivacyUnit("CustomerID", max_rows=4))
    got = load_release(tmp_path / "m.json")
    np.testing.assert_allclose(got.answers, lib.to_release().answers)
    assert got.description["privacy_unit"]["max_rows"] == 4
    bad = _cli(*base, "--max-rows", "4", "--out", str(tmp_path / "x.json"))
    assert bad.returncode != 0 and not (tmp_path / "x.json").exists()


def test_spec_with_a_unit(tmp_path):
    X, ids = _table(4, rows=200, units=20)
    pd.DataFrame(X, columns=DOM.names).assign(CustomerID=ids).to_csv(tmp_path / "t.csv", index=False)
    spec = ('[data]\npath = "t.csv"\ncolumns = ["a", "b", "c"]\nsizes = [3, 2, 4]\n'
            '[workload]\nmarginals = [["c"], ["a", "b"]]\n'
            '[privacy]\nrho = 1.0\nunit = "CustomerID"\nmax_rows = "auto"\n'
            '[consistency]\nnonnegative = true\n[output]\nrelease = "m.npz"\n')
    (tmp_path / "s.toml").write_text(spec)
    from sparsedp.spec import run_spec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bound's choice is unreliable with 20 units
        res = run_spec(tmp_path / "s.toml", rng=1)
    rel = load_release(tmp_path / "m.npz")
    assert rel.description["privacy_unit"]["privacy_unit"] == "CustomerID"
    assert rel.description["privacy_unit_bound"]["spent"] == {"rho": pytest.approx(0.1)}
    assert [e["label"] for e in rel.ledger][0].startswith("privacy unit: bound")
    assert res.accountant.spent == pytest.approx(1.0)
    assert list(dict.fromkeys(rel.labels["marginal"].tolist())) == ["c", "a,b"]
    assert np.all(rel.answers >= 0)
    (tmp_path / "s.toml").write_text(spec.replace('max_rows = "auto"', 'max_rows = "many"'))
    with pytest.raises(SparseDPError, match="max_rows"):
        run_spec(tmp_path / "s.toml", rng=1)


# -- answers in the order of the workload passed ------------------------------------------------------

def _truth(X: np.ndarray, dom: Domain, work) -> np.ndarray:
    """What a user compares with: each marginal's counts in the order they named its attributes."""
    out = []
    for m in work:
        t = np.zeros([dom.sizes[dom.names.index(a)] for a in m])
        np.add.at(t, tuple(X[:, dom.names.index(a)] for a in m), 1.0)
        out.append(t.ravel())
    return np.concatenate(out)


def test_answers_come_in_the_order_of_the_workload_passed():
    """A new user passes marginals in their own order (and attributes within them) and compares
    with the truth in that order: the error is the noise's, not a reshuffle's (was RMSE ~477 here:
    marginals grouped by shape, attributes in the domain's order)."""
    rng = np.random.default_rng(1)
    dom = Domain(["age", "sex", "region"], [4, 4, 4])
    X = rng.integers(0, 4, (5000, 3))
    X[:, 1] = np.minimum(X[:, 0], rng.integers(0, 4, 5000))
    work = [("sex", "age"), ("region",), ("age", "region")]
    rel = release_marginals(X, dom, work, 1.0, rng=0)
    res = rel.to_release()
    rmse = float(np.sqrt(np.mean((res.answers - _truth(X, dom, work)) ** 2)))
    assert rmse < 3 * math.sqrt(float(np.mean(res.variances)))
    assert list(dict.fromkeys(res.labels["marginal"].tolist())) == ["sex,age", "region", "age,region"]
    assert list(rel.marginals) == [("age", "sex"), ("region",), ("age", "region")]  # keyed in the domain's order
    np.testing.assert_array_equal(rel.marginal(["sex", "age"]), rel.marginals[("age", "sex")].T)  # as named
    np.testing.assert_array_equal(rel.marginal(("age", "sex")), rel.marginals[("age", "sex")])
    df = res.to_pandas()
    first = df[df.marginal == "sex,age"].iloc[1]  # C order over (sex, age): sex 0, age 1
    assert (first["sex"], first["age"], first["region"]) == (0, 1, -1)
    nn = nonnegative_marginals(rel).to_release()
    assert nn.labels["marginal"].tolist() == res.labels["marginal"].tolist()
    assert float(np.sqrt(np.mean((nn.answers - _truth(X, dom, work)) ** 2))) < 3 * math.sqrt(
        float(np.mean(res.variances)))
    with np.errstate(all="ignore"):
        strategy = optimize_marginals_laplace(dom, work, 1.0, restarts=1, rng=0)
    lap = release_marginals_laplace(X, strategy, rng=0).to_release()
    assert float(np.sqrt(np.mean((lap.answers - _truth(X, dom, work)) ** 2))) < 3 * math.sqrt(
        float(np.mean(lap.variances)))


def test_nonnegative_marginals_are_a_release(tmp_path):
    rng = np.random.default_rng(5)
    X = rng.integers(0, [3, 2, 4], (40, 3))
    rel = release_marginals(X, DOM, WORK, 0.05, rng=2)
    nn = nonnegative_marginals(rel)
    res = nn.to_release()
    assert np.all(res.answers >= 0) and res.variance_method == "gls-before-consistency"
    assert res.description["nonnegative"] is True and list(res.ledger) == list(rel.to_release().ledger)
    path = nn.save(tmp_path / "nn.npz")
    back = load_release(path)
    np.testing.assert_allclose(back.answers, res.answers)
    assert back.labels["marginal"].tolist() == res.labels["marginal"].tolist()
    lo, hi = nn.confidence_intervals(0.9)
    assert lo.shape == res.answers.shape and np.all(lo <= hi)


def test_cli_reads_the_same_ids_from_csv_and_parquet_and_drops_missing_ones_when_asked(tmp_path):
    pytest.importorskip("pyarrow")
    X, ids = _table(6, rows=120, units=15)
    df = pd.DataFrame(X, columns=DOM.names).assign(CustomerID=ids.astype(float))
    df.loc[5, "CustomerID"] = np.nan  # a Parquet float column with a gap: 7.0 reads as "7", as in the CSV
    df.to_parquet(tmp_path / "t.parquet")
    df.to_csv(tmp_path / "t.csv", index=False)
    got = []
    for name in ("t.parquet", "t.csv"):
        base = ["marginals", str(tmp_path / name), "--columns", "a,b,c", "--sizes", "3,2,4", "--rho", "1", "--seed",
                "3", "--privacy-unit", "CustomerID", "--max-rows", "3", "--out", str(tmp_path / f"{name}.json")]
        refused = _cli(*base)
        assert refused.returncode == 2 and "no value" in refused.stderr
        assert not (tmp_path / f"{name}.json").exists()
        assert _cli(*base, "--drop-missing-units").returncode == 0
        got.append(json.loads((tmp_path / f"{name}.json").read_text())["marginals"])
    assert got[0] == got[1]
