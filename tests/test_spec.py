"""Declarative releases: a spec runs end to end from CSV / .npy / Parquet; clear errors; the
release file has the ledger and never the data."""

import re

import numpy as np
import pytest

from sparsedp import SparseDPError
from sparsedp.cli import main
from sparsedp.io import Bins, bin_records, load_histogram
from sparsedp.release_file import load_release_file
from sparsedp.spec import run_spec

SPEC = """
[data]
path = "people.csv"
column = "age"
bins = {{ start = 0, stop = 20, width = 1 }}

[workload]
kind = "ranges"
ranges = [[0, 4], [5, 19], [0, 19]]

[strategy]
kind = "hierarchical"
branching = 4

[privacy]
epsilon = 0.5

[consistency]
nonnegative = true
{total}

[output]
release = "out.npz"
report = "out.md"
plot = "out.png"
"""


def _write(tmp_path, total=""):
    ages = np.random.default_rng(1).integers(0, 20, size=500)
    (tmp_path / "people.csv").write_text("id,age\n" + "".join(f"{i},{a}\n" for i, a in enumerate(ages)))
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(total=total))
    return spec, np.bincount(ages, minlength=20)


def test_spec_runs_end_to_end(tmp_path):
    spec, hist = _write(tmp_path, total="total = 500")
    res = run_spec(spec)
    assert res.answers.shape == (3,) and res.estimate.sum() == pytest.approx(500)
    assert np.all(res.estimate >= -1e-9)
    assert res.accountant.spent == 0.5 and len(res.accountant.ledger) == 1
    back = load_release_file(res.files["release"])
    assert back.private and back.epsilon == 0.5
    assert not any(np.array_equal(a, hist) for a in back.arrays.values())
    report = res.files["report"].read_text()
    assert "epsilon 0.5" in report and "exact laplace" in report
    assert res.files["plot"].stat().st_size > 1000


def test_cli_release_and_ledger(tmp_path, capsys):
    spec, _ = _write(tmp_path)
    assert main(["release", str(spec), "--seed", "3"]) == 0
    captured = capsys.readouterr()
    assert "NOT private" in captured.err and "released 3 answers" in captured.out
    assert main(["ledger", str(tmp_path / "out.npz")]) == 0
    assert "NOT PRIVATE" in capsys.readouterr().out


@pytest.mark.parametrize("edit,match", [
    (lambda s: s.replace('column = "age"', 'column = "height"'), "no column 'height'"),
    (lambda s: s.replace("[privacy]", "[privacy]\n").replace("epsilon = 0.5", "epsilon = -1"), "epsilon"),
    (lambda s: s.replace("[output]", "[outputs]"), "unknown section"),
    (lambda s: s.replace("stop = 20", "stop = 10"), "outside"),
    (lambda s: s.replace("[[0, 4], [5, 19], [0, 19]]", "[[0, 40]]"), "ranges"),
])
def test_bad_specs_raise_clear_errors_before_any_noise(tmp_path, edit, match):
    spec, _ = _write(tmp_path)
    spec.write_text(edit(spec.read_text()))
    with pytest.raises(SparseDPError, match=match):
        run_spec(spec)
    assert not (tmp_path / "out.npz").exists()


def test_io_readers(tmp_path):
    np.save(tmp_path / "h.npy", np.array([3, 0, 2]))
    assert load_histogram(tmp_path / "h.npy").tolist() == [3, 0, 2]
    (tmp_path / "bad.csv").write_text("age\n1\nabc\n")
    with pytest.raises(SparseDPError, match="row 3 .* not numeric"):
        load_histogram(tmp_path / "bad.csv", "age", Bins(0, 5))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(SparseDPError, match="empty"):
        load_histogram(tmp_path / "empty.csv", "age")
    assert bin_records(np.array([0.5, 1.5, 1.7, 9.9]), Bins(0, 10, 2)).tolist() == [3, 0, 0, 0, 1]
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame({"age": [1, 2, 2]}).to_parquet(tmp_path / "t.parquet")
    assert load_histogram(tmp_path / "t.parquet", "age", Bins(0, 3)).tolist() == [0, 1, 2]


