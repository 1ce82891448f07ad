"""The hierarchy GLS on shape classes (sparsedp.topdown.gls.shape_classes / class_variances)
against the unit-by-unit GLS (hierarchy_gls): the same variances, on far fewer rows."""

from __future__ import annotations

import numpy as np
import pytest

from sparsedp.topdown import CellDomain, hierarchy_gls
from sparsedp.topdown.gls import class_variances, shape_classes
from sparsedp.topdown.hierarchy import Hierarchy


def random_hierarchy(seed: int, depth: int = 4) -> Hierarchy:
    """An unbalanced hierarchy: random fan-outs, some units leaves above the deepest level."""
    gen = np.random.default_rng(seed)
    parents = [np.array([-1])]
    n = 1
    for d in range(1, depth + 1):
        kids = gen.integers(0 if d > 1 else 1, 5, n)  # 0: a leaf above the deepest level
        if kids.sum() == 0:
            kids[0] = 1
        parents.append(np.repeat(np.arange(n), kids))
        n = int(kids.sum())
    codes = tuple(np.array([f"u{i}" for i in range(p.size)], dtype=object) for p in parents)
    return Hierarchy(tuple(f"l{d}" for d in range(depth + 1)), tuple(parents), codes,
                     CellDomain(("a",), (("x", "y", "z"),), ("a_x", "a_y", "a_z")))


@pytest.mark.parametrize("seed", range(6))
def test_class_variances_are_the_unit_by_unit_gls(seed):
    h = random_hierarchy(seed)
    gen = np.random.default_rng(100 + seed)
    own = [gen.uniform(0.3, 4.0, 3) for _ in range(h.depth + 1)]
    own[0][0] = 0.0  # an exact (invariant) column at the root
    own[0][1] = np.inf  # a column the root does not measure (its children's sum estimates it)
    sc = shape_classes(h)
    assert sc.contexts <= h.units
    for d in range(h.depth + 1):
        assert int(sc.weight[d].sum()) == h.sizes[d]  # every unit in exactly one context
    cv = class_variances(sc, own)
    full = hierarchy_gls(h, [np.zeros((n, 3)) for n in h.sizes],
                         [np.broadcast_to(v, (n, 3)).copy() for v, n in zip(own, h.sizes)]).variance
    for d in range(h.depth + 1):
        w = sc.weight[d].astype(float)
        np.testing.assert_allclose(w @ cv[d] / w.sum(), full[d].mean(axis=0), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(w @ np.sqrt(cv[d]) / w.sum(), np.sqrt(full[d]).mean(axis=0), rtol=1e-10,
                                   atol=1e-14)
    assert shape_classes(h) is sc  # computed once per hierarchy
