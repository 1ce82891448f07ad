"""Exact weighted projectors onto ``{x : C x = b}``, built once and reused every sweep.

With ``V = diag(variances)`` (``D = V^-1`` the weights), the projection in the ``D``-norm is
(seed 002, Thm 1, eq. 7, weighted form)

    ``P(x) = x + V C^T (C V C^T)^+ (b - C x)``.

* :class:`SPDSolver` solves ``S y = r`` with ``S = C V C^T`` sparse and positive *semi*-definite:
  a CHOLMOD factor (scikit-sparse, AMD/METIS ordering) of ``S + delta I`` or, when scikit-sparse is
  missing, a scipy ``splu`` of the same matrix, with iterative refinement against ``S`` itself.
  Redundant rows of ``C`` make ``S`` singular; ``delta = 1e-10 max diag(S)`` keeps the factor
  positive definite, and for a consistent right side (``r`` in the range of ``S``) refinement
  converges at the rate ``delta / (lambda + delta)`` per step (``lambda`` the non-zero eigenvalues of
  ``S``) to a solution of ``S y = r``; ``V C^T y`` is then the same for every solution.
  New variances refactorise numerically on the same symbolic analysis (:meth:`SPDSolver.refactor`).
* :func:`tree_project` is the O(n) two-pass weighted projection onto ``parent = sum(children)`` for
  any forest given by a parent array (the per-node-variance generalisation of Hay et al. 2010).
* :func:`batched_project` projects many small groups that share one constraint matrix at once.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

try:  # pragma: no cover - import guard
    from sksparse import cholmod as _cholmod
except ImportError:  # pragma: no cover - scikit-sparse is optional
    _cholmod = None

from ..tree_estimator import bfs_order, two_pass

__all__ = ["SPDSolver", "tree_project", "batched_project", "HAVE_CHOLMOD"]

HAVE_CHOLMOD = _cholmod is not None
_REG = 1e-10


class SPDSolver:
    """Solve ``S y = r`` for a sparse symmetric positive semi-definite ``S`` (see module docstring).

    ``backend`` is ``"cholmod"`` (default when scikit-sparse is installed) or ``"splu"``.
    """

    def __init__(self, S: sp.spmatrix, backend: str | None = None) -> None:
        self.backend = backend or ("cholmod" if HAVE_CHOLMOD else "splu")
        if self.backend == "cholmod" and not HAVE_CHOLMOD:
            raise ImportError("scikit-sparse is not installed; use backend='splu'")
        self._factor = None
        self._symbolic = None
        self.last_relative_residual = float("nan")
        self.refactor(S)

    def refactor(self, S: sp.spmatrix) -> None:
        """Factorise a new ``S`` with the same sparsity pattern (numeric phase only with CHOLMOD)."""
        S = sp.csc_matrix(S)
        self.S = S
        diag = S.diagonal()
        self.delta = _REG * float(diag.max()) if diag.size and diag.max() > 0 else _REG
        if S.shape[0] == 0:
            self._factor = None
            return
        if self.backend == "cholmod":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if self._symbolic is None:
                    self._symbolic = _cholmod.analyze(S)
                self._symbolic.cholesky_inplace(S, beta=self.delta)
            self._factor = self._symbolic
        else:
            reg = S + self.delta * sp.identity(S.shape[0], format="csc")
            self._factor = spla.splu(reg.tocsc(), permc_spec="MMD_AT_PLUS_A")

    def _raw(self, r: np.ndarray) -> np.ndarray:
        if self.backend == "cholmod":
            return np.asarray(self._factor(r)).reshape(r.shape)
        return self._factor.solve(r)

    def solve(self, r: np.ndarray, rtol: float = 1e-13, max_refine: int = 30) -> np.ndarray:
        """``y`` with ``S y = r``: refined until ``||S y - r|| <= rtol ||r||``, until a step no longer
        reduces ``||S y - r||`` (the rounding floor; the better iterate is kept) or ``max_refine``
        steps.  ``last_relative_residual`` is then ``||S y - r|| / ||r||`` (float64 evaluation)."""
        r = np.asarray(r, dtype=np.float64)
        if self._factor is None:
            self.last_relative_residual = 0.0
            return np.zeros_like(r)
        y = self._raw(r)
        scale = float(np.linalg.norm(r))
        res = r - self.S @ y
        rn = float(np.linalg.norm(res))
        for _ in range(max_refine):
            if rn <= rtol * scale:
                break
            y_new = y + self._raw(res)
            res_new = r - self.S @ y_new
            rn_new = float(np.linalg.norm(res_new))
            if not rn_new < rn:
                break
            y, res, rn = y_new, res_new, rn_new
        self.last_relative_residual = rn / scale if scale > 0 else 0.0
        return y


def tree_project(
    parent: np.ndarray, y: np.ndarray, v: np.ndarray, order: tuple | None = None, plan: tuple | None = None
) -> np.ndarray:
    """Weighted projection of node values ``y`` (variances ``v``) onto ``x_u = sum_{c child of u} x_c``.

    Two passes over the depths, O(nodes) (Hay, Rastogi, Miklau, Suciu 2010, generalised to per-node
    variances and to any forest):

    * up: leaves ``z = y``, ``var(z) = v``; internal ``u`` with ``Z_u = sum_c z_c``,
      ``V_u = sum_c var(z_c)``: ``z_u = (y_u / v_u + Z_u / V_u) / (1 / v_u + 1 / V_u)``,
      ``var(z_u) = 1 / (1 / v_u + 1 / V_u)``;
    * down: roots keep ``xhat = z``; ``xhat_c = z_c + var(z_c) / V_u (xhat_u - Z_u)``.

    The result is the generalised least-squares fit of consistent node values, i.e. the projection
    ``argmin sum_u (x_u - y_u)^2 / v_u`` over consistent ``x``.  ``order`` is
    :func:`~sparsedp.tree_estimator.bfs_order` of ``parent`` when the caller has it already, ``plan``
    its :func:`~sparsedp.tree_estimator.two_pass_plan`.
    """
    perm, bfs_parent, level_start = bfs_order(parent) if order is None else order
    out = np.empty(y.shape)
    out[perm] = two_pass(bfs_parent, level_start, y[perm], v[perm], plan=plan)
    return out


def batched_project(X: np.ndarray, B: np.ndarray, R: np.ndarray, VX: np.ndarray | None) -> np.ndarray:
    """Project every row ``x_g`` of ``X`` (G x p) onto ``{B x = r_g}`` in the weighted norm.

    ``B`` (k x p) has full row rank.  ``R`` (G x k) the right sides; ``VX`` (G x p) the variances or
    ``None`` (equal weights).  ``x_g + V_g B^T (B V_g B^T)^-1 (r_g - B x_g)``, one batched solve.
    """
    res = R - X @ B.T
    if VX is None:
        return X + np.linalg.solve(B @ B.T, res.T).T @ B
    S = np.einsum("kp,gp,lp->gkl", B, VX, B)
    lam = np.linalg.solve(S, res[..., None])[..., 0]
    return X + VX * (lam @ B)
