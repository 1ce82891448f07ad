"""BLAS threads for the library's small dense kernels, chosen by the library (as scikit-learn does).

Multi-threaded OpenBLAS is much slower than one thread on the small dense products sparsedp runs
in loops (``m x 10`` panels, ``10 x 10`` cores, vector dots inside LSQR): every call pays the thread
start and synchronisation, and on a 2-core machine shared with other work the threads wait for each
other.  Measured with ``sparsedp complete --size 1000 --rank 10 --observed 0.15`` (the completion
solve, DLNM-QR): 2.7 s with OpenBLAS's default 2 threads against 0.29 s with one (the figures and
the list of kernels are in ``docs/choose.md``, "BLAS threads").

``blas_threads(limit=1)`` is a context manager and a decorator: inside it, every BLAS library
loaded in the process (numpy's and scipy's OpenBLAS are two different libraries) runs at most
``limit`` threads (``threadpoolctl.threadpool_limits(limit, user_api="blas")``), and the previous
counts come back on exit.  It does nothing

* when the user chose the thread count: any of ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``,
  ``MKL_NUM_THREADS``, ``BLIS_NUM_THREADS``, ``VECLIB_MAXIMUM_THREADS`` set in the environment
  (read at each entry, so a user's explicit setting always wins);
* when every BLAS library already runs at most ``limit`` threads (a few microseconds: the
  controller that lists the libraries is built once and cached);
* inside another ``blas_threads`` block (nested or from other threads: the first entry sets the
  limit, the last exit restores it; a limit is never raised, so a user's own lower
  ``threadpool_limits`` is kept).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import SparseDPError

__all__ = ["USER_ENV", "blas_threads", "user_chose_threads"]

F = TypeVar("F", bound=Callable[..., Any])

#: Environment variables by which a user chooses the BLAS thread count; if any is set, it is obeyed.
USER_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
            "VECLIB_MAXIMUM_THREADS")

_lock = threading.Lock()
_depth = 0  # open blas_threads blocks, all threads together
_restore: Any = None  # the threadpoolctl limiter of the outermost block that changed the limits
_controller: Any = None
_controller_libs: int = -1


def user_chose_threads(environ: Any = None) -> bool:
    """Whether the environment sets the BLAS thread count explicitly (a non-empty ``USER_ENV`` variable)."""
    env = os.environ if environ is None else environ
    return any(str(env.get(name, "")).strip() for name in USER_ENV)


def _blas_controller() -> Any:
    """A cached ``threadpoolctl.ThreadpoolController`` restricted to BLAS (rebuilt if none was found
    before, e.g. when the first call came before scipy loaded its BLAS)."""
    global _controller, _controller_libs
    if _controller is None or _controller_libs == 0:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController().select(user_api="blas")
        _controller_libs = len(_controller.lib_controllers)
    return _controller


def _enter(limit: int) -> None:
    global _depth, _restore
    with _lock:
        _depth += 1
        if _depth > 1 or user_chose_threads():
            return
        controller = _blas_controller()
        if all(lib.num_threads <= limit for lib in controller.lib_controllers):
            return
        _restore = controller.limit(limits=limit, user_api="blas")


def _exit() -> None:
    global _depth, _restore
    with _lock:
        _depth -= 1
        if _depth == 0 and _restore is not None:
            limiter, _restore = _restore, None
            limiter.restore_original_limits()


class blas_threads:
    """Run a block or a function with at most ``limit`` BLAS threads (see the module docstring).

    >>> import numpy as np
    >>> with blas_threads():
    ...     _ = np.ones((50, 10)) @ np.ones((10, 50))
    >>> @blas_threads(limit=1)
    ... def gram(a):
    ...     return a.T @ a
    >>> gram(np.eye(3)).shape
    (3, 3)
    """

    def __init__(self, limit: int = 1) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise SparseDPError(f"blas_threads: limit must be a positive int, got {limit!r}")
        self.limit = limit

    def __enter__(self) -> blas_threads:
        _enter(self.limit)
        return self

    def __exit__(self, *exc: object) -> None:
        _exit()

    def __call__(self, func: F) -> F:
        limit = self.limit

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _enter(limit)
            try:
                return func(*args, **kwargs)
            finally:
                _exit()

        return wrapper  # type: ignore[return-value]
