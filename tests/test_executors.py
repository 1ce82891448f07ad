import pickle

import numpy as np
import pytest

from sparsedp import SparseDPError
from sparsedp.consistency import LinearConstraints, restaurant_constraints, solve
from sparsedp.consistency.blocks import SparseBlock
from sparsedp.executors import DaskExecutor, InProcessExecutor, ThreadExecutor, get_executor


def _square(a, b=0):
    return a * a + b


def test_inprocess_and_threads_map_in_order():
    for ex in (InProcessExecutor(), ThreadExecutor(3)):
        assert ex.map(_square, range(10), range(10)) == [i * i + i for i in range(10)]
        objs = [object(), object()]
        assert ex.scatter(objs) == objs
        ex.close()


def test_get_executor():
    assert get_executor(None).name == "inprocess"
    ex = get_executor("threads")
    assert ex.name == "threads"
    ex.close()
    mine = InProcessExecutor()
    assert get_executor(mine) is mine
    with pytest.raises(SparseDPError):
        get_executor("gpu")
    with pytest.raises(SparseDPError):
        ThreadExecutor(0)


def test_sparse_block_pickles_without_its_factor():
    blk = SparseBlock(np.array([[1.0, 1.0]]), np.array([2.0]), np.array([0, 1]), "f")
    x = np.array([0.0, 0.0])
    blk.project(x, None)
    assert blk._solver is not None
    clone = pickle.loads(pickle.dumps(blk))
    assert clone._solver is None
    np.testing.assert_allclose(clone.project(x, None), [1.0, 1.0])


@pytest.fixture(scope="module")
def dask_executor():
    pytest.importorskip("dask.distributed")
    ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=False)
    yield ex
    ex.close()


def test_executors_agree(dask_executor):
    days = 16
    rng = np.random.default_rng(1)
    n = 5 * (2 * days - 1)
    x = rng.normal(size=n) * 10
    v = rng.uniform(0.5, 2.0, n)
    fams = restaurant_constraints(days, "leaves", chunks=4, per_item=True)
    fams.append(LinearConstraints(np.ones((1, n)), [123.0], name="grand-total"))
    threads = ThreadExecutor(2)
    try:
        for method in ("alternating", "accelerated"):
            # a fixed number of iterations: the iterates themselves must agree, converged or not
            base = solve(x, fams, variances=v, method=method, tol=1e-12, max_sweeps=15)
            for ex in (threads, dask_executor):
                got = solve(x, fams, variances=v, method=method, tol=1e-12, max_sweeps=15, executor=ex)
                assert got.executor == ex.name
                assert got.iterations == base.iterations
                np.testing.assert_allclose(got.x, base.x, atol=1e-12)
    finally:
        threads.close()
    assert dask_executor.map(_square, [1, 2, 3]) == [1, 4, 9]
