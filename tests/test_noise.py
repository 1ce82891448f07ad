"""Tests for sparsedp.noise: distributions, exactness of the integer samplers, parameter checks."""

from __future__ import annotations

import math
import os
from decimal import Decimal, localcontext

import numpy as np
import pytest
from scipy import stats

from sparsedp import noise as nz
from sparsedp.errors import InvalidPrivacyParameterError, NonFiniteInputError, ShapeError, SparseDPError

N = 200_000
MASK64 = (1 << 64) - 1

# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def dlap_pmf(k: np.ndarray, t: float) -> np.ndarray:
    q = math.exp(-1.0 / t)
    return (1 - q) / (1 + q) * q ** np.abs(k)


def dgauss_pmf_table(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    K = int(math.ceil(40 * sigma + 10))
    k = np.arange(-K, K + 1)
    w = np.exp(-(k.astype(float) ** 2) / (2 * sigma * sigma))
    return k, w / w.sum()


def chisquare_integer(x: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square p-value of integer samples ``x`` against ``pmf`` on ``support`` (sorted).

    Bins: one per integer where the expected count is >= 5, the two tails pooled with the
    outermost bins until they also have >= 5 expected.
    """
    n = x.size
    exp = n * pmf
    ok = np.flatnonzero(exp >= 5)
    lo, hi = support[ok[0]], support[ok[-1]]
    inner = np.arange(lo + 1, hi)
    e_inner = n * pmf[(support > lo) & (support < hi)]
    e_lo = n * pmf[support <= lo].sum()
    e_hi = n * pmf[support >= hi].sum()
    o_inner = np.bincount(np.clip(x, lo, hi) - lo, minlength=hi - lo + 1)[1:-1]
    o_lo = np.count_nonzero(x <= lo)
    o_hi = np.count_nonzero(x >= hi)
    obs = np.concatenate([[o_lo], o_inner, [o_hi]])
    expv = np.concatenate([[e_lo], e_inner, [e_hi]])
    assert obs.sum() == n and inner.size == o_inner.size
    expv = expv * (n / expv.sum())  # the pmf table is normalised up to ~1e-16
    return float(stats.chisquare(obs, expv).pvalue)


def dec_bits(value_fn, nbits: int, digits: int = 150) -> int:
    """floor(v * 2^nbits) with plain high-precision decimal (independent of the module's code)."""
    with localcontext() as ctx:
        ctx.prec = digits
        v = value_fn()
        return int((v * (Decimal(2) ** nbits)).to_integral_value(rounding="ROUND_FLOOR"))


def dec_p0(t: float) -> Decimal:
    q = (-(Decimal(1) / Decimal(t))).exp()
    return (1 - q) / (1 + q)


class RecordingBits(nz.SecureRandomBits):
    """Byte source that records whether anything was drawn."""

    def __init__(self) -> None:
        super().__init__(np.random.default_rng(0))
        self.calls = 0

    def bytes(self, n: int) -> bytes:
        self.calls += 1
        return super().bytes(n)


class RiggedBits(nz.SecureRandomBits):
    """Byte source with programmed draws.

    ``uint16`` calls return ``u16`` (a scalar, broadcast, or an array for the first call only
    if ``u16`` is a list of arrays, consumed one per call).  Each ``script`` entry answers one
    ``uint64(n)`` call (a scalar is broadcast); once the script is used up, uint64 draws come
    from a seeded generator.
    """

    def __init__(self, u16, script: list, seed: int = 0) -> None:
        super().__init__(np.random.default_rng(seed))
        self.u16 = u16
        self.script = list(script)

    def uint16(self, n: int) -> np.ndarray:
        if isinstance(self.u16, list):
            v = np.asarray(self.u16.pop(0), dtype=np.uint16)
        else:
            v = np.asarray(self.u16, dtype=np.uint16)
        return np.broadcast_to(v, (int(n),)).copy()

    def uint64(self, n: int) -> np.ndarray:
        if self.script:
            v = np.asarray(self.script.pop(0), dtype=np.uint64)
            out = np.broadcast_to(v, (int(n),)).copy()
            return out
        return super().uint64(n)


# ----------------------------------------------------------------------------------------------
# as_generator and sources
# ----------------------------------------------------------------------------------------------


def test_as_generator_semantics():
    a = nz.as_generator(123).random(5)
    b = nz.as_generator(123).random(5)
    np.testing.assert_array_equal(a, b)
    g = np.random.default_rng(1)
    assert nz.as_generator(g) is g
    assert isinstance(nz.as_generator(None), np.random.Generator)
    assert isinstance(nz.as_generator(np.int64(7)), np.random.Generator)
    for bad in ["abc", 1.5, True, object(), -1]:
        with pytest.raises(SparseDPError):
            nz.as_generator(bad)


def test_seeded_samplers_reproducible():
    np.testing.assert_array_equal(nz.laplace(2.0, 10, rng=5), nz.laplace(2.0, 10, rng=5))
    np.testing.assert_array_equal(nz.gaussian(2.0, 10, rng=5), nz.gaussian(2.0, 10, rng=5))
    np.testing.assert_array_equal(nz.discrete_laplace(7.5, 1000, rng=5), nz.discrete_laplace(7.5, 1000, rng=5))
    np.testing.assert_array_equal(nz.discrete_gaussian(7.5, 1000, rng=5), nz.discrete_gaussian(7.5, 1000, rng=5))
    assert not np.array_equal(nz.discrete_laplace(7.5, 1000, rng=5), nz.discrete_laplace(7.5, 1000, rng=6))


def test_default_secure_source_uses_openssl_csprng(monkeypatch):
    import ssl

    calls = []
    real = ssl.RAND_bytes

    def counting(n):
        calls.append(n)
        return real(n)

    monkeypatch.setattr(nz, "_DEFAULT_BITS", nz.SecureRandomBits())
    monkeypatch.setattr(ssl, "RAND_bytes", counting)
    monkeypatch.setattr(os, "urandom", lambda n: pytest.fail("the default source must not call os.urandom"))
    x = nz.discrete_laplace(3.0, 5000)
    assert calls and x.dtype == np.int64
    calls.clear()
    monkeypatch.setattr(nz, "_DEFAULT_BITS", nz.SecureRandomBits())  # empty buffer again
    nz.discrete_gaussian(3.0, 5000)
    assert calls
    # the output is a function of the CSPRNG's bytes: all-zero bytes give U = 0, the first category (0)
    monkeypatch.setattr(nz, "_DEFAULT_BITS", nz.SecureRandomBits())
    monkeypatch.setattr(ssl, "RAND_bytes", lambda n: bytes(n))
    np.testing.assert_array_equal(nz.discrete_laplace(3.0, 5000), 0)
    assert nz._DEFAULT_BITS.secure and nz._DEFAULT_BITS.source == "openssl"
    src = nz.SecureRandomBits(np.random.default_rng())
    assert not src.secure and src.source == "numpy" and "NOT secure" in repr(src)


def test_os_source_uses_os_urandom(monkeypatch):
    import ssl

    calls = []
    real = os.urandom
    monkeypatch.setattr(os, "urandom", lambda n: calls.append(n) or real(n))
    monkeypatch.setattr(ssl, "RAND_bytes", lambda n: pytest.fail("source='os' must not call OpenSSL"))
    src = nz.SecureRandomBits(source="os")
    assert src.secure and src.source == "os" and "os.urandom" in repr(src)
    x = nz.discrete_laplace(3.0, 5000, rng=src)
    assert calls and x.dtype == np.int64
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))
    np.testing.assert_array_equal(nz.discrete_laplace(3.0, 5000, rng=nz.SecureRandomBits(source="os")), 0)
    with pytest.raises(SparseDPError):
        nz.SecureRandomBits(source="mt19937")


def test_openssl_source_falls_back_to_os_urandom_without_ssl(monkeypatch):
    calls = []
    real = os.urandom
    monkeypatch.setattr(nz, "_ssl", None)  # Python built without OpenSSL
    monkeypatch.setattr(os, "urandom", lambda n: calls.append(n) or real(n))
    src = nz.SecureRandomBits()
    assert len(src.bytes(10)) == 10 and calls == [1 << 20]


def test_openssl_large_requests_are_read_in_pieces(monkeypatch):
    import ssl

    calls = []
    real = ssl.RAND_bytes
    monkeypatch.setattr(ssl, "RAND_bytes", lambda n: calls.append(n) or real(n))
    monkeypatch.setattr(nz, "_SSL_MAX", 1000)  # RAND_bytes takes a C int (2^31 - 1 at most)
    b = nz.SecureRandomBits(chunk_size=64).bytes(2500)
    assert len(b) == 2500 and calls == [1000, 1000, 500]


def test_csprng_bytes_look_uniform():
    """A smoke test of the default source: byte frequencies and bit pairs of 4 MiB are uniform."""
    b = np.frombuffer(nz.SecureRandomBits().bytes(4 << 20), dtype=np.uint8)
    counts = np.bincount(b, minlength=256)
    exp = b.size / 256
    chi2 = float(((counts - exp) ** 2 / exp).sum())
    assert chi2 < 255 + 6 * math.sqrt(2 * 255)  # 255 df: mean 255, sd 22.6
    # two bytes apart from each other in the stream are independent (a 16-bit joint histogram)
    pairs = b[0::2].astype(np.int64) * 256 + b[1::2]
    pc = np.bincount(pairs, minlength=1 << 16)
    e2 = pairs.size / (1 << 16)
    chi2p = float(((pc - e2) ** 2 / e2).sum())
    df = (1 << 16) - 1
    assert chi2p < df + 6 * math.sqrt(2 * df)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("source", ["openssl", "os"])
def test_forked_child_draws_different_bytes(source):
    """After fork(), parent and child must not replay one stream: our buffer is dropped in the
    child and OpenSSL's DRBG reseeds (it tracks the process id), so their next bytes differ."""
    src = nz.SecureRandomBits(source=source)
    src.bytes(16)  # fill the buffer and prime the DRBG before forking
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(w, src.bytes(32) + nz._SOURCES[source](32))
        finally:
            os._exit(0)
    os.close(w)
    child = b""
    while len(child) < 64:
        part = os.read(r, 64)
        if not part:
            break
        child += part
    os.close(r)
    os.waitpid(pid, 0)
    mine = src.bytes(32) + nz._SOURCES[source](32)
    assert len(child) == 64 and child[:32] != mine[:32] and child[32:] != mine[32:]


def test_secure_bits_buffer_and_fork_guard(monkeypatch):
    calls = []
    real = os.urandom
    monkeypatch.setattr(os, "urandom", lambda n: calls.append(n) or real(n))
    src = nz.SecureRandomBits(chunk_size=4096, source="os")
    a = src.bytes(100)
    b = src.bytes(100)
    assert len(a) == len(b) == 100 and a != b and calls == [4096]
    big = src.bytes(10_000)  # large requests go straight to the source
    assert len(big) == 10_000 and calls == [4096, 10_000]
    monkeypatch.setattr(os, "getpid", lambda: -12345)  # "forked": the buffer must be dropped
    src.bytes(10)
    assert calls == [4096, 10_000, 4096]
    assert src.uint16(3).dtype == np.uint16 and src.uint64(3).dtype == np.uint64


# ----------------------------------------------------------------------------------------------
# floating-point samplers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("b", [0.5, 3.0, 100.0])
def test_float_laplace_ks_and_variance(b):
    x = nz.laplace(b, N, rng=11)
    assert x.dtype == np.float64 and x.shape == (N,)
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-3
    assert abs(x.var() / (2 * b * b) - 1) < 0.03
    assert nz.laplace_variance(b) == 2 * b * b


@pytest.mark.parametrize("s", [0.5, 3.0, 100.0])
def test_float_gaussian_ks_and_variance(s):
    x = nz.gaussian(s, N, rng=12)
    assert stats.kstest(x, stats.norm(scale=s).cdf).pvalue > 1e-3
    assert abs(x.var() / (s * s) - 1) < 0.02


def test_float_per_row_scales():
    scales = np.array([[1.0], [10.0], [100.0]])
    x = nz.laplace(scales, (3, 50_000), rng=3)
    np.testing.assert_allclose(x.var(axis=1), 2 * scales[:, 0] ** 2, rtol=0.05)
    g = nz.gaussian(np.array([1.0, 10.0]), rng=3)  # size None: shape of the scales
    assert g.shape == (2,)
    with pytest.raises(ShapeError):
        nz.laplace(np.array([1.0, 2.0]), (3,), rng=0)


# ----------------------------------------------------------------------------------------------
# exact discrete samplers: distributions
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [0.7, 3.0, 25.5, 1000.0])
def test_discrete_laplace_chisquare_and_variance(t):
    x = nz.discrete_laplace(t, N, rng=21)
    assert x.dtype == np.int64 and x.shape == (N,)
    K = int(40 * t + 50)
    support = np.arange(-K, K + 1)
    assert chisquare_integer(x, support, dlap_pmf(support, t)) > 1e-3
    assert abs(x.var() / nz.discrete_laplace_variance(t) - 1) < 0.03


