"""A TopDown release written as a table (sparsedp.topdown.table_file): every unit's full code is
unambiguous whatever the widths of its codes, and the table loads back as the same release."""

from __future__ import annotations

import numpy as np
import pytest

from sparsedp import load_release
from sparsedp.cli import main
from sparsedp.errors import SparseDPError
from sparsedp.topdown import read_table, topdown
from sparsedp.topdown.table_file import full_codes, split_full_code

pd = pytest.importorskip("pandas")

# "1" + "23" and "12" + "3" concatenate alike; codes may hold the separator and the escape
FRAME = pd.DataFrame({"state": ["1", "12", "12", "a/b"], "county": ["23", "3", "4\\", "c"],
                      "p": [3, 1, 4, 1], "q": [5, 9, 2, 6]})


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_paths_whose_codes_concatenate_alike_get_different_full_codes_and_round_trip(tmp_path, suffix):
    src = tmp_path / "in.csv"
    FRAME.to_csv(src, index=False)
    out = tmp_path / f"units{suffix}"
    assert main(["topdown", str(src), "--geo", "state,county", "--counts", "p,q", "--rho", "1", "--seed", "4",
                 "--out", str(out)]) == 0
    rel = topdown(read_table(src, "state,county", "p,q"), rho=1.0, rng=4)
    written = rel.published_table()
    counties = written[written["level"] == "county"]
    assert counties["code"].tolist() == ["1/23", "12/3", "12/4\\\\", "a\\/b/c"]
    assert len(set(counties["code"])) == len(counties)  # "123" twice, were the codes concatenated
    for code, state, county in zip(counties["code"], counties["state"], counties["county"]):
        assert split_full_code(code) == (state, county)
    loaded = load_release(out)  # the same release: its answers, and the table with its codes as text
    np.testing.assert_array_equal(loaded.answers, rel.to_release().answers)
    back = loaded.to_pandas()
    assert back["code"].iloc[1:].tolist() == written["code"].iloc[1:].tolist()  # the root's code is empty
    assert back["code"].map(type).iloc[1:].eq(str).all()
    np.testing.assert_array_equal(back["total"], written["total"])


def test_full_codes_follow_the_units_order_and_keep_leading_zeros():
    frame = pd.DataFrame({"s": ["01", "01", "02"], "c": ["001", "010", "001"], "x": [1, 2, 3]})
    from sparsedp.topdown import HierarchicalTable

    h = HierarchicalTable.from_counts(frame, ["s", "c"], ["x"]).hierarchy
    assert full_codes(h).tolist() == [None, "01", "02", "01/001", "01/010", "02/001"]


def test_a_full_code_ending_in_a_lone_escape_is_refused():
    assert split_full_code("a\\\\") == ("a\\",)
    with pytest.raises(SparseDPError, match="lone"):
        split_full_code("a\\")
    with pytest.raises(SparseDPError, match="text"):
        split_full_code(None)
