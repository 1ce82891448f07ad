"""sparsedp.Domain: attribute names and sizes, record encoding."""

import numpy as np
import pytest

import sparsedp
from sparsedp.errors import InputBoundError, ShapeError


def test_domain_basics():
    d = sparsedp.Domain(["age", "sex", "edu"], [5, 2, 4])
    assert len(d) == 3 and d.size == 40
    assert d.axes(["edu", "age"]) == (0, 2) and d.axes(1) == (1,)
    assert d.project(["edu", "sex"]) == sparsedp.Domain(["sex", "edu"], [2, 4])
    assert sparsedp.Domain.uniform(100, 10).size == 10**100  # never enumerated


@pytest.mark.parametrize("names, sizes", [(["a", "a"], [2, 2]), (["a"], [0]), (["a", "b"], [2]), (["a"], ["x"])])
def test_bad_domains(names, sizes):
    with pytest.raises(ShapeError):
        sparsedp.Domain(names, sizes)


def test_axes_errors():
    d = sparsedp.Domain(["a", "b"], [2, 3])
    for bad in (["c"], [2], ["a", 0]):
        with pytest.raises(ShapeError):
            d.axes(bad)


def test_encode_checks_and_dtype():
    d = sparsedp.Domain(["a", "b"], [2, 300])
    X = np.array([[0, 299], [1, 0]])
    assert d.encode(X).dtype == np.uint16 and np.array_equal(d.encode(X), X)
    with pytest.raises(InputBoundError):
        d.encode(np.array([[0, 300]]))
    with pytest.raises(ShapeError):
        d.encode(np.array([["x", "y"]]))
