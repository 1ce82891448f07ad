"""``sparsedp continual DATA --column C`` (issue 15): a stream from a file, checked before any noise."""

import io
import sys

import numpy as np
import pytest
from _cli_help import cli_help

import sparsedp.continual.cli as ccli
from sparsedp.cli import main

STREAM = [3, 0, 5, 1, 0, 0, 2, 7]


def _stdin_run(monkeypatch, capsys, argv, values):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{v}\n" for v in values)))
    assert main(["continual", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("method", ["fenwick", "gls-tree"])
def test_file_stream_equals_the_stdin_stream(tmp_path, monkeypatch, capsys, method):
    argv = ["--horizon", "10", "--seed", "4", "--std", "--method", method]
    piped = _stdin_run(monkeypatch, capsys, argv, STREAM)
    assert len(piped.splitlines()) == len(STREAM)
    csv = tmp_path / "s.csv"
    csv.write_text("day,n\n" + "".join(f"{d},{v}\n" for d, v in enumerate(STREAM)))
    npy = tmp_path / "s.npy"
    np.save(npy, np.array(STREAM, dtype=np.int64))
    monkeypatch.setattr(sys, "stdin", io.StringIO("999\n"))  # a DATA file is read instead of stdin
    assert main(["continual", str(csv), "--column", "n", *argv]) == 0
    assert capsys.readouterr().out == piped
    assert main(["continual", str(npy), *argv]) == 0
    assert capsys.readouterr().out == piped
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pq = tmp_path / "s.parquet"
    pd.DataFrame({"n": STREAM}).to_parquet(pq)
    assert main(["continual", str(pq), "--column", "n", *argv]) == 0
    assert capsys.readouterr().out == piped


def test_unit_increments_from_a_file(tmp_path, monkeypatch, capsys):
    vals = [0.25, 1.0, 0.0, 0.5]
    argv = ["--horizon", "4", "--seed", "2", "--increments", "unit"]
    piped = _stdin_run(monkeypatch, capsys, argv, vals)
    path = tmp_path / "u.csv"
    path.write_text("x\n" + "".join(f"{v}\n" for v in vals))
    assert main(["continual", str(path), "--column", "x", *argv]) == 0
    assert capsys.readouterr().out == piped


BAD = [
    ("day,n\n0,1\n1,2\n", ["--column", "count"], "no column 'count'"),
    ("day,n\n0,1\n1,two\n", ["--column", "n"], "row 3 of column 'n' is not numeric"),
    ("day,n\n0,1\n1,\n", ["--column", "n"], "not numeric"),
    ("day,n\n", ["--column", "n"], "holds no values"),
    ("", ["--column", "n"], "empty"),
    ("n\n1\n-1\n", ["--column", "n"], "row 3: increment -1.0 is not a non-negative integer"),
    ("n\n1\n1.5\n", ["--column", "n"], "not a non-negative integer"),
    ("n\n0.5\n1.5\n", ["--column", "n", "--increments", "unit"], "outside [0, 1]"),
    ("n\n1\nnan\n", ["--column", "n"], "NaN"),
    ("n\n" + "1\n" * 6, ["--column", "n"], "holds 6 increments but --horizon is 5"),
    ("n\n1\n", [], "name its column"),
]


@pytest.mark.parametrize("text,extra,message", BAD)
def test_bad_files_are_refused_before_any_counter_exists(tmp_path, monkeypatch, capsys, text, extra, message):
    path = tmp_path / "s.csv"
    path.write_text(text)

    def no_counter(*a, **k):
        raise AssertionError("a counter (and its noise) was created for bad input")

    monkeypatch.setattr(ccli, "ContinualCounter", no_counter)
    monkeypatch.setattr(ccli, "GLSTreeCounter", no_counter)
    assert main(["continual", str(path), "--horizon", "5", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing released
    assert message in captured.err


def test_other_bad_sources(tmp_path, monkeypatch, capsys):
    assert main(["continual", str(tmp_path / "missing.csv"), "--column", "n", "--horizon", "5"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["continual", "--column", "n", "--horizon", "5"]) == 2  # --column without a file
    assert "--column" in capsys.readouterr().err
    np.save(tmp_path / "m.npy", np.ones((2, 2)))
    assert main(["continual", str(tmp_path / "m.npy"), "--horizon", "5"]) == 2
    assert "1-D" in capsys.readouterr().err
    (tmp_path / "s.txt").write_text("1\n")
    assert main(["continual", str(tmp_path / "s.txt"), "--horizon", "5"]) == 2
    assert "unsupported" in capsys.readouterr().err
    (tmp_path / "ok.csv").write_text("n\n1\n")
    assert main(["continual", str(tmp_path / "ok.csv"), "--column", "n", "--horizon", "0"]) == 2


def test_resumed_state_checks_the_steps_left(tmp_path, monkeypatch, capsys):
    state = str(tmp_path / "s.json")
    _stdin_run(monkeypatch, capsys, ["--horizon", "4", "--state", state, "--seed", "1"], [1, 1])
    path = tmp_path / "rest.csv"
    path.write_text("n\n1\n1\n1\n")
    assert main(["continual", str(path), "--column", "n", "--horizon", "4", "--state", state, "--seed", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "only 2 of the --horizon 4 steps are left" in captured.err
    path.write_text("n\n1\n1\n")
    assert main(["continual", str(path), "--column", "n", "--horizon", "4", "--state", state, "--seed", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_no_progress_bar_when_not_a_terminal(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text("n\n" + "1\n" * 50)
    assert main(["continual", str(path), "--column", "n", "--horizon", "64"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.splitlines()) == 50


def test_a_reader_that_stops_early_ends_the_stream_quietly(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    data = tmp_path / "s.npy"
    np.save(data, np.ones(200_000, dtype=np.int64))
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen([sys.executable, "-m", "sparsedp", "continual", str(data), "--horizon", "200000",
                             "--float-noise"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141
    assert float(first) == float(first) and "Traceback" not in err


def test_continual_help_documents_the_file_input(monkeypatch, capsys):
    out = cli_help(["continual", "--help"], monkeypatch, capsys)
    for word in ("data", "--column", "CSV", "Parquet", ".npy", "--horizon", "stdin"):
        assert word in out


# ---- issue 26, finding 3: a step is saved (durably) before it is printed, and never re-released ----

def _published(out):
    return [float(line.split("\t")[0]) for line in out.splitlines() if line.strip()]


def test_a_failed_save_publishes_nothing_for_that_step(tmp_path, monkeypatch, capsys):
    import json

    state = tmp_path / "s.json"
    argv = ["--horizon", "8", "--state", str(state)]
    first = _published(_stdin_run(monkeypatch, capsys, argv, [1, 1]))
    assert len(first) == 2

    def full_disk(self, path):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(ccli.ContinualCounter, "save", full_disk)
        m.setattr(sys, "stdin", io.StringIO("1\n1\n"))
        assert main(["continual", *argv]) == 2
        captured = capsys.readouterr()
    assert captured.out == ""  # nothing of step 3 was published
    assert "cannot save" in captured.err and "step 3" in captured.err
    assert json.loads(state.read_text())["t"] == 2
    # the resume releases step 3 for the first time: one value per step over all the runs
    again = _published(_stdin_run(monkeypatch, capsys, argv, [1]))
    assert len(first) + len(again) == 3 and json.loads(state.read_text())["t"] == 3


def test_the_state_is_saved_and_synced_before_a_step_is_printed(tmp_path, monkeypatch):
    import os
    import stat

    events = []
    save = ccli.ContinualCounter.save
    fsync = os.fsync

    def logged_save(self, path):
        save(self, path)
        events.append(("save", self.t))

    def logged_fsync(fd):
        fsync(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            events.append(("dir", None))

    class Out(io.StringIO):
        def write(self, text):
            events.append(("print", text))
            return super().write(text)

    monkeypatch.setattr(ccli.ContinualCounter, "save", logged_save)
    monkeypatch.setattr(os, "fsync", logged_fsync)
    monkeypatch.setattr(sys, "stdout", Out())
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n0\n2\n"))
    assert main(["continual", "--horizon", "8", "--state", str(tmp_path / "s.json")]) == 0
    prints = [i for i, e in enumerate(events) if e[0] == "print"]
    assert len(prints) == 3
    for step, i in enumerate(prints, start=1):
        saves = [j for j in range(i) if events[j] == ("save", step)]
        assert saves, f"step {step} was printed before it was saved"
        assert any(events[j][0] == "dir" for j in range(saves[-1], i)), f"step {step}: directory not synced"


def test_a_restored_older_state_is_refused_not_re_released(tmp_path, monkeypatch, capsys):
    state = tmp_path / "s.json"
    argv = ["--horizon", "8", "--state", str(state)]
    _stdin_run(monkeypatch, capsys, argv, [1, 1])
    older = state.read_bytes()
    _stdin_run(monkeypatch, capsys, argv, [1, 1])
    latest = state.read_bytes()
    for _ in range(3):  # "restore the state" again and again: never a fresh draw of steps 3 and 4
        state.write_bytes(older)
        monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))
        assert main(["continual", *argv]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "4 steps were published" in captured.err and "holds 2" in captured.err
        assert state.read_bytes() == older  # untouched
    state.unlink()  # a lost state is no licence to start the same release again
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))
    assert main(["continual", *argv]) == 2
    assert capsys.readouterr().out == ""
    state.write_bytes(latest)  # the latest state resumes
    state.chmod(0o600)
    assert len(_published(_stdin_run(monkeypatch, capsys, argv, [1]))) == 1


def test_a_state_and_record_restored_from_a_backup_replay_the_published_values(tmp_path, monkeypatch, capsys):
    # the record check cannot see a backup of both files; the noise key in the state makes the replay harmless
    state = tmp_path / "s.json"
    record = tmp_path / "s.json.published"
    argv = ["--horizon", "8", "--state", str(state)]
    _stdin_run(monkeypatch, capsys, argv, [1, 1])
    backup = state.read_bytes(), record.read_bytes()
    published = _published(_stdin_run(monkeypatch, capsys, argv, [1, 0, 2]))  # steps 3..5
    for values in ([1, 0, 2], [1, 0, 2], [1, 0]):
        state.write_bytes(backup[0])
        record.write_bytes(backup[1])
        assert _published(_stdin_run(monkeypatch, capsys, argv, values)) == published[:len(values)]


def test_a_resume_reprints_the_saved_step_instead_of_drawing_it_again(tmp_path, monkeypatch, capsys):
    state = tmp_path / "s.json"
    argv = ["--horizon", "8", "--state", str(state), "--std"]
    out = _stdin_run(monkeypatch, capsys, argv, [1, 1])
    last = out.splitlines()[-1].split("\t")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["continual", *argv]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "after step 2" in captured.err
    assert last[0] in captured.err and last[1] in captured.err  # the value published, not a new one

    class Died(BaseException):
        pass

    class Dying(io.StringIO):  # the process dies between the save of step 3 and its line
        def write(self, text):
            raise Died

    monkeypatch.setattr(sys, "stdout", Dying())
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))
    with pytest.raises(Died):
        main(["continual", *argv])
    monkeypatch.undo()
    capsys.readouterr()
    notes = []
    for _ in range(2):
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        assert main(["continual", *argv]) == 0
        captured = capsys.readouterr()
        assert captured.out == "" and "after step 3" in captured.err
        notes.append(captured.err)
    assert notes[0] == notes[1]  # step 3 is re-printed from the state, never drawn again
    assert len(_published(_stdin_run(monkeypatch, capsys, argv, [1]))) == 1  # step 4


def test_two_runs_on_one_state_file_are_refused_not_both_released(tmp_path, monkeypatch, capsys):
    """Two concurrent runs on one --state would each pass the resume check and release the same next
    step twice; the second is refused while the first holds the state's lock."""
    import fcntl
    import os

    state = tmp_path / "s.json"
    fd = os.open(tmp_path / "s.json.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a first run in progress
    try:
        monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))
        assert main(["continual", "--horizon", "8", "--state", str(state)]) == 2
        assert "another sparsedp continual run" in capsys.readouterr().err
        assert not state.exists()  # nothing drawn, nothing saved
    finally:
        os.close(fd)
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))
    assert main(["continual", "--horizon", "8", "--state", str(state)]) == 0  # free again


def _records(tmp_path):
    rng = np.random.default_rng(7)
    steps = rng.integers(1, 11, 300)
    ids = rng.integers(0, 40, 300)
    path = tmp_path / "rec.csv"
    path.write_text("day,CustomerID\n" + "".join(f"{s},c{u}\n" for s, u in zip(steps, ids)))
    return path, steps, np.array([f"c{u}" for u in ids], dtype=object)


@pytest.mark.parametrize("bounds, unit_kw", [
    (["--max-rows", "3"], {"max_rows": 3}),
    (["--max-groups", "2", "--max-rows-per-group", "2"], {"max_groups": 2, "max_rows_per_group": 2}),
])
def test_records_per_privacy_unit_release_every_step(tmp_path, capsys, bounds, unit_kw):
    """``--privacy-unit``: the records are truncated per unit (steps as groups) and the counter is
    calibrated per unit; the same as the Python API with the same seed; every step of the horizon
    is printed (how many steps hold records is not published)."""
    from sparsedp.continual import ContinualCounter, unit_increments
    from sparsedp.privacy_unit import PrivacyUnit

    path, steps, ids = _records(tmp_path)
    assert main(["continual", str(path), "--step-column", "day", "--horizon", "12", "--privacy-unit", "CustomerID",
                 *bounds, "--seed", "5"]) == 0
    cap = capsys.readouterr()
    out = [float(v) for v in cap.out.split()]
    assert len(out) == 12
    assert "privacy unit: CustomerID" in cap.err and "per unit" in cap.err
    unit = PrivacyUnit("CustomerID", **unit_kw)
    a = unit_increments(steps, 12, ids, unit, rng=np.random.default_rng([5, 2]))
    want = ContinualCounter(12, epsilon=1.0, rng=5, privacy_unit=unit).run(a)
    assert np.allclose(out, np.round(want, 6), atol=1e-6)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_records_with_auto_bound_report_the_private_choice(tmp_path, capsys):
    path, _, _ = _records(tmp_path)
    assert main(["continual", str(path), "--step-column", "day", "--horizon", "10", "--privacy-unit", "CustomerID",
                 "--max-rows", "auto", "--seed", "1"]) == 0
    cap = capsys.readouterr()
    assert len(cap.out.split()) == 10
    assert "chosen privately" in cap.err and "epsilon 0.1 of the budget" in cap.err


@pytest.mark.parametrize("extra, stdin, message", [
    (["--state", "{tmp}/s.json"], False, "no --state"),
    ([], True, "needs the records as a DATA file"),
    (["--column", "day"], False, "--column is not used"),
    (["--increments", "unit"], False, "must be counts"),
    (["--method", "gls-tree"], False, "--method fenwick"),
])
def test_bad_per_unit_runs_are_refused_before_anything_is_read(tmp_path, monkeypatch, capsys, extra, stdin, message):
    path, _, _ = _records(tmp_path)
    src = [] if stdin else [str(path), "--step-column", "day"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))
    argv = ["continual", *src, "--horizon", "10", "--privacy-unit", "CustomerID", "--max-rows", "3",
            *[e.replace("{tmp}", str(tmp_path)) for e in extra]]
    assert main(argv) != 0
    cap = capsys.readouterr()
    assert message in cap.err and cap.out == ""
    assert not (tmp_path / "s.json").exists()


def test_per_unit_records_are_checked(tmp_path, capsys):
    path, _, _ = _records(tmp_path)
    base = ["continual", str(path), "--privacy-unit", "CustomerID", "--max-rows", "3"]
    assert main([*base, "--horizon", "10"]) != 0
    assert "--step-column" in capsys.readouterr().err
    assert main([*base, "--horizon", "5", "--step-column", "day"]) != 0  # steps beyond the horizon
    assert "1 .. 5" in capsys.readouterr().err
    missing = tmp_path / "m.csv"
    missing.write_text("day,CustomerID\n1,a\n2,\n")
    assert main(["continual", str(missing), "--step-column", "day", "--horizon", "3", "--privacy-unit",
                 "CustomerID", "--max-rows", "2"]) != 0
    assert "no value" in capsys.readouterr().err
    assert main(["continual", str(missing), "--step-column", "day", "--horizon", "3", "--privacy-unit",
                 "CustomerID", "--max-rows", "2", "--drop-missing-units", "--seed", "0"]) == 0
    assert len(capsys.readouterr().out.split()) == 3
    assert main(["continual", str(path), "--step-column", "day", "--horizon", "10"]) != 0
    assert "goes with --privacy-unit" in capsys.readouterr().err


def test_a_values_file_with_an_id_like_column_warns(tmp_path, capsys):
    path = tmp_path / "v.csv"
    path.write_text("n,user_id\n1,a\n2,b\n")
    assert main(["continual", str(path), "--column", "n", "--horizon", "3", "--seed", "0"]) == 0
    err = capsys.readouterr().err
    assert "warning: column 'user_id' looks like an identifier" in err
