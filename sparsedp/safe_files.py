"""Checks on the files a release reads or writes, before any of them is opened.

A release file is data from elsewhere: whoever made it chose every name and every byte in it.
So before sparsedp reads what a release file points to, or writes a release over an old one:

* :func:`resolve_inside`: a file a release names (a chunked release's array, a TopDown
  directory's parts) is a plain name inside the release's own directory, also after symlinks are
  followed; an absolute path or ``..`` would let a 400-byte record present any file on disk (the
  true counts, say) as its answers.
* :func:`open_zarr`: a Zarr array is opened only after its metadata (v2 ``.zarray``, v3
  ``zarr.json``) has been read as plain JSON and found to hold numbers (bool, integer or float)
  encoded by well-known numeric codecs (:data:`ZARR_CODECS`).  Zarr resolves codecs by name, and
  some run code while decoding (numcodecs' ``pickle`` filter unpickles each chunk), so a crafted
  array could otherwise run its payload when read.
* :func:`refuse_existing`: ``save`` never replaces an existing release unless asked
  (``overwrite=True``, the command line's ``--force``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .errors import ReleaseExistsError, SparseDPError, UnsafeFileError

__all__ = ["ZARR_CODECS", "check_zarr", "open_zarr", "refuse_existing", "resolve_inside", "zarr_module"]

#: The codecs (v2 ``compressor`` / ``filters`` ids, v3 ``codecs`` names) a Zarr array may use:
#: byte layout, checksums and lossless compressors of numeric data.  None of them runs code from
#: the file; anything else (``pickle``, object codecs, custom or unknown codecs) is refused.
ZARR_CODECS = frozenset({
    "bytes", "transpose", "sharding_indexed", "crc32c", "crc32", "adler32", "fletcher32",
    "blosc", "zstd", "gzip", "zlib", "lz4", "bz2", "lzma", "shuffle",
})
#: The numpy kinds of a Zarr array's elements sparsedp reads: bool, signed and unsigned integers, floats.
_NUMERIC_KINDS = "biuf"
#: The Zarr v3 ``data_type`` names of those kinds.
_V3_TYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                       "float16", "float32", "float64"})


# -- names a release file gives --------------------------------------------------------------------


def resolve_inside(directory: str | Path, name: str | os.PathLike[str]) -> Path:
    """The file ``name`` of a release in ``directory``, resolved (symlinks followed).

    ``name`` is what a release file says (a chunked release's answers array, a part of a TopDown
    directory): it must be a relative path without ``..`` that, after every symlink is followed,
    still lies inside ``directory``.  Anything else raises :class:`~sparsedp.errors.UnsafeFileError`
    naming it, before the file is opened.  The file need not exist (the caller says if it must)."""
    text = os.fspath(name)
    if not isinstance(text, str) or not text:
        raise UnsafeFileError(f"a release names the file {name!r}: not a file name")
    rel = Path(text)
    if rel.is_absolute() or rel.drive or rel.root:
        raise UnsafeFileError(f"a release names the absolute path {text!r}: a release file may name only files "
                              f"inside its own directory {directory}")
    if ".." in rel.parts:
        raise UnsafeFileError(f"a release names {text!r}, which leads out of its directory {directory} ('..'): a "
                              "release file may name only files inside its own directory")
    base = Path(directory).resolve()
    target = (base / rel).resolve()
    if not target.is_relative_to(base) or target == base:
        raise UnsafeFileError(f"a release names {text!r}, which resolves to {target}, outside its directory {base} "
                              "(a symlink leading out): a release file may name only files inside its own directory")
    return target


# -- writing ---------------------------------------------------------------------------------------


def refuse_existing(paths: Iterable[str | Path], overwrite: bool) -> None:
    """Raise :class:`~sparsedp.errors.ReleaseExistsError` when one of ``paths`` (the files a save
    would write) exists and ``overwrite`` is not set: a save never silently replaces an earlier
    release (as the command line refuses without ``--force``)."""
    if overwrite:
        return
    for p in paths:
        if os.path.lexists(p):
            raise ReleaseExistsError(f"{p} exists: refusing to replace an earlier release; pass overwrite=True to "
                                     "replace it, or choose another file")


# -- Zarr ------------------------------------------------------------------------------------------


def zarr_module() -> Any:
    """The ``zarr`` package, or a :class:`~sparsedp.errors.SparseDPError` naming the ``scale`` extra."""
    try:
        import zarr
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SparseDPError("Zarr input/output needs the zarr package: pip install 'sparsedp[scale]'") from exc
    return zarr


def _metadata(path: Path, name: str) -> dict | None:
    f = path / name
    if not f.is_file():
        return None
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise SparseDPError(f"cannot read the Zarr metadata {f}: {exc}") from exc
    if not isinstance(meta, dict):
        raise UnsafeFileError(f"{f} is not Zarr array metadata (not a JSON object)")
    return meta


def _codec_names_v3(codecs: Any, where: Path) -> list[str]:
    """Every codec name of a v3 ``codecs`` list, those nested in a sharding codec included."""
    if not isinstance(codecs, list):
        raise UnsafeFileError(f"{where}: 'codecs' is not a list")
    names = []
    for c in codecs:
        if isinstance(c, str):
            names.append(c)
            continue
        if not isinstance(c, dict):
            raise UnsafeFileError(f"{where}: a codec is neither a name nor an object: {c!r}")
        names.append(str(c.get("name")))
        conf = c.get("configuration") or {}
        if isinstance(conf, dict):
            for key in ("codecs", "index_codecs"):
                if key in conf:
                    names += _codec_names_v3(conf[key], where)
    return names


def _check_codecs(names: Iterable[str], where: Path) -> None:
    for name in names:
        plain = name[len("numcodecs."):] if name.startswith("numcodecs.") else name
        if plain not in ZARR_CODECS:
            raise UnsafeFileError(f"{where}: the Zarr codec {name!r} is not one sparsedp reads (allowed: "
                                  f"{', '.join(sorted(ZARR_CODECS))}); refusing to open the array, as an unknown "
                                  "codec may run code while decoding")


def _check_v2(meta: dict, where: Path) -> None:
    dtype = meta.get("dtype")
    try:
        kind = np.dtype(dtype).kind if isinstance(dtype, str) else None
    except TypeError:
        kind = None
    if kind is None or kind not in _NUMERIC_KINDS:
        raise UnsafeFileError(f"{where}: the Zarr dtype {dtype!r} is not a plain number (bool, integer or float); "
                              "object, string and structured arrays are refused")
    if meta.get("object_codec") is not None:  # pragma: no cover - only with an object dtype
        raise UnsafeFileError(f"{where}: an object codec {meta['object_codec']!r} is refused")
    names = []
    comp = meta.get("compressor")
    if comp is not None:
        if not isinstance(comp, dict):
            raise UnsafeFileError(f"{where}: the compressor is not an object: {comp!r}")
        names.append(str(comp.get("id")))
    filters = meta.get("filters")
    if filters is not None:
        if not isinstance(filters, list) or not all(isinstance(f, dict) for f in filters):
            raise UnsafeFileError(f"{where}: the filters are not a list of objects: {filters!r}")
        names += [str(f.get("id")) for f in filters]
    _check_codecs(names, where)


def _check_v3(meta: dict, where: Path) -> None:
    if meta.get("node_type", "array") != "array":
        raise UnsafeFileError(f"{where}: a Zarr {meta.get('node_type')!r}, not an array")
    dtype = meta.get("data_type")
    name = dtype.get("name") if isinstance(dtype, dict) else dtype
    if name not in _V3_TYPES or (isinstance(dtype, dict) and dtype.get("configuration")):
        raise UnsafeFileError(f"{where}: the Zarr data type {dtype!r} is not a plain number (bool, integer or "
                              "float); object, string and structured arrays are refused")
    if meta.get("storage_transformers"):
        raise UnsafeFileError(f"{where}: Zarr storage transformers are refused: {meta['storage_transformers']!r}")
    _check_codecs(_codec_names_v3(meta.get("codecs", []), where), where)


def check_zarr(path: str | Path) -> None:
    """Refuse (:class:`~sparsedp.errors.UnsafeFileError`) a Zarr array whose metadata is not plain
    numbers under :data:`ZARR_CODECS`, reading that metadata as JSON only (no codec is made, no
    chunk is read).  A path with neither ``.zarray`` nor ``zarr.json`` is refused too: what cannot
    be checked is not opened."""
    p = Path(path)
    v2, v3 = _metadata(p, ".zarray"), _metadata(p, "zarr.json")
    if v2 is None and v3 is None:
        raise SparseDPError(f"{p} is not a Zarr array on this machine (no .zarray or zarr.json in it)")
    if v2 is not None:
        _check_v2(v2, p / ".zarray")
    if v3 is not None:
        if v3.get("zarr_format") == 2:  # pragma: no cover - not a layout zarr writes
            raise UnsafeFileError(f"{p / 'zarr.json'}: not Zarr v3 metadata")
        _check_v3(v3, p / "zarr.json")


def open_zarr(path: str | Path, mode: str = "r", **kwargs: Any) -> Any:
    """``zarr.open_array(path, mode, **kwargs)``; an existing array (every mode but ``"w"``) is
    first checked by :func:`check_zarr`, so nothing of a refused array is decoded."""
    if mode != "w":
        check_zarr(path)
    return zarr_module().open_array(str(path), mode=mode, **kwargs)
