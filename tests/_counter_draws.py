"""Test helper (not collected): many independent releases of one online counter, cheaply.

``counter_releases(make, x, R, seed)`` returns the ``(R, horizon)`` releases of ``R`` independent
runs of the counter ``make(rng)`` on ``x``, as ``R`` counters would make them, but with one plan:
the ``R`` noise vectors come in one call from the plan's own ``measure`` (``audit.plan_release``,
through the counter's ``_draw_offsets`` hook) and are mapped to offsets by the counter's own steps
(``_offset_matrix``).  The counter's own seeded release on ``x`` is checked first to be
``cumsum(x) + B z`` for the noise ``z`` it drew (the hooks are the counter; see
tests/test_continual_test_hooks.py), so an error in the counter's steps still fails the tests.
"""

from __future__ import annotations

import numpy as np


def drawn_noise(fresh, seed):
    """The noise a counter ``make(seed)`` draws, from a fresh (unused) copy ``fresh``: the rows of its
    keyed noise (a resumable counter: each row's noise is a function of the key derived from the
    seed and the row), else its plan's stream seeded with ``seed``."""
    if getattr(fresh._noise, "keys", None) is not None:
        return fresh._noise.all()
    return fresh.plan.noise_stream(rng=seed, chunk=fresh.plan.rows).all()


def counter_releases(make, x, R, seed):
    x = np.asarray(x, dtype=np.float64)
    s = np.cumsum(x)
    out = make(seed).run(x)
    fresh = make(seed)
    B = fresh._offset_matrix()
    z = drawn_noise(fresh, seed)  # what make(seed) drew
    np.testing.assert_allclose(out - s, B @ z, rtol=1e-9, atol=1e-9 * (np.abs(out).max() + 1.0))
    errs = fresh._draw_offsets(R, np.random.default_rng(seed))
    assert errs.shape == (R, x.size)
    return s + errs


def batched_counter_release(make, post=None):
    """An ``audit(..., batched=True)`` release of the counter ``make(rng)`` on the data: per call,
    one counter's plan, ``k`` noise vectors in one call (``_draw_offsets``), ``post`` (a vectorised
    post-processing of the ``(k, horizon)`` released running sums) applied.  Each call first checks
    that the counter's own release on this data, seeded from the audit's generator, is ``cumsum(x)
    + B z`` for the noise it drew."""

    def release(x, g, k):
        x = np.asarray(x, dtype=np.float64)
        seed = int(g.integers(2**62))
        c = make(seed)
        B = c._offset_matrix()
        out = make(seed).run(x)
        z = drawn_noise(c, seed)
        np.testing.assert_allclose(out, np.cumsum(x) + B @ z, rtol=1e-9, atol=1e-9 * (np.abs(out).max() + 1.0))
        S = np.cumsum(x) + c._draw_offsets(k, g, B)
        return S if post is None else post(S)

    return release


_BLT_FITS: dict = {}


def memoise_fit_blt(monkeypatch):
    """BLTCounter fits its default BLT (``fit_blt``: deterministic, ~1-2 s) on every construction;
    test modules that build the same ``(N, buffers)`` many times memoise the fit (an autouse fixture
    calls this): the counter still takes its default path and gets the same frozen BLT."""
    from sparsedp.continual import toeplitz

    fit = toeplitz.fit_blt

    def memo(N, buffers=5, *args, **kw):
        key = (N, buffers, args, tuple(sorted(kw.items())))
        if key not in _BLT_FITS:
            _BLT_FITS[key] = fit(N, buffers, *args, **kw)
        return _BLT_FITS[key]

    monkeypatch.setattr(toeplitz, "fit_blt", memo)


def counter_offset_shape(make, answer_variances):
    """The error shape a counter's released values have: ``cumsum(x) + B z`` with ``B`` the offset
    matrix of a fresh counter (``make(seed)``) and ``z`` its plan's noise
    (:func:`sparsedp.accuracy.error_shape`)."""
    from sparsedp.accuracy import error_shape

    ctr = make(7)
    plan = ctr.plan
    return error_shape(ctr._offset_matrix(), plan.noise, secure=plan.secure, variances=plan.variances(),
                       unit_scales=plan.unit_scales, answer_variances=answer_variances)
