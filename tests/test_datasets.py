import csv
import importlib.util

import numpy as np
import pytest

import sparsedp.datasets as datasets
from sparsedp import SparseDPError
from sparsedp.datasets import (PENGUIN_BINS, PENGUIN_COLUMNS, demo_histogram, demo_table, dpbench_names, load_dpbench,
                               penguins, penguins_csv, synthetic_histogram)


def test_synthetic_histogram_is_counts():
    x = synthetic_histogram(512, seed=3)
    assert x.shape == (512,) and np.all(x >= 0) and np.all(x == np.round(x))
    np.testing.assert_array_equal(x, synthetic_histogram(512, seed=3))


def test_demo_histogram_always_available():
    x, label = demo_histogram()
    assert x.size > 0 and label


@pytest.mark.skipif(not dpbench_names(), reason="shared datasets not beside the checkout")
def test_dpbench_loads():
    x = load_dpbench("HEPTH.n4096.npy")
    assert x.shape == (4096,) and x.sum() == 347414


def test_missing_dataset_raises():
    with pytest.raises(SparseDPError):
        load_dpbench("no-such-file.npy")


# --- the penguins table (sparsedp.datasets.penguins) -------------------------------------------

HAVE_PENGUINS = importlib.util.find_spec("palmerpenguins") is not None
needs_penguins = pytest.mark.skipif(not HAVE_PENGUINS, reason="palmerpenguins (the data extra) is not installed")
HEADER = list(PENGUIN_COLUMNS)


def write_csv(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        w.writerows(rows)
    return path


ROW = ["Adelie", "Dream", "39.1", "18.7", "181", "3750", "male", "2008"]


@needs_penguins
def test_penguins_loads_the_shipped_table():
    t = penguins()
    assert t.records.shape == (344, 8)
    assert t.domain.names == PENGUIN_COLUMNS and t.domain.sizes == (3, 3, 7, 6, 7, 8, 3, 3)
    # the package's documented class counts (Adelie, Chinstrap, Gentoo) and missing values
    np.testing.assert_array_equal(np.bincount(t.records[:, 0]), [152, 68, 124])
    assert t.categories["sex"][-1] == "missing" and np.sum(t.records[:, 6] == 2) == 11
    assert all(np.sum(t.records[:, j] == t.domain.sizes[j] - 1) == 2 for j in range(2, 6))
    assert "penguins" in t.source


@needs_penguins
def test_penguins_bins_follow_the_public_edges():
    t = penguins()
    with open(penguins_csv(), newline="") as fh:
        rows = list(csv.DictReader(fh))
    for j, c in enumerate(PENGUIN_COLUMNS):
        if c not in PENGUIN_BINS:
            continue
        for i, row in enumerate(rows):
            if row[c] == "NA":
                assert t.records[i, j] == t.domain.sizes[j] - 1
            else:  # bin k holds [e_{k-1}, e_k): count of edges <= value, by a loop independent of searchsorted
                assert t.records[i, j] == sum(1 for e in PENGUIN_BINS[c] if e <= float(row[c]))


@needs_penguins
def test_penguins_columns_subset_and_release():
    from sparsedp.marginals import marginal_tables, marginals_up_to, release_marginals

    t = penguins(["species", "sex", "body_mass_g"])
    full = penguins()
    np.testing.assert_array_equal(t.records, full.records[:, [0, 6, 5]])
    work = marginals_up_to(t.domain, 2, exact=True)
    rel = release_marginals(t.records, t.domain, work, rho=1e6, rng=0, secure=False)  # seeded: a test, not private
    truth = marginal_tables(t.records, t.domain, work)
    for S in work:
        key = tuple(t.domain.names[i] for i in S)
        assert np.max(np.abs(rel.marginals[key] - truth[S])) < 0.1  # huge rho: released ~ true


def test_penguins_domain_does_not_depend_on_the_records(tmp_path):
    one = penguins(path=write_csv(tmp_path / "one.csv", [ROW]))
    two = penguins(path=write_csv(tmp_path / "two.csv", [ROW, ["Gentoo", "Biscoe", "99", "1", "300", "9000", "NA", "2009"]]))
    assert one.domain == two.domain and one.categories == two.categories
    assert one.domain.sizes == (3, 3, 7, 6, 7, 8, 3, 3)


def test_penguins_edges_missing_and_end_bins(tmp_path):
    rows = [
        ["Adelie", "Dream", "40", "14", "180", "3000", "female", "2007"],  # on an edge: the upper bin
        ["Gentoo", "Biscoe", "1", "99", "999", "1e9", "", "2009"],  # outside the edges: open end bins
        ["Chinstrap", "Torgersen", "NA", "NA", "NA", "NA", "NA", "2008"],  # missing -> last code
    ]
    t = penguins(path=write_csv(tmp_path / "p.csv", rows))
    np.testing.assert_array_equal(t.records, [[0, 1, 2, 1, 1, 1, 0, 0],
                                              [2, 0, 0, 4, 5, 6, 2, 2],
                                              [1, 2, 6, 5, 6, 7, 2, 1]])
    assert t.categories["bill_length_mm"][2] == "40-45" and t.categories["body_mass_g"][6] == ">=5500"


@pytest.mark.parametrize("bad, match", [
    (["Emperor"] + ROW[1:], "not one of"),  # unseen category (its value is not shown)
    (["NA"] + ROW[1:], "may not be missing"),  # species may not be missing
    (ROW[:2] + ["long"] + ROW[3:], "not numeric"),
    (ROW[:2] + ["inf"] + ROW[3:], "not finite"),
    (ROW[:7] + ["2010"], "not one of"),
])
def test_penguins_bad_values_raise_naming_the_row(tmp_path, bad, match):
    with pytest.raises(SparseDPError, match=match) as info:
        penguins(path=write_csv(tmp_path / "p.csv", [ROW, bad]))
    assert "row 3" in str(info.value)
    assert not any(v in str(info.value) for v in ("Emperor", "long", "inf", "2010"))  # where, never the value


def test_penguins_bad_columns_and_files(tmp_path):
    with pytest.raises(SparseDPError, match="columns"):
        penguins(["species", "flippers"], path=write_csv(tmp_path / "p.csv", [ROW]))
    with pytest.raises(SparseDPError, match="no such file"):
        penguins(path=tmp_path / "absent.csv")
    with pytest.raises(SparseDPError, match="no records"):
        penguins(path=write_csv(tmp_path / "empty.csv", []))


def test_penguins_without_the_package_names_the_extra(monkeypatch):
    monkeypatch.setattr(datasets, "find_spec", lambda name: None)
    with pytest.raises(SparseDPError, match=r"sparsedp\[data\]"):
        penguins()
    t = demo_table(n=500, seed=1)  # the fallback: synthetic records on the same public domain
    assert "synthetic" in t.source and t.records.shape == (500, 8)
    assert t.domain.sizes == (3, 3, 7, 6, 7, 8, 3, 3) and t.categories["sex"] == ("female", "male", "missing")
    np.testing.assert_array_equal(t.records, demo_table(n=500, seed=1).records)


@needs_penguins
def test_demo_table_is_the_real_table_when_installed():
    assert demo_table().source == penguins().source
