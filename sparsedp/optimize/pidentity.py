"""HDMM's p-Identity strategies (McKenna, Miklau, Hay, Machanavajjhala, VLDB 2018, section 5.2),
implemented here from the formulas.

**Dense method.**  The strategy is ``M = [I; Theta] D`` with ``Theta >= 0`` (``p x n``) and ``D`` the
diagonal that normalises every column: ``D_jj = 1 / delta_j``,

* Laplace: ``delta_j = 1 + sum_i Theta_ij`` (column L1 norm 1, ``Delta_1 = 1``);
* Gaussian: ``delta_j = sqrt(1 + sum_i Theta_ij^2)`` (``Delta_2 = 1``; ``Theta`` of any sign).

It has ``(p + 1) n`` entries and the optimiser's working set is ``O(p n)`` dense numbers, so this
family is for ``n`` up to a few thousand (the issue's "~8192" with a small ``p``); the workload
itself is never formed, only ``G = W^T W`` applied to ``p`` vectors
(:class:`~sparsedp.optimize.gram.Gram`, ``O(n p)`` for prefix and all ranges).

**Objective.**  ``M^T M = D (I + Theta^T Theta) D``, so with ``X = D^{-1} G D^{-1}`` the GLS error
per unit noise variance is ``f = tr((M^T M)^{-1} G) = tr(C X)``, ``C = (I + Theta^T Theta)^{-1}``.
By Woodbury ``C = I - Theta^T S^{-1} Theta`` with the small ``S = I_p + Theta Theta^T``; writing
``Y = Theta X``, ``A = S^{-1} Theta`` and ``B = S^{-1} Y`` (``p x n``):

    f = tr(X) - <A, Y>,
    df/dTheta = -2 Theta C X C + 2 diag((C X)_jj / delta_j) ddelta/dTheta
              = -2 (B - (B Theta^T) A) + [2 (CX)_jj / delta_j] * (1 or Theta_ij / delta_j),

using ``Theta C = S^{-1} Theta`` and ``(C X)_jj = X_jj - <A[:, j], Y[:, j]>``.  One evaluation costs
one ``G``-product with ``p`` vectors plus ``O(p^2 n)``: no ``n x n`` matrix is formed, unlike the
``O(n^3)`` dense solve of the original.  The gradient is checked against finite differences in the
tests; ``Theta`` is optimised by L-BFGS-B (bounds ``Theta >= 0`` for Laplace).  The first start
is an interval tree with fitted level weights (:mod:`~sparsedp.optimize.pidentity_start`; far
fewer steps to a better optimum on range workloads), further starts ``U[0, 1]`` as in the paper.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..operators import SparseOperator
from .calibrate import NoiseModel
from .gram import Gram

__all__ = ["DEFAULT_P_MAX", "DENSE_SCORE_MAX_N", "PIdentityObjective", "default_p", "dense_trace", "pidentity_strategy"]

#: Largest ``n`` scored by the dense QR of :func:`dense_trace` (``O(n^3)``, ~1 s at 2048).
DENSE_SCORE_MAX_N = 4096


#: Largest default ``p`` (bounds the ``O(p^2 n)`` cost per step; 273 = the 16-ary tree over 4096 cells).
DEFAULT_P_MAX = 300


def internal_nodes(n: int, k: int) -> int:
    """Internal nodes of the k-ary interval tree over ``n`` leaves: ``sum_{l >= 1} ceil(n / k^l)``
    over the levels whose blocks (``k^l`` cells, the last one possibly shorter) are below the
    root's, plus the root (0 for ``n = 1``)."""
    if n <= 1:
        return 0
    count, size = 0, k
    while size < n:
        count += -(-n // size)
        size *= k
    return count + 1


def default_p(n: int) -> int:
    """The internal nodes of the 16-ary interval tree over ``n`` cells (``n / 16`` blocks, HDMM's
    ``p`` for 1-D workloads, plus the levels above them; at least 1), at most
    :data:`DEFAULT_P_MAX`: the first start is that tree (:mod:`~sparsedp.optimize.pidentity_start`)."""
    return int(min(max(1, internal_nodes(n, 16)), DEFAULT_P_MAX))


class PIdentityObjective:
    """``Theta (flattened p x n) -> (f, df/dTheta)`` with ``f = tr((M^T M)^{-1} W^T W)`` of the
    normalised ``M = [I; Theta] D`` (error per unit noise variance)."""

    def __init__(self, gram: Gram, model: NoiseModel, p: int):
        self.gram = gram
        self.model = model
        self.p = int(p)
        self.n = gram.n
        self.gdiag = gram.diagonal()

    def delta(self, theta: np.ndarray) -> np.ndarray:
        """Column norms of ``[I; Theta]``: ``1 + sum Theta`` (L1) or ``sqrt(1 + sum Theta^2)``."""
        if self.model.p == 1:
            return 1.0 + theta.sum(axis=0)
        return np.sqrt(1.0 + np.einsum("ij,ij->j", theta, theta))

    def trace(self, theta: np.ndarray, delta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """``f`` for ``M = [I; Theta] diag(1 / delta)``, with ``A``, ``Y`` and ``B`` for the gradient."""
        p = theta.shape[0]
        Z = self.gram.matmat(delta[:, None] * theta.T)  # G D^-1 Theta^T  (n x p)
        Y = (delta[:, None] * Z).T  # Theta X  (p x n)
        S = theta @ theta.T
        S[np.diag_indices(p)] += 1.0
        # S >= I is well conditioned (cond <= 1 + ||Theta||^2): its explicit inverse and two matrix
        # products are several times faster than triangular solves with 2n right-hand sides.
        S_inv = np.linalg.inv(S)
        A, B = S_inv @ theta, S_inv @ Y
        xdiag = delta * delta * self.gdiag
        f = float(xdiag.sum() - np.einsum("ij,ij->", A, Y))
        return f, A, Y, B

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        theta = x.reshape(self.p, self.n)
        delta = self.delta(theta)
        f, A, Y, B = self.trace(theta, delta)
        grad = -2.0 * (B - (B @ theta.T) @ A)
        cx = delta * delta * self.gdiag - np.einsum("ij,ij->j", A, Y)
        col = 2.0 * cx / delta
        if self.model.p == 1:
            grad += col[None, :]
        else:
            grad += col[None, :] * theta / delta[None, :]
        return f, grad.ravel()


def dense_trace(M: np.ndarray, gram: Gram) -> float:
    """``tr((M^T M)^{-1} G)`` by a thin QR ``M = Q R``: ``||W R^{-1}||_F^2 = <Z, G Z>`` with
    ``Z = R^{-1}``.  Backward stable: unlike the Woodbury form ``tr(X) - <A, Y>``, it does not
    subtract two nearly equal numbers when the strategy answers the workload almost exactly
    (a low-rank workload: ``f / tr(X)`` of ``1e-8`` was measured, leaving ~5 correct digits in the
    Woodbury value).  Used for the final score of the returned matrix when ``n <= 4096``."""
    import scipy.linalg as sla

    R = np.linalg.qr(np.asarray(M, dtype=np.float64), mode="r")
    n = R.shape[1]
    Z = sla.solve_triangular(R, np.eye(n), lower=False, check_finite=False)
    return float(np.einsum("ij,ij->", Z, gram.matmat(Z)))


def pidentity_strategy(a: np.ndarray, B: np.ndarray, name: str) -> SparseOperator:
    """``[diag(a); B]`` as a sparse operator (zeros of ``B`` dropped).  With ``a = 1 / delta`` and
    ``B = Theta diag(a)`` it is ``[I; Theta] D``; conversely its error is that of
    ``Theta = B diag(1 / a)``, ``delta = 1 / a`` (:meth:`PIdentityObjective.trace`)."""
    top = sp.diags(np.asarray(a, dtype=np.float64), format="csr")
    bottom = sp.csr_matrix(np.asarray(B, dtype=np.float64))
    bottom.eliminate_zeros()
    return SparseOperator(sp.vstack([top, bottom], format="csr"), name=name, structure="general")
