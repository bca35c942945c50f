"""ESSP (eager SSP): the protocol value, worker caches on the simulator, the real substrates' refusal, CLI and panel.

Under SSP with a cache a worker reads its own copy of the table and fetches a row only when the
bound forces it; under ESSP the server also sends every update it applies to every other worker's
copy. The bound holds on every read either way; ESSP's reads are fresher and cost more messages.
"""
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simlib
from simlib.app.scenario import PROTOCOLS, LiveSettings
from simlib.cli import main
from simlib.protocol import Clocks, Protocol
from simlib.sim import SimConfig, Stragglers

STRAGGLERS = Stragglers(jitter="lognormal", jitter_sigma=0.8, slow_workers=1, slow_factor=3.0, pause_prob=0.1,
                        pause_time=0.002)
# An instant network: a pushed update is in every copy the moment it is applied.
INSTANT = dict(latency=0.0, bandwidth=1e30)


CLUSTER = dict(n_workers=6, steps=40, stragglers=STRAGGLERS, latency=2e-4, bandwidth=1.25e8, seed=1)


def _on_cluster(problem, protocol, **changes):
    """The trace of ``problem`` under ``protocol`` on the straggler cluster, ``changes`` made to its options."""
    return simlib.run(problem, protocol, substrate="sim", **{**CLUSTER, **changes}).trace


def _mean_lag(trace):
    return sum(u.clock_lag for u in trace.updates) / len(trace.updates)


def _messages(trace):
    return sum(1 for s in trace.spans if s.kind in ("send", "recv"))


def _bytes(trace):
    s = trace.summary()
    return s["bytes_sent"] + s["bytes_received"]


# -- the protocol value ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, bound, label", [
    ("essp:3", 3, "ESSP(3)"), ("ESSP(3)", 3, "ESSP(3)"), (" essp : 0 ", 0, "ESSP(0)"), ("Essp:010", 10, "ESSP(10)"),
])
def test_essp_parses_with_ssps_bound(spec, bound, label):
    p = Protocol.parse(spec)
    assert (p.kind, p.bound, p.label, p.spec) == ("essp", bound, label, f"essp:{bound}")
    assert p.eager and p.clocked and Protocol.parse(p.spec) == p
    assert not any(Protocol.parse(s).eager for s in ("bsp", "ssp:3", "async"))
    assert Protocol.parse("essp:2", backup_workers=1).label == "ESSP(2) b=1"


