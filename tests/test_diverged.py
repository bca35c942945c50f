"""Divergence is reported the same way on every substrate: a Diverged error naming the step and the value.

A step size far too large drives logistic regression's loss to infinity; every substrate of
``simlib.run`` must stop with :class:`simlib.diverged.Diverged` (a ValueError) saying at which step
(updates applied) the metric first stopped being finite and what it was, and leave no process behind.
"""
from __future__ import annotations

import multiprocessing
import os
import re

import numpy as np
import pytest

import simlib
from fault_driver import children
from simlib.contract import ServerRecord, Training
from simlib.diverged import Diverged, check_finite
from simlib.parallel.shm import PREFIX
from simlib.problems.logistic import LogisticProblem, make_sparse_classification

N_WORKERS, STEPS, LR = 2, 150, 1e6
MESSAGE = re.compile(r"^training diverged: the loss at step (\d+) was (nan|inf|-inf) \(lr=1e\+06 is too large\?\)$")
SUBSTRATES = {
    "sim": {},
    "gpu": {"xp": "numpy"},
    "pipes": {},
    "shm": {"monitor_every": 0.01},
    "ray": {"num_cpus": 2},  # Ray starts as many actor processes at once as it has CPUs
}


@pytest.fixture(scope="module")
def problem():
    return LogisticProblem(make_sparse_classification(400, 50, 5, seed=0), eval_rows=None)


def _diverge(problem, substrate: str) -> Diverged:
    with pytest.raises(Diverged) as info:
        simlib.run(problem, "bsp", substrate=substrate, n_workers=N_WORKERS, steps=STEPS, lr=LR, eval_every=1,
                   **SUBSTRATES[substrate])
    return info.value


@pytest.fixture(scope="module")
def simulated(problem):
    return _diverge(problem, "sim")


def _my_segments() -> list[str]:
    mine = f"{PREFIX}{os.getpid()}_"
    return [n for n in os.listdir("/dev/shm") if n.startswith(mine)]


# On Ray the run starts a local Ray of its own (seconds of the suite): heavy; tests/test_ray.py makes the same checks on
# its module's cluster, and this one adds that the Ray the run started is gone after the error.
@pytest.mark.parametrize("substrate", [s if s != "ray" else pytest.param(s, marks=pytest.mark.heavy) for s in SUBSTRATES])
def test_every_substrate_reports_divergence_with_its_step_and_value(problem, simulated, substrate):
    if substrate == "ray":
        pytest.importorskip("ray")
    before = set(children())
    err = _diverge(problem, substrate)
    assert isinstance(err, ValueError)
    match = MESSAGE.match(str(err))
    assert match, str(err)
    assert int(match.group(1)) == err.step and not np.isfinite(err.value) and err.what == "loss"
    assert 0 < err.step <= N_WORKERS * STEPS
    if substrate == "gpu":  # lock-step rounds in worker order: the simulator's numbers
        assert (err.step, err.value) == (simulated.step, simulated.value)
    if substrate in ("pipes", "ray"):  # the server measures the loss after every N_WORKERS pushes
        assert err.step % N_WORKERS == 0
    if substrate in ("sim", "gpu"):  # deterministic rounds: one round fewer ends with a finite loss
        shorter = simlib.run(problem, "bsp", substrate=substrate, n_workers=N_WORKERS, steps=err.step // N_WORKERS - 1,
                             lr=LR, eval_every=1, **SUBSTRATES[substrate])
        assert np.isfinite([q.value for q in shorter.trace.quality]).all()
    assert multiprocessing.active_children() == [] and _my_segments() == []
    assert set(children()) <= before  # no worker, server or Ray process outlives the run


@pytest.mark.parametrize("evaluate", [True, False])
def test_the_server_record_of_pipes_and_ray_measures_every_eval_every_rounds_and_stops_at_the_first_bad_one(
        problem, evaluate):
    """One ServerRecord serves the pipes server and Ray's coordinator: the metric is due after every eval_every x n
    updates (not after the last, which the end records), and the first one not finite raises Diverged there."""
    record = ServerRecord(problem, Training(n_workers=2, steps=5, eval_every=2, lr=LR), evaluate, "server", "pipes")
    record.metric(0.0, problem.init_params())
    due = [k for k in range(1, 11) if record.update(float(k), k % 2, (k - 1) // 2, 0, True, 0)]
    assert due == ([4, 8] if evaluate else [])
    assert [q.step for q in record.served.quality] == [0] and len(record.served.updates) == 10
    with pytest.raises(Diverged) as info:
        record.metric(10.0, np.full(problem.n_params, np.nan))
    assert (info.value.step, info.value.what) == (10, "loss") and "lr=1e+06" in str(info.value)
    with pytest.raises(Diverged) as again:  # a later push (another worker's, on Ray) ends at the same step
        record.update(11.0, 0, 5, 0, True, 0)
    assert again.value.step == 10 and len(record.served.updates) == 10


def test_check_finite_names_the_metric_and_step():
    check_finite(1.0, 3, "accuracy")
    with pytest.raises(Diverged, match="the accuracy at step 3 was nan"):
        check_finite(float("nan"), 3, "accuracy")


class _NanStart(LogisticProblem):
    """Logistic regression whose starting weights are not finite: bad input, not divergence."""

    def init_params(self):
        return np.full(self.n_params, np.nan)


@pytest.mark.parametrize("substrate", ["sim", "gpu"])
def test_a_starting_metric_that_is_not_finite_names_the_start_not_the_step_size(substrate):
    bad = _NanStart(make_sparse_classification(200, 20, 3, seed=0), eval_rows=None)
    with pytest.raises(ValueError, match=r"^the loss of the starting parameters is nan: the data or the initial "
                                         r"parameters hold values that are not finite$") as info:
        simlib.run(bad, "bsp", substrate=substrate, n_workers=2, steps=3, lr=0.1, **SUBSTRATES[substrate])
    assert not isinstance(info.value, Diverged)  # nothing was trained: no step size to blame
