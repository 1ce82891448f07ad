"""``sparsedp restaurant --data``: a user's daily item sales from CSV, Parquet or .npy (issue 15)."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from _tables import write_table
from sparsedp.cli import main
from sparsedp.consistency import COMBOS, ITEMS, restaurant
from sparsedp.consistency import cli as rcli
from sparsedp.errors import SparseDPError
from sparsedp.release_file import load_release_file as load_release

DAYS = 16


@pytest.fixture()
def sales():
    return restaurant(DAYS, seed=3)


def _frame(s):
    df = pd.DataFrame(s.sales, columns=list(ITEMS))
    df.insert(0, "day", np.arange(len(df)))  # an extra column is ignored
    return df


@pytest.mark.parametrize("ext", ["csv", "parquet", "npy"])
def test_load_sales_recovers_the_orders(tmp_path, sales, ext):
    path = tmp_path / f"sales.{ext}"
    if ext == "npy":
        np.save(path, sales.sales)
    else:
        write_table(_frame(sales).sample(frac=1, axis=1, random_state=0), path)  # column order does not matter
    got = rcli.load_sales(path)
    assert got.orders.dtype == np.int64 and got.sales.dtype == np.int64
    np.testing.assert_array_equal(got.orders, sales.orders)
    np.testing.assert_array_equal(got.sales, sales.sales)
    assert rcli.load_sales(path, days=DAYS).days == DAYS


def test_basis_is_unimodular():
    # the orders are recovered exactly in integers because the basis columns have det 1
    assert round(abs(np.linalg.det(COMBOS[:, rcli._BASIS].astype(float)))) == 1
    np.testing.assert_array_equal(COMBOS[:, rcli._BASIS] @ rcli._BASIS_INV, np.eye(3, dtype=np.int64))


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_cli_releases_the_file(tmp_path, sales, ext, capsys):
    data = write_table(_frame(sales), tmp_path / f"sales.{ext}")
    out, js = tmp_path / "rel.npz", tmp_path / "s.json"
    assert main(["restaurant", "--data", data, "--seed", "5", "--evaluate", "--out", str(out),
                 "--json", str(js)]) == 0
    summary = json.loads(js.read_text())
    assert summary["days"] == DAYS and summary["data"] == "file" and summary["data_seed"] is None
    assert summary["laplace_scale"] == 5 * 5  # Delta_1 = 5 h, h = log2(16) + 1 = 5
    rel = load_release(out)
    assert len(rel.ledger) == 1
    kept = {k for k in rel.arrays if not k.startswith("error_shape.")}  # the intervals' shape of the noise
    assert kept == {"x", "variances", "label.lo", "label.hi", "label.item"}  # the release, never the sales
    # the same seed on the same sales in the library gives the same release: the file was read faithfully
    from sparsedp.consistency import restaurant_release

    lib = restaurant_release(epsilon=1.0, seed=5, sales=sales)
    np.testing.assert_allclose(rel.arrays["x"], lib.x)
    assert summary["evaluation"]["rmse_consistent"] == pytest.approx(lib.rmse_consistent or
                                                                     np.sqrt(np.mean((lib.x - lib.truth) ** 2)))


def test_synthetic_default_unchanged(tmp_path):
    js = tmp_path / "s.json"
    assert main(["restaurant", "--days", "8", "--seed", "1", "--json", str(js)]) == 0
    summary = json.loads(js.read_text())
    assert summary["days"] == 8 and summary["data"] == "synthetic" and summary["data_seed"] == 0


def _bad_cases(sales):
    good = _frame(sales)
    nan = good.astype(float)
    nan.loc[3, "wings"] = np.nan
    neg = good.copy()
    neg.loc[2, "cola"] = -1
    frac = good.astype(float)
    frac.loc[1, "fries"] = 2.5
    huge = good.astype(float)
    huge.loc[0, "burger"] = 2.0**60
    text = good.astype(object)
    text.loc[4, "nuggets"] = "many"
    outside = good.copy()
    outside.loc[5, list(ITEMS)] = [1, 0, 0, 0, 0]  # a cola on its own: not a combo
    negorders = good.copy()
    negorders.loc[6, list(ITEMS)] = COMBOS[0] + COMBOS[1] - COMBOS[2]  # [1, 2, 3, 0, 0]: orders (1, 1, -1)
    assert (COMBOS[0] + COMBOS[1] - COMBOS[2] >= 0).all()
    return {
        "missing column": (good.drop(columns="wings"), "no column 'wings'|wings"),
        "non-numeric": (text, "not numeric"),
        "NaN": (nan, "NaN|not numeric"),  # CSV writes NaN as an empty cell
        "negative": (neg, "negative"),
        "non-integer": (frac, "not whole numbers"),
        "too large": (huge, "2\\^50"),
        "empty": (good.iloc[:0], "no values|no days|empty"),
        "not a combination": (outside, "not a combination of the combos"),
        "negative orders": (negorders, "negative number of orders"),
    }


@pytest.mark.parametrize("ext", ["csv", "parquet"])
@pytest.mark.parametrize("case", ["missing column", "non-numeric", "NaN", "negative", "non-integer", "too large",
                                  "empty", "not a combination", "negative orders"])
def test_cli_refuses_bad_files_before_any_noise(tmp_path, sales, ext, case, capsys, monkeypatch):
    df, pattern = _bad_cases(sales)[case]
    if ext == "parquet" and case == "non-numeric":
        df = df.astype({"nuggets": str})
    data = write_table(df, tmp_path / f"bad.{ext}")

    def no_release(*a, **k):  # validation must come before the charge and the noise
        raise AssertionError("restaurant_release reached with bad data")

    monkeypatch.setattr(rcli, "restaurant_release", no_release)
    out = tmp_path / "rel.npz"
    assert main(["restaurant", "--data", data, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "sparsedp: error" in err
    assert re.search(pattern, err), err
    assert not out.exists()
    with pytest.raises(SparseDPError):
        rcli.load_sales(data)


def test_cli_refuses_bad_shapes_and_day_count(tmp_path, sales, capsys, monkeypatch):
    monkeypatch.setattr(rcli, "restaurant_release", lambda *a, **k: pytest.fail("reached the release"))
    data = write_table(_frame(sales), tmp_path / "s.csv")
    assert main(["restaurant", "--data", data, "--days", str(DAYS + 1)]) == 2
    assert f"holds {DAYS} days" in capsys.readouterr().err
    np.save(tmp_path / "wide.npy", np.zeros((DAYS, 4)))
    np.save(tmp_path / "flat.npy", np.zeros(DAYS))
    np.save(tmp_path / "text.npy", np.array([["a"] * 5] * 3))
    np.save(tmp_path / "empty.npy", np.zeros((0, 5)))
    for name, pattern in (("wide.npy", "shape"), ("flat.npy", "shape"), ("text.npy", "not real numbers"),
                          ("empty.npy", "no days")):
        assert main(["restaurant", "--data", str(tmp_path / name)]) == 2
        assert pattern in capsys.readouterr().err, name
    (tmp_path / "s.txt").write_text("cola\n1\n")
    assert main(["restaurant", "--data", str(tmp_path / "s.txt")]) == 2
    assert "unsupported" in capsys.readouterr().err
    assert main(["restaurant", "--data", str(tmp_path / "absent.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "blank.csv").write_text("")
    assert main(["restaurant", "--data", str(tmp_path / "blank.csv")]) == 2
    assert "empty" in capsys.readouterr().err


def test_nan_text_in_csv_is_refused(tmp_path, sales):
    df = _frame(sales).astype(object)
    df.loc[0, "cola"] = "nan"  # parsed as a float NaN: refused as a missing sale
    with pytest.raises(SparseDPError, match="NaN"):
        rcli.load_sales(write_table(df, tmp_path / "n.csv"))
