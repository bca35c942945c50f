"""Shotgun's simulated twin: the same math as the serial reference, round times in closed form."""
from __future__ import annotations

import numpy as np
import pytest

from simlib.problems.lasso import make_lasso, make_uncorrelated_lasso, random_schedule, reference_optimum, shotgun
from simlib.sim import SimConfig, Stragglers
from simlib.course.shotgun_twin import allgather_time, simulate_shotgun


@pytest.fixture(scope="module")
def small():
    return make_lasso(n_rows=200, n_features=100, n_nonzero=10, seed=0)


def test_objective_equals_the_serial_reference(small) -> None:
    sched = random_schedule(100, 6, 300, seed=1)
    run, trace = simulate_shotgun(small, sched, SimConfig(n_workers=4), record_every=10)
    ref = shotgun(small, sched, record_every=10)
    np.testing.assert_array_equal(run.rounds, ref.rounds)
    np.testing.assert_array_equal(run.objective, ref.objective)
    assert [q.value for q in trace.quality] == list(ref.objective)


def test_round_time_is_slowest_compute_plus_allgather_plus_apply(small) -> None:
    cfg = SimConfig(n_workers=4, latency=1e-4, bandwidth=1e6, compute_per_unit=1e-6, compute_overhead=1e-4)
    run, trace = simulate_shotgun(small, random_schedule(100, 6, 10, seed=2), cfg, record_every=10)
    compute = 1e-4 + 2 * 200 * 1e-6  # workers 0 and 1 own two of the 6 slots
    exchange = 3 * (1e-4 + 2 * 8 / 1e6)  # (N - 1) phases of the largest block of (key, value) pairs
    apply = 1e-6 * 6 * 200 / 4
    assert allgather_time(4, 16, 1e-4, 1e6) == pytest.approx(exchange)
    assert trace.quality[-1].time == pytest.approx(10 * (compute + exchange + apply), rel=1e-12)
    # Workers 2 and 3 own one slot each and wait at the barrier for the others.
    waits = [s.end - s.start for s in trace.spans if s.kind == "wait" and s.worker == 3 and s.step == 0]
    assert waits == [pytest.approx(200 * 1e-6)]


def test_p8_reaches_the_target_sooner_in_simulated_time() -> None:
    prob = make_uncorrelated_lasso()
    fstar = reference_optimum(prob)
    target = fstar + 1e-3 * (prob.objective(np.zeros(512)) - fstar)
    cfg = SimConfig(n_workers=8)
    _, one = simulate_shotgun(prob, random_schedule(512, 1, 6_000, seed=0), cfg)
    _, eight = simulate_shotgun(prob, random_schedule(512, 8, 1_000, seed=0), cfg)
    assert one.time_to(target) > 4 * eight.time_to(target)  # measured 5.3x


def test_stragglers_slow_every_round_and_runs_are_deterministic(small) -> None:
    sched = random_schedule(100, 8, 50, seed=3)
    cfg = SimConfig(n_workers=4, stragglers=Stragglers(jitter="lognormal"))
    a, ta = simulate_shotgun(small, sched, cfg)
    b, tb = simulate_shotgun(small, sched, cfg)
    assert ta == tb
    _, slow = simulate_shotgun(small, sched, cfg.replace(stragglers=Stragglers(slow_workers=1, slow_factor=4.0)))
    _, fast = simulate_shotgun(small, sched, cfg.replace(stragglers=Stragglers()))
    assert slow.makespan > 1.5 * fast.makespan


def test_bad_inputs_name_the_field(small) -> None:
    with pytest.raises(ValueError, match="schedule"):
        simulate_shotgun(small, np.full((3, 2), 100))
    with pytest.raises(ValueError, match="cfg"):
        simulate_shotgun(small, random_schedule(100, 2, 3), cfg={"n_workers": 2})
    with pytest.raises(ValueError, match="record_every"):
        simulate_shotgun(small, random_schedule(100, 2, 3), record_every=0)
