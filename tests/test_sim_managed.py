"""Bosen's managed communication in the simulator (simlib.sim.managed): budget, nothing lost, priority, bound."""
import hashlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simlib.sim import SimConfig, Stragglers
from simlib.sim.engine import run_config
from simlib.managed import MESSAGE_ENTRIES, Pending, priority
from simlib.options import options

JITTER = Stragglers(jitter="lognormal", slow_workers=1, pause_prob=0.1, pause_time=0.001)


def _managed(**changes):
    base = SimConfig(n_workers=4, protocol="ssp:2", steps=12, clock_batches=4, managed_bandwidth=2e5,
                     stragglers=JITTER, seed=5)
    return base.replace(**changes)


# -- the option off: today's traces -------------------------------------------------------------
# sha256 of these five runs' traces (config left out: it lists the new fields), computed on main at
# 46d257c, before managed communication existed.
TRACES_BEFORE = "6b9647d4b9d524b1a996c780172dd088e7a47aca6fb6e428a3d735ff3fc84a23"


def test_off_gives_exactly_the_traces_from_before(small_problem):
    cfgs = [SimConfig(n_workers=4, steps=15, protocol=p, n_servers=2, stragglers=JITTER, seed=3)
            for p in ("bsp", "ssp:2", "async")]
    cfgs += [SimConfig(n_workers=4, steps=15, protocol="essp:2", stragglers=JITTER, seed=3),
             SimConfig(n_workers=4, steps=15, protocol="ssp:1", compression="topk:0.1", stragglers=JITTER, seed=3)]
    h = hashlib.sha256()
    for cfg in cfgs:
        d = run_config(cfg, small_problem).trace.to_dict()
        d["meta"].pop("config")
        h.update(json.dumps(d, sort_keys=True).encode())
    assert h.hexdigest() == TRACES_BEFORE


