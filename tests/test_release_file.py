"""Release files: released arrays, description and ledger round-trip; never the data; seeded runs
are marked not private; `sparsedp ledger FILE` prints the ledger."""

import numpy as np
import pytest

from sparsedp import Accountant, MatrixMechanism, SparseDPError
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.cli import main
from sparsedp.release_file import load_release_file, save_release


def test_matrix_mechanism_release_round_trip(tmp_path):
    x = np.arange(16) * 3
    acc = Accountant(epsilon=1.0)
    rel = MatrixMechanism(wl.prefix(16), st.hierarchical(16, 4), epsilon=0.5, accountant=acc).run(x)
    path = rel.save(tmp_path / "r.npz")
    back = load_release_file(path)
    assert back.kind == "matrix-mechanism" and back.private
    np.testing.assert_array_equal(back.arrays["answers"], rel.answers)
    assert back.epsilon == 0.5 and back.ledger[0]["sensitivity"] == 3 and back.ledger[0]["secure"] is True
    assert back.ledger[0] == acc.ledger[0].as_dict()
    for name, arr in back.arrays.items():  # nothing equal to the data
        assert not (arr.shape == x.shape and np.array_equal(arr, x)), name


def test_seeded_release_is_marked_not_private(tmp_path, capsys):
    rel = MatrixMechanism(wl.identity(4), st.identity(4), epsilon=1.0).run([1, 2, 3, 4], rng=0)
    path = rel.save(tmp_path / "seeded.npz")
    assert load_release_file(path).private is False
    assert main(["ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "NOT PRIVATE" in out and "epsilon=1" in out and "exact laplace" in out and "total: epsilon 1" in out


def test_not_a_release_file(tmp_path, capsys):
    np.savez(tmp_path / "plain.npz", a=np.ones(3))
    with pytest.raises(SparseDPError, match="not a sparsedp release"):
        load_release_file(tmp_path / "plain.npz")
    assert main(["ledger", str(tmp_path / "plain.npz")]) == 2
    with pytest.raises(SparseDPError):
        save_release(tmp_path / "bad.npz", "x", {"a": np.array([object()])})


def test_flows_and_restaurant_releases_save_in_the_one_format(tmp_path):
    from sparsedp.consistency import restaurant, restaurant_release
    from sparsedp.flows import random_trips, release_flows, road_grid

    road = road_grid(4, 4, seed=0)
    trips = random_trips(road, 30, seed=1, max_edges=4)
    acc = Accountant(epsilon=2.0)
    fl = release_flows(road, trips, epsilon=1.0, accountant=acc)
    back = load_release_file(fl.save(tmp_path / "f.npz"))
    assert back.kind == "flows" and back.epsilon == 1.0 and back.ledger[0] == acc.ledger[0].as_dict()
    rel = restaurant_release(sales=restaurant(16, seed=0), epsilon=1.0, accountant=acc)
    back = load_release_file(rel.save(tmp_path / "r.npz"))
    assert back.kind == "restaurant" and back.private and back.description["days"] == 16
    ev = restaurant_release(sales=restaurant(16, seed=0), epsilon=1.0, evaluate=True)
    assert load_release_file(ev.save(tmp_path / "e.npz")).private is False


def test_save_release_refuses_an_existing_file_unless_asked(tmp_path):
    from sparsedp.errors import ReleaseExistsError

    entry = [{"label": "x", "epsilon": 1.0}]
    path = save_release(tmp_path / "r.npz", "mine", {"answers": np.arange(3.0)}, ledger=entry)
    with pytest.raises(ReleaseExistsError, match="overwrite=True") as info:
        save_release(path, "mine", {"answers": np.zeros(3)}, ledger=entry)
    assert str(path) in str(info.value)
    np.testing.assert_array_equal(load_release_file(path).arrays["answers"], np.arange(3.0))  # untouched
    save_release(path, "mine", {"answers": np.zeros(3)}, ledger=entry, overwrite=True)
    np.testing.assert_array_equal(load_release_file(path).arrays["answers"], np.zeros(3))
    back = load_release_file(save_release(tmp_path / "none.npz", "mine", {"answers": np.zeros(3)}))
    assert back.private is False  # no measurement recorded: never reported private
