"""Issue 26 (7): a release never overwrites its own input, never writes outside a spec's directory,
and never replaces an existing release file unless asked (``--force``, or ``overwrite = true`` in a
spec).  Every refusal comes before any budget is charged or noise drawn."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from sparsedp import Accountant, SparseDPError
from sparsedp.cli import main
from sparsedp.consistency import ITEMS, restaurant
from sparsedp.measure import MeasurementPlan
from sparsedp.spec import run_spec

SPEC = """
[data]
path = "{data}"
column = "age"
bins = {{ start = 0, stop = 10, width = 1 }}

[privacy]
epsilon = 0.5

[output]
{output}
"""


@pytest.fixture
def no_measure(monkeypatch):
    """Fail the test if anything is measured (charged or drawn)."""
    def refuse(self, *a, **k):
        raise AssertionError("measured although the outputs are refused")

    monkeypatch.setattr(MeasurementPlan, "measure", refuse)


def _spec(d, output, data="people.csv"):
    ages = np.random.default_rng(0).integers(0, 10, size=50)
    (d / "people.csv").write_text("age\n" + "".join(f"{a}\n" for a in ages))
    path = d / "s.toml"
    path.write_text(SPEC.format(data=data, output=output))
    return path


# -- specs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("output", ['release = "people.csv"', 'report = "people.csv"', 'plot = "./people.csv"',
                                    'release = "s.toml"', 'release = "sub/../people.csv"'])
def test_spec_output_never_overwrites_its_input(tmp_path, output, no_measure):
    (tmp_path / "sub").mkdir()
    spec = _spec(tmp_path, output)
    before = (tmp_path / "people.csv").read_bytes(), spec.read_bytes()
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="input|spec"):
        run_spec(spec, accountant=acc, force=True)  # not even with force
    assert acc.spent == 0 and ((tmp_path / "people.csv").read_bytes(), spec.read_bytes()) == before


def test_spec_output_through_a_symlink_to_its_input_is_refused(tmp_path, no_measure):
    os.symlink(tmp_path / "people.csv", tmp_path / "link.npz")
    spec = _spec(tmp_path, 'release = "link.npz"')
    with pytest.raises(SparseDPError, match="input"):
        run_spec(spec, force=True)


@pytest.mark.parametrize("output", ['release = "../out.npz"', 'report = "sub/../../out.md"',
                                    'release = "{abs}"', 'plot = "escape/out.png"'])
def test_spec_output_never_escapes_the_spec_directory(tmp_path, output, no_measure):
    d = tmp_path / "spec"
    d.mkdir()
    (d / "sub").mkdir()
    os.symlink(tmp_path, d / "escape")  # a symlink pointing out of the directory
    spec = _spec(d, output.format(abs=tmp_path / "out.npz"))
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="outside"):
        run_spec(spec, accountant=acc)
    assert acc.spent == 0 and not list(tmp_path.glob("out.*"))


def test_spec_outputs_must_differ(tmp_path, no_measure):
    spec = _spec(tmp_path, 'release = "a.npz"\nreport = "a.npz"')
    with pytest.raises(SparseDPError, match="same file"):
        run_spec(spec)


def test_spec_never_replaces_an_existing_release_unless_asked(tmp_path, capsys):
    spec = _spec(tmp_path, 'release = "out.npz"')
    assert main(["release", str(spec)]) == 0
    first = (tmp_path / "out.npz").read_bytes()
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="exists.*--force|overwrite"):
        run_spec(spec, accountant=acc)
    assert acc.spent == 0 and (tmp_path / "out.npz").read_bytes() == first
    assert main(["release", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and "Traceback" not in err
    assert main(["release", str(spec), "--force"]) == 0
    assert (tmp_path / "out.npz").read_bytes() != first
    spec.write_text(spec.read_text().replace('release = "out.npz"', 'release = "out.npz"\noverwrite = true'))
    assert main(["release", str(spec)]) == 0


def test_spec_data_outside_its_directory_is_still_read(tmp_path):
    # only outputs are confined to the spec's directory; data may live anywhere
    d = tmp_path / "spec"
    d.mkdir()
    _spec(tmp_path, "")
    spec = _spec(d, 'release = "out.npz"', data="../people.csv")
    res = run_spec(spec, rng=0)
    assert res.files["release"] == d / "out.npz"


# -- command lines --------------------------------------------------------------------------------
def _histogram_data(d):
    np.save(d / "h.npy", np.array([3, 0, 5, 1, 0, 0, 2, 7]))
    return d / "h.npy"


def test_histogram_out_equal_to_its_input_is_refused(tmp_path, capsys, no_measure):
    data = _histogram_data(tmp_path)
    before = data.read_bytes()
    for out in (data, tmp_path / "x" / ".." / "h.npy"):
        (tmp_path / "x").mkdir(exist_ok=True)
        assert main(["histogram", str(data), "--epsilon", "1", "--out", str(out), "--force"]) == 2
        err = capsys.readouterr().err
        assert "input" in err and "Traceback" not in err
    assert data.read_bytes() == before
    assert main(["histogram", str(data), "--epsilon", "1", "--executor", "inprocess", "--out", str(data),
                 "--force"]) == 2
    assert data.read_bytes() == before


def test_histogram_never_replaces_an_existing_release_unless_forced(tmp_path, capsys):
    data = _histogram_data(tmp_path)
    out = tmp_path / "r.npz"
    argv = ["histogram", str(data), "--epsilon", "1", "--out", str(out)]
    assert main(argv) == 0
    first = out.read_bytes()
    assert main(argv) == 2
    assert "exists" in capsys.readouterr().err and out.read_bytes() == first
    assert main([*argv, "--force"]) == 0 and out.read_bytes() != first
    # the scale-out release also writes OUT.release.json: an existing one is not replaced either
    npy = tmp_path / "leaves.npy"
    (tmp_path / "leaves.npy.release.json").write_text("{}")
    assert main(["histogram", str(data), "--epsilon", "1", "--executor", "inprocess", "--out", str(npy)]) == 2
    assert (tmp_path / "leaves.npy.release.json").read_text() == "{}" and not npy.exists()


def _trips(d):
    path = d / "trips.csv"
    pd.DataFrame({"trip": [1, 1, 2], "node": [0, 1, 3]}).to_csv(path, index=False)
    return path


def _sales(d):
    path = d / "sales.csv"
    pd.DataFrame(restaurant(8, seed=0).sales, columns=list(ITEMS)).to_csv(path, index=False)
    return path


def _records(d):
    path = d / "t.csv"
    pd.DataFrame({"a": [0, 1, 2, 1], "b": [1, 0, 1, 1]}).to_csv(path, index=False)
    return path


def _entries(d):
    path = d / "e.csv"
    pd.DataFrame({"row": [0, 1, 2, 3, 0], "col": [0, 1, 2, 0, 3], "value": [1.0, 2, 3, 4, 5]}).to_csv(path, index=False)
    return path


# command, data writer, arguments ({data}: the data file), the release option, other output options
COMMANDS = {
    "flows": (_trips, ["flows", "--grid", "3", "3", "--trips-file", "{data}"], "--out", ["--json", "--write-network"]),
    "restaurant": (_sales, ["restaurant", "--data", "{data}"], "--out", ["--json", "--plot"]),
    "marginals": (_records, ["marginals", "{data}", "--columns", "a,b", "--sizes", "3,2", "--rho", "1"], "--out", []),
    "complete": (_entries, ["complete", "{data}", "--rank", "1", "--epsilon", "1", "--bounds", "0", "5",
                            "--max-iter", "5"], "--save", ["--json"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_output_never_overwrites_its_input(tmp_path, capsys, command, no_measure):
    write, argv, release, others = COMMANDS[command]
    data = write(tmp_path)
    before = data.read_bytes()
    for flag in [release, *others]:
        args = [a.format(data=data) for a in argv] + [flag, str(data)]
        if flag != release:
            args += [release, str(tmp_path / ("r.json" if command == "marginals" else "r.npz"))]
        assert main([*args, "--force"]) == 2, flag
        err = capsys.readouterr().err
        assert "input" in err and "Traceback" not in err, (flag, err)
        assert data.read_bytes() == before


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_never_replaces_an_existing_release_unless_forced(tmp_path, capsys, command):
    write, argv, release, _ = COMMANDS[command]
    data = write(tmp_path)
    out = tmp_path / ("r.json" if command == "marginals" else "r.npz")
    out.write_text("an earlier release")
    args = [a.format(data=data) for a in argv] + [release, str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err
    assert out.read_text() == "an earlier release"
    assert main([*args, "--force"]) == 0
    assert out.read_bytes() != b"an earlier release"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_cli_output_in_a_missing_directory_is_refused_first(tmp_path, capsys, command, no_measure):
    write, argv, release, _ = COMMANDS[command]
    data = write(tmp_path)
    args = [a.format(data=data) for a in argv] + [release, str(tmp_path / "absent" / "r.npz")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "absent" in err and "Traceback" not in err


def test_cli_two_outputs_on_one_file_are_refused(tmp_path, capsys, no_measure):
    data = _trips(tmp_path)
    same = str(tmp_path / "o.json")
    assert main(["flows", "--grid", "3", "3", "--trips-file", str(data), "--json", same, "--write-network", same]) == 2
    assert "same file" in capsys.readouterr().err


def test_flows_json_and_out_still_written(tmp_path):
    # the checks do not get in the way of an ordinary run
    data = _trips(tmp_path)
    js = tmp_path / "f.json"
    assert main(["flows", "--grid", "3", "3", "--trips-file", str(data), "--json", str(js),
                 "--out", str(tmp_path / "f.npz")]) == 0
    assert json.loads(js.read_text())["trips_source"] == "file"


def test_cli_output_hard_linked_to_its_input_is_refused(tmp_path, capsys, no_measure):
    data = _histogram_data(tmp_path)
    before = data.read_bytes()
    os.link(data, tmp_path / "link.npz")
    assert main(["histogram", str(data), "--epsilon", "1", "--out", str(tmp_path / "link.npz"), "--force"]) == 2
    assert "input" in capsys.readouterr().err and data.read_bytes() == before


def test_cli_output_that_is_a_directory_is_refused(tmp_path, capsys, no_measure):
    data = _trips(tmp_path)
    for target in (str(tmp_path), ""):
        assert main(["flows", "--grid", "3", "3", "--trips-file", str(data), "--json", target]) == 2
        err = capsys.readouterr().err
        assert ("directory" in err or "empty" in err) and "Traceback" not in err


def _topdown_table(d):
    from test_topdown import small_frame

    path = d / "t.csv"
    small_frame(5).to_csv(path, index=False)
    return path


def _counts(d):
    path = d / "x.npy"
    np.save(path, np.random.default_rng(0).poisson(5, 256))
    return path


def _sales_npy(d):
    path = d / "s.npy"
    np.save(path, restaurant(64, seed=0).sales)
    return path


# the releases written through a release object's save (which itself refuses an existing file
# unless overwrite=True): the command passes its --force on
SAVED = {
    "histogram-chunked": (_counts, ["histogram", "{data}", "--epsilon", "1", "--executor", "inprocess", "--k", "4",
                                    "--chunk", "64"], "c.npy"),
    "histogram-in-process": (_counts, ["histogram", "{data}", "--epsilon", "1"], "h.npz"),
    "restaurant-chunked": (_sales_npy, ["restaurant", "--data", "{data}", "--chunk", "32"], "o.npy"),
    "marginals-npz": (_records, ["marginals", "{data}", "--columns", "a,b", "--sizes", "3,2", "--rho", "1"], "m.npz"),
    "topdown": (_topdown_table, ["topdown", "{data}", "--geo", "state,county,vtd", "--counts", "vap_*,u18_*",
                                 "--attributes", "age,race", "--root", "nation", "--rho", "0.5"], "r.npz"),
}


@pytest.mark.parametrize("name", sorted(SAVED))
def test_force_replaces_a_release_written_by_save(tmp_path, capsys, name):
    write, argv, out = SAVED[name]
    args = [a.format(data=write(tmp_path)) for a in argv] + ["--out", str(tmp_path / out)]
    assert main(args) == 0
    first = (tmp_path / out).read_bytes() if (tmp_path / out).is_file() else None
    assert main(args) == 2 and "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0, capsys.readouterr().err
    assert first is None or (tmp_path / out).read_bytes() != first