class CountingBits(nz.SecureRandomBits):
    """The default secure source (OpenSSL's CSPRNG), counting the bytes it hands out."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def bytes(self, n: int) -> bytes:
        self.count += max(int(n), 0)
        return super().bytes(n)


def test_keyed_bits_are_a_function_of_key_index_and_requests():
    key = bytes(range(32))
    a, b = nz.KeyedRandomBits(key, 5), nz.KeyedRandomBits(key, 5)
    first = [a.bytes(n) for n in (3, 100, 8)]
    assert first == [b.bytes(n) for n in (3, 100, 8)]  # the same requests give the same bytes
    assert a.at(5).bytes(3) == first[0] and a.at(6).bytes(3) != first[0]  # at(): the index's stream from its start
    assert nz.KeyedRandomBits(bytes(32), 5).bytes(100) != first[1]
    assert a.bytes(0) == b"" and len(a.bytes(1 << 20)) == 1 << 20
    assert a.secure and a.source == "keyed"
    fresh = nz.KeyedRandomBits.new()
    assert fresh.secure and fresh.key != nz.KeyedRandomBits.new().key and len(fresh.key) == 32
    seeded = nz.KeyedRandomBits.from_seed(7)
    assert not seeded.secure and seeded.key == nz.KeyedRandomBits.from_seed(7).key != nz.KeyedRandomBits.from_seed(8).key
    assert not nz.KeyedRandomBits.from_seed(np.random.default_rng(1)).secure
    assert nz.discrete_laplace(4.0, 50, rng=a.at(9)).tolist() == nz.discrete_laplace(4.0, 50, rng=b.at(9)).tolist()
    g1, g2 = a.at(3).generator(), b.at(3).generator()
    assert g1.random(4).tolist() == g2.random(4).tolist()
    for bad in (b"short", "a" * 32, None):
        with pytest.raises(SparseDPError, match="32 bytes"):
            nz.KeyedRandomBits(bad)
    for bad in (-1, 2**64, True):
        with pytest.raises(SparseDPError, match="index"):
            nz.KeyedRandomBits(key, bad)
    for bad in ("7", 1.5, -3):
        with pytest.raises(SparseDPError):
            nz.KeyedRandomBits.from_seed(bad)


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_exact_samplers_on_keyed_bits_have_the_exact_law(kind):
    # one value per index (a counter's keyed blocks of one row) and many values from one index
    keys = nz.KeyedRandomBits(bytes(range(100, 132)))  # a fixed key: the test is repeatable
    scale = 3.0
    one_each = np.array([nz.noise(kind, scale, 1, rng=keys.at(i), secure=True)[0] for i in range(4000)])
    many = nz.noise(kind, scale, N, rng=keys.at(10**6), secure=True)
    if kind == "laplace":
        K = int(40 * scale + 50)
        support = np.arange(-K, K + 1)
        pmf, var = dlap_pmf(support, scale), nz.discrete_laplace_variance(scale)
    else:
        support, pmf = dgauss_pmf_table(scale)
        var = nz.discrete_gaussian_variance(scale)
    for x, tol in ((many, 0.03), (one_each, 0.15)):
        assert chisquare_integer(x.astype(np.int64), support, pmf) > 1e-3
        assert abs(x.var() / var - 1) < tol


@pytest.mark.parametrize("t", [3.0, 150.0, 1024.0])
def test_discrete_laplace_from_csprng_exact_law_and_bytes(t):
    """The production path (OpenSSL bits, heavy plan) at the completion entry-level scale ~1024:
    chi-square of the empirical pmf and tail probabilities against the exact law, and the bytes
    read per draw: 2 (main 16-bit bucket) + 2 per low-bit table + 8 per flagged bucket hit, plus
    the rare overflow rounds (probability ~2^-10, 2+ bytes each)."""
    n = 1_000_000
    bits = CountingBits()
    x = nz.discrete_laplace(t, n, rng=bits)
    K = int(40 * t + 50)
    support = np.arange(-K, K + 1)
    pmf = dlap_pmf(support, t)
    assert chisquare_integer(x, support, pmf) > 1e-5  # unseeded: a false alarm 1 run in 10^5
    # tails, including the main table's overflow categories |X| >= M (continued by H' ~ Geometric)
    plan = nz._laplace_plan(t)
    q = math.exp(-1.0 / t)
    for k in (1, int(t) + 1, 3 * int(t) + 1, plan.M, plan.M + 2 * int(t)):
        p_tail = 2 * q**k / (1 + q)  # P(|X| >= k), k >= 1
        obs = np.count_nonzero(np.abs(x) >= k)
        assert abs(obs - n * p_tail) < 5 * math.sqrt(n * p_tail * (1 - p_tail)) + 1, (k, obs, n * p_tail)
    # bytes consumed: what the tables say, up to the overflow rounds
    flagged = np.count_nonzero(plan.main.bucket == nz._FLAG) / 65536
    flagged += sum(np.count_nonzero(tab.bucket == nz._FLAG) / 65536 for tab in plan.low)
    claim = 2 + 2 * len(plan.low) + 8 * flagged
    per_draw = bits.count / n
    sd = 8 * math.sqrt(flagged / n)  # the flagged hits are binomial
    assert claim - 5 * sd < per_draw < claim + 5 * sd + 0.01, (per_draw, claim)


@pytest.mark.parametrize("t", [2.0, 300.0, 1e5])
def test_discrete_laplace_light_plans(t):
    """Small requests (many distinct scales) use small tables with one bit per low group."""
    plan = nz._LaplacePlan(t, light=True)
    assert plan.main.bucket is None and len(plan.main.values) <= 64
    x = plan.sample(N, nz.SecureRandomBits(np.random.default_rng(22)))
    if t < 1000:
        support = np.arange(-int(40 * t + 50), int(40 * t + 50) + 1)
        assert chisquare_integer(x, support, dlap_pmf(support, t)) > 1e-3
    assert abs(x.var() / nz.discrete_laplace_variance(t) - 1) < 0.03
    # the sign and |X| mod 2: both fair / exact; checks the combination of the bit groups
    q = math.exp(-1 / t)
    p_odd = 2 * q / (1 + q) * (1 - q) / (1 - q * q)  # P(|X| odd) = side * P(G even)
    assert abs(np.mean(np.abs(x) % 2 == 1) - p_odd) < 5 * math.sqrt(p_odd * (1 - p_odd) / N)


@pytest.mark.parametrize("sigma", [0.8, 4.0, 30.0])
def test_discrete_gaussian_chisquare_and_variance(sigma):
    x = nz.discrete_gaussian(sigma, N, rng=31)
    assert x.dtype == np.int64 and x.shape == (N,)
    support, pmf = dgauss_pmf_table(sigma)
    assert chisquare_integer(x, support, pmf) > 1e-3
    var = float((support.astype(float) ** 2 * pmf).sum())
    assert nz.discrete_gaussian_variance(sigma) == pytest.approx(var, rel=1e-9)
    assert abs(x.var() / var - 1) < 0.03


def test_discrete_gaussian_large_sigma_coarse_grid():
    sigma = 5000.0
    plan = nz._gauss_plan(sigma)
    assert plan.step > 1  # bounds on grid segments, exact constants for undecided candidates
    x = nz.discrete_gaussian(sigma, N, rng=32)
    assert abs(x.var() / sigma**2 - 1) < 0.03
    # compare the CDF at a few points with the continuous normal (error ~ 1/sigma^2)
    for z in [-1.5, -0.3, 0.0, 0.8, 2.0]:
        k = math.floor(z * sigma)
        assert abs(np.mean(x <= k) - stats.norm.cdf((k + 0.5) / sigma)) < 5 * math.sqrt(0.25 / N)


def test_discrete_per_row_scales_and_shapes():
    scales = np.array([1.0, 50.0, 1.0, 50.0])[:, None]
    x = nz.discrete_laplace(scales, (4, 40_000), rng=41)
    assert x.shape == (4, 40_000) and x.dtype == np.int64
    want = np.array([nz.discrete_laplace_variance(s) for s in scales[:, 0]])
    np.testing.assert_allclose(x.var(axis=1), want, rtol=0.05)
    g = nz.discrete_gaussian(np.array([2.0, 20.0]), (50_000, 2), rng=42)
    np.testing.assert_allclose(g.var(axis=0), [4.0, 400.0], rtol=0.05)
    assert nz.discrete_laplace(2.0, rng=1).shape == ()
    assert nz.discrete_laplace(2.0, (2, 3), rng=1).shape == (2, 3)
    assert nz.discrete_laplace(2.0, 0, rng=1).shape == (0,)
    many = np.linspace(1.0, 3.0, 200)  # 200 distinct scales, light plans
    y = nz.discrete_laplace(many, (50, 200), rng=43)
    assert y.shape == (50, 200)


def test_grouping_by_scale_matches_numpy_unique():
    """Per-row scales are grouped in O(n) over their runs; the groups (and so the seeded draws) are
    exactly np.unique's / a stable argsort's, in runs or not."""
    rng = np.random.default_rng(5)
    for trial in range(60):
        n = int(rng.integers(0, 400))
        vals = rng.choice(rng.random(int(rng.integers(1, 7))) * 10 + 0.5, n)
        if trial % 3 == 0:
            vals = np.sort(vals)  # long runs
        if trial % 4 == 0:
            vals = np.repeat(vals, 3)
        u, inv = np.unique(vals, return_inverse=True)
        u2, inv2 = nz._unique_inverse(vals)
        np.testing.assert_array_equal(u2, u)
        np.testing.assert_array_equal(inv2, inv.ravel())
        np.testing.assert_array_equal(nz._unique_values(vals), u)
        np.testing.assert_array_equal(nz._group_order(inv2, u.size), np.argsort(inv.ravel(), kind="stable"))
    # a seeded per-row draw is the per-group draw placed back in order (the documented grouping)
    scales = np.repeat([4.0, 1.5, 4.0, 9.0], [300, 200, 100, 50])
    x = nz.discrete_laplace(scales, rng=8)
    bits = nz.SecureRandomBits(np.random.default_rng(8))
    ref = np.empty(scales.size, dtype=np.int64)
    for s in np.unique(scales):  # increasing scale, each group's positions in order
        idx = np.flatnonzero(scales == s)
        ref[idx] = nz._laplace_plan(float(s), light=idx.size < nz._LIGHT_BELOW).sample(idx.size, bits)
    np.testing.assert_array_equal(x, ref)


def test_tiny_scale_is_zero_and_terminates():
    x = nz.discrete_laplace(0.01, 10_000, rng=1)
    np.testing.assert_array_equal(x, 0)  # P(X != 0) ~ 2 exp(-100)
    assert nz.discrete_gaussian(0.05, 1000, rng=1).tolist() == [0] * 1000


# ----------------------------------------------------------------------------------------------
# exactness of the constants and of the tie fallback
# ----------------------------------------------------------------------------------------------


def test_table_constants_match_independent_decimal():
    t = 25.5
    plan = nz._laplace_plan(t)
    T, g = plan.T, plan.g
    assert g == 0
    with localcontext() as ctx:
        ctx.prec = 80
        q = (-(Decimal(1) / Decimal(t))).exp()
        p0 = (1 - q) / (1 + q)
        side = q / (1 + q)
        inv = 1 / (1 + q)
        A = [1 - q**m for m in range(1, T + 1)]
        b = [p0] + [p0 + side * a for a in A] + [inv] + [inv + side * a for a in A]
        want = [int((v * 2**64).to_integral_value(rounding="ROUND_FLOOR")) for v in b]
    assert [int(c) for c in plan.main.c64] == want
    # a truncated-geometric group table (scale 1000 splits off low bits)
    big = nz._laplace_plan(1000.0)
    assert big.g > 0 and big.low
    tab = big.low[0]
    nbits = int(round(math.log2(tab.values.size)))
    with localcontext() as ctx:
        ctx.prec = 80
        rho = (-(Decimal(1) / Decimal(1000))).exp()
        den = 1 - rho ** (1 << nbits)
        want = [
            int(((1 - rho ** (i + 1)) / den * 2**64).to_integral_value(rounding="ROUND_FLOOR"))
            for i in range((1 << nbits) - 1)
        ]
    assert [int(c) for c in tab.c64] == want


def test_laplace_tie_fallback_bucket_path():
    """Force U's first 64 bits to equal floor(b_0 2^64), b_0 = P(X = 0); later blocks decide."""
    t = 3.0
    plan = nz._laplace_plan(t, light=False)
    B = dec_bits(lambda: dec_p0(t), 192)
    c0, B2, B3 = B >> 128, (B >> 64) & MASK64, B & MASK64
    assert int(plan.main.c64[0]) == c0 and 0 < B2 < MASK64 and 0 < B3 < MASK64
    w = c0 >> 48
    assert plan.main.bucket[w] == nz._FLAG  # the bucket holding c0 needs more bits
    x48 = (c0 & ((1 << 48) - 1)) << 16  # the sampler uses the top 48 bits of the next uint64
    script = [x48, B2 - 1, B2 + 1, B2, B3 - 1, B2, B3 + 1]
    bits = RiggedBits(w, script)
    out = plan.sample(4, bits)
    # U < p0 -> 0; U > p0 -> the next category, +1
    assert out.tolist() == [0, 1, 0, 1]
    assert not bits.script  # every programmed block was read, in order


