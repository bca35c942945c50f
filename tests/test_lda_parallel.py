"""AD-LDA on real processes: consistent counts, the SSP bound, topic recovery, clean failures; and over pipes."""
import multiprocessing
import os

import numpy as np
import pytest

import simlib
from simlib.parallel import WorkerDied, WorkerError
from simlib.parallel.lda import train_parallel
from simlib.problems.lda import count_tables, log_likelihood, make_synthetic_corpus, shard_documents, topic_match, topic_word
from simlib.problems.lda_table import LDAProblem
from simlib.protocol import Protocol


@pytest.fixture(scope="module")
def synthetic():
    return make_synthetic_corpus(seed=0)


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"simlib_{os.getpid()}_")} if os.path.isdir("/dev/shm") else set()


def _assert_consistent(corpus, run, K):
    _, n_wk, n_k = count_tables(corpus, run.z, K)
    assert np.array_equal(n_wk, run.n_wk) and np.array_equal(n_k, run.n_k)
    assert run.min_count >= 0


@pytest.mark.parametrize("n_workers, protocol, staleness", [(1, "bsp", 0), (2, "bsp", 0), (2, "ssp", 2)])
def test_topics_recovered_and_counts_consistent(synthetic, n_workers, protocol, staleness):
    corpus, phi, _ = synthetic
    run = train_parallel(corpus, 8, alpha=0.5, n_sweeps=40, n_workers=n_workers, protocol=protocol,
                         staleness=staleness, seed=1, timeout=60)
    _assert_consistent(corpus, run, 8)
    # 0.86-0.99 over loaded and idle runs: a parallel Gibbs chain's end point varies with the races.
    assert topic_match(phi, topic_word(run.n_wk, run.n_k, 0.01))[0] >= 0.8
    t = run.trace
    assert t.substrate == "parallel" and t.metric == "log_likelihood" and not t.lower_is_better
    assert t.quality[-1].value > t.quality[0].value  # the chain climbed from the random start
    assert len(t.updates) == n_workers * 40


def test_ssp_never_samples_against_a_table_older_than_the_bound(synthetic):
    corpus, _, _ = synthetic
    s, n = 2, 12
    # Worker 0 is 20 ms slower per clock, so worker 1 runs ahead as far as the bound allows.
    run = train_parallel(corpus, 8, alpha=0.5, n_sweeps=n, n_workers=2, protocol="ssp", staleness=s,
                         straggler=(0, 0.02), seed=2, timeout=60)
    lag = np.arange(n)[None, :] - run.table_clock
    assert lag.min() >= 0 and lag.max() <= s
    assert lag[1].max() == s  # the fast worker did use the slack
    updates = run.trace.updates
    assert max(u.clock_lag for u in updates) == s  # the protocol's view: clocks behind at the read
    assert sorted((u.worker, u.step, u.clock_lag) for u in updates) == [(w, c, c - run.table_clock[w, c])
                                                                     for w in range(2) for c in range(n)]
    # tau counts the other worker's pushes applied between a pull and its push: the fast worker
    # skips none of its own, and over a run every push of the slow one lands in some fast window
    assert min(u.staleness for u in updates) >= 0
    assert max(u.staleness for u in updates) >= 1
    assert sum(u.staleness for u in updates) <= (n_workers := 2) * n * (n_workers - 1)
    _assert_consistent(corpus, run, 8)


def test_bsp_waits_for_the_straggler_and_is_never_stale(synthetic):
    corpus, _, _ = synthetic
    run = train_parallel(corpus, 8, n_sweeps=6, n_workers=2, protocol="bsp", straggler=(0, 0.02), timeout=60)
    assert np.array_equal(run.table_clock, np.tile(np.arange(6), (2, 1)))
    assert run.trace.busy_time("wait") > 5 * 0.02 * 0.5  # worker 1 waited most of the straggler's delay


def test_over_pipes_the_contract_recovers_the_topics_and_counts_each_rows_bytes(synthetic):
    """LDA over pipes is the contract's pipe server running LDAProblem: a pull carries the rows of the
    worker's own words (4-byte keys, 8-byte values), not the whole table."""
    corpus, phi, _ = synthetic
    problem = LDAProblem(corpus, 8, alpha=0.5, beta=0.01)
    res = simlib.run(problem, "ssp:1", substrate="pipes", n_workers=2, steps=40, seed=1)
    problem.check_counts(res.params)
    n_wk, n_k = problem.split(res.params)
    assert topic_match(phi, topic_word(n_wk, n_k, 0.01))[0] >= 0.8
    assert max(u.clock_lag for u in res.trace.updates) <= 1
    shards = problem.shards(2)
    for w, shard in enumerate(shards):  # each pull: a small header, then 8 bytes per value of the worker's rows
        recv = [s.nbytes for s in res.trace.spans if s.kind == "recv" and s.worker == w]
        assert [b for b in recv if b > 64] == [8 * len(problem.keys(shard))] * 40
    assert all(len(problem.keys(shard)) < problem.n_params for shard in shards)


