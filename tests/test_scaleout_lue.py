"""LUE-DPTree on scale-out (issue 14): chunk subtrees of SC / k-ary trees == the in-process publisher."""

import numpy as np
import pytest
from _scaleout_util import histogram, spy_measure

from sparsedp.errors import BudgetExceededError, NegativeCountError, SparseDPError
from sparsedp.privacy import Accountant
from sparsedp.scaleout import chunk_seeds
from sparsedp.scaleout.lue import TreeShape, chunk_roots, release_lue
from sparsedp.trees import LUEDPTree
from sparsedp.trees.blue import blue
from sparsedp.trees.publishers import MIN_VARIANCE


def _assembled(x, r, seed):
    """Re-draw the release's noise in process from the same per-chunk streams and lay every chunk's
    (and the top's) measurements, variances, budgets and scales out in the whole tree's order."""
    pub = LUEDPTree(r.epsilon, tree=r.tree, k=r.k)
    plan = pub._prepare(x.astype(np.float64))
    t = plan.tree
    index = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(t.lo, t.hi))}
    y, v, e, b = (np.full(t.size, np.nan) for _ in range(4))
    seeds = chunk_seeds(seed, r.chunks + 1)
    shape = r.spec.shape
    for q, root in enumerate(r.roots):
        sub = shape.subtree(root.lo, root.hi)
        idx = np.array([index[(int(a) + root.lo, int(c) + root.lo)] for a, c in zip(sub.lo, sub.hi)])
        cp = r.chunk_plan(q)
        meas = cp.measure(x[root.lo:root.hi], rng=np.random.Generator(np.random.PCG64(seeds[q])))
        y[idx], v[idx], b[idx] = meas.y, np.maximum(cp.variances(), MIN_VARIANCE), cp.scales
        e[idx] = r.chunk_budgets(q)
    inner = r.top.inner
    if inner.size:
        idx = np.array([index[(int(r.top.lo[i]), int(r.top.hi[i]))] for i in inner])
        totals = np.add.reduceat(x, r.bounds[:-1])
        top = r.top_plan.measure(totals, rng=np.random.Generator(np.random.PCG64(seeds[-1])))
        y[idx], v[idx], b[idx] = top.y, np.maximum(r.top_plan.variances(), MIN_VARIANCE), r.top_plan.scales
    assert not np.any(np.isnan(y)) and not np.any(np.isnan(b))  # every node measured exactly once
    return plan, y, v, e, b


CASES = [  # n, tree, k, largest chunk
    (1000, "sc", None, 64),
    (1000, "kary", 3, 50),
    (777, "sc", 3, 40),
    (300, "kary", 2, 300),  # one chunk: no top tree
    (5000, "sc", None, 700),
    (97, "kary", 4, 1),  # every leaf a chunk
]


