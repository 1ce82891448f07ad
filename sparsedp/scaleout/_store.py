"""Array files of the scale-out path: what a ``.npy`` / ``.zarr`` input is and how large, without
reading its data.  One home for these helpers, shared by :mod:`sparsedp.scaleout.chunked` (1-D
histograms), :mod:`sparsedp.scaleout.lue` and :mod:`sparsedp.scaleout.treespan` (``(days, 5)`` sales)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..safe_files import open_zarr  # every Zarr array is opened through open_zarr (its metadata checked first)


def is_zarr(path: Path) -> bool:
    """``path`` names a Zarr array: a ``.zarr`` suffix, or a directory holding Zarr metadata."""
    return path.suffix == ".zarr" or (path.is_dir() and any((path / f).exists() for f in ("zarr.json", ".zarray")))


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` file (memory-mapped: no data read)."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SparseDPError(f"cannot read {path} as a .npy array: {exc}") from exc
    return arr.shape, arr.dtype


def stored_shape(data: Any, what: str = "input") -> tuple[int, ...]:
    """The shape of a ``.npy`` / ``.zarr`` path (from its metadata) or of an array-like, no data read;
    another kind of path is a :class:`SparseDPError` (``what`` names the input in the message)."""
    if isinstance(data, (str, Path)):
        path = Path(data)
        if is_zarr(path):
            return tuple(open_zarr(path).shape)
        if path.suffix == ".npy":
            return tuple(npy_header(path)[0])
        raise SparseDPError(f"{path}: scale-out {what} must be a .npy file or a .zarr array")
    return tuple(getattr(data, "shape", np.shape(data)))
