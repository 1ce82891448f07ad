"""Partitioned inputs and outputs: one block of leaves per task, never the whole vector on one process.

Inputs (:func:`as_input`): a ``.npy`` file (memory-mapped: a task reads only its block's bytes), a
Zarr array (``.zarr``, with the ``scale`` extra), a ``dask.array`` (each task computes its own
block with the synchronous scheduler: give arrays whose graphs are small, e.g. :func:`open_array`
or ``da.from_zarr``; ``da.from_array`` of an in-memory array ships that array with every task), or
an in-memory numpy array (sliced on the driver: for tests and small data).  Each block reader is a
small picklable object; a task calls ``read()``.

Outputs (:func:`as_output`): a ``.npy`` file created on the driver at full size (sparse on disk)
and written block by block through a memory map, a Zarr array (``.zarr``) whose chunks are the
blocks, or ``None`` (the blocks are returned to the driver and concatenated: small data only).
On a real cluster both files must live on storage every worker can reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ShapeError, SparseDPError
from ..safe_files import open_zarr, zarr_module
from ._store import is_zarr, npy_header, stored_shape

__all__ = ["as_input", "as_output", "open_array", "BlockReader", "ChunkedInput", "ChunkedOutput"]


@dataclass(frozen=True)
class BlockReader:
    """Reads leaves ``[lo, hi)`` of one input: ``kind`` ``"npy"`` / ``"zarr"`` (``source`` a path),
    ``"dask"`` (``source`` the block's dask array) or ``"array"`` (``source`` the block itself)."""

    kind: str
    source: Any
    lo: int
    hi: int

    def read(self) -> np.ndarray:
        if self.kind == "npy":
            return np.array(np.load(self.source, mmap_mode="r", allow_pickle=False)[self.lo : self.hi])
        if self.kind == "zarr":
            return np.asarray(open_zarr(self.source)[self.lo : self.hi])
        if self.kind == "dask":
            return np.asarray(self.source.compute(scheduler="sync"))
        return np.asarray(self.source)


@dataclass(frozen=True)
class ChunkedInput:
    """A 1-D input of ``n`` leaves in blocks of ``chunk`` (the last may be shorter)."""

    n: int
    chunk: int
    kind: str
    source: Any

    def block(self, q: int) -> BlockReader:
        lo, hi = q * self.chunk, min((q + 1) * self.chunk, self.n)
        if self.kind == "dask":
            return BlockReader("dask", self.source[lo:hi], lo, hi)
        if self.kind == "array":
            return BlockReader("array", self.source[lo:hi], lo, hi)
        return BlockReader(self.kind, self.source, lo, hi)

    def blocks(self) -> list[BlockReader]:
        return [self.block(q) for q in range(-(-self.n // self.chunk))]


def native_chunks(data: Any) -> tuple[int, ...] | None:
    """The block lengths a dask array or Zarr array already has (``None`` for other inputs)."""
    if hasattr(data, "chunks") and hasattr(data, "dask"):
        return tuple(int(c) for c in data.chunks[0])
    if isinstance(data, (str, Path)) and is_zarr(Path(data)):
        z = open_zarr(data)
        c = int(z.chunks[0])
        n = int(z.shape[0])
        return tuple(min(c, n - lo) for lo in range(0, n, c))
    return None


def input_length(data: Any) -> int:
    """Number of leaves of an input (1-D), without reading it."""
    shape = stored_shape(data, "input")
    if len(shape) != 1 or shape[0] < 1:
        raise ShapeError(f"the histogram must be a non-empty 1-D array, got shape {shape}")
    return int(shape[0])


def as_input(data: Any, chunk: int, n: int | None = None) -> ChunkedInput:
    """The input in blocks of ``chunk`` leaves (see the module docstring for the kinds) along its
    first axis, ``n`` long (default: :func:`input_length`, a 1-D histogram; give ``n`` for 2-D data)."""
    if n is None:
        n = input_length(data)
    if isinstance(data, (str, Path)):
        path = Path(data)
        return ChunkedInput(n, chunk, "zarr" if is_zarr(path) else "npy", str(path.resolve()))
    if hasattr(data, "dask") and hasattr(data, "chunks"):
        return ChunkedInput(n, chunk, "dask", data)
    return ChunkedInput(n, chunk, "array", np.asarray(data))


def _read_npy_block(path: str, block_info: Any = None) -> np.ndarray:
    lo, hi = block_info[None]["array-location"][0]
    return np.array(np.load(path, mmap_mode="r", allow_pickle=False)[lo:hi])


def open_array(path: str | Path, chunk: int) -> Any:
    """A ``dask.array`` over a ``.npy`` file (memory-mapped, one small read task per block) or a Zarr
    array, in blocks of ``chunk`` leaves; its graph holds the path only, never the data."""
    import dask.array as da

    p = Path(path)
    n = input_length(p)
    if is_zarr(p):
        return da.from_zarr(open_zarr(p)).rechunk(chunk)
    _, dtype = npy_header(p)
    sizes = tuple(min(chunk, n - lo) for lo in range(0, n, chunk))
    return da.map_blocks(_read_npy_block, str(p.resolve()), chunks=(sizes,), dtype=dtype, meta=np.empty(0, dtype))


@dataclass(frozen=True)
class BlockWriter:
    """Writes the final estimates of leaves ``[lo, hi)``: ``kind`` ``"npy"``, ``"zarr"`` or
    ``"return"`` (handed back to the driver); ``cols``: ``None`` for a 1-D output, else the width of
    each row (rows ``[lo, hi)`` of a ``(n, cols)`` output)."""

    kind: str
    path: str | None
    lo: int
    hi: int
    cols: int | None = None

    def write(self, values: np.ndarray) -> np.ndarray | None:
        if self.cols is None and values.shape != (self.hi - self.lo,):
            raise ShapeError(f"block [{self.lo}, {self.hi}) got {values.shape[0]} values")
        if self.cols is not None and values.shape != (self.hi - self.lo, self.cols):
            raise ShapeError(f"rows [{self.lo}, {self.hi}) got values of shape {values.shape}")
        if self.kind == "npy":
            out = np.load(self.path, mmap_mode="r+", allow_pickle=False)
            out[self.lo : self.hi] = values
            out.flush()
            del out
            return None
        if self.kind == "zarr":
            open_zarr(self.path, mode="r+")[self.lo : self.hi] = values
            return None
        return values


@dataclass(frozen=True)
class ChunkedOutput:
    """Where the release goes: a ``.npy`` / ``.zarr`` path, or ``None`` (returned in memory); ``n``
    values (``cols=None``) or an ``(n, cols)`` array cut into blocks of ``chunk`` rows."""

    n: int
    chunk: int
    kind: str
    path: str | None
    cols: int | None = None

    def block(self, q: int) -> BlockWriter:
        return BlockWriter(self.kind, self.path, q * self.chunk, min((q + 1) * self.chunk, self.n), self.cols)

    def create(self) -> None:
        """Make the empty output (driver side, before any block is written)."""
        tail = () if self.cols is None else (self.cols,)
        if self.kind == "npy":
            np.lib.format.open_memmap(self.path, mode="w+", dtype=np.float64, shape=(self.n, *tail)).flush()
        elif self.kind == "zarr":
            open_zarr(self.path, mode="w", shape=(self.n, *tail), chunks=(self.chunk, *tail), dtype="f8")

    def load(self) -> np.ndarray:
        """The written release (memory-mapped for ``.npy``)."""
        if self.kind == "return":
            raise SparseDPError("an in-memory release has no file to load")
        return load_output(self.path)


def load_output(path: str | None) -> np.ndarray:
    """A written release: a ``.npy`` file memory-mapped, a ``.zarr`` array read whole."""
    if path is None:
        raise SparseDPError("an in-memory release has no file to load")
    if Path(path).suffix == ".npy":
        return np.load(path, mmap_mode="r", allow_pickle=False)
    return np.asarray(open_zarr(path)[:])


def as_output(out: Any, n: int, chunk: int, cols: int | None = None) -> ChunkedOutput:
    """The output target: ``None`` (in memory), or a ``.npy`` / ``.zarr`` path; ``n`` values, or
    ``(n, cols)`` rows with ``cols``."""
    if out is None:
        return ChunkedOutput(n, chunk, "return", None, cols)
    p = Path(out)
    if p.suffix == ".zarr":
        zarr_module()
        return ChunkedOutput(n, chunk, "zarr", str(p.resolve()), cols)
    if p.suffix == ".npy":
        return ChunkedOutput(n, chunk, "npy", str(p.resolve()), cols)
    raise SparseDPError(f"{out}: the scale-out output must be a .npy or .zarr path")
