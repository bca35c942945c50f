"""Straggler mitigation in the simulator: backup workers (wait for N - b of N) and deadlines.

Measured on the default simulated cluster (8 workers, the default logistic problem).
"""
from __future__ import annotations

import numpy as np
import pytest

import simlib
from simlib.sim import Stragglers, default_problem
from simlib.trace import Trace

# simlib.run's options for the simulator: one worker 4x slow, or every worker jittery
SLOW = dict(n_workers=8, steps=60, stragglers=Stragglers(slow_workers=1, slow_factor=4.0))
JITTER = dict(n_workers=8, steps=40, compute_per_unit=1e-6, stragglers=Stragglers(jitter="lognormal", jitter_sigma=0.5))


def bsp(**options) -> Trace:
    """The default problem under BSP on the simulator."""
    return simlib.run(default_problem(), "bsp", substrate="sim", **options).trace


def applied_per_round(trace: Trace, steps: int) -> np.ndarray:
    """Effective batch, in gradients: how many pushes each clock actually applied."""
    per = np.zeros(steps)
    for u in trace.updates:
        per[u.step] += u.applied
    return per


@pytest.fixture(scope="module")
def slow_runs() -> dict[int, Trace]:
    return {b: bsp(**SLOW, backup_workers=b) for b in (0, 1)}


def test_one_backup_worker_reaches_the_target_sooner_with_a_slow_worker(slow_runs) -> None:
    """BSP waits for the 4x-slow worker every step; b = 1 lets the other 7 close the step.

    Measured: plain BSP reaches loss 0.62 at 41 ms, b = 1 at 26 ms (1.6x sooner)."""
    target = 0.62
    plain, backup = slow_runs[0].time_to(target), slow_runs[1].time_to(target)
    assert plain is not None and backup is not None
    assert backup * 1.3 < plain


def test_backup_worker_drops_exactly_the_slow_workers_gradients(slow_runs) -> None:
    plain, backup = slow_runs[0], slow_runs[1]
    np.testing.assert_array_equal(applied_per_round(plain, SLOW["steps"]), np.full(SLOW["steps"], 8))
    np.testing.assert_array_equal(applied_per_round(backup, SLOW["steps"]), np.full(SLOW["steps"], 7))
    dropped = {u.worker for u in backup.updates if not u.applied}
    assert dropped == {0}  # worker 0 is the slow one


def test_effective_batch_falls_as_the_deadline_tightens() -> None:
    """Gradients arriving after the step's deadline are dropped: tighter deadline, fewer applied.

    Measured mean applied per round (of 8): no deadline 8.0, 2 ms 7.85, 1.2 ms 6.05, 1 ms 3.2,
    0.8 ms 0.73 (a step takes 1.5 ms without a deadline)."""
    timeouts = [None, 2e-3, 1.2e-3, 1e-3, 8e-4]
    runs = [bsp(**JITTER, timeout=t) for t in timeouts]
    effective = [applied_per_round(r, JITTER["steps"]).mean() for r in runs]
    assert effective[0] == 8.0
    assert all(a > b for a, b in zip(effective, effective[1:])), effective
    assert effective[-1] < 2.0
    # Fewer gradients per step means less progress per step: the final loss rises with the cut.
    finals = [r.summary()["final_loss"] for r in runs]
    assert finals[-1] > finals[0] + 0.03
    # And rounds get shorter: the deadline bounds the wait for the slowest worker.
    assert runs[-1].makespan < 0.8 * runs[0].makespan
