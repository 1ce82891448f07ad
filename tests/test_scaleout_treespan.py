"""The restaurant's trees x span release chunk by chunk (issue 14) == the in-process projection."""

import importlib.util
import os

import _scaleout_util
import numpy as np
import pytest
from _scaleout_util import kill_once_reader, spy_measure

from sparsedp import strategies as st
from sparsedp.consistency import restaurant_constraints, solve
from sparsedp.consistency.restaurant import COMBOS, restaurant, restaurant_rows
from sparsedp.errors import (
    BudgetExceededError,
    InputBoundError,
    InvalidPrivacyParameterError,
    NonFiniteInputError,
    ShapeError,
    SparseDPError,
)
from sparsedp.executors import DaskExecutor, ThreadExecutor
from sparsedp.measure import MeasurementPlan
from sparsedp.privacy import Accountant
from sparsedp.scaleout import chunk_layout, chunk_seeds
from sparsedp.scaleout.treespan import _chunk_plan, _plan_release, release_restaurant


def _sales(days, seed=0):
    return restaurant(days, seed=seed).sales


def _measurements(sales, epsilon, chunk, seed):
    """The release's noisy (node, item) values, re-drawn from the same per-chunk streams and put in
    the in-process release's order (node-major over ``TreeLayout.balanced(T, 2)``, root first)."""
    T = sales.shape[0]
    s = _plan_release(T, epsilon, chunk)
    tree = s.tree
    seeds = chunk_seeds(seed, tree.chunks + 1)
    G = st.TreeLayout.balanced(T, 2)
    assert G.levels == tree.levels
    per_level = [[] for _ in range(tree.chunk_levels)]
    totals = []
    for q in range(tree.chunks):
        lo, hi = tree.bounds(q)
        block = sales[lo:hi]
        cp = _chunk_plan(s.spec, hi - lo)
        y = cp.plan.measure(np.ascontiguousarray(block.T).ravel(),
                            rng=np.random.Generator(np.random.PCG64(seeds[q]))).y.reshape(-1, 5)
        lay = chunk_layout(hi - lo, 2, tree.chunk_levels)
        for lev in range(tree.chunk_levels):
            per_level[lev].append(lay.level_rows(y, lev))
        totals.append(block.sum(axis=0))
    Y = np.empty((G.nodes, 5))
    for lev in range(tree.chunk_levels):
        Y[G.row_offsets[lev]: G.row_offsets[lev] + G.sizes[lev]] = np.concatenate(per_level[lev])
    if s.top is not None:
        t = np.ascontiguousarray(np.array(totals).T).ravel()
        Y[: s.inner] = s.top.measure(t, rng=np.random.Generator(np.random.PCG64(seeds[-1]))).y.reshape(-1, 5)
    return G, Y, s


def _inprocess(Y, T, method="auto"):
    """What ``restaurant_release`` does with its noisy vector: ``solve`` on the restaurant's constraints."""
    return solve(Y.ravel(), restaurant_constraints(T), method=method).x.reshape(-1, 5)


@pytest.mark.parametrize("T,chunk", [(1, 1), (7, 1), (64, 64), (100, 8), (100, 32), (1000, 64), (513, 256)])
def test_equals_inprocess_release_for_the_same_noise(T, chunk):
    sales = _sales(T, T)
    r = release_restaurant(sales, 1.0, chunk=chunk, rng=11)
    G, Y, s = _measurements(sales, 1.0, chunk, 11)
    x = _inprocess(Y, T)
    tol = 1e-9 * max(1.0, float(np.abs(x).max()))
    np.testing.assert_allclose(r.estimate, x[G.row_offsets[0]:], rtol=1e-9, atol=tol)
    np.testing.assert_allclose(r.top_values, x[: s.tree.top.nodes], rtol=1e-9, atol=tol)
    assert r.chunks == s.tree.chunks and r.levels == G.levels and r.loss <= 1.0


