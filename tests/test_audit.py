"""The empirical auditor: valid on a correct release, and powerful enough to catch a release whose
sensitivity was halved (it then costs twice the epsilon it claims)."""

import math

import numpy as np
import pytest

from sparsedp import SparseDPError
from sparsedp import noise as nz
from sparsedp import strategies as st
from sparsedp.audit import audit, clopper_pearson
from sparsedp.measure import plan_measurement


def test_clopper_pearson_covers_the_truth():
    rng = np.random.default_rng(0)
    misses = 0
    for _ in range(400):
        k = int(rng.binomial(200, 0.1))
        lo, hi = clopper_pearson(k, 200, 0.05)
        misses += not (lo <= 0.1 <= hi)
    assert misses <= 40  # exact intervals are conservative: ~5% or fewer
    assert clopper_pearson(0, 10, 0.05)[0] == 0.0 and clopper_pearson(10, 10, 0.05)[1] == 1.0


def test_correct_release_is_not_flagged_and_broken_release_is():
    plan = plan_measurement(st.identity(1), epsilon=1.0)  # exact discrete Laplace, Delta = 1

    def correct(x, g):
        return plan.measure(x, rng=g).y

    def broken(x, g):  # claims epsilon 1 but calibrates for sensitivity 1/2: costs 2
        return np.asarray(x, float) + nz.discrete_laplace(0.5, size=1, rng=g)

    good = audit(correct, [5], [6], trials=4000, rng=1)
    bad = audit(broken, [5], [6], trials=4000, rng=1)
    assert good.epsilon_lower <= 1.0
    assert bad.epsilon_lower > 1.0, bad
    assert math.isclose(bad.p_hat / max(bad.q_hat, 1e-9), math.exp(2), rel_tol=0.6)


def test_bad_arguments():
    with pytest.raises(SparseDPError):
        audit(lambda x, g: x, [1], [2], trials=10)
    with pytest.raises(SparseDPError):
        audit(lambda x, g: [np.nan], [1], [2], trials=400)