# -- the budget ----------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [5e4, 2e5, 1e6])
def test_early_bytes_per_time_bin_stay_within_the_budget(small_problem, budget):
    cfg = _managed(managed_bandwidth=budget)
    t = run_config(cfg, small_problem).trace
    log = np.array(t.meta["managed"]["log"])  # [start, arrival, bytes, worker, clock]
    assert len(log) > 10
    one_message = MESSAGE_ENTRIES * (cfg.key_bytes + cfg.value_bytes)
    for width in (1e-3, 5e-3, 2e-2):
        for i in range(cfg.n_workers):
            mine = log[log[:, 3] == i]
            per_bin = np.bincount((mine[:, 0] // width).astype(int), weights=mine[:, 2])
            assert per_bin.max() <= budget * width + one_message


def test_a_larger_budget_sends_more_early_and_reads_see_more(small_problem):
    runs = {b: run_config(_managed(managed_bandwidth=b), small_problem).trace for b in (5e4, 1e6)}
    plain = run_config(_managed(managed_bandwidth=None), small_problem).trace
    early = {b: t.meta["managed"]["bytes"] for b, t in runs.items()}
    assert 0 < early[5e4] < early[1e6]
    unseen = {b: np.mean(t.meta["clocked"]["unseen"]) for b, t in runs.items()}
    assert unseen[1e6] < unseen[5e4] < np.mean(plain.meta["clocked"]["unseen"])
    assert "managed" not in plain.meta


def test_link_load_counts_every_byte_sent(small_problem):
    t = run_config(_managed(), small_problem).trace
    width = 2e-3
    _, load = t.link_load(width)
    assert load.shape[0] == 4
    assert load.sum() * width == pytest.approx(t.summary()["bytes_sent"])


# -- nothing lost ----------------------------------------------------------------------------------
class _Recording:
    """The problem, with every step's update written down."""

    def __init__(self, problem):
        self._p = problem
        self.deltas = []

    def __getattr__(self, name):
        return getattr(self._p, name)

    def step(self, values, batch, keys, lr):
        k, g = self._p.step(values, batch, keys, lr)
        self.deltas.append((np.array(k), np.array(g)))
        return k, g


@pytest.mark.parametrize("changes", [{}, {"n_servers": 3}, {"protocol": "async", "staleness": None}, {"managed_bandwidth": None},
                                     {"managed_bandwidth": 1e9, "bandwidth": 1e9}])
def test_the_final_table_is_the_start_plus_every_update(small_problem, changes):
    rec = _Recording(small_problem)
    cfg = _managed(**changes)
    run = run_config(cfg, rec)
    assert len(rec.deltas) == cfg.n_workers * cfg.steps * cfg.clock_batches
    expected = small_problem.init_params().astype(np.float64)
    for k, g in rec.deltas:
        np.add.at(expected, k, g)
    np.testing.assert_allclose(run.w, expected, rtol=1e-10, atol=1e-12)
    if cfg.managed_bandwidth is not None:
        m = run.trace.meta["managed"]
        assert m["messages"] > 0 and m["entries"] > 0


# -- priority ------------------------------------------------------------------------------------
def test_priority_is_relative_magnitude():
    np.testing.assert_allclose(priority(np.array([-2.0, 1.0]), np.array([4.0, -1.0]), eps=0.0), [0.5, 1.0])


def test_largest_relative_change_goes_first():
    keys = np.array([3, 7, 10, 12, 20])
    values = np.array([100.0, 1.0, -0.5, 10.0, 2.0])
    pend = Pending(keys, values)
    pend.add(np.array([3, 7, 10, 12]), np.array([50.0, 0.9, 0.2, -8.0]))  # relative: 0.5, 0.9, 0.4, 0.8
    pend.add(np.array([12]), np.array([-1.0]))  # key 12 now sums to -9: relative 0.9 (ties with key 7)
    k, d = pend.take(2)
    assert k.tolist() == [7, 12] and d.tolist() == [0.9, -9.0]  # the largest |delta| (50 at key 3) is not first
    k, d = pend.take(2)
    assert k.tolist() == [3, 10]
    k, d = pend.rest()
    assert len(k) == 0 and pend.closed  # key 20 never changed: nothing to send
    with pytest.raises(ValueError, match="did not read"):
        pend.add(np.array([4]), np.array([1.0]))


# -- the SSP bound, determinism ---------------------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 5), s=st.integers(1, 3), k=st.integers(2, 4), shards=st.integers(1, 3),
       budget=st.sampled_from([1e4, 1e5, 1e6]), sigma=st.floats(0.0, 1.5), seed=st.integers(0, 10_000))
def test_no_read_is_staler_than_the_bound(small_problem, n, s, k, shards, budget, sigma, seed):
    cfg = SimConfig(n_workers=n, protocol=f"ssp:{s}", steps=8, clock_batches=k, managed_bandwidth=budget,
                    n_servers=shards, stragglers=Stragglers(jitter="lognormal", jitter_sigma=sigma, slow_workers=1),
                    seed=seed)
    t = run_config(cfg, small_problem).trace
    assert len(t.updates) == n * 8
    assert max(u.clock_lag for u in t.updates) <= s
    assert all(u.staleness >= 0 for u in t.updates)


def test_same_seed_same_trace(small_problem):
    cfg = _managed(n_servers=2)
    assert run_config(cfg, small_problem).trace == run_config(cfg, small_problem).trace
    assert run_config(cfg.replace(seed=6), small_problem).trace.spans != run_config(cfg, small_problem).trace.spans


# -- refused by name -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(protocol="ssp:2", managed_bandwidth=1e5), "clock_batches >= 2"),
    (dict(protocol="bsp", clock_batches=2, managed_bandwidth=1e5), "managed_bandwidth needs a stale protocol"),
    (dict(protocol="ssp:0", clock_batches=2, managed_bandwidth=1e5), "managed_bandwidth needs a stale protocol"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=0), "managed_bandwidth must be"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=float("nan")), "managed_bandwidth must be"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=1e10, bandwidth=1e9), "must be <= bandwidth"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=1e5, staleness_aware=True), "managed_bandwidth: stal"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=1e5, backup_workers=1), "managed_bandwidth: backup"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=1e5, sites=2), "managed_bandwidth: sites"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=1e5,
          stragglers=Stragglers(fail_worker=0, fail_time=1.0)), "managed_bandwidth: stragglers.fail_worker"),
    (dict(protocol="ssp:2", clock_batches=2, managed_bandwidth=1e5, stragglers="none"),
     "stragglers must be a Stragglers"),  # was an AttributeError from the managed check
    (dict(clock_batches=0), "clock_batches must be an integer"),
    (dict(steps=100, clock_batches=10_001), "clock_batches: steps x clock_batches = 100 x 10,001 = 1,000,100 mini"),
    (dict(protocol="essp:2", clock_batches=2), "clock_batches > 1 is modelled without worker caches, and protocol "
                                               "'essp:S' keeps one per worker; use 'ssp:S' or 'async' without cache"),
    (dict(protocol="ssp:2", cache=True, clock_batches=2), "clock_batches > 1 is modelled without worker caches, and "
                                                          "cache=True keeps one per worker"),
    (dict(topology="allreduce", clock_batches=2), "clock_batches > 1 is modelled with topology 'ps' only, not 'allr"),
    (dict(protocol="ssp:2", clock_batches=2, compression="topk:0.1"), "clock_batches > 1 is modelled without compr"),
])
def test_bad_values_are_refused_by_name(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("|", r"\|").replace("(", r"\(")):
        SimConfig(**kwargs)


def test_managed_bandwidths_documented_range_names_the_bound_it_is_refused_by():
    """It was documented as (0, 1e+30] while anything above bandwidth was refused."""
    doc = next(o for o in options(SimConfig) if o.name == "managed_bandwidth").range_text()
    assert doc == "in (0, 1e+30] and <= bandwidth"
    with pytest.raises(ValueError, match="must be <= bandwidth"):
        SimConfig(protocol="ssp:2", clock_batches=2, managed_bandwidth=2e9, bandwidth=1e9)


def test_labels_say_clock_size_and_budget():
    assert SimConfig(protocol="ssp:3", clock_batches=8).label == "SSP(3) 8/clock"
    assert SimConfig(protocol="ssp:3", clock_batches=8, managed_bandwidth=2.5e5).label == "SSP(3) 8/clock managed 0.25 MB/s"
