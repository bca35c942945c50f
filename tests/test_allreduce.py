"""Protocol 'allreduce' (simlib.parallel.allreduce and each substrate's transport): the math of one process on the
global batch, one span per bucket, the collectives themselves, and what it refuses."""
import time

import numpy as np
import pytest

import simlib
from simlib.parallel.allreduce import PAIR_DIRECT_BYTES, TSO, Ring, ShmAllReduce
from simlib.parallel.group import WorkerGroup
from simlib.parallel.shm import live_segments
from simlib.problems.mlp import MLPProblem
from simlib.worker import Bucket, Compute, Plan, Pull, Reduced, allreduce_worker

from allreduce_kit import BATCH, LR, N, STEPS, one_process, sends

QUIET = {"sim": {}, "pipes": {}, "shm": {}, "gpu": {"xp": "numpy"}, "ray": {"num_cpus": 2}}


@pytest.fixture(scope="module")
def mlp():
    return MLPProblem(hidden=(32, 16))  # layers of 2080, 528 and 170 parameters


def bucket_sizes(prob, bucket_bytes):
    """Parameters per bucket: layers last first, a bucket closed once it holds bucket_bytes."""
    sizes, held = [], 0
    for sl in reversed(prob.layers):
        held += sl.stop - sl.start
        if held * 8 >= bucket_bytes:
            sizes, held = sizes + [held], 0
    return sizes + ([held] if held else [])


@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm", "gpu"])
def test_every_replica_takes_one_process_step_on_the_global_batch_and_each_bucket_is_its_own_span(mlp, substrate):
    res = simlib.run(mlp, "allreduce", substrate=substrate, n_workers=N, steps=STEPS, batch_size=BATCH, lr=LR,
                     bucket_bytes=2000, **QUIET[substrate])
    expected = one_process(mlp)
    np.testing.assert_allclose(res.params, expected, rtol=1e-6, atol=1e-9 * np.abs(expected).max())
    sizes = bucket_sizes(mlp, 2000)
    assert sizes == [698, 2080]  # the last two layers fill the first bucket, the first layer the second
    for i in range(N):
        for c in range(STEPS):
            spans = sends(res, i, c)
            assert len(spans) == len(sizes)
            if substrate != "sim":  # the simulator counts a ring's bytes on the wire: 2 (n - 1) / n x 4 B a value
                assert sorted(s.nbytes for s in spans) == [8 * k for k in sizes]
    assert len(res.trace.updates) == N * STEPS and {u.staleness for u in res.trace.updates} == {0}
    if substrate in ("pipes", "shm"):
        assert res.measured["replica_spread"] == 0.0  # every replica added the very same sums


def test_the_simulator_rings_each_bucket_and_overlap_hides_all_but_the_last_ring(mlp):
    """No jitter: a step is its compute T plus each bucket's ring in turn, or with overlap T plus the last ring
    (the first ring, 698 values, ends before the first layer's backward does)."""
    from simlib.sim import SimConfig, ring_allreduce_time

    cluster = {"bandwidth": 2e6, "latency": 1e-4}
    runs = {ov: simlib.run(mlp, "allreduce", substrate="sim", n_workers=N, steps=3, batch_size=BATCH, lr=LR,
                           bucket_bytes=2000, overlap=ov, **cluster) for ov in (False, True)}
    cfg = SimConfig()
    T = cfg.compute_overhead + cfg.compute_per_unit * mlp.work(mlp.batch(mlp.shards(N)[0], 0, BATCH))
    rings = [ring_allreduce_time(N, k * cfg.value_bytes, **cluster) for k in bucket_sizes(mlp, 2000)]
    assert runs[False].trace.makespan == pytest.approx(3 * (T + sum(rings)))
    assert runs[True].trace.makespan == pytest.approx(3 * (T + rings[-1]))
    np.testing.assert_array_equal(runs[True].params, runs[False].params)


