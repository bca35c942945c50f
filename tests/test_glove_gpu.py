"""GloVe on the gpu substrate: batched lock-free AdaGrad through the problem's hook, NumPy always, CuPy with a GPU."""
import numpy as np
import pytest

import simlib
from simlib.backend import InFlight, gpu_available
from simlib.problems.glove import GloveConfig, GloveParams, adagrad_kernel, entry_terms
from simlib.problems.glove_device import CHUNK, adagrad_batch, device_pass
from simlib.problems.glove_table import GloveProblem


def test_batch_of_one_equals_the_sequential_kernel(cooc):
    cfg = GloveConfig(dim=8)
    a, b = GloveParams.init(cooc.n_words, cfg), GloveParams.init(cooc.n_words, cfg)
    logx, fx = entry_terms(cooc.values, cfg)
    order = np.arange(200, dtype=np.int64)
    eta, clip = np.float32(cfg.lr), np.float32(cfg.grad_clip)
    seq = adagrad_kernel((cooc.rows, cooc.cols, logx, fx), order, a.arrays(), eta, clip)
    bat = sum(adagrad_batch((cooc.rows, cooc.cols, logx, fx), order[k:k + 1], b.arrays(), eta, clip) for k in range(200))
    assert bat == pytest.approx(seq, rel=1e-4)
    for x, y in zip(a.arrays(), b.arrays()):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_repeated_words_in_a_batch_all_land(cooc):
    # Two copies of one entry in a batch: both steps are computed from the old row and both are added.
    cfg = GloveConfig(dim=4)
    p = GloveParams.init(cooc.n_words, cfg)
    before = p.W[cooc.rows[0]].copy()
    logx, fx = entry_terms(cooc.values, cfg)
    once = GloveParams.init(cooc.n_words, cfg)
    adagrad_batch((cooc.rows, cooc.cols, logx, fx), np.array([0]), once.arrays(), np.float32(0.05), np.float32(100))
    adagrad_batch((cooc.rows, cooc.cols, logx, fx), np.array([0, 0]), p.arrays(), np.float32(0.05), np.float32(100))
    np.testing.assert_allclose(p.W[cooc.rows[0]] - before, 2 * (once.W[cooc.rows[0]] - before), rtol=1e-5)


def test_the_device_pass_with_batches_of_one_is_the_cpu_hook(cooc):
    prob = GloveProblem(cooc, GloveConfig(dim=8))
    cpu = prob.init_params().astype(np.float32)
    prob.local_steps(cpu, (0, 300), 0, 300, 1, 0.05)
    dev = prob.init_params().astype(np.float32)
    cost, _ = device_pass(prob, dev, prob._order(0)[:300], 0, 1, np.float32(0.05), np.float32(prob.config.grad_clip))
    assert cost == pytest.approx(prob.local_result((0, 300))[0][0], rel=1e-4)
    np.testing.assert_allclose(dev, cpu, rtol=1e-4, atol=1e-6)


def test_steps_stay_aligned_across_segments(cooc):
    """Steps start at the shard positions that are multiples of the batch, whatever segment a call gets."""
    prob = GloveProblem(cooc, GloveConfig(dim=8))
    eta, clip = np.float32(0.05), np.float32(prob.config.grad_clip)
    entries = prob._order(0)[:700]
    whole, split = prob.init_params().astype(np.float32), prob.init_params().astype(np.float32)
    device_pass(prob, whole, entries, 0, 64, eta, clip)
    device_pass(prob, split, entries[:128], 0, 64, eta, clip)
    device_pass(prob, split, entries[128:], 128, 64, eta, clip)
    np.testing.assert_array_equal(split, whole)
    shifted = prob.init_params().astype(np.float32)
    device_pass(prob, shifted, entries, 5, 64, eta, clip)  # other step boundaries: other sums
    assert not np.array_equal(shifted, whole)