def test_spec_with_the_optimized_strategy(tmp_path):
    # issue 11: kind = "optimized" measures the strategy sparsedp.optimize finds for the workload
    from sparsedp import MatrixMechanism, optimize
    from sparsedp import strategies as st
    from sparsedp import workloads as wl

    spec, _ = _write(tmp_path)
    spec.write_text(spec.read_text().replace('kind = "hierarchical"\nbranching = 4', 'kind = "optimized"'))
    res = run_spec(spec, rng=5)
    back = load_release_file(res.files["release"])
    W = wl.range_queries(20, [(0, 4), (5, 19), (0, 19)])
    opt = optimize(W, rng=0)
    assert back.description["strategy"] == opt.strategy.name and back.epsilon == 0.5
    per_query = back.description["expected_error_per_query"]
    assert per_query == pytest.approx(MatrixMechanism(W, opt, epsilon=0.5).error_report().per_query, rel=1e-9)
    assert per_query < MatrixMechanism(W, st.hierarchical(20, 4), epsilon=0.5).error_report().per_query


def test_spec_release_is_labelled_with_variances_and_intervals(tmp_path):
    from sparsedp import load_release

    spec, _ = _write(tmp_path, total="")
    spec.write_text(spec.read_text().replace("nonnegative = true", "nonnegative = false"))
    res = run_spec(spec)
    back = load_release(res.files["release"])
    np.testing.assert_array_equal(back.labels["lo"], [0, 5, 0])
    np.testing.assert_array_equal(back.labels["hi"], [4, 19, 19])
    assert back.variances is not None and np.all(back.variances > 0)
    assert back.variance_method == "exact-gls"
    lo, hi = back.confidence_intervals(0.95)
    assert np.all(lo < back.answers) and np.all(back.answers < hi)
    report = res.files["report"].read_text()
    assert "| bins 0..4 |" in report and "95% interval" in report


def test_spec_after_consistency_says_its_variances_are_before_it(tmp_path):
    from sparsedp import load_release

    spec, _ = _write(tmp_path, total="total = 500")
    back = load_release(run_spec(spec).files["release"])
    assert back.variance_method == "gls-before-consistency"
    assert "before the consistency step" in back.description["variances"]


@pytest.mark.parametrize("line, hint", [("epsilom = 2", "did you mean 'epsilon'?"),
                                        ("nonnegtive = true", "did you mean 'nonnegative' in [consistency]?")])
def test_misspelt_keys_are_refused_with_a_suggestion(tmp_path, line, hint):
    spec, _ = _write(tmp_path)
    spec.write_text(spec.read_text().replace("epsilon = 0.5", "epsilon = 0.5\n" + line))
    with pytest.raises(SparseDPError, match=re.escape(hint)):
        run_spec(spec)


@pytest.mark.parametrize("extra,match", [
    ("[workload]\nk = 2\n", "'k': not used by a histogram"),  # a marginal spec's key
    ('[consistency]\ninvariants = ["state:total"]\n', "'invariants': not used by a histogram"),  # a TopDown key
])
def test_keys_of_the_other_kinds_are_refused_in_a_histogram_spec(tmp_path, extra, match):
    (tmp_path / "a.csv").write_text("age\n1\n2\n")
    path = tmp_path / "h.toml"
    path.write_text('[data]\npath = "a.csv"\ncolumn = "age"\nbins = { start = 0, stop = 4, width = 1 }\n'
                    "[privacy]\nepsilon = 1.0\n" + extra)
    with pytest.raises(SparseDPError, match=match):
        run_spec(path)


def _histogram_spec(tmp_path):
    return _write(tmp_path)[0], ("people.csv",), "out"


def _marginal_spec(tmp_path):
    from test_spec_marginals import _small

    return _small(tmp_path), ("small.csv",), "small"


def _topdown_spec(tmp_path):
    from test_spec_topdown import _write as topdown_write

    return topdown_write(tmp_path), ("counts.csv",), "td"


