"""Delayed SGD: delay 0 is serial SGD; a delay is a real stale read."""
import numpy as np
import pytest

from simlib.contract import serial_reference
from simlib.course.delayed import delayed_sgd, loss_against_delay
from simlib.problems.logistic import LogisticProblem, make_sparse_classification


@pytest.fixture(scope="module")
def prob():
    return LogisticProblem(make_sparse_classification(600, 40, 8, seed=1), eval_rows=None)


def test_delay_zero_is_serial_sgd(prob) -> None:
    np.testing.assert_array_equal(delayed_sgd(prob, 30, 16, 0.5, 0), serial_reference(prob, 30, 16, 0.5))


def test_delay_one_reads_the_table_one_step_old(prob) -> None:
    # By hand: step t's gradient is taken at w_{t-1} (w_0 for the first two steps).
    w_hist = [prob.init_params()]
    w = prob.init_params()
    shard = prob.shards(1)[0]
    for t in range(5):
        b = prob.batch(shard, t, 16)
        k = prob.keys(b)
        k, d = prob.step(w_hist[max(0, t - 1)][k], b, k, 0.5)
        w[k] += d
        w_hist.append(w.copy())
    np.testing.assert_allclose(delayed_sgd(prob, 5, 16, 0.5, 1), w)


def test_a_large_delay_at_a_large_step_hurts(prob) -> None:
    fresh, stale = loss_against_delay(prob, [0, 40], steps=200, batch_size=16, lr=8.0)
    assert stale > fresh


def test_bad_delay_is_named(prob) -> None:
    with pytest.raises(ValueError, match="delay"):
        delayed_sgd(prob, 5, 16, 0.5, -1)
