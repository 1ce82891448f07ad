"""Scale-out hierarchical releases (issue 14): chunk subtrees on executors == the whole-tree two-pass."""

import os

import _scaleout_util
import numpy as np
import pytest
from _scaleout_util import histogram, kill_once_reader, spy_measure, whole_tree_measurements

from sparsedp import strategies as st
from sparsedp.errors import BudgetExceededError, FractionalCountError, NegativeCountError, NonFiniteInputError, ShapeError, SparseDPError
from sparsedp.executors import DaskExecutor, ThreadExecutor
from sparsedp.measure import MeasurementPlan
from sparsedp.privacy import Accountant
from sparsedp.scaleout import ChunkedTree, ChunkSpec, chunk_seeds, level_budgets, release_hierarchical
from sparsedp.scaleout.subtree import chunk_plan
from sparsedp.tree_estimator import tree_gls, two_pass
from sparsedp.trees import Boost
from sparsedp.trees.blue import blue


CASES = [  # n, k, chunk
    (4096, 4, 256),
    (4096 + 100, 4, 256),  # a short last chunk
    (1000, 2, 64),
    (16**3, 16, 16),
    (729, 3, 27),
    (500, 5, 125),
    (90, 3, 1),  # every leaf a chunk
    (256, 2, 256),  # one chunk: no top tree
]


