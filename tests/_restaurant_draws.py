"""Many restaurant releases at once (suite and benchmark speed): the consistent release is affine in
the noisy node values, ``x = P y + c0`` (``P`` built column by column through the solver itself),
so ``R`` releases are ``R`` noise vectors of the plan's batched release mapped through ``P``."""

from __future__ import annotations

import numpy as np


def restaurant_affine(sales, T: int, secure: bool):
    """``(plan, items, truth, P, c0)`` for ``T`` days of ``sales`` at epsilon 1: the plan measured,
    the items' daily sales stacked item-major, the noise-free node values, and the solver's affine
    map ``x = P y + c0`` of the noisy node values ``y``."""
    from sparsedp.consistency import solve
    from sparsedp.consistency.restaurant import restaurant_constraints, restaurant_layout, restaurant_plan

    plan = restaurant_plan(restaurant_layout(T), 1.0, secure)
    cons = restaurant_constraints(T, "leaves")
    items = np.ascontiguousarray(sales.sales.T).ravel()
    truth = plan.measured.matvec(items)
    c0 = solve(np.zeros(truth.size), cons).x
    P = np.column_stack([solve(e, cons).x - c0 for e in np.eye(truth.size)])
    return plan, items, truth, P, c0


def restaurant_errors(plan, items, truth, P, c0, R: int, seed: int = 0) -> np.ndarray:
    """The errors of ``R`` releases (``R x answers``): the plan's batched release through ``P``."""
    from sparsedp.audit import plan_release

    return plan_release(plan)(items, np.random.default_rng(seed), R) @ P.T + c0 - truth
