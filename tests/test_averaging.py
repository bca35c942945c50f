"""Model averaging and iterative parameter mixing on the Problem contract."""
import numpy as np
import pytest

from simlib.course.averaging import parameter_mixing, train_on_shard
from simlib.contract import serial_reference
from simlib.problems.logistic import LogisticProblem, make_sparse_classification


@pytest.fixture(scope="module")
def prob():
    return LogisticProblem(make_sparse_classification(800, 40, 6, seed=3), eval_rows=None)


def test_training_on_the_whole_shard_is_serial_sgd(prob) -> None:
    np.testing.assert_array_equal(train_on_shard(prob, prob.shards(1)[0], 25, 16, 0.5), serial_reference(prob, 25, 16, 0.5))


def test_one_round_of_mixing_is_the_mean_of_the_parts(prob) -> None:
    parts = [train_on_shard(prob, s, 10, 16, 0.5) for s in prob.shards(2)]
    np.testing.assert_allclose(parameter_mixing(prob, 2, 1, 10, 16, 0.5)[0], (parts[0] + parts[1]) / 2)


def test_later_rounds_start_from_the_average_and_continue_the_batches(prob) -> None:
    first, second = parameter_mixing(prob, 2, 2, 5, 16, 0.5)
    parts = [train_on_shard(prob, s, 5, 16, 0.5, w0=first, first_step=5) for s in prob.shards(2)]
    np.testing.assert_allclose(second, (parts[0] + parts[1]) / 2)
    assert prob.quality(second) < prob.quality(first)


def test_train_on_shard_leaves_w0_alone_and_names_bad_input(prob) -> None:
    w0 = prob.init_params()
    train_on_shard(prob, prob.shards(1)[0], 3, 8, 0.5, w0=w0)
    assert not w0.any()
    with pytest.raises(ValueError, match="n_parts"):
        parameter_mixing(prob, 0, 1, 3, 8, 0.5)
    with pytest.raises(ValueError, match="steps"):
        train_on_shard(prob, prob.shards(1)[0], 0, 8, 0.5)