@pytest.mark.parametrize("n,k,chunk", CASES)
def test_equals_whole_tree_two_pass(n, k, chunk):
    x = histogram(n)
    r = release_hierarchical(x, 1.0, k=k, chunk=chunk, rng=11)
    G, y, v, _ = whole_tree_measurements(x, 1.0, k, chunk, 11)
    parent, level_start = G.bfs()
    whole = two_pass(parent, level_start, y, v)
    leaves = G.level_rows(whole, 0)
    np.testing.assert_allclose(r.estimate, leaves, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(r.estimate, tree_gls(G, y, v), rtol=1e-9, atol=1e-9)  # the MatrixMechanism path
    np.testing.assert_allclose(r.top_values[0], whole[0], rtol=1e-9)  # the root
    assert r.estimate.sum() == pytest.approx(whole[0], rel=1e-9)
    assert r.loss <= 1.0 and not r.private and r.secure


def test_same_tree_scales_and_blue_as_boost():
    n, k = 4**6, 4
    x = histogram(n, 3)
    r = release_hierarchical(x, 0.7, k=k, chunk=64, rng=5)
    G, y, v, scales = whole_tree_measurements(x, 0.7, k, 64, 5)
    pub = Boost(0.7, k=k)
    plan = pub._prepare(x.astype(np.float64))
    per_row = np.repeat(np.arange(G.levels), [G.sizes[lev] for lev in reversed(range(G.levels))])
    np.testing.assert_array_equal(plan.measurement.scales, r.level_scales[per_row])  # the same noise per node
    assert np.all(r.level_scales >= scales)  # the path only rounds up
    lo, hi = G.intervals()
    np.testing.assert_array_equal(plan.tree.lo, lo)
    np.testing.assert_array_equal(plan.tree.hi, hi)
    H = st.hierarchical(n, k)  # MatrixMechanism's strategy: the same node intervals
    np.testing.assert_array_equal(H.lo, lo)
    np.testing.assert_allclose(r.estimate, blue(plan.tree, y, variances=v)[plan.tree.leaves], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(r.level_variances, plan.measurement.variances()[list(G.row_offsets[::-1])], rtol=0)


def test_level_weights_per_level_budgets():
    n, k, c = 2000, 3, 81
    x = histogram(n, 4)
    w = np.arange(1, ChunkedTree(n, k, c).levels + 1, dtype=float)
    r = release_hierarchical(x, 2.0, k=k, chunk=c, rng=2, level_weights=w)
    G, y, v, scales = whole_tree_measurements(x, 2.0, k, c, 2, level_weights=w)
    assert np.unique(r.level_scales).size == r.levels
    assert float(np.sum(1.0 / r.level_scales)) <= 2.0
    np.testing.assert_allclose(r.estimate, tree_gls(G, y, v), rtol=1e-9, atol=1e-9)


def test_unaligned_chunks_refused_or_rechunked():
    da = pytest.importorskip("dask.array")
    x = histogram(1000)
    d = da.from_array(x, chunks=100)
    with pytest.raises(SparseDPError, match="not subtrees"):
        release_hierarchical(d, 1.0, k=4, rng=1)
    with pytest.raises(SparseDPError, match="power of k"):
        release_hierarchical(x, 1.0, k=4, chunk=100, rng=1)
    with pytest.raises(SparseDPError, match="power of k"):
        release_hierarchical(x, 1.0, k=4, chunk=4096, rng=1)  # larger than n
    r = release_hierarchical(d, 1.0, k=4, chunk=64, rng=1)  # an explicit chunk rechunks
    np.testing.assert_array_equal(r.estimate, release_hierarchical(x, 1.0, k=4, chunk=64, rng=1).estimate)
    aligned = release_hierarchical(da.from_array(x, chunks=256), 1.0, k=4, rng=1)  # aligned blocks are kept
    assert aligned.chunk == 256


def test_budget_charged_once_and_refused_before_noise(monkeypatch):
    calls = spy_measure(monkeypatch)
    acc = Accountant(epsilon=1.5)
    x = histogram(1100)
    r = release_hierarchical(x, 1.0, k=2, chunk=128, rng=4, accountant=acc)
    assert acc.spent == 1.0 and len(acc.ledger) == 1
    entry = acc.ledger[0]
    assert entry is r.ledger and entry.rows == ChunkedTree(1100, 2, 128).nodes() and entry.columns == 1100
    assert entry.sensitivity == r.levels and entry.private is False
    assert len(calls) == r.chunks + 1 and all(a is None for a in calls)  # chunks + top, none charges again
    calls.clear()
    with pytest.raises(BudgetExceededError):
        release_hierarchical(x, 1.0, k=2, chunk=128, rng=4, accountant=acc)
    assert calls == [] and acc.spent == 1.0 and len(acc.ledger) == 1


@pytest.mark.parametrize("bad,err", [
    (np.array([1.0, np.nan] + [1.0] * 62), NonFiniteInputError),
    (np.array([1, -1] + [1] * 62), NegativeCountError),
    (np.array([1.5] + [1.0] * 63), FractionalCountError),
    (np.ones((8, 8)), ShapeError),
    (np.array([2**49, 2**49, 2**49] + [0] * 61), SparseDPError),  # total above 2^50
])
def test_bad_input_refused_before_charge_and_noise(monkeypatch, bad, err):
    calls = []
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **kw: calls.append(1))
    acc = Accountant(epsilon=5.0)
    with pytest.raises(err):
        release_hierarchical(bad, 1.0, k=2, chunk=8, rng=1, accountant=acc)
    assert calls == [] and acc.spent == 0 and acc.ledger == ()


def test_parameters_checked():
    x = histogram(64)
    for kw in ({"k": 1}, {"k": 2.5}, {"secure": 1}, {"rng": -1}, {"rng": "seed"}, {"level_weights": [1, 2]}):
        with pytest.raises(SparseDPError):
            release_hierarchical(x, 1.0, **{"k": 2, "chunk": 8, **kw})
    with pytest.raises(SparseDPError):
        release_hierarchical(x, 0.0, k=2, chunk=8)


def test_os_entropy_default_is_private_and_consistent():
    x = histogram(2000)
    acc = Accountant(epsilon=1.0)
    r = release_hierarchical(x, 1.0, k=4, chunk=64, accountant=acc)
    assert r.private and r.secure and acc.ledger[0].private is True
    r2 = release_hierarchical(x, 1e-3 * 999, k=4, chunk=64)
    assert not np.array_equal(r.estimate, r2.estimate)  # fresh noise
    # consistent: every chunk's leaves sum to its root's final value
    m = r.chunks
    sums = np.add.reduceat(r.estimate, np.arange(0, 2000, 64))
    np.testing.assert_allclose(sums, r.top_values[-m:], rtol=1e-9, atol=1e-6)


def test_seeds_spawned_independently():
    a = chunk_seeds(5, 4)
    b = chunk_seeds(np.random.SeedSequence(5), 4)
    assert [s.entropy for s in a] == [s.entropy for s in b] and len({tuple(s.spawn_key) for s in a}) == 4
    assert chunk_seeds(None, 3) == [None, None, None]


# -- a real LocalCluster (worker processes): the same answer, and the same answer when a worker dies


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("dask.distributed")
    ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GB")
    yield ex
    ex.close()


def test_executors_agree_and_write_npy(cluster, tmp_path):
    n = 3000
    x = histogram(n, 8)
    path = tmp_path / "x.npy"
    np.save(path, x)
    base = release_hierarchical(x, 1.0, k=4, chunk=256, rng=3)
    threads = ThreadExecutor(2)
    try:
        for ex in (threads, cluster):
            r = release_hierarchical(str(path), 1.0, k=4, chunk=256, rng=3, executor=ex, out=tmp_path / f"{ex.name}.npy")
            assert r.estimate is None and r.executor == ex.name
            np.testing.assert_array_equal(r.load(), base.estimate)
    finally:
        threads.close()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("sparsedp-scaleout-")]  # scratch removed


