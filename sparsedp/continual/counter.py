"""The online continual counter of seed 000: weighted Fenwick release, one step at a time.

Privacy argument (pure ``epsilon``-DP, Laplace).  The whole run releases a post-processing of
``y = Sigma M_N x + z`` with ``z_i ~ Lap(Delta_1 / epsilon)`` i.i.d.: the output at step ``t`` is
``(B Sigma^{-1} y)_t``, which reads ``y_1 .. y_t`` only (``B`` and ``M`` are lower triangular), and
``y_t`` reads ``a_1 .. a_t`` only.  Two neighbouring streams differ by one record, i.e. one increment
``a_j`` by at most 1, which moves ``y`` by ``Sigma M e_j``, of L1 norm ``(M^T lambda)_j <=
Delta_1(Sigma M_N)``.  So ``y`` is the Laplace mechanism with noise calibrated to its L1 sensitivity
and the release is ``epsilon``-DP (Dwork et al. 2006; matrix mechanism, Li et al. 2010).  The counter
computes ``Delta_1 = max_j (M^T lambda)_j`` exactly (``<= 1`` for the optimal weights, which are
built with ``M^T lambda <= 1``; ``floor(log2 N) + 1`` unweighted) and draws ``Lap(Delta_1 /
epsilon)``.  It refuses step ``N + 1``: the sensitivity bound holds for ``N`` steps only.

Gaussian variant (``rho``-zCDP): ``z_i ~ N(0, sigma^2)``, ``sigma = Delta_2 / sqrt(2 rho)``,
``Delta_2 = max_j sqrt((M^T lambda^2)_j)`` (``<= 1`` for the norm-2-optimal weights).

Streaming.  Node ``t`` is ``c_t = s_t - s_{t - lowbit(t)}`` (eq. 5.5) and ``s~_t = s~_{t -
lowbit(t)} + c~_t`` (eq. 5.6).  The counter keeps the chain of ``t`` on a stack -- node index, exact
prefix sum, noisy prefix sum, variance -- at most ``floor(log2 N) + 1`` entries, so each step costs
``O(log N)`` time (weights by :meth:`FenwickWeights.at`) and the state is ``O(log N)``.  Setup computes
``Delta`` once, vectorised, in ``O(N log N)`` time and ``O(N)`` transient memory.

Save / restore.  :meth:`ContinualCounter.state` is a JSON-able dict of the stack and the running sum:
it holds the exact (private) prefix sums, so it must be stored as securely as the raw data.  Noise of
published steps lives in the stored noisy sums and is never drawn again.  The random generator is not
saved: :meth:`from_state` continues with fresh noise from the ``rng`` it is given.  Restoring an
*older* state and replaying a published step would publish that step twice with independent noise
(twice the budget for it); save after every published step and restore the latest state only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..validation import check_vector
from ._stream import BufferedNoise, StreamingCounter
from .error import expected_error, noise_calibration
from .fenwick import check_horizon
from .weights import FenwickWeights, weights_sensitivity

__all__ = ["ContinualCounter"]

_STATE_VERSION = 1


class ContinualCounter(StreamingCounter):
    """Online weighted-Fenwick counter for ``horizon`` steps.

    Parameters: ``horizon`` (``N``), exactly one of ``epsilon`` (with ``noise="laplace"``) and
    ``rho`` (with ``noise="gaussian"``), ``weights`` = ``"optimal"`` (FDA, for the noise's norm),
    ``"uniform"`` (plain Fenwick = binary mechanism) or an array of ``N`` positive weights, ``rng``
    (seed or Generator).  ``update(a_t)`` returns ``s~_t``; ``last_variance`` is its exact variance.
    """

    name = "fenwick"

    def __init__(
        self,
        horizon: int,
        epsilon: float | None = None,
        rho: float | None = None,
        weights: Any = "optimal",
        noise: str | None = None,
        rng: Any = None,
    ) -> None:
        super().__init__(check_horizon(horizon))
        noise = noise or ("gaussian" if rho is not None else "laplace")
        if noise not in ("laplace", "gaussian"):
            raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
        if (noise == "laplace") != (epsilon is not None) or (noise == "gaussian") != (rho is not None):
            raise SparseDPError("use noise='laplace' with epsilon=, or noise='gaussian' with rho=")
        self.epsilon, self.rho, self.noise = epsilon, rho, noise
        self.norm = 1 if noise == "laplace" else 2
        noise_calibration(epsilon, rho, 1.0)  # reject a bad budget before any work
        N = self.horizon
        self._fda: FenwickWeights | None = None
        self._lam: np.ndarray | None = None
        if isinstance(weights, str):
            if weights == "optimal":
                self._fda = FenwickWeights.build(N, self.norm)
                lam = self._fda.array()  # one-off, for the exact sensitivity; not kept
            elif weights in ("uniform", "unweighted"):
                lam = np.ones(N)
            else:
                raise SparseDPError(f"weights must be 'optimal', 'uniform' or an array, got {weights!r}")
            self.weights_spec: Any = weights
        else:
            lam = check_vector(weights, N, "weights")
            if np.any(lam <= 0):
                raise SparseDPError("weights must all be > 0")
            self._lam = lam
            self.weights_spec = lam.tolist()
        self.sensitivity = weights_sensitivity(lam, self.norm)  # exact; unit weights: floor(log2 N) + 1
        _, self.scale, self.unit_variance = noise_calibration(epsilon, rho, self.sensitivity)
        self._noise = BufferedNoise(noise, self.scale, rng)
        self._s = 0.0
        self._stack: list[tuple[int, float, float, float]] = []  # (node, exact s, noisy s, var / unit)
        self.last_noise = float("nan")

    def weight(self, t: int) -> float:
        """``lambda_t`` (1-based): ``O(log N)`` for the optimal weights."""
        if self._fda is not None:
            return self._fda.at(t)
        if self._lam is not None:
            return float(self._lam[t - 1])
        return 1.0

    def _step(self, a: float) -> float:
        t = self.t + 1
        start = t - (t & -t)
        stack = self._stack
        while stack and stack[-1][0] > start:
            stack.pop()
        prev_s, prev_est, prev_var = (stack[-1][1], stack[-1][2], stack[-1][3]) if stack else (0.0, 0.0, 0.0)
        self._s += a
        lam = self.weight(t)
        z = self._noise.draw()
        est = prev_est + (lam * (self._s - prev_s) + z) / lam
        var = prev_var + 1.0 / (lam * lam)
        stack.append((t, self._s, est, var))
        self.last_noise = z
        self.last_variance = var * self.unit_variance
        return est

    def expected_error(self):  # type: ignore[no-untyped-def]
        """:func:`sparsedp.continual.expected_error` for this counter's weights and budget."""
        if self._fda is not None:
            lam = self._fda.array()
        else:
            lam = self._lam if self._lam is not None else np.ones(self.horizon)
        return expected_error(self.horizon, lam, epsilon=self.epsilon, rho=self.rho)

    # ---- save / restore -------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state (contains exact prefix sums: keep it as secret as the data)."""
        return {
            "version": _STATE_VERSION,
            "horizon": self.horizon,
            "epsilon": self.epsilon,
            "rho": self.rho,
            "noise": self.noise,
            "weights": self.weights_spec,
            "t": self.t,
            "s": self._s,
            "stack": [list(e) for e in self._stack],
            "last_variance": self.last_variance,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], rng: Any = None) -> "ContinualCounter":
        """Rebuild a counter from :meth:`state`; future noise comes from ``rng`` (fresh by default).

        An integer seed is combined with the saved step ``t`` (``default_rng([seed, t])``), so resuming
        with the seed of the first run never replays that run's noise on other steps.
        """
        try:
            if state["version"] != _STATE_VERSION:
                raise SparseDPError(f"unknown counter state version {state['version']!r}")
            t = int(state["t"])
            if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
                rng = np.random.default_rng([int(rng), t])
            obj = cls(state["horizon"], epsilon=state["epsilon"], rho=state["rho"], weights=state["weights"],
                      noise=state["noise"], rng=rng)
            stack = [(int(e[0]), float(e[1]), float(e[2]), float(e[3])) for e in state["stack"]]
            s = float(state["s"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SparseDPError(f"malformed counter state: {exc}") from exc
        if not 0 <= t <= obj.horizon or (t > 0 and (not stack or stack[-1][0] != t)):
            raise SparseDPError("inconsistent counter state: step and stack do not match")
        obj.t, obj._s, obj._stack = t, s, stack
        obj.last_variance = float(state.get("last_variance", float("nan")))
        return obj

    def save(self, path: str | Path) -> None:
        """Write :meth:`state` as JSON to ``path`` (atomically: write then rename)."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.state()))
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path, rng: Any = None) -> "ContinualCounter":
        """Counterpart of :meth:`save`."""
        try:
            state = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SparseDPError(f"cannot read counter state {path}: {exc}") from exc
        return cls.from_state(state, rng)
