"""The shared privacy-unit flags and spec keys (sparsedp.privacy_unit_cli)."""

from __future__ import annotations

import argparse

import pytest

from sparsedp.errors import SparseDPError
from sparsedp.privacy_unit import ONE_ROW, PrivacyUnit
from sparsedp.privacy_unit_cli import add_unit_arguments, unit_from_args, unit_from_spec


def _args(argv):
    p = argparse.ArgumentParser()
    add_unit_arguments(p)
    return p.parse_args(argv)


def test_flags_declare_the_unit_and_default_to_one_row():
    assert unit_from_args(_args([])) == (ONE_ROW, False)
    unit, drop = unit_from_args(_args(["--privacy-unit", "CustomerID", "--max-rows", "50", "--drop-missing-units"]))
    assert unit == PrivacyUnit("CustomerID", max_rows=50) and drop
    assert unit_from_args(_args(["--privacy-unit", "pid", "--max-rows", "auto"]))[0].is_auto
    grouped = unit_from_args(_args(["--privacy-unit", "pid", "--max-groups", "3", "--max-rows-per-group", "2"]))[0]
    assert grouped.l1_bound() == 6


@pytest.mark.parametrize("argv", [["--max-rows", "5"], ["--privacy-unit", "pid"], ["--drop-missing-units"],
                                  ["--privacy-unit", "pid", "--max-rows", "0"],
                                  ["--privacy-unit", "pid", "--max-groups", "2"]])
def test_bad_flags_are_refused(argv):
    with pytest.raises(SparseDPError):
        unit_from_args(_args(argv))


def test_spec_keys():
    assert unit_from_spec({"rho": 1.0}) == (ONE_ROW, False)
    assert unit_from_spec({"unit": "pid", "max_rows": "auto", "drop_missing_units": True})[0].is_auto
    assert unit_from_spec({"unit": "pid", "max_groups": 2, "max_rows_per_group": 3})[0].l1_bound() == 6
    for bad in [{"max_rows": 3}, {"unit": "pid", "max_rows": "many"}, {"unit": "pid"}, {"drop_missing_units": True},
                {"unit": "pid", "max_rows": 2, "drop_missing_units": "yes"}, {"unit": 3, "max_rows": 2}]:
        with pytest.raises(SparseDPError):
            unit_from_spec(bad)