def test_local_cluster_survives_a_killed_worker(cluster, tmp_path):
    import cloudpickle
    import dask.array as da

    n, k, c = 5000, 4, 256
    x = histogram(n, 9)
    path = tmp_path / "x.npy"
    np.save(path, x)
    base = release_hierarchical(x, 1.0, k=k, chunk=c, rng=21)
    cloudpickle.register_pickle_by_value(_scaleout_util)  # the killer reader travels by value
    m = ChunkedTree(n, k, c).chunks
    marker = str(tmp_path / "marker")
    d = da.map_blocks(kill_once_reader, str(path), marker, m + 3, chunks=(ChunkedTree(n, k, c).lengths(),),
                      dtype=x.dtype, meta=np.empty(0, x.dtype))
    acc = Accountant(epsilon=1.0)
    killed = release_hierarchical(d, 1.0, k=k, rng=21, executor=cluster, accountant=acc)
    assert os.path.exists(os.path.join(marker, "killed"))  # a worker did die mid-measurement
    np.testing.assert_array_equal(killed.estimate, base.estimate)  # its task ran again: the same noise
    assert acc.spent == 1.0 and len(acc.ledger) == 1


def test_cli_histogram_executor(tmp_path, capsys):
    import json

    from sparsedp.cli import main

    x = histogram(3000, 6)
    data = tmp_path / "x.npy"
    np.save(data, x)
    out = tmp_path / "out.npy"
    args = ["histogram", str(data), "--epsilon", "1", "--executor", "inprocess", "--k", "4", "--chunk", "256"]
    assert main(args + ["--seed", "3", "--out", str(out)]) == 0
    assert "NOT private" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(out), release_hierarchical(x, 1.0, k=4, chunk=256, rng=3).estimate)
    meta = json.loads((tmp_path / "out.npy.release.json").read_text())
    assert meta["private"] is False and meta["ledger"][0]["epsilon"] == 1.0 and meta["chunks"] == 12
    assert main(args + ["--out", str(tmp_path / "o.npz")]) == 2  # not .npy / .zarr
    assert main(["histogram", str(data), "--epsilon", "1", "--method", "dwork", "--chunk", "256", "--out",
                 str(tmp_path / "o.npz")]) == 2  # --chunk: the chunked methods only
    assert main(args[:-2] + ["--chunk", "100", "--out", str(out)]) == 2
    assert main(args + ["--method", "privelet", "--out", str(out)]) == 2
    assert main(args + ["--scheduler", "tcp://127.0.0.1:1", "--out", str(out)]) == 2  # needs --executor dask
    assert "error" in capsys.readouterr().err


