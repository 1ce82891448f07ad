"""Noise samplers: fast floating-point Laplace/Gaussian and exact, fast discrete Laplace/Gaussian.

Floating-point samplers (``secure=False``)
    :func:`laplace` draws ``Lap(0, b)`` with density ``exp(-|z|/b) / (2b)`` and variance ``2 b^2``;
    :func:`gaussian` draws ``N(0, sigma^2)``.  Both use a :class:`numpy.random.Generator` and are
    fast, but a textbook floating-point Laplace sample does not satisfy differential privacy:
    the set of doubles it can output depends on the secret value it is added to, so a single
    output can reveal that value (Mironov, "On significance of the least significant bits for
    differential privacy", CCS 2012).

Exact integer samplers (``secure=True``)
    :func:`discrete_laplace` draws ``P(k) = (1-q)/(1+q) q^|k|``, ``q = exp(-1/t)`` (the two-sided
    geometric distribution; Inusah and Kozubowski 2006; Ghosh, Roughgarden and Sundararajan 2009)
    with variance ``2 q / (1-q)^2``.  :func:`discrete_gaussian` draws
    ``P(k) ~ exp(-k^2 / (2 sigma^2))`` by Canonne, Kamath and Steinke, "The discrete Gaussian for
    differential privacy" (NeurIPS 2020), Algorithm 3.  Their outputs are integers drawn
    *exactly* from these distributions from uniform random bits; no floating-point number takes
    part in any decision that affects an output.  By default the bits come from a
    cryptographically secure generator seeded by the operating system -- OpenSSL's CTR_DRBG
    (:func:`ssl.RAND_bytes`), or :func:`os.urandom` with ``SecureRandomBits(source="os")`` --
    through :class:`SecureRandomBits` (see there for what "secure" means and why).

How the exact samplers work (and why they are fast)
    *Inversion with lazily read bits.*  A categorical variable with ``K`` categories and CDF
    boundaries ``0 < b_0 < b_1 < ... < b_{K-2} < 1`` is the number of boundaries below a uniform
    ``U`` in ``[0, 1)``.  ``U`` is read lazily as a bit string ``0.u_1 u_2 ...``: with the first
    16 bits ``w``, ``U`` lies in ``[w, w+1) / 2^16``, and if no boundary falls in that bucket the
    category is known already.  A 65536-entry table gives it with one lookup.  Otherwise 48 more
    bits make a 64-bit prefix ``u`` that is compared with ``c_i = floor(b_i 2^64)``: ``c_i < u``
    means ``b_i < U``, ``c_i > u`` means ``b_i > U``.  Only if ``c_i == u`` (probability about
    ``2^-64`` per element) are further 64-bit blocks of ``U`` compared with the next binary
    digits of ``b_i``, computed to as many digits as needed.  (Reading random bits only as far
    as the comparison needs is the idea of Knuth and Yao, 1976.)  The constants are computed
    with :mod:`decimal` *interval arithmetic* (outward rounding; ``Decimal.exp`` is correctly
    rounded), and a floor is accepted only when both ends of the interval agree, otherwise the
    precision is raised.  This is exact: the output distribution is the mathematical one.

    *Decomposition of the discrete Laplace.*  ``X = 0`` with probability ``(1-q)/(1+q)``,
    otherwise ``X = +-(1 + G)`` with a fair sign and ``G ~ Geometric(q)``,
    ``P(G = k) = (1-q) q^k``.  Because ``q^k = prod_j (q^(2^j))^(bit_j(k))``, the binary digits
    of ``G`` are independent, ``P(bit_j = 1) = q^(2^j) / (1 + q^(2^j)) = 1 / (1 + exp(2^j / t))``;
    so ``G = L + 2^g H`` with independent ``L = G mod 2^g`` (a truncated geometric, sampled in
    groups of at most 8 bits, each group again independent) and ``H = G >> g ~ Geometric(q^(2^g))``.
    The main table holds the categories ``0``, ``+-(1 + 2^g h)`` for ``h < T`` and two overflow
    categories ``+-(H >= T)``; on overflow the memorylessness of the geometric law gives
    ``H = T + H'`` with a fresh ``H'``.  ``g`` and ``T`` are chosen so that the main table has at
    most about 2048 boundaries (few flagged buckets) and overflows occur with probability
    about ``2^-10``.  Typical cost: 2 random bytes, one table lookup and a handful of numpy
    passes per sample.

    *Discrete Gaussian.*  Candidates ``Y`` are discrete Laplace with ``t = floor(sigma) + 1`` and
    are accepted with probability ``a(|Y|) = exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``
    (Canonne, Kamath, Steinke 2020, Alg. 3).  A 64-bit uniform ``u`` is compared with
    pre-computed exact lower/upper bounds of ``a`` on a grid (``a`` is unimodal in ``|Y|``), and
    only the rare undecided candidates get the exact constant (and, on a 64-bit tie, more bits).

Reproducible (not secure) bits
    ``rng`` may be an ``int`` seed or a :class:`numpy.random.Generator`: the exact samplers then
    read their bits from that generator (``SecureRandomBits(generator)``).  This is for tests and
    reproducible examples only: a seeded PRNG is predictable and gives no privacy.

Grid snapping
    The exact samplers add *integers*.  To protect real-valued answers, snap them to a grid
    ``gamma`` with :func:`snap_to_grid` (``k = round(v / gamma)``), add integer noise whose scale
    is the sensitivity *in grid units*, and report ``gamma * (k + noise)``.  For integer data
    and integer query coefficients with ``gamma = 1`` (or ``gamma`` dividing every value),
    snapping is exact and the sensitivity is unchanged.  Otherwise rounding can move each
    touched coordinate by one more unit: ``|round(a) - round(b)| <= |a - b| + 1``, so an L1
    sensitivity ``Delta`` over at most ``m`` touched coordinates becomes at most
    ``Delta / gamma + m`` grid units (L2: ``sqrt(sum_i (|d_i| / gamma + 1)^2)``).
"""

from __future__ import annotations

import math
import os
import threading
import hashlib
from collections import OrderedDict
from decimal import (
    MAX_EMAX,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_FLOOR,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    InvalidOperation,
)
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from .errors import InvalidPrivacyParameterError, NonFiniteInputError, ShapeError, SparseDPError
from .validation import check_positive

__all__ = [
    "as_generator",
    "SecureRandomBits",
    "KeyedRandomBits",
    "laplace",
    "gaussian",
    "discrete_laplace",
    "discrete_gaussian",
    "noise",
    "snap_to_grid",
    "laplace_variance",
    "discrete_laplace_variance",
    "discrete_gaussian_variance",
]

Size = int | tuple[int, ...] | None

# --------------------------------------------------------------------------------------------
# Sources of randomness
# --------------------------------------------------------------------------------------------


def as_generator(rng: None | int | np.random.Generator = None) -> np.random.Generator:
    """Return a :class:`numpy.random.Generator` for ``rng``.

    ``None`` gives ``np.random.default_rng()`` (seeded from OS entropy), an ``int`` gives
    ``np.random.default_rng(rng)`` (the same seed gives the same draws) and a ``Generator`` is
    returned as is.  Anything else raises :class:`SparseDPError`.
    """
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        try:
            return np.random.default_rng(int(rng))
        except ValueError as exc:
            raise SparseDPError(f"invalid seed {rng!r}: {exc}") from exc
    raise SparseDPError(f"rng must be None, an int seed or a numpy Generator, got {type(rng).__name__}")


try:  # Python built without OpenSSL: every secure byte comes from os.urandom
    import ssl as _ssl
