"""Sites joined by a WAN (simlib.sim.sites): a flat PS across sites, per-site servers, Gaia's significance filter."""
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simlib.cli import main
from simlib.sim import SimConfig, Stragglers
from simlib.sim.config import NETWORKS
from simlib.sim.engine import run_config
from simlib.sim.sites import Outbox, against, relative_changes, sent_by_frequency, site_of

FAST_LAN = dict(latency=0.0, bandwidth=1e18)
# Fixed compute, an instant LAN, a WAN with latency only: every time below is a closed form.
CLOSED = dict(compute_per_unit=0.0, compute_overhead=0.01, wan_latency=0.05, wan_bandwidth=1e18, **FAST_LAN)


# -- one site, the options off: today's trace ------------------------------------------------------
def test_one_flat_site_is_the_trace_from_before_sites(small_problem):
    # Figures of the simulator before sites existed (the same config, the same problem, seed 0).
    t = run_config(SimConfig(n_workers=3, protocol="ssp:1", steps=10, n_servers=2), small_problem).trace
    assert (t.makespan, t.quality[-1].value) == (0.0041430943999999975, 0.6423498125255882)
    assert (sum(u.staleness for u in t.updates), len(t.spans)) == (30, 90)
    t = run_config(SimConfig(n_workers=4, protocol="essp:1", steps=8), small_problem).trace
    assert (t.makespan, t.quality[-1].value) == (0.0034223279999999966, 0.6411325410719271)
    assert not {"wan_bytes", "lan_bytes", "wan"} & set(t.meta)


def test_wan_settings_do_nothing_on_one_flat_site(small_problem):
    a = run_config(SimConfig(n_workers=3, steps=10), small_problem).trace
    b = run_config(SimConfig(n_workers=3, steps=10, wan_latency=1.0, wan_bandwidth=10.0), small_problem).trace
    assert (a.spans, a.updates, a.quality) == (b.spans, b.updates, b.quality)


# -- a flat parameter server across sites ------------------------------------------------------------
def test_workers_are_spread_evenly_in_blocks():
    assert site_of(8, 3) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert site_of(4, 1) == [0, 0, 0, 0]


def test_flat_ps_remote_worker_pays_three_wan_trips_per_step(small_problem):
    # Worker 1 is at site 1, the server at site 0: pull request, pull reply and push each cross the WAN,
    # and BSP makes everyone wait for it: a step is 3 x 50 ms + 10 ms of compute.
    t = run_config(SimConfig(n_workers=2, sites=2, steps=6, **CLOSED), small_problem).trace
    assert t.makespan == pytest.approx(6 * (3 * 0.05 + 0.01), rel=1e-9)
    one_site = run_config(SimConfig(n_workers=2, steps=6, **CLOSED), small_problem).trace
    assert t.makespan - one_site.makespan >= 6 * 3 * 0.05 - 1e-9
    # The remote worker's bytes crossed the WAN, the local one's stayed on the LAN.
    sent = {w: sum(s.nbytes for s in t.spans if s.worker == w and s.kind in ("send", "recv")) for w in (0, 1)}
    assert t.meta["wan_bytes"] == sent[1] and t.meta["lan_bytes"] == sent[0]
    assert t.meta["site_of"] == [0, 1]


def test_flat_ps_wan_link_is_shared_so_traffic_queues(small_problem):
    # Workers 2 and 3 share site 1's WAN link to site 0: with no latency at all, each step still takes
    # at least the time to move both of their messages through it, one after the other.
    bw = 1e5
    t = run_config(SimConfig(n_workers=4, sites=2, steps=5, wan_latency=0.0, wan_bandwidth=bw, compute_overhead=0.0,
                           compute_per_unit=0.0, **FAST_LAN), small_problem).trace
    remote = [s for s in t.spans if s.worker in (2, 3) and s.kind in ("send", "recv")]
    per_step_bytes = sum(s.nbytes for s in remote if s.step == 0)
    # Pull requests queue behind each other on the way in, replies on the way out, then pushes.
    assert t.makespan >= 5 * per_step_bytes / 2 / bw
    alone = run_config(SimConfig(n_workers=4, sites=2, steps=5, wan_latency=0.0, wan_bandwidth=bw * 1e6,
                               compute_overhead=0.0, compute_per_unit=0.0, **FAST_LAN), small_problem).trace
    assert t.makespan > 100 * alone.makespan


