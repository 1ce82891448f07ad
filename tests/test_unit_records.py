"""Histograms of records per privacy unit: truncation the same on every path, the per-unit
sensitivity, the release file and the command line (sparsedp.unit_records)."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from sparsedp import load_release
from sparsedp.cli import main
from sparsedp.errors import SparseDPError
from sparsedp.executors import DaskExecutor
from sparsedp.io import Bins, bin_indices, read_id_column, read_values
from sparsedp.privacy_unit import PrivacyUnit
from sparsedp.scaleout.records import release_records, unit_histogram_records
from sparsedp.unit_records import cell_priorities, truncated_histogram, unit_key

BINS = Bins(0, 20, 1)


def _table(rng, rows=3000, units=120):
    return pd.DataFrame({"v": rng.uniform(0, 20, rows), "CustomerID": rng.integers(0, units, rows)})


@pytest.mark.parametrize("unit", [PrivacyUnit("u", max_rows=4),
                                  PrivacyUnit("u", max_rows=5, max_groups=2, max_rows_per_group=3)])
def test_truncation_does_not_depend_on_row_order(unit):
    rng = np.random.default_rng(0)
    ids = np.array([str(i) for i in rng.integers(0, 40, 1500)], dtype=object)
    cells = rng.integers(0, 20, 1500)
    key = unit_key(5)
    h = truncated_histogram(cells, 20, ids, unit, key)
    for _ in range(3):
        p = rng.permutation(ids.size)
        assert np.array_equal(truncated_histogram(cells[p], 20, ids[p], unit, key), h)
    assert h.sum() <= 40 * unit.l1_bound()
    other = truncated_histogram(cells, 20, ids, unit, unit_key(6))
    assert not np.array_equal(other, h)  # the key decides which rows
    assert unit.grouped or other.sum() == h.sum()  # (with max_rows alone, not how many)


@pytest.mark.parametrize("unit", [PrivacyUnit("u", max_rows=3),
                                  PrivacyUnit("u", max_rows=4, max_groups=2, max_rows_per_group=2)])
def test_removing_one_unit_moves_the_histogram_within_the_bound(unit):
    rng = np.random.default_rng(1)
    key = unit_key(2)
    for trial in range(30):
        ids = np.array([str(i) for i in rng.integers(0, 6, 40)], dtype=object)
        cells = rng.integers(0, 5, 40)
        full = truncated_histogram(cells, 5, ids, unit, key)
        for u in np.unique(ids):
            keep = ids != u
            d = full - truncated_histogram(cells[keep], 5, ids[keep], unit, key)
            assert np.all(d >= 0) and d.sum() <= unit.l1_bound()
            assert np.sqrt((d.astype(float) ** 2).sum()) <= unit.l2_bound()


def test_priorities_depend_on_the_row_only():
    ids = np.array(["a", "b", "a", None], dtype=object)
    p = cell_priorities(ids, np.array([1, 1, 1, 0]), unit_key(1))
    q = cell_priorities(np.array(["a", "a", "c"], dtype=object), np.array([1, 1, 2]), unit_key(1))
    assert set(p[[0, 2]]) == set(q[[0, 1]]) and p[3] == 0  # a's rows in bin 1: the same two priorities


def test_dask_release_equals_in_process_release(tmp_path, capsys):
    """One seed: the same truncation and the same release in process and on a LocalCluster."""
    df = _table(np.random.default_rng(3), rows=10_000, units=400)
    data = tmp_path / "t.parquet"
    df.to_parquet(data, row_group_size=1500)
    unit = PrivacyUnit("CustomerID", max_rows=6)
    ref = truncated_histogram(bin_indices(read_values(data, "v"), BINS), 20, read_id_column(data, "CustomerID"),
                              unit, unit_key(9))
    with DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GB") as ex:
        h, _, _, _ = unit_histogram_records(data, "v", BINS, unit, key=unit_key(9), executor=ex)
        assert np.array_equal(h, ref)
        r = release_records(data, "v", BINS, 1.0, privacy_unit=unit, executor=ex, rng=9, out=tmp_path / "d.npy")
    assert main(["histogram", str(data), "--column", "v", "--bins", "0", "20", "1", "--epsilon", "1", "--method",
                 "boost", "--seed", "9", "--out", str(tmp_path / "p.npz"), "--privacy-unit", "CustomerID",
                 "--max-rows", "6"]) == 0
    assert "epsilon 1 per CustomerID (max_rows 6)" in capsys.readouterr().out
    a, b = load_release(tmp_path / "p.npz"), r.to_release()
    assert np.array_equal(np.asarray(a.answers), np.asarray(b.answers))
    assert a.description["privacy_unit"] == {"privacy_unit": "CustomerID", "max_rows": 6}
    assert a.epsilon <= 1.0 and a.ledger[0]["privacy_unit"] == "CustomerID (max_rows 6)"


def test_cli_auto_charges_both_within_epsilon(tmp_path, capsys):
    data = tmp_path / "t.csv"
    _table(np.random.default_rng(4)).to_csv(data, index=False)
    out = tmp_path / "a.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["histogram", str(data), "--column", "v", "--bins", "0", "20", "1", "--epsilon", "1",
                     "--method", "dwork", "--seed", "1", "--out", str(out), "--privacy-unit", "CustomerID",
                     "--max-rows", "auto"]) == 0
    rel = load_release(out)
    assert len(rel.ledger) == 2 and rel.ledger[0]["label"].startswith("privacy unit: bound")
    assert rel.epsilon <= 1.0 and rel.epsilon > 0.999
    assert rel.description["privacy_unit_bound"]["max_rows"] == rel.description["privacy_unit"]["max_rows"]
    text = capsys.readouterr().out
    assert "per CustomerID (max_rows" in text and "chosen privately" in text
    assert "dropped" not in text and "kept" not in text  # nothing about truncation is published


def test_cli_row_release_warns_on_an_id_column_and_records_one_row(tmp_path, capsys):
    data = tmp_path / "t.csv"
    _table(np.random.default_rng(5)).to_csv(data, index=False)
    assert main(["histogram", str(data), "--column", "v", "--bins", "0", "20", "1", "--epsilon", "1", "--method",
                 "dwork", "--seed", "1", "--out", str(tmp_path / "r.npz")]) == 0
    cap = capsys.readouterr()
    assert "CustomerID" in cap.err and "looks like an identifier" in cap.err and "per row" in cap.out
    assert load_release(tmp_path / "r.npz").description["privacy_unit"] == {"privacy_unit": "one row"}


def test_bad_declarations_are_refused_before_any_output(tmp_path):
    df = _table(np.random.default_rng(6))
    df.loc[3, "CustomerID"] = None
    data = tmp_path / "t.csv"
    df.to_csv(data, index=False)
    base = ["histogram", str(data), "--column", "v", "--bins", "0", "20", "1", "--epsilon", "1", "--method", "dwork",
            "--out", str(tmp_path / "x.npz")]
    for extra in (["--privacy-unit", "CustomerID", "--max-rows", "3"],  # a missing id
                  ["--privacy-unit", "CustomerID", "--max-rows", "auto"],
                  ["--privacy-unit", "nope", "--max-rows", "3"],
                  ["--max-rows", "3"], ["--privacy-unit", "CustomerID"]):
        assert main(base + extra) == 2
        assert not (tmp_path / "x.npz").exists()
    assert main(base + ["--privacy-unit", "CustomerID", "--max-rows", "3", "--drop-missing-units"]) == 0
    with pytest.raises(SparseDPError, match="no value"):
        unit_histogram_records(data, "v", BINS, PrivacyUnit("CustomerID", max_rows=3), key=unit_key(1),
                               executor="inprocess")


def test_auto_bound_on_threads_equals_in_process(tmp_path):
    """max_rows="auto": the workers count each unit's rows, the same private choice and release as
    in one process with one seed; the choice's charge first, the total within epsilon."""
    from sparsedp.scaleout import release_hierarchical
    from sparsedp.unit_records import read_unit_histogram

    data = tmp_path / "t.csv"
    _table(np.random.default_rng(8), rows=6000, units=200).to_csv(data, index=False)
    unit = PrivacyUnit("CustomerID", max_rows="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, concrete, choice, rest = read_unit_histogram(data, "v", BINS, unit, epsilon=1.0, rng=4)
        ref = release_hierarchical(x, concrete.row_budget("laplace", rest), k=4, rng=4)
        r = release_records(data, "v", BINS, 1.0, privacy_unit=unit, executor="threads", rng=4, k=4)
    assert r.privacy_unit == concrete and r.bound_choice.bound == choice.bound
    assert np.array_equal(np.asarray(r.to_release().answers), np.asarray(ref.to_release().answers))
    rel = r.to_release()
    assert rel.ledger[0]["label"].startswith("privacy unit: bound") and rel.epsilon <= 1.0
    assert rel.description["privacy_unit_bound"]["max_rows"] == concrete.max_rows
