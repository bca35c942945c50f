"""Fault injection on every real substrate and algorithm: each fault ends the run promptly, clearly, cleanly.

For each algorithm one driver process (``fault_driver.py``) runs it over and over; each run gets one
fault at a random moment: kill -9 of one worker, SIGTERM of one worker, an exception raised inside
one worker (SIGUSR1, whose handler raises), SIGINT of the parent, SIGTERM of the parent, SIGINT of
the whole process group (a terminal's Ctrl-C). Every run must end within 5 s of its fault with the
expected error (KeyboardInterrupt for SIGINT), and leave no process, no /dev/shm segment and no new
thread behind. The default run repeats each fault 3 times; the ``slow`` test repeats it 10 times.
"""
from __future__ import annotations

import importlib.util
import random

import pytest

import faultkit

ALGORITHMS = [
    "hogwild",  # simlib.parallel.hogwild.train, shared memory
    "lda-shm",  # simlib.parallel.lda over shared memory
    "lda-pipe",  # simlib.parallel.lda over pipes (a server thread in the parent)
    "glove-hogwild",  # simlib.parallel.glove, shared memory
    "run-pipes",  # simlib.run(..., substrate="pipes"): the pipe parameter server
    "run-shm",  # simlib.run(..., substrate="shm"), where that substrate exists
]


def _available(algorithm: str) -> bool:
    return algorithm != "run-shm" or importlib.util.find_spec("simlib.parallel.shm_ps") is not None


def _inject_all(algorithm: str, reps: int, seed: int) -> list[faultkit.Outcome]:
    if not _available(algorithm):
        pytest.skip("the 'shm' substrate (simlib.parallel.shm_ps) is not in this tree yet")
    rng = random.Random(seed)
    driver = faultkit.Driver(algorithm)
    try:
        return [driver.inject(fault, rng) for fault in faultkit.FAULTS for _ in range(reps)]
    finally:
        driver.close()


def _assert_all_clean(outcomes: list[faultkit.Outcome], algorithm: str) -> None:
    problems = [p for o in outcomes for p in faultkit.check(o, algorithm)]
    assert problems == [], "\n".join(problems)
    assert {o.fault for o in outcomes} == set(faultkit.FAULTS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_fault_ends_the_run_promptly_and_cleanly(algorithm):
    _assert_all_clean(_inject_all(algorithm, reps=3, seed=19), algorithm)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_fault_ten_times(algorithm):
    _assert_all_clean(_inject_all(algorithm, reps=10, seed=1919), algorithm)