def test_the_gpu_substrate_trains_glove_and_keeps_the_costs(cooc):
    prob = GloveProblem(cooc, GloveConfig(dim=16))
    res = simlib.run(prob, "async", substrate="gpu", xp="numpy", n_workers=1, batch_size=64, lr=0.05,
                     steps=4 * prob.epoch_steps(1, 64), eval_every=10**6)
    costs = prob.epoch_costs(res)
    assert res.trace.meta["path"] == "in place" and len(costs) == 4
    assert all(b < a for a, b in zip(costs, costs[1:])), costs


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("batch, dim", [(1, 8), (1024, 16), (8192, 50)])
def test_fused_kernels_match_the_array_step(cooc, batch, dim):  # pragma: no cover
    import cupy

    prob = GloveProblem(cooc, GloveConfig(dim=dim))
    n = 3000 if batch == 1 else cooc.nnz  # batches of one: one launch triple per entry, so a slice
    out = {}
    for kernel in ("array", "fused"):
        prob.device_kernel = kernel
        w = cupy.asarray(prob.init_params().astype(np.float32))
        for epoch in range(2):
            device_pass(prob, w, prob._order(epoch)[:n], 0, batch, np.float32(0.05), np.float32(100.0))
        out[kernel] = cupy.asnumpy(w)
    # float32 sums in another order, and atomics in any order: equal up to rounding, which two epochs of
    # AdaGrad amplify on a few frequent words.
    assert np.linalg.norm(out["fused"] - out["array"]) <= 1e-3 * np.linalg.norm(out["array"])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_cupy_matches_numpy(cooc):  # pragma: no cover
    prob = GloveProblem(cooc, GloveConfig(dim=16))
    prob.device_kernel = "array"
    kw = dict(n_workers=1, batch_size=1024, lr=0.05, steps=2 * prob.epoch_steps(1, 1024), eval_every=10**6)
    on_gpu = simlib.run(prob, "async", substrate="gpu", xp="cupy", **kw)
    w = prob.init_params().astype(np.float32)
    # the run's steps continue across passes (pass 1's first step starts at position nnz) and its last
    # step ends inside pass 2: the same segments, in the same order, on NumPy
    t, end = 0, kw["steps"] * 1024
    while t < end:
        p, pos = divmod(t, cooc.nnz)
        upto = min(cooc.nnz, pos + end - t)
        device_pass(prob, w, prob._order(p)[pos:upto], t, 1024, np.float32(0.05), np.float32(prob.config.grad_clip))
        t += upto - pos
    np.testing.assert_allclose(on_gpu.params, w, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_lock_free_entries_one_in_flight_are_the_cpu_hook(cooc):  # pragma: no cover
    import cupy

    prob = GloveProblem(cooc, GloveConfig(dim=40))
    cpu = prob.init_params().astype(np.float32)
    prob.local_steps(cpu, (0, 3000), 0, 3000, 1, 0.05)
    prob.device_kernel = "hogwild"
    dev = cupy.asarray(prob.init_params().astype(np.float32))
    cost, counts = device_pass(prob, dev, prob._order(0)[:3000], 0, 1, np.float32(0.05),
                               np.float32(prob.config.grad_clip))
    prob.device_kernel = "auto"
    seen = InFlight.of(counts)
    assert (seen.items, seen.missed_max) == (3000, 0)
    assert float(cost) == pytest.approx(prob.local_result((0, 3000))[0][0], rel=1e-4)
    np.testing.assert_allclose(cupy.asnumpy(dev), cpu, rtol=1e-3, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_lock_free_entries_in_flight_learn_like_the_cpu(cooc):  # pragma: no cover
    prob = GloveProblem(cooc, GloveConfig(dim=16))
    kw = dict(n_workers=1, lr=0.05, eval_every=10**6)
    cpu = prob.epoch_costs(simlib.run(prob, "async", substrate="gpu", xp="numpy", batch_size=1024,
                                      steps=4 * prob.epoch_steps(1, 1024), **kw))
    prob.device_kernel = "hogwild"
    res = simlib.run(prob, "async", substrate="gpu", xp="cupy", batch_size=1024, steps=4 * prob.epoch_steps(1, 1024),
                     **kw)
    prob.device_kernel = "auto"
    costs = prob.epoch_costs(res)
    assert 0 < res.trace.meta["in_flight"]["missed_max"] < CHUNK * 1024  # 1,024 warps, CHUNK entries each at a time
    assert costs[-1] == pytest.approx(cpu[-1], rel=0.05), (costs, cpu)
