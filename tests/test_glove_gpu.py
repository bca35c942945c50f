"""Tests for simlib.gpu.glove: batched lock-free AdaGrad on NumPy (always) and CuPy (with a GPU)."""
import numpy as np
import pytest

from simlib.backend import gpu_available
from simlib.gpu.glove import adagrad_batch, train_batched
from simlib.problems.glove import Cooccurrence, GloveConfig, GloveParams, adagrad_kernel, entry_terms, train


def test_batch_of_one_equals_the_sequential_kernel(cooc):
    cfg = GloveConfig(dim=8)
    a, b = GloveParams.init(cooc.n_words, cfg), GloveParams.init(cooc.n_words, cfg)
    logx, fx = entry_terms(cooc.values, cfg)
    order = np.arange(200, dtype=np.int64)
    eta, clip = np.float32(cfg.lr), np.float32(cfg.grad_clip)
    seq = adagrad_kernel(cooc.rows, cooc.cols, logx, fx, order, *a.arrays(), eta, clip)
    bat = sum(adagrad_batch(b.arrays(), cooc.rows, cooc.cols, logx, fx, order[k:k + 1], eta, clip) for k in range(200))
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
    adagrad_batch(once.arrays(), cooc.rows, cooc.cols, logx, fx, np.array([0]), np.float32(0.05), np.float32(100))
    adagrad_batch(p.arrays(), cooc.rows, cooc.cols, logx, fx, np.array([0, 0]), np.float32(0.05), np.float32(100))
    np.testing.assert_allclose(p.W[cooc.rows[0]] - before, 2 * (once.W[cooc.rows[0]] - before), rtol=1e-5)


def test_numpy_batched_training_lowers_the_cost_like_sequential(cooc):
    cfg = GloveConfig(dim=16, epochs=4)
    _, costs = train_batched(cooc, cfg, batch=256, xp="numpy")
    _, seq = train(cooc, cfg)
    assert all(b < a for a, b in zip(costs, costs[1:])), costs
    assert costs[-1] < 1.3 * seq[-1]


def test_bad_batch_names_the_field(cooc):
    with pytest.raises(ValueError, match="batch"):
        train_batched(cooc, GloveConfig(dim=4), batch=0, xp="numpy")
    with pytest.raises(ValueError, match="kernel"):
        train_batched(cooc, GloveConfig(dim=4), xp="numpy", kernel="fused")
    with pytest.raises(ValueError, match="kernel"):
        train_batched(cooc, GloveConfig(dim=4), xp="numpy", kernel="magic")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_cupy_matches_numpy(cooc):
    cfg = GloveConfig(dim=16, epochs=2)
    p_np, c_np = train_batched(cooc, cfg, batch=1024, xp="numpy")
    p_cp, c_cp = train_batched(cooc, cfg, batch=1024, xp="cupy")
    np.testing.assert_allclose(c_cp, c_np, rtol=1e-3)
    np.testing.assert_allclose(p_cp.W, p_np.W, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("batch, dim", [(1, 8), (1024, 16), (8192, 50)])
def test_fused_kernels_match_the_array_step(cooc, batch, dim):
    cfg = GloveConfig(dim=dim, epochs=2)
    if batch == 1:  # batches of one are the sequential kernel (on a slice: one launch triple per entry)
        cooc = Cooccurrence(cooc.rows[:3000], cooc.cols[:3000], cooc.values[:3000], cooc.n_words)
        p_arr, c_arr = train(cooc, cfg)
    else:  # larger ones the array step on the same device
        p_arr, c_arr = train_batched(cooc, cfg, batch=batch, xp="cupy", kernel="array")
    p_fus, c_fus = train_batched(cooc, cfg, batch=batch, xp="cupy", kernel="fused")
    # float32 sums in another order, and atomics in any order: equal up to rounding, which two
    # epochs of AdaGrad amplify on a few frequent words (measured on an H100 at B=8192, d=50: 43
    # of 61,050 entries of W differ by more than 1e-3 relative, the largest by 0.0014).
    np.testing.assert_allclose(c_fus, c_arr, rtol=1e-4)
    for a, b in zip(p_fus.arrays(), p_arr.arrays()):
        assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)