except ImportError:  # pragma: no cover
    _ssl = None  # type: ignore[assignment]


def _openssl_bytes(n: int) -> bytes:
    """``n`` bytes from OpenSSL's CSPRNG (``RAND_bytes``), or ``os.urandom`` where it is unavailable.

    OpenSSL 1.1.1+ and 3.x serve ``RAND_bytes`` from a NIST SP 800-90A CTR_DRBG (AES-256 in
    counter mode) that is seeded from the operating system (``getrandom(2)`` on Linux), reseeded
    periodically and after a ``fork()`` (it compares the process id), and is thread-safe.
    """
    if _ssl is not None:
        try:
            if n <= _SSL_MAX:
                return _ssl.RAND_bytes(n)
            return b"".join(_ssl.RAND_bytes(min(_SSL_MAX, n - a)) for a in range(0, n, _SSL_MAX))  # C int
        except _ssl.SSLError:  # pragma: no cover - "PRNG not seeded": fall back to the kernel
            pass
    return os.urandom(n)


_SSL_MAX = 1 << 30  # RAND_bytes takes a C int: larger requests are read in pieces


_SOURCES: dict[str, Callable[[int], bytes]] = {
    # looked up at call time, so that tests can monkeypatch os.urandom / ssl.RAND_bytes
    "openssl": lambda n: _openssl_bytes(n),
    "os": lambda n: os.urandom(n),
}


class SecureRandomBits:
    """A source of uniform random bytes for the exact samplers.

    ``SecureRandomBits()`` (``source="openssl"``, the default) reads a cryptographically secure
    pseudo-random generator (CSPRNG) seeded from the operating system: OpenSSL's ``RAND_bytes``
    (:func:`ssl.RAND_bytes`; a NIST SP 800-90A CTR_DRBG with AES-256, seeded from
    ``getrandom(2)``, reseeded periodically and in a forked child), falling back to
    :func:`os.urandom` if Python has no OpenSSL.  ``SecureRandomBits(source="os")`` reads
    :func:`os.urandom` (``getrandom(2)``: the kernel's ChaCha20 CSPRNG) for every byte.

    Both are *secure* in the sense the privacy proofs need: the bytes are computationally
    indistinguishable from independent uniform bytes for anyone who does not hold the generator's
    state, which never leaves the process (or the kernel), so outputs cannot be predicted from
    earlier outputs the way a PRNG state such as numpy's PCG64 or Philox (not cryptographic) can.
    The kernel's ``/dev/urandom`` is itself a CSPRNG seeded from hardware entropy; OpenSSL's DRBG
    is the same construction one level up (256-bit seed from the kernel, AES-256-CTR output) and is
    what TLS keys are made from.  It is chosen as the default because it is about 15 times faster
    than one ``getrandom`` system call per MiB (4 GB/s against 0.15-0.3 GB/s here), which is most of
    the exact samplers' cost at large scales.  opendp likewise fills its sampler bits from a
    thread-local CTR_DRBG seeded from the OS (the Rust ``drbg`` crate; older releases called
    OpenSSL's ``RAND_bytes``), diffprivlib from :class:`secrets.SystemRandom` (``os.urandom``).  Python
    exposes OpenSSL's *public* DRBG only (``RAND_priv_bytes`` is not reachable), so the process's
    other OpenSSL users (e.g. TLS nonces) draw from the same generator; predicting one from the
    other would require breaking AES-256.  Use ``source="os"`` to keep every byte from the kernel.

    Small requests are served from a buffer of ``chunk_size`` bytes that is used once, guarded by a
    lock and discarded in a forked child (checked via the process id), so two processes never
    share random bytes.

    ``SecureRandomBits(generator)`` draws the bytes from a :class:`numpy.random.Generator`
    instead: reproducible, for tests and examples only, and **not secure** (the generator state
    determines every output).

    Arrays returned by :meth:`uint16` and :meth:`uint64` are read-only views of fresh bytes in
    native byte order (any fixed mapping of uniform bytes to integers is uniform).
    """

    def __init__(self, generator: np.random.Generator | None = None, chunk_size: int = 1 << 20,
                 source: str = "openssl") -> None:
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise SparseDPError("SecureRandomBits takes a numpy Generator or nothing")
        if int(chunk_size) < 64:
            raise SparseDPError("chunk_size must be at least 64 bytes")
        if source not in _SOURCES:
            raise SparseDPError(f"source must be one of {sorted(_SOURCES)}, got {source!r}")
        self._gen = generator
        self._source = source
        self._read = _SOURCES[source]
        self._chunk = int(chunk_size)
        self._buf = b""
        self._pos = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def secure(self) -> bool:
        """True when the bytes come from a CSPRNG (OpenSSL's or the kernel's) rather than a seeded generator."""
        return self._gen is None

    @property
    def source(self) -> str:
        """``"openssl"``, ``"os"`` or ``"numpy"`` (a seeded generator: not secure)."""
        return "numpy" if self._gen is not None else self._source

    def __repr__(self) -> str:
        src = {"openssl": "OpenSSL RAND_bytes", "os": "os.urandom"}.get(self.source, "numpy Generator (NOT secure)")
        return f"SecureRandomBits({src})"

    def bytes(self, n: int) -> bytes:
        """Return ``n`` fresh uniform random bytes."""
        n = int(n)
        if n <= 0:
            return b""
        if self._gen is not None:
            return self._gen.bytes(n)
        if n >= self._chunk:
            return self._read(n)
        with self._lock:
            pid = os.getpid()
            if pid != self._pid:  # forked: never reuse the parent's buffered bytes
                self._buf, self._pos, self._pid = b"", 0, pid
            if len(self._buf) - self._pos < n:
                self._buf, self._pos = self._read(self._chunk), 0
            out = self._buf[self._pos : self._pos + n]
            self._pos += n
            return out

    def uint16(self, n: int) -> np.ndarray:
        """``n`` independent uniform integers in ``[0, 2^16)`` (read-only uint16 array)."""
        return np.frombuffer(self.bytes(2 * int(n)), dtype=np.uint16)

    def uint64(self, n: int) -> np.ndarray:
        """``n`` independent uniform integers in ``[0, 2^64)`` (read-only uint64 array)."""
        return np.frombuffer(self.bytes(8 * int(n)), dtype=np.uint64)