def test_zarr_and_npy_dask_arrays_in_and_out(tmp_path):
    zarr = pytest.importorskip("zarr")
    from sparsedp.scaleout import open_array

    x = histogram(5000, 12)
    z = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=x.shape, chunks=(256,), dtype="i8")
    z[:] = x
    np.save(tmp_path / "x.npy", x)
    base = release_hierarchical(x, 1.0, k=4, chunk=256, rng=1)
    r = release_hierarchical(str(tmp_path / "x.zarr"), 1.0, k=4, rng=1, out=tmp_path / "o.zarr")  # its own chunks
    assert r.chunk == 256
    np.testing.assert_array_equal(r.load(), base.estimate)
    for d in (open_array(tmp_path / "x.zarr", 256), open_array(tmp_path / "x.npy", 256)):
        np.testing.assert_array_equal(release_hierarchical(d, 1.0, k=4, rng=1).estimate, base.estimate)
    bad = zarr.open_array(str(tmp_path / "b.zarr"), mode="w", shape=x.shape, chunks=(300,), dtype="i8")
    bad[:] = x
    with pytest.raises(SparseDPError, match="not subtrees"):
        release_hierarchical(str(tmp_path / "b.zarr"), 1.0, k=4, rng=1)


def test_a_rerun_attempt_is_bound_to_its_own_noise(tmp_path):
    """Two attempts at one chunk with OS entropy draw different noise into different files; the
    downward pass uses exactly the file of the summary the driver kept, never the other."""
    from sparsedp.scaleout.chunked import as_input, as_output
    from sparsedp.scaleout.passes import downward, upward
    from sparsedp.scaleout.subtree import measure_chunk, release_chunk

    x = histogram(1024, 2)
    tree = ChunkedTree(1024, 4, 256)
    scales = tree.node_scales(level_budgets(tree.levels, 1.0))
    spec = ChunkSpec(4, tree.chunk_levels, tuple(float(s) for s in scales[tree.top_levels:]), True)
    reader = as_input(x, 256).block(1)
    first = measure_chunk(spec, reader, 1, None, str(tmp_path))
    second = measure_chunk(spec, reader, 1, None, str(tmp_path))  # the rerun: fresh exact noise
    assert first.path != second.path and first.total == second.total == int(x[256:512].sum())
    y1, y2 = np.load(first.path), np.load(second.path)
    assert not np.array_equal(y1, y2)
    cp = chunk_plan(spec, 256)
    for s, y in ((first, y1), (second, y2)):
        assert (s.z, s.var) == upward(cp.plans, cp.level_start, y, cp.variances).root
        total, leaves, _ = release_chunk(spec, s, 1000.0, as_output(None, 1024, 256).block(1))
        want = downward(cp.plans, upward(cp.plans, cp.level_start, y, cp.variances), 1000.0)[-256:]
        np.testing.assert_array_equal(leaves, want)
        assert total == pytest.approx(1000.0)


@pytest.mark.parametrize("n,k", [(4**6, 4), (3**6, 3), (1000, 2), (12345, 7)])
def test_level_coverage_is_the_per_level_sum_of_coverage_probabilities(n, k):
    from sparsedp.scaleout import level_coverage

    G = st.TreeLayout.balanced(n, k)  # eq. 3.5 on the layout's own intervals (any n)
    lo, hi = G.intervals()
    parent, level_start = G.bfs()
    N = (lo + 1.0) * (n - hi + 1.0)
    p = (N - np.concatenate(([0.0], N[parent[1:]]))) / (n * (n + 1) / 2)
    np.testing.assert_allclose(level_coverage(n, k), np.add.reduceat(p, level_start[:-1]), rtol=1e-12)