def test_is_the_projection_by_an_independent_solver():
    """Against the dense least-squares projection (``method='generic'``), not the tree-span code."""
    T = 24
    sales = _sales(T, 3)
    r = release_restaurant(sales, 0.5, chunk=8, rng=5)
    G, Y, _ = _measurements(sales, 0.5, 8, 5)
    x = _inprocess(Y, T, method="generic")
    np.testing.assert_allclose(r.estimate, x[G.row_offsets[0]:], rtol=1e-9, atol=1e-7)
    # feasible: every day's five values lie in the combos' span, top nodes are sums of days
    Q, _ = np.linalg.qr(COMBOS.T.astype(float))
    np.testing.assert_allclose(r.estimate - r.estimate @ Q @ Q.T, 0, atol=1e-9)
    np.testing.assert_allclose(r.top_values[0], r.estimate.sum(axis=0), rtol=1e-12)


def test_certified_loss_is_the_brute_force_sensitivity():
    """Every order (one combo on one day) changes the measured rows -- chunk subtrees and top nodes,
    assembled as the whole tree -- by at most ``epsilon`` in scaled L1, and some order reaches it."""
    T, c, eps = 20, 4, 0.7
    s = _plan_release(T, eps, c)
    G = st.TreeLayout.balanced(T, 2)
    A = restaurant_rows(G)  # the in-process rows; the scale-out measures the same rows
    worst = 0.0
    for t in range(T):
        for k in range(3):
            d = np.zeros((T, 5))
            d[t] = COMBOS[k]
            worst = max(worst, float(np.abs(A.matvec(np.ascontiguousarray(d.T).ravel())).sum()) / s.scale)
    assert worst <= s.loss <= eps and s.loss == pytest.approx(worst, rel=1e-9)
    assert s.sensitivity == 5 * G.levels
    rows = sum(_chunk_plan(s.spec, L).plan.rows for L in s.tree.lengths()) + (s.top.rows if s.top else 0)
    assert rows == 5 * G.nodes  # every node of every item measured once


def test_noise_has_the_reported_variance():
    T = 32
    sales = _sales(T, 2)
    truth = restaurant_rows(st.TreeLayout.balanced(T, 2)).matvec(np.ascontiguousarray(sales.T).ravel())
    errs = np.concatenate([_measurements(sales, 2.0, 8, seed)[1].ravel() - truth for seed in range(40)])
    r = release_restaurant(sales, 2.0, chunk=8, rng=0)
    assert np.all(errs == np.round(errs))  # exact discrete Laplace by default
    se = r.variance * np.sqrt(5.0 / errs.size)
    assert abs(errs.var() - r.variance) < 4 * se
    assert r.variance == pytest.approx(2 * r.scale**2, rel=0.01)


def test_charged_once_and_overspend_refused_before_noise(monkeypatch):
    calls = spy_measure(monkeypatch)
    acc = Accountant(epsilon=1.5)
    r = release_restaurant(_sales(300), 1.0, chunk=32, rng=4, accountant=acc)
    assert acc.spent == 1.0 and len(acc.ledger) == 1 and acc.ledger[0] is r.ledger
    e = r.ledger
    assert e.rows == 5 * st.TreeLayout.balanced(300, 2).nodes and e.columns == 1500 and e.private is False
    assert e.sensitivity == r.sensitivity == 5 * r.levels and e.scale_min == r.scale
    assert len(calls) == r.chunks + 1 and all(a is None for a in calls)
    calls.clear()
    with pytest.raises(BudgetExceededError):
        release_restaurant(_sales(300), 1.0, chunk=32, rng=4, accountant=acc)
    assert calls == [] and len(acc.ledger) == 1


