"""AD-LDA on the contract, simulated: determinism, SSP(0) = BSP, the staleness bound, closed-form timing, SSP vs BSP."""
import numpy as np
import pytest

import simlib
from simlib.problems.lda import kjv_corpus, make_synthetic_corpus
from simlib.problems.lda_table import LDAProblem
from simlib.protocol import Protocol
from simlib.sim import Stragglers

JITTER = Stragglers(jitter="lognormal", jitter_sigma=0.5, pause_prob=0.1, pause_time=0.01)
CLUSTER = dict(n_workers=4, steps=8, compute_per_unit=1e-7, latency=1e-3, bandwidth=1.25e8)


@pytest.fixture(scope="module")
def synthetic():
    return LDAProblem(make_synthetic_corpus(n_docs=200, seed=0)[0], 8, 0.5)


def _sim(problem, protocol, **kw):
    return simlib.run(problem, protocol, substrate="sim", **(CLUSTER | kw))


def test_same_config_gives_the_same_trace_and_counts_are_conserved(synthetic):
    a = _sim(synthetic, "ssp:2", stragglers=JITTER, seed=3)
    b = _sim(synthetic, "ssp:2", stragglers=JITTER, seed=3)
    assert a.trace == b.trace and np.array_equal(a.params, b.params)
    synthetic.check_counts(a.params)


def test_ssp_with_bound_zero_is_bsp(synthetic):
    bsp = _sim(synthetic, "bsp", stragglers=JITTER).trace
    ssp0 = _sim(synthetic, "ssp:0", stragglers=JITTER).trace
    assert bsp.quality == ssp0.quality and bsp.spans == ssp0.spans


def test_clock_lag_never_exceeds_the_bound_and_reaches_it(synthetic):
    trace = _sim(synthetic, "ssp:2", steps=12, stragglers=JITTER).trace
    lags = [u.clock_lag for u in trace.updates]
    assert min(lags) >= 0 and max(lags) == 2


def test_one_worker_without_noise_matches_the_cost_model(synthetic):
    # Infinite-ish bandwidth: a clock is pull request + reply + push (3 latencies) + compute.
    trace = _sim(synthetic, "bsp", n_workers=1, steps=5, bandwidth=1e18, latency=2e-3, compute_overhead=1e-3).trace
    per_clock = 3 * 2e-3 + 1e-3 + synthetic.corpus.n_tokens * 1e-7
    assert trace.makespan == pytest.approx(5 * per_clock, rel=1e-9)
    assert [q.step for q in trace.quality] == list(range(6))


def test_ssp_beats_bsp_in_time_on_a_jittery_cluster():
    prob = LDAProblem(kjv_corpus(max_docs=200), 20, 0.1)
    bsp, ssp = (_sim(prob, p, steps=15, stragglers=JITTER).trace for p in ("bsp", "ssp:3"))
    assert ssp.makespan < 0.85 * bsp.makespan  # no barrier waits for the slowest worker
    assert bsp.summary()["wait_fraction"] > 2 * ssp.summary()["wait_fraction"]
    # log p(w | z) per sweep trails a little under stale counts: 1.4-2.0% after 15 sweeps over seeds 0-3.
    assert abs(ssp.quality[-1].value - bsp.quality[-1].value) < 0.025 * abs(bsp.quality[-1].value)


@pytest.mark.parametrize("protocol, kw, field", [
    (Protocol.parse("ssp:1", backup_workers=1), {}, "backup_workers"),
    (Protocol.parse("bsp", timeout=1.0), {}, "timeout"),
    ("bsp", dict(compression="topk:0.1"), "compression"),
    ("bsp", dict(n_workers=1000), "n_workers"),
    ("bsp", dict(accumulation=4), "accumulation"),  # it averaged pushes: fractional counts, check_counts passed
])
def test_configs_that_would_lose_counts_are_refused(synthetic, protocol, kw, field):
    with pytest.raises(ValueError, match=field):
        _sim(synthetic, protocol, **kw)


@pytest.mark.parametrize("substrate", ["pipes", "ray"])
def test_the_real_servers_refuse_backup_workers_too(synthetic, substrate):
    """Refused before any process or actor starts: the pipe server dropped the slowest push of a step
    and the counts went negative, with no error."""
    with pytest.raises(ValueError, match="backup_workers: LDAProblem needs every push applied whole"):
        simlib.run(synthetic, Protocol("bsp", backup_workers=1), substrate=substrate,
                   n_workers=3, steps=2)


def test_check_counts_finds_a_count_that_is_not_whole(synthetic):
    table = synthetic.init_params().astype(np.float64)
    synthetic.check_counts(table)
    assert table[[1, 8]].min() >= 1
    table[[0, 1, 8, 9]] += [0.5, -0.5, -0.5, 0.5]  # words 0 and 1, topics 0 and 1: every row and column sum kept
    with pytest.raises(AssertionError, match="not a whole number"):
        synthetic.check_counts(table)


def test_bad_hyperparameters_name_the_field(synthetic):
    with pytest.raises(ValueError, match="n_topics"):
        LDAProblem(synthetic.corpus, 0)
    with pytest.raises(ValueError, match="corpus"):
        LDAProblem([[1, 2]], 3)


def test_a_table_larger_than_memory_is_refused_naming_the_field():
    corpus = make_synthetic_corpus(n_docs=200, n_topics=3, n_words=30, doc_length=10, seed=0)[0]
    with pytest.raises(ValueError, match=r"n_topics: .* more than half the memory available .* use at most \d+"):
        LDAProblem(corpus, n_topics=10**9)  # 3 TB of tables for 30 words
    # Tables that take a quarter of the memory are accepted; 200 workers' copies of them are not.
    per_topic = 8 * (corpus.n_words + 1) + 12 * (corpus.n_docs + corpus.n_words)
    from simlib._validate import available_memory
    prob = LDAProblem(corpus, n_topics=int(available_memory() / 4 / per_topic))
    with pytest.raises(ValueError, match=r"n_workers: .* more than half the memory available"):
        prob.shards(200)