@pytest.mark.parametrize("n,tree,k,c", CASES)
def test_equals_the_in_process_publisher(n, tree, k, c):
    x = histogram(n, 2)
    r = release_lue(x, 0.9, tree=tree, k=k, chunk=c, rng=11)
    plan, y, v, e, b = _assembled(x, r, 11)
    if inner := r.top.inner.size:
        assert inner + sum(r.chunk_plan(q).rows for q in range(r.chunks)) == plan.tree.size
    np.testing.assert_array_equal(b, plan.measurement.scales)  # the same noise scale on every node
    np.testing.assert_array_equal(v, np.maximum(plan.measurement.variances(), MIN_VARIANCE))
    chunk_e = ~np.isin(np.arange(plan.tree.size), [])
    np.testing.assert_array_equal(e[~np.isnan(e)], plan.eps_per_node[~np.isnan(e)])  # the same budgets
    assert np.isnan(e).sum() == r.top.inner.size and chunk_e.all()
    want = blue(plan.tree, y, variances=v)  # LUEDPTree's estimate for this noise
    np.testing.assert_allclose(r.estimate, want[plan.tree.leaves], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(r.top_values[0], want[0], rtol=1e-9)
    assert (r.nodes, r.levels) == (plan.tree.size, plan.tree.levels)
    assert r.loss <= 0.9 and not r.private and r.secure and r.ledger.rows == plan.tree.size


def test_chunks_are_nodes_of_the_tree_and_cutting_blocks_are_refused():
    da = pytest.importorskip("dask.array")
    from sparsedp.trees import sc_layout

    n = 2000
    x = histogram(n, 3)
    t = sc_layout(n)
    shape = TreeShape("sc", n, int(np.diff(t.child_start)[0]), 20)
    top = chunk_roots(shape, 300)
    nodes = set(zip(t.lo.tolist(), t.hi.tolist()))
    bounds = top.bounds()
    assert all((int(a), int(c)) in nodes for a, c in zip(bounds[:-1], bounds[1:]))
    assert np.diff(bounds).max() <= 300 and bounds[0] == 0 and bounds[-1] == n and top.roots.size > 5
    parents = {(int(top.lo[p]), int(top.hi[p])) for p in top.parent[top.roots]}
    assert all(hi - lo > 300 for lo, hi in parents)  # maximal: every chunk root's parent is too large
    base = release_lue(x, 1.0, chunk=300, rng=4)
    # a dask array whose blocks are nodes keeps them
    d = da.from_array(x, chunks=(tuple(np.diff(bounds).tolist()),))
    np.testing.assert_array_equal(release_lue(d, 1.0, rng=4).estimate, base.estimate)
    with pytest.raises(SparseDPError, match="cuts a subtree"):
        release_lue(da.from_array(x, chunks=100), 1.0, rng=4)
    r = release_lue(da.from_array(x, chunks=100), 1.0, chunk=300, rng=4)  # an explicit chunk rechunks
    np.testing.assert_array_equal(r.estimate, base.estimate)


def test_budget_charged_once_and_bad_input_refused_before_noise(monkeypatch):
    calls = spy_measure(monkeypatch)
    acc = Accountant(epsilon=1.5)
    x = histogram(900, 5)
    r = release_lue(x, 1.0, chunk=64, rng=1, accountant=acc)
    assert acc.spent == 1.0 and len(acc.ledger) == 1 and acc.ledger[0] is r.ledger
    assert len(calls) == r.chunks + 1 and all(a is None for a in calls)  # chunks + top, none charges again
    calls.clear()
    with pytest.raises(BudgetExceededError):
        release_lue(x, 1.0, chunk=64, rng=1, accountant=acc)
    bad = x.copy()
    bad[700] = -1
    with pytest.raises(NegativeCountError):
        release_lue(bad, 0.1, chunk=64, rng=1, accountant=acc)
    assert calls == [] and acc.spent == 1.0 and len(acc.ledger) == 1


def test_publisher_release_and_executors(tmp_path):
    from sparsedp.executors import ThreadExecutor

    x = histogram(3000, 6)
    np.save(tmp_path / "x.npy", x)
    base = release_lue(x, 1.0, tree="kary", k=4, chunk=200, rng=3)
    with ThreadExecutor(2) as ex:
        r = LUEDPTree(1.0, tree="kary", k=4).release(str(tmp_path / "x.npy"), executor=ex, chunk=200, rng=3,
                                                     out=tmp_path / "o.npy")
    np.testing.assert_array_equal(r.load(), base.estimate)
    import os

    assert not [p for p in os.listdir(tmp_path) if p.startswith("sparsedp-scaleout-")]  # scratch removed
    for kw in ({"queries": [[0, 3]]}, {"objective": "gls"}, {"whole_domain": 0.5}, {"consistency": False},
               {"eps_per_node": np.ones(3)}):
        with pytest.raises(SparseDPError, match="scale-out"):
            LUEDPTree(1.0, **kw).release(x, chunk=200)
    pytest.importorskip("zarr")
    with pytest.raises(SparseDPError, match="Zarr output"):
        release_lue(x, 1.0, chunk=200, out=tmp_path / "o.zarr")


def test_float_noise_and_os_entropy():
    x = histogram(600, 7)
    r = release_lue(x, 1.0, chunk=50, secure=False)
    assert r.private and not r.secure
    sums = np.add.reduceat(r.estimate, r.bounds[:-1])  # consistent at the chunk roots
    np.testing.assert_allclose(sums, r.top_values[r.top.roots], rtol=1e-9, atol=1e-6)


def test_certified_loss_is_the_brute_force_sensitivity():
    """Per chunk (top rows above it + its plan) against ``max_j sum_i |A_ij| / b_i`` of the explicit
    whole-tree matrix at the scales every node was measured with, and the largest change of the
    scaled node counts over every neighbouring histogram (one leaf +- 1)."""
    for n, tree, k, c in ((60, "sc", None, 8), (50, "kary", 3, 10)):
        x = histogram(n, 1)
        r = release_lue(x, 1.0, tree=tree, k=k, chunk=c, rng=0)
        plan, _, _, _, b = _assembled(x, r, 0)
        A = plan.tree and np.zeros((plan.tree.size, n))
        for i, (lo, hi) in enumerate(zip(plan.tree.lo, plan.tree.hi)):
            A[i, lo:hi] = 1.0
        exact = max(np.abs((A @ (x + e) - A @ x) / b).sum() for e in np.eye(n, dtype=int))
        assert exact == pytest.approx((A / b[:, None]).sum(axis=0).max(), rel=1e-12)
        assert exact <= r.loss <= 1.0 and r.loss == pytest.approx(exact, rel=1e-6)


def test_secure_floor_matches_the_publisher(monkeypatch):
    """The exact sampler's budget floor (2^-39, reached only near epsilon = 1e-9, where a chunk's
    own plan would fall below the path's smallest epsilon) raised to 0.1 in both places, so that it
    is used at epsilon 1: the chunks replay the floor and the normalisation after it as the publisher."""
    from sparsedp.scaleout import lue
    from sparsedp.trees import publishers

    monkeypatch.setattr(publishers, "SECURE_MIN_BUDGET", 0.1)
    monkeypatch.setattr(lue, "SECURE_MIN_BUDGET", 0.1)
    x = histogram(400, 8)
    r = release_lue(x, 1.0, chunk=40, rng=2)
    plan, _, _, e, b = _assembled(x, r, 2)
    assert ("floor", 0.1) in r.spec.ops and np.sum(plan.eps_per_node < 0.101) >= 3  # the floor was used
    np.testing.assert_array_equal(e[~np.isnan(e)], plan.eps_per_node[~np.isnan(e)])
    np.testing.assert_array_equal(b, plan.measurement.scales)


def test_on_a_dask_local_cluster():
    pytest.importorskip("dask.distributed")
    from sparsedp.executors import DaskExecutor

    x = histogram(2500, 9)
    base = release_lue(x, 1.0, chunk=600, rng=6)
    with DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=False) as ex:
        r = release_lue(x, 1.0, chunk=600, rng=6, executor=ex)
    assert r.executor == "dask" and r.chunks == base.chunks
    np.testing.assert_array_equal(r.estimate, base.estimate)


