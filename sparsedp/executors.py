"""Where independent work runs: in-process, a thread pool, or a ``dask.distributed`` cluster.

An executor has three methods:

* ``scatter(objects) -> handles``: place long-lived objects (e.g. constraint blocks with their cached
  factorisations) where the work runs.  In-process and threads return the objects themselves; Dask
  scatters them once to the workers, so a block's factor is built once on its worker and reused.
* ``map(fn, *iterables, callback=None) -> list``: ``[fn(*args) for args in zip(*iterables)]``,
  possibly in parallel; results come back in order.  ``callback()`` (if given) is called once per
  finished task, in the order they finish (progress bars).
* ``close()``: release what the executor created (not a client it was given).

Results do not depend on the executor: every task is a pure function of its arguments.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor as _Pool
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from .errors import SparseDPError

__all__ = ["Executor", "InProcessExecutor", "ThreadExecutor", "DaskExecutor", "get_executor", "WORKER_MALLOC_ENV"]

#: glibc settings for ``LocalCluster`` worker processes (see :meth:`DaskExecutor.local`): large
#: arrays (up to 32 MB) come from the heap and freed heap memory is kept (up to 1 GB at the top).
#: For ``dask worker`` set them through Dask's config, e.g.
#: ``DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON__MALLOC_TRIM_THRESHOLD_=1073741824``.
WORKER_MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": 2**30, "MALLOC_MMAP_THRESHOLD_": 2**25}


@runtime_checkable
class Executor(Protocol):
    """The interface every executor offers."""

    name: str

    def scatter(self, objects: list[Any]) -> list[Any]: ...

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            callback: Callable[[], Any] | None = None) -> list[Any]: ...

    def close(self) -> None: ...


class InProcessExecutor:
    """Run every task here, one after the other (the default; the tasks themselves are vectorised)."""

    name = "inprocess"

    def scatter(self, objects: list[Any]) -> list[Any]:
        return list(objects)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            callback: Callable[[], Any] | None = None) -> list[Any]:
        out = []
        for args in zip(*iterables):
            out.append(fn(*args))
            if callback is not None:
                callback()
        return out

    def close(self) -> None:
        return None

    def __enter__(self) -> "InProcessExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ThreadExecutor(InProcessExecutor):
    """A thread pool; numpy, scipy and CHOLMOD release the GIL in their heavy kernels."""

    name = "threads"

    def __init__(self, max_workers: int | None = None) -> None:
        if max_workers is not None and int(max_workers) < 1:
            raise SparseDPError(f"max_workers must be >= 1, got {max_workers!r}")
        self._pool = _Pool(max_workers=max_workers)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            callback: Callable[[], Any] | None = None) -> list[Any]:
        if callback is None:
            return list(self._pool.map(fn, *iterables))
        from concurrent.futures import as_completed

        futures = [self._pool.submit(fn, *args) for args in zip(*iterables)]
        for _ in as_completed(futures):
            callback()
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class DaskExecutor(InProcessExecutor):
    """Tasks on a ``dask.distributed.Client``: a ``LocalCluster`` on this machine or a remote scheduler.

    ``DaskExecutor(client)`` uses a client you own (``close()`` leaves it open);
    ``DaskExecutor.local(n_workers, threads_per_worker, processes, memory_limit)`` starts a
    ``LocalCluster`` and closes it on ``close()``; ``DaskExecutor.connect(address)`` connects to a
    running scheduler.  A task whose worker dies is run again on another worker by Dask (up to the
    ``distributed.scheduler.allowed-failures`` setting); tasks must therefore be safe to repeat.
    """

    name = "dask"

    def __init__(self, client: Any, owns: bool = False) -> None:
        self.client = client
        self._owns = owns

    @classmethod
    def local(cls, n_workers: int = 2, threads_per_worker: int = 1, processes: bool = True,
              memory_limit: str | int | None = None, malloc_env: dict | None = None) -> "DaskExecutor":
        """A new ``LocalCluster`` (``memory_limit`` per worker, e.g. ``"4GB"``; ``None``: Dask's
        default, the machine's memory shared among the workers).

        Worker processes start with :data:`WORKER_MALLOC_ENV` (or the variables in ``malloc_env``,
        merged over Dask's ``distributed.nanny.pre-spawn-environ``) in place of Dask's
        ``MALLOC_TRIM_THRESHOLD_=65536``: with Dask's value
        every large numpy temporary is a fresh ``mmap`` whose pages fault in again, and a
        scale-out chunk task (``2^20`` leaves) took 0.69 s on a worker against 0.29 s in-process;
        with these it took 0.28 s (measured, 6 tasks each).  Workers then keep their peak heap
        instead of returning it to the system between tasks."""
        import dask
        from dask.distributed import Client, LocalCluster

        if int(n_workers) < 1 or int(threads_per_worker) < 1:
            raise SparseDPError(f"need n_workers >= 1 and threads_per_worker >= 1, got {n_workers}, {threads_per_worker}")
        extra = {} if memory_limit is None else {"memory_limit": memory_limit}
        env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
        env.update(WORKER_MALLOC_ENV if malloc_env is None else malloc_env)
        with dask.config.set({"distributed.nanny.pre-spawn-environ": env}):
            cluster = LocalCluster(
                n_workers=int(n_workers),
                threads_per_worker=int(threads_per_worker),
                processes=processes,
                dashboard_address=None,
                **extra,
            )
        return cls(Client(cluster), owns=True)

    @classmethod
    def connect(cls, address: str) -> "DaskExecutor":
        from dask.distributed import Client

        return cls(Client(address), owns=True)

    def scatter(self, objects: list[Any]) -> list[Any]:
        return list(self.client.scatter(list(objects), hash=False))

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            callback: Callable[[], Any] | None = None) -> list[Any]:
        args = [list(it) for it in iterables]
        futures = self.client.map(fn, *args, pure=False)
        try:
            if callback is not None:
                from dask.distributed import as_completed

                for _ in as_completed(futures):
                    callback()
            return list(self.client.gather(futures))
        finally:
            self.client.cancel(futures)  # results are copied here; free them on the workers

    def close(self) -> None:
        if self._owns:
            cluster = getattr(self.client, "cluster", None)
            self.client.close()
            if cluster is not None:
                cluster.close()


def get_executor(spec: Any = None) -> Executor:
    """An executor from ``None`` / ``"inprocess"``, ``"threads"``, ``"dask"`` (a new ``LocalCluster``),
    a ``dask.distributed.Client``, or an executor (returned as is)."""
    if spec is None or spec == "inprocess":
        return InProcessExecutor()
    if spec == "threads":
        return ThreadExecutor()
    if spec == "dask":
        return DaskExecutor.local()
    if isinstance(spec, Executor):
        return spec
    if type(spec).__name__ == "Client" and hasattr(spec, "scatter"):
        return DaskExecutor(spec)
    raise SparseDPError(f"unknown executor {spec!r}: use None, 'inprocess', 'threads', 'dask', a Client or an Executor")
