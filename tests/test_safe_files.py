"""Files a release names or reads are checked before they are opened: a name must stay inside the
release's directory (no absolute path, '..' or symlink leading out), a Zarr array must be plain
numbers under numeric codecs (a crafted array whose codec runs code is refused before any chunk is
decoded), and a save never replaces an earlier release unless asked."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from sparsedp import Accountant, ReleaseExistsError, SparseDPError, UnsafeFileError
from sparsedp.safe_files import check_zarr, open_zarr, refuse_existing, resolve_inside

zarr = pytest.importorskip("zarr")


# -- resolve_inside --------------------------------------------------------------------------------


def test_a_plain_name_resolves_inside(tmp_path):
    (tmp_path / "sub").mkdir()
    assert resolve_inside(tmp_path, "a.npy") == (tmp_path / "a.npy").resolve()
    assert resolve_inside(tmp_path, "sub/b.npz") == (tmp_path / "sub" / "b.npz").resolve()
    (tmp_path / "link.npy").symlink_to(tmp_path / "sub" / "b.npz")  # a symlink that stays inside is fine
    assert resolve_inside(tmp_path, "link.npy") == (tmp_path / "sub" / "b.npz").resolve()


@pytest.mark.parametrize("name", ["../secret.npy", "sub/../../secret.npy", "..", "", "."])
def test_dot_dot_and_empty_names_are_refused(tmp_path, name):
    with pytest.raises(UnsafeFileError):
        resolve_inside(tmp_path / "rel", name)


def test_absolute_paths_and_symlinks_out_are_refused(tmp_path):
    secret = tmp_path / "secret.npy"
    np.save(secret, np.arange(4))
    rel = tmp_path / "rel"
    rel.mkdir()
    with pytest.raises(UnsafeFileError, match="absolute path"):
        resolve_inside(rel, str(secret))
    (rel / "a.npy").symlink_to(secret)
    with pytest.raises(UnsafeFileError, match="symlink"):
        resolve_inside(rel, "a.npy")
    (rel / "d").symlink_to(tmp_path, target_is_directory=True)  # a directory link leading out
    with pytest.raises(UnsafeFileError):
        resolve_inside(rel, "d/secret.npy")


def test_refuse_existing(tmp_path):
    p = tmp_path / "r.npz"
    refuse_existing([p], False)  # nothing there: fine
    p.write_bytes(b"old")
    with pytest.raises(ReleaseExistsError, match="overwrite=True") as info:
        refuse_existing([tmp_path / "other", p], False)
    assert str(p) in str(info.value) and isinstance(info.value, FileExistsError)
    assert isinstance(info.value, SparseDPError)
    refuse_existing([p], True)


# -- Zarr ------------------------------------------------------------------------------------------


class _Payload:
    """Unpickling it creates ``path`` (what a crafted chunk would do with numcodecs' pickle filter)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _v2_array(path: Path, marker: Path, **meta) -> Path:
    """A Zarr v2 array of 4 values whose one chunk is a pickle that creates ``marker``."""
    path.mkdir()
    head = {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<f8", "compressor": None, "fill_value": 0,
            "filters": None, "order": "C", **meta}
    (path / ".zarray").write_text(json.dumps(head))
    (path / "0").write_bytes(pickle.dumps(_Payload(marker)))
    return path


@dataclass(frozen=True)
class _RunsCode(zarr.abc.codec.BytesBytesCodec):
    """A codec installed on the machine that runs code while decoding (a stand-in for numcodecs'
    pickle under zarr 2, or any plugin codec): it creates the file MARKER names."""

    is_fixed_size = True
    marker: str = ""

    @classmethod
    def from_dict(cls, data):
        return cls(marker=str((data.get("configuration") or {}).get("marker", "")))

    def to_dict(self):
        return {"name": "sparsedp-test-runs-code", "configuration": {"marker": self.marker}}

    async def _decode_single(self, chunk_bytes, chunk_spec):
        Path(self.marker).write_text("ran")
        return chunk_bytes

    async def _encode_single(self, chunk_bytes, chunk_spec):
        return chunk_bytes

    def compute_encoded_size(self, input_byte_length, chunk_spec):
        return input_byte_length


zarr.registry.register_codec("sparsedp-test-runs-code", _RunsCode)


def _v3_with_codec(path: Path, marker: Path, values: np.ndarray) -> Path:
    """A Zarr v3 array of ``values`` whose metadata adds the code-running codec (a crafted file)."""
    z = zarr.open_array(str(path), mode="w", shape=values.shape, chunks=values.shape, dtype="f8")
    z[:] = values
    meta = json.loads((path / "zarr.json").read_text())
    meta["codecs"].append({"name": "sparsedp-test-runs-code", "configuration": {"marker": str(marker)}})
    (path / "zarr.json").write_text(json.dumps(meta))
    return path


def test_the_test_codec_runs_code_when_zarr_itself_reads_the_array(tmp_path):
    """Without the check zarr decodes with the codec the file names: the marker appears."""
    marker = tmp_path / "ran"
    arr = _v3_with_codec(tmp_path / "a.zarr", marker, np.arange(4.0))
    np.testing.assert_array_equal(zarr.open_array(str(arr), mode="r")[:], np.arange(4.0))
    assert marker.exists()


def test_unknown_codecs_and_object_dtypes_are_refused_before_decoding(tmp_path):
    marker = tmp_path / "ran"
    bad = [_v2_array(tmp_path / "pickle.zarr", marker, filters=[{"id": "pickle"}]),
           _v2_array(tmp_path / "object.zarr", marker, dtype="|O", filters=[{"id": "pickle"}]),
           _v2_array(tmp_path / "struct.zarr", marker, dtype=[["a", "<f8"]]),
           _v2_array(tmp_path / "comp.zarr", marker, compressor={"id": "pickle"}),
           _v3_with_codec(tmp_path / "v3.zarr", marker, np.arange(4.0))]
    for arr in bad:
        with pytest.raises(UnsafeFileError) as info:
            open_zarr(arr)
        assert str(arr) in str(info.value)
    with pytest.raises(UnsafeFileError, match="sparsedp-test-runs-code"):
        check_zarr(tmp_path / "v3.zarr")
    with pytest.raises(UnsafeFileError, match="'pickle'"):
        check_zarr(tmp_path / "pickle.zarr")
    with pytest.raises(SparseDPError, match="not a Zarr array"):
        check_zarr(tmp_path)
    assert not marker.exists()


def test_numeric_arrays_of_both_formats_open(tmp_path):
    for fmt in (2, 3):
        z = zarr.open_array(str(tmp_path / f"v{fmt}.zarr"), mode="w", shape=(10,), chunks=(5,), dtype="i8",
                            zarr_format=fmt)
        z[:] = np.arange(10)
        np.testing.assert_array_equal(open_zarr(tmp_path / f"v{fmt}.zarr")[:], np.arange(10))
    sharded = zarr.create_array(str(tmp_path / "s.zarr"), shape=(10,), chunks=(5,), shards=(10,), dtype="f8")
    sharded[:] = 1.0
    np.testing.assert_array_equal(open_zarr(tmp_path / "s.zarr")[:], np.ones(10))


def test_the_scale_out_readers_refuse_a_crafted_array_before_charging(tmp_path):
    from sparsedp.scaleout import open_array, release_hierarchical

    marker = tmp_path / "ran"
    arr = _v3_with_codec(tmp_path / "x.zarr", marker, np.arange(64.0))
    acc = Accountant(epsilon=1.0)
    with pytest.raises(UnsafeFileError):
        release_hierarchical(str(arr), 1.0, k=4, rng=1, accountant=acc)
    with pytest.raises(UnsafeFileError):
        open_array(arr, 16)
    assert acc.spent == 0 and not marker.exists()


def test_load_release_refuses_a_crafted_zarr_answers_array(tmp_path):
    import sparsedp
    from sparsedp.releases import ReleaseResult, axis_labels

    rel = ReleaseResult(kind="mine", answers=np.arange(4.0), labels=axis_labels((4,), ["bin"]),
                        ledger=[{"label": "mine", "epsilon": 1.0}])
    rel.save(tmp_path / "r.zarr")
    np.testing.assert_array_equal(sparsedp.load_release(tmp_path / "r.zarr").answers, np.arange(4.0))
    marker = tmp_path / "ran"
    meta = json.loads((tmp_path / "r.zarr" / "zarr.json").read_text())
    meta["codecs"].append({"name": "sparsedp-test-runs-code", "configuration": {"marker": str(marker)}})
    (tmp_path / "r.zarr" / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(UnsafeFileError, match="sparsedp-test-runs-code"):
        sparsedp.load_release(tmp_path / "r.zarr")
    assert not marker.exists()
    os.remove(tmp_path / "r.zarr" / "zarr.json")
    _v2_array(tmp_path / "p.zarr", marker, filters=[{"id": "pickle"}])
    (tmp_path / "p.zarr.release.json").write_text((tmp_path / "r.zarr.release.json").read_text()
                                                  .replace('"r.zarr"', '"p.zarr"'))
    with pytest.raises(UnsafeFileError, match="pickle"):
        sparsedp.load_release(tmp_path / "p.zarr")
    assert not marker.exists()
