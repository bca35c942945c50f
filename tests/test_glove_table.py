"""GloVe on the contract and in the simulator: one worker equals the sequential kernel; more workers are predicted faster."""
import numpy as np
import pytest

from simlib.problems.glove import (
    GloveConfig, GloveParams, adagrad_kernel, entry_terms, epoch_order,
)
import simlib
from simlib.problems.glove_table import GloveProblem
from simlib.sim.glove_twin import predict_speedup


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
    adagrad_kernel(cooc.rows, cooc.cols, logx, fx, order, *ref.arrays(), np.float32(cfg.lr), np.float32(cfg.grad_clip))
    got = prob.unflatten(w)
    for name in GloveParams.ARRAYS:
        assert np.allclose(getattr(got, name), getattr(ref, name), rtol=1e-6, atol=1e-7), name


def test_simulated_run_lowers_the_cost(cooc):
    cfg = GloveConfig(dim=8)
    trace = simlib.run(GloveProblem(cooc, cfg), "async", substrate="sim", n_workers=2, steps=40, batch_size=256,
                       lr=cfg.lr).trace
    assert trace.quality[-1].value < 0.7 * trace.quality[0].value
    assert trace.summary()["bytes_sent"] > 0


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
