"""AD-LDA on real processes through the contract: ``simlib.run(LDAProblem(...), protocol, substrate="shm"|"pipes")``.

Consistent counts, the SSP bound with a real straggler, topic recovery, clean failures.
"""
import multiprocessing
import os

import numpy as np
import pytest

import simlib
from simlib.parallel import WorkerDied, WorkerError
from simlib.data.corpus import shard_documents
from simlib.problems.lda import (count_tables, deal_documents, log_likelihood, make_synthetic_corpus, topic_match,
                                topic_word)
from simlib.problems.lda_table import LDAProblem
from simlib.protocol import Protocol


@pytest.fixture(scope="module")
def synthetic():
    return make_synthetic_corpus(seed=0)


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"simlib_{os.getpid()}_")} if os.path.isdir("/dev/shm") else set()


def lda(corpus, protocol="bsp", substrate="shm", n_topics=8, alpha=0.5, **options):
    """(problem, result) of AD-LDA through simlib.run."""
    problem = LDAProblem(corpus, n_topics, alpha=alpha, beta=0.01)
    return problem, simlib.run(problem, protocol, substrate=substrate, **({"n_workers": 2, "timeout": 60} | options))


@pytest.mark.parametrize("n_workers, protocol", [(1, "bsp"), (2, "bsp"), (2, "ssp:2")])
def test_topics_recovered_and_counts_consistent(synthetic, n_workers, protocol):
    corpus, phi, _ = synthetic
    problem, res = lda(corpus, protocol, n_workers=n_workers, steps=40, seed=1)
    problem.check_counts(res.params)
    n_wk, n_k = problem.split(res.params)
    # 0.86-0.99 over loaded and idle runs: a parallel Gibbs chain's end point varies with the races.
    assert topic_match(phi, topic_word(n_wk, n_k, 0.01))[0] >= 0.8
    t = res.trace
    assert t.substrate == "shm" and t.metric == "log_likelihood" and not t.lower_is_better
    assert t.quality[-1].value > t.quality[0].value  # the chain climbed from the random start
    assert len(t.updates) == n_workers * 40


@pytest.mark.parametrize("substrate", ["shm", "pipes"])
def test_ssp_lets_the_fast_worker_use_the_slack_and_never_more(synthetic, substrate):
    corpus, _, _ = synthetic
    s, n = 2, 12
    # Worker 0 is 20 ms slower per clock, so worker 1 runs ahead as far as the bound allows.
    problem, res = lda(corpus, "ssp:2", substrate, steps=n, straggler=(0, 0.02), seed=2)
    updates = res.trace.updates
    assert sorted((u.worker, u.step) for u in updates) == [(w, c) for w in range(2) for c in range(n)]
    assert max(u.clock_lag for u in updates) == s  # the fast worker did use the slack
    assert min(u.clock_lag for u in updates) >= 0
    # tau counts the other worker's pushes applied between a pull and its push
    assert min(u.staleness for u in updates) >= 0 and max(u.staleness for u in updates) >= 1
    problem.check_counts(res.params)


@pytest.mark.parametrize("substrate", ["shm", "pipes"])
def test_bsp_waits_for_the_straggler_and_is_never_stale(synthetic, substrate):
    corpus, _, _ = synthetic
    _, res = lda(corpus, "bsp", substrate, n_topics=8, steps=6, straggler=(0, 0.02))
    assert {u.clock_lag for u in res.trace.updates} == {0}
    # worker 1 waited most of the straggler's delay: polling the clocks on shm, for the held reply over pipes
    waited = sum(sp.end - sp.start for sp in res.trace.spans if sp.worker == 1
                 and sp.kind == ("wait" if substrate == "shm" else "recv"))
    assert waited > 5 * 0.02 * 0.5


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
    b = shard_documents(corpus.offsets, 3)
    assert b[0] == 0 and b[-1] == corpus.n_docs and np.all(np.diff(b) > 0)
    tokens = np.diff(corpus.offsets[b])
    assert tokens.max() - tokens.min() < 3 * np.diff(corpus.offsets).max()


