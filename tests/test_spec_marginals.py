"""Marginal specs (``[data] columns``): a thin, checked path to the marginal releases -- the same
release as calling them directly, consistent non-negative output, labelled report, refusals
before any charge."""

import numpy as np
import pytest

from sparsedp import SparseDPError, load_release
from sparsedp.cli import main
from sparsedp.marginals import Domain, optimize_marginals_laplace, release_marginals, release_marginals_laplace
from sparsedp.privacy import Accountant
from sparsedp.spec import run_spec

CATS = {"age": ["0-17", "18-64", "65+"], "sex": ["F", "M"], "region": ["N", "S", "E"]}

SPEC = """
[data]
path = "people.csv"
columns = ["age", "sex", "region"]
categories = { age = ["0-17", "18-64", "65+"], sex = ["F", "M"], region = ["N", "S", "E"] }

[workload]
kind = "marginals"
k = 2

[privacy]
rho = 0.5

[consistency]
nonnegative = false

[output]
release = "m.npz"
report = "m.md"
plot = "m.png"
"""


def _write(tmp_path, spec=SPEC, n=400):
    rng = np.random.default_rng(5)
    codes = np.column_stack([rng.integers(0, len(CATS[c]), size=n) for c in CATS])
    rows = ["age,sex,region,other"] + [",".join(CATS[c][v] for c, v in zip(CATS, r)) + ",x" for r in codes]
    (tmp_path / "people.csv").write_text("\n".join(rows) + "\n")
    path = tmp_path / "m.toml"
    path.write_text(spec)
    return path, codes


def test_a_marginal_spec_is_the_marginal_release_itself(tmp_path):
    path, codes = _write(tmp_path)
    res = run_spec(path, rng=11)
    dom = Domain(list(CATS), [len(v) for v in CATS.values()])
    direct = release_marginals(codes, dom, [("age", "sex"), ("age", "region"), ("sex", "region")], 0.5, rng=11)
    want = direct.to_release()
    np.testing.assert_array_equal(res.answers, want.answers)
    np.testing.assert_array_equal(res.result.variances, want.variances)
    assert res.accountant.ledger and res.result.rho == pytest.approx(0.5)
    back = load_release(res.files["release"])
    np.testing.assert_array_equal(back.answers, res.answers)
    assert not back.private  # seeded
    assert back.description["categories"] == CATS
    report = res.files["report"].read_text()
    assert "age=65+, sex=M" in report and "## sex,region" in report and "NOT private" in report
    assert res.files["plot"].stat().st_size > 1000


def test_nonnegative_marginals_are_consistent_and_nonnegative(tmp_path):
    path, _ = _write(tmp_path, SPEC.replace("nonnegative = false", "nonnegative = true"), n=30)
    res = run_spec(path, rng=2)
    rel = res.result
    assert np.all(rel.answers >= 0) and rel.variance_method == "gls-before-consistency"
    marg = np.asarray(rel.labels["marginal"])
    totals = [rel.answers[marg == m].sum() for m in ("age,sex", "age,region", "sex,region")]
    np.testing.assert_allclose(totals, totals[0], rtol=1e-6)
    sex_a = [rel.answers[(marg == "age,sex") & (np.asarray(rel.labels["sex"]) == s)].sum() for s in (0, 1)]
    sex_b = [rel.answers[(marg == "sex,region") & (np.asarray(rel.labels["sex"]) == s)].sum() for s in (0, 1)]
    np.testing.assert_allclose(sex_a, sex_b, rtol=1e-6, atol=1e-6)


def test_pure_dp_marginal_spec_with_explicit_marginals(tmp_path):
    spec = SPEC.replace("k = 2", 'marginals = [["sex", "age"], ["region"]]').replace("rho = 0.5", "epsilon = 1.0")
    path, codes = _write(tmp_path, spec)
    acc = Accountant(epsilon=2.0)
    res = run_spec(path, rng=4, accountant=acc)
    assert acc.spent == pytest.approx(1.0)
    dom = Domain(list(CATS), [len(v) for v in CATS.values()])
    strategy = optimize_marginals_laplace(dom, [("age", "sex"), ("region",)], 1.0, rng=0)
    want = release_marginals_laplace(codes, strategy, rng=4).to_release()
    np.testing.assert_array_equal(res.answers, want.answers)
    assert res.result.noise == "laplace" and res.answers.size == 6 + 3
    assert list(dict.fromkeys(np.asarray(res.result.labels["marginal"]))) == ["age,sex", "region"]


