"""The Old-or-New-Testament task: labels follow the chapter, rows are unit-norm tf-idf, SGD learns it."""
from __future__ import annotations

import numpy as np
import pytest

import simlib
from simlib.problems.logistic import LogisticProblem
from simlib.problems.textclass import passages, kjv_testament_dataset


@pytest.fixture(scope="module")
def task():
    return kjv_testament_dataset(passage_tokens=100, min_count=10)


def test_passages_are_labelled_by_testament() -> None:
    texts, labels = passages(10_000)  # longer than any chapter: one passage per chapter
    assert len(texts) == 1_189
    assert labels[0] == -1.0 and labels[-1] == 1.0
    assert int((labels > 0).sum()) == 260  # Matthew 1 .. Revelation 22


def test_rows_are_unit_norm_tf_idf_over_words_and_pairs(task) -> None:
    data, features = task
    assert data.n_features == len(features) == len(set(features))
    assert any("_" in f for f in features) and "god" in features
    norms = np.sqrt(np.bincount(np.repeat(np.arange(data.n_rows), np.diff(data.indptr)), weights=data.values.astype(np.float64) ** 2))
    np.testing.assert_allclose(norms[norms > 0], 1.0, rtol=1e-5)
    # the most common word carries the least weight in a row that has it
    the = features.index("the")
    row = int(np.searchsorted(data.indptr, np.flatnonzero(data.indices == the)[0], side="right")) - 1
    lo, hi = data.indptr[row], data.indptr[row + 1]
    cols, vals = data.indices[lo:hi], data.values[lo:hi]
    rare = vals[cols != the]
    assert rare.size and vals[cols == the][0] < rare.max()


def test_rows_are_shuffled_with_the_seed(task) -> None:
    data, _ = task
    first = data.y[: data.n_rows // 4]
    assert 0.05 < float((first > 0).mean()) < 0.5  # not all Old Testament, as the book order would give
    a, _ = kjv_testament_dataset(passage_tokens=2_000, min_count=50, seed=1)
    b, _ = kjv_testament_dataset(passage_tokens=2_000, min_count=50, seed=1)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.indices, b.indices)


def test_sgd_separates_the_testaments(task) -> None:
    data, _ = task
    prob = LogisticProblem(data, l2=1e-5, eval_rows=None, l2_on="all")
    res = simlib.run(prob, "async", substrate="shm", n_workers=1, steps=5 * data.n_rows, batch_size=1, lr=0.5)
    majority = max(float((data.y > 0).mean()), float((data.y < 0).mean()))
    assert prob.accuracy(prob.weights(res.params)) > majority + 0.1


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="passage_tokens"):
        kjv_testament_dataset(passage_tokens=0)
    with pytest.raises(ValueError, match="min_count"):
        kjv_testament_dataset(passage_tokens=10_000, min_count=10**9)
