"""sparsedp._threads.blas_threads: BLAS limited inside, restored after, user's choice obeyed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import sparsedp._threads as T
from sparsedp._threads import USER_ENV, blas_threads, user_chose_threads
from sparsedp.errors import SparseDPError


def blas_counts() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


@pytest.fixture
def no_user_env(monkeypatch):
    for name in USER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def two_threads(no_user_env):
    """Every BLAS at 2 threads (as on a machine where nobody pinned them); skipped where impossible."""
    with threadpool_limits(2, user_api="blas"):
        if not blas_counts() or min(blas_counts()) < 2:
            pytest.skip("this BLAS cannot run 2 threads here")
        yield


def test_limits_inside_and_restores_after(two_threads):
    with blas_threads():
        assert blas_counts() and max(blas_counts()) == 1
    assert min(blas_counts()) == 2


def test_decorator_limits_returns_and_restores_on_error(two_threads):
    @blas_threads(limit=1)
    def kernel(a: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """A kernel."""
        return a @ a.T, blas_counts()

    value, inside = kernel(np.eye(3))
    assert np.array_equal(value, np.eye(3)) and max(inside) == 1
    assert kernel.__name__ == "kernel" and kernel.__doc__ == "A kernel."

    @blas_threads()
    def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fails()
    assert min(blas_counts()) == 2


def test_nested_blocks_restore_only_at_the_outermost_exit(two_threads):
    with blas_threads():
        with blas_threads():
            pass
        assert max(blas_counts()) == 1  # the inner exit did not restore
    assert min(blas_counts()) == 2


def test_concurrent_blocks_keep_the_limit_until_the_last_exit(two_threads):
    # (the counter logic; OpenBLAS may ignore a thread count set from a non-main thread)
    inside, release = threading.Event(), threading.Event()

    def worker() -> None:
        with blas_threads():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    limiter = T._restore
    assert limiter is not None and T._depth == 1
    with blas_threads():
        assert T._depth == 2
    assert T._restore is limiter and T._depth == 1  # not restored: the worker's block is still open
    release.set()
    t.join(10)
    assert T._restore is None and T._depth == 0


def test_users_environment_setting_wins(two_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert user_chose_threads()
    with blas_threads():
        assert min(blas_counts()) == 2


def test_user_chose_threads_reads_every_variable():
    assert not user_chose_threads({})
    assert not user_chose_threads({"OPENBLAS_NUM_THREADS": " "})
    for name in USER_ENV:
        assert user_chose_threads({name: "3"})


def test_already_limited_is_a_cheap_no_op(no_user_env):
    with threadpool_limits(1, user_api="blas"):
        with blas_threads():
            pass  # builds the cached controller
        assert T._restore is None
        n = 2000
        t = time.perf_counter()
        for _ in range(n):
            with blas_threads():
                pass
        per_call = (time.perf_counter() - t) / n
        assert T._restore is None and T._depth == 0
    assert per_call < 2e-4, f"{per_call * 1e6:.1f} us per entry"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_bad_limit_is_refused(bad):
    with pytest.raises(SparseDPError, match="positive int"):
        blas_threads(bad)
