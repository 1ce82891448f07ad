"""One release model (issue 27): every release kind converts to a ReleaseResult, saves, loads back
with sparsedp.load_release (answers, labels, variances, ledger), gives to_pandas one row per
answer, and `sparsedp ledger` / `sparsedp query` read its file; every kind's
confidence_intervals(0.95) is the same call and returns arrays shaped like the answers.  Files of
the previous layouts still load; files that are not releases are refused with what they are."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest

import sparsedp
from sparsedp import MatrixMechanism, SparseDPError, load_release
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.cli import main
from sparsedp.release_file import save_release
from sparsedp.releases import SIDE_SUFFIX, AxisLabel, ReleaseResult, axis_labels, workload_labels

pd = pytest.importorskip("pandas")

X = np.random.default_rng(0).poisson(5, 300)


def _ledger(rel: ReleaseResult) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "time"} for e in rel.ledger]


def _same(want: ReleaseResult, got: ReleaseResult) -> None:
    assert got.kind == want.kind
    np.testing.assert_allclose(np.asarray(got.answers), np.asarray(want.answers), rtol=1e-12, atol=1e-9)
    assert list(got.labels) == list(want.labels)
    for name in want.labels:
        np.testing.assert_array_equal(np.asarray(got.labels[name]), np.asarray(want.labels[name]), err_msg=name)
    if want.variances is None:
        assert got.variances is None
    else:
        np.testing.assert_allclose(got.variances, want.variances, rtol=1e-12)
    assert _ledger(got) == _ledger(want)
    assert (got.private, got.noise, got.secure, got.strategy) == (want.private, want.noise, want.secure, want.strategy)
    assert got.variance_method == want.variance_method


# -- every kind, built once -----------------------------------------------------------------------
def _build(d: Path) -> dict[str, tuple[ReleaseResult | None, Path]]:
    """``{name: (the release as the library made it, or None for a command's file; its file)}``."""
    out: dict[str, tuple[ReleaseResult | None, Path]] = {}

    def lib(name: str, obj, suffix: str = ".npz") -> None:
        path = d / f"{name}{suffix}"
        obj.save(path)
        out[name] = (obj.to_release(), path)

    def cli(name: str, argv: list[str], path: Path, want: ReleaseResult | None = None) -> None:
        assert main(argv) == 0, argv
        out[name] = (want, path)

    from sparsedp import trees

    np.save(d / "x.npy", X)
    lib("matrix-mechanism", MatrixMechanism(wl.prefix(32), st.hierarchical(32, 4), epsilon=1.0).run(X[:32], rng=1))
    lib("matrix-mechanism-nnls",
        MatrixMechanism(wl.identity(16), st.identity(16), epsilon=1.0).run(X[:16], rng=1, method="nnls"))
    lib("scaleout-matrix",
        MatrixMechanism(wl.all_ranges(64), st.hierarchical(64, 4), epsilon=1.0).run(X[:64], rng=1, executor="threads",
                                                                                     chunk=16))
    for name, pub in (("histogram-lue", trees.LUEDPTree(1.0)), ("histogram-raw", trees.LUEDPTree(1.0, consistency=False)),
                      ("histogram-privelet", trees.Privelet(1.0)), ("histogram-dwork", trees.Dwork(1.0, secure=False))):
        lib(name, pub.fit(X[:64], rng=2).release_)
    cli("histogram-cli", ["histogram", str(d / "x.npy"), "--epsilon", "1", "--method", "boost", "--seed", "1",
                          "--out", str(d / "h.npz")], d / "h.npz")
    from sparsedp.scaleout import release_hierarchical, release_lue

    boost = release_hierarchical(X, 1.0, k=4, chunk=64, rng=3).to_release()
    cli("histogram-chunked-npy", ["histogram", str(d / "x.npy"), "--epsilon", "1", "--executor", "inprocess", "--k",
                                  "4", "--chunk", "64", "--seed", "3", "--out", str(d / "c.npy")], d / "c.npy", boost)
    pytest.importorskip("zarr")
    cli("histogram-chunked-zarr", ["histogram", str(d / "x.npy"), "--epsilon", "1", "--executor", "threads",
                                   "--workers", "2", "--k", "4", "--chunk", "64", "--seed", "3", "--out",
                                   str(d / "c.zarr")], d / "c.zarr", boost)
    cli("histogram-chunked-lue", ["histogram", str(d / "x.npy"), "--epsilon", "1", "--method", "lue", "--executor",
                                  "inprocess", "--chunk", "100", "--seed", "3", "--out", str(d / "l.npy")], d / "l.npy",
        release_lue(X, 1.0, chunk=100, rng=3).to_release())

    from sparsedp.consistency import restaurant, restaurant_release

    lib("restaurant", restaurant_release(sales=restaurant(16, seed=0), epsilon=1.0, seed=3))
    cli("restaurant-cli", ["restaurant", "--days", "16", "--seed", "3", "--out", str(d / "r.npz")], d / "r.npz")
    np.save(d / "sales.npy", restaurant(100, seed=0).sales)
    from sparsedp.scaleout.treespan import release_restaurant

    chunked = release_restaurant(restaurant(100, seed=0).sales, 1.0, chunk=32, rng=2).to_release()
    cli("restaurant-chunked-npy", ["restaurant", "--data", str(d / "sales.npy"), "--chunk", "32", "--seed", "2",
                                   "--out", str(d / "o.npy")], d / "o.npy", chunked)
    cli("restaurant-chunked-zarr", ["restaurant", "--data", str(d / "sales.npy"), "--chunk", "32", "--seed", "2",
                                    "--out", str(d / "o.zarr"), "--json", str(d / "o.json")], d / "o.zarr", chunked)
    out["restaurant-chunked-json"] = (chunked, d / "o.json")  # the --json copy of the record

    from sparsedp.flows import random_trips, release_flows, road_grid

    road = road_grid(4, 4, seed=0)
    lib("flows", release_flows(road, random_trips(road, 30, seed=1, max_edges=4), epsilon=1.0, rng=0))
    cli("flows-cli", ["flows", "--grid", "4", "4", "--trips", "30", "--seed", "1", "--out", str(d / "f.npz")],
        d / "f.npz")

    from sparsedp.marginals import Domain, KronOperator, release_kron, release_marginals
    from sparsedp.marginals import optimize_marginals_laplace
    from sparsedp.marginals.pure_release import release_marginals_laplace

    rng = np.random.default_rng(4)
    dom = Domain(["a", "b", "c"], [3, 2, 4])
    recs = np.column_stack([rng.integers(0, s, 200) for s in dom.sizes])
    lib("marginals", release_marginals(recs, dom, [("a", "b"), ("c",)], 1.0, rng=1))
    from sparsedp.marginals import nonnegative_marginals

    # consistent non-negative marginals (a small rho: some cells are lifted), in the order asked for
    lib("marginals-nonneg", nonnegative_marginals(release_marginals(recs, dom, [("c",), ("b", "a")], 0.01, rng=1)))
    with np.errstate(all="ignore"):
        strategy = optimize_marginals_laplace(dom, [("a", "b"), ("c",)], 1.0, restarts=1)
    lib("marginals-laplace", release_marginals_laplace(recs, strategy, rng=1))
    pd.DataFrame(recs, columns=dom.names).to_csv(d / "t.csv", index=False)
    base = ["marginals", str(d / "t.csv"), "--columns", "a,b,c", "--sizes", "3,2,4", "--rho", "1", "--seed", "0"]
    cli("marginals-json", base + ["--out", str(d / "m.json")], d / "m.json")
    cli("marginals-npz", base + ["--out", str(d / "m.npz")], d / "m.npz")
    K = KronOperator([st.hierarchical(8, 2).tosparse(), st.identity(4).tosparse()])
    lib("kron", release_kron(rng.integers(0, 5, (8, 4)), K, epsilon=1.0, rng=1))

    from sparsedp.continual import ContinualCounter

    counter = ContinualCounter(32, epsilon=1.0, rng=1)
    counter.run(np.ones(10))
    lib("continual", counter.to_release())
    cli("completion", ["complete", "--size", "20", "--rank", "2", "--observed", "0.4", "--noise-scale", "0.1",
                       "--seed", "1", "--save", str(d / "c.npz")], d / "c.npz")
    ages = np.random.default_rng(1).integers(0, 20, size=300)
    (d / "people.csv").write_text("id,age\n" + "".join(f"{i},{a}\n" for i, a in enumerate(ages)))
    (d / "s.toml").write_text('[data]\npath = "people.csv"\ncolumn = "age"\nbins = { start = 0, stop = 20, width = 1 }'
                              '\n[workload]\nkind = "prefix"\n[strategy]\nkind = "hierarchical"\nbranching = 4\n'
                              '[privacy]\nepsilon = 0.5\n[output]\nrelease = "spec.npz"\n')
    cli("spec", ["release", str(d / "s.toml"), "--seed", "1"], d / "spec.npz")
    return out


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("kinds"))


KINDS = ["matrix-mechanism", "matrix-mechanism-nnls", "scaleout-matrix", "histogram-lue", "histogram-raw",
         "histogram-privelet", "histogram-dwork", "histogram-cli", "histogram-chunked-npy", "histogram-chunked-zarr",
         "histogram-chunked-lue", "restaurant", "restaurant-cli", "restaurant-chunked-npy", "restaurant-chunked-zarr",
         "restaurant-chunked-json", "flows", "flows-cli", "marginals", "marginals-nonneg", "marginals-laplace", "marginals-json",
         "marginals-npz", "kron", "continual", "completion", "spec"]


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_round_trips_and_the_commands_read_it(kinds, name, capsys):
    want, path = kinds[name]
    got = load_release(path)
    assert isinstance(got, ReleaseResult) and got.path is not None
    if want is not None:
        _same(want, got)
    assert len(got) > 0 and got.answers.ndim == 1
    assert all(len(col) == len(got) for col in got.labels.values())
    assert got.ledger or name == "completion"  # the synthetic completion problem measures nothing private
    df = got.to_pandas()
    assert df.shape == (len(got), len(got.labels) + 4)
    assert list(df.columns[-4:]) == ["answer", "variance", "lower", "upper"]
    capsys.readouterr()
    assert main(["ledger", str(path)]) == 0
    assert f"{got.kind} release" in capsys.readouterr().out
    assert main(["query", str(path)]) == 0  # every answer as CSV
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(got) + 1 and lines[0].endswith("answer,variance,lower,upper")
    assert main(["query", str(path), "0", "2"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    if list(got.labels) == ["bin"]:  # a histogram: the count of bins 0..2
        want_count = got.source.range(0, 2) if hasattr(got.source, "range") else float(np.sum(got.answers[:3]))
        assert float(printed[-1]) == pytest.approx(want_count, rel=1e-5, abs=1e-9)  # printed with 6 digits
    else:
        assert len(printed) == 4


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_has_the_same_interval_call(kinds, name):
    want, path = kinds[name]
    for rel in (r for r in (want, load_release(path)) if r is not None):
        if rel.variances is None:
            with pytest.raises(SparseDPError, match="no per-answer variances"):
                rel.confidence_intervals(0.95)
            continue
        lo, hi = rel.confidence_intervals(0.95)
        assert lo.shape == hi.shape == (len(rel),)
        assert np.all(lo <= np.asarray(rel.answers)) and np.all(np.asarray(rel.answers) <= hi)
        table = rel.table(0.95)  # the table's interval is the release's own
        np.testing.assert_array_equal(table["lower"], lo)
        np.testing.assert_array_equal(table["upper"], hi)
        lo2, hi2 = rel.confidence_intervals(0.95, "chebyshev")  # certified, wider
        assert np.all(hi2 - lo2 >= hi - lo - 1e-9)


@pytest.mark.parametrize("name", KINDS)
def test_a_loaded_release_gives_the_intervals_of_the_live_one(kinds, name):
    # the file keeps the error's shape (kurtosis, lattice, single noise terms) with the variances, so
    # the default ("accurate") intervals of a loaded release are those of the object it was saved from
    want, path = kinds[name]
    if want is None or want.variances is None:
        pytest.skip("no live object or no variances")
    got = load_release(path)
    if got.variances is None or np.shape(got.variances) != np.shape(want.variances):
        pytest.skip("this layout keeps no per-answer variances")
    if got.variance_method == "bound" or want.variance_method == "bound":
        pytest.skip("a chunked layout keeps a variance bound, not the variances")
    np.testing.assert_allclose(got.confidence_intervals(0.95), want.confidence_intervals(0.95), rtol=1e-12, atol=1e-9)
    assert got.error_report().interval_method() == want.error_report().interval_method()


def test_the_table_of_a_topdown_release_gives_the_intervals_of_its_published_counts(tmp_path):
    """A TopDown release's table() gives the intervals the release itself gives for its published
    counts (sparsedp.topdown.intervals: integers, never below 0), not answer -+ half-width."""
    from test_topdown import table as topdown_table

    from sparsedp.topdown import topdown
    from sparsedp.topdown.intervals import count_intervals

    td = topdown(topdown_table(seed=1, high=4), rho=0.5, rng=7)  # small counts: many zero cells
    rel = td.to_release()
    lo, hi = td.confidence_intervals()  # the TopDown release's own method
    half = rel.error_report().half_widths(0.95)
    assert (rel.answers - half < 0).any()  # answer -+ half-width would reach below 0
    want = count_intervals(rel.answers, rel.arrays["estimate"], half)
    for got in (rel, load_release(td.save(tmp_path / "td.npz"))):
        t = got.table()
        for end, own, formula in ((t["lower"], lo, want[0]), (t["upper"], hi, want[1])):
            np.testing.assert_array_equal(end, own)
            np.testing.assert_array_equal(end, formula)
            assert (end == np.round(end)).all()
        assert (t["lower"] >= 0).all() and (t["lower"] <= t["answer"]).all() and (t["answer"] <= t["upper"]).all()
        part = got.table(rows=slice(10, 30))
        np.testing.assert_array_equal(part["lower"], lo[10:30])
        np.testing.assert_array_equal(part["upper"], hi[10:30])


def _release_classes():
    from sparsedp.consistency.restaurant import RestaurantRelease
    from sparsedp.continual._stream import StreamingCounter
    from sparsedp.flows.release import FlowRelease
    from sparsedp.marginals.kron_release import KronRelease
    from sparsedp.marginals.nonneg import NonNegativeMarginals
    from sparsedp.marginals.pure_release import PureMarginalRelease
    from sparsedp.marginals.release import MarginalRelease
    from sparsedp.mechanism import Release
    from sparsedp.scaleout.lue import LUEScaleoutRelease
    from sparsedp.scaleout.matrix import ScaleoutMatrixRelease
    from sparsedp.scaleout.release import ScaleoutRelease
    from sparsedp.scaleout.treespan import ScaleoutRestaurantRelease
    from sparsedp.trees.publishers import HistogramRelease, TreePublisher

    return [Release, HistogramRelease, TreePublisher, RestaurantRelease, FlowRelease, MarginalRelease,
            NonNegativeMarginals, PureMarginalRelease, KronRelease, ScaleoutRelease, LUEScaleoutRelease, ScaleoutMatrixRelease,
            ScaleoutRestaurantRelease, StreamingCounter, ReleaseResult]


@pytest.mark.parametrize("cls", _release_classes(), ids=lambda c: c.__name__)
def test_every_release_class_converts_and_shares_the_interval_signature(cls):
    assert callable(getattr(cls, "to_release", None))
    params = list(inspect.signature(cls.confidence_intervals).parameters.values())[1:3]
    assert [(p.name, p.default) for p in params] == [("level", 0.95), ("method", "auto")]


def test_classes_and_files_agree_on_intervals(kinds):
    # a release converted from its object and the same release read from its file: same intervals
    # when the file keeps what the object knew (a histogram file: its tree)
    want, path = kinds["histogram-lue"]
    got = load_release(path)
    np.testing.assert_allclose(got.confidence_intervals(0.95), want.confidence_intervals(0.95))
    np.testing.assert_allclose(want.source.confidence_intervals(0.95), want.confidence_intervals(0.95))
    # the histogram's ranges go by keyword; the earlier call with the ranges first still works
    pairs = np.array([[0, 9], [5, 40]])
    np.testing.assert_allclose(want.source.confidence_intervals(0.9, pairs=pairs),
                               want.source.confidence_intervals(pairs, 0.9))


# -- layouts --------------------------------------------------------------------------------------
def test_chunked_record_is_the_release_record_with_the_earlier_fields(kinds):
    _, path = kinds["histogram-chunked-npy"]
    meta = json.loads(Path(str(path) + SIDE_SUFFIX).read_text())
    assert meta["format"] == "sparsedp-release/1" and meta["kind"] == "histogram"
    assert meta["model"]["answers"] == path.name and meta["model"]["variances"] == {
        "constant": meta["level_variances"][-1]}
    assert meta["method"] == "boost" and meta["description"]["chunks"] == meta["chunks"] == 5  # earlier fields kept
    back = load_release(Path(str(path) + SIDE_SUFFIX))  # the record itself loads too
    assert isinstance(back.answers, np.memmap) and back.variance_method == "bound"


def test_in_process_histogram_refuses_a_zarr_or_npy_out(tmp_path, capsys):
    np.save(tmp_path / "x.npy", X)
    for out in ("r.zarr", "r.npy"):
        assert main(["histogram", str(tmp_path / "x.npy"), "--epsilon", "1", "--out", str(tmp_path / out)]) == 2
        assert "--executor" in capsys.readouterr().err
        assert not (tmp_path / out).exists()


def test_array_layout_holds_axis_labels_and_constant_variances_only(kinds, tmp_path):
    want, _ = kinds["histogram-lue"]
    with pytest.raises(SparseDPError, match="save it as .npz"):
        want.save(tmp_path / "h.npy")  # one exact variance per bin
    chunked, _ = kinds["restaurant-chunked-npy"]
    loaded = load_release(kinds["restaurant-chunked-npy"][1])
    for suffix in (".npy", ".zarr", ".npz"):  # a chunked release copied to either layout
        p = loaded.save(tmp_path / f"copy{suffix}")
        _same(chunked, load_release(p))
    boost, _ = kinds["histogram-chunked-zarr"]
    _same(boost, load_release(load_release(kinds["histogram-chunked-zarr"][1]).save(tmp_path / "boost.npz")))
    m = ReleaseResult(kind="mine", answers=np.arange(3.0), labels={"lo": [0, 1, 2]}, variances=np.ones(3))
    with pytest.raises(SparseDPError, match="not the axes"):
        m.save(tmp_path / "m.npy")


def test_a_release_made_by_hand_round_trips(tmp_path):
    mine = ReleaseResult(kind="mine", answers=np.array([3.0, 5.0]), labels=axis_labels((2,), ["bin"]),
                         variances=np.array([2.0, 2.0]), noise="laplace", secure=False,
                         ledger=[{"label": "mine", "epsilon": 1.0, "rho": 0.0, "private": False}])
    assert not mine.private  # a seeded ledger entry makes the release not private
    back = load_release(mine.save(tmp_path / "mine.npz"))
    _same(mine, back)
    assert back.epsilon == 1.0 and back.rho == 0.0
    with pytest.raises(SparseDPError, match="entries for 2 answers"):
        ReleaseResult(kind="bad", answers=np.zeros(2), labels={"x": [1, 2, 3]})
    with pytest.raises(SparseDPError, match="1-D"):
        ReleaseResult(kind="bad", answers=np.zeros((2, 2)))


def test_labels():
    assert workload_labels(wl.prefix(4))["hi"].tolist() == [0, 1, 2, 3]
    lab = workload_labels(wl.all_ranges(3))
    assert list(zip(lab["lo"].tolist(), lab["hi"].tolist())) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]
    assert list(workload_labels(wl.identity(5))) == ["bin"]
    assert list(workload_labels(wl.total(5))) == ["lo", "hi"]
    grid = axis_labels((2, 3), ["day", "item"], {"item": ["a", "b", "c"]})
    assert np.asarray(grid["day"]).tolist() == [0, 0, 0, 1, 1, 1]
    assert np.asarray(grid["item"]).tolist() == ["a", "b", "c", "a", "b", "c"]
    assert isinstance(grid["day"], AxisLabel) and len(grid["day"]) == 6 and grid["item"][4] == "b"


def test_marginals_json_is_a_release_and_the_npz_agrees(kinds):
    _, jpath = kinds["marginals-json"]
    meta = json.loads(jpath.read_text())
    assert meta["kind"] == "marginals" and "time" not in meta["ledger"][0] and meta["ledger"][0]["rho"] == 1.0
    a, b = load_release(jpath), load_release(kinds["marginals-npz"][1])
    np.testing.assert_allclose(a.answers, b.answers)
    np.testing.assert_allclose(a.variances, b.variances)
    assert a.labels["marginal"].tolist() == b.labels["marginal"].tolist()
    assert _ledger(a) == _ledger(b)
    cells = a.to_pandas()
    ab = cells[cells.marginal == "a,b"]
    assert len(ab) == 6 and set(ab.c) == {-1} and sorted(set(ab.a)) == [0, 1, 2]


def test_marginal_release_saves_and_has_intervals(kinds):
    want, path = kinds["marginals"]
    rel = want.source
    lo, hi = rel.confidence_intervals(0.95)
    assert lo.shape == (sum(t.size for t in rel.marginals.values()),)
    np.testing.assert_allclose(want.variances[:6], rel.variances[("a", "b")])


def test_kron_release_carries_its_covariance(kinds):
    want, _ = kinds["kron"]
    C = want.covariance @ np.eye(len(want))
    np.testing.assert_allclose(np.diag(C), want.variances)
    K = want.source
    np.testing.assert_allclose(C, K.noise_variance * np.kron(*K.covariance_factors))


def test_scaleout_matrix_variances_equal_the_in_process_mechanism(kinds):
    want, _ = kinds["scaleout-matrix"]
    ref = MatrixMechanism(wl.all_ranges(64), st.hierarchical(64, 4), epsilon=1.0).run(X[:64], rng=1)
    np.testing.assert_allclose(want.variances, ref.variances(), rtol=1e-9)


# -- earlier layouts and what is not a release ------------------------------------------------------
def test_files_of_the_previous_layouts_load(kinds, tmp_path, capsys):
    # an .npz of the previous version: no model
    want, _ = kinds["matrix-mechanism"]
    src = want.source
    m = src.measurement
    old = save_release(tmp_path / "old.npz", "matrix-mechanism", {"answers": src.answers, "x_hat": src.x_hat},
                       ledger=[m.entry], description={"strategy": m.strategy.name, "secure": m.secure})
    back = load_release(old)
    np.testing.assert_array_equal(back.answers, src.answers)
    assert back.variances is None and back.noise == "laplace" and _ledger(back) == _ledger(want)
    # restaurant and histogram files of the previous version: variances computed again from the file
    rest, _ = kinds["restaurant"]
    r = rest.source
    old = save_release(tmp_path / "oldr.npz", "restaurant", {"x": r.x}, ledger=[r.ledger],
                       description={"days": 16, "laplace_scale": r.scale, "secure": True})
    np.testing.assert_allclose(load_release(old).variances, rest.variances)
    hist, _ = kinds["histogram-lue"]
    h = hist.source
    old = save_release(tmp_path / "oldh.npz", "histogram", {k: v for k, v in hist.arrays.items()},
                       ledger=[h.ledger], description={"method": h.method, "epsilon": h.epsilon, "secure": h.secure,
                                                       "consistent": True})
    np.testing.assert_allclose(load_release(old).variances, hist.variances)
    # the first histogram layout (fields as arrays)
    np.savez_compressed(tmp_path / "first.npz", method=np.array("dwork"), epsilon=np.array(1.0),
                        estimate=np.arange(4.0), consistent=np.array(True), private=np.array(False))
    assert load_release(tmp_path / "first.npz").answers.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert main(["query", str(tmp_path / "first.npz"), "0", "3"]) == 0
    assert float(capsys.readouterr().out.strip().splitlines()[-1]) == 6.0
    # a chunked record of the previous version: flat fields only
    _, npy = kinds["histogram-chunked-npy"]
    meta = json.loads(Path(str(npy) + SIDE_SUFFIX).read_text())
    flat = {k: v for k, v in meta.items() if k not in ("format", "kind", "description", "model")}
    np.save(tmp_path / "prev.npy", np.load(npy))
    (tmp_path / f"prev.npy{SIDE_SUFFIX}").write_text(json.dumps(flat))
    back = load_release(tmp_path / "prev.npy")
    assert back.kind == "histogram" and back.variances[0] == meta["level_variances"][-1] and not back.private
    # a marginals JSON of the previous version: no ledger (one is made from its privacy block)
    _, jpath = kinds["marginals-json"]
    meta = json.loads(jpath.read_text())
    for k in ("format", "kind", "ledger", "private"):
        meta.pop(k)
    (tmp_path / "prev.json").write_text(json.dumps(meta))
    back = load_release(tmp_path / "prev.json")
    assert back.rho == 1.0 and back.ledger[0]["noise"] == "gaussian" and not back.private


def test_what_is_not_a_release_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps({"method": "direct", "seconds": 0.1, "epsilon": 1.0}))
    with pytest.raises(SparseDPError, match="summary of a run"):
        load_release(tmp_path / "summary.json")
    from sparsedp.continual import ContinualCounter

    c = ContinualCounter(8, epsilon=1.0, rng=0)
    c.update(1)
    c.save(tmp_path / "state.json")
    with pytest.raises(SparseDPError, match="SECRET"):
        load_release(tmp_path / "state.json")
    np.save(tmp_path / "bare.npy", np.ones(3))
    with pytest.raises(SparseDPError, match="without its release record"):
        load_release(tmp_path / "bare.npy")
    np.savez(tmp_path / "plain.npz", a=np.ones(3))
    with pytest.raises(SparseDPError, match="not a sparsedp release"):
        load_release(tmp_path / "plain.npz")
    with pytest.raises(SparseDPError, match="no such"):
        load_release(tmp_path / "missing.npz")
    for path in ("summary.json", "state.json", "bare.npy", "plain.npz"):
        assert main(["ledger", str(tmp_path / path)]) == 2
        assert main(["query", str(tmp_path / path)]) == 2
    assert "error" in capsys.readouterr().err


def test_top_level_names():
    assert sparsedp.load_release is load_release and sparsedp.ReleaseResult is ReleaseResult


def test_an_optimised_strategy_carries_its_certified_gap_into_the_release_and_ledger(tmp_path, capsys):
    import sparsedp
    from sparsedp import workloads
    from sparsedp.cli import main

    mm = sparsedp.MatrixMechanism(workloads.prefix(64), "optimized", noise="gaussian", rho=0.5)
    rel = mm.run(np.random.default_rng(0).poisson(5, 64), rng=1).to_release()
    opt = rel.description["optimizer"]
    assert opt["family"] == mm.optimized.family and opt["lower_bound"] > 0
    assert opt["gap"] == pytest.approx(opt["error"] / opt["lower_bound"]) and opt["gap"] >= 1.0
    path = rel.save(tmp_path / "opt.npz")
    assert load_release(path).description["optimizer"] == opt
    assert main(["ledger", str(path)]) == 0
    assert f"certified gap {opt['gap']:.4g}" in capsys.readouterr().out


# -- what a release file may point to (a record is data from whoever made it) -----------------------
def _record(answers: str, ledger: list | None = None, **top) -> str:
    """A hand-made chunked release record (what a 400-byte crafted file holds)."""
    return json.dumps({"format": "sparsedp-release/1", "kind": "histogram", "private": True, "description": {},
                       "ledger": ledger or [], "model": {"answers": answers, "shape": [8],
                                                         "labels": {"bin": {"axis": 0}}, "variances": None}, **top})


def test_a_record_naming_a_file_outside_its_directory_is_refused(tmp_path, capsys):
    from sparsedp.errors import UnsafeFileError

    secret = tmp_path / "secret"
    secret.mkdir()
    truth = np.array([11, 0, 7, 3, 0, 5, 2, 9])
    np.save(secret / "true_histogram.npy", truth)
    pub = tmp_path / "pub"
    pub.mkdir()
    (pub / "link.npy").symlink_to(secret / "true_histogram.npy")
    entry = [{"label": "h", "epsilon": 1.0}]
    for name, answers in (("dotdot", "../secret/true_histogram.npy"),
                          ("absolute", str(secret / "true_histogram.npy")), ("symlink", "link.npy")):
        rec = pub / f"{name}.release.json"
        rec.write_text(_record(answers, entry))
        with pytest.raises(UnsafeFileError, match="directory"):
            load_release(rec)
        assert main(["query", str(rec), "0", "4"]) == 2 and main(["ledger", str(rec)]) == 2
        out = capsys.readouterr()
        assert str(int(truth[:5].sum())) not in out.out and "directory" in out.err
    (pub / "given.npy").symlink_to(secret / "true_histogram.npy")  # the array named by the record's own name
    (pub / "given.npy.release.json").write_text(_record("given.npy", entry))
    for path in ("given.npy", "given.npy.release.json"):
        with pytest.raises(UnsafeFileError, match="symlink"):
            load_release(pub / path)
    # an earlier record's estimate (the path written to) is read by its name next to the record only
    (pub / "old.release.json").write_text(json.dumps({"method": "boost", "ledger": entry,
                                                      "estimate": str(secret / "true_histogram.npy")}))
    with pytest.raises(SparseDPError, match="missing"):
        load_release(pub / "old.release.json")
    np.save(pub / "true_histogram.npy", np.ones(8))  # the one next to it is the release's
    np.testing.assert_array_equal(load_release(pub / "old.release.json").answers, np.ones(8))


def test_a_release_whose_ledger_is_empty_is_never_reported_private(tmp_path, capsys):
    from sparsedp.release_file import load_release_file

    np.save(tmp_path / "counts.npy", np.arange(8.0))
    rec = tmp_path / "counts.npy.release.json"
    rec.write_text(_record("counts.npy"))  # "private": true, no measurement
    rel = load_release(rec)
    assert rel.private is False and rel.ledger == ()
    assert main(["ledger", str(rec)]) == 0
    assert "NOT PRIVATE, 0 measurement(s)" in capsys.readouterr().out
    assert main(["query", str(rec), "0", "4"]) == 0
    assert "not private (it records no measurement)" in capsys.readouterr().err
    save_release(tmp_path / "bare.npz", "matrix-mechanism", {"answers": np.arange(4.0)})  # no ledger
    assert load_release_file(tmp_path / "bare.npz").private is False
    assert load_release(tmp_path / "bare.npz").private is False
    assert main(["ledger", str(tmp_path / "bare.npz")]) == 0
    assert "NOT PRIVATE" in capsys.readouterr().out
    assert ReleaseResult(kind="mine", answers=np.zeros(2)).private is False  # in memory too
    rec.write_text(_record("counts.npy", [{"label": "h", "epsilon": 1.0}]))  # one measurement: as the file says
    assert load_release(rec).private is True
    # a marginals JSON with no ledger and no privacy block to read one from; the first histogram layout
    (tmp_path / "m.json").write_text(json.dumps({"domain": {"names": ["a"], "sizes": [3]}, "private": True,
                                                 "marginals": [{"attributes": ["a"], "counts": [4, 1, 2],
                                                                "cell_variance": 1.0}]}))
    assert load_release(tmp_path / "m.json").private is False
    np.savez_compressed(tmp_path / "first.npz", method=np.array("dwork"), epsilon=np.array(1.0),
                        estimate=np.arange(4.0), consistent=np.array(True), private=np.array(True))
    assert load_release(tmp_path / "first.npz").private is False
    from sparsedp.trees.publishers import load_release as load_histogram

    assert load_histogram(tmp_path / "first.npz").private is False


# -- save never replaces an earlier release silently ------------------------------------------------
@pytest.mark.parametrize("cls", _release_classes(), ids=lambda c: c.__name__)
def test_every_release_class_saves_with_overwrite_false_by_default(cls):
    if not hasattr(cls, "save"):
        pytest.skip(f"{cls.__name__} has no save")
    if cls.__module__.startswith("sparsedp.continual"):
        pytest.skip("a continual counter's save writes its state, read and rewritten by design")
    assert inspect.signature(cls.save).parameters["overwrite"].default is False


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_refuses_to_save_over_an_existing_file(kinds, name, tmp_path):
    from sparsedp.errors import ReleaseExistsError

    want, path = kinds[name]
    rel = want if want is not None else load_release(path)
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(ReleaseExistsError, match="overwrite=True") as info:
        rel.save(path)
    assert str(path) in str(info.value) and isinstance(info.value, FileExistsError)
    assert before is None or path.read_bytes() == before
    for suffix in (".npz", ".npy"):  # replaced when asked
        if suffix == ".npy" and any(not isinstance(c, AxisLabel) for c in rel.labels.values()):
            continue
        if suffix == ".npy" and rel.variances is not None and rel.variances.strides != (0,):
            continue
        copy = tmp_path / f"copy{suffix}"
        rel.save(copy)
        with pytest.raises(ReleaseExistsError):
            rel.save(copy)
        if suffix == ".npy":
            Path(str(copy) + SIDE_SUFFIX).unlink()  # the array alone left: still refused
            with pytest.raises(ReleaseExistsError):
                rel.save(copy)
        _same(rel, load_release(rel.save(copy, overwrite=True)))


def test_the_release_classes_refuse_to_save_over_an_existing_file(tmp_path):
    from sparsedp.consistency import restaurant, restaurant_release
    from sparsedp.errors import ReleaseExistsError
    from sparsedp.flows import random_trips, release_flows, road_grid
    from sparsedp.marginals import Domain, release_marginals
    from sparsedp.trees import LUEDPTree

    road = road_grid(3, 3, seed=0)
    recs = np.random.default_rng(0).integers(0, 2, (50, 2))
    objects = [MatrixMechanism(wl.prefix(16), st.hierarchical(16, 4), epsilon=1.0).run(X[:16], rng=1),
               LUEDPTree(1.0).fit(X[:16], rng=1).release_,
               restaurant_release(sales=restaurant(8, seed=0), epsilon=1.0, seed=1),
               release_flows(road, random_trips(road, 10, seed=1, max_edges=3), epsilon=1.0, rng=0),
               release_marginals(recs, Domain(["a", "b"], [2, 2]), [("a",)], 1.0, rng=1)]
    for i, obj in enumerate(objects):
        p = tmp_path / f"r{i}.npz"
        obj.save(p)
        before = p.read_bytes()
        with pytest.raises(ReleaseExistsError, match=str(p)):
            obj.save(p)
        assert p.read_bytes() == before
        assert load_release(obj.save(p, overwrite=True)).kind == obj.to_release().kind
