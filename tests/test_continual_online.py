"""The online convolutions of the exact Toeplitz counters (sparsedp.continual._online): equal to the
direct products (float: within rounding; integers: exactly), and the counters' blocked release equal
to their direct ``O(t)`` release."""

import numpy as np
import pytest

from sparsedp.continual import BLTCounter, SqrtCounter, ToeplitzCounter, sqrt_coefficients
from sparsedp.continual._online import ExactOnlineConvolution, OnlineConvolution


@pytest.mark.parametrize("n, direct", [(1, 4), (7, 4), (300, 4), (1000, 16)])
def test_online_convolution_equals_the_direct_product(n, direct):
    rng = np.random.default_rng(n)
    h, x = rng.standard_normal(n), rng.standard_normal(n)
    conv = OnlineConvolution(h, n, direct)
    got = np.array([conv.push(i, v) for i, v in enumerate(x)])
    want = np.convolve(h, x)[:n]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(h).sum() * np.abs(x).max())


def test_exact_online_convolution_is_exact_for_large_integers():
    n, direct = 700, 4
    rng = np.random.default_rng(5)
    h = rng.integers(-(2**21), 2**21, n)
    x = rng.integers(0, 50, n)
    x[[3, 100, 257]] = [2**50 - 1, 2**49 + 12345, 2**47]
    conv = ExactOnlineConvolution(h, n, 50, direct)
    got = [conv.push(i, int(v)) for i, v in enumerate(x)]
    hl, xl = [int(v) for v in h], [int(v) for v in x]
    want = [sum(hl[k] * xl[t - k] for k in range(direct, t + 1)) for t in range(n)]
    assert got == want


@pytest.mark.parametrize("make", [
    lambda N: SqrtCounter(N, 0.5, rng=3),
    lambda N: BLTCounter(N, 0.5, buffers=3, rng=3),
    lambda N: ToeplitzCounter(N, 0.5, sqrt_coefficients(N), rng=3, increments="unit"),
    lambda N: SqrtCounter(N, 0.5, rng=3, secure=False),
])
def test_blocked_release_equals_the_direct_release(make):
    N = 600
    x = np.random.default_rng(1).integers(0, 2, N).astype(float)
    x[17] = 2.0**40 if make(1).increments == "counts" else 1.0
    fast, slow = make(N), make(N)
    fast.direct_lags, slow.direct_lags = 8, N  # many FFT levels against the O(t) computation
    a, b = fast.run(x), slow.run(x)
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("make", [lambda N: SqrtCounter(N, 0.5, rng=3), lambda N: BLTCounter(N, 0.5, buffers=2, rng=3)])
def test_blocked_release_is_a_function_of_the_measurement(make):
    """The coupling of tests/test_postprocessing_rule.py with the FFT levels in use: a stream and its
    neighbour, with noise moved so that ``y = M' x + z`` is the same, release the same bits."""
    N = 300
    gen = np.random.default_rng(11)
    ctr = make(N)
    ctr.direct_lags = 8
    M = ctr.measured_strategy().tocsr()
    for _ in range(3):
        x0 = gen.integers(0, 4, N).astype(float)
        x1 = x0.copy()
        x1[int(gen.integers(N))] += 1.0
        z0 = ctr.plan.grid * np.rint(gen.normal(0.0, ctr.sigma / ctr.plan.grid, N))
        z1 = z0 + M @ (x0 - x1)
        np.testing.assert_array_equal(M @ x0 + z0, M @ x1 + z1)
        a, b = ctr._release_for(x0, z0), ctr._release_for(x1, z1)
        assert a.tobytes() == b.tobytes()
