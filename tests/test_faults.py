"""Fault injection on every real substrate and algorithm: each fault ends the run promptly, clearly, cleanly.

For each algorithm one driver process (``fault_driver.py``) runs it over and over; each run gets one
fault at a random moment: kill -9 of one worker, SIGTERM of one worker, an exception raised inside
one worker (SIGUSR1, whose handler raises), SIGINT of the parent, SIGTERM of the parent, SIGINT of
the whole process group (a terminal's Ctrl-C). Every run must end within 5 s of its fault with the
expected error (KeyboardInterrupt for SIGINT), and leave no process, no /dev/shm segment and no new
thread behind. Each fault is repeated twice in the default run (Ray's only in the heavy test), and 10 times on
every algorithm in the ``heavy`` test, run with ``pytest --heavy`` (about 25 minutes: Ray's alone takes 12).

On Ray a worker is a worker actor's process. Starting a local Ray takes seconds, so worker faults
run on one Ray the driver keeps (``attached``: the run must kill its actors); parent faults take
turns between that Ray (the fault once the workers run), a Ray the run starts itself (``owned``,
the fault once the workers run: the run must stop every Ray process) and the same at a random
moment of the first seconds, which mostly falls in Ray's start-up.
"""
from __future__ import annotations

import importlib.util
import random

import pytest

import faultkit

ALGORITHMS = [
    "hogwild",  # simlib.run(LogisticProblem, "async", substrate="shm"): in place on shared memory
    "lda-shm",  # simlib.run(LDAProblem, "ssp:1", substrate="shm")
    "lda-pipe",  # LDAProblem on simlib.run(..., substrate="pipes"): the word-topic table on the pipe server
    "glove-hogwild",  # simlib.run(GloveProblem, "async", substrate="shm"): AdaGrad in place on shared memory
    "glove-model",  # simlib.run(GloveSlices, "bsp", substrate="shm"): the dimensions split, phases at the barrier
    "run-pipes",  # simlib.run(..., substrate="pipes"): the pipe parameter server
    "run-shm",  # simlib.run(..., substrate="shm"), where that substrate exists
    "glove-count",  # simlib.parallel.glove_count.count_parallel: co-occurrence counting, map-reduce
    "run-ray",  # simlib.run(..., substrate="ray"): actors on a local Ray
    "lda-shm-mh",  # LDAProblem(kernel="mh") on shm: LightLDA's sampler under the block locks
    "lda-shm-alias",  # LDAProblem(kernel="alias") on shm: AliasLDA's sampler under the block locks
    "run-pipes-managed",  # the pipe server with clocks of 4 mini-batches and Bosen's managed communication
    "allreduce-shm",  # simlib.run(MLPProblem, "allreduce", substrate="shm", overlap=True): the spinning barrier
    "allreduce-pipes",  # the same over a ring of pipes, each bucket summed on the helper thread
    "pipeline",  # simlib.modelpar.run_pipeline: an MLP's layers as two stage processes, 1F1B over channels
]
# Repetitions per fault in the default run: 1, each fault at one random moment of a run, while the suite stays
# within its time (at 10 the matrix was a fifth of the suite; at 3 it took 90 s of a 917 s run; at 2 the suite
# took 955 s on a quiet machine, a fresh clone); 10 on every
# algorithm in the heavy test. Ray
# only there: each of its runs starts actors (seconds each), and a third of them a whole Ray (63 s of a quiet CI
# run for one repetition); the default run keeps tests/test_ray.py's faults (kill -9 of a worker, of the server and
# of the driver, Ctrl-C while it starts and while it runs, SIGTERM at start and while running).
DEFAULT_REPS = 1
# Ray's parent faults take turns over (mode, wait for the workers, window in s); see the docstring.
# SIGTERM ends the driver (Ray cannot start again in its process), so it comes last on the driver's Ray.
RAY_TURNS = {
    "int-parent": [("owned", False, 3.0), ("attached", True, 1.0), ("owned", True, 1.0)],
    "int-group": [("owned", True, 1.0), ("owned", False, 3.0), ("attached", True, 1.0)],
    "term-parent": [("attached", True, 1.0), ("owned", False, 3.0), ("owned", True, 1.0)],
}
# Over ten repetitions each parent fault takes its turns in order, so each hits a Ray the run starts (early and
# late) and the driver's own Ray.


def _available(algorithm: str) -> bool:
    return algorithm != "run-ray" or importlib.util.find_spec("ray") is not None


def _plan(algorithm: str, reps: int) -> list[tuple[str, dict]]:
    """(fault, how) for every repetition; on Ray the runs on the driver's own Ray come first."""
    if algorithm != "run-ray":
        return [(fault, {}) for fault in faultkit.FAULTS for _ in range(reps)]
    plan = []
    for fault in faultkit.FAULTS:
        for r in range(reps):
            if fault.endswith("-worker"):
                plan.append((fault, {"mode": "attached", "window": 1.0}))
            else:
                mode, late, window = RAY_TURNS[fault][r % len(RAY_TURNS[fault])]
                plan.append((fault, {"mode": mode, "late": late, "window": window}))
    # one start of the driver's Ray, one switch to runs that start their own; SIGTERM last in each block
    return sorted(plan, key=lambda item: (item[1]["mode"] == "owned", item[0] == "term-parent"))


def _inject_all(algorithm: str, reps: int, seed: int, plan: list[tuple[str, dict]] | None = None,
                timeout: float | None = None) -> list[faultkit.Outcome]:
    if not _available(algorithm):
        pytest.skip("ray is not installed")
    rng = random.Random(seed)
    driver = faultkit.Driver(algorithm, timeout)
    try:
        outcomes = [driver.inject(fault, rng, **how) for fault, how in plan or _plan(algorithm, reps)]
    finally:
        left = driver.close()
    assert left == [], f"{algorithm}: the driver left processes behind when it closed: {left}"
    return outcomes


def _assert_all_clean(outcomes: list[faultkit.Outcome], algorithm: str) -> None:
    problems = [p for o in outcomes for p in faultkit.check(o, algorithm)]
    assert problems == [], "\n".join(problems)
    assert {o.fault for o in outcomes} == set(faultkit.FAULTS)


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "run-ray"])
def test_every_fault_ends_the_run_promptly_and_cleanly(algorithm):
    """Each fault DEFAULT_REPS times on every algorithm but Ray's; ten times each, Ray's too, is the heavy test below."""
    _assert_all_clean(_inject_all(algorithm, reps=DEFAULT_REPS, seed=19), algorithm)


@pytest.mark.heavy
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_fault_ten_times_ends_the_run_promptly_and_cleanly(algorithm):
    _assert_all_clean(_inject_all(algorithm, reps=10, seed=1919), algorithm)


@pytest.mark.parametrize("algorithm", ["allreduce-shm", "lda-shm-mh", "run-pipes-managed"])
def test_a_stopped_worker_ends_the_run_at_its_timeout(algorithm):
    """SIGSTOP for good of one worker, which only the run's timeout= (2 s) can end: with TimeoutError, nothing left.
    All-reduce: its peer's helper thread spins at the shared-memory barrier for a partner that never comes; LDA's MH
    sampler: the stopped worker may hold a block lock its peer waits for; managed communication:
    the pipe server waits for a clock that never ends while early updates keep arriving."""
    outcomes = _inject_all(algorithm, 0, seed=23, plan=[("stop-worker", {})], timeout=2.0)
    assert [p for o in outcomes for p in faultkit.check(o, algorithm)] == []
    assert [o.error for o in outcomes] == ["TimeoutError"]
