"""Test helper (not collected): many independent ``MatrixMechanism.run`` releases, cheaply.

``mechanism_answers(mech, x, R, seed)`` returns the ``(R, queries)`` workload answers of ``R``
independent ``mech.run(x)`` calls, with the mechanism's own parts: ``run`` is the plan's measure,
then least squares (linear in ``y``), then ``W``.  The ``R`` measurements come from the plan's
batched release (:func:`sparsedp.audit.plan_release`: its own ``measure`` on a block-diagonal
copy, the only noise drawer) and are answered by the mechanism's own reconstruction as a linear map
(built from unit vectors), which is first checked against ``run`` for two seeds, so an error in the
reconstruction still fails the tests.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sparsedp.audit import plan_release
from sparsedp.inference import reconstruct


def mechanism_answers(mech, x, R: int, seed: int) -> np.ndarray:
    x = np.asarray(x)
    meas = mech.measure(x, rng=0)

    def answer(y):
        return mech.W.matvec(reconstruct(dataclasses.replace(meas, y=y), method="ls").x)

    A = np.column_stack([answer(e) for e in np.eye(meas.y.size)])
    for s in (1, 2):
        np.testing.assert_allclose(mech.run(x, rng=s).answers, A @ mech.measure(x, rng=s).y, rtol=1e-9, atol=1e-9)
    Y = plan_release(mech._plan)(x, np.random.default_rng(seed), R)
    return Y @ A.T
