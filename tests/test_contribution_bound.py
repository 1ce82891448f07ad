"""Choosing max_rows privately (sparsedp.contribution_bound)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsedp.contribution_bound import candidate_bounds, choose_max_rows, resolve_unit
from sparsedp.errors import SparseDPError
from sparsedp.privacy import Accountant
from sparsedp.privacy_unit import PrivacyUnit


def _ids(rng: np.random.Generator, units: int = 3000) -> np.ndarray:
    per = rng.geometric(1 / 40, units)  # mean 40 rows per unit, a long tail
    return np.repeat(np.arange(units), per), per


def test_candidates_are_a_public_geometric_grid() -> None:
    g = candidate_bounds(1000)
    assert g[0] == 1 and g[-1] == 1000 and np.all(np.diff(g) > 0)
    assert np.all(g[1:] / g[:-1] <= 2.0)


def test_the_private_quantile_lands_near_the_true_one() -> None:
    rng = np.random.default_rng(0)
    ids, per = _ids(rng)
    true_q = np.quantile(per, 0.95)
    acct = Accountant(epsilon=1.0)
    choice = choose_max_rows(ids, quantile=0.95, epsilon=0.5, accountant=acct, rng=1)
    assert acct.spent == 0.5 and acct.ledger[-1].label.startswith("privacy unit")
    # the grid has 4 steps per octave: within two steps of the true quantile at this budget
    assert true_q / 2**0.5 <= choice.bound <= true_q * 2**0.5
    kept = choice.rows_kept([choice.bound, 10**6])
    assert kept[0] < kept[1]
    assert choice.describe()["max_rows"] == choice.bound


def test_a_unit_level_change_moves_one_bucket_by_one() -> None:
    """The bucket histogram is the measured vector: removing one unit changes exactly one entry by
    one, whatever its size (sensitivity 1, as charged)."""
    rng = np.random.default_rng(2)
    ids, _ = _ids(rng, 200)
    for u in (0, 7, 199):
        a = choose_max_rows(ids, epsilon=1.0, rng=5)
        b = choose_max_rows(ids[ids != u], epsilon=1.0, rng=5)
        d = a.measurement.y - b.measurement.y
        assert np.abs(d).sum() == 1.0
        assert a.measurement.sensitivity == 1.0


def test_auto_spends_its_share_and_leaves_the_rest_exactly() -> None:
    rng = np.random.default_rng(3)
    ids, _ = _ids(rng, 500)
    acct = Accountant(epsilon=1.0)
    unit, choice, rest = resolve_unit(PrivacyUnit("id", max_rows="auto", auto_share=0.1), ids, epsilon=1.0,
                                      accountant=acct, rng=0)
    assert not unit.is_auto and unit.max_rows == choice.bound
    from sparsedp.privacy import PrivacyCost

    acct.spend(PrivacyCost(epsilon=rest), label="release")  # the whole budget, never more
    with pytest.raises(SparseDPError):
        acct.spend(PrivacyCost(epsilon=1e-9), label="more")
    fixed, none, whole = resolve_unit(PrivacyUnit("id", max_rows=5), ids, epsilon=1.0)
    assert none is None and whole == 1.0 and fixed.max_rows == 5



def test_bad_quantiles_are_refused() -> None:
    for q in ("median", 0.0, 1.0, True):
        with pytest.raises(SparseDPError):
            PrivacyUnit("id", max_rows="auto", auto_quantile=q)


def test_too_few_units_for_the_noise_warns() -> None:
    from sparsedp.contribution_bound import UnreliableBoundWarning

    ids = np.repeat(np.arange(50), 3)
    with pytest.warns(UnreliableBoundWarning, match="unreliable"):
        choose_max_rows(ids, rho=0.1, rng=0)
    import warnings

    rng = np.random.default_rng(0)
    many, _ = _ids(rng, 4000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreliableBoundWarning)
        choose_max_rows(many, epsilon=0.5, rng=0)
