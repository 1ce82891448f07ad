"""Issue 26 (6): bad arguments are refused before any budget is charged or noise drawn."""

import numpy as np
import pytest

from sparsedp import Accountant, MatrixMechanism, SparseDPError
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.cli import main
from sparsedp.spec import run_spec

SPEC = """
[data]
path = "people.csv"
column = "age"
bins = {{ start = 0, stop = 10, width = 1 }}

[privacy]
epsilon = 0.5

[consistency]
{consistency}

[output]
release = "{release}"
"""


def _spec(tmp_path, consistency="nonnegative = true", release="out.npz"):
    ages = np.random.default_rng(0).integers(0, 10, size=50)
    (tmp_path / "people.csv").write_text("age\n" + "".join(f"{a}\n" for a in ages))
    path = tmp_path / "s.toml"
    path.write_text(SPEC.format(consistency=consistency, release=release))
    return path


@pytest.mark.parametrize("method", ["bogus", "LS", ""])
def test_run_with_an_unknown_method_spends_nothing(method):
    acc = Accountant(epsilon=2.0)
    mech = MatrixMechanism(wl.prefix(8), st.hierarchical(8, 2), epsilon=1.0, accountant=acc)
    with pytest.raises(SparseDPError, match="method"):
        mech.run(np.arange(8), method=method)
    assert acc.spent == 0 and acc.ledger == ()
    mech.run(np.arange(8), method="nnls")  # a known method still runs (and is charged once)
    assert acc.spent == 1.0


def test_partitioned_run_with_an_unknown_method_spends_nothing(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(16))
    acc = Accountant(epsilon=2.0)
    mech = MatrixMechanism(wl.prefix(16), st.hierarchical(16, 2), epsilon=1.0, accountant=acc)
    with pytest.raises(SparseDPError, match="method"):
        mech.run(str(tmp_path / "x.npy"), method="bogus")
    assert acc.spent == 0


@pytest.mark.parametrize("consistency,match", [
    ("nonnegative = true\ntotal = -5", "total"),  # no non-negative vector adds up to -5
    ('total = "many"', "total"),
    ("total = nan", "total"),
    ("total = inf", "total"),
    ("total = true", "total"),
    ('nonnegative = "yes"', "nonnegative"),
])
def test_spec_with_an_infeasible_or_bad_total_spends_nothing(tmp_path, consistency, match):
    spec = _spec(tmp_path, consistency)
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match=match):
        run_spec(spec, accountant=acc)
    assert acc.spent == 0 and not (tmp_path / "out.npz").exists()


def test_spec_with_a_missing_output_directory_spends_nothing(tmp_path, capsys):
    spec = _spec(tmp_path, release="absent/out.npz")
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="absent"):
        run_spec(spec, accountant=acc)
    assert acc.spent == 0
    assert main(["release", str(spec)]) == 2  # a clean error, no traceback
    err = capsys.readouterr().err
    assert "sparsedp: error:" in err and "Traceback" not in err and "absent" in err


@pytest.mark.parametrize("edit,match", [
    (lambda s: s.replace("[privacy]\n", "[privacy]\nsecure = \"no\"\n"), "secure"),
    (lambda s: s.replace("[privacy]\n", "[privacy]\nepsilion = 1\n"), "epsilion"),  # a misspelt key
    (lambda s: s.replace('release = "out.npz"', 'relase = "out.npz"'), "relase"),
    (lambda s: s.replace("[data]\n", "[data]\nclip = 1\n"), "clip"),
    (lambda s: s.replace("[privacy]\n", '[strategy]\nbranching = "x"\n\n[privacy]\n'), "branching"),
    (lambda s: s.replace("[privacy]\n", "[strategy]\nbranching = 2.5\n\n[privacy]\n"), "branching"),
    (lambda s: s.replace("[privacy]\n", '[workload]\nkind = "ranges"\nranges = [["a", 1]]\n\n[privacy]\n'), "ranges"),
    (lambda s: s.replace("[privacy]\n", '[workload]\nkind = "ranges"\nranges = [[0.5, 1]]\n\n[privacy]\n'), "ranges"),
])
def test_spec_with_bad_keys_spends_nothing(tmp_path, edit, match):
    spec = _spec(tmp_path)
    spec.write_text(edit(spec.read_text()))
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match=match):
        run_spec(spec, accountant=acc)
    assert acc.spent == 0
