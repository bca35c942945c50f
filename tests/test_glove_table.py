"""GloVe on the contract: one worker equals the sequential kernel, in place or by get / step / add; two Hogwild
workers on shared memory reach the serial cost; more simulated workers are predicted faster."""
import numpy as np
import pytest

from simlib.contract import serial_reference
from simlib.problems.glove import (
    GloveConfig, GloveParams, adagrad_kernel, entry_terms, epoch_order,
)
from glove_reference import train
import simlib
from simlib.problems.glove_table import GloveProblem
from simlib.course.glove_twin import predict_speedup


def test_one_worker_equals_the_sequential_kernel(cooc):
    cfg = GloveConfig(dim=8, seed=3)
    batch, steps = 64, 50
    assert batch * steps <= cooc.nnz  # batches are consecutive slices of the epoch order
    prob = GloveProblem(cooc, cfg)
    w = prob.init_params()
    for s in range(steps):
        b = prob.batch((0, cooc.nnz), s, batch)
        k = prob.keys(b)
        k, d = prob.step(w[k], b, k, cfg.lr)
        w[k] += d
    ref = GloveParams.init(cooc.n_words, cfg)
    logx, fx = entry_terms(cooc.values, cfg)
    order = epoch_order(cooc.nnz, cfg.seed, 0)[: batch * steps]
    adagrad_kernel((cooc.rows, cooc.cols, logx, fx), order, ref.arrays(), np.float32(cfg.lr), np.float32(cfg.grad_clip))
    got = prob.unflatten(w)
    for name in GloveParams.ARRAYS:
        assert np.allclose(getattr(got, name), getattr(ref, name), rtol=1e-6, atol=1e-7), name


@pytest.mark.parametrize("batch_size, steps, chunk", [(1, 3_000, 7), (64, 100, 3), (1_000, 250, 40)])
def test_local_steps_equal_get_step_add_bit_for_bit(cooc, batch_size, steps, chunk):
    """The in-place kernel over chunks of steps (crossing passes: 250 x 1,000 entries is 2.5 passes) is the serial replay."""
    prob = GloveProblem(cooc, GloveConfig(dim=8, seed=3))
    ref = serial_reference(prob, steps=steps, batch_size=batch_size, lr=0.05)
    w, shard = prob.init_params(), prob.shards(1)[0]
    for first in range(0, steps, chunk):
        prob.local_steps(w, shard, first, min(chunk, steps - first), batch_size, 0.05)
    assert np.array_equal(w, ref)


def test_each_pass_takes_its_epoch_order(cooc):
    prob = GloveProblem(cooc, GloveConfig(dim=4))
    shard = (10, 110)
    batch = prob.batch(shard, 1, 150)  # positions 150 .. 299: the second half of pass 1, then pass 2
    np.testing.assert_array_equal(batch[:50], epoch_order(cooc.nnz, 0, 1)[60:110])
    np.testing.assert_array_equal(batch[50:], epoch_order(cooc.nnz, 0, 2)[10:110])


@pytest.fixture(scope="module")
def few_chapters():
    """Co-occurrences of the first 15 KJV chapters (about 22,000 entries): the serial reference steps one entry at a
    time through the worker program, 3 epochs of the 60-chapter set took 28 s of the suite."""
    from simlib.data import Vocabulary, load_kjv
    from simlib.problems.glove import count_cooccurrences

    docs = load_kjv().docs[:15]
    vocab = Vocabulary.build(docs, min_count=3)
    return count_cooccurrences(*vocab.encode_docs(docs), len(vocab), window=5)