def _bad(kind):
    x = _sales(64).astype(np.float64)
    if kind == "nan":
        x[3, 1] = np.nan
    elif kind == "negative":
        x[40] = -COMBOS[0]
    elif kind == "fraction":
        x[10, 2] += 0.5
    elif kind == "not-combos":
        x[63, 0] += 1  # one cola sold outside the combos
    elif kind == "shape":
        x = x[:, :4]
    elif kind == "1d":
        x = x[:, 0]
    elif kind == "total":  # every day at most 2^50, but the cola tree's root 2^51
        x[:2] = COMBOS[0] * 2**49
    return x


@pytest.mark.parametrize("kind,err", [("nan", NonFiniteInputError), ("negative", SparseDPError),
                                      ("fraction", SparseDPError), ("not-combos", SparseDPError),
                                      ("shape", ShapeError), ("1d", ShapeError), ("total", InputBoundError)])
def test_bad_input_refused_before_charge_and_noise(monkeypatch, kind, err):
    calls = []
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **kw: calls.append(1))
    acc = Accountant(epsilon=5.0)
    with pytest.raises(err):
        release_restaurant(_bad(kind), 1.0, chunk=16, rng=1, accountant=acc)
    assert calls == [] and acc.spent == 0 and acc.ledger == ()


def test_parameters_and_unaligned_chunks_refused(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **kw: calls.append(1))
    x = _sales(100)
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(InvalidPrivacyParameterError):
            release_restaurant(x, eps, chunk=8)
    for kw in ({"chunk": 12}, {"chunk": 0}, {"chunk": 128}, {"secure": 1}, {"rng": -1}, {"out": tmp_path / "o.txt"}):
        with pytest.raises(SparseDPError):
            release_restaurant(x, 1.0, **{"chunk": 8, **kw})
    da = pytest.importorskip("dask.array")
    with pytest.raises(SparseDPError, match="not subtrees"):
        release_restaurant(da.from_array(x, chunks=(30, 5)), 1.0)  # 30-day blocks cut the binary tree
    assert calls == []
    monkeypatch.undo()
    r = release_restaurant(da.from_array(x, chunks=(30, 5)), 1.0, chunk=16, rng=1)  # rechunked on request
    assert r.chunk == 16


def test_files_in_and_out_and_executors_agree(tmp_path):
    zarr = pytest.importorskip("zarr")
    T = 700
    x = _sales(T, 9)
    np.save(tmp_path / "s.npy", x)
    z = zarr.open_array(str(tmp_path / "s.zarr"), mode="w", shape=x.shape, chunks=(128, 5), dtype="i8")
    z[:] = x
    ref = release_restaurant(x, 1.0, chunk=128, rng=7)
    a = release_restaurant(str(tmp_path / "s.npy"), 1.0, chunk=128, rng=7, out=tmp_path / "o.npy")
    with ThreadExecutor() as ex:
        b = release_restaurant(str(tmp_path / "s.zarr"), 1.0, rng=7, out=tmp_path / "o.zarr", executor=ex)
    assert b.chunk == 128  # the Zarr array's own aligned chunks
    np.testing.assert_array_equal(a.load(), ref.estimate)
    np.testing.assert_array_equal(b.load(), ref.estimate)
    np.testing.assert_array_equal(a.top_values, ref.top_values)
    assert not list(tmp_path.glob("sparsedp-restaurant-*"))  # scratch removed


def test_os_entropy_default_is_private():
    x = _sales(200)
    acc = Accountant(epsilon=2.0)
    r = release_restaurant(x, 1.0, chunk=32, accountant=acc)
    r2 = release_restaurant(x, 1.0, chunk=32)
    assert r.private and r.secure and acc.ledger[0].private is True
    assert not np.array_equal(r.estimate, r2.estimate)


def test_local_cluster_equals_inprocess(tmp_path):
    """A LocalCluster (worker threads: a few seconds less than processes on this machine)."""
    pytest.importorskip("dask.distributed")
    x = _sales(500, 4)
    np.save(tmp_path / "s.npy", x)
    ref = release_restaurant(x, 1.0, chunk=64, rng=3)
    ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=False)
    try:
        r = release_restaurant(str(tmp_path / "s.npy"), 1.0, chunk=64, rng=3, executor=ex, out=tmp_path / "o.zarr"
                               if importlib.util.find_spec("zarr") else tmp_path / "o.npy")
    finally:
        ex.close()
    assert r.executor == "dask" and r.estimate is None
    np.testing.assert_array_equal(r.load(), ref.estimate)