@pytest.mark.parametrize("substrate", ["pipes", "shm"])
def test_without_buckets_or_overlap_the_math_is_the_same(mlp, substrate):
    expected = one_process(mlp)
    for extra in ({}, {"bucket_bytes": 1, "overlap": False}):
        res = simlib.run(mlp, "allreduce", substrate=substrate, n_workers=N, steps=STEPS, batch_size=BATCH, lr=LR,
                         **extra)
        np.testing.assert_allclose(res.params, expected, rtol=1e-6, atol=1e-9 * np.abs(expected).max())
        assert len(sends(res, 0, 1)) == (1 if not extra else len(mlp.layers))  # 1 byte: a bucket a layer
    assert live_segments() == []


@pytest.mark.parametrize("substrate", ["pipes", "shm", "gpu"])
def test_a_sparse_problem_is_summed_as_the_simulator_sums_it(small_problem, substrate):
    """Logistic regression's updates touch a batch's keys only: each all-reduced as a dense vector, as in the ring."""
    opts = {"n_workers": 3, "steps": 4, "batch_size": 16, "lr": 0.5}
    ring = simlib.run(small_problem, "allreduce", substrate="sim", **opts)
    res = simlib.run(small_problem, "allreduce", substrate=substrate, **opts, **QUIET[substrate])
    np.testing.assert_allclose(res.params, ring.params, rtol=1e-9, atol=1e-12)
    assert not np.allclose(res.params, small_problem.init_params())
    with pytest.raises(ValueError, match="bucket_bytes: .* has no backward_layers"):
        simlib.run(small_problem, "allreduce", substrate=substrate, bucket_bytes=1000, **opts, **QUIET[substrate])


def test_a_bucket_goes_out_before_the_backward_pass_reaches_the_first_layer(mlp):
    """The program's order: the forward and the last layers' backward, their bucket, then the first layer and its
    bucket (the last Compute finds the backward pass over)."""
    program = allreduce_worker(mlp, mlp.shards(1)[0], Plan(1, BATCH, LR), bucket_bytes=2000)
    kinds, value = [], None
    while True:
        try:
            effect = program.send(value)
        except StopIteration:
            break
        kinds.append(type(effect).__name__ if type(effect) is not Bucket else f"Bucket{effect.index}")
        value = ((mlp.init_params(), 0) if type(effect) is Pull else
                 effect.fn(*effect.args) if type(effect) is Compute else None)
    assert kinds == ["Pull", "Compute", "Compute", "Bucket0", "Compute", "Bucket1", "Compute", "Reduced"]
    assert type(effect) is Reduced


def _sum_three(i, n, x, reduce):
    """A long vector, then a short one and the long one again, summed over itself as the replicas sum their buckets
    (shm: reduce-scatter, direct, reduce-scatter)."""
    again = x * (i + 1)
    return reduce(x * (i + 1)), reduce(x[:100] * (i + 1)), again, reduce(again, again) is again


@pytest.mark.parametrize("collective", ["shm", "ring"])
def test_three_processes_sum_a_vector_longer_than_a_pipe_and_the_shared_segment(collective):
    x = np.arange(100_003, dtype=np.float64)  # 800 KB: more than a pipe holds; three parts of unequal length
    with WorkerGroup(3) as group:
        if collective == "shm":
            ranks = ShmAllReduce(group, 3, 40_000).ranks()  # the vector goes in three chunks
        else:
            pairs = [group.channel_pair() for _ in range(3)]
            ranks = [Ring(i, 3, pairs[i - 1][1], pairs[i][0]) for i in range(3)]
        out = group.run(_sum_three, x, worker_args=[(r,) for r in ranks], timeout=60)
    for long, short, again, in_place in out:
        np.testing.assert_array_equal(long, 6 * x)
        np.testing.assert_array_equal(short, 6 * x[:100])
        np.testing.assert_array_equal(again, 6 * x)
        assert in_place


