"""Spark's model in miniature: lazy transformations, cache() with and without room, text partitions round trip."""
import functools

import numpy as np
import pytest
import scipy.sparse

from simlib.course.fullbatch import Objective, gradient_descent, part_loss_grad
from simlib.course.spark import RDD, parse_points, text_file, write_text_partitions
from simlib.problems.logistic import make_sparse_classification


def numbers(n_parts=4):
    return RDD.source(lambda i: np.arange(3) + 10 * i, n_parts)


def total(rdd):
    return rdd.map(np.sum).reduce(lambda a, b: a + b)


def test_transformations_are_lazy_and_actions_read_the_source():
    src = numbers()
    doubled = src.map(lambda p: 2 * p)
    assert src.reads[0] == 0
    assert total(doubled) == 2 * sum(3 * 10 * i + 3 for i in range(4))
    assert total(doubled) == total(doubled) and src.reads[0] == 12   # no cache: every action reads again


def test_cache_reads_each_partition_once():
    src = numbers()
    kept = src.map(lambda p: p + 1).cache()
    assert src.reads[0] == 0
    assert [total(kept) for _ in range(3)] == [total(numbers().map(lambda p: p + 1))] * 3
    assert src.reads[0] == 4


def test_a_cache_too_small_for_a_cyclic_scan_never_hits():
    src = numbers(5)
    kept = src.cache(capacity=4)
    for _ in range(3):
        total(kept)
    assert src.reads[0] == 15
    roomy = numbers(5)
    full = roomy.cache(capacity=5)
    for _ in range(3):
        total(full)
    assert roomy.reads[0] == 5


def test_text_partitions_round_trip_and_gradient_descent_matches(tmp_path):
    data = make_sparse_classification(300, 25, 4, seed=1)
    paths = write_text_partitions(data, str(tmp_path), 3)
    points = text_file(paths).map(functools.partial(parse_points, n_features=25)).cache()
    X = points.map(lambda p: p[0]).reduce(lambda a, b: scipy.sparse.vstack([a, b]).tocsr())
    y = points.map(lambda p: p[1]).reduce(np.append)
    np.testing.assert_allclose(X.toarray(), data.to_scipy().toarray(), rtol=1e-6)
    np.testing.assert_array_equal(y, data.y)
    w = np.zeros(25)
    for _ in range(3):
        w = w - 1.0 * points.map(lambda part, w=w: part_loss_grad(part, w)[1]).reduce(np.add) / data.n_rows
    obj = Objective(data, 3, l2=1e-12)
    expected = gradient_descent(obj, 1.0, 3)
    assert obj.value(w) == pytest.approx(expected[-1][1], rel=1e-6)


def test_bad_input_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="n_parts"):
        RDD.source(lambda i: i, 0)
    with pytest.raises(ValueError, match="capacity"):
        numbers().cache(capacity=0)
    with pytest.raises(ValueError, match="n_parts"):
        write_text_partitions(make_sparse_classification(10, 5, 2, seed=0), str(tmp_path), 11)
