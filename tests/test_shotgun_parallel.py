"""Shotgun on real processes and shared memory: same answer as the serial reference, clean exit."""
from __future__ import annotations

import os

import numpy as np
import pytest

from simlib.parallel.shotgun import run_shotgun
from simlib.problems.lasso import (
    CorrelationScheduler,
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
def test_processes_match_the_serial_reference(small, p: int, n_workers: int) -> None:
    before = _our_segments()
    sched = random_schedule(100, p, 200, seed=p)
    run, trace = run_shotgun(small, sched, n_workers=n_workers, record_every=10)
    ref = shotgun(small, sched, record_every=10)
    np.testing.assert_array_equal(run.rounds, ref.rounds)
    np.testing.assert_allclose(run.objective, ref.objective, rtol=1e-12)
    np.testing.assert_allclose(run.x, ref.x, rtol=1e-10, atol=1e-12)
    assert not run.diverged
    # Every worker recorded compute and wait spans; worker 0 recorded the objective.
    assert {s.worker for s in trace.spans if s.kind == "compute"} == set(range(n_workers))
    assert [q.value for q in trace.quality] == pytest.approx(list(ref.objective[1:]), rel=1e-12)
    assert _our_segments() == before  # nothing left in /dev/shm


def test_padded_schedules_and_divergence_stop_every_worker_together() -> None:
    prob = make_correlated_lasso()
    plain = random_schedule(512, 8, 300, seed=0)
    run, _ = run_shotgun(prob, plain, n_workers=2, record_every=10)
    ref = shotgun(prob, plain, record_every=10)
    assert run.diverged and ref.diverged
    np.testing.assert_allclose(run.objective, ref.objective, rtol=1e-9)
    safe = CorrelationScheduler(prob).schedule(8, 300, seed=0)
    run, _ = run_shotgun(prob, safe, n_workers=2, record_every=50)
    assert not run.diverged and run.objective[-1] < 0.5 * run.objective[0]


def test_bad_inputs_fail_before_any_process_starts(small) -> None:
    sched = random_schedule(100, 4, 10, seed=0)
    with pytest.raises(ValueError, match="n_workers"):
        run_shotgun(small, sched, n_workers=0)
    with pytest.raises(ValueError, match="schedule"):
        run_shotgun(small, sched + 100)
    with pytest.raises(ValueError, match="schedule"):
        run_shotgun(small, np.zeros(5, dtype=int))
    with pytest.raises(ValueError, match="record_every"):
        run_shotgun(small, sched, record_every=0)