def test_laplace_tie_fallback_light_path():
    t = 3.0
    plan = nz._LaplacePlan(t, light=True)
    B = dec_bits(lambda: dec_p0(t), 128)
    c0, B2 = B >> 64, B & MASK64
    bits = RiggedBits(0, [c0, B2 + 1, B2 - 1])
    assert plan.sample(2, bits).tolist() == [1, 0]


def test_gaussian_acceptance_tie_fallback():
    sigma = 4.0
    plan = nz._gauss_plan(sigma)
    assert plan.step == 1
    c = Decimal(16) / Decimal(5)  # sigma^2 / t, t = floor(sigma) + 1 = 5

    def a_bits(y: int) -> int:
        return dec_bits(lambda: (-((Decimal(y) - c) ** 2) / Decimal(32)).exp(), 192)

    ys = [0, 3, 5, 0]
    A = {y: a_bits(y) for y in set(ys)}
    first = [A[y] >> 128 for y in ys]
    mid = {y: (A[y] >> 64) & MASK64 for y in A}
    low = {y: A[y] & MASK64 for y in A}
    # 16 bits, then 48 more (the top of a uint64), then further 64-bit blocks
    w = np.array([f >> 48 for f in first], dtype=np.uint16)
    x = np.array([(f & ((1 << 48) - 1)) << 16 for f in first], dtype=np.uint64)
    script = [x, mid[0] - 1, mid[3] + 1, mid[5], low[5] - 1, mid[0], low[0] + 1]
    bits = RiggedBits([w], script)
    acc = plan.accept(np.array(ys, dtype=np.int64), bits)
    assert acc.tolist() == [True, False, True, False]
    assert not bits.script