@pytest.mark.skipif(os.environ.get("SPARSEDP_PROCESS_CLUSTER") != "1",
                    reason="starts worker processes and kills one (~20 s here); set SPARSEDP_PROCESS_CLUSTER=1")
def test_local_cluster_survives_a_killed_worker(tmp_path):
    """A LocalCluster of worker processes, one of which dies in the measurement pass (Dask runs its
    task again): the release written chunk by chunk equals the in-process one, charged once."""

    pytest.importorskip("dask.distributed")
    import cloudpickle
    import dask.array as da

    T, c = 600, 64
    x = _sales(T, 4)
    path = tmp_path / "s.npy"
    np.save(path, x)
    ref = release_restaurant(x, 1.0, chunk=c, rng=3)
    ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GB")
    try:
        cloudpickle.register_pickle_by_value(_scaleout_util)  # the killer reader travels by value
        m = -(-T // c)
        marker = str(tmp_path / "marker")
        d = da.map_blocks(kill_once_reader, str(path), marker, m + 3,
                          chunks=(tuple(min(c, T - lo) for lo in range(0, T, c)), (5,)), dtype=x.dtype,
                          meta=np.empty((0, 0), x.dtype))
        acc = Accountant(epsilon=1.0)
        killed = release_restaurant(d, 1.0, rng=3, executor=ex, accountant=acc, out=tmp_path / "o.npy")
    finally:
        ex.close()
    assert os.path.exists(os.path.join(marker, "killed"))  # a worker did die mid-measurement
    assert killed.executor == "dask" and killed.chunk == c  # the dask array's own aligned blocks
    np.testing.assert_array_equal(killed.load(), ref.estimate)  # its task ran again: the same noise
    assert acc.spent == 1.0 and len(acc.ledger) == 1
    assert not [p for p in os.listdir(tmp_path) if p.startswith("sparsedp-restaurant-")]  # scratch removed


def test_cli_chunked_release(tmp_path, capsys, monkeypatch):
    import json

    from sparsedp.cli import main

    x = _sales(300, 6)
    np.save(tmp_path / "s.npy", x)
    out = tmp_path / "o.npy"
    assert main(["restaurant", "--data", str(tmp_path / "s.npy"), "--chunk", "64", "--seed", "2", "--out", str(out),
                 "--executor", "threads", "--workers", "2"]) == 0
    ref = release_restaurant(x, 1.0, chunk=64, rng=2)
    np.testing.assert_array_equal(np.load(out), ref.estimate)
    meta = json.loads((tmp_path / "o.npy.release.json").read_text())
    assert meta["private"] is False and meta["chunks"] == 5 and len(meta["ledger"]) == 1
    assert "chunk by chunk" in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **kw: calls.append(1))
    np.savetxt(tmp_path / "s.csv", x, delimiter=",")
    for argv in (["--data", str(tmp_path / "s.npy"), "--out", str(out), "--evaluate"],  # not with the chunked path
                 ["--data", str(tmp_path / "s.csv"), "--out", str(out)],  # a .npy / .zarr array is needed
                 ["--data", str(tmp_path / "s.npy"), "--chunk", "64", "--out", str(tmp_path / "o.npz")],
                 ["--data", str(tmp_path / "s.npy"), "--out", str(out), "--chunk", "48"],  # not a power of 2
                 ["--data", str(tmp_path / "s.npy"), "--out", str(out), "--days", "301"],
                 ["--data", str(tmp_path / "s.npy"), "--workers", "2"]):
        assert main(["restaurant", *argv, "--force"]) == 2  # --force: refused for the reason named, not "exists"
    assert calls == []
