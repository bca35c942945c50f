"""The array-module helpers that let one function run on NumPy in CI and on CuPy on a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from simlib.backend import array_module, get_xp, gpu_available, scatter_add, segment_sum, to_numpy


def _modules() -> list:
    return [np] + ([get_xp("cupy")] if gpu_available() else [])


@pytest.mark.parametrize("xp", _modules(), ids=lambda m: m.__name__)
def test_scatter_add_accumulates_repeated_indices(xp) -> None:
    target = xp.zeros(5)
    scatter_add(target, xp.asarray([1, 3, 1, 1]), xp.asarray([1.0, 2.0, 0.5, 0.25]))
    np.testing.assert_array_equal(to_numpy(target), [0.0, 1.75, 0.0, 2.0, 0.0])


@pytest.mark.parametrize("xp", _modules(), ids=lambda m: m.__name__)
def test_segment_sum_has_the_asked_length_and_sums_or_counts(xp) -> None:
    index = xp.asarray([0, 2, 2, 0, 2])
    sums = segment_sum(index, xp.asarray([1.0, 2.0, 3.0, 4.0, 5.0]), 4)
    counts = segment_sum(index, None, 4)
    assert array_module(sums) is xp and sums.shape == (4,)
    np.testing.assert_array_equal(to_numpy(sums), [5.0, 0.0, 10.0, 0.0])
    np.testing.assert_array_equal(to_numpy(counts), [2, 0, 3, 0])
    assert np.issubdtype(to_numpy(counts).dtype, np.integer)


def test_get_xp_names_the_bad_choice() -> None:
    with pytest.raises(ValueError, match="xp must be one of"):
        get_xp("tpu")