# -- per-site servers ---------------------------------------------------------------------------------
def test_per_site_bsp_waits_one_wan_trip_per_step_async_does_not(small_problem):
    # Each site's workers reach their servers over the instant LAN; under BSP a step's reads wait until
    # the other sites' updates of the step before have crossed the WAN: compute + 50 ms per step.
    bsp = run_config(SimConfig(n_workers=2, sites=2, hierarchy="per-site", steps=6, **CLOSED), small_problem).trace
    assert bsp.makespan == pytest.approx(6 * (0.01 + 0.05), rel=1e-9)
    asy = run_config(SimConfig(n_workers=2, sites=2, hierarchy="per-site", protocol="async", steps=6, **CLOSED),
                   small_problem).trace
    assert asy.makespan == pytest.approx(6 * 0.01 + 0.05, rel=1e-9)  # the last updates still cross the WAN
    waits = [s for s in bsp.spans if s.kind == "wait" and s.end - s.start > 1e-9]  # (the barrier's are ~0)
    assert len(waits) == 2 * 5 and all(s.end - s.start == pytest.approx(0.05) for s in waits)


def _site_step_keys(trace, problem, n_workers, sites):
    """Per (site, step): the distinct keys its workers' pushes of that step touched (every push applied)."""
    shards, where = problem.shards(n_workers), site_of(n_workers, sites)
    out: dict = {}
    for u in trace.updates:
        keys = problem.keys(problem.batch(shards[u.worker], u.step, trace.meta["config"]["batch_size"]))
        out.setdefault((where[u.worker], u.step), []).append(keys)
    return {k: np.unique(np.concatenate(v)) for k, v in out.items()}


def test_per_site_replication_sends_each_sites_summed_step_to_every_other_site(small_problem):
    # A site server sums its workers' pushes of a step and sends the sum, one message to each other site
    # per step: one key + value entry per distinct key its workers touched (under BSP a step's pushes are
    # all in before any worker of the site moves on).
    cfg = SimConfig(n_workers=6, sites=3, hierarchy="per-site", steps=8)
    t = run_config(cfg, small_problem).trace
    per_step = _site_step_keys(t, small_problem, 6, 3)
    assert t.meta["wan_bytes"] == 2 * sum(len(k) for k in per_step.values()) * (cfg.key_bytes + cfg.value_bytes)
    assert t.meta["wan_messages"] == 2 * 3 * 8
    pushed = sum(s.nbytes for s in t.spans if s.kind == "send")  # each applied push, key + value bytes
    assert t.meta["wan_bytes"] < 2 * pushed  # keys two workers of a site both touched cross once
    assert t.meta["lan_bytes"] == sum(s.nbytes for s in t.spans if s.kind in ("send", "recv"))


def test_significance_filter_moves_fewer_bytes_and_every_update_arrives(small_problem):
    base = SimConfig(n_workers=6, sites=3, hierarchy="per-site", steps=30)
    full = run_config(base, small_problem)
    filt = run_config(base.replace(significance=0.1), small_problem)
    assert filt.trace.meta["wan_bytes"] < 0.8 * full.trace.meta["wan_bytes"]
    for run in (full, filt):
        # After the final flush the sites hold the same table (up to the order of the additions) ...
        for table in run.tables[1:]:
            np.testing.assert_allclose(table, run.tables[0], rtol=0, atol=1e-12)
        # ... and the last quality point is site 0's table.
        assert run.trace.quality[-1].value == small_problem.quality(run.tables[0])
    # Filtered reads miss the other sites' small sums for a while, so the runs differ, but only a little.
    assert filt.trace.quality[-1].value == pytest.approx(full.trace.quality[-1].value, rel=0.02)