def test_gaussian_coarse_grid_exact_resolution():
    sigma = 5000.0
    plan = nz._gauss_plan(sigma)
    assert plan.step > 1
    ys = [7, 4999, 5003, 31000]

    def a_value(y: int) -> Decimal:  # evaluated inside dec_bits' high-precision context
        cF = Decimal(sigma) ** 2 / Decimal(plan.t)
        return (-((Decimal(y) - cF) ** 2) / (2 * Decimal(sigma) ** 2)).exp()

    A = {y: dec_bits(lambda y=y: a_value(y), 128) for y in ys}
    u = []
    want = []
    script_tail = []
    for y in ys:  # u just below, just above and equal to floor(a 2^64)
        c64 = A[y] >> 64
        u += [c64 - 1, c64 + 1, c64]
        want += [True, False, None]
        script_tail += [(A[y] & MASK64) + 1]  # the tie is then decided by the second block: U > a
    yarr = np.repeat(np.array(ys, dtype=np.int64), 3)
    w = np.array([v >> 48 for v in u], dtype=np.uint16)
    x = np.array([(v & ((1 << 48) - 1)) << 16 for v in u], dtype=np.uint64)
    bits = RiggedBits([w], [x] + script_tail)
    acc = plan.accept(yarr, bits).tolist()
    for got, exp in zip(acc, want):
        assert got == (False if exp is None else exp)
    assert not bits.script