def _sum_in_turn(i, n, lengths, reduce):
    """Vectors of each length in turn, each call's values its own (a slot read late would show another call's)."""
    return [reduce(np.random.default_rng([c, i]).standard_normal(m)) for c, m in enumerate(lengths)]


@pytest.mark.parametrize("blocking", [False, True])
def test_two_processes_sum_long_and_short_vectors_in_turn_bit_for_bit(blocking):
    """Above PAIR_DIRECT_BYTES a call reduces in place on one set of slots, below it the sets alternate: every mix is
    exact, at the flags' barrier and at the semaphore one an overlapping helper thread waits at."""
    long = PAIR_DIRECT_BYTES // 8 + 1_001
    lengths = [long] * 4 + [50, long, 3_000, 70] + [long] * 6
    with WorkerGroup(2) as group:
        ranks = ShmAllReduce(group, 2, long, blocking=blocking).ranks()
        assert all((r.barrier is not None) == (blocking or not TSO) for r in ranks)
        out = group.run(_sum_in_turn, lengths, worker_args=[(r,) for r in ranks], timeout=60)
    for c, m in enumerate(lengths):
        want = np.random.default_rng([c, 0]).standard_normal(m) + np.random.default_rng([c, 1]).standard_normal(m)
        assert np.array_equal(out[0][c], want) and np.array_equal(out[1][c], want)


@pytest.mark.parametrize("feature, kwargs", [
    ("backup_workers", {"backup_workers": 1}),
    ("staleness_aware", {"staleness_aware": True}),
    ("accumulation", {"accumulation": 4}),
    ("read_rule", {"read_rule": lambda clock, completed, bound: True}),
    ("clock_batches", {"clock_batches": 2}),
    ("compression", {"compression": "topk:0.5", "bucket_bytes": 2000}),
])
def test_what_cannot_mean_anything_under_allreduce_is_refused_by_name(mlp, feature, kwargs):
    from simlib.substrates import WITH_ALLREDUCE

    with pytest.raises(ValueError, match=feature) as err:
        simlib.run(mlp, "allreduce", substrate="sim", n_workers=3, steps=2, **kwargs)
    assert feature == "backup_workers" or WITH_ALLREDUCE[feature] in str(err.value)


def test_bad_or_misplaced_bucket_options_are_named(mlp):
    with pytest.raises(ValueError, match="bucket_bytes"):
        simlib.run(mlp, "bsp", substrate="shm", n_workers=2, steps=2, bucket_bytes=1000)
    with pytest.raises(ValueError, match="overlap"):
        simlib.run(mlp, "ssp:1", substrate="pipes", n_workers=2, steps=2, overlap=False)
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="bucket_bytes"):
            simlib.run(mlp, "allreduce", substrate="shm", n_workers=2, steps=2, bucket_bytes=bad)
    with pytest.raises(ValueError, match="compression"):  # the simulator models it without buckets only
        simlib.run(mlp, "allreduce", substrate="pipes", n_workers=2, steps=2, compression="topk:0.5")
    with pytest.raises(ValueError, match="only SSP takes a bound"):
        simlib.Protocol.parse("allreduce:2")


