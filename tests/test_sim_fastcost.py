"""The compiled cost-only server (simlib.sim.fastcost) gives the engine's trace bit for bit, where it applies."""
from __future__ import annotations

import pytest

from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.sim import SimConfig, Stragglers
from simlib.sim import fastcost
from simlib.sim.engine import run_config

JITTER = Stragglers(jitter="lognormal", jitter_sigma=0.5)
CASES = {
    "bsp": dict(n_workers=40, steps=12),
    "bsp_jitter": dict(n_workers=40, steps=12, stragglers=JITTER),
    "ssp3_slow": dict(n_workers=30, steps=15, protocol="ssp:3", stragglers=Stragglers(jitter="lognormal",
                                                                                       slow_workers=4)),
    "async_exponential": dict(n_workers=30, steps=15, protocol="async", stragglers=Stragglers(jitter="exponential")),
    "ssp1_pauses": dict(n_workers=20, steps=15, protocol="ssp:1", stragglers=Stragglers(
        jitter="lognormal", pause_prob=0.2, pause_time=0.002)),
    "backup_bsp": dict(n_workers=20, steps=15, backup_workers=3, stragglers=JITTER),
    "backup_ssp": dict(n_workers=20, steps=15, protocol="ssp:2", backup_workers=2, stragglers=JITTER),
    "ties_fast_net": dict(n_workers=16, steps=10, latency=0.0, bandwidth=1e18, compute_per_unit=0.0,
                          compute_overhead=0.01),
    "server_time_slow_link": dict(n_workers=25, steps=8, protocol="ssp:2", server_time=1e-5, bandwidth=1e7,
                                  stragglers=JITTER),
    "ssp0": dict(n_workers=10, steps=10, protocol="ssp:0", stragglers=JITTER),
}


@pytest.fixture(scope="module")
def problem():
    return LogisticProblem(make_sparse_classification(n_rows=200, n_features=500, nnz_per_row=10, seed=0),
                           eval_rows=None)


def _engine(cfg, problem, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(fastcost, "eligible", lambda run: False)
        return run_config(cfg, problem)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_path_gives_the_engines_trace(name, problem, monkeypatch):
    cfg = SimConfig(cost_only=True, step_keys=37, **CASES[name])
    slow = _engine(cfg, problem, monkeypatch)
    fast = run_config(cfg, problem)
    assert fastcost.eligible(fast) and fast.procs == []  # the fast path ran
    assert fast.trace.spans == slow.trace.spans
    assert fast.trace.updates == slow.trace.updates
    assert fast.trace.meta == slow.trace.meta
    assert (fast.applied, fast.done_steps, fast.finished) == (slow.applied, slow.done_steps, slow.finished)


def test_configurations_outside_it_run_on_the_engine(problem):
    for extra in (dict(n_servers=2), dict(sites=2), dict(timeout=0.01), dict(topology="allreduce"),
                  dict(stragglers=Stragglers(fail_worker=1, fail_time=0.001))):
        run = run_config(SimConfig(n_workers=4, steps=3, cost_only=True, step_keys=10, **extra), problem)
        assert not fastcost.eligible(run) and len(run.procs) == 4
    assert not fastcost.eligible(run_config(SimConfig(n_workers=4, steps=3, cost_only=True), problem))
