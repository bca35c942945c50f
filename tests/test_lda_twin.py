"""The simulated AD-LDA twin: determinism, SSP(0) = BSP, the staleness bound, closed-form timing, SSP vs BSP."""
import numpy as np
import pytest

from simlib.problems.lda import kjv_corpus, make_synthetic_corpus
from simlib.sim import SimConfig, Stragglers
from simlib.sim.lda_twin import simulate_lda

JITTER = Stragglers(jitter="lognormal", jitter_sigma=0.5, pause_prob=0.1, pause_time=0.01)


@pytest.fixture(scope="module")
def synthetic():
    return make_synthetic_corpus(n_docs=200, seed=0)[0]


def _cfg(**kw):
    base = dict(n_workers=4, steps=8, compute_per_unit=1e-7, latency=1e-3, bandwidth=1.25e8)
    return SimConfig(**(base | kw))


def test_same_config_gives_the_same_trace(synthetic):
    cfg = _cfg(protocol="ssp", staleness=2, stragglers=JITTER, seed=3)
    assert simulate_lda(synthetic, 8, 0.5, cfg=cfg) == simulate_lda(synthetic, 8, 0.5, cfg=cfg)


def test_ssp_with_bound_zero_is_bsp(synthetic):
    bsp = simulate_lda(synthetic, 8, 0.5, cfg=_cfg(protocol="bsp", stragglers=JITTER))
    ssp0 = simulate_lda(synthetic, 8, 0.5, cfg=_cfg(protocol="ssp", staleness=0, stragglers=JITTER))
    assert bsp.quality == ssp0.quality and bsp.spans == ssp0.spans


def test_staleness_never_exceeds_the_bound_and_is_used(synthetic):
    s = 2
    trace = simulate_lda(synthetic, 8, 0.5, cfg=_cfg(protocol="ssp", staleness=s, steps=12, stragglers=JITTER))
    lag = np.arange(12)[None, :] - np.array(trace.meta["table_clock"])
    assert lag.min() >= 0 and lag.max() <= s
    assert max(u.clock_lag for u in trace.updates) == s


def test_one_worker_without_noise_matches_the_cost_model(synthetic):
    # Infinite-ish bandwidth: a clock is pull request + reply + push (3 latencies) + compute.
    cfg = _cfg(n_workers=1, steps=5, bandwidth=1e18, latency=2e-3, compute_overhead=1e-3)
    trace = simulate_lda(synthetic, 8, 0.5, cfg=cfg)
    per_clock = 3 * 2e-3 + 1e-3 + synthetic.n_tokens * 1e-7
    assert trace.makespan == pytest.approx(5 * per_clock, rel=1e-9)
    assert [q.step for q in trace.quality] == list(range(6))


def test_ssp_beats_bsp_in_time_on_a_jittery_cluster():
    corpus = kjv_corpus(max_docs=200)
    runs = {
        p: simulate_lda(corpus, 20, 0.1, cfg=_cfg(protocol=p, staleness=s, steps=15, stragglers=JITTER))
        for p, s in (("bsp", 0), ("ssp", 3))
    }
    bsp, ssp = runs["bsp"], runs["ssp"]
    assert ssp.makespan < 0.85 * bsp.makespan  # no barrier waits for the slowest worker
    assert bsp.summary()["wait_fraction"] > 2 * ssp.summary()["wait_fraction"]
    assert abs(ssp.quality[-1].value - bsp.quality[-1].value) < 0.01 * abs(bsp.quality[-1].value)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(backup_workers=1), "backup_workers"),
        (dict(timeout=1.0), "timeout"),
        (dict(n_servers=2), "n_servers"),
        (dict(n_workers=1000), "n_workers"),
    ],
)
def test_configs_that_would_lose_counts_are_refused(synthetic, kw, field):
    with pytest.raises(ValueError, match=field):
        simulate_lda(synthetic, 8, 0.5, cfg=_cfg(**kw))
    with pytest.raises(ValueError, match="n_topics"):
        simulate_lda(synthetic, 0, 0.5, cfg=_cfg())
