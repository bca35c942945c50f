"""Cost-only simulation (SimConfig.cost_only): the real run's times and bytes, no math; refused where it makes no sense."""
from __future__ import annotations

import numpy as np
import pytest

import simlib
from simlib.protocol import MAX_REAL_WORKERS, MAX_WORKERS
from simlib.sim import SimConfig, Stragglers
from simlib.sim.engine import run_config

JITTER = Stragglers(jitter="lognormal")


@pytest.mark.parametrize("fields", [
    dict(n_workers=6, steps=15),
    dict(n_workers=6, steps=15, protocol="ssp:2", stragglers=JITTER),
    dict(n_workers=6, steps=15, protocol="async", n_servers=3, stragglers=JITTER),
    dict(n_workers=6, steps=15, backup_workers=1, stragglers=JITTER),
    dict(n_workers=6, steps=10, sites=3, hierarchy="per-site", stragglers=JITTER),
    dict(n_workers=6, steps=10, topology="allreduce", stragglers=JITTER),
    dict(n_workers=6, steps=10, stragglers=Stragglers(fail_worker=2, fail_time=0.002, restart_after=0.003)),
])
def test_cost_only_has_the_real_runs_times_and_bytes(fields, small_problem):
    real = run_config(SimConfig(**fields), small_problem).trace
    cost = run_config(SimConfig(cost_only=True, **fields), small_problem).trace
    assert cost.spans == real.spans and cost.updates == real.updates  # time never depends on the values
    assert cost.quality == [] and "no gradient" in cost.meta["math"] and "math" not in real.meta
    assert cost.label.endswith("cost-only")


def test_a_fixed_step_needs_no_data_and_charges_its_keys(small_problem):
    cfg = SimConfig(n_workers=4, steps=3, cost_only=True, step_keys=50, compute_per_unit=1e-6, compute_overhead=0.0,
                    latency=0.0, bandwidth=1e6)
    t = run_config(cfg, small_problem).trace
    compute = [s for s in t.spans if s.kind == "compute"]
    assert compute and all(s.end - s.start == pytest.approx(50e-6) for s in compute)
    assert {s.nbytes for s in t.spans if s.kind == "send"} == {50 * 8}
    assert {s.nbytes for s in t.spans if s.kind == "recv"} == {50 * 8}
    with pytest.raises(ValueError, match="step_keys"):
        run_config(cfg.replace(step_keys=small_problem.n_params + 1), small_problem).trace


def test_more_workers_than_rows_run_cost_only_with_a_fixed_step(small_problem):
    n = small_problem.data.n_rows * 3
    t = run_config(SimConfig(n_workers=n, steps=2, protocol="async", cost_only=True, step_keys=20), small_problem).trace
    assert len(t.updates) == 2 * n and not t.quality


@pytest.mark.parametrize("extra, field", [
    (dict(compression="topk:0.1"), "compression"),
    (dict(protocol="ssp:2", hierarchy="per-site", sites=2, significance=0.1), "significance"),
    (dict(protocol="essp:2"), "cache"),
    (dict(protocol="ssp:2", cache=True), "cache"),
    (dict(staleness_aware=True), "staleness_aware"),
    (dict(accumulation=16), "accumulation"),
    (dict(clock_batches=2), "clock_batches"),
])
def test_cost_only_refuses_what_needs_the_math_by_name(extra, field):
    with pytest.raises(ValueError, match=f"^{field}: not available with cost_only"):
        SimConfig(n_workers=4, cost_only=True, **extra)


def test_step_keys_needs_cost_only():
    with pytest.raises(ValueError, match="step_keys .* needs cost_only"):
        SimConfig(step_keys=10)


def test_the_cli_takes_cost_only_and_refuses_a_target_with_it():
    from simlib.cli import main

    assert main(["compare", "--cost-only", "--target", "0.5", "--no-plot"]) == 2
    assert main(["compare", "--workers", "8", "--steps", "2", "--cost-only", "--no-plot"]) == 0


def test_the_simulator_takes_a_million_workers_and_real_substrates_keep_their_limit(small_problem):
    assert MAX_WORKERS == 1_000_000 and MAX_REAL_WORKERS < MAX_WORKERS
    SimConfig(n_workers=MAX_WORKERS)
    with pytest.raises(ValueError, match="n_workers"):
        SimConfig(n_workers=MAX_WORKERS + 1)
    with pytest.raises(ValueError, match=f"n_workers must be <= {MAX_REAL_WORKERS} on substrate 'shm'"):
        simlib.run(small_problem, "bsp", substrate="shm", n_workers=MAX_REAL_WORKERS + 1, steps=1)
    res = simlib.run(small_problem, "async", substrate="sim", n_workers=10, steps=2, cost_only=True, step_keys=5)
    assert len(res.trace.updates) == 20 and np.all(res.params == 0)  # nothing was applied


def test_a_trace_too_large_for_memory_is_refused_naming_steps_before_any_work(small_problem, monkeypatch):
    import simlib._validate

    monkeypatch.setattr(simlib._validate, "available_memory", lambda: 2e9)  # a 2 GB machine: 1 GB for the trace
    with pytest.raises(ValueError, match=r"steps: steps = 1000 needs about 300 GB .* use at most 3\b"):
        simlib.run(small_problem, "bsp", substrate="sim", n_workers=1_000_000, steps=1000, cost_only=True,
                   step_keys=5)