def test_a_filter_that_passes_nothing_still_delivers_everything_at_the_end(small_problem):
    run = run_config(SimConfig(n_workers=6, sites=3, hierarchy="per-site", significance=1e6, steps=6), small_problem)
    # Nothing passes |acc| > 1e6 |value| once values are nonzero; keys at 0 pass on their first sum.
    # The flush sends one message from each site to each other site, after the last step.
    last_update = max(u.time for u in run.trace.updates)
    flush = [m for m in run.trace.meta["wan"] if m[0] >= last_update]
    assert len(flush) == 3 * 2
    for table in run.tables[1:]:
        np.testing.assert_allclose(table, run.tables[0], rtol=0, atol=1e-12)
    assert np.abs(run.tables[0] - small_problem.init_params()).sum() > 0


def test_filter_keeps_small_sums_until_they_pass():
    box = Outbox(np.zeros(4), threshold=0.5)
    values = np.array([1.0, 1.0, 5.0, 0.0])
    box.add(3, np.array([0, 1, 3]), np.array([0.2, 2.0, 0.1]))
    keys, sums, step = box.take(values)
    assert keys.tolist() == [1, 3] and step == 3  # 2.0 > 0.5 x 1; key 3's value is 0: any change passes
    box.add(4, np.array([0, 2]), np.array([0.4, 1.0]))
    keys, sums, step = box.take(values)
    assert keys.tolist() == [0] and sums.tolist() == pytest.approx([0.6]) and step == 4  # key 2: 1.0 <= 2.5
    keys, sums = box.rest()
    assert keys.tolist() == [2] and sums.tolist() == [1.0]
    assert box.rest()[0].tolist() == [] and box.take(values)[2] is None


def test_a_site_sums_its_workers_pushes_before_the_wan():
    box = Outbox(np.zeros(4))  # full replication: every key touched since the last take, summed
    box.add(2, np.array([0, 1]), np.array([1.0, 2.0]))
    box.add(1, np.array([1, 3]), np.array([0.5, -1.0]))  # a push of an earlier step, from a slower worker
    keys, sums, step = box.take(np.zeros(4))
    assert keys.tolist() == [0, 1, 3] and sums.tolist() == [1.0, 2.5, -1.0] and step == 1
    assert box.take(np.zeros(4))[0].tolist() == []


def test_mirror_clock_zero_makes_async_sites_wait_one_wan_trip_per_step(small_problem):
    # Gaia's mirror clock: a site starts step c once it has heard that the other sites ended step c - 1 - m.
    # With m = 0 the announcement of each step's end crosses the WAN before the next: BSP's closed form.
    asy = run_config(SimConfig(n_workers=2, sites=2, hierarchy="per-site", protocol="async", mirror_clock=0, steps=6,
                             **CLOSED), small_problem).trace
    assert asy.makespan == pytest.approx(6 * (0.01 + 0.05), rel=1e-9)
    # Every step's end is announced: one message each way per step, updates and clock together.
    assert asy.meta["wan_messages"] == 2 * 6


def _pushed_at(trace) -> dict:
    return {(u.worker, u.step): u.time for u in trace.updates}


@pytest.mark.parametrize("m", [0, 2])
def test_mirror_clock_bounds_how_far_async_sites_drift_apart(small_problem, m):
    # Site 0's worker is 20x slower. A push of step c at site 1 follows a read that the mirror clock let
    # through only once site 0 had ended step c - 1 - m: its worker had pushed that step before.
    cfg = SimConfig(n_workers=2, sites=2, hierarchy="per-site", protocol="async", steps=12,
                    stragglers=Stragglers(slow_workers=1, slow_factor=20.0), **CLOSED)
    def drift(trace):
        at = _pushed_at(trace)
        return max(c - max((k for (w, k), t in at.items() if w == 0 and t <= at[(1, c)]), default=-1)
                   for c in range(12))
    assert drift(run_config(cfg.replace(mirror_clock=m), small_problem).trace) <= m + 1
    assert drift(run_config(cfg, small_problem).trace) > m + 1  # without it the fast site runs ahead


