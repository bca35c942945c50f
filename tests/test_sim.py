"""The simulator: closed-form cases, protocol equivalences, staleness bounds, failures, determinism."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simlib.sim import SimConfig, Stragglers, ring_allreduce_time
from simlib.sim.engine import run_config

FAST_NET = dict(latency=0.0, bandwidth=1e18)


def _equal_runs(a, b):
    return a.spans == b.spans and a.updates == b.updates and a.quality == b.quality


# -- closed forms -------------------------------------------------------------------------------
def test_constant_compute_no_network_time_is_steps_times_compute(small_problem):
    cfg = SimConfig(n_workers=3, steps=40, compute_per_unit=0.0, compute_overhead=0.01, **FAST_NET)
    t = run_config(cfg, small_problem).trace
    assert t.makespan == pytest.approx(40 * 0.01, rel=1e-9)
    assert t.summary()["wait_fraction"] == pytest.approx(0.0, abs=1e-9)


def test_bsp_step_with_exponential_compute_is_mean_times_harmonic_number(small_problem):
    n, steps, mean = 8, 1500, 0.01
    cfg = SimConfig(
        n_workers=n, steps=steps, compute_per_unit=0.0, compute_overhead=mean,
        stragglers=Stragglers(jitter="exponential"), eval_every=steps, **FAST_NET,
    )
    t = run_config(cfg, small_problem).trace
    harmonic = sum(1.0 / k for k in range(1, n + 1))
    # Standard error of the mean of max-of-8 exponentials over 1,500 steps is ~0.032 * mean: 4 %
    # is about 3.6 standard errors.
    assert t.makespan / steps == pytest.approx(mean * harmonic, rel=0.04)


def test_ring_allreduce_step_matches_formula(small_problem):
    n, lat, bw, comp = 4, 1e-3, 1e6, 0.02
    cfg = SimConfig(n_workers=n, steps=3, topology="allreduce", latency=lat, bandwidth=bw,
                    compute_per_unit=0.0, compute_overhead=comp)
    t = run_config(cfg, small_problem).trace
    size = small_problem.n_params * cfg.value_bytes
    ring = 2 * (n - 1) / n * size / bw + 2 * (n - 1) * lat
    assert ring_allreduce_time(n, size, lat, bw) == pytest.approx(ring)
    assert t.makespan == pytest.approx(3 * (comp + ring), rel=1e-9)
    sent = [s.nbytes for s in t.spans if s.kind == "send"]
    assert sent and all(b == round(2 * (n - 1) / n * size) for b in sent)


def test_single_message_costs_latency_plus_size_over_bandwidth(small_problem):
    lat, bw = 2e-3, 1e5
    cfg = SimConfig(n_workers=1, steps=1, latency=lat, bandwidth=bw, compute_per_unit=0.0, compute_overhead=0.0)
    t = run_config(cfg, small_problem).trace
    (push,) = [s for s in t.spans if s.kind == "send"]
    assert push.end - push.start == pytest.approx(lat + push.nbytes / bw)


def test_k_shards_move_bytes_through_k_links_in_parallel(small_problem):
    base = dict(n_workers=8, steps=5, latency=0.0, bandwidth=1e5, compute_per_unit=0.0, compute_overhead=0.0, batch_size=64)
    one = run_config(SimConfig(n_servers=1, **base), small_problem).trace
    four = run_config(SimConfig(n_servers=4, **base), small_problem).trace
    # Bytes are the same; with the servers' links the bottleneck, 4 shards take about 1/4 the time
    # (keys are not split perfectly evenly, hence the band).
    assert one.summary()["bytes_sent"] == four.summary()["bytes_sent"]
    ratio = one.makespan / four.makespan
    assert 3.0 < ratio <= 4.05


def test_incast_push_time_grows_with_workers(small_problem):
    base = dict(steps=2, latency=0.0, bandwidth=1e5, compute_per_unit=0.0, compute_overhead=0.0)
    t2 = run_config(SimConfig(n_workers=2, **base), small_problem).trace
    t8 = run_config(SimConfig(n_workers=8, **base), small_problem).trace
    assert t8.makespan > 3.0 * t2.makespan  # 8 workers queue on one in-link


def test_a_server_serves_one_request_at_a_time(small_problem):
    s = 1e-3
    base = dict(steps=3, compute_per_unit=0.0, compute_overhead=0.0, server_time=s, **FAST_NET)
    # One worker: its pull and its push each occupy the server for s.
    assert run_config(SimConfig(n_workers=1, **base), small_problem).trace.makespan == pytest.approx(3 * 2 * s)
    # Two BSP workers arrive together: the second pull waits for the first, the pushes queue behind
    # the pulls, so a step takes 4 s, not 2 s.
    two = run_config(SimConfig(n_workers=2, **base), small_problem).trace
    assert two.makespan == pytest.approx(3 * 4 * s)
    assert sorted(s_.end - s_.start for s_ in two.spans if s_.kind == "recv" and s_.step == 0) == pytest.approx([s, 2 * s])
    # A request split over two shards is handled by both at once: s each, in parallel, not 2 s.
    assert run_config(SimConfig(n_workers=2, n_servers=2, **base), small_problem).trace.makespan == pytest.approx(3 * 4 * s)


def test_summation_nodes_add_links(small_problem):
    base = dict(n_workers=8, steps=3, latency=0.0, bandwidth=1e5, compute_per_unit=0.0, compute_overhead=0.0)
    plain = run_config(SimConfig(n_servers=1, **base), small_problem).trace
    byteps = run_config(SimConfig(n_servers=1, n_summation=3, **base), small_problem).trace
    assert byteps.makespan < 0.5 * plain.makespan


# -- protocols ---------------------------------------------------------------------------------------
JITTERY = Stragglers(jitter="lognormal", jitter_sigma=0.6, slow_workers=1, slow_factor=2.5)


def test_ssp_zero_is_exactly_bsp(small_problem):
    bsp = run_config(SimConfig(n_workers=5, steps=30, protocol="bsp", stragglers=JITTERY), small_problem).trace
    ssp0 = run_config(SimConfig(n_workers=5, steps=30, protocol="ssp", staleness=0, stragglers=JITTERY), small_problem).trace
    assert _equal_runs(bsp, ssp0)
    assert bsp.summary()["max_clock_lag"] == 0


def test_ssp_with_huge_bound_is_async(small_problem):
    a = run_config(SimConfig(n_workers=5, steps=30, protocol="async", stragglers=JITTERY), small_problem).trace
    s = run_config(SimConfig(n_workers=5, steps=30, protocol="ssp", staleness=10_000, stragglers=JITTERY), small_problem).trace
    assert _equal_runs(a, s)
    assert a.summary()["max_clock_lag"] > 3  # the slow worker really reads old state


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 6),
    s=st.integers(0, 4),
    sigma=st.floats(0.0, 1.5),
    slow=st.integers(0, 2),
    shards=st.integers(1, 3),
    backup=st.integers(0, 1),
    seed=st.integers(0, 10_000),
)
def test_no_read_is_staler_than_the_bound(small_problem, n, s, sigma, slow, shards, backup, seed):
    backup = min(backup, n - 1)
    cfg = SimConfig(
        n_workers=n, protocol="ssp", staleness=s, steps=12, n_servers=shards, backup_workers=backup,
        stragglers=Stragglers(jitter="lognormal", jitter_sigma=sigma, slow_workers=min(slow, n), slow_factor=3.0),
        seed=seed,
    )
    t = run_config(cfg, small_problem).trace
    # Dropped workers skip ahead to the current step, so with backups some steps are never computed.
    assert (n - backup) * 12 <= len(t.updates) <= n * 12
    assert max(u.clock_lag for u in t.updates) <= s
    # Reads are gated: every worker's step c starts only after step c - s - 1 completed for a quorum.
    assert all(u.staleness >= 0 and u.clock_lag >= 0 for u in t.updates)


def test_stale_reads_give_stale_gradients(small_problem):
    # Same batches and straggler draws; only what the workers read differs, so the losses differ.
    bsp = run_config(SimConfig(n_workers=4, steps=40, stragglers=JITTERY), small_problem).trace
    asy = run_config(SimConfig(n_workers=4, steps=40, protocol="async", stragglers=JITTERY), small_problem).trace
    assert bsp.quality[-1].value != asy.quality[-1].value


def test_staleness_aware_changes_only_stale_updates(small_problem):
    base = SimConfig(n_workers=4, steps=30, protocol="async", stragglers=JITTERY)
    plain, aware = run_config(base, small_problem).trace, run_config(base.replace(staleness_aware=True), small_problem).trace
    assert plain.quality[0] == aware.quality[0]
    assert plain.quality[-1].value != aware.quality[-1].value
    one = SimConfig(n_workers=1, steps=20)  # one worker is never stale: identical runs
    assert _equal_runs(run_config(one, small_problem).trace, run_config(one.replace(staleness_aware=True), small_problem).trace)


# -- mitigation and failures -------------------------------------------------------------------------
def test_backup_workers_drop_the_slowest(small_problem):
    slow = Stragglers(slow_workers=1, slow_factor=5.0)
    plain = run_config(SimConfig(n_workers=4, steps=20, stragglers=slow), small_problem).trace
    backup = run_config(SimConfig(n_workers=4, steps=20, stragglers=slow, backup_workers=1), small_problem).trace
    dropped = [u for u in backup.updates if not u.applied]
    assert dropped and all(u.worker == 0 for u in dropped)
    assert plain.summary()["updates_dropped"] == 0
    assert backup.summary()["time_per_step"] < plain.summary()["time_per_step"]
    # The dropped worker rejoins at the current step instead of redoing stale ones, so the run
    # as a whole ends sooner (it would not, if the slow worker computed all 20 steps).
    assert backup.makespan < 0.6 * plain.makespan
    assert sum(1 for u in backup.updates if u.worker == 0) < 20


@pytest.mark.parametrize("spec", ["topk:0.01", "qsgd", "onebit"])
def test_allreduce_with_compression_sends_fewer_bytes(small_problem, spec):
    base = SimConfig(n_workers=4, steps=5, topology="allreduce")
    plain = run_config(base, small_problem).trace
    packed = run_config(base.replace(compression=spec), small_problem).trace
    assert 0 < packed.summary()["bytes_sent"] < plain.summary()["bytes_sent"]
    assert packed.quality[-1].value < packed.quality[0].value


def test_bad_compression_spec_fails_at_config_time():
    with pytest.raises(ValueError, match="compression"):
        SimConfig(compression="gzip")


def test_timeout_drops_late_gradients(small_problem):
    slow = Stragglers(slow_workers=1, slow_factor=10.0)
    cfg = SimConfig(n_workers=3, steps=10, stragglers=slow, timeout=0.001)  # fast step ~0.45 ms, slow ~1.5 ms
    t = run_config(cfg, small_problem).trace
    late = [u for u in t.updates if not u.applied]
    assert late and {u.worker for u in late} == {0}


def test_failed_worker_stalls_bsp_but_not_backup(small_problem):
    fail = Stragglers(fail_worker=1, fail_time=0.003)
    stalled = run_config(SimConfig(n_workers=3, steps=20, stragglers=fail), small_problem).trace
    assert stalled.meta["stalled"] and "backup_workers" in stalled.meta["stall_reason"]
    assert any(s.kind == "down" and s.worker == 1 for s in stalled.spans)
    assert stalled.meta["failed_workers"] == [1] and 1 not in stalled.meta["stalled"]
    ok = run_config(SimConfig(n_workers=3, steps=20, stragglers=fail, backup_workers=1), small_problem).trace
    assert ok.meta["stalled"] == [] and ok.meta["failed_workers"] == [1]  # the others finish
    assert sum(1 for u in ok.updates if u.worker != 1) == 2 * 20


def test_restarted_worker_finishes(small_problem):
    fail = Stragglers(fail_worker=0, fail_time=0.002, restart_after=0.01)
    t = run_config(SimConfig(n_workers=2, steps=10, stragglers=fail), small_problem).trace
    assert t.meta["stalled"] == []
    (down,) = [s for s in t.spans if s.kind == "down"]
    assert down.end - down.start == pytest.approx(0.01)


# -- determinism ---------------------------------------------------------------------------------------
def test_same_seed_same_trace_bit_for_bit(small_problem):
    cfg = SimConfig(n_workers=4, protocol="ssp", staleness=2, steps=25, n_servers=2,
                    stragglers=Stragglers(jitter="lognormal", pause_prob=0.1, pause_time=0.001), seed=7)
    assert run_config(cfg, small_problem).trace == run_config(cfg, small_problem).trace
    other = run_config(cfg.replace(seed=8), small_problem).trace
    assert other.spans != run_config(cfg, small_problem).trace.spans


def test_progress_is_reported(small_problem):
    seen = []
    run_config(SimConfig(n_workers=2, steps=10), small_problem, progress=seen.append).trace
    assert seen and seen[-1] == pytest.approx(1.0) and seen == sorted(seen)


# -- validation -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n_workers": 0}, "n_workers"),
        ({"latency": -1.0}, "latency"),
        ({"protocol": "ssp", "staleness": -1}, "staleness"),
        ({"protocol": "gossip"}, "protocol"),
        ({"bandwidth": 0}, "bandwidth"),
        ({"topology": "allreduce", "protocol": "ssp", "staleness": 1}, "allreduce"),
        ({"backup_workers": 8}, "backup_workers"),
        ({"lr": math.nan}, "lr"),
        ({"stragglers": Stragglers(slow_workers=9)}, "slow_workers"),
        ({"timeout": 0.0}, "timeout"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SimConfig(**kwargs)


def test_bad_straggler_fields_name_the_field():
    with pytest.raises(ValueError, match="jitter"):
        Stragglers(jitter="gaussian")
    with pytest.raises(ValueError, match="slow_factor"):
        Stragglers(slow_factor=0.5)
    with pytest.raises(ValueError, match="fail_time"):
        Stragglers(fail_worker=0)


def test_bsp_timeline_has_barriers(small_problem):
    t = run_config(SimConfig(n_workers=3, steps=5, stragglers=JITTERY), small_problem).trace
    assert len(t.meta["barriers"]) == 5
    assert np.all(np.diff(t.meta["barriers"]) > 0)
