import numpy as np
import pytest

from sparsedp import SparseDPError
from sparsedp.datasets import demo_histogram, dpbench_names, load_dpbench, synthetic_histogram


def test_synthetic_histogram_is_counts():
    x = synthetic_histogram(512, seed=3)
    assert x.shape == (512,) and np.all(x >= 0) and np.all(x == np.round(x))
    np.testing.assert_array_equal(x, synthetic_histogram(512, seed=3))


def test_demo_histogram_always_available():
    x, label = demo_histogram()
    assert x.size > 0 and label


@pytest.mark.skipif(not dpbench_names(), reason="shared datasets not beside the checkout")
def test_dpbench_loads():
    x = load_dpbench("HEPTH.n4096.npy")
    assert x.shape == (4096,) and x.sum() == 347414


def test_missing_dataset_raises():
    with pytest.raises(SparseDPError):
        load_dpbench("no-such-file.npy")