def test_sent_by_frequency_counts_what_the_filter_held_back():
    box = Outbox(np.zeros(3), threshold=0.5)
    values = np.array([10.0, 1.0, 0.0])
    for step in range(4):  # key 0 summed 4 times and never sent; key 1 sent each time; key 2 once, sent
        box.add(step, np.array([0, 1] if step else [0, 1, 2]), np.array([0.1, 1.0, 1.0] if not step else [0.1, 1.0]))
        box.take(values)
    assert box.summed.tolist() == [4, 4, 1] and box.sent.tolist() == [0, 4, 1]
    top, rest = sent_by_frequency([box], shares=(0.5, 1.0))  # 3 keys: round(1.5) = 2 in the top half
    assert (top["keys"], top["share"], top["sent"], top["per_key"]) == (2, 8 / 9, 0.5, 4)
    assert (rest["keys"], rest["share"], rest["sent"]) == (1, 1 / 9, 1.0)
    with pytest.raises(ValueError, match="shares must rise"):
        sent_by_frequency([box], shares=(0.5, 0.2, 1.0))


def test_against_compares_bytes_time_and_loss_with_the_base(small_problem):
    cfg = SimConfig(n_workers=6, sites=3, protocol="ssp:2", steps=30)
    flat, site = run_config(cfg, small_problem).trace, run_config(cfg.replace(hierarchy="per-site", significance=0.1), small_problem).trace
    target = flat.quality[-1].value * 1.05
    rows = against(flat, {"flat": flat, "filter": site}, target)
    assert rows["flat"]["fewer"] == 1.0 and rows["flat"]["sooner"] == 1.0 and rows["flat"]["change"] == 0.0
    r = rows["filter"]
    assert r["wan_mb"] == site.meta["wan_bytes"] / 1e6 and r["fewer"] == flat.meta["wan_bytes"] / site.meta["wan_bytes"]
    assert r["time"] == site.time_to(target) and r["sooner"] == flat.time_to(target) / site.time_to(target)
    assert r["change"] == pytest.approx(site.quality[-1].value / flat.quality[-1].value - 1)
    assert against(flat, {"never": site}, 0.0)["never"]["time"] is None


def test_tau_counts_updates_applied_at_every_site(small_problem):
    t = run_config(SimConfig(n_workers=4, sites=2, hierarchy="per-site", protocol="async", steps=10, **CLOSED),
                 small_problem).trace
    # Equal workers pushing in turn: between a read and its push the other 3 workers each pushed once.
    assert max(u.staleness for u in t.updates) == 3


# -- presets, labels, errors --------------------------------------------------------------------------
def test_presets_set_the_network():
    regions = SimConfig.preset("regions", n_workers=9)
    assert (regions.sites, regions.wan_latency, regions.wan_bandwidth, regions.n_workers) == (3, 0.05, 12.5e6, 9)
    assert SimConfig.preset("rack").latency < SimConfig.preset("datacenter").latency
    assert set(NETWORKS) == {"rack", "datacenter", "regions"}
    assert SimConfig.preset("regions", n_workers=9, hierarchy="per-site", significance=0.01).label == \
        "BSP 3 sites per-site sig=0.01"
    with pytest.raises(ValueError, match="network must be one of 'rack'"):
        SimConfig.preset("moon")


@pytest.mark.parametrize("fields, needle", [
    (dict(sites=0), "sites must be an integer in \\[1"),
    (dict(n_workers=2, sites=3), "sites \\(3\\) must be <= n_workers \\(2\\)"),
    (dict(wan_bandwidth=0), "wan_bandwidth must be"),
    (dict(wan_latency=-1), "wan_latency must be"),
    (dict(hierarchy="tree"), "hierarchy must be one of 'flat', 'per-site'"),
    (dict(significance=0.01), "significance .* needs hierarchy='per-site'"),
    (dict(hierarchy="per-site", significance=-0.1), "significance must be"),
    (dict(mirror_clock=2), "mirror_clock .* needs hierarchy='per-site'"),
    (dict(hierarchy="per-site", mirror_clock=-1), "mirror_clock must be"),
    (dict(hierarchy="per-site", mirror_clock=1.5), "mirror_clock must be"),
    (dict(sites=2, topology="allreduce"), "sites > 1 runs with topology 'ps' only"),
    (dict(hierarchy="per-site", protocol="essp:2"), "hierarchy 'per-site': worker caches"),
    (dict(hierarchy="per-site", protocol="ssp:2", cache=True), "hierarchy 'per-site': worker caches"),
    (dict(hierarchy="per-site", protocol="ssp:2", staleness_aware=True), "hierarchy 'per-site': staleness_aware"),
])
def test_bad_site_settings_are_named(fields, needle):
    with pytest.raises(ValueError, match=needle):
        SimConfig(**fields)