@pytest.mark.parametrize("make", [_histogram_spec, _marginal_spec, _topdown_spec])
def test_report_recreates_the_report_of_every_spec_kind_without_a_charge(tmp_path, monkeypatch, capsys, make):
    from sparsedp.privacy import Accountant

    spec, data, stem = make(tmp_path)
    assert main(["release", str(spec), "--seed", "4"]) == 0
    report, plot = tmp_path / f"{stem}.md", tmp_path / f"{stem}.png"
    text = report.read_text()
    report.unlink()
    plot.unlink()
    for name in data:  # the report is made from the release alone
        (tmp_path / name).unlink()

    def no_charge(*args, **kwargs):
        raise AssertionError("sparsedp report charged a budget")

    monkeypatch.setattr(Accountant, "spend", no_charge)
    capsys.readouterr()
    assert main(["report", str(tmp_path / f"{stem}.npz")]) == 0
    assert report.read_text() == text and plot.stat().st_size > 0
    assert f"report: {report}" in capsys.readouterr().out
    (tmp_path / "elsewhere").mkdir()
    assert main(["report", str(tmp_path / f"{stem}.npz"), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / f"{stem}.md").read_text() == text


def test_report_refuses_a_release_that_no_spec_made(tmp_path, capsys):
    from sparsedp import MatrixMechanism, strategies, workloads

    rel = MatrixMechanism(workloads.prefix(4), strategies.identity(4), epsilon=1.0).run([1, 2, 3, 4], rng=0)
    path = rel.save(tmp_path / "r.npz")
    assert main(["report", str(path)]) == 2
    assert "not one of a spec" in capsys.readouterr().err


def test_a_report_failure_without_a_release_file_rescues_the_release(tmp_path, monkeypatch, capsys):
    import sparsedp.spec as spec_module
    from sparsedp import load_release

    spec, _ = _write(tmp_path)
    spec.write_text(spec.read_text().replace('release = "out.npz"\n', ""))

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(spec_module, "histogram_report", broken)
    assert main(["release", str(spec), "--seed", "1"]) == 2
    err = capsys.readouterr().err
    rescued = tmp_path / "out.rescued.npz"
    assert f"saved in {rescued}" in err and "disk full" in err and f"sparsedp report {rescued}" in err
    assert len(load_release(rescued).ledger) == 1
    monkeypatch.undo()
    assert main(["report", str(rescued)]) == 0 and (tmp_path / "out.md").exists()


def test_report_writes_only_in_the_chosen_directory(tmp_path):
    """The names a release records are bare file names: a directory part (``../``) is dropped, an
    empty name falls back to the release's own name."""
    from dataclasses import replace

    from sparsedp import load_release
    from sparsedp.spec import rebuild_report

    spec, _ = _write(tmp_path)
    res = run_spec(spec, rng=1)
    rel = load_release(res.files["release"])
    (tmp_path / "sub").mkdir()
    odd = replace(rel, description={**rel.description, "outputs": {"report": "../../evil.md", "plot": ""}})
    path = odd.save(tmp_path / "sub" / "odd.npz")
    files = rebuild_report(path)
    assert files == {"report": tmp_path / "sub" / "evil.md", "plot": tmp_path / "sub" / "odd.png"}
    assert not (tmp_path.parent / "evil.md").exists()


def test_histogram_spec_per_privacy_unit(tmp_path):
    """[privacy] unit / max_rows: records truncated per unit, the noise per unit, the auto bound's
    charge first in the ledger, both within epsilon; a bad declaration refused before any output."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, 2000)
    rows = "\n".join(f"{v},{u}" for v, u in zip(rng.integers(0, 10, 2000), ids))
    (tmp_path / "r.csv").write_text("age,CustomerID\n" + rows + "\n")
    head = ('[data]\npath = "r.csv"\ncolumn = "age"\nbins = { start = 0, stop = 10, width = 1 }\n'
            '[output]\nrelease = "rel.npz"\n[privacy]\nepsilon = 1.0\nunit = "CustomerID"\n')
    path = tmp_path / "u.toml"
    path.write_text(head + "max_rows = 5\n")
    res = run_spec(path, rng=1)
    assert res.result.description["privacy_unit"] == {"privacy_unit": "CustomerID", "max_rows": 5}
    (entry,) = res.result.ledger
    assert entry["privacy_unit"] == "CustomerID (max_rows 5)" and entry["sensitivity"] >= 5
    (tmp_path / "rel.npz").unlink()
    path.write_text(head + 'max_rows = "auto"\n')
    with pytest.warns(Warning):  # few units: the private bound is flagged unreliable
        res = run_spec(path, rng=1)
    ledger = load_release_file(tmp_path / "rel.npz").ledger
    assert len(ledger) == 2 and ledger[0]["label"].startswith("privacy unit: bound")
    assert sum(e["epsilon"] for e in ledger) <= 1.0
    assert "privacy_unit_bound" in res.result.description
    (tmp_path / "rel.npz").unlink()
    path.write_text(head + 'max_rows = "many"\n')
    with pytest.raises(SparseDPError, match="max_rows"):
        run_spec(path)
    assert not (tmp_path / "rel.npz").exists()