def test_boost_un_budgets_match_the_publisher():
    from sparsedp.trees import BoostUN, coverage_probabilities, kary_layout

    n, k = 4**6, 4
    x = histogram(n, 5)
    t = kary_layout(n, k)
    p = coverage_probabilities(t)
    from sparsedp.scaleout import level_coverage

    np.testing.assert_allclose(level_coverage(n, k), np.add.reduceat(p, t.level_start[:-1]), rtol=1e-12)
    r = release_hierarchical(x, 0.8, k=k, chunk=256, rng=1, level_weights="boost-un")
    plan = BoostUN(0.8, k=k)._prepare(x.astype(float))
    np.testing.assert_allclose(r.level_budgets, plan.eps_per_node[t.level_start[:-1]], rtol=1e-12)
    assert np.unique(r.level_budgets).size > 1 and float(np.sum(r.level_budgets)) <= 0.8
    G, y, v, _ = whole_tree_measurements(x, 0.8, k, 256, 1, level_weights=np.cbrt(level_coverage(n, k)))
    np.testing.assert_allclose(r.estimate, tree_gls(G, y, v), rtol=1e-9, atol=1e-9)
    with pytest.raises(SparseDPError):
        release_hierarchical(x, 0.8, k=k, chunk=256, level_weights="lue")


def test_certified_loss_is_the_brute_force_sensitivity_of_the_whole_tree():
    """The loss the release certifies (top plan + chunk plan) against ``max_j sum_i |A_ij| / b_i``
    of the explicit whole-tree matrix with the scales every row was measured with, and against the
    largest change of the scaled node counts over all neighbouring histograms (one leaf +- 1)."""
    from sparsedp.calibration import laplace_loss

    for n, k, c, w in ((100, 3, 9, None), (64, 2, 8, "boost-un"), (50, 4, 16, [1.0, 2.0, 3.0, 4.0])):
        x = histogram(n, 1)
        r = release_hierarchical(x, 1.0, k=k, chunk=c, rng=0, level_weights=w)
        G = st.TreeLayout.balanced(n, k)
        A = G.matrix().toarray()
        b = r.level_scales[np.repeat(np.arange(G.levels), [G.sizes[lev] for lev in reversed(range(G.levels))])]
        exact = max(np.abs((A @ (x + e) - A @ x) / b).sum() for e in np.eye(n, dtype=int))  # every neighbour
        assert exact == pytest.approx((np.abs(A) / b[:, None]).sum(axis=0).max(), rel=1e-12)
        assert exact <= r.loss <= 1.0 and r.loss == pytest.approx(exact, rel=1e-9)
        assert laplace_loss(G.matrix(), b) == pytest.approx(r.loss, rel=1e-9)


def test_node_noise_has_the_reported_variance():
    n, k, c = 64, 4, 16
    x = histogram(n, 3)
    G = st.TreeLayout.balanced(n, k)
    truth = G.matrix() @ x
    errs = np.array([whole_tree_measurements(x, 2.0, k, c, seed)[1] - truth for seed in range(120)])
    r = release_hierarchical(x, 2.0, k=k, chunk=c, rng=0)
    assert np.all(r.level_variances == r.level_variances[0])  # uniform budget: one variance
    sample = errs.ravel()
    assert np.all(sample == np.round(sample))  # exact discrete Laplace: integer noise
    se = r.level_variances[0] * np.sqrt(5.0 / sample.size)  # Laplace: Var(s^2) ~ 5 sigma^4 / N
    assert abs(sample.mean()) < 4 * np.sqrt(r.level_variances[0] / sample.size)
    assert abs(sample.var() - r.level_variances[0]) < 4 * se


def test_exact_noise_is_the_default():
    import inspect

    assert inspect.signature(release_hierarchical).parameters["secure"].default is True
    r = release_hierarchical(histogram(256), 1.0, k=4, chunk=64, rng=2, secure=False)
    assert not r.secure and not r.ledger.secure
    np.testing.assert_allclose(r.level_variances, 2 * r.level_scales**2)  # float Laplace: 2 b^2


