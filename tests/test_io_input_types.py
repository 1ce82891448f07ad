"""Issue 26 (8): inputs of the wrong kind and impossible bin counts are refused cleanly."""

import numpy as np
import pytest

from sparsedp import SparseDPError
from sparsedp.cli import main
from sparsedp.errors import InputBoundError
from sparsedp.io import MAX_BINS, Bins, load_histogram, load_npy_table, read_values

BAD_ARRAYS = {
    "complex": np.array([1 + 2j, 3 + 0j, 5 + 0j]),
    "complex zero imaginary": np.array([1, 3, 5], dtype=np.complex64),
    "text digits": np.array(["1", "3", "5"]),
    "bool": np.array([True, False, True]),
    "timedelta": np.array([1, 3, 5], dtype="timedelta64[s]"),
    "bytes": np.array([b"1", b"3", b"5"]),
}


@pytest.mark.parametrize("kind", sorted(BAD_ARRAYS))
def test_npy_values_of_a_non_real_dtype_are_refused(tmp_path, kind):
    path = tmp_path / "x.npy"
    np.save(path, BAD_ARRAYS[kind])
    with pytest.raises(SparseDPError, match="dtype"):
        read_values(path)
    with pytest.raises(SparseDPError, match="dtype"):
        load_histogram(path)
    with pytest.raises(SparseDPError, match="dtype"):
        load_histogram(path, bins=Bins(0, 10))
    np.save(path, np.stack([BAD_ARRAYS[kind]] * 5, axis=1))
    with pytest.raises(SparseDPError):
        load_npy_table(path, 5, "a table", "not real numbers")


def test_object_npy_is_refused(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.array([1, "a", None], dtype=object), allow_pickle=True)
    with pytest.raises(SparseDPError):
        read_values(path)


def test_histogram_cli_refuses_a_complex_npy(tmp_path, capsys):
    np.save(tmp_path / "c.npy", np.array([1 + 2j, 3, 5, 7]))
    assert main(["histogram", str(tmp_path / "c.npy"), "--epsilon", "1", "--out", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert "complex" in err and "Traceback" not in err
    assert not (tmp_path / "o.npz").exists()


def test_real_npy_values_still_load(tmp_path):
    for dtype in (np.int8, np.uint32, np.int64, np.float32, np.float64):
        np.save(tmp_path / "x.npy", np.array([1, 0, 2], dtype=dtype))
        assert load_histogram(tmp_path / "x.npy").tolist() == [1, 0, 2]


@pytest.mark.parametrize("start,stop,width", [(0, 1e13, 1), (0, MAX_BINS + 1, 1), (-1e308, 1e308, 1e-300),
                                              (0, 1, 1e-300)])
def test_bin_count_above_the_limit_is_refused(start, stop, width):
    with pytest.raises(InputBoundError, match="bins"):
        Bins(start, stop, width)


def test_bin_count_at_the_limit_is_accepted():
    assert Bins(0, MAX_BINS, 1).count == MAX_BINS
    assert MAX_BINS == 2**31


def test_histogram_cli_with_too_many_bins_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "v.csv").write_text("v\n1\n2\n")
    assert main(["histogram", str(tmp_path / "v.csv"), "--column", "v", "--bins", "0", "1e13", "1", "--epsilon", "1",
                 "--out", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert "sparsedp: error:" in err and "bins" in err and "Traceback" not in err and "MemoryError" not in err
