"""MatrixMechanism with a hierarchical strategy on partitioned data (issue 14) == its in-process GLS."""

import dataclasses

import numpy as np
import pytest
from _scaleout_util import histogram, whole_tree_measurements

from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.errors import BudgetExceededError, SparseDPError
from sparsedp.inference import reconstruct
from sparsedp.intervals import IntervalRows
from sparsedp.mechanism import MatrixMechanism, Release
from sparsedp.privacy import Accountant
from sparsedp.scaleout.matrix import ScaleoutMatrixRelease, hierarchical_branching


def _noisy_rows(x, epsilon, k, chunk, seed):
    """The scale-out release's noisy node counts and their variances, in the row order of
    ``hierarchical(n, k)`` (root first)."""
    _, y, v, _ = whole_tree_measurements(x, epsilon, k, chunk, seed)
    return y, v


@pytest.mark.parametrize("n,k,chunk", [(1000, 4, 64), (729, 3, 27), (500, 16, 16), (256, 2, 256)])
def test_equals_the_in_process_gls_for_the_same_noise(n, k, chunk):
    x = histogram(n, 1)
    W = wl.prefix(n)
    mech = MatrixMechanism(W, st.hierarchical(n, k), epsilon=1.0)
    r = mech.run(x, rng=5, chunk=chunk)
    assert isinstance(r, ScaleoutMatrixRelease) and not r.private
    y, _ = _noisy_rows(x, 1.0, k, chunk, 5)
    inproc = mech.measure(x, rng=0)  # the mechanism's own measurement, with the scale-out noise put in
    rec = reconstruct(dataclasses.replace(inproc, y=y))
    np.testing.assert_allclose(r.x_hat, rec.x, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(r.answers, W.matvec(rec.x), rtol=1e-9, atol=1e-7)
    # the scales: the publishers' rule, within 1e-9 of the mechanism's L / epsilon
    np.testing.assert_allclose(r.scaleout.level_scales, mech.noise_scale(), rtol=1e-9)
    assert np.all(r.scaleout.level_scales >= mech.noise_scale())


def test_partitioned_inputs_out_file_and_ledger(tmp_path):
    n, k = 3000, 4
    x = histogram(n, 2)
    np.save(tmp_path / "x.npy", x)
    acc = Accountant(epsilon=1.5)
    mech = MatrixMechanism(wl.identity(n), st.hierarchical(n, k), epsilon=1.0, accountant=acc)
    base = mech.run(x, rng=3, chunk=256)
    assert acc.spent == 1.0 and len(acc.ledger) == 1 and acc.ledger[0] is base.ledger
    acc2 = Accountant(epsilon=1.0)
    mech2 = MatrixMechanism(wl.identity(n), st.hierarchical(n, k), epsilon=1.0, accountant=acc2)
    r = mech2.run(str(tmp_path / "x.npy"), rng=3, chunk=256, executor="threads", out=tmp_path / "xh.npy")
    assert r.x_hat is None and r.answers is None and r.out.endswith("xh.npy")
    np.testing.assert_array_equal(r.load(), base.x_hat)
    np.testing.assert_array_equal(r.workload_answers(), base.answers)
    assert acc2.spent == 1.0 and len(acc2.ledger) == 1
    with pytest.raises(BudgetExceededError):
        mech2.run(str(tmp_path / "x.npy"), rng=3, chunk=256)
    assert len(acc2.ledger) == 1
    small = MatrixMechanism(wl.identity(8), st.hierarchical(8, 2), epsilon=1.0)
    assert isinstance(small.run(np.ones(8, int), rng=1), Release)  # in memory, no scale-out option: as before


def test_only_exact_hierarchical_strategies_scale_out():
    n = 256
    x = histogram(n, 3)
    assert hierarchical_branching(st.hierarchical(n, 4)) == 4
    assert hierarchical_branching(st.hierarchical(1000, 16)) == 16
    H = st.hierarchical(n, 4)
    lo, hi = H.lo.copy(), H.hi.copy()
    hi[5], lo[6] = hi[5] + 1, lo[6] + 1  # two nodes' boundary moved: not the balanced tree any more
    forged = IntervalRows(n, lo, hi, name="hierarchical(256, k=4)", structure="tree", meta=H.meta)
    assert hierarchical_branching(forged) is None
    assert hierarchical_branching(IntervalRows(n, H.lo, H.hi, weights=np.full(H.lo.size, 2.0))) is None
    for M in (st.identity(n), forged, st.haar(n)):
        with pytest.raises(SparseDPError, match="hierarchical"):
            MatrixMechanism(wl.identity(n), M, epsilon=1.0).run(x, chunk=16)
    gauss = MatrixMechanism(wl.identity(n), st.hierarchical(n, 4), rho=0.5, noise="gaussian")
    with pytest.raises(SparseDPError, match="Laplace"):
        gauss.run(x, chunk=16)
    with pytest.raises(SparseDPError, match="least squares"):
        MatrixMechanism(wl.identity(n), st.hierarchical(n, 4), epsilon=1.0).run(x, chunk=16, method="nnls")
