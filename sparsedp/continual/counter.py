"""The online continual counter of seed 000: weighted Fenwick release, one step at a time.

Privacy argument (pure ``epsilon``-DP, Laplace).  The whole run releases a post-processing of
``y = diag(w) M_N x + z`` with ``z_i ~ Lap(b)`` i.i.d.: row ``i`` is the Fenwick node ``i`` (the sum
of the steps ``(i - lowbit(i), i]``, an interval) with weight ``w_i`` (seed 000's ``Sigma M_N``).
The output at step ``t`` is ``(B diag(w)^{-1} y)_t``, which reads ``y_1 .. y_t`` only (``B`` and ``M``
are lower triangular), and ``y_t`` reads ``a_1 .. a_t`` only.  Two neighbouring streams differ in one
increment ``a_j`` by at most 1, which moves ``y`` by ``diag(w) M e_j``, of L1 norm
``(M^T w)_j <= Delta_1``.  The rows are :class:`~sparsedp.intervals.IntervalRows` measured through
:func:`sparsedp.measure.plan_measurement`, which computes ``Delta_1 = max_j (M^T w)_j`` from the rows
themselves (exact integer coverage, certified ``>=`` the exact value) and ``b = Delta_1 / epsilon``
rounded up (Dwork et al. 2006; matrix mechanism, Li et al. 2010).  ``self.sensitivity`` is the same
quantity for ``lambda`` (:func:`~sparsedp.continual.weights.certified_weights_sensitivity`: 1 up to
rounding for the optimal weights, which are built with ``M^T lambda <= 1``; exactly
``floor(log2 N) + 1`` unweighted).  :meth:`ContinualCounter.measured_strategy` and
:meth:`~ContinualCounter.noise_scales` expose ``diag(w) M_N`` and ``b`` for audits.  It refuses step
``N + 1``: the sensitivity bound holds for ``N`` steps only.

Gaussian variant (``rho``-zCDP): ``z_i ~ N(0, sigma^2)``, ``sigma = Delta_2 / sqrt(2 rho)``,
``Delta_2 = max_j sqrt((M^T w^2)_j)`` (``<= 1`` for the norm-2-optimal weights).

Weights measured.  Float noise (``secure=False``, an explicit opt-out: float64 noise leaks through
its low bits): ``w = lambda``.  Exact noise (``secure=True``, the default): discrete Laplace /
Gaussian noise on the data's lattice (:mod:`._stream`) needs a lattice strategy, so the weights are
the integers ``m_i = max(1, round(2^20 lambda_i))`` (:meth:`ContinualCounter._measured_weights`):
every node gets the same noise scale, one sampler table for the whole stream.  (Weights as per-row
scales ``b / lambda_i`` on the 0/1 rows, the other way to put weights on a lattice, would give about
380 distinct scales at ``N = 2^20`` after the plan's rounding to 64 steps per octave -- one exact
sampler table each, 1 s of table building and 1% more variance.)  Then ``y_i = m_i c_i + z_i`` is
computed exactly (Python integers) and the node estimate ``c~_i = y_i / m_i`` is a function of
``y``: the release is a post-processing of the exact measurement.

Streaming.  Node ``t`` is ``c_t = s_t - s_{t - lowbit(t)}`` (eq. 5.5) and ``s~_t = s~_{t -
lowbit(t)} + c~_t`` (eq. 5.6).  The counter keeps the chain of ``t`` on a stack -- node index, exact
prefix sum, noisy prefix sum, variance -- at most ``floor(log2 N) + 1`` entries, so each step costs
``O(1)`` amortised time beyond the chain and the state is ``O(log N)``.  Setup computes ``Delta`` and
the measurement plan once, vectorised, in ``O(N log N)`` time; the plan keeps ``O(N)`` per-row arrays
(interval ends, weights, scales, variances: about 50 bytes per step).

Increments (``increments=``, :mod:`._stream`): non-negative integer counts with a running sum of at
most ``2^50`` (default), or reals in ``[0, 1]``; anything else is refused before the step is taken.
``accountant=``: charged ``epsilon`` (``rho``) once, in the constructor, through the plan's ledger
entry, before any noise is drawn.

Keyed noise.  The noise of node ``t`` is a function of a secret 256-bit key and ``t``: the rows are
cut into fixed blocks (:class:`~._stream.RowNoise`, ``noise_block`` rows) and block ``b`` is drawn by
the plan's exact samplers from the bytes of :class:`~sparsedp.noise.KeyedRandomBits` ``(key, b)``
(SHAKE-256, a keyed pseudo-random function).  The key comes from ``os.urandom`` (``rng=None``) or
from the seed (a seed or Generator: reproducible and NOT private); it is made at the first draw, so a
Generator is not read at creation.  Drawing a block costs what drawing a batch cost before.

Privacy unit (``privacy_unit=``).  With a declared :class:`~sparsedp.privacy_unit.PrivacyUnit` the
increments are counts of records truncated per unit (:func:`~.units.unit_increments`): one unit
changes them by ``d >= 0`` with at most ``g`` non-zero steps of at most ``r`` each and ``sum d <= k``.
The plan's sensitivity is multiplied by :func:`~.units.unit_factor` ``c``, the largest
``sum_s d_s ||A_s||_p`` over those ``d`` divided by the largest column norm (``r`` times the ``g``
largest column norms, capped by ``k`` times the largest), rounded up: ``||A d||_p <= c Delta`` for
every unit (:mod:`.units`).  The ledger entry, :meth:`to_release` and the state name the unit; a
resume must declare the same one.

Save / restore.  :meth:`ContinualCounter.state` is a JSON-able dict of the stack, the running sum and
the noise key (with its block size and whether it is private): it holds the exact prefix sums and the
key (which recomputes every noise value), so it is as secret as the raw data.  :meth:`save` writes it
atomically to a file only its owner can read or write (mode ``0600``: a temporary file created
``0600`` in the same directory, flushed, then renamed over the target).  :meth:`from_state` continues
with the saved key from the saved step's row on, so rebuilding from one state twice, or from an older
copy, and taking a step again with the same increment releases the value already published for it,
bit for bit: a replay carries no new information (where refusing an older state would need a record of publication that
outlives every backup).  :meth:`load` and :meth:`from_state` refuse a state whose parameters
(horizon, epsilon, rho, weights, increments, privacy unit) disagree with the ones the caller states, and a state
whose sums lie outside the increment domain.  States of versions 1 to 3 hold no key: they resume
with a new one and a warning.  A restored counter continues the release charged when it was created
and charges nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import InputBoundError, SparseDPError
from ..intervals import IntervalRows
from ..measure import MeasurementPlan, plan_measurement
from ..noise import KeyedRandomBits, SecureRandomBits
from ..privacy import Accountant
from ..privacy_unit import ONE_ROW, PrivacyUnit
from ..validation import MAX_MAGNITUDE, check_epsilon, check_rho, check_vector
from ._stream import (
    MIN_RELATIVE_WEIGHT,
    StreamingCounter,
    check_accountant,
    fenwick_rows,
    plan_rows,
    row_variances,
)
from .error import expected_error, noise_calibration
from .fenwick import check_horizon, fenwick_matrices
from .units import check_counter_unit, unit_factor
from .weights import FenwickWeights, certified_weights_sensitivity

__all__ = ["ContinualCounter"]

_STATE_VERSION = 4
#: How a key and a row become noise (block layout, KeyedRandomBits, the exact samplers' use of its
#: bytes).  A state records it; a state of another scheme is refused, since its replayed steps would
#: not repeat their published values.  Bump it whenever that mapping changes (a test pins it).
NOISE_SCHEME = 1
_EXACT = 2.0**52  # integers below this add exactly in float64
#: The parameters a resumed state must share with the run that continues it.
RESUME_PARAMETERS = ("horizon", "epsilon", "rho", "weights", "increments", "secure", "privacy_unit")


class ContinualCounter(StreamingCounter):
    """Online weighted-Fenwick counter for ``horizon`` steps.

    Parameters: ``horizon`` (``N``), exactly one of ``epsilon`` (with ``noise="laplace"``) and
    ``rho`` (with ``noise="gaussian"``), ``weights`` = ``"optimal"`` (FDA, for the noise's norm),
    ``"uniform"`` (plain Fenwick = binary mechanism) or an array of ``N`` positive weights (scaled to
    a largest weight of 1; the smallest must then be ``>= 1e-100``), ``rng`` (``None``: a fresh
    256-bit noise key from the operating system; a seed or Generator: a key derived from it,
    reproducible and NOT private; see *Keyed noise* in the module docstring), ``increments``
    (``"counts"`` or ``"unit"``, see :mod:`._stream`), ``accountant`` (charged once, here),
    ``secure`` (``True``, default: exact discrete noise; ``False``: float64 noise, an opt-out),
    ``privacy_unit`` (a :class:`~sparsedp.privacy_unit.PrivacyUnit` with fixed bounds: the
    increments are counts of records truncated per unit, :func:`~sparsedp.continual.units.unit_increments`,
    and the noise is calibrated so that the whole stream costs the budget per *unit*: the sensitivity
    is the largest change one unit's truncated rows can make, from the strategy's column norms,
    :mod:`sparsedp.continual.units`; ``None``: one row).
    ``update(a_t)`` returns ``s~_t``; ``last_variance`` is its exact variance.
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
        *,
        increments: str = "counts",
        accountant: Accountant | None = None,
        secure: bool = True,
        privacy_unit: PrivacyUnit | None = None,
        _noise_block: int | None = None,
    ) -> None:
        super().__init__(check_horizon(horizon), increments, secure)
        accountant = check_accountant(accountant)
        unit = check_counter_unit(privacy_unit)
        if unit is not None and self.increments != "counts":
            raise SparseDPError("a privacy unit counts records: use increments='counts' (each kept row adds 1 "
                                "to its step)")
        #: whom the release protects (:data:`~sparsedp.privacy_unit.ONE_ROW` unless declared)
        self.privacy_unit: PrivacyUnit = unit if unit is not None else ONE_ROW
        #: the factor on the strategy's largest column norm that bounds one unit's change (1: one row)
        self.unit_factor = 1.0
        noise = noise or ("gaussian" if rho is not None else "laplace")
        if noise not in ("laplace", "gaussian"):
            raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
        if (noise == "laplace") != (epsilon is not None) or (noise == "gaussian") != (rho is not None):
            raise SparseDPError("use noise='laplace' with epsilon=, or noise='gaussian' with rho=")
        self.epsilon = None if epsilon is None else check_epsilon(epsilon, "epsilon")
        self.rho = None if rho is None else check_rho(rho, "rho")
        self.noise = noise
        self.norm = 1 if noise == "laplace" else 2
        N = self.horizon
        self._fda: FenwickWeights | None = None
        self._lam: np.ndarray | None = None
        if isinstance(weights, str):
            if weights == "optimal":
                self._fda = FenwickWeights.build(N, self.norm)
            elif weights not in ("uniform", "unweighted"):
                raise SparseDPError(f"weights must be 'optimal', 'uniform' or an array, got {weights!r}")
            self.weights_spec: Any = weights
        else:
            lam = check_vector(weights, N, "weights")
            if np.any(lam <= 0):
                raise SparseDPError("weights must all be > 0")
            lam = lam / lam.max()
            if lam.min() < MIN_RELATIVE_WEIGHT:
                raise SparseDPError(f"weights must lie within a factor {1 / MIN_RELATIVE_WEIGHT:g} of each other")
            self._lam = lam
            self.weights_spec = [float(v) for v in np.asarray(weights, dtype=np.float64)]
        # certified >= the exact max_j (M^T lambda)_j of the weights used (unit weights: floor(log2 N) + 1)
        lam = self.weights_array()
        self.sensitivity = certified_weights_sensitivity(lam, self.norm)
        _, self.scale, self.unit_variance = noise_calibration(self.epsilon, self.rho, self.sensitivity)
        nodes = fenwick_rows(N)

        def build(grid: float) -> MeasurementPlan:
            w = None if self._uniform else self._measured_weights(lam, grid)
            rows = IntervalRows(N, nodes.lo, nodes.hi, w, name=nodes.name + (", weighted" if w is not None else ""))
            # homoscedastic noise on the weighted rows: the plan computes Delta from the rows themselves
            if unit is None:
                return plan_rows(rows, epsilon=self.epsilon, rho=self.rho, secure=self.secure, grid=grid)
            # one unit changes the increments by d (module doc of .units): Delta times c bounds ||A d||
            self.unit_factor = unit_factor(np.ones(N) if w is None else w, self.norm, unit)
            plan = plan_measurement(rows, epsilon=self.epsilon, rho=self.rho, noise=self.noise, secure=self.secure,
                                    grid=grid if self.secure else 1.0, unit=self.unit_factor)
            return dataclasses.replace(plan, privacy_unit=unit.label)

        self._make_plan(build)
        self._w = self.plan.measured.weights  # the weight of every node as measured (ones: unweighted)
        self._wint = self._w.astype(np.int64).tolist() if self.secure else None
        #: the weights' unit: ``w = weight_unit * lambda`` (up to rounding; 2^20 with exact noise)
        self.weight_unit = 1.0 if self._uniform else float(self._w.max()) / float(lam.max())
        #: node ``i``'s estimate has noise of scale ``scale / lambda_i`` (the plan's per-node scale,
        #: :meth:`noise_scales`, is ``weight_unit * scale``)
        self.scale = float(self.plan.scales[0]) / self.weight_unit
        self._row_var = row_variances(self.plan) / self._w**2  # variance of each node's estimate
        self._s = 0.0
        self._stack: list[tuple[int, float, float, float]] = []  # (node, exact s, noisy s, variance)
        self.last_noise = float("nan")
        # charges, once; draws nothing yet.  The noise of each step is a function of a secret key and
        # the step (made at the first draw: a Generator is read only then), so a replay repeats it.
        self._open(accountant, rng, lambda: noise_keys(rng), _noise_block)

    @property
    def _uniform(self) -> bool:
        return self._fda is None and self._lam is None

    def _measured_weights(self, lam: np.ndarray, grid: float) -> np.ndarray:
        """The node weights measured: ``lambda`` itself with float noise; with exact noise the integers
        ``m_i = max(1, round(K lambda_i))``, ``K = 2^20`` (less only when the exact sampler's scale,
        about ``K / (grid epsilon)`` grid units, would pass ``2^39``), so that the strategy lies on the
        lattice and every node gets the *same* noise scale (one sampler table for all rows; per-row
        scales ``b / lambda_i`` would need about 380 tables at ``N = 2^20``).  The plan computes
        ``Delta`` exactly from the integers; rounding the weights only moves them off the optimum by
        ``2^-21 / lambda_i`` (relative)."""
        if not self.secure:
            return lam
        budget = self.epsilon if self.rho is None else math.sqrt(2.0 * self.rho)
        K = 2.0 ** max(0, min(20, math.floor(math.log2(2.0**39 * budget * grid))))
        return np.maximum(1.0, np.round(lam * K))

    def weight(self, t: int) -> float:
        """``lambda_t`` (1-based): ``O(log N)`` for the optimal weights (bit-for-bit
        ``weights_array()[t - 1]``)."""
        if self._fda is not None:
            return self._fda.at(t)
        if self._lam is not None:
            return float(self._lam[t - 1])
        return 1.0

    def weights_array(self) -> np.ndarray:
        """All ``N`` weights ``lambda_t`` the counter uses, ``O(N)``."""
        if self._fda is not None:
            return self._fda.array()
        return self._lam.copy() if self._lam is not None else np.ones(self.horizon)

    def measured_strategy(self) -> sp.csr_matrix:
        """``diag(w) M_N``: row ``t`` is node ``t``, the sum over ``(t - lowbit(t), t]``, weighted
        ``w_t`` (``lambda_t``; exact noise: the integer ``m_t``, see :meth:`_measured_weights`)."""
        return super().measured_strategy()

    def noise_scales(self) -> np.ndarray:
        """``b = Delta_1 / epsilon`` (``sigma = Delta_2 / sqrt(2 rho)``) on every node, rounded up,
        ``Delta`` computed by the plan from the measured rows."""
        return super().noise_scales()

    def _step(self, a: float) -> float:
        t = self.t + 1
        start = t - (t & -t)
        stack = self._stack
        while stack and stack[-1][0] > start:
            stack.pop()
        prev_s, prev_est, prev_var = (stack[-1][1], stack[-1][2], stack[-1][3]) if stack else (0.0, 0.0, 0.0)
        self._s += a
        z = self._noise.draw()  # row t - 1: node t, measured as w_t x(start, t] + z_t
        if self._wint is not None:  # exact: y / q = w (c / q) + z / q in integers, then c~ = y / w
            q = self.quantum
            w = self._wint[t - 1]
            cq, zq = (self._s - prev_s) / q, z / q  # integers (q is a power of two)
            prod = w * cq
            if prod < _EXACT and -_EXACT < zq < _EXACT:
                y = prod + zq  # integers below 2^53: exact in float64
            else:
                y = float(w * int(cq) + int(zq))  # exact in Python integers, then rounded (a function of y)
            c = q * (y / w)
        else:
            w = float(self._w[t - 1])
            c = (w * (self._s - prev_s) + z) / w
        est = prev_est + c
        var = prev_var + float(self._row_var[t - 1])
        stack.append((t, self._s, est, var))
        self.last_noise = c - (self._s - prev_s)  # the noise of the node's estimate (sum units)
        self.last_variance = var
        return est

    def expected_error(self):  # type: ignore[no-untyped-def]
        """:func:`sparsedp.continual.expected_error` for this counter's weights and budget (with a
        privacy unit, the budget of one row: ``epsilon / c`` or ``rho / c^2``, ``c`` the
        :attr:`unit_factor`)."""
        c = self.unit_factor
        return expected_error(self.horizon, self.weights_array(),
                              epsilon=None if self.epsilon is None else self.epsilon / c,
                              rho=None if self.rho is None else self.rho / (c * c))

    def to_release(self) -> Any:
        """:meth:`StreamingCounter.to_release`, its ledger entry and description naming the privacy
        unit (``{"privacy_unit": "one row"}`` when none is declared)."""
        result = super().to_release()
        entry = dict(result.ledger[0], privacy_unit=self.plan.privacy_unit if self.plan is not None else None)
        desc = dict(result.description, privacy_unit=self.privacy_unit.describe())
        return dataclasses.replace(result, ledger=[entry], description=desc)

    # ---- save / restore -------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state.  Secret: it holds the exact prefix sums and the noise key (whoever holds
        the key can recompute every noise value and so subtract it from the published sums)."""
        keys = self._noise.keys
        return {
            "version": _STATE_VERSION,
            "horizon": self.horizon,
            "epsilon": self.epsilon,
            "rho": self.rho,
            "noise": self.noise,
            "weights": self.weights_spec,
            "increments": self.increments,
            "secure": self.secure,
            "privacy_unit": self.privacy_unit.describe(),
            "t": self.t,
            "s": self._s,
            "stack": [list(e) for e in self._stack],
            "last_variance": self.last_variance,
            "noise_key": keys.key.hex(),
            "noise_block": self._noise.block,
            "noise_scheme": NOISE_SCHEME,
            "private": bool(keys.secure),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], rng: Any = None, *, horizon: int | None = None,
                   epsilon: float | None = None, rho: float | None = None, weights: Any = None,
                   increments: str | None = None, secure: bool | None = None,
                   privacy_unit: PrivacyUnit | None = None) -> "ContinualCounter":
        """Rebuild a counter from :meth:`state`; its noise comes from the key saved in the state.

        The noise of every step is a function of the saved key and the step, so rebuilding from the
        same state twice (or from an older copy) and taking a step again with the same increment
        releases the value already published for it, bit for bit, never a second independent draw
        (with another increment, the same noise on another sum: the change is published exactly).  ``rng`` must therefore be
        ``None`` for a current state (:class:`SparseDPError` otherwise: it would not be used).

        Every parameter given (not ``None``) must equal the state's, else :class:`SparseDPError`
        naming it and both values: a resume never silently changes the budget, the weights or the
        increment domain of the release it continues.  The stored sums must lie in the increment
        domain (:class:`InputBoundError` otherwise).  Nothing is charged.

        States written before the noise was keyed (versions 1 to 3) hold no key: they resume with a
        new key (fresh, or from ``rng``: an integer seed combined with the saved step ``t``) and a
        :class:`UserWarning`, since a replay of such a file cannot reproduce its published steps;
        save the resumed counter at once so that later resumes read the key.
        """
        try:
            version = state["version"]
            if version not in (1, 2, 3, _STATE_VERSION):
                raise SparseDPError(f"unknown counter state version {version!r}")
            stored = {key: state.get(key) for key in RESUME_PARAMETERS}
            stored["increments"] = state.get("increments", "counts")  # version 1: counts
            stored["secure"] = state.get("secure", False)  # versions 1 and 2: float noise
            stored["privacy_unit"] = state.get("privacy_unit", ONE_ROW.describe())  # older states: one row
            _check_resume(stored, dict(horizon=horizon, epsilon=epsilon, rho=rho, weights=weights,
                                       increments=increments, secure=secure, privacy_unit=privacy_unit))
            t = _as_int(state["t"], "t")
            keys, block = _saved_keys(state, version, rng, t)
            obj = cls(stored["horizon"], epsilon=stored["epsilon"], rho=stored["rho"], weights=stored["weights"],
                      noise=state["noise"], rng=keys, increments=stored["increments"], secure=stored["secure"],
                      privacy_unit=_unit_from_description(stored["privacy_unit"]), _noise_block=block)
            # versions 1 and 2 stored the variances in units of the (uniform) node noise variance
            unit = 1.0 if version >= 3 else obj.unit_variance
            stack = [(_as_int(e[0], "node"), float(e[1]), float(e[2]), float(e[3]) * unit) for e in state["stack"]]
            s = float(state["s"])
            last_variance = float(state.get("last_variance", float("nan")))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            if isinstance(exc, SparseDPError):
                raise
            raise SparseDPError(f"malformed counter state: {exc!r}") from exc
        _check_stack(obj, t, s, stack)
        obj.t, obj._s, obj._stack, obj._total = t, s, stack, s
        obj._noise.skip_to(t)  # the rows of published steps are never drawn again
        obj.last_variance = last_variance
        return obj

    def save(self, path: str | Path) -> None:
        """Write :meth:`state` as JSON to ``path``, atomically and readable by its owner only (``0600``).

        The JSON goes to a temporary file that :func:`tempfile.mkstemp` creates with mode ``0600`` (and
        ``O_EXCL``) in the target's directory; it is flushed to disk and renamed over ``path`` with
        :func:`os.replace`, so ``path`` is never partially written nor, even for an instant, readable
        by others (an older, more open file at ``path`` is replaced, not rewritten in place).
        """
        write_private_atomic(Path(path), json.dumps(self.state()).encode())

    @classmethod
    def load(cls, path: str | Path, rng: Any = None, **expected: Any) -> "ContinualCounter":
        """Counterpart of :meth:`save`; ``expected`` are :meth:`from_state`'s parameter checks
        (``horizon=``, ``epsilon=``, ``rho=``, ``weights=``, ``increments=``, ``secure=``,
        ``privacy_unit=``).  Warns if the file is
        readable or writable by others than its owner (it holds exact sums)."""
        unknown = set(expected) - set(RESUME_PARAMETERS)
        if unknown:
            raise SparseDPError(f"unknown resume parameter(s) {sorted(unknown)}; expected {RESUME_PARAMETERS}")
        try:
            with open(path, "rb") as fh:
                if stat.S_IMODE(os.fstat(fh.fileno()).st_mode) & 0o077:
                    warnings.warn(f"counter state {path} is accessible to other users; it holds exact running "
                                  "sums (it is rewritten with mode 0600 at the next save)", stacklevel=2)
                state = json.loads(fh.read())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SparseDPError(f"cannot read counter state {path}: {exc}") from exc
        if not isinstance(state, dict):
            raise SparseDPError(f"counter state {path} is not a JSON object")
        return cls.from_state(state, rng, **expected)


def noise_keys(rng: Any) -> KeyedRandomBits:
    """The key of a counter's noise for the constructor's ``rng``: ``None`` (or a secure
    :class:`~sparsedp.noise.SecureRandomBits`): 256 fresh bits from the operating system; an ``int``
    seed or a numpy Generator (or a seeded ``SecureRandomBits``): derived from it, reproducible and
    NOT private; a :class:`~sparsedp.noise.KeyedRandomBits` (a restored state's key): itself."""
    if isinstance(rng, KeyedRandomBits):
        return rng
    if rng is None:
        return KeyedRandomBits.new()
    if isinstance(rng, SecureRandomBits):
        return KeyedRandomBits(rng.bytes(KeyedRandomBits.KEY_BYTES), secure=rng.secure)
    if isinstance(rng, (int, np.integer, np.random.Generator)):
        return KeyedRandomBits.from_seed(rng)
    raise SparseDPError(f"rng must be None, an int seed or a numpy Generator, got {type(rng).__name__}")


def _saved_keys(state: dict[str, Any], version: int, rng: Any, t: int) -> tuple[KeyedRandomBits, int | None]:
    """The noise key and block size a state resumes with (see :meth:`ContinualCounter.from_state`)."""
    if version == _STATE_VERSION:
        if rng is not None:
            raise SparseDPError("a restored counter draws its noise from the key saved in its state (a replayed "
                                "step then repeats its published value); rng= is not used, pass rng=None")
        if state["noise_scheme"] != NOISE_SCHEME:
            raise SparseDPError(f"the counter state's noise was derived by scheme {state['noise_scheme']!r}, this "
                                f"version derives it by scheme {NOISE_SCHEME}: a resume could not repeat the "
                                "published steps' noise; resume it with the version that wrote it")
        key, private = state["noise_key"], state["private"]
        if not isinstance(key, str) or len(key) != 2 * KeyedRandomBits.KEY_BYTES or not isinstance(private, bool):
            raise SparseDPError("malformed counter state: noise_key must be 64 hex digits and private a boolean")
        block = _as_int(state["noise_block"], "noise_block")
        if block < 1:
            raise SparseDPError("malformed counter state: noise_block must be >= 1")
        return KeyedRandomBits(bytes.fromhex(key), secure=private), block
    warnings.warn(f"counter state version {version} holds no noise key: it resumes with a new key, so resuming "
                  "this file again would draw its next step with independent noise; save the counter now and "
                  "resume from the new file only", UserWarning, stacklevel=4)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = np.random.default_rng([int(rng), t])
    return noise_keys(rng), None


def write_private_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and readable by its owner only: a temporary file that
    :func:`tempfile.mkstemp` creates with mode ``0600`` (and ``O_EXCL``) in the target's directory,
    flushed and fsynced, then renamed over ``path`` (:func:`os.replace`), so ``path`` is never
    partially written nor, even for an instant, readable by others."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _same(stored: Any, given: Any) -> bool:
    """Whether a stored resume parameter equals the given one (numbers by value, lists elementwise)."""
    if isinstance(stored, (list, tuple, np.ndarray)) or isinstance(given, (list, tuple, np.ndarray)):
        if isinstance(stored, str) or isinstance(given, str):
            return False
        a, b = np.asarray(stored, dtype=np.float64), np.asarray(given, dtype=np.float64)
        return a.shape == b.shape and bool(np.all(a == b))
    if isinstance(stored, (int, float)) and isinstance(given, (int, float, np.number)) \
            and not isinstance(stored, bool) and not isinstance(given, (bool, np.bool_)):
        return float(stored) == float(given)
    return stored == given


def _canonical(key: str, value: Any) -> Any:
    if key == "privacy_unit" and isinstance(value, PrivacyUnit):
        return value.describe()
    return "uniform" if key == "weights" and value == "unweighted" else value


def _unit_from_description(desc: Any) -> PrivacyUnit | None:
    """The :class:`PrivacyUnit` a state records (:meth:`PrivacyUnit.describe`); ``None``: one row."""
    if not isinstance(desc, dict) or "privacy_unit" not in desc:
        raise SparseDPError(f"malformed counter state: privacy_unit {desc!r}")
    if desc["privacy_unit"] == "one row" and len(desc) == 1:
        return None
    bounds = {k: desc[k] for k in ("max_rows", "max_groups", "max_rows_per_group") if k in desc}
    if set(desc) - set(bounds) - {"privacy_unit"}:
        raise SparseDPError(f"malformed counter state: privacy_unit {desc!r}")
    return PrivacyUnit(desc["privacy_unit"], **bounds)


def _check_resume(stored: dict[str, Any], given: dict[str, Any]) -> None:
    """Raise :class:`SparseDPError` naming the first given parameter that differs from the state's."""
    for key in RESUME_PARAMETERS:
        value = given.get(key)
        if value is not None and not _same(_canonical(key, stored[key]), _canonical(key, value)):
            raise SparseDPError(
                f"the saved counter state has {key}={stored[key]!r} but {key}={value!r} was given: a resume "
                f"must use the parameters of the run it continues (start a new state file for new parameters)"
            )


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != math.floor(value):
        raise SparseDPError(f"malformed counter state: {name} must be an integer, got {value!r}")
    return int(value)


def _check_stack(obj: ContinualCounter, t: int, s: float, stack: list[tuple[int, float, float, float]]) -> None:
    """The saved step, running sum and chain must be mutually consistent and inside the domain."""
    if not 0 <= t <= obj.horizon or (t > 0 and (not stack or stack[-1][0] != t)) or (t == 0 and stack):
        raise SparseDPError("inconsistent counter state: step and stack do not match")
    nodes = [e[0] for e in stack]
    if any(b <= a for a, b in zip(nodes, nodes[1:])) or (nodes and nodes[0] < 1):
        raise SparseDPError("inconsistent counter state: the chain's nodes are not increasing")
    values = [s] + [v for e in stack for v in e[1:]]
    if not all(math.isfinite(v) for v in values):
        raise SparseDPError("inconsistent counter state: non-finite values")
    if stack and stack[-1][1] != s:
        raise SparseDPError("inconsistent counter state: the running sum and the chain disagree")
    sums = [s] + [e[1] for e in stack]
    if obj.increments == "unit":
        bad = [v for v in sums if not 0.0 <= v <= t]
    else:
        bad = [v for v in sums if v < 0 or v != math.floor(v) or v > MAX_MAGNITUDE]
    if bad:
        raise InputBoundError(f"counter state holds running sums {bad[:3]} outside the increment domain "
                              f"{obj.increments!r} (tampered or written by another tool)")
