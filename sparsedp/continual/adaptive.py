"""Privacy against adaptively chosen streams for counters that release ``s_t + e_t``.

Every pure-DP counter here releases ``s~_t = s_t + e_t`` where the offset process ``e = B z`` is a
fixed linear map of i.i.d. ``z_i ~ Lap(Delta_1 / epsilon)`` that *does not depend on the data*, and
``B M = W`` for a strategy ``M`` with ``Delta_1(M) = max_j ||M e_j||_1``.  For the lower-triangular
strategies (Fenwick, trees with subtree estimates) ``e_t`` uses past noise only; for the
negative-digit tree and the full-GLS tree ``B`` is not lower triangular (``e_t`` uses the noise of
blocks that end after ``t``), which is why their noise is drawn ahead (or lazily, on first use).

**Claim.** Such a counter is ``epsilon``-DP in the adaptive continual-release game: the adversary
picks increment ``t`` (and the challenge step ``t*`` and its pair of values differing by at most 1)
as a function of ``s~_1 .. s~_{t-1}``.

**Proof.** Fix the adversary's coins.  In world ``b`` the increments are functions of the past
outputs, so ``s^b_t = S^b_t(o_1 .. o_{t-1})`` and ``o = e + S^b(o)``.  The map ``e -> o`` is
triangular with unit diagonal, so the output density is ``p_b(o) = p_e(o - S^b(o))``.  The two
worlds agree before ``t*`` (a function of the transcript) and afterwards
``S^1(o) - S^0(o) = delta(o) W e_{t*}`` with ``|delta| <= 1`` fixed by ``o_{<t*}``.  Since
``W e_{t*} = B M e_{t*}``: ``Bz + delta W e_{t*} = B(z + delta M e_{t*})`` and
``p_z(z - delta M e_{t*}) <= exp(epsilon ||M e_{t*}||_1 / Delta_1) p_z(z) <= e^epsilon p_z(z)``
pointwise (Laplace), so the image density obeys ``p_e(u + delta W e_{t*}) <= e^epsilon p_e(u)`` for
every ``u`` (a pointwise-dominated measure has a dominated push-forward).  Hence
``p_1(o) <= e^epsilon p_0(o)`` for every transcript ``o``.  Drawing the ``z`` lazily changes
nothing when *which* ``z_i`` is drawn at step ``t`` depends on ``t`` only: the joint law of ``e`` is
the same.  For Gaussian noise and ``rho``-zCDP the analogous statement for factorisation mechanisms
is Denisov et al. (NeurIPS 2022, Thm. 2.1); the pointwise bound above is specific to pure DP.

The two conditions the proof needs -- the offsets do not depend on the data, and the noise drawn
depends on ``t`` only -- are what :func:`adaptive_run` lets a test check: run one counter against an
adaptive adversary, and the same seed against a different one, and compare ``o - s``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ._stream import StreamingCounter

__all__ = ["adaptive_run"]


def adaptive_run(counter: StreamingCounter, choose: Callable[[int, np.ndarray], float],
                 steps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Feed ``counter`` the increments ``a_t = choose(t, outputs so far)`` for ``t = 1..steps``
    (default: the remaining horizon); returns ``(outputs, increments)``.  ``outputs -
    cumsum(increments)`` is the counter's noise offset process."""
    steps = counter.horizon - counter.t if steps is None else int(steps)
    outputs = np.empty(steps)
    increments = np.empty(steps)
    for i in range(steps):
        increments[i] = choose(i + 1, outputs[:i])
        outputs[i] = counter.update(increments[i])
    return outputs, increments