class KeyedRandomBits(SecureRandomBits):
    """Random bytes that are a deterministic function of a secret key and a stream index.

    ``KeyedRandomBits(key, index)`` serves the exact samplers the bytes of SHAKE-256 (FIPS 202, an
    extendable-output function) applied to ``key``, ``index`` and a request counter: request ``r``
    of ``n`` bytes is ``SHAKE-256(domain || key || index || r)`` truncated to ``n`` bytes.  With a
    256-bit ``key`` drawn from the operating system (:meth:`new`) and kept secret, these bytes are
    computationally indistinguishable from uniform ones, like :class:`SecureRandomBits`' (SHAKE-256
    keyed by a secret is a pseudo-random function, the construction of KMAC), and they are the
    *same* every time the same ``(key, index)`` is read with the same requests.  That is what a
    counter restored from a saved state needs: the noise of a row is a function of the key and the
    row, so a replay of a published step reproduces the value already published instead of
    releasing the step again with fresh noise.  :meth:`at` gives the stream of another index under
    the same key.

    ``secure=False`` marks a key derived from a user seed (:meth:`from_seed`): reproducible and NOT
    private (:attr:`secure` is then false, as for ``SecureRandomBits(generator)``).
    """

    KEY_BYTES = 32
    _DOMAIN = b"sparsedp keyed noise v1\0"

    def __init__(self, key: bytes, index: int = 0, secure: bool = True) -> None:
        super().__init__()
        if not isinstance(key, (bytes, bytearray)) or len(key) != self.KEY_BYTES:
            raise SparseDPError(f"a noise key must be {self.KEY_BYTES} bytes")
        if isinstance(index, bool) or not 0 <= int(index) < 2**64:
            raise SparseDPError(f"a noise stream index must be an integer in [0, 2^64), got {index!r}")
        self._key, self._index, self._keyed_secure, self._requests = bytes(key), int(index), bool(secure), 0

    @classmethod
    def new(cls) -> "KeyedRandomBits":
        """A fresh secret key: 256 bits from the operating system (:func:`os.urandom`)."""
        return cls(_SOURCES["os"](cls.KEY_BYTES))

    @classmethod
    def from_seed(cls, seed: int | np.random.Generator) -> "KeyedRandomBits":
        """A key derived from a user seed (an ``int``: :class:`numpy.random.SeedSequence` of it;
        a Generator: 32 of its bytes): reproducible, so NOT private (``secure=False``)."""
        if isinstance(seed, np.random.Generator):
            return cls(seed.bytes(cls.KEY_BYTES), secure=False)
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, (bool, np.bool_)):
            raise SparseDPError(f"a seed must be an int or a numpy Generator, got {type(seed).__name__}")
        try:
            words = np.random.SeedSequence(int(seed)).generate_state(cls.KEY_BYTES // 4, np.uint32)
        except ValueError as exc:
            raise SparseDPError(f"invalid seed {seed!r}: {exc}") from exc
        return cls(words.astype("<u4").tobytes(), secure=False)

    @property
    def key(self) -> bytes:
        """The secret key (whoever holds it can recompute every noise value drawn from it)."""
        return self._key

    @property
    def secure(self) -> bool:
        """True for a key from the operating system, False for one derived from a seed."""
        return self._keyed_secure

    @property
    def source(self) -> str:
        return "keyed" if self._keyed_secure else "numpy"

    def __repr__(self) -> str:
        return f"KeyedRandomBits(index={self._index}{'' if self._keyed_secure else ', seeded: NOT secure'})"

    def at(self, index: int) -> "KeyedRandomBits":
        """The byte stream of ``index`` under the same key (read from its first request)."""
        return KeyedRandomBits(self._key, index, self._keyed_secure)

    def generator(self) -> np.random.Generator:
        """A numpy Generator determined by ``(key, index)``, for the float samplers (``secure=False``
        noise is an opt-out that leaks through its low bits anyway)."""
        seq = np.random.SeedSequence(int.from_bytes(self._key, "little"), spawn_key=(self._index,))
        return np.random.Generator(np.random.PCG64(seq))

    def bytes(self, n: int) -> bytes:
        """The next ``n`` bytes of this ``(key, index)`` stream."""
        n = int(n)
        if n <= 0:
            return b""
        with self._lock:
            r = self._requests
            self._requests += 1
        msg = self._DOMAIN + self._key + self._index.to_bytes(8, "little") + r.to_bytes(8, "little")
        return hashlib.shake_256(msg).digest(n)


_DEFAULT_BITS = SecureRandomBits()


def _bits_from(rng: Any) -> SecureRandomBits:
    """Map the ``rng`` argument of the exact samplers to a byte source (see module docstring)."""
    if rng is None:
        return _DEFAULT_BITS
    if isinstance(rng, SecureRandomBits):
        return rng
    return SecureRandomBits(as_generator(rng))


# --------------------------------------------------------------------------------------------
# Parameter checks
# --------------------------------------------------------------------------------------------

MAX_DISCRETE_SCALE = float(2**40)
_MAX_DISCRETE_SCALE = MAX_DISCRETE_SCALE


def _normalize_size(size: Size) -> tuple[int, ...] | None:
    if size is None:
        return None
    if isinstance(size, (int, np.integer)):
        size = (int(size),)
    try:
        shape = tuple(int(s) for s in size)
    except TypeError as exc:
        raise ShapeError(f"size must be an int, a tuple of ints or None, got {size!r}") from exc
    if any(s < 0 for s in shape):
        raise ShapeError(f"size must be non-negative, got {size!r}")
    return shape


def _check_scale(scale: Any, size: Size, name: str, upper: float | None = None) -> tuple[Any, tuple[int, ...]]:
    """Validate a scale (float or array, finite and > 0) and return it with the output shape.

    Returns ``(float, shape)`` for a scalar scale and ``(float64 array broadcast to shape, shape)``
    for an array.  Raises :class:`InvalidPrivacyParameterError` or :class:`ShapeError`; nothing is
    drawn before this check.
    """
    shape = _normalize_size(size)
    if np.ndim(scale) == 0 and not isinstance(scale, np.ndarray):
        s = check_positive(scale, name)
        if upper is not None and s > upper:
            raise InvalidPrivacyParameterError(f"{name} must be at most {upper:g} for the exact sampler, got {s!r}")
        return s, (() if shape is None else shape)
    try:
        arr = np.asarray(scale, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidPrivacyParameterError(f"{name} must be positive numbers: {exc}") from exc
    if arr.size and not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
        raise InvalidPrivacyParameterError(f"{name} must be finite and > 0 everywhere")
    if upper is not None and arr.size and float(arr.max()) > upper:
        raise InvalidPrivacyParameterError(f"{name} must be at most {upper:g} for the exact sampler")
    if shape is None:
        shape = arr.shape
    try:
        arr = np.broadcast_to(arr, shape)
    except ValueError as exc:
        raise ShapeError(f"{name} of shape {arr.shape} does not broadcast to size {shape}") from exc
    return arr, shape


# --------------------------------------------------------------------------------------------
# Floating-point samplers
# --------------------------------------------------------------------------------------------


def laplace(scale: float | np.ndarray, size: Size = None, rng: Any = None) -> np.ndarray:
    """Floating-point Laplace noise ``Lap(0, b)``: density ``exp(-|z|/b) / (2b)``, variance ``2 b^2``.

    ``scale`` (``b``) may be an array broadcast against ``size`` (e.g. one scale per row); it
    must be finite and > 0 everywhere (:class:`InvalidPrivacyParameterError`, raised before any
    draw).  ``rng`` is anything :func:`as_generator` accepts.  Not safe against Mironov's attack;
    use :func:`discrete_laplace` for that.
    """
    b, shape = _check_scale(scale, size, "scale")
    gen = as_generator(rng)
    return np.asarray(gen.laplace(0.0, b, shape), dtype=np.float64)


def gaussian(sigma: float | np.ndarray, size: Size = None, rng: Any = None) -> np.ndarray:
    """Floating-point Gaussian noise ``N(0, sigma^2)`` (variance ``sigma^2``); see :func:`laplace`."""
    s, shape = _check_scale(sigma, size, "sigma")
    gen = as_generator(rng)
    return np.asarray(gen.normal(0.0, s, shape), dtype=np.float64)


def laplace_variance(scale: float) -> float:
    """Variance ``2 b^2`` of ``Lap(0, b)``."""
    b = check_positive(scale, "scale")
    return 2.0 * b * b


def discrete_laplace_variance(scale: float) -> float:
    """Variance ``2 q / (1 - q)^2``, ``q = exp(-1/t)``, of the discrete Laplace with scale ``t``."""
    t = check_positive(scale, "scale")
    q = math.exp(-1.0 / t)
    return 2.0 * q / (-math.expm1(-1.0 / t)) ** 2


def discrete_gaussian_variance(sigma: float) -> float:
    """Variance ``sum_k k^2 P(k)`` of ``P(k) ~ exp(-k^2 / (2 sigma^2))`` on the integers (below
    ``sigma^2``); the pmf is summed over ``|k| <= 40 sigma + 10``, where the tail is below 1e-300."""
    s = check_positive(sigma, "sigma")
    if s >= 3.0:
        # sigma^2 minus a theta-function correction below 8 pi^2 sigma^4 e^{-2 pi^2 sigma^2}
        # (< 1e-70 sigma^2 here): sigma^2 is the variance to double precision, without summing
        # 80 sigma terms (which at sigma ~ 1e9 would need hundreds of GiB)
        return s * s
    K = int(math.ceil(40 * s + 10))
    k = np.arange(-K, K + 1, dtype=np.float64)
    w = np.exp(-(k * k) / (2 * s * s))
    return float((w * k * k).sum() / w.sum())


# --------------------------------------------------------------------------------------------
# Exact constants: decimal interval arithmetic
# --------------------------------------------------------------------------------------------

Interval = tuple[Decimal, Decimal]
_LOG10_2 = 0.30103


class _IA:
    """Interval arithmetic with outward rounding on :class:`~decimal.Decimal` (``digits`` digits).

    Every operation returns ``(lo, hi)`` with ``lo <= true value <= hi``.  All quantities here
    are non-negative (probabilities and exponentials): ``sub`` is only used for differences known
    to be positive (``1 - exp(-z)``, ``z > 0``) and clamps its lower end at 0, so ``mul`` and
    ``div`` only ever see non-negative lower ends (a zero divisor raises, and the caller retries
    at a higher precision).
    ``exp`` uses ``Decimal.exp``, which is correctly rounded (error <= 1/2 ulp); two extra ulps
    of widening make the bounds safe.
    """

    __slots__ = ("dn", "up", "ne")

    def __init__(self, digits: int) -> None:
        kw = dict(prec=int(digits), Emin=MIN_EMIN, Emax=MAX_EMAX)
        self.dn = Context(rounding=ROUND_FLOOR, **kw)
        self.up = Context(rounding=ROUND_CEILING, **kw)
        self.ne = Context(rounding=ROUND_HALF_EVEN, **kw)

    def const(self, f: Fraction | int) -> Interval:
        f = Fraction(f)
        n, d = Decimal(f.numerator), Decimal(f.denominator)
        return self.dn.divide(n, d), self.up.divide(n, d)

    def exp_neg(self, x: Interval) -> Interval:
        """``exp(-x)`` (decreasing in ``x``)."""
        lo = self.ne.exp(x[1].copy_negate())
        hi = self.ne.exp(x[0].copy_negate())
        lo = self.dn.next_minus(self.dn.next_minus(lo))
        hi = self.up.next_plus(self.up.next_plus(hi))
        if lo < 0:
            lo = Decimal(0)
        return lo, hi

    def mul(self, a: Interval, b: Interval) -> Interval:
        return self.dn.multiply(a[0], b[0]), self.up.multiply(a[1], b[1])

    def div(self, a: Interval, b: Interval) -> Interval:
        return self.dn.divide(a[0], b[1]), self.up.divide(a[1], b[0])

    def add(self, a: Interval, b: Interval) -> Interval:
        return self.dn.add(a[0], b[0]), self.up.add(a[1], b[1])

    def sub(self, a: Interval, b: Interval) -> Interval:
        """``a - b`` for a difference known to be positive (lower end clamped at 0)."""
        lo = self.dn.subtract(a[0], b[1])
        return (lo if lo > 0 else Decimal(0)), self.up.subtract(a[1], b[0])

    def floor_scaled(self, x: Interval, nbits: int) -> int | None:
        """``floor(v 2^nbits)`` for the value ``v`` in ``x``, known to lie in ``(0, 1)``; None if ambiguous."""
        m = 1 << nbits
        dm = Decimal(m)
        lo = math.floor(self.dn.multiply(x[0], dm))
        hi = math.floor(self.up.multiply(x[1], dm))
        lo = min(max(lo, 0), m - 1)
        hi = min(max(hi, 0), m - 1)
        return lo if lo == hi else None

    def ceil_scaled(self, x: Interval, nbits: int) -> int:
        """An integer ``>= v 2^nbits`` for every ``v`` in ``x`` (the ceiling of the upper end)."""
        return math.ceil(self.up.multiply(x[1], Decimal(1 << nbits)))

    def floor_lower(self, x: Interval, nbits: int) -> int:
        """An integer ``<= v 2^nbits`` for every ``v`` in ``x`` (the floor of the lower end, >= 0)."""
        return max(math.floor(self.dn.multiply(x[0], Decimal(1 << nbits))), 0)


def _digits_for(nbits: int, extra: int = 0) -> int:
    return int(math.ceil(nbits * _LOG10_2)) + 25 + max(int(extra), 0)


def _exact_floor(value: Callable[[_IA], Interval], nbits: int, extra: int = 0) -> int:
    """``floor(v 2^nbits)`` exactly, for ``v`` in ``(0, 1)`` given as an interval function of the precision."""
    digits = _digits_for(nbits, extra)
    for _ in range(24):
        ia = _IA(digits)
        try:
            f = ia.floor_scaled(value(ia), nbits)
        except (DivisionByZero, InvalidOperation):
            f = None
        if f is not None:
            return f
        digits *= 2
    raise SparseDPError("could not resolve an exact constant (value too close to a dyadic rational)")


def _u_below(chunks: list[int], floor_bits: Callable[[int], int], bits: SecureRandomBits) -> bool:
    """Decide ``U < b`` when the first 64-bit block of ``U`` equals ``floor(b 2^64)`` (a tie).

    ``chunks`` holds the 64-bit blocks of ``U`` read so far (``chunks[0]`` is the tied block);
    more are read from ``bits`` as needed and appended, so that one ``U`` can be compared with
    several constants.  ``floor_bits(n)`` must return ``floor(b 2^n)`` exactly.  With ``r``
    blocks ``U`` lies in ``[V, V + 1) / 2^(64 r)`` and ``b`` in ``[B, B + 1) / 2^(64 r)``, so
    ``V < B`` gives ``U < b``, ``V > B`` gives ``U > b`` and ``V == B`` needs another block.
    """
    r = 1
    while True:
        r += 1
        while len(chunks) < r:
            chunks.append(int(bits.uint64(1)[0]))
        v = 0
        for c in chunks[:r]:
            v = (v << 64) | c
        b = floor_bits(64 * r)
        if v < b:
            return True
        if v > b:
            return False


# --------------------------------------------------------------------------------------------
# Exact categorical sampler (inversion with lazily read bits)
# --------------------------------------------------------------------------------------------

_FLAG = np.int64(1 << 62)  # bucket table entry "a boundary lies in this bucket: read more bits"
_BUCKET_BITS = 16
_TAIL_BITS = 10  # overflow categories get probability about 2^-10


class _ExactTable:
    """Exact sampler of a categorical variable by inversion (see the module docstring).

    Category ``k`` (with output ``values[k]``) is the number of CDF boundaries ``b_i`` below a
    uniform ``U``; ``b_i = P(category <= i)``, ``i = 0..K-2``.  ``bulk(ia)`` returns intervals of
    all boundaries at the precision of ``ia`` (may use recurrences), ``single(ia, i)`` one of
    them (used for the rare ties beyond 64 bits).  With ``buckets=True`` a 2^16-entry table
    resolves most samples from 16 random bits.
    """

    def __init__(
        self,
        bulk: Callable[[_IA], list[Interval]],
        single: Callable[[_IA, int], Interval],
        values: np.ndarray,
        buckets: bool,
        extra_digits: int = 0,
    ) -> None:
        self.values = np.ascontiguousarray(values, dtype=np.int64)
        self.single = single
        self.extra = int(extra_digits)
        nb = self.values.size - 1
        digits = _digits_for(64, self.extra)
        for _ in range(24):
            ia = _IA(digits)
            try:
                ivs = bulk(ia)
                floors = [ia.floor_scaled(iv, 64) for iv in ivs]
            except (DivisionByZero, InvalidOperation):
                floors = [None]
            if len(floors) == nb and all(f is not None for f in floors):
                break
            digits *= 2
        else:  # pragma: no cover - would need a boundary within 10^-(huge) of a dyadic number
            raise SparseDPError("could not compute exact sampler constants")
        self.c64 = np.array(floors, dtype=np.uint64)
        self.bucket: np.ndarray | None = None
        if buckets:
            shift = np.uint64(64 - _BUCKET_BITS)
            starts = np.arange(1 << _BUCKET_BITS, dtype=np.uint64) << shift
            base = np.searchsorted(self.c64, starts, side="left")  # #{c_i < start of bucket}
            top = np.append(base[1:], nb)  # #{c_i < start of next bucket}
            self.bucket = np.where(base == top, self.values[base], _FLAG).astype(np.int64)

    def floor_bits(self, i: int, nbits: int) -> int:
        """``floor(b_i 2^nbits)`` exactly."""
        return _exact_floor(lambda ia: self.single(ia, i), nbits, self.extra)

    def resolve_u(self, u: np.ndarray, bits: SecureRandomBits) -> np.ndarray:
        """Categories' values for 64-bit prefixes ``u`` (uint64), reading more bits on exact ties."""
        c64 = self.c64
        nb = c64.size
        k = np.searchsorted(c64, u, side="left")  # #{i: c_i < u}: those b_i are surely below U
        if nb:
            tie = np.flatnonzero(c64[np.minimum(k, nb - 1)] == u)
            tie = tie[k[tie] < nb]
            for j in tie:  # probability ~ 2^-64 per element: a loop over (almost always no) ties
                k[j] = self._slow(int(k[j]), int(u[j]), bits)
        return self.values.take(k)

    def _slow(self, i: int, u: int, bits: SecureRandomBits) -> int:
        chunks = [u]
        nb = self.c64.size
        while i < nb and int(self.c64[i]) == u:
            if _u_below(chunks, lambda n, i=i: self.floor_bits(i, n), bits):
                return i
            i += 1
        return i

    def resolve_buckets(self, w: np.ndarray, bits: SecureRandomBits) -> np.ndarray:
        """Values for flagged buckets ``w``: read 48 more bits (the top 48 of a uint64 draw)."""
        x = bits.uint64(w.size)
        u = (w.astype(np.uint64) << np.uint64(64 - _BUCKET_BITS)) | (x >> np.uint64(_BUCKET_BITS))
        return self.resolve_u(u, bits)

    def sample(self, n: int, bits: SecureRandomBits) -> np.ndarray:
        """``n`` independent exact draws (int64 values)."""
        if self.bucket is None:
            return self.resolve_u(bits.uint64(n), bits)
        w = bits.uint16(n)
        out = self.bucket.take(w.astype(np.intp))  # numpy's take is ~6x slower with uint16 indices
        fl = np.flatnonzero(out == _FLAG)
        if fl.size:
            out[fl] = self.resolve_buckets(w[fl], bits)
        return out


def _powers(ia: _IA, base: Interval, count: int) -> list[Interval]:
    """``[base^1, ..., base^count]`` by repeated (outward-rounded) multiplication."""
    out = []
    p = base
    for _ in range(count):
        out.append(p)
        p = ia.mul(p, base)
    return out


def _geometric_table(y: Fraction, T: int, buckets: bool, extra: int) -> _ExactTable:
    """``H ~ Geometric(rho)``, ``rho = exp(-y)``: categories ``0..T-1`` and ``T`` meaning ``H >= T``.

    ``b_i = P(H <= i) = 1 - rho^(i+1)``, ``i = 0..T-1``.
    """
    one = (Decimal(1), Decimal(1))

    def bulk(ia: _IA) -> list[Interval]:
        rho = ia.exp_neg(ia.const(y))
        return [ia.sub(one, p) for p in _powers(ia, rho, T)]

    def single(ia: _IA, i: int) -> Interval:
        return ia.sub(one, ia.exp_neg(ia.const(y * (i + 1))))

    return _ExactTable(bulk, single, np.arange(T + 1), buckets, extra)


def _truncated_geometric_table(y: Fraction, nbits: int, shift: int, buckets: bool, extra: int) -> _ExactTable:
    """``V`` on ``0..2^nbits - 1`` with ``P(V = v) ~ rho^v``, ``rho = exp(-y)``; outputs ``V << shift``.

    ``b_i = P(V <= i) = (1 - rho^(i+1)) / (1 - rho^(2^nbits))``.
    """
    size = 1 << nbits
    one = (Decimal(1), Decimal(1))

    def bulk(ia: _IA) -> list[Interval]:
        rho = ia.exp_neg(ia.const(y))
        pw = _powers(ia, rho, size)
        den = ia.sub(one, pw[-1])
        return [ia.div(ia.sub(one, p), den) for p in pw[:-1]]

    def single(ia: _IA, i: int) -> Interval:
        num = ia.sub(one, ia.exp_neg(ia.const(y * (i + 1))))
        den = ia.sub(one, ia.exp_neg(ia.const(y * size)))
        return ia.div(num, den)

    return _ExactTable(bulk, single, np.arange(size, dtype=np.int64) << shift, buckets, extra)


# --------------------------------------------------------------------------------------------
# Discrete Laplace
# --------------------------------------------------------------------------------------------


class _LaplacePlan:
    """Tables for the exact discrete Laplace with scale ``t`` (see the module docstring).

    ``X = 0`` w.p. ``(1-q)/(1+q)``; else ``X = s (1 + L + 2^g H)`` with a fair sign ``s``,
    ``L = G mod 2^g`` and ``H = G >> g``.  The main table's categories and boundaries
    (``p0 = (1-q)/(1+q)``, ``side = q/(1+q)``, ``rho = q^(2^g)``, ``A_m = 1 - rho^m``):

    ====================  ===================  =============================================
    category              value                boundary ``b_i = P(category <= i)``
    ====================  ===================  =============================================
    0                     0                    ``b_0 = p0``
    h + 1, h < T          ``+(1 + 2^g h)``     ``b_m = p0 + side A_m``, ``m = 1..T``
    T + 1                 ``+M`` (overflow)    ``b_{T+1} = 1/(1+q)``
    T + 2 + h, h < T      ``-(1 + 2^g h)``     ``b_{T+1+m} = 1/(1+q) + side A_m``
    2T + 2                ``-M`` (overflow)    (1)
    ====================  ===================  =============================================

    with ``M = 1 + 2^g T``; an overflow adds ``s 2^g H'``, ``H' ~ Geometric(rho)``.
    """

    def __init__(self, scale: float, light: bool) -> None:
        self.scale = float(scale)
        self.light = bool(light)
        x = 1 / Fraction(self.scale)  # exact: 1/t as a rational
        self.x = x
        kmax = 64 if light else 2048
        g = 0
        while True:
            T = max(1, math.ceil(_TAIL_BITS * math.log(2) * self.scale / 2.0**g))
            if 2 * T + 2 <= kmax:
                break
            g += 1
        self.g, self.T = g, T
        self.M = 1 + (T << g)
        extra = max(0, math.ceil(math.log10(self.scale))) + 4
        self.extra = extra
        buckets = not light
        y = x * (1 << g)  # rho = exp(-y)
        self.y = y
        one = (Decimal(1), Decimal(1))

        def consts(ia: _IA) -> tuple[Interval, Interval, Interval]:
            q = ia.exp_neg(ia.const(x))
            inv = ia.div(one, ia.add(one, q))  # 1/(1+q)
            p0 = ia.div(ia.sub(one, q), ia.add(one, q))
            side = ia.mul(q, inv)
            return p0, inv, side

        def bulk(ia: _IA) -> list[Interval]:
            p0, inv, side = consts(ia)
            rho = ia.exp_neg(ia.const(y))
            sa = [ia.mul(side, ia.sub(one, p)) for p in _powers(ia, rho, T)]
            return [p0] + [ia.add(p0, v) for v in sa] + [inv] + [ia.add(inv, v) for v in sa]

        def single(ia: _IA, i: int) -> Interval:
            p0, inv, side = consts(ia)
            if i == 0:
                return p0
            if i == T + 1:
                return inv
            base, m = (p0, i) if i <= T else (inv, i - T - 1)
            return ia.add(base, ia.mul(side, ia.sub(one, ia.exp_neg(ia.const(y * m)))))

        hs = np.arange(T, dtype=np.int64)
        pos = 1 + (hs << g)
        values = np.concatenate([[0], pos, [self.M], -pos, [-self.M]])
        self.main = _ExactTable(bulk, single, values, buckets, extra)
        # low bits of G: independent groups of bits (<= 8 per group; 1 per group in light plans)
        self.low: list[_ExactTable] = []
        step = 1 if light else 8
        for a in range(0, g, step):
            nbits = min(step, g - a)
            self.low.append(_truncated_geometric_table(x * (1 << a), nbits, a, buckets, extra))
        self._geo: _ExactTable | None = None
        self._lock = threading.Lock()

    @property
    def geo(self) -> _ExactTable:
        """Table for the overflow continuation ``H' ~ Geometric(rho)`` (built on first use)."""
        if self._geo is None:
            with self._lock:
                if self._geo is None:
                    self._geo = _geometric_table(self.y, self.T, not self.light, self.extra)
        return self._geo

    def geometric(self, m: int, bits: SecureRandomBits) -> np.ndarray:
        """``m`` exact draws of ``H ~ Geometric(rho)`` (rounds over a shrinking active set)."""
        tab, T = self.geo, self.T
        total = np.zeros(m, dtype=np.int64)
        active = np.arange(m)
        limit = (1 << 61) >> self.g
        while active.size:
            v = tab.sample(active.size, bits)
            total[active] += v
            active = active[v == T]  # category T means "H >= T": add T and draw again (memoryless)
            if active.size and int(total[active].max()) > limit:  # probability < exp(-2^21)
                raise SparseDPError("discrete Laplace sample exceeds the int64 range")
        return total

    def sample(self, n: int, bits: SecureRandomBits) -> np.ndarray:
        """``n`` independent exact discrete Laplace draws (int64)."""
        main, M = self.main, self.M
        if main.bucket is not None:
            w = bits.uint16(n)
            out = main.bucket.take(w.astype(np.intp))  # intp indices: take's fast path (see _ExactTable)
        else:
            w = None
            out = main.sample(n, bits)
        special = np.flatnonzero(np.abs(out) >= M)  # flagged buckets (_FLAG) or overflow (+-M)
        v = out[special]
        if special.size and w is not None:
            fl = np.flatnonzero(v == _FLAG)
            if fl.size:
                v[fl] = main.resolve_buckets(w[special[fl]], bits)
        ov = np.flatnonzero(np.abs(v) == M)
        # Constant work against a timing channel: the overflow continuation runs on every call,
        # on at least one draw (a dummy one, discarded, when no value is in the tail), so the time
        # of a call does not tell whether a value landed in the tail (benchmarks/bench_noise_timing.py).
        tail = self.geometric(max(ov.size, 1), bits)
        v[ov] += np.sign(v[ov]) * (tail[: ov.size] << self.g)  # runs (on empty arrays) either way
        out[special] = v
        if self.low:
            low = self.low[0].sample(n, bits)
            for tab in self.low[1:]:
                low += tab.sample(n, bits)
            low *= np.sign(out)
            out += low
        return out


_PLAN_CACHE: OrderedDict[tuple, Any] = OrderedDict()
_PLAN_CACHE_SIZE = 256  # about 0.55 MB per heavy plan; LUE-DPTree budgets use ~200 scales
_PLAN_LOCK = threading.Lock()
_LIGHT_BELOW = 4096  # fewer draws than this with one scale: use small tables (cheap to build)


def _cached(key: tuple, build: Callable[[], Any]) -> Any:
    with _PLAN_LOCK:
        plan = _PLAN_CACHE.get(key)
        if plan is not None:
            _PLAN_CACHE.move_to_end(key)
            return plan
    plan = build()
    with _PLAN_LOCK:
        _PLAN_CACHE[key] = plan
        _PLAN_CACHE.move_to_end(key)
        while len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
            _PLAN_CACHE.popitem(last=False)
    return plan


def _laplace_plan(scale: float, light: bool = False) -> _LaplacePlan:
    """The (cached) sampler tables for scale ``t``; ``light`` plans have tiny tables and no buckets."""
    s = float(scale)
    # light and heavy plans consume random bits differently: never let one stand in for the other,
    # or a seeded draw would depend on which plans this process happened to build before
    return _cached(("lap", s, light), lambda: _LaplacePlan(s, light))


_CHUNK = 1 << 20  # draws per batch: bounds the temporaries of very large requests


def _chunked(sample: Callable[[float, int], np.ndarray]) -> Callable[[float, int], np.ndarray]:
    """Wrap ``sample(scale, n)`` to draw at most ``_CHUNK`` values per call."""

    def run(s: float, n: int) -> np.ndarray:
        if n <= 2 * _CHUNK:
            return sample(s, n)
        out = np.empty(n, dtype=np.int64)
        for a in range(0, n, _CHUNK):
            b = min(a + _CHUNK, n)
            out[a:b] = sample(s, b - a)
        return out

    return run


def _run_starts(flat: np.ndarray) -> np.ndarray:
    """Indices where a run of equal values starts in the 1-d array ``flat`` (``[0]`` first)."""
    starts = np.flatnonzero(flat[1:] != flat[:-1])
    starts += 1
    return np.concatenate(([0], starts))


def _unique_values(flat: Any) -> np.ndarray:
    """``np.unique(flat)``, sorting only the first value of each run of equal values."""
    flat = np.ravel(flat)
    return np.unique(flat[_run_starts(flat)]) if flat.size > 1 else np.unique(flat)


def _unique_inverse(flat: Any) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(flat, return_inverse=True)`` for a 1-d array, in O(n) plus a sort of its runs.

    Per-row scales come in runs of equal values (a tree's levels, a plan's blocks): only the first
    value of each run is sorted, and the runs' inverse is repeated over their lengths.  The result
    is the same as ``np.unique``'s (the sorted distinct values and, per element, its index).
    """
    flat = np.ravel(flat)
    n = flat.size
    if n < 2:
        uniq, inv = np.unique(flat, return_inverse=True)
        return uniq, inv.ravel()
    starts = _run_starts(flat)
    uniq, inv_run = np.unique(flat[starts], return_inverse=True)
    return uniq, np.repeat(inv_run.ravel(), np.diff(starts, append=n))


def _group_order(inv: np.ndarray, groups: int) -> np.ndarray:
    """``np.argsort(inv, kind="stable")`` -- as a radix sort on 16-bit keys when there are few groups."""
    key = inv.astype(np.uint16) if groups <= 1 << 16 else inv
    return np.argsort(key, kind="stable")


def _grouped(values: Any, shape: tuple[int, ...], sample: Callable[[float, int], np.ndarray]) -> np.ndarray:
    """Draw for a scalar scale, or for an array of scales grouped by unique value (in increasing
    order of the scale; each group's draws fill its positions in order)."""
    sample = _chunked(sample)
    n = int(np.prod(shape, dtype=np.int64))
    if np.ndim(values) == 0:
        return sample(float(values), n).reshape(shape)
    flat = np.ravel(values)
    uniq, inv = _unique_inverse(flat)
    if uniq.size == 1:
        return sample(float(uniq[0]), n).reshape(shape)
    out = np.empty(n, dtype=np.int64)
    order = _group_order(inv, uniq.size)
    ends = np.cumsum(np.bincount(inv, minlength=uniq.size))
    start = 0
    for s, end in zip(uniq, ends):
        idx = order[start:end]
        out[idx] = sample(float(s), idx.size)
        start = end
    return out.reshape(shape)


def discrete_laplace(scale: float | np.ndarray, size: Size = None, rng: Any = None) -> np.ndarray:
    """Exact discrete Laplace noise: ``P(k) = (1-q)/(1+q) q^|k|``, ``q = exp(-1/t)``, ``k`` integer.

    Variance ``2 q / (1 - q)^2`` (:func:`discrete_laplace_variance`).  Adding it with
    ``t = Delta / epsilon`` to an integer query of L1 sensitivity ``Delta`` is ``epsilon``-DP.

    Parameters
    ----------
    scale:
        ``t > 0`` (finite, at most 2^40), a float or an array broadcast against ``size``
        (per-row scales; draws are grouped by unique value).
    size:
        Output shape (default: the shape of ``scale``; a 0-d array for a float).
    rng:
        ``None``: bits from the operating system (the shared :class:`SecureRandomBits`).
        An ``int`` or :class:`numpy.random.Generator`: bits from that generator -- reproducible
        but **not secure**.  A :class:`SecureRandomBits` is used as given.

    Returns
    -------
    numpy.ndarray
        An int64 array of exact samples.  Invalid scales raise
        :class:`InvalidPrivacyParameterError` before any random bit is read.
    """
    t, shape = _check_scale(scale, size, "scale", _MAX_DISCRETE_SCALE)
    bits = _bits_from(rng)

    def sample(s: float, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return _laplace_plan(s, light=n < _LIGHT_BELOW).sample(n, bits)

    return _grouped(t, shape, sample)


# --------------------------------------------------------------------------------------------
# Discrete Gaussian (Canonne, Kamath, Steinke 2020, Algorithm 3)
# --------------------------------------------------------------------------------------------

_GRID_POINTS = 8192
_TAIL_EXP = Fraction(40) * Fraction(6931471805599453, 10**16)  # about 40 ln 2


class _GaussPlan:
    """Exact discrete Gaussian ``P(k) ~ exp(-k^2 / (2 sigma^2))`` by rejection from discrete Laplace.

    Canonne, Kamath, Steinke (2020), Algorithm 3: ``t = floor(sigma) + 1``; draw
    ``Y ~ DLap(t)`` and accept with probability ``a(|Y|) = exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``.

    The acceptance test compares a uniform ``U`` (16 bits first, 64 if needed) with integers
    ``lo[j] <= a 2^64`` and ``hm[j] >= a 2^64 - 1`` valid for every ``|Y|`` in grid segment
    ``j = |Y| // step``
    (``a`` is unimodal with its peak at ``c = sigma^2/t``, so its extremes on a segment are at
    the ends, or 1 at the peak): ``u < lo`` accepts, ``u > hm`` rejects.  For ``step == 1`` the
    bounds are the exact ``floor(a 2^64)``.  The last segment covers every ``|Y|`` beyond the grid
    (where ``a <= 2^-40``) with ``lo = 0``.  Undecided candidates get the exact constant.
    """

    def __init__(self, sigma: float) -> None:
        self.sigma = float(sigma)
        sig = Fraction(self.sigma)
        self.t = math.floor(self.sigma) + 1
        self.lap = _laplace_plan(float(self.t), light=False)
        self.c = sig * sig / self.t  # peak of a(y)
        self.two_s2 = 2 * sig * sig
        # grid: cover y <= ymax with a(ymax) <= 2^-40, i.e. (ymax - c)^2 >= 2 sigma^2 * 40 ln 2
        ymax = math.ceil(float(self.c) + self.sigma * math.sqrt(2 * float(_TAIL_EXP))) + 1
        while (ymax - self.c) ** 2 < self.two_s2 * _TAIL_EXP:  # make the float guess rigorous
            ymax += 1
        step = max(1, math.ceil((ymax + 1) / _GRID_POINTS))
        J = math.ceil((ymax + 1) / step)  # segments 0..J-1 cover y in [j step, (j+1) step); J is the tail
        self.step, self.J = step, J
        self.extra = max(0, math.ceil(math.log10(self.sigma + 1))) + 6
        lo, hm = self._grid()
        self.lo64 = np.array(lo, dtype=np.uint64)
        self.hm64 = np.array(hm, dtype=np.uint64)
        self.lo16 = (self.lo64 >> np.uint64(48)).astype(np.uint16)
        self.hm16 = (self.hm64 >> np.uint64(48)).astype(np.uint16)
        self.exact = (self.lo64 == self.hm64) if step == 1 else np.zeros(J + 1, dtype=bool)
        self._cache: OrderedDict[int, int] = OrderedDict()
        # acceptance rate, floating point: only used to size the batches of candidates
        ys = np.arange(J + 1, dtype=np.float64) * step
        qf = math.exp(-1.0 / self.t)
        pl = (1 - qf) / (1 + qf) * qf**ys
        af = np.exp(-((ys - float(self.c)) ** 2) / (2 * self.sigma**2))
        w = np.full(J + 1, 2.0 * step)
        w[0] = 1.0 + 2.0 * (step - 1)
        self.rate = float(min(1.0, max(0.05, np.sum(w * pl * af))))

    def _grid(self) -> tuple[list[int], list[int]]:
        """Bounds ``lo``, ``hm`` for the segments (see the class docstring)."""
        step, J, c, two_s2 = self.step, self.J, self.c, self.two_s2
        top = (1 << 64) - 1
        digits = _digits_for(64, self.extra + len(str(J)))
        for _ in range(8):
            ia = _IA(digits)
            # a(y + step) = a(y) r(y), r(y) = exp(-(2 step (y - c) + step^2) / (2 sigma^2)),
            # r(y + step) = r(y) d, d = exp(-step^2 / sigma^2)
            a = ia.exp_neg(ia.const(c * c / two_s2))
            r = ia.exp_neg(ia.const((step * step - 2 * step * c) / two_s2))
            d = ia.exp_neg(ia.const(Fraction(2 * step * step) / two_s2))
            pts = [a]
            for _ in range(J):
                a = ia.mul(a, r)
                r = ia.mul(r, d)
                pts.append(a)
            lo: list[int] = []
            hm: list[int] = []
            ok = True
            for j in range(J + 1):
                if j == J:  # tail: y >= J step > c, a decreasing: 0 <= a(y) <= a(J step)
                    lo.append(0)
                    hm.append(min(ia.ceil_scaled(pts[J], 64) - 1, top))
                    continue
                if step == 1:
                    ends = [pts[j]]
                else:
                    ends = [pts[j], pts[j + 1]]
                low = min(ia.floor_lower(e, 64) for e in ends)
                if step > 1 and j * step <= c <= (j + 1) * step:
                    high = top  # the peak a = 1 lies in this segment
                else:
                    high = min(max(ia.ceil_scaled(e, 64) for e in ends) - 1, top)
                lo.append(min(low, top))
                hm.append(max(high, 0))
                if step == 1 and ia.floor_scaled(pts[j], 64) is None:
                    ok = False
            if ok or step > 1:
                return lo, hm
            digits *= 2
        return lo, hm  # pragma: no cover - non-exact entries are then resolved exactly per value

    def _gamma(self, y: int) -> Fraction:
        return (y - self.c) ** 2 / self.two_s2

    def floor_a(self, y: int, nbits: int) -> int:
        """``floor(a(y) 2^nbits)`` exactly."""
        g = self._gamma(y)
        return _exact_floor(lambda ia: ia.exp_neg(ia.const(g)), nbits, self.extra)

    def _c64(self, y: int) -> int:
        if self.step == 1 and y < self.J and self.exact[y]:
            return int(self.lo64[y])
        v = self._cache.get(y)
        if v is None:
            v = self.floor_a(y, 64)
            self._cache[y] = v
            if len(self._cache) > 65536:
                self._cache.popitem(last=False)
        return v

    def accept(self, y: np.ndarray, bits: SecureRandomBits) -> np.ndarray:
        """Exact Bernoulli(``a(|y|)``) decisions for candidates ``y``.

        Reads 16 bits ``w`` per candidate: ``w < lo >> 48`` accepts and ``w > hm >> 48``
        rejects whatever the following bits are; otherwise (probability about ``2^-15``) 48 more
        bits give the 64-bit prefix ``u`` that is compared with ``lo`` and ``hm`` themselves.
        """
        ay = np.abs(y)
        j = ay if self.step == 1 else ay // self.step
        j = np.minimum(j, self.J)
        w = bits.uint16(y.size)
        lo16 = self.lo16.take(j)
        acc = w < lo16
        und = np.flatnonzero((w - lo16) <= (self.hm16.take(j) - lo16))  # lo16 <= w <= hm16 (mod 2^16)
        if und.size:
            x = bits.uint64(und.size)
            u = (w[und].astype(np.uint64) << np.uint64(48)) | (x >> np.uint64(16))
            jj = j[und]
            lo = self.lo64.take(jj)
            a2 = u < lo
            und2 = np.flatnonzero(u - lo <= self.hm64.take(jj) - lo)  # lo <= u <= hm (mod 2^64)
            if und2.size:
                a2[und2] = self._resolve(ay[und][und2], u[und2], bits)
            acc[und] = a2
        return acc

    def _resolve(self, ay: np.ndarray, u: np.ndarray, bits: SecureRandomBits) -> np.ndarray:
        uniq, inv = np.unique(ay, return_inverse=True)
        c = np.array([self._c64(int(v)) for v in uniq], dtype=np.uint64)[inv]
        acc = u < c
        for i in np.flatnonzero(u == c):  # 64-bit tie (probability ~ 2^-64): compare more bits
            yv = int(ay[i])
            acc[i] = _u_below([int(u[i])], lambda n, yv=yv: self.floor_a(yv, n), bits)
        return acc

    def sample(self, n: int, bits: SecureRandomBits) -> np.ndarray:
        """``n`` exact draws: candidates in batches; accepted ones fill the output in order."""
        out = np.empty(n, dtype=np.int64)
        filled = 0
        rate = self.rate
        while filled < n:
            need = n - filled
            m = int(need / rate * 1.05) + 16
            y = self.lap.sample(m, bits)
            keep = y[self.accept(y, bits)][:need]
            out[filled : filled + keep.size] = keep
            filled += keep.size
        return out


def _gauss_plan(sigma: float) -> _GaussPlan:
    s = float(sigma)
    return _cached(("gauss", s), lambda: _GaussPlan(s))


def discrete_gaussian(sigma: float | np.ndarray, size: Size = None, rng: Any = None) -> np.ndarray:
    """Exact discrete Gaussian noise: ``P(k) ~ exp(-k^2 / (2 sigma^2))``, ``k`` integer.

    Canonne, Kamath and Steinke (2020), Algorithm 3, with exact Bernoulli decisions; see
    :class:`_GaussPlan`.  Its variance is below ``sigma^2`` (the sum ``sum_k k^2 P(k)``), and adding
    it with ``sigma^2 = Delta^2 / (2 rho)`` to an integer query of L2 sensitivity ``Delta`` is
    ``rho``-zCDP.  ``sigma``, ``size`` and ``rng`` as in :func:`discrete_laplace` (``sigma`` at
    most 2^40).  Returns int64.
    """
    s, shape = _check_scale(sigma, size, "sigma", _MAX_DISCRETE_SCALE)
    bits = _bits_from(rng)

    def sample(sv: float, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return _gauss_plan(sv).sample(n, bits)

    return _grouped(s, shape, sample)


# --------------------------------------------------------------------------------------------
# Dispatcher and grid snapping
# --------------------------------------------------------------------------------------------


def noise(kind: str, scale: float | np.ndarray, size: Size = None, rng: Any = None, secure: bool = False) -> np.ndarray:
    """Draw noise of ``kind`` ``"laplace"`` (scale ``b``/``t``) or ``"gaussian"`` (``sigma``).

    ``secure=False``: :func:`laplace` / :func:`gaussian` (float64).  ``secure=True``:
    :func:`discrete_laplace` / :func:`discrete_gaussian`, returned as a float64 array of
    integers (exact as long as ``|k| < 2^53``).  An unknown ``kind`` raises :class:`SparseDPError`.
    """
    if kind not in ("laplace", "gaussian"):
        raise SparseDPError(f"noise kind must be 'laplace' or 'gaussian', got {kind!r}")
    if secure:
        f = discrete_laplace if kind == "laplace" else discrete_gaussian
        return f(scale, size, rng).astype(np.float64)
    return laplace(scale, size, rng) if kind == "laplace" else gaussian(scale, size, rng)


def snap_to_grid(values: Any, grid: float) -> np.ndarray:
    """Round ``values`` to the grid ``gamma``: ``round(values / gamma)`` as int64 (half to even).

    Use with the exact samplers: release ``gamma * (snap_to_grid(v, gamma) + k)`` with integer
    noise ``k`` calibrated to the sensitivity in grid units.  If every value (and every change
    one individual can cause) is a multiple of ``gamma`` -- e.g. integer counts with
    ``gamma = 1`` -- the snapping is exact and the sensitivity is ``Delta / gamma``.  Otherwise
    each touched coordinate can move by one extra unit (``|round(a) - round(b)| <= |a - b| + 1``),
    so L1 sensitivity ``Delta`` over at most ``m`` touched coordinates becomes at most
    ``Delta / gamma + m``.  Raises :class:`NonFiniteInputError` for NaN/inf,
    :class:`InvalidPrivacyParameterError` for a bad grid and :class:`SparseDPError` if a value
    does not fit in int64.
    """
    gamma = check_positive(grid, "grid")
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"values must be numeric: {exc}") from exc
    if not np.all(np.isfinite(v)):
        raise NonFiniteInputError("values contain NaN or infinity")
    k = np.rint(v / gamma)
    if k.size and float(np.max(np.abs(k))) >= 2.0**62:
        raise SparseDPError("values / grid do not fit in int64")
    return k.astype(np.int64)
