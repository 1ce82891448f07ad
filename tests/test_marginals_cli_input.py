"""``sparsedp marginals``: CSV / Parquet / .npy input, each bad-input case, and the progress bar (issue 15)."""

import io
import json
import re

import numpy as np
import pytest

import sparsedp.progress
from _tables import write_table
from sparsedp.cli import main
from sparsedp.marginals import cli as mcli

pd = pytest.importorskip("pandas")


@pytest.fixture
def frame():
    rng = np.random.default_rng(1)
    return pd.DataFrame({"a": rng.integers(0, 3, 300), "b": rng.integers(0, 2, 300), "note": "x"})


def _release(data, out, *extra):
    return main(["marginals", data, "--columns", "a,b", "--sizes", "3,2", "--rho", "20", "--seed", "2",
                 "--out", str(out), *extra])


@pytest.mark.parametrize("ext", ["csv", "parquet", "npy"])
def test_every_format_gives_the_same_release(tmp_path, frame, ext):
    ref = tmp_path / "ref.json"
    assert _release(write_table(frame, tmp_path / "d.csv"), ref) == 0
    out = tmp_path / "o.json"
    df = frame[["a", "b"]] if ext == "npy" else frame
    assert _release(write_table(df, tmp_path / f"d.{ext}"), out) == 0
    got, want = json.loads(out.read_text()), json.loads(ref.read_text())
    assert got["marginals"] == want["marginals"]  # same records, same seed: the same release
    truth = frame.groupby(["a", "b"]).size().unstack(fill_value=0).to_numpy()
    err = np.asarray(got["marginals"][0]["counts"]) - truth
    assert np.mean(err ** 2) < 10 * got["marginals"][0]["cell_variance"]


def _bad(frame):
    text = frame.astype({"b": object})
    text.loc[4, "b"] = "yes"
    nan = frame.astype({"b": float})
    nan.loc[3, "b"] = np.nan
    frac = frame.astype({"b": float})
    frac.loc[2, "b"] = 0.5
    big = frame.copy()
    big.loc[1, "a"] = 7
    return {
        "missing column": (frame.drop(columns="b"), "no column"),
        "non-numeric": (text, "non-numeric|not numeric"),
        "NaN": (nan, "NaN"),
        "non-integer": (frac, "integer codes"),
        "outside the domain": (big, "outside|code"),
        "empty": (frame.iloc[:0], "no records"),
    }


@pytest.mark.parametrize("ext", ["csv", "parquet"])
@pytest.mark.parametrize("case", ["missing column", "non-numeric", "NaN", "non-integer", "outside the domain", "empty"])
def test_bad_tables_are_refused_before_any_noise(tmp_path, frame, ext, case, capsys, monkeypatch):
    df, pattern = _bad(frame)[case]
    if ext == "parquet" and case == "non-numeric":
        df = df.astype({"b": str})
    data = write_table(df, tmp_path / f"bad.{ext}")
    monkeypatch.setattr(mcli, "release_marginals", lambda *a, **k: pytest.fail("reached the release"))
    out = tmp_path / "o.json"
    assert _release(data, out) == 2
    err = capsys.readouterr().err
    assert "sparsedp: error" in err and re.search(pattern, err, re.I), err
    assert not out.exists()


def test_bad_files_are_refused(tmp_path, capsys):
    out = tmp_path / "o.json"
    (tmp_path / "blank.csv").write_text("")
    (tmp_path / "d.txt").write_text("a,b\n0,1\n")
    (tmp_path / "junk.parquet").write_text("not parquet")
    np.save(tmp_path / "wide.npy", np.zeros((5, 3)))
    np.save(tmp_path / "text.npy", np.array([["u", "v"]] * 3))
    for name, pattern in (("absent.csv", "no such file"), ("blank.csv", "empty"), ("d.txt", "unsupported"),
                          ("junk.parquet", "cannot read"), ("wide.npy", "shape"), ("text.npy", "not numeric")):
        assert _release(str(tmp_path / name), out) == 2, name
        assert pattern in capsys.readouterr().err, name
        assert not out.exists()
    (tmp_path / "c.json").write_text(json.dumps({"a": [0, 1, 2], "b": [0, 1]}))
    assert main(["marginals", str(tmp_path / "wide.npy"), "--columns", "a,b", "--categories", str(tmp_path / "c.json"), "--rho", "1",
                 "--out", str(out)]) == 2
    assert "--sizes" in capsys.readouterr().err
    assert main(["marginals", str(tmp_path / "wide.npy"), "--columns", "a,b", "--sizes", "3,x", "--rho", "1",
                 "--out", str(out)]) == 2
    assert "--sizes must be" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(tmp_path, frame, capsys, monkeypatch):
    data = write_table(frame, tmp_path / "d.csv")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(sparsedp.progress, "DELAY", 0.0)  # draw at once (by default after 1 s)
    assert _release(data, tmp_path / "o.json") == 0
    assert "stages" not in capsys.readouterr().err  # not a terminal: silent
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    assert _release(data, tmp_path / "o2.json") == 0
    drawn = term.getvalue()
    assert "marginals: 0/4 stages" in drawn and "reading d.csv" in drawn
    # library calls outside the sparsedp command never draw
    from sparsedp.progress import loop_disable

    assert loop_disable() is True
