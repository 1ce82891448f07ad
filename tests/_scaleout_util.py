"""Shared helpers of the scale-out tests (tests/test_scaleout*.py): a test histogram, the whole
tree's measurements re-drawn from a release's per-chunk streams, a spy on ``MeasurementPlan.measure``
and a block reader that kills its worker process once."""

import os
import uuid

import numpy as np

from sparsedp import strategies as st
from sparsedp.measure import MeasurementPlan
from sparsedp.scaleout import ChunkedTree, ChunkSpec, chunk_layout, chunk_seeds, level_budgets
from sparsedp.scaleout.subtree import MIN_VARIANCE, chunk_plan
from sparsedp.scaleout.top import top_plan


def histogram(n, seed=0):
    return np.random.default_rng(seed).integers(0, 40, n)


def whole_tree_measurements(x, epsilon, k, chunk, seed, level_weights=None):
    """A hierarchical release's node measurements and variances, re-drawn in process from the same
    per-chunk streams and assembled in the row order of the whole tree ``hierarchical(n, k)`` (root
    first): ``(layout, y, v, scales)``."""
    n = x.size
    tree = ChunkedTree(n, k, chunk)
    scales = tree.node_scales(level_budgets(tree.levels, epsilon, level_weights))
    spec = ChunkSpec(k, tree.chunk_levels, tuple(float(s) for s in scales[tree.top_levels:]), True)
    seeds = chunk_seeds(seed, tree.chunks + 1)
    G = st.TreeLayout.balanced(n, k)
    assert G.levels == tree.levels
    y = np.empty(G.nodes)
    v = np.empty(G.nodes)
    per_level_y = [[] for _ in range(tree.chunk_levels)]
    per_level_v = [[] for _ in range(tree.chunk_levels)]
    totals = []
    for q in range(tree.chunks):
        lo, hi = tree.bounds(q)
        cp = chunk_plan(spec, hi - lo)
        meas = cp.plan.measure(x[lo:hi], rng=np.random.Generator(np.random.PCG64(seeds[q])))
        lay = chunk_layout(hi - lo, k, tree.chunk_levels)
        for lev in range(tree.chunk_levels):
            per_level_y[lev].append(lay.level_rows(meas.y, lev))
            per_level_v[lev].append(lay.level_rows(cp.variances, lev))
        totals.append(int(x[lo:hi].sum()))
    for lev in range(tree.chunk_levels):
        y[G.row_offsets[lev]: G.row_offsets[lev] + G.sizes[lev]] = np.concatenate(per_level_y[lev])
        v[G.row_offsets[lev]: G.row_offsets[lev] + G.sizes[lev]] = np.concatenate(per_level_v[lev])
    tp = top_plan(tree, scales, True)
    if tp.plan is not None:
        top = tp.plan.measure(np.array(totals), rng=np.random.Generator(np.random.PCG64(seeds[-1])))
        y[: tp.inner] = top.y
        v[: tp.inner] = np.maximum(tp.plan.variances(), MIN_VARIANCE)
    return G, y, v, scales


def spy_measure(monkeypatch):
    """Wrap ``MeasurementPlan.measure`` (it still measures); the returned list gets the ``accountant``
    argument of every call (``None`` when the call charges nothing)."""
    calls = []
    real = MeasurementPlan.measure

    def spy(self, *a, **kw):
        calls.append(kw.get("accountant"))
        return real(self, *a, **kw)

    monkeypatch.setattr(MeasurementPlan, "measure", spy)
    return calls


def kill_once_reader(path, marker_dir, after, block_info=None):
    """Read a block of a .npy file (``da.map_blocks``); the first read past ``after`` reads kills its
    worker process.  Send it by value: ``cloudpickle.register_pickle_by_value(_scaleout_util)``."""
    os.makedirs(marker_dir, exist_ok=True)
    open(os.path.join(marker_dir, f"read-{uuid.uuid4().hex}"), "w").close()
    if len([f for f in os.listdir(marker_dir) if f.startswith("read-")]) > after:
        try:
            fd = os.open(os.path.join(marker_dir, "killed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            os._exit(1)
    lo, hi = block_info[None]["array-location"][0]
    return np.array(np.load(path, mmap_mode="r")[lo:hi])