def test_cli_on_a_running_scheduler(cluster, tmp_path):
    from sparsedp.cli import main

    x = histogram(2000, 13)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npy"
    address = cluster.client.scheduler.address
    assert main(["histogram", str(tmp_path / "x.npy"), "--epsilon", "1", "--executor", "dask", "--scheduler", address,
                 "--k", "4", "--chunk", "256", "--seed", "4", "--out", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out), release_hierarchical(x, 1.0, k=4, chunk=256, rng=4).estimate)
    assert cluster.client.status == "running"  # the CLI closed its own client only


# -- issue 27: one method name = one algorithm, in process and on every executor ---------------------------


def _dense_bin_variances(lo, hi, n, v):
    """The BLUE's per-bin variances by brute force: diag((A^T V^-1 A)^-1), A the node-interval rows."""
    A = np.zeros((len(lo), n))
    for i, (a, b) in enumerate(zip(lo, hi)):
        A[i, a:b] = 1.0
    return np.diag(np.linalg.inv(A.T @ (A / np.asarray(v)[:, None])))


@pytest.mark.parametrize("method", ["boost", "boost-un", "lue"])
def test_cli_in_process_and_executors_publish_the_same_release(cluster, tmp_path, capsys, method):
    """The same command and --seed: the in-process .npz and the --executor inprocess / threads / dask
    arrays hold the same answers, bit for bit (before issue 27 --method boost ran a binary tree in
    process and a 16-ary one with --executor: different trees, different answers)."""
    from sparsedp.cli import main
    from sparsedp.releases import load_release

    x = histogram(1000, 21)  # not a power of k: short last chunks and single-child chains
    np.save(tmp_path / "x.npy", x)
    base = ["histogram", str(tmp_path / "x.npy"), "--epsilon", "1", "--method", method, "--seed", "5",
            "--chunk", "64" if method == "lue" else "256"]  # the default --k: several chunks each
    assert main(base + ["--out", str(tmp_path / "a.npz")]) == 0
    got = {"in process": load_release(tmp_path / "a.npz")}
    address = cluster.client.scheduler.address
    for ex, extra in (("inprocess", []), ("threads", ["--workers", "2"]), ("dask", ["--scheduler", address])):
        assert main(base + ["--executor", ex, *extra, "--out", str(tmp_path / f"{ex}.npy")]) == 0
        got[ex] = load_release(tmp_path / f"{ex}.npy")
    want = got["in process"]
    assert want.description["chunks"] > 1
    for ex, rel in got.items():
        np.testing.assert_array_equal(np.asarray(rel.answers), np.asarray(want.answers), err_msg=ex)
        assert rel.description["method"] == method and rel.description["k"] == want.description["k"]
        assert rel.strategy == want.strategy  # the same words on every path
        assert not rel.private
    words = {"boost": "Boost, Hay et al. 2010", "boost-un": "Boost-UN", "lue": "LUE-DPTree"}[method]
    assert words in want.strategy
    if method != "lue":
        assert want.description["k"] == 16  # one default on both paths
    # the in-process file keeps every bin's exact variance (the executors' files record a bound)
    assert want.variance_method == "exact-tree" and got["threads"].variance_method == "bound"
    assert np.all(np.asarray(want.variances) <= np.asarray(got["threads"].variances) + 1e-12)
    capsys.readouterr()


