"""sparsedp.io: the CSV reader's two paths (pandas, standard library) agree; load_entries."""

import sys

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import SparseDPError
from sparsedp.io import load_entries, read_columns, read_values

TABLES = [
    "a,b\n1,2\n3,4.5\n",
    "a,b\n1,nan\n2,inf\n3,-4.5\n",
    "a,b\n1, 2\n\n2,1e3\n",  # a blank line is skipped, spaces around a number are fine
    "a,b\n1,\n2,3\n",  # empty cell: not numeric
    "a,b\n1,two\n",
    "a,b\n",
    "",
    "a,c\n1,2\n",
]


def _read(path, columns):
    try:
        return read_columns(path, columns)
    except SparseDPError as exc:
        return str(exc)


@pytest.mark.parametrize("text", TABLES)
def test_pandas_and_standard_library_paths_agree(tmp_path, monkeypatch, text):
    pytest.importorskip("pandas")
    path = tmp_path / "t.csv"
    path.write_text(text)
    fast = _read(path, ["a", "b"])
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    slow = _read(path, ["a", "b"])
    if isinstance(fast, str) or isinstance(slow, str):
        assert fast == slow
    else:
        for c in ("a", "b"):
            np.testing.assert_array_equal(fast[c], slow[c])


def test_read_values_and_columns_errors(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    assert read_values(path, "b").tolist() == [2.0]
    with pytest.raises(SparseDPError, match="name its column"):
        read_values(path)
    with pytest.raises(SparseDPError, match="no such file"):
        read_columns(tmp_path / "x.csv", ["a"])
    with pytest.raises(SparseDPError, match="column names"):
        read_columns(path, [])
    (tmp_path / "t.txt").write_text("a\n1\n")
    with pytest.raises(SparseDPError, match="unsupported"):
        read_columns(tmp_path / "t.txt", ["a"])


def test_load_entries_formats_agree(tmp_path):
    rng = np.random.default_rng(0)
    M = sp.random(7, 5, density=0.4, random_state=1, format="csr")
    M.data[:2] = 0.0  # stored zeros are observations too
    coo = M.tocoo()
    sp.save_npz(tmp_path / "m.npz", M)
    np.savez(tmp_path / "r.npz", row=coo.row, col=coo.col, value=coo.data)
    order = rng.permutation(coo.nnz)
    (tmp_path / "m.csv").write_text("row,col,value\n" + "".join(
        f"{coo.row[i]},{coo.col[i]},{float(coo.data[i])!r}\n" for i in order))
    dense = np.full((7, 5), np.nan)
    dense[coo.row, coo.col] = coo.data
    np.save(tmp_path / "m.npy", dense)
    ref = load_entries(tmp_path / "m.npz")
    assert ref.nnz == M.nnz and ref.shape == (7, 5)
    for name, kw in (("r.npz", {"shape": (7, 5)}), ("m.csv", {"shape": (7, 5)}), ("m.npy", {})):
        got = load_entries(tmp_path / name, **kw)
        assert got.shape == (7, 5) and got.nnz == M.nnz
        assert (got != ref).nnz == 0 and np.array_equal(np.sort(got.indices), np.sort(ref.indices))
    small = load_entries(tmp_path / "m.csv")  # default shape: largest indices + 1
    assert small.shape == (int(coo.row.max()) + 1, int(coo.col.max()) + 1)


@pytest.mark.parametrize("text,kw,message", [
    ("row,col,value\n0,0,1\n0,0,2\n", {}, "observed more than once"),
    ("row,col,value\n0,0,1\n2,0,2\n", {"shape": (2, 2)}, "outside the 2 x 2 matrix"),
    ("row,col,value\n0,-1,1\n", {}, "0-based integer indices"),
    ("row,col,value\n0,1.5,1\n", {}, "0-based integer indices"),
    ("row,col,value\n0,1,nan\n", {}, "NaN"),
    ("row,col,value\n", {}, "holds no values"),
    ("r,c,v\n0,0,1\n", {}, "no column 'row'"),
    ("row,col,value\n0,0,1\n", {"shape": (0, 2)}, "positive integers"),
])
def test_load_entries_refuses_bad_records(tmp_path, text, kw, message):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(SparseDPError, match=message):
        load_entries(path, **kw)


def test_csv_text_error_names_the_row_and_column_not_the_value(tmp_path):
    """A non-number in a CSV column is located (row, column), never quoted: it is private data."""
    from sparsedp import SparseDPError
    from sparsedp.io import read_values

    (tmp_path / "v.csv").write_text("id,age\n1,34\n2,Smith J.\n")
    with pytest.raises(SparseDPError, match="row 3 of column 'age' is not numeric: text where numbers") as info:
        read_values(tmp_path / "v.csv", "age")
    assert "Smith" not in str(info.value)