def test_dealt_shards_hold_every_part_of_the_corpus_in_even_shares(synthetic):
    corpus, _, _ = synthetic
    parts = deal_documents(corpus, 3, pieces=4)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(corpus.n_docs))
    lengths = np.diff(corpus.offsets)
    tokens = [lengths[p].sum() for p in parts]
    assert max(tokens) - min(tokens) < 4 * lengths.max()
    assert all(p.min() < corpus.n_docs // 3 and p.max() >= 2 * corpus.n_docs // 3 for p in parts)  # front and back
    problem = LDAProblem(corpus, 8)
    for shard, own in zip(problem.shards(3), deal_documents(corpus, 3)):  # its dealt documents, with their start topics
        np.testing.assert_array_equal(shard.state.corpus.words, np.concatenate([corpus.doc(d) for d in own]))
        np.testing.assert_array_equal(shard.state.z, np.concatenate([problem.z0[corpus.offsets[d]:corpus.offsets[d + 1]]
                                                                     for d in own]))


class FailingLDA(LDAProblem):
    """LDA whose worker 1 raises at clock 3 (in get / step / add, or in place on shm): the clean failure path."""

    def step(self, values, batch, keys, lr):
        if batch.worker == 1 and batch.clock == 3:
            raise RuntimeError("injected failure in worker 1 at clock 3")
        return super().step(values, batch, keys, lr)

    def local_steps(self, table, shard, first, count, batch_size, lr, **shared):
        if shard.worker == 1 and first <= 3 < first + count:
            raise RuntimeError("injected failure in worker 1 at clock 3")
        super().local_steps(table, shard, first, count, batch_size, lr, **shared)


@pytest.mark.parametrize("substrate", ["shm", "pipes"])
def test_a_failing_worker_gives_a_clear_error_and_leaves_nothing(synthetic, substrate):
    corpus, _, _ = synthetic
    before = _segments()
    with pytest.raises(WorkerError, match="injected failure in worker 1 at clock 3") as info:
        simlib.run(FailingLDA(corpus, 8), "ssp:1", substrate=substrate, n_workers=2, steps=10, timeout=60)
    assert "worker 1" in str(info.value).split(":")[0]
    assert multiprocessing.active_children() == []
    assert _segments() <= before


def test_a_killed_worker_is_reported_and_cleaned_up(synthetic, sigkill_a_worker):
    corpus, _, _ = synthetic
    before = _segments()
    with sigkill_a_worker(delay=0.2), pytest.raises(WorkerDied, match="killed by signal 9"):
        lda(corpus, "bsp", steps=100_000, straggler=(0, 0.01))
    assert multiprocessing.active_children() == []
    assert _segments() <= before


@pytest.mark.parametrize(
    "make, options, field",
    [
        (dict(n_topics=0), {}, "n_topics"),
        (dict(alpha=0.0), {}, "alpha"),
        (dict(beta=-1.0), {}, "beta"),
        ({}, dict(protocol="ssp:x"), "protocol"),
        ({}, dict(protocol=Protocol("bsp", backup_workers=1)), "backup_workers"),
        ({}, dict(n_workers=10_000), "n_workers"),
        ({}, dict(straggler=(5, 0.1)), "straggler"),
        ({}, dict(compression="onebit", substrate="sim"), "compression"),
    ],
)
def test_bad_configuration_fails_before_any_process_starts(synthetic, make, options, field):
    corpus, _, _ = synthetic
    with pytest.raises(ValueError, match=field):
        problem = LDAProblem(corpus, **({"n_topics": 8} | make))
        simlib.run(problem, options.pop("protocol", "bsp"), **({"substrate": "shm", "n_workers": 2, "steps": 2} | options))
    assert multiprocessing.active_children() == []


def test_protocols_bound_the_lag_and_tau(synthetic):
    corpus, _, _ = synthetic
    for protocol in ("ssp:1", Protocol.parse("SSP(1)")):
        problem, res = lda(corpus, protocol, n_topics=8, steps=6)
        assert res.trace.meta["protocol"] == "ssp:1"
        assert max(u.clock_lag for u in res.trace.updates) <= 1
        # while a worker samples clock c (read once clock c - s was complete), the other can push its
        # clocks c - s .. c + s: tau <= 2s + 1 = 3 at SSP(1) with two workers
        assert all(0 <= u.staleness <= 3 for u in res.trace.updates)
        problem.check_counts(res.params)
    _, bsp = lda(corpus, "bsp", n_topics=8, steps=6)
    assert {u.clock_lag for u in bsp.trace.updates} == {0}
    assert all(0 <= u.staleness <= 1 for u in bsp.trace.updates)  # only the other worker's push of this clock
    problem, free = lda(corpus, "async", n_topics=8, steps=6)
    problem.check_counts(free.params)


@pytest.mark.parametrize("substrate", ["shm", "pipes"])
def test_the_workers_assignments_come_back_and_give_the_full_log_likelihood(synthetic, substrate):
    corpus, _, _ = synthetic
    problem, res = lda(corpus, "ssp:1", substrate, steps=5)
    z = problem.assignments(res)
    assert z.shape == (corpus.n_tokens,) and z.min() >= 0 and z.max() < 8
    n_dk, n_wk, n_k = count_tables(corpus, z, 8)
    np.testing.assert_array_equal(problem.split(res.params)[0], n_wk)  # the table is exactly the workers' counts
    assert problem.log_likelihood(res.params, z) == pytest.approx(log_likelihood(n_dk, n_wk, n_k, 0.5, 0.01), rel=1e-12)
    with pytest.raises(ValueError, match="holds no workers' assignments"):
        problem.assignments(simlib.run(problem, "bsp", substrate="sim", n_workers=2, steps=1))


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


@pytest.mark.parametrize("kernel, mh_steps", [("sparse", 4), ("mh", 2), ("word", 4)])
def test_one_worker_in_place_is_the_serial_sampler(synthetic, kernel, mh_steps):
    """On shm, one worker samples on the shared table itself: the run is the serial sweep loop, token for token
    (benchmarks/lda.py --time-to-target counts a 1-process run's sweeps to a log-likelihood on the serial chain)."""
    from simlib.problems.lda_gibbs import GibbsState

    corpus, _, _ = synthetic
    problem = LDAProblem(corpus, 8, alpha=0.5, beta=0.01, kernel=kernel, mh_steps=mh_steps)
    res = simlib.run(problem, "bsp", substrate="shm", n_workers=1, steps=5, timeout=60)
    assert res.trace.meta["path"] == "in place"
    state = GibbsState(corpus, 8, 0.5, 0.01, problem.z0, kernel=kernel, mh_steps=mh_steps)
    for c in range(5):
        state.sweep(seed=c)  # the sweep seed of worker 0 at clock c, with seed 0
    np.testing.assert_array_equal(problem.assignments(res), state.z)
    np.testing.assert_array_equal(problem.split(res.params)[0], state.n_wk)


@pytest.mark.parametrize("kernel", ["sparse", "mh", "alias", "dense", "word"])
@pytest.mark.parametrize("protocol", ["bsp", "async"])
def test_in_place_syncs_within_a_sweep_and_keeps_the_counts_exact(synthetic, kernel, protocol):
    """Two workers sampling on the table's rows block by block, racing on n_k: the table is the recount of z."""
    corpus, _, _ = synthetic
    problem = LDAProblem(corpus, 8, alpha=0.5, beta=0.01, kernel=kernel, sync_every=300)
    assert len(problem.shards(2)[0].blocks) > 20  # many syncs per sweep
    res = simlib.run(problem, protocol, substrate="shm", n_workers=2, steps=8, timeout=60)
    z = problem.assignments(res)
    _, n_wk, n_k = count_tables(corpus, z, 8)
    np.testing.assert_array_equal(problem.split(res.params)[0], n_wk)
    np.testing.assert_array_equal(problem.split(res.params)[1], n_k)
    assert problem.log_likelihood(res.params, z) > problem.log_likelihood(problem.init_params(), problem.z0)


def test_in_place_the_word_kernels_shared_lists_are_each_words_topics(synthetic):
    """Two workers (taking turns here, in one process) keep one list of each word's topics beside the table, each
    word's kept by the worker holding its block: after their sweeps every word is listed, with exactly its topics."""
    from simlib.problems.lda_gibbs import check_word_lists

    corpus, _, _ = synthetic
    problem = LDAProblem(corpus, 8, alpha=0.5, beta=0.01, kernel="word", sync_every=300)
    table, shards = problem.init_table(), problem.shards(2)
    shared = np.zeros(problem.in_place_words(2), np.int32)
    for c in range(3):
        for shard in shards:
            problem.local_steps(table, shard, c, 1, 1, 0.0, shared=shared)
    problem.check_counts(table)
    lists, listed = problem._word_lists(shared[len(shards[0].blocks) - 1:])
    assert (listed[np.unique(corpus.words)] > 0).all()
    check_word_lists(lists, listed, problem.split(table)[0])


def test_in_place_a_held_block_is_left_alone_until_its_lock_is_free(synthetic):
    """A block another worker holds: its rows stay as they are while the sweep does the rest, then it is swept too."""
    import threading

    corpus, _, _ = synthetic
    problem = LDAProblem(corpus, 8, alpha=0.5, beta=0.01, sync_every=300)
    shard = problem.shards(2)[0]
    table, K = problem.init_table(), problem.K
    shared = np.zeros(problem.in_place_words(2), np.int32)
    locks = shared[:len(shard.blocks) - 1]
    ptr = shard.state.word_ptr[shard.blocks]
    j = int(np.flatnonzero(np.diff(ptr) > 0)[1])  # a block the shard has tokens in, not its first
    held = slice(shard.blocks[j] * K, shard.blocks[j + 1] * K)
    before = table.copy()
    locks[j] = 2  # held by worker 1
    sweep = threading.Thread(target=problem.local_steps, args=(table, shard, 0, 1, 1, 0.0), kwargs={"shared": shared})
    sweep.start()
    others = [slice(shard.blocks[b] * K, shard.blocks[b + 1] * K) for b in np.flatnonzero(np.diff(ptr) > 0) if b != j]
    for _ in range(600):  # until every other block's rows have moved (the sweep cannot end while the lock is held)
        if all(not np.array_equal(table[r], before[r]) for r in others) or not sweep.is_alive():
            break
        sweep.join(0.05)
    assert sweep.is_alive() and all(not np.array_equal(table[r], before[r]) for r in others)
    np.testing.assert_array_equal(table[held], before[held])
    locks[j] = 0
    sweep.join(30)
    assert not sweep.is_alive() and not np.array_equal(table[held], before[held]) and not locks.any()
    problem.check_counts(table)


def test_in_place_refuses_a_table_of_another_type(synthetic):
    corpus, _, _ = synthetic
    problem = LDAProblem(corpus, 8)
    with pytest.raises(ValueError, match="table must be the int32 table"):
        problem.local_steps(problem.init_params(), problem.shards(1)[0], 0, 1, 1, 0.0)
    with pytest.raises(ValueError, match="sync_every"):
        LDAProblem(corpus, 8, sync_every=0)