@pytest.mark.parametrize("n,k,chunk", [(37, 3, 9), (64, 4, 16), (50, 2, 8), (20, 4, 64 // 4)])
def test_exact_bin_variances_of_a_chunked_release(n, k, chunk):
    """release_hierarchical(variances=True): each bin's variance is diag((A^T V^-1 A)^-1) of the whole tree."""
    x = histogram(n, 2)
    for weights in (None, "boost-un"):
        r = release_hierarchical(x, 1.0, k=k, chunk=min(chunk, n), level_weights=weights, rng=1, variances=True)
        layout = st.TreeLayout.balanced(n, k)
        lo, hi = layout.intervals()
        level_of_row = np.repeat(np.arange(layout.levels), [layout.sizes[lv] for lv in reversed(range(layout.levels))])
        want = _dense_bin_variances(lo, hi, n, r.level_variances[level_of_row])
        np.testing.assert_allclose(r.leaf_variances, want, rtol=1e-10)
        rel = r.to_release()
        assert rel.variance_method == "exact-tree"
        np.testing.assert_allclose(np.asarray(rel.variances), want, rtol=1e-10)


def test_exact_bin_variances_of_a_chunked_lue_release_match_the_publisher():
    from sparsedp.scaleout import release_lue
    from sparsedp.trees import LUEDPTree

    x = histogram(700, 4)
    for tree in ("sc", "kary"):
        r = release_lue(x, 1.0, tree=tree, chunk=50, rng=2, variances=True)
        assert r.chunks > 1
        pub = LUEDPTree(1.0, tree=tree).fit(x, rng=2)  # the same tree and budgets: exact per-bin variances
        np.testing.assert_allclose(r.leaf_variances, pub.variances(), rtol=1e-10)


def test_boost_on_a_power_of_k_is_the_publishers_boost():
    """n = k^j: the tree of hierarchical(n, k) is Boost(k)'s and the budgets are uniform, so the
    per-bin variances are the publisher's Boost on the same k (the noise streams differ: per chunk)."""
    x = histogram(4**5, 3)
    r = release_hierarchical(x, 1.0, k=4, chunk=64, rng=1, variances=True)
    np.testing.assert_allclose(r.leaf_variances, Boost(1.0, k=4).fit(x, rng=1).variances(), rtol=1e-12)
    assert r.method == "boost" and "uniform budget" in r.strategy()


def test_variances_need_the_estimate_in_memory(tmp_path):
    with pytest.raises(SparseDPError, match="out=None"):
        release_hierarchical(histogram(100), 1.0, k=4, out=tmp_path / "o.npy", variances=True)
    with pytest.raises(SparseDPError, match="True or False"):
        release_hierarchical(histogram(100), 1.0, k=4, variances="yes")


def test_cli_executor_refuses_a_method_it_does_not_chunk(tmp_path, capsys):
    from sparsedp.cli import main

    np.save(tmp_path / "x.npy", histogram(100))
    for method in ("privelet", "dwork"):
        assert main(["histogram", str(tmp_path / "x.npy"), "--epsilon", "1", "--method", method, "--executor",
                     "threads", "--out", str(tmp_path / "o.npy")]) == 2
        err = capsys.readouterr().err
        assert f"--method {method} runs in this process only" in err and "boost, boost-un, lue" in err


def test_cli_records_in_process_and_on_threads_publish_the_same_release(tmp_path, capsys):
    from sparsedp.cli import main
    from sparsedp.releases import load_release

    ages = np.random.default_rng(3).integers(0, 500, size=3000)
    (tmp_path / "r.csv").write_text("age\n" + "".join(f"{a}\n" for a in ages))
    base = ["histogram", str(tmp_path / "r.csv"), "--column", "age", "--bins", "0", "512", "1", "--epsilon", "1",
            "--method", "boost", "--seed", "2", "--chunk", "256"]
    assert main(base + ["--out", str(tmp_path / "a.npz")]) == 0
    assert main(base + ["--executor", "threads", "--out", str(tmp_path / "b.npy")]) == 0
    a, b = load_release(tmp_path / "a.npz"), load_release(tmp_path / "b.npy")
    np.testing.assert_array_equal(np.asarray(a.answers), np.asarray(b.answers))
    assert a.description["column"] == b.description["column"] == "age"
    capsys.readouterr()