def test_cli_takes_the_site_flags(capsys):
    rc = main(["compare", "--no-plot", "--workers", "6", "--steps", "5", "--sites", "3", "--hierarchy", "per-site",
               "--significance", "0.05", "--mirror-clock", "1", "--wan-latency", "0.02", "--protocols", "bsp,async"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "BSP 3 sites per-site sig=0.05 mirror=1" in out and "Async 3 sites per-site sig=0.05 mirror=1" in out


def test_cli_names_a_bad_site_flag():
    proc = subprocess.run([sys.executable, "-m", "simlib", "compare", "--no-plot", "--significance", "0.1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "significance" in proc.stderr and "Traceback" not in proc.stderr


def test_relative_changes_are_what_the_filter_compares(small_problem):
    run = run_config(SimConfig(n_workers=2, steps=20), small_problem)
    rel = relative_changes(small_problem, run.w, 32, 0.5, steps=3)
    batch = small_problem.batch(small_problem.shards(1)[0], 0, 32)
    keys = small_problem.keys(batch)
    keys, deltas = small_problem.step(run.w[keys], batch, keys, 0.5)
    np.testing.assert_allclose(rel[:len(keys)], np.abs(deltas) / np.abs(run.w[keys]))
    assert np.isinf(relative_changes(small_problem, small_problem.init_params(), 32, 0.5, steps=1)).all()


def test_runs_across_sites_are_deterministic(small_problem):
    cfg = SimConfig(n_workers=6, sites=3, hierarchy="per-site", significance=0.05, protocol="ssp:2", steps=8,
                    stragglers=Stragglers(jitter="lognormal"))
    assert run_config(cfg, small_problem).trace == run_config(cfg, small_problem).trace


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 6), sites=st.integers(1, 3), proto=st.sampled_from(["bsp", "ssp:1", "async"]),
       sig=st.sampled_from([None, 0.0, 0.05, 10.0]), servers=st.integers(1, 2),
       mirror=st.sampled_from([None, 0, 2]))
def test_per_site_invariants(small_problem, n, sites, proto, sig, servers, mirror):
    sites = min(sites, n)
    run = run_config(SimConfig(n_workers=n, sites=sites, hierarchy="per-site", significance=sig, protocol=proto,
                               steps=5, n_servers=servers, mirror_clock=mirror,
                               stragglers=Stragglers(jitter="lognormal")), small_problem)
    t = run.trace
    assert len(t.updates) == 5 * n and all(u.applied for u in t.updates)
    for table in run.tables[1:]:  # every update reached every site
        np.testing.assert_allclose(table, run.tables[0], rtol=0, atol=1e-12)
    assert t.meta["wan_bytes"] == sum(m[2] for m in t.meta["wan"])
    assert all(m[3] != m[4] for m in t.meta["wan"])
    # The bound across sites (the protocol's, at most the mirror clock): a push of step c follows a read that
    # waited until every worker elsewhere had pushed step c - 1 - bound.
    bound = min(SimConfig(protocol=proto).bound, np.inf if mirror is None else mirror)
    at, where = _pushed_at(t), site_of(n, sites)
    for (i, c), when in at.items():
        if c - 1 - bound >= 0:
            assert all(at[(j, int(c - 1 - bound))] <= when for j in range(n) if where[j] != where[i])
    if sig is None and proto == "bsp" and mirror is None:  # full replication: each site's summed step crosses to every other site
        per_step = _site_step_keys(t, small_problem, n, sites)
        assert t.meta["wan_bytes"] == (sites - 1) * 8 * sum(len(k) for k in per_step.values())
    if sig is None and mirror is None:  # never more than each push sent as it is (a mirror clock adds its own)
        assert t.meta["wan_bytes"] <= (sites - 1) * sum(s.nbytes for s in t.spans if s.kind == "send")
