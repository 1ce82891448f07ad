"""Where independent work runs: in-process, a thread pool, or a ``dask.distributed`` cluster.

An executor has three methods:

* ``scatter(objects) -> handles``: place long-lived objects (e.g. constraint blocks with their cached
  factorisations) where the work runs.  In-process and threads return the objects themselves; Dask
  scatters them once to the workers, so a block's factor is built once on its worker and reused.
* ``map(fn, *iterables) -> list``: ``[fn(*args) for args in zip(*iterables)]``, possibly in
  parallel; results come back in order.
* ``close()``: release what the executor created (not a client it was given).

Results do not depend on the executor: every task is a pure function of its arguments.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor as _Pool
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from .errors import SparseDPError

__all__ = ["Executor", "InProcessExecutor", "ThreadExecutor", "DaskExecutor", "get_executor"]


@runtime_checkable
class Executor(Protocol):
    """The interface every executor offers."""

    name: str

    def scatter(self, objects: list[Any]) -> list[Any]: ...

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[Any]: ...

    def close(self) -> None: ...


class InProcessExecutor:
    """Run every task here, one after the other (the default; the tasks themselves are vectorised)."""

    name = "inprocess"

    def scatter(self, objects: list[Any]) -> list[Any]:
        return list(objects)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[Any]:
        return [fn(*args) for args in zip(*iterables)]

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

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[Any]:
        return list(self._pool.map(fn, *iterables))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class DaskExecutor(InProcessExecutor):
    """Tasks on a ``dask.distributed.Client``: a ``LocalCluster`` on this machine or a remote scheduler.

    ``DaskExecutor(client)`` uses a client you own (``close()`` leaves it open);
    ``DaskExecutor.local(n_workers, threads_per_worker, processes)`` starts a ``LocalCluster`` and
    closes it on ``close()``; ``DaskExecutor.connect(address)`` connects to a running scheduler.
    """

    name = "dask"

    def __init__(self, client: Any, owns: bool = False) -> None:
        self.client = client
        self._owns = owns

    @classmethod
    def local(cls, n_workers: int = 2, threads_per_worker: int = 1, processes: bool = True) -> "DaskExecutor":
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=processes,
            dashboard_address=None,
        )
        return cls(Client(cluster), owns=True)

    @classmethod
    def connect(cls, address: str) -> "DaskExecutor":
        from dask.distributed import Client

        return cls(Client(address), owns=True)

    def scatter(self, objects: list[Any]) -> list[Any]:
        return list(self.client.scatter(list(objects), hash=False))

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[Any]:
        args = [list(it) for it in iterables]
        futures = self.client.map(fn, *args, pure=False)
        return list(self.client.gather(futures))

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