def test_one_worker_on_shared_memory_trains_as_the_single_process_trainer(few_chapters):
    cooc = few_chapters
    cfg = GloveConfig(dim=16, epochs=3)
    prob = GloveProblem(cooc, cfg)
    res = simlib.run(prob, "async", substrate="shm", n_workers=1, steps=3 * prob.epoch_steps(1, 1), batch_size=1,
                     lr=cfg.lr)
    assert res.trace.meta["path"] == "in place" and res.params.dtype == np.float32  # the values' own precision
    reference = serial_reference(prob, steps=3 * cooc.nnz, batch_size=1, lr=cfg.lr)
    np.testing.assert_allclose(res.params, reference, rtol=1e-4, atol=1e-6)
    # the in-place kernel on the serial reference's float64 storage: the same steps, bit for bit
    table = prob.init_params()
    prob.local_steps(table, prob.shards(1)[0], 0, 3 * cooc.nnz, 1, cfg.lr)
    assert np.array_equal(table, reference)
    params, costs = train(cooc, cfg)  # float32 arrays, the same loop vectorised for them: equal to float32 rounding
    np.testing.assert_allclose(prob.epoch_costs(res), costs, rtol=1e-6)
    np.testing.assert_allclose(prob.unflatten(res.params).W, params.W, atol=1e-3)


@pytest.mark.parametrize("protocol", ["async", "bsp"])
def test_two_workers_on_shared_memory_reach_the_serial_cost(cooc, protocol):
    cfg = GloveConfig(dim=16, epochs=4)
    prob = GloveProblem(cooc, cfg)
    _, serial = train(cooc, cfg)
    batch = 1 if protocol == "async" else 512
    res = simlib.run(prob, protocol, substrate="shm", n_workers=2, steps=4 * prob.epoch_steps(2, batch),
                     batch_size=batch, lr=cfg.lr)
    costs = prob.epoch_costs(res)
    assert len(costs) == 4 and all(b < a for a, b in zip(costs, costs[1:])), costs
    assert abs(costs[-1] / serial[-1] - 1) < 0.02, (costs, serial)
    assert res.quality < res.trace.quality[0].value


def test_epoch_costs_need_the_in_place_path(cooc):
    prob = GloveProblem(cooc, GloveConfig(dim=4))
    res = simlib.run(prob, "async", substrate="sim", n_workers=2, steps=2, batch_size=16, lr=0.05)
    with pytest.raises(ValueError, match="substrate 'shm'"):
        prob.epoch_costs(res)


def test_simulated_run_lowers_the_cost(cooc):
    cfg = GloveConfig(dim=8)
    trace = simlib.run(GloveProblem(cooc, cfg), "async", substrate="sim", n_workers=2, steps=40, batch_size=256,
                       lr=cfg.lr).trace
    assert trace.quality[-1].value < 0.7 * trace.quality[0].value
    assert trace.summary()["bytes_sent"] > 0


def test_the_problems_own_epochs_are_the_runs_steps_unless_steps_are_given(cooc):
    """GloveConfig(epochs=...) was ignored: epochs=1 and epochs=50 both trained simlib.run's default 50 steps."""
    run = dict(substrate="sim", n_workers=2, batch_size=512)
    prob = GloveProblem(cooc, GloveConfig(dim=4, epochs=2))
    res = simlib.run(prob, "bsp", **run)
    assert res.trace.summary()["steps_per_worker"] == 2 * prob.epoch_steps(2, 512)
    np.testing.assert_array_equal(res.params, simlib.run(prob, "bsp", steps=2 * prob.epoch_steps(2, 512), **run).params)
    assert simlib.run(prob, "bsp", steps=3, **run).trace.summary()["steps_per_worker"] == 3  # steps= given: that many