@pytest.mark.parametrize("spec, message", [
    ("essp", "ESSP needs a staleness bound such as 'essp:3', got 'essp'"),
    ("essp:x", "unknown protocol 'essp:x'"),
    ("essp:-1", "unknown protocol 'essp:-1'"),
    ("essp:2.5", "unknown protocol 'essp:2.5'"),
    ("eassp:2", "unknown protocol 'eassp:2'"),
    ("essp:99999999", "staleness must be <= 1000000"),
])
def test_bad_essp_specs_are_refused_naming_the_value(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Protocol.parse(spec)


def test_essp_reads_by_the_ssp_rule():
    ssp, essp = Clocks(3, "ssp:1"), Clocks(3, "essp:1")
    for c in (ssp, essp):
        c.deliver(0), c.deliver(0)
    assert [ssp.may_read(k) for k in range(4)] == [essp.may_read(k) for k in range(4)] == [True, True, False, False]
    # A cached row holding every step < 1 may be read at clock 2 (2 - 1 <= 1), not at clock 3.
    assert essp.may_read_from(2, 1) and not essp.may_read_from(3, 1)


@pytest.mark.parametrize("kwargs, needle", [
    ({"protocol": "essp"}, "ESSP needs a staleness bound"),
    ({"protocol": "essp:-2"}, "unknown protocol 'essp:-2'"),
    ({"protocol": "async", "cache": True}, "cache needs a staleness bound"),
    ({"protocol": "ssp:2", "cache": "yes"}, "cache must be True or False"),
    ({"protocol": "essp:2", "accumulation": 64}, "accumulation"),
    ({"protocol": "essp:2", "topology": "allreduce"}, "allreduce"),
])
def test_bad_cache_configurations_name_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SimConfig(**kwargs)


def test_labels_say_which_ssp_ran():
    assert SimConfig(protocol="essp:2").label == "ESSP(2)"
    assert SimConfig(protocol="ssp:2", cache=True).label == "SSP(2) cache"
    assert SimConfig(protocol="essp", staleness=4).proto == Protocol("essp", 4)
    assert SimConfig(protocol="ssp:2").cached is False and SimConfig(protocol="essp:2").cached is True


# -- the simulator ----------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 6),
    s=st.integers(0, 4),
    sigma=st.floats(0.0, 1.5),
    slow=st.integers(0, 2),
    shards=st.integers(1, 3),
    eager=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_no_cached_read_is_staler_than_the_bound(small_problem, n, s, sigma, slow, shards, eager, seed):
    t = simlib.run(
        small_problem, f"{'essp' if eager else 'ssp'}:{s}", substrate="sim", n_workers=n, cache=True, steps=12,
        n_servers=shards, seed=seed,
        stragglers=Stragglers(jitter="lognormal", jitter_sigma=sigma, slow_workers=min(slow, n), slow_factor=3.0),
    ).trace
    assert len(t.updates) == n * 12
    assert all(0 <= u.clock_lag <= s and u.staleness >= 0 for u in t.updates)


@pytest.mark.parametrize("s", [1, 2, 4, 10])
def test_essp_reads_are_fresher_than_cached_ssp_at_the_same_bound(small_problem, s):
    ssp = _on_cluster(small_problem, f"ssp:{s}", cache=True)
    essp = _on_cluster(small_problem, f"essp:{s}")
    a, b = ssp.summary(), essp.summary()
    assert a["max_clock_lag"] <= s and b["max_clock_lag"] <= s
    assert _mean_lag(essp) <= _mean_lag(ssp)  # the rows read hold more of the complete steps
    if s >= 2:
        assert b["mean_staleness"] <= a["mean_staleness"]
    else:
        # At s = 1 the bound makes both fetch nearly every read, so the pushes buy no fresher rows, and the
        # fetch replies queue behind them on the server's out-link: tau comes out level, not lower.
        assert abs(b["mean_staleness"] - a["mean_staleness"]) <= 0.1 * a["mean_staleness"]


def test_a_lazy_cache_goes_stale_as_the_bound_grows_and_essp_does_not(small_problem):
    tau = {(kind, s): _on_cluster(small_problem, f"{kind}:{s}", cache=True).summary()["mean_staleness"]
           for kind in ("ssp", "essp") for s in (1, 10)}
    assert tau["ssp", 10] > 2 * tau["ssp", 1]
    assert tau["essp", 10] < 1.5 * tau["essp", 1]


def test_essp_sends_every_applied_update_to_every_other_worker(small_problem):
    essp = _on_cluster(small_problem, "essp:2")
    ssp = _on_cluster(small_problem, "ssp:2", cache=True)
    pulled = _on_cluster(small_problem, "ssp:2")
    others = CLUSTER["n_workers"] - 1
    applied = sum(u.applied for u in essp.updates)
    pushes = [s for s in essp.spans if s.kind == "recv" and s.nbytes and s not in ssp.spans]
    assert essp.meta["cache"]["pushes"] == others * applied
    assert essp.meta["cache"]["pushed_bytes"] > 0 and "cache" not in pulled.meta
    assert len(pushes) >= others * applied - 1  # a push may share its interval with a fetch's span
    for other in (ssp, pulled):
        assert _messages(essp) > _messages(other)
        assert _bytes(essp) > _bytes(other) + essp.meta["cache"]["pushed_bytes"] / 2


def test_on_an_instant_network_essp_reads_exactly_what_a_pull_reads(small_problem):
    # The copies receive each update the moment it is applied, so every cached read equals a pull from the server.
    for shards in (1, 3):
        pulled = _on_cluster(small_problem, "ssp:2", n_servers=shards, **INSTANT)
        essp = _on_cluster(small_problem, "essp:2", n_servers=shards, **INSTANT)
        assert essp.updates == pulled.updates and essp.quality == pulled.quality
        assert essp.meta["cache"]["pushes"] > 0


def test_a_cache_the_bound_refreshes_on_every_read_is_no_cache(small_problem):
    # At s = 0 every read must hold the newest complete step, so every row read is fetched, as a pull would.
    pulled = _on_cluster(small_problem, "ssp:0")
    cached = _on_cluster(small_problem, "ssp:0", cache=True)
    assert cached.spans == pulled.spans and cached.updates == pulled.updates and cached.quality == pulled.quality
    assert cached.meta["cache"]["fetches"] == len(cached.updates)


def test_a_lazy_cache_with_a_loose_bound_trains_on_stale_rows(small_problem):
    # SSP(100) with a cache fetches a row once and keeps it: workers mostly see their own updates.
    fresh = _on_cluster(small_problem, "essp:100")
    lazy = _on_cluster(small_problem, "ssp:100", cache=True)
    assert lazy.summary()["mean_staleness"] > 10 * fresh.summary()["mean_staleness"]
    assert lazy.quality[-1].value > fresh.quality[-1].value
    assert lazy.meta["cache"]["fetched_keys"] < fresh.meta["cache"]["fetched_keys"] + small_problem.n_params * 6


def test_essp_is_deterministic_for_a_seed(small_problem):
    first = _on_cluster(small_problem, "essp:2", n_servers=2)
    assert _on_cluster(small_problem, "essp:2", n_servers=2) == first
    assert _on_cluster(small_problem, "essp:2", n_servers=2, seed=2).spans != first.spans


def test_simlib_run_takes_essp_and_the_cache_on_the_simulator(small_problem):
    res = simlib.run(small_problem, "essp:2", substrate="sim", n_workers=3, steps=10, lr=0.5)
    assert res.trace.label == "ESSP(2)" and res.trace.meta["cache"]["pushes"] == 2 * 30
    res = simlib.run(small_problem, "ssp:2", substrate="sim", n_workers=3, steps=10, lr=0.5, cache=True)
    assert res.trace.label == "SSP(2) cache" and res.trace.meta["cache"]["pushes"] == 0


# -- real substrates, CLI, panel ---------------------------------------------------------------------
@pytest.mark.parametrize("substrate", ["pipes", "shm", "gpu"])
def test_real_substrates_run_essp_under_ssps_read_rule_reading_the_table_itself(small_problem, substrate):
    """No cache to push to: every read is of the table, as fresh as ESSP's pushes make a cache; the bound holds."""
    res = simlib.run(small_problem, "essp:2", substrate=substrate, n_workers=3, steps=10, lr=0.5)
    assert res.trace.label.startswith("ESSP(2)") and "eager" in res.trace.meta
    assert max(u.clock_lag for u in res.trace.updates) <= 2
    assert res.trace.quality[-1].value < res.trace.quality[0].value


def test_cli_runs_essp_on_the_simulator_and_on_pipes(capsys):
    argv = ["run", "--workers", "3", "--steps", "10", "--rows", "2000", "--features", "100"]
    assert main([*argv, "--protocol", "essp:2"]) == 0
    assert "ESSP(2)" in capsys.readouterr().out
    assert main([*argv, "--protocol", "essp:2", "--substrate", "pipes"]) == 0
    assert "ESSP(2)" in capsys.readouterr().out


def test_cli_compare_runs_cached_ssp_against_essp(capsys):
    rc = main(["compare", "--workers", "4", "--steps", "20", "--protocols", "ssp:2,essp:2", "--cache", "--no-plot"])
    out = capsys.readouterr().out
    assert rc == 0 and "SSP(2) cache" in out and "ESSP(2)" in out


def test_the_panel_offers_essp():
    assert "essp" in PROTOCOLS
    assert "essp" not in LiveSettings().protocols  # offered, not switched on at the start
    cfgs = LiveSettings(n_workers=4, steps=10, protocols=("ssp", "essp"), staleness=2).configs()
    assert [c.label for c in cfgs] == ["SSP(2)", "ESSP(2)"]
    with pytest.raises(ValueError, match="protocols"):
        LiveSettings(protocols=("essp:2",))


def test_the_panel_names_essp_with_its_bound(tiny_problem):
    pytest.importorskip("ipywidgets", reason="the live panel needs ipywidgets")
    from simlib.app.live import LivePanel

    panel = LivePanel(LiveSettings(n_workers=2, steps=10, protocols=("essp",), staleness=3), problem=tiny_problem,
                      figsize=(8, 5))
    try:
        assert panel.c_protocols["essp"].description == "ESSP(3)" and panel.c_protocols["essp"].value
        panel.c_staleness.value = 5
        assert panel.c_protocols["essp"].description == "ESSP(5)"
        assert [t.label for t in panel.traces] == ["ESSP(5)"]
        assert math.isfinite(panel.traces[0].quality[-1].value)
    finally:
        panel.close()
