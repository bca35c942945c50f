"""The GPU twin of Hogwild!: batches of rows against the same weights, scatter-added; NumPy always, CuPy when present."""
from __future__ import annotations

import math

import numpy as np
import pytest

import simlib
from simlib.backend import gpu_available
from simlib.gpu.hogwild import batch_step, train_batched
from simlib.problems.logistic import LogisticProblem, make_sparse_classification


@pytest.fixture(scope="module")
def data():
    return make_sparse_classification(3_000, 1_500, 20, zipf=1.0, seed=5)


def serial_sgd(data, lr: float = 0.2, l2: float = 1e-5, epochs: int = 3) -> np.ndarray:
    """The serial reference: one worker, one row per step, every weight decayed every step (the contract)."""
    prob = LogisticProblem(data, l2=l2, eval_rows=None, l2_on="all")
    res = simlib.run(prob, "async", substrate="shm", n_workers=1, steps=epochs * data.n_rows, batch_size=1, lr=lr)
    return prob.weights(res.params)


def test_batches_of_one_are_serial_sgd(data) -> None:
    small = data.rows(0, 800)
    serial = serial_sgd(small, lr=0.5, l2=1e-3, epochs=2)
    batched = train_batched(small, lr=0.5, l2=1e-3, epochs=2, batch_size=1, xp="numpy")
    np.testing.assert_allclose(batched.w, serial, rtol=1e-10, atol=1e-14)


def test_one_batch_step_is_the_sum_of_the_rows_updates_at_the_same_weights(data) -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=data.n_features)
    row_of = np.repeat(np.arange(data.n_rows), np.diff(data.indptr))
    x = data.to_scipy()[10:20].toarray().astype(np.float64)
    y = data.y[10:20].astype(np.float64)
    coef = -y / (1.0 + np.exp(y * (x @ w)))
    expected = (1.0 - 0.2 * 0.01) ** 10 * w - 0.2 * coef @ x
    batch_step(w, data.indptr, data.indices.astype(np.int64), data.values.astype(np.float64), data.y.astype(np.float64), row_of, 10, 20, 0.2, 0.01)
    np.testing.assert_allclose(w, expected, rtol=1e-12)


def test_moderate_batches_keep_the_loss_close_to_serial(data) -> None:
    full = LogisticProblem(data, l2=1e-5, eval_rows=None)
    serial = full.loss(serial_sgd(data))
    res = train_batched(data, epochs=3, batch_size=16, xp="numpy")
    assert full.loss(res.w) < serial * 1.05
    assert res.trace.substrate == "gpu" and res.trace.meta["xp"] == "numpy"
    assert res.trace.quality[0].value == pytest.approx(math.log(2))
    assert all(u.staleness == 15 for u in res.trace.updates)


@pytest.mark.parametrize("kwargs, field", [({"lr": 0}, "lr"), ({"batch_size": 0}, "batch_size"), ({"epochs": -1}, "epochs"),
                                           ({"xp": "tpu"}, "xp"), ({"kernel": "magic"}, "kernel"),
                                           ({"kernel": "fused", "xp": "numpy"}, "kernel")])
def test_bad_arguments_are_value_errors(data, kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        train_batched(data, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_cupy_path_matches_numpy(data) -> None:
    on_cpu = train_batched(data, epochs=2, batch_size=64, xp="numpy")
    on_gpu = train_batched(data, epochs=2, batch_size=64, xp="cupy")
    assert isinstance(on_gpu.w, np.ndarray)
    np.testing.assert_allclose(on_gpu.w, on_cpu.w, rtol=1e-8, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("batch_size", [1, 64, 1000])
def test_fused_kernels_match_the_array_step(data, batch_size: int) -> None:
    small = data.rows(0, 1_500)
    array = train_batched(small, epochs=2, batch_size=batch_size, xp="cupy", kernel="array")
    fused = train_batched(small, epochs=2, batch_size=batch_size, xp="cupy", kernel="fused")
    reference = train_batched(small, epochs=2, batch_size=batch_size, xp="numpy")
    assert fused.trace.meta["kernel"] == "fused" and array.trace.meta["kernel"] == "array"
    # Atomic adds land in any order, so the sums differ by rounding only.
    np.testing.assert_allclose(fused.w, array.w, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fused.w, reference.w, rtol=1e-9, atol=1e-12)