@pytest.mark.parametrize("substrate", ["sim", "shm"])
def test_the_problems_own_lr_is_the_runs_unless_another_is_given(cooc, substrate):
    """GloveConfig(lr=...) was ignored: lr=1e6 and lr=0.05 gave the same parameters, trained at simlib.run's 0.5."""
    run = dict(substrate=substrate, n_workers=1, steps=4, batch_size=16)
    own = simlib.run(GloveProblem(cooc, GloveConfig(dim=4, lr=0.01)), "bsp", **run).params
    given = simlib.run(GloveProblem(cooc, GloveConfig(dim=4, lr=0.3)), "bsp", **run).params
    assert not np.array_equal(own, given)
    np.testing.assert_array_equal(own, simlib.run(GloveProblem(cooc, GloveConfig(dim=4, lr=0.01)), "bsp", lr=0.01,
                                                  **run).params)
    with pytest.raises(ValueError, match=r"^lr: simlib.run was given lr=0.5, but GloveProblem has its own lr=0.01"):
        simlib.run(GloveProblem(cooc, GloveConfig(dim=4, lr=0.01)), "bsp", lr=0.5, **run)


def test_prediction_two_workers_faster_when_compute_bound(cooc):
    pred = predict_speedup(cooc, GloveConfig(dim=8), updates_per_second=1e6, workers=(1, 2), batch_size=256, epochs=0.5)
    assert 1.6 < pred[2]["speedup"] <= 2.05
    slow_net = predict_speedup(cooc, GloveConfig(dim=8), updates_per_second=1e6, workers=(1, 2), batch_size=256,
                               epochs=0.5, latency=1e-3, bandwidth=1e6)
    assert slow_net[2]["speedup"] < pred[2]["speedup"]


def test_bad_rate_is_rejected(cooc):
    with pytest.raises(ValueError, match="updates_per_second"):
        predict_speedup(cooc, GloveConfig(dim=8), updates_per_second=0.0)


def test_vectors_larger_than_memory_are_refused_naming_dim(cooc):
    with pytest.raises(ValueError, match=r"dim: .* more than half the memory available .* use at most \d+"):
        GloveProblem(cooc, GloveConfig(dim=10**9))


def _pass_problem(n_tokens: int) -> tuple[GloveProblem, int]:
    """GloVe on random text (V = 5,000, window 10) and one pass's length in entries."""
    from simlib.problems.glove import GloveConfig, count_cooccurrences

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5_000, n_tokens).astype(np.int32)
    cooc = count_cooccurrences(ids, np.arange(0, n_tokens + 1, 1_000, dtype=np.int64), 5_000, window=10)
    return GloveProblem(cooc, GloveConfig(dim=50)), cooc.nnz


def test_a_pass_in_blocks_is_the_pass_in_one_call(monkeypatch):
    """local_steps cuts a pass into compiled calls of BLOCK entries: the parameters are the same to the bit."""
    import simlib.problems.glove_table as table

    problem, nnz = _pass_problem(20_000)
    one, blocks = problem.init_params(), problem.init_params()
    problem.local_steps(one, (0, nnz), 0, 1, nnz, 0.05)
    monkeypatch.setattr(table, "BLOCK", 1_000)
    problem.local_steps(blocks, (0, nnz), 0, 1, nnz, 0.05)
    assert nnz > 10 * 1_000
    np.testing.assert_array_equal(one, blocks)


def test_ctrl_c_stops_a_pass_between_blocks():
    """SIGINT 20 ms into a pass of millions of entries (a second or more): KeyboardInterrupt before the pass ends,
    so the AdaGrad accumulators (which only grow) have grown less than a whole pass grows them."""
    import signal

    problem, nnz = _pass_problem(300_000)
    g = slice(problem.offsets[4], None)  # gW, gC, gbw, gbc
    whole = problem.init_params()
    problem.local_steps(whole, (0, nnz), 0, 1, nnz, 0.05)
    stopped = problem.init_params()
    signal.setitimer(signal.ITIMER_REAL, 0.02)
    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)  # the alarm stands for Ctrl-C
    try:
        with pytest.raises(KeyboardInterrupt):
            problem.local_steps(stopped, (0, nnz), 0, 1, nnz, 0.05)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    start = problem.init_params()[g].sum()
    assert nnz > 8 * (1 << 18) and start < stopped[g].sum() < whole[g].sum()