def test_cli_method_lue_executor(tmp_path, capsys):
    import json

    from sparsedp.cli import main

    x = histogram(3000, 6)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npy"
    args = ["histogram", str(tmp_path / "x.npy"), "--epsilon", "1", "--method", "lue", "--executor", "inprocess",
            "--chunk", "400", "--force"]
    assert main(args + ["--seed", "3", "--out", str(out)]) == 0
    assert "NOT private" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(out), release_lue(x, 1.0, chunk=400, rng=3).estimate)
    meta = json.loads((tmp_path / "out.npy.release.json").read_text())
    assert meta["method"] == "lue" and meta["tree"] == "sc" and meta["private"] is False
    assert meta["ledger"][0]["epsilon"] == 1.0 and meta["largest_chunk"] <= 400
    assert main(args + ["--tree", "kary", "--k", "4", "--seed", "3", "--out", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out), release_lue(x, 1.0, tree="kary", k=4, chunk=400, rng=3).estimate)
    assert main(args + ["--column", "c", "--bins", "0", "10", "1", "--out", str(out)]) == 2
    assert main(args + ["--out", str(tmp_path / "o.npz")]) == 2
    assert "error" in capsys.readouterr().err


def test_rerun_tasks_are_safe(tmp_path):
    """A task Dask runs again: the validation / budget pass writes identical subtree files; a rerun
    measurement with OS entropy draws fresh noise into its own file, and the downward pass uses
    exactly the file of the summary it is given."""
    import dataclasses

    from sparsedp.scaleout.chunked import BlockWriter
    from sparsedp.scaleout.lue import measure_chunk, prepare_chunk, release_chunk

    x = histogram(800, 4)
    r = release_lue(x, 1.0, chunk=100, rng=1)
    q = 2
    root, left = r.roots[q], r.lefts[q]
    reader = _readers_for(x, r)[q]
    a = prepare_chunk(r.spec, root, reader, str(tmp_path))
    b = prepare_chunk(r.spec, root, reader, str(tmp_path))
    assert a[5] != b[5] and a[:5] == b[:5]
    fa, fb = np.load(a[5]), np.load(b[5])
    assert all(np.array_equal(fa[k], fb[k]) for k in fa.files)
    root = dataclasses.replace(root, coef=a[5])
    first = measure_chunk(r.spec, root, left, None, 1.0, reader, None, str(tmp_path))
    second = measure_chunk(r.spec, root, left, None, 1.0, reader, None, str(tmp_path))
    assert first.path != second.path and first.total == second.total == int(x[root.lo:root.hi].sum())
    y1, y2 = np.load(first.path)[0], np.load(second.path)[0]
    assert not np.array_equal(y1, y2)
    writer = BlockWriter("return", None, root.lo, root.hi)
    l1 = release_chunk(r.spec, root, left, first, 500.0, writer)[1]
    l2 = release_chunk(r.spec, root, left, second, 500.0, writer)[1]
    assert l1.sum() == pytest.approx(500.0) and l2.sum() == pytest.approx(500.0) and not np.allclose(l1, l2)
    np.testing.assert_array_equal(release_chunk(r.spec, root, left, first, 500.0, writer)[1], l1)  # no noise drawn
    with pytest.raises(SparseDPError, match="exceeds epsilon"):  # the plan's own certificate, before any draw
        measure_chunk(r.spec, root, left, 0.999999, 1.0, reader, None, str(tmp_path))


def _readers_for(x, r):
    from sparsedp.scaleout.lue import _readers

    return _readers(x, r.bounds)
