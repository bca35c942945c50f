"""Hogwild! on the gpu substrate: mini-batches against one read of the weights, through simlib.run.

The device branch of ``LogisticProblem.local_steps`` (array code on NumPy always, fused CUDA kernels
on CuPy when a GPU is present) must apply exactly the steps the compiled CPU loop applies.
"""
from __future__ import annotations

import numpy as np
import pytest

import simlib
from simlib.backend import gpu_available
from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.protocol import StepRule
from simlib.problems.logistic_device import array_steps, device_steps

L2_ON = ("touched", "all")


@pytest.fixture(scope="module")
def data():
    return make_sparse_classification(3_000, 1_500, 20, zipf=1.0, seed=5)


@pytest.mark.parametrize("l2_on", L2_ON)
@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_the_array_steps_are_the_compiled_steps(data, l2_on: str, batch_size: int) -> None:
    prob = LogisticProblem(data, l2=1e-2, eval_rows=None, l2_on=l2_on)
    compiled, array = prob.init_params(), prob.init_params()
    shard = (37, 450)  # 20 steps of 64 rows wrap around the shard's end
    prob.local_steps(compiled, shard, 3, 20, batch_size, 0.3)
    array_steps(prob, array, shard, 3, 20, batch_size, 0.3)
    assert np.abs(compiled).max() > 0.05
    np.testing.assert_allclose(array, compiled, rtol=1e-12, atol=1e-15)


def test_every_row_of_a_batch_reads_the_same_weights(data) -> None:
    prob = LogisticProblem(data, l2=0.01, eval_rows=None)
    w = np.random.default_rng(0).normal(size=data.n_features)
    x = data.to_scipy()[10:20].toarray().astype(np.float64)
    y = data.y[10:20].astype(np.float64)
    coef = -y / (1.0 + np.exp(y * (x @ w)))
    touched = np.flatnonzero(np.abs(x).sum(axis=0))
    expected = w - 0.2 * (coef @ x) / 10
    expected[touched] -= 0.2 * 0.01 * w[touched]
    array_steps(prob, w, (10, 20), 0, 1, 10, 0.2)  # l2=0.01 on the touched keys
    np.testing.assert_allclose(w, expected, rtol=1e-12)


@pytest.mark.parametrize("l2_on", L2_ON)
def test_one_worker_on_the_gpu_substrate_is_the_shared_memory_run(data, l2_on: str) -> None:
    prob = LogisticProblem(data, l2=1e-3, eval_rows=None, l2_on=l2_on)
    kw = dict(n_workers=1, steps=200, batch_size=8, lr=0.5)
    gpu = simlib.run(prob, "async", substrate="gpu", xp="numpy", eval_every=50, **kw)
    shm = simlib.run(prob, "async", substrate="shm", **kw)
    assert gpu.trace.meta["path"] == "in place" and gpu.trace.meta["xp"] == "numpy"
    assert len(gpu.trace.updates) == 4  # one update per chunk between evaluations
    # the same steps; l2_on='all' adds a chunk's decay to log s at the chunk's end, and chunks differ
    np.testing.assert_allclose(gpu.params, shm.params, rtol=1e-12, atol=1e-15)


def test_batch_size_is_the_staleness_knob(data) -> None:
    """B rows on one read of the weights at lr * B: a mild B keeps the serial loss, a huge one does not."""
    prob = LogisticProblem(data, l2=1e-5, eval_rows=None, l2_on="all")

    def loss(b: int) -> float:
        res = simlib.run(prob, "async", substrate="gpu", xp="numpy", n_workers=1, batch_size=b, lr=0.2 * b,
                         steps=3 * prob.epoch_steps(1, b), eval_every=10**6)
        return prob.quality(res.params)

    serial = loss(1)
    assert loss(16) < 1.05 * serial
    assert loss(1_000) > 1.2 * serial


class _Unit(StepRule):
    """The built-in rule under another name: not ``plain``, so the gpu substrate takes get / step / add."""


@pytest.mark.parametrize("protocol", ["bsp", "ssp:2", "async"])
def test_the_in_place_path_computes_what_get_step_add_computes(data, protocol: str) -> None:
    prob = LogisticProblem(data, l2=1e-3, eval_rows=None, l2_on="all")
    kw = dict(substrate="gpu", xp="numpy", n_workers=4, steps=20, batch_size=16, lr=0.5)
    fast = simlib.run(prob, protocol, **kw)
    generic = simlib.run(prob, protocol, rule=_Unit(), **kw)
    assert (fast.trace.meta["path"], generic.trace.meta["path"]) == ("in place", "get / step / add")
    # every worker of a round reads the same table, so worker i's change lands on top of i others (BSP: one update)
    taus = {u.staleness for u in fast.trace.updates}
    assert taus == {u.staleness for u in generic.trace.updates} == ({0} if protocol == "bsp" else {0, 1, 2, 3})
    np.testing.assert_allclose(fast.params, generic.params, rtol=1e-10, atol=1e-13)
    assert fast.trace.quality[-1].value < fast.trace.quality[0].value


@pytest.mark.parametrize("kernel, message", [("magic", "kernel must be one of"), ("fused", "needs CuPy")])
def test_a_bad_device_kernel_is_named(data, kernel: str, message: str) -> None:
    prob = LogisticProblem(data, eval_rows=None)
    prob.device_kernel = kernel
    with pytest.raises(ValueError, match=message):
        device_steps(prob, prob.init_params(), (0, 100), 0, 1, 4, 0.1)