@pytest.mark.parametrize("substrate", ["sim", "pipes", "shm", "gpu", "ray"])
def test_one_bound_on_bucket_bytes_on_every_substrate(mlp, substrate):
    """Up to MAX_BUCKET_BYTES a bucket as large as the gradient is one all-reduce; past it every substrate refuses,
    by the same words, before anything starts (the simulator refused and the others ran)."""
    from simlib.protocol import MAX_BUCKET_BYTES

    if substrate == "ray":  # its options are the worker program's and its own, checked before Ray starts
        from simlib.substrates.ray import RayOptions

        RayOptions(bucket_bytes=MAX_BUCKET_BYTES)
        with pytest.raises(ValueError, match=rf"bucket_bytes must be an integer in \[1, {MAX_BUCKET_BYTES}\]"):
            RayOptions(bucket_bytes=MAX_BUCKET_BYTES + 1)
        return
    opts = dict(n_workers=2, steps=1, batch_size=BATCH, lr=LR, **QUIET[substrate])
    res = simlib.run(mlp, "allreduce", substrate=substrate, bucket_bytes=MAX_BUCKET_BYTES, **opts)
    assert len(sends(res, 0, 0)) == 1
    for bad in (MAX_BUCKET_BYTES + 1, 2**64):
        with pytest.raises(ValueError, match=rf"bucket_bytes must be an integer in \[1, {MAX_BUCKET_BYTES}\], got {bad}"):
            simlib.run(mlp, "allreduce", substrate=substrate, bucket_bytes=bad, **opts)


class _FailsOnWorkerOne:
    """The MLP, except that worker 1's backward pass raises at its second step."""

    def __init__(self, problem):
        self.inner = problem

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def backward_layers(self, params, batch):
        if batch[0] == self.inner.shards(2)[1][0] + BATCH:
            raise RuntimeError("a broken backward pass")
        return self.inner.backward_layers(params, batch)


@pytest.mark.parametrize("substrate", ["pipes", "shm"])
def test_a_worker_that_fails_mid_step_fails_the_run_at_once_naming_it(mlp, substrate):
    """Its peer waits at a barrier (or a pipe) for a bucket that never comes: the run still ends within seconds."""
    from simlib.parallel.group import WorkerError

    t = time.perf_counter()
    with pytest.raises(WorkerError, match="worker 1 failed: RuntimeError: a broken backward pass"):
        simlib.run(_FailsOnWorkerOne(mlp), "allreduce", substrate=substrate, n_workers=2, steps=STEPS,
                   batch_size=BATCH, lr=LR, bucket_bytes=2000, timeout=60)
    assert time.perf_counter() - t < 30 and live_segments() == []


def test_a_straggler_holds_every_replica_back(mlp):
    """Worker 1 sleeps 50 ms after each step's backward pass: worker 0 waits for its buckets in every step."""
    res = simlib.run(mlp, "allreduce", substrate="shm", n_workers=N, steps=3, batch_size=BATCH, lr=LR,
                     bucket_bytes=2000, overlap=False, straggler=(1, 0.05))
    np.testing.assert_allclose(res.params, one_process(mlp, steps=3), rtol=1e-6)
    for c in range(1, 3):  # worker 1 sleeps after its part of step c - 1's last bucket, before its step c
        last = max(s.start for s in sends(res, 0, c - 1))
        first = min(s.end for s in sends(res, 0, c))
        assert first - last >= 0.05
    with pytest.raises(ValueError, match="hot_keys"):
        simlib.run(mlp, "allreduce", substrate="shm", n_workers=N, steps=2, hot_keys=10)


@pytest.mark.parametrize("substrate", ["pipes", "gpu"])
def test_lda_under_allreduce_returns_the_topics_its_counts_count(substrate):
    """Every replica adds the sum of every worker's moves, so the counts are those of all the workers' topics; the
    topics come back in Result.measured['local'] as on the parameter-server paths (they were dropped, and
    LDAProblem.assignments asked for a real substrate)."""
    from simlib.problems.lda import count_tables, make_synthetic_corpus
    from simlib.problems.lda_table import LDAProblem

    corpus = make_synthetic_corpus(n_docs=40, n_topics=3, n_words=30, doc_length=20, seed=0)[0]
    prob = LDAProblem(corpus, 3)
    res = simlib.run(prob, "allreduce", substrate=substrate, n_workers=2, steps=3, **QUIET[substrate])
    _, n_wk, n_k = count_tables(corpus, prob.assignments(res), 3)
    np.testing.assert_array_equal(prob.split(res.params)[0], n_wk)
    np.testing.assert_array_equal(prob.split(res.params)[1], n_k)
