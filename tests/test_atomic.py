"""simlib.problems.atomic: adds and compare-and-swaps that two threads running compiled code at once never lose."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from numba import njit

from simlib.problems.atomic import atomic_add, compare_swap

N = 2_000_000


@njit(nogil=True)
def _add_many(arr, ones, atomic, passes=1):  # pragma: no cover - compiled
    # ``ones`` may alias ``arr`` as far as the compiler knows, so the plain adds stay one load and store each
    for _ in range(passes):
        for i in range(ones.shape[0]):
            if atomic:
                atomic_add(arr, 0, ones[i])
            else:
                arr[0] += ones[i]


@njit(nogil=True)
def _lock_and_count(locks, counter, n, me):  # pragma: no cover - compiled
    for _ in range(n):
        while not compare_swap(locks, 0, 0, me):
            pass
        counter[0] += 1  # a plain add, safe only while the lock is held
        compare_swap(locks, 0, me, 0)


def _two_threads(target, *args_per_thread) -> None:
    """Run ``target`` in two threads let go together (compiled with nogil, they run at once)."""
    start = threading.Barrier(len(args_per_thread))

    def run(*args):
        start.wait()
        target(*args)

    threads = [threading.Thread(target=run, args=args) for args in args_per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_atomic_adds_from_two_threads_lose_nothing(dtype):
    arr = np.zeros(1, dtype)
    ones = np.ones(N, dtype)
    _two_threads(_add_many, (arr, ones, True), (arr, ones, True))
    assert arr[0] == 2 * N


def test_the_same_adds_without_atomics_lose_some():
    """The check above can fail: two threads' plain read-modify-writes lose updates (it tries a few times).

    Each thread adds 25 x N times (~0.1 s): where the machine is busy and both threads share one core, a thread
    preempted between its load and its store writes back a stale count, which only a run of many time slices
    makes sure to happen (at N adds, a few ms, 20 tries once lost nothing beside the suite)."""
    lost = False
    for _ in range(20):
        arr = np.zeros(1, np.int64)
        ones = np.ones(N, np.int64)
        _two_threads(_add_many, (arr, ones, False, 25), (arr, ones, False, 25))
        if arr[0] < 2 * 25 * N:
            lost = True
            break
    assert lost


def test_compare_swap_takes_a_free_lock_only_and_says_so():
    locks = np.zeros(1, np.int32)
    assert _take(locks, 1) and locks[0] == 1
    assert not _take(locks, 2) and locks[0] == 1  # held by 1: refused, unchanged
    counter = np.zeros(1, np.int64)
    locks[0] = 0
    _two_threads(_lock_and_count, (locks, counter, N, 1), (locks, counter, N, 2))
    assert counter[0] == 2 * N and locks[0] == 0


@njit
def _take(locks, me):  # pragma: no cover - compiled
    return compare_swap(locks, 0, 0, me)
