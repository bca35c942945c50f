"""Shotgun through simlib.run: exact rounds on the gpu substrate, real processes on shared memory, clean exit."""
from __future__ import annotations

import os

import numpy as np
import pytest

import simlib
from simlib.problems.lasso import (
    CorrelationScheduler,
    ShotgunProblem,
    make_correlated_lasso,
    make_lasso,
    random_schedule,
    shotgun,
)


def _our_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"simlib_{os.getpid()}_")} if os.path.isdir("/dev/shm") else set()


@pytest.fixture(scope="module")
def small():
    return make_lasso(n_rows=200, n_features=100, n_nonzero=10, seed=0)


@pytest.mark.parametrize("p,n_workers", [(4, 2), (3, 2), (8, 3)])
def test_rounds_from_one_read_are_the_serial_reference(small, p: int, n_workers: int) -> None:
    """On the gpu substrate every worker of a round reads the same x: exactly Shotgun's P updates against one x."""
    sched = random_schedule(100, p, 200, seed=p)
    res = simlib.run(ShotgunProblem(small, sched), "bsp", substrate="gpu", xp="numpy", n_workers=n_workers,
                     steps=200, eval_every=10)
    ref = shotgun(small, sched, record_every=10)
    np.testing.assert_allclose(res.params, ref.x, rtol=1e-10, atol=1e-12)
    assert [q.value for q in res.trace.quality] == pytest.approx(list(ref.objective), rel=1e-10)


def test_real_processes_reach_the_serial_objective_and_leave_nothing(small) -> None:
    before = _our_segments()
    sched = random_schedule(100, 4, 300, seed=1)
    prob = ShotgunProblem(small, sched)
    res = simlib.run(prob, "bsp", substrate="shm", n_workers=2, steps=300, eval_every=300)
    ref = shotgun(small, sched)
    assert prob.quality(res.params) == pytest.approx(ref.objective[-1], rel=1e-3)
    assert {s.worker for s in res.trace.spans if s.kind == "compute"} == {0, 1}
    assert _our_segments() == before  # nothing left in /dev/shm


def test_correlated_columns_diverge_unless_the_scheduler_keeps_them_apart() -> None:
    prob = make_correlated_lasso()
    plain = simlib.run(ShotgunProblem(prob, random_schedule(512, 8, 300, seed=0)), "bsp", substrate="gpu",
                       xp="numpy", n_workers=2, steps=300, eval_every=50)
    safe = simlib.run(ShotgunProblem(prob, CorrelationScheduler(prob).schedule(8, 300, seed=0)), "bsp",
                      substrate="gpu", xp="numpy", n_workers=2, steps=300, eval_every=50)
    start = plain.trace.quality[0].value
    assert plain.trace.quality[-1].value > 1e6 * start
    assert safe.trace.quality[-1].value < 0.5 * start


def test_bad_inputs_fail_before_any_process_starts(small) -> None:
    sched = random_schedule(100, 4, 10, seed=0)
    with pytest.raises(ValueError, match="n_workers"):
        simlib.run(ShotgunProblem(small, sched), "bsp", substrate="shm", n_workers=5, steps=2)
    with pytest.raises(ValueError, match="schedule"):
        ShotgunProblem(small, sched + 100)
    with pytest.raises(ValueError, match="schedule"):
        ShotgunProblem(small, np.zeros(5, dtype=int))