def test_u_below_multi_block():
    """_u_below against a constant with known bits, across several equal 64-bit blocks."""
    bval = (5 << 128) | (7 << 64) | 9  # b = that / 2^192, a dyadic test constant

    def floor_bits(n: int) -> int:
        return bval >> (192 - n) if n <= 192 else bval << (n - 192)

    assert nz._u_below([5], floor_bits, RiggedBits(0, [7, 8])) is True
    assert nz._u_below([5], floor_bits, RiggedBits(0, [7, 10])) is False
    assert nz._u_below([5], floor_bits, RiggedBits(0, [6])) is True
    assert nz._u_below([5], floor_bits, RiggedBits(0, [8])) is False


# ----------------------------------------------------------------------------------------------
# parameter checks: before any draw
# ----------------------------------------------------------------------------------------------

BAD_SCALES = [0, -1.0, float("nan"), float("inf"), np.array([1.0, 0.0]), np.array([1.0, np.nan]), "x", None]


@pytest.mark.parametrize("bad", BAD_SCALES, ids=repr)
def test_invalid_scale_raises_before_any_draw(bad):
    for f in (nz.discrete_laplace, nz.discrete_gaussian):
        src = RecordingBits()
        with pytest.raises(InvalidPrivacyParameterError):
            f(bad, 10, rng=src)
        assert src.calls == 0
    for f in (nz.laplace, nz.gaussian):
        gen = np.random.default_rng(0)
        before = gen.bit_generator.state
        with pytest.raises(InvalidPrivacyParameterError):
            f(bad, 10, rng=gen)
        assert gen.bit_generator.state == before
    for secure in (False, True):
        with pytest.raises(InvalidPrivacyParameterError):
            nz.noise("laplace", bad, 10, rng=0, secure=secure)