def test_shards_cover_the_corpus_evenly(synthetic):
    corpus, _, _ = synthetic
    b = shard_documents(corpus, 3)
    assert b[0] == 0 and b[-1] == corpus.n_docs and np.all(np.diff(b) > 0)
    tokens = np.diff(corpus.offsets[b])
    assert tokens.max() - tokens.min() < 3 * np.diff(corpus.offsets).max()


def test_a_failing_worker_gives_a_clear_error_and_leaves_nothing(synthetic):
    corpus, _, _ = synthetic
    before = _segments()
    with pytest.raises(WorkerError, match="injected failure in worker 1 at clock 3") as info:
        train_parallel(corpus, 8, n_sweeps=10, n_workers=2, protocol="ssp", staleness=1, fail_at=(1, 3), timeout=60)
    assert info.value.worker_id == 1
    assert multiprocessing.active_children() == []
    assert _segments() <= before


def test_a_killed_worker_is_reported_and_cleaned_up(synthetic, sigkill_a_worker):
    corpus, _, _ = synthetic
    before = _segments()
    with sigkill_a_worker(delay=0.2), pytest.raises(WorkerDied, match="killed by signal 9"):
        train_parallel(corpus, 8, n_sweeps=100_000, n_workers=2, straggler=(0, 0.01), timeout=60)
    assert multiprocessing.active_children() == []
    assert _segments() <= before


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n_topics=0), "n_topics"),
        (dict(alpha=0.0), "alpha"),
        (dict(beta=-1.0), "beta"),
        (dict(protocol="ssp:x"), "protocol"),
        (dict(protocol=Protocol("bsp", backup_workers=1)), "protocol"),
        (dict(protocol="bsp", staleness=2), "staleness"),
        (dict(n_workers=10_000), "n_workers"),
        (dict(straggler=(5, 0.1)), "straggler"),
    ],
)
def test_bad_configuration_fails_before_any_process_starts(synthetic, kwargs, field):
    corpus, _, _ = synthetic
    args = dict(n_topics=8, n_sweeps=2, n_workers=2) | kwargs
    with pytest.raises(ValueError, match=field):
        train_parallel(corpus, **args)
    assert multiprocessing.active_children() == []


def test_protocol_specs_and_tau(synthetic):
    corpus, _, _ = synthetic
    for protocol in ("ssp:1", Protocol.parse("SSP(1)")):
        run = train_parallel(corpus, 8, n_sweeps=6, n_workers=2, protocol=protocol, timeout=60)
        assert run.trace.meta["protocol"] == "ssp:1"
        assert max(u.clock_lag for u in run.trace.updates) <= 1
        # while a worker samples clock c (read once clock c - s was complete), the other can push its
        # clocks c - s .. c + s: tau <= 2s + 1 = 3 at SSP(1) with two workers
        assert all(0 <= u.staleness <= 3 for u in run.trace.updates)
        _assert_consistent(corpus, run, 8)
    bsp = train_parallel(corpus, 8, n_sweeps=6, n_workers=2, protocol="bsp", timeout=60)
    assert {u.clock_lag for u in bsp.trace.updates} == {0}
    assert all(0 <= u.staleness <= 1 for u in bsp.trace.updates)  # only the other worker's push of this clock
    free = train_parallel(corpus, 8, n_sweeps=6, n_workers=2, protocol="async", timeout=60)
    _assert_consistent(corpus, free, 8)


def test_untracked_run_reports_the_exact_final_log_likelihood(synthetic):
    corpus, _, _ = synthetic
    run = train_parallel(corpus, 8, alpha=0.5, n_sweeps=5, n_workers=2, record_every=None, timeout=60)
    assert [q.step for q in run.trace.quality] == [0, 5]
    n_dk, n_wk, n_k = count_tables(corpus, run.z, 8)
    assert run.log_likelihood == pytest.approx(log_likelihood(n_dk, n_wk, n_k, 0.5, 0.01), rel=1e-12)
    assert run.tokens_per_s > 0


def test_ctrl_c_over_pipes_ends_promptly_and_cleanly():
    """A real SIGINT to LDA on the pipe server (LDA's own pipe server thread once hung here, blocked
    sending to a dead worker; the contract's server replaced it)."""
    import random

    import faultkit

    driver = faultkit.Driver("lda-pipe")
    rng = random.Random(19)
    try:
        outcomes = [driver.inject("int-parent", rng, window=1.0) for _ in range(4)]
    finally:
        driver.close()
    problems = [p for o in outcomes for p in faultkit.check(o, "lda-pipe")]
    assert problems == []
    assert all(o.error == "KeyboardInterrupt" and o.seconds_after_fault < faultkit.PROMPT for o in outcomes)