def test_codes_with_sizes_and_the_command_line(tmp_path, capsys):
    spec = SPEC.replace('categories = { age = ["0-17", "18-64", "65+"], sex = ["F", "M"], region = ["N", "S", "E"] }',
                        "sizes = [3, 2, 3]").replace('path = "people.csv"', 'path = "codes.npy"')
    path, codes = _write(tmp_path, spec)
    np.save(tmp_path / "codes.npy", codes)
    assert main(["release", str(path), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "released 21 answers (rho 0.5, exact noise)" in out
    assert main(["release", str(path)]) == 2  # an existing release is refused without --force
    assert "exists: refusing to replace" in capsys.readouterr().err
    assert main(["ledger", str(tmp_path / "m.npz")]) == 0


@pytest.mark.parametrize("edit,match", [
    (lambda s: s.replace("[workload]", "[workload]\nranges = [[0, 1]]"), "not used by a marginal"),
    (lambda s: s.replace('columns = ["age", "sex", "region"]', 'columns = ["age", "sex", "region"]\nclip = true'),
     "not used by a marginal"),
    (lambda s: s.replace("k = 2", "k = 4"), "workload.k"),
    (lambda s: s.replace("k = 2", 'marginals = [["age", "height"]]'), "workload.marginals"),
    (lambda s: s.replace('"65+"]', '"65+"], extra = ["a"]'), "categories"),
    (lambda s: s.replace('sex = ["F", "M"], ', ""), "missing"),
    (lambda s: s.replace('region = ["N", "S", "E"]', 'region = ["N", "S"]'), "not among"),
    (lambda s: s.replace("rho = 0.5", "epsilon = 1.0").replace("nonnegative = false", "nonnegative = true"),
     "nonnegative"),
    (lambda s: s.replace("rho = 0.5", "rho = 0.5\nepsilon = 1.0"), "exactly one"),
    (lambda s: s.replace("rho = 0.5", 'rho = 0.5\nnoise = "laplace"'), "does not go with"),
    (lambda s: s.replace("rho = 0.5", "rho = -1"), "budget"),
    (lambda s: s.replace('kind = "marginals"', 'kind = "prefix"'), "workload.kind"),
    (lambda s: s + "\n[strategy]\nkind = \"identity\"\n", "no \\[strategy\\]"),
])
def test_bad_marginal_specs_are_refused_before_any_charge(tmp_path, edit, match):
    path, _ = _write(tmp_path)
    path.write_text(edit(path.read_text()))
    acc = Accountant(epsilon=2.0) if "epsilon = 1.0" in path.read_text() else Accountant(rho=1.0)
    with pytest.raises(SparseDPError, match=match):
        run_spec(path, accountant=acc)
    assert not acc.ledger and not (tmp_path / "m.npz").exists()



LOWER_SPEC = """
[data]
path = "small.csv"
columns = ["a", "b"]
sizes = [2, 2]

[workload]
k = 2
lower = true

[privacy]
{budget}

[output]
release = "small.npz"
report = "small.md"
plot = "small.png"
"""


def _small(tmp_path, budget="rho = 0.5"):
    """A 3-row, 2-column table and a spec releasing every marginal up to order 2 (``lower = true``:
    the 0-way marginal, the number of records, among them)."""
    (tmp_path / "small.csv").write_text("a,b\n0,1\n1,0\n1,1\n")
    path = tmp_path / "small.toml"
    path.write_text(LOWER_SPEC.format(budget=budget))
    return path


@pytest.mark.parametrize("budget", ["rho = 0.5", "epsilon = 1.0"])
def test_lower_true_reports_the_0_way_marginal(tmp_path, capsys, budget):
    """``lower = true`` used to crash with ``KeyError: ''`` while writing the report, after the
    charge and the release file."""
    path = _small(tmp_path, budget)
    assert main(["release", str(path), "--seed", "2"]) == 0
    report = (tmp_path / "small.md").read_text()
    assert "## total (all records)" in report and "| all records |" in report
    assert "## a,b" in report and "| a=1, b=0 |" in report
    assert (tmp_path / "small.png").stat().st_size > 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_report_failure_after_the_charge_keeps_the_release_and_says_how_to_recreate(tmp_path, capsys, monkeypatch):
    import sparsedp.spec_marginals as sm

    path = _small(tmp_path)
    real = sm.marginals_report

    def broken(*args, **kwargs):
        raise KeyError("")

    monkeypatch.setattr(sm, "marginals_report", broken)
    assert main(["release", str(path), "--seed", "2"]) == 2
    err = capsys.readouterr().err
    release = tmp_path / "small.npz"
    assert "Traceback" not in err and f"saved in {release}" in err and f"sparsedp report {release}" in err
    back = load_release(release)  # the paid-for release and its ledger are on disk
    assert len(back.ledger) == 1 and back.rho == pytest.approx(0.5)
    assert not (tmp_path / "small.md").exists()
    monkeypatch.setattr(sm, "marginals_report", real)
    (tmp_path / "small.csv").unlink()  # the report needs the release only
    assert main(["report", str(release)]) == 0
    assert "## total (all records)" in (tmp_path / "small.md").read_text()


def test_an_attribute_named_like_a_label_is_reported(tmp_path):
    """An attribute called ``lower`` is labelled ``attribute_lower`` in the release: the report
    finds its codes there."""
    (tmp_path / "t.csv").write_text("lower,b\n0,1\n1,0\n1,1\n")
    spec = LOWER_SPEC.format(budget="rho = 0.5").replace('"small.csv"', '"t.csv"').replace('["a", "b"]',
                                                                                         '["lower", "b"]')
    (tmp_path / "t.toml").write_text(spec)
    res = run_spec(tmp_path / "t.toml", rng=1)
    assert "| lower=1, b=0 |" in res.files["report"].read_text()