def test_scale_too_large_for_exact_sampler():
    with pytest.raises(InvalidPrivacyParameterError):
        nz.discrete_laplace(1e13, 5, rng=RecordingBits())


# ----------------------------------------------------------------------------------------------
# dispatcher and grid snapping
# ----------------------------------------------------------------------------------------------


def test_noise_dispatcher():
    for kind in ("laplace", "gaussian"):
        f = nz.noise(kind, 2.0, 1000, rng=1)
        assert f.dtype == np.float64 and np.any(f != np.round(f))
        s = nz.noise(kind, 2.0, 1000, rng=1, secure=True)
        assert s.dtype == np.float64 and np.all(s == np.round(s))
    np.testing.assert_array_equal(nz.noise("laplace", 2.0, 50, rng=4, secure=True), nz.discrete_laplace(2.0, 50, rng=4))
    with pytest.raises(SparseDPError):
        nz.noise("cauchy", 1.0, 5)


def test_snap_to_grid():
    v = np.array([0.24, 0.26, -1.1, 3.0])
    np.testing.assert_array_equal(nz.snap_to_grid(v, 0.5), [0, 1, -2, 6])
    assert nz.snap_to_grid(v, 0.5).dtype == np.int64
    counts = np.array([3, 0, 7])
    np.testing.assert_array_equal(nz.snap_to_grid(counts, 1.0), counts)  # exact for integer data
    with pytest.raises(NonFiniteInputError):
        nz.snap_to_grid([1.0, np.inf], 1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        nz.snap_to_grid([1.0], 0.0)
    with pytest.raises(SparseDPError):
        nz.snap_to_grid([1e30], 1.0)


# ----------------------------------------------------------------------------------------------
# more exactness checks: large samples, test power, internals
# ----------------------------------------------------------------------------------------------


def test_large_sample_and_power():
    t, sigma, n = 3.0, 4.0, 2_000_000
    x = nz.discrete_laplace(t, n, rng=51)
    support = np.arange(-200, 201)
    assert chisquare_integer(x, support, dlap_pmf(support, t)) > 1e-3
    # the same test has power: a 2% change of scale is rejected
    assert chisquare_integer(x, support, dlap_pmf(support, t * 1.02)) < 1e-6
    g = nz.discrete_gaussian(sigma, n, rng=52)
    sup, pmf = dgauss_pmf_table(sigma)
    assert chisquare_integer(g, sup, pmf) > 1e-3
    sup2, pmf2 = dgauss_pmf_table(sigma * 1.01)
    assert chisquare_integer(g, sup2, pmf2) < 1e-6


def test_geometric_overflow_rounds():
    """H ~ Geometric(rho) through the table's overflow category (probability ~2^-10 per round)."""
    t = 25.5
    plan = nz._laplace_plan(t)
    assert plan.g == 0
    h = plan.geometric(N, nz.SecureRandomBits(np.random.default_rng(53)))
    assert h.min() >= 0 and np.count_nonzero(h >= plan.T) > 50  # overflow rounds happened
    rho = math.exp(-1 / t)
    support = np.arange(0, 2000)
    pmf = (1 - rho) * rho**support
    assert chisquare_integer(h, support, pmf / pmf.sum()) > 1e-3


def test_chunked_draws(monkeypatch):
    monkeypatch.setattr(nz, "_CHUNK", 1000)
    x = nz.discrete_laplace(4.0, 5500, rng=54)
    y = nz.discrete_gaussian(4.0, 5500, rng=54)
    assert x.shape == y.shape == (5500,)
    assert abs(x.var() / nz.discrete_laplace_variance(4.0) - 1) < 0.15
    assert abs(y.var() / 16.0 - 1) < 0.15


try:
    from hypothesis import given, settings
    from hypothesis import strategies as hst
except ImportError:  # pragma: no cover
    given = None

if given is not None:

    @settings(max_examples=40, deadline=None)
    @given(hst.fractions(min_value=0, max_value=200, max_denominator=10**6), hst.integers(30, 120))
    def test_interval_exp_encloses(x, digits):
        ia = nz._IA(digits)
        lo, hi = ia.exp_neg(ia.const(x))
        with localcontext() as ctx:
            ctx.prec = digits + 60
            v = (-(Decimal(x.numerator) / Decimal(x.denominator))).exp()
        assert lo <= v <= hi
        # width: the rounding of x (relative 10^-digits) is amplified by x in exp(-x)
        assert (hi - lo) <= v * (Decimal(float(x)) + 2) * Decimal(10) ** (-digits + 2) + Decimal(10) ** (-digits * 10)

    @settings(max_examples=15, deadline=None)
    @given(hst.floats(min_value=0.05, max_value=5e4, allow_nan=False))
    def test_first_boundary_exact_for_any_scale(t):
        plan = nz._LaplacePlan(t, light=True)
        want = dec_bits(lambda: dec_p0(t), 64)
        assert int(plan.main.c64[0]) == want


def test_tail_branch_runs_on_every_call(monkeypatch):
    # issue 19 #10: the overflow continuation of the exact discrete Laplace used to run only when a
    # value landed in the tail (a call took 2-2.5x longer then: a timing channel).  It now runs on
    # every call, on a dummy draw when nothing is in the tail.
    from sparsedp.noise import _LaplacePlan

    calls: list[int] = []
    real = _LaplacePlan.geometric

    def spy(self, m, bits):
        calls.append(m)
        return real(self, m, bits)

    monkeypatch.setattr(_LaplacePlan, "geometric", spy)
    for _ in range(200):
        nz.discrete_laplace(1.0, size=1, rng=np.random.default_rng(len(calls)))
    assert len(calls) == 200 and min(calls) >= 1
