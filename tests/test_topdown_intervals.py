"""Intervals of the published integer counts of a TopDown release (sparsedp.topdown.intervals)."""
from __future__ import annotations

import numpy as np
from test_topdown import table

from sparsedp.releases import load_release
from sparsedp.topdown import plan_topdown, topdown
from sparsedp.topdown.intervals import count_intervals


def test_count_intervals_integer_non_negative_and_contain_the_count():
    counts = np.array([0.0, 3.0, 10.0, 2.0])
    est = np.array([-1.3, 3.4, 6.2, 2.0])
    lo, hi = count_intervals(counts, est, np.array([2.0, 0.5, 1.0, 0.0]))
    assert lo.tolist() == [0, 3, 6, 2] and hi.tolist() == [0, 3, 10, 2]  # [5.2, 7.2] -> 6..7, widened to 10


def test_published_count_intervals_cover_at_every_level_and_never_below_zero():
    t = table(seed=1, high=4)  # small counts: many zero cells, where the old intervals reach below 0
    h = t.hierarchy
    sizes = [s * h.cells.size for s in h.sizes]
    truth = np.concatenate([c.ravel() for c in t.counts]).astype(float)
    design = plan_topdown(h, rho=1.0, invariants=["state:total"])
    reps, hits, old_below = 300, np.zeros(len(sizes)), 0
    for r in range(reps):
        rel = topdown(t, design=design, rng=np.random.default_rng([5, r]), keep_noisy=False).to_release()
        lo, hi = rel.confidence_intervals()
        assert (lo >= 0).all() and (lo == np.round(lo)).all() and (hi == np.round(hi)).all()
        assert ((lo <= rel.answers) & (rel.answers <= hi)).all()
        cov = (lo <= truth) & (truth <= hi)
        hits += [c.mean() for c in np.split(cov, np.cumsum(sizes)[:-1])]
        old_below += int((rel.answers - rel.error_report().half_widths(0.95, "normal") < 0).sum())
    coverage = hits / reps
    assert ((0.9 <= coverage) & (coverage <= 0.99)).all(), coverage
    assert old_below > 0  # the estimate's symmetric half-widths around the counts did reach below 0


def test_saved_release_keeps_count_intervals(tmp_path):
    rel = topdown(table(), rho=1.0, rng=2)
    lo, hi = rel.confidence_intervals()
    path = rel.save(tmp_path / "r.npz")
    lo2, hi2 = load_release(path).confidence_intervals()
    assert np.array_equal(lo, lo2) and np.array_equal(hi, hi2) and (lo >= 0).all()
