"""The worker-side cache model: no cache is plain round-robin SGD; a cache saves pulls and reads stale rows."""
import numpy as np
import pytest

from simlib.course.cache import cached_sgd
from simlib.contract import serial_reference
from simlib.problems.logistic import LogisticProblem, make_sparse_classification


@pytest.fixture(scope="module")
def prob():
    return LogisticProblem(make_sparse_classification(800, 60, 6, seed=2), eval_rows=None)


def test_one_worker_without_cache_is_serial_sgd(prob) -> None:
    w, st = cached_sgd(prob, 1, 25, 16, 0.5, refresh=1)
    np.testing.assert_allclose(w, serial_reference(prob, 25, 16, 0.5))
    assert st.hits == 0 and st.pulled_keys == st.reads


def test_one_worker_with_a_cache_reads_nothing_stale(prob) -> None:
    # Write-through: a lone worker's cache holds exactly the table, so caching changes nothing.
    w, st = cached_sgd(prob, 1, 25, 16, 0.5, refresh=10)
    np.testing.assert_allclose(w, serial_reference(prob, 25, 16, 0.5))
    assert st.hits > 0 and st.mean_age == 0.0


def test_a_longer_refresh_pulls_less_and_reads_older_rows(prob) -> None:
    stats = [cached_sgd(prob, 4, 200, 16, 0.5, refresh=r)[1] for r in (1, 4, 16)]
    pulled = [s.pulled_keys for s in stats]
    ages = [s.mean_age for s in stats]
    assert pulled[0] > pulled[1] > pulled[2]
    assert ages[0] == 0.0 < ages[1] < ages[2]
    assert stats[0].reads == stats[2].reads == stats[1].hits + stats[1].pulled_keys


def test_bad_refresh_is_named(prob) -> None:
    with pytest.raises(ValueError, match="refresh"):
        cached_sgd(prob, 2, 5, 8, 0.5, refresh=0)