@pytest.mark.parametrize("l2_on", L2_ON)
def test_lock_free_rows_on_numpy_are_single_rows_at_lr_over_b(data, l2_on: str) -> None:
    """device_kernel='hogwild': a step of B rows is B one-row steps at lr / B (one row in flight on NumPy)."""
    prob = LogisticProblem(data, l2=1e-3, eval_rows=None, l2_on=l2_on)
    kw = dict(substrate="gpu", xp="numpy", n_workers=1, eval_every=10**6)
    prob.device_kernel = "hogwild"
    lock_free = simlib.run(prob, "async", steps=30, batch_size=8, lr=0.8, **kw)
    prob.device_kernel = "auto"
    rows = simlib.run(prob, "async", steps=240, batch_size=1, lr=0.1, **kw)
    batched = simlib.run(prob, "async", steps=30, batch_size=8, lr=0.8, **kw)
    np.testing.assert_allclose(lock_free.params, rows.params, rtol=1e-12, atol=1e-15)
    assert np.abs(lock_free.params - batched.params).max() > 1e-6  # not the batched step under another name


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("l2_on", L2_ON)
def test_lock_free_rows_one_in_flight_are_the_compiled_loop(data, l2_on: str) -> None:  # pragma: no cover
    import cupy

    prob = LogisticProblem(data, l2=1e-3, eval_rows=None, l2_on=l2_on)
    kw = dict(substrate="gpu", n_workers=1, steps=1_000, batch_size=1, lr=0.3, eval_every=10**6)
    prob.device_kernel = "hogwild"
    on_gpu = simlib.run(prob, "async", xp="cupy", **kw)
    on_cpu = simlib.run(prob, "async", xp="numpy", **kw)
    prob.device_kernel = "auto"
    assert on_gpu.trace.meta["in_flight"] == {"items": 1_000, "missed_mean": 0.0, "missed_max": 0}
    np.testing.assert_allclose(on_gpu.params, on_cpu.params, rtol=1e-9, atol=1e-12)
    assert isinstance(cupy.asarray(on_gpu.params), cupy.ndarray)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_lock_free_rows_in_flight_miss_some_and_still_learn(data) -> None:  # pragma: no cover
    prob = LogisticProblem(data, l2=1e-5, eval_rows=None, l2_on="all")
    b = 256
    prob.device_kernel = "hogwild"
    res = simlib.run(prob, "async", substrate="gpu", xp="cupy", n_workers=1, batch_size=b, lr=0.2 * b,
                     steps=3 * prob.epoch_steps(1, b), eval_every=10**6)
    prob.device_kernel = "auto"
    serial = simlib.run(prob, "async", substrate="shm", n_workers=1, batch_size=1, lr=0.2,
                        steps=3 * prob.epoch_steps(1, 1))
    seen = res.trace.meta["in_flight"]
    assert seen["items"] == 3 * prob.epoch_steps(1, b) * b
    assert 0 < seen["missed_max"] < b  # at most the other warps' rows are pending
    assert max(u.staleness for u in res.trace.updates) == seen["missed_max"]
    assert prob.quality(res.params) < 1.02 * prob.quality(serial.params)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("l2_on", L2_ON)
@pytest.mark.parametrize("batch_size", [1, 64, 1000])
def test_fused_kernels_match_the_array_steps(data, l2_on: str, batch_size: int) -> None:  # pragma: no cover
    import cupy

    prob = LogisticProblem(data.rows(0, 1_500), l2=1e-3, eval_rows=None, l2_on=l2_on)
    out = {}
    for xp, kernel in ((np, "array"), (cupy, "array"), (cupy, "fused")):
        prob.device_kernel = kernel
        w = xp.asarray(prob.init_params())
        if xp is np:
            array_steps(prob, w, (0, 1_500), 0, 6, batch_size, 0.3)
        else:
            prob.local_steps(w, (0, 1_500), 0, 6, batch_size, 0.3)
        out[(xp.__name__, kernel)] = cupy.asnumpy(w) if xp is cupy else w
    # Atomic adds land in any order, so the sums differ by rounding only.
    np.testing.assert_allclose(out[("cupy", "fused")], out[("numpy", "array")], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out[("cupy", "array")], out[("numpy", "array")], rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("l2_on, protocol", [("all", "async"), ("all", "bsp"), ("touched", "ssp:1")])
def test_the_cupy_run_matches_the_numpy_run(data, l2_on: str, protocol: str) -> None:  # pragma: no cover
    # several workers: on CuPy the fused steps read the round's snapshot and add to the table (reads apart),
    # on NumPy each worker steps a copy of the snapshot
    prob = LogisticProblem(data, l2=1e-3 if l2_on == "touched" else 1e-5, eval_rows=None, l2_on=l2_on)
    kw = dict(n_workers=3, steps=100, batch_size=64, lr=3.0)
    on_cpu = simlib.run(prob, protocol, substrate="gpu", xp="numpy", **kw)
    on_gpu = simlib.run(prob, protocol, substrate="gpu", xp="cupy", **kw)
    assert isinstance(on_gpu.params, np.ndarray) and on_gpu.trace.meta["xp"] == "cupy"
    np.testing.assert_allclose(on_gpu.params, on_cpu.params, rtol=1e-8, atol=1e-12)
