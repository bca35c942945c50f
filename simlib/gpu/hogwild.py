"""Hogwild! at GPU scale: a whole batch of rows updates the weights at once, without locks.

On a CPU, Hogwild lets a few processes write the shared weights while the others read them.
A GPU runs thousands of rows at the same moment, so the same idea becomes one batched step:

1. gather ``w`` at every nonzero of the batch's rows,
2. margins ``m_i = x_i . w`` by a segmented sum over the row id of each nonzero
   (:func:`simlib.backend.segment_sum`: no read-back to the host, so launches stay queued),
3. coefficients ``c_i = -y_i sigma(-y_i m_i)``,
4. decay ``w *= (1 - lr*l2) ** B`` (the B steps' L2) and scatter-add ``-lr c_i x_i``
   (:func:`simlib.backend.scatter_add`: repeated features add up).

Every row of a batch reads the same weights, as if each update were B-1 updates stale; the
batch size is therefore the staleness knob. With ``batch_size=1`` this is exactly serial SGD
(tested); larger batches trade a little loss per epoch for far fewer, larger kernel launches.

On CuPy the same step also comes as two fused kernels (``kernel='fused'``, the default there):
one warp per row sums its margin and writes its coefficient, then one thread per nonzero
atomically adds its update. The decay is kept as one scale for the whole vector (``w = v *
scale``, as scikit-learn does), so no kernel touches the untouched weights. The array version
above costs about a dozen launches per batch, each with CuPy's own overhead, and is
launch-bound at the batch sizes that keep the loss (measured on an H100: 24-34 M nonzeros/s
at B = 256, against 514-549 M fused); it stays as the NumPy path and as the reference the fused kernels are tested against.
"""
from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, get_xp, scatter_add, segment_sum, synchronize, to_numpy
from simlib.gpu import cuda_kernels, use_fused
from simlib.problems.logistic import HogwildResult, LogisticProblem, SparseDataset, check_sgd, sigmoid
from simlib.trace import Trace


def batch_step(
    w: Any, indptr: np.ndarray, indices: Any, values: Any, y: Any, row_of: Any, lo: int, hi: int, lr: float, l2: float
) -> None:
    """Rows [lo, hi) in one step: w <- keep**B w - lr * sum_i c_i x_i, every c_i from the same w.

    ``indptr`` stays on the host (it only gives slice bounds); the other arrays live with ``w``.
    ``row_of[p]`` is the row of nonzero ``p``.
    """
    xp = array_module(w)
    a, b = int(indptr[lo]), int(indptr[hi])
    cols = indices[a:b]
    vals = values[a:b]
    rows = row_of[a:b] - lo
    margin = segment_sum(rows, vals * w[cols], hi - lo)
    yb = y[lo:hi]
    coef = -yb * sigmoid(-yb * margin)
    w *= (1.0 - lr * l2) ** (hi - lo)
    scatter_add(w, cols, (-lr) * coef[rows] * vals)


_FUSED_SOURCE = r"""
extern "C" __global__ void hogwild_margins(
    const long long* indptr, const long long* cols, const double* vals, const double* y, const double* v,
    const double scale, const long long lo, const long long hi, double* coef)
{
    // One warp per row: its lanes stride over the row's nonzeros, then a shuffle reduction.
    const long long row = lo + ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= hi) return;  // whole warps leave together: a warp owns one row
    double s = 0.0;
    for (long long p = indptr[row] + lane; p < indptr[row + 1]; p += 32) s += vals[p] * v[cols[p]];
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) {
        const double yi = y[row];
        coef[row - lo] = -yi / (1.0 + exp(yi * s * scale));  // -y sigma(-y m)
    }
}

extern "C" __global__ void hogwild_updates(
    const long long* row_of, const long long* cols, const double* vals, const double* coef, double* v,
    const double factor, const long long a, const long long b, const long long lo)
{
    // One thread per nonzero of the batch: v[j] += factor * c_row * x; repeats add up atomically.
    const long long p = a + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= b) return;
    atomicAdd(&v[cols[p]], factor * coef[row_of[p] - lo] * vals[p]);
}
"""


class _FusedStep:  # pragma: no cover - needs a GPU
    """:func:`batch_step` as the two CUDA kernels, with the decay kept as ``w = v * scale``.

    Called with rows [lo, hi) like :func:`batch_step`; ``v`` is the device vector it updates in
    place and ``scale`` a host number, folded into ``v`` before it can underflow.
    """

    def __init__(self, v: Any, indptr: np.ndarray, indices: Any, values: Any, y: Any, row_of: Any,
                 lr: float, l2: float, batch_size: int):
        self.margins, self.updates = cuda_kernels(_FUSED_SOURCE, ("hogwild_margins", "hogwild_updates"))
        xp = array_module(v)
        self.v, self.host_ptr, self.indptr = v, indptr, xp.asarray(indptr.astype(np.int64))
        self.indices, self.values, self.y, self.row_of = indices, values, y, row_of
        self.lr, self.keep = lr, 1.0 - lr * l2
        self.coef = xp.zeros(batch_size, dtype=np.float64)
        self.scale = 1.0

    def __call__(self, lo: int, hi: int) -> None:
        a, b = int(self.host_ptr[lo]), int(self.host_ptr[hi])
        self.margins((-(-(hi - lo) * 32 // 256),), (256,), (self.indptr, self.indices, self.values, self.y, self.v,
                                                           np.float64(self.scale), np.int64(lo), np.int64(hi), self.coef))
        self.scale *= self.keep ** (hi - lo)
        if b > a:
            self.updates((-(-(b - a) // 256),), (256,), (self.row_of, self.indices, self.values, self.coef, self.v,
                                                        np.float64(-self.lr / self.scale), np.int64(a),
                                                        np.int64(b), np.int64(lo)))
        if self.scale < 1e-100:  # fold the scale into v before it underflows
            self.v *= self.scale
            self.scale = 1.0

    def weights(self) -> np.ndarray:
        """w = v * scale, on the host."""
        return to_numpy(self.v) * self.scale


def train_batched(
    data: SparseDataset,
    *,
    lr: float = 0.2,
    l2: float = 1e-5,
    epochs: int = 5,
    batch_size: int = 256,
    xp: str | ModuleType = "auto",
    eval_rows: int = 2_000,
    record_every: int = 50,
    seed: int = 0,
    kernel: str = "auto",
) -> HogwildResult:
    """Batched lock-free SGD over ``data`` for ``epochs`` passes; weights come back as NumPy.

    A compute span and an update are recorded every ``record_every`` batches, and the loss on
    ``eval_rows`` sampled rows after every epoch. ``kernel`` is 'array' (the array code above,
    NumPy or CuPy), 'fused' (two CUDA kernels per batch; CuPy only) or 'auto' (fused on CuPy).
    """
    if not isinstance(data, SparseDataset):
        raise ValueError(f"data must be a SparseDataset, got {type(data).__name__}")
    data.validate()
    check_sgd(lr, l2, epochs, batch_size)
    check.positive_int("eval_rows", eval_rows)
    check.positive_int("record_every", record_every)
    mod = get_xp(xp) if isinstance(xp, str) else xp
    fused = use_fused(kernel, mod)
    started = time.perf_counter()
    problem = LogisticProblem(data, l2=l2, eval_rows=eval_rows, seed=seed)
    indices = mod.asarray(data.indices.astype(np.int64))
    values = mod.asarray(data.values, dtype=np.float64)
    y = mod.asarray(data.y, dtype=np.float64)
    row_of = mod.asarray(np.repeat(np.arange(data.n_rows, dtype=np.int64), np.diff(data.indptr)))
    w = mod.zeros(data.n_features, dtype=np.float64)
    if fused:  # pragma: no cover - needs a GPU
        step = _FusedStep(w, data.indptr, indices, values, y, row_of, lr, l2, batch_size)
        weights = step.weights
    else:
        def step(lo: int, hi: int) -> None:
            batch_step(w, data.indptr, indices, values, y, row_of, lo, hi, lr, l2)

        def weights() -> np.ndarray:
            return to_numpy(w)
    name = "numpy" if mod is np else "cupy"
    trace = Trace(label=f"batched ({name}{', fused' if fused else ''}, B={batch_size})", substrate="gpu", n_workers=1)
    trace.meta.update(xp=name, kernel="fused" if fused else "array", batch_size=batch_size, lr=lr, l2=l2,
                      epochs=epochs, nnz=data.nnz * epochs)
    trace.record_quality(0.0, 0, problem.loss(weights()))
    step(0, 1)  # warm-up launch (and the fused kernels' compilation), then back to the start
    w[:] = 0.0
    if fused:  # pragma: no cover - needs a GPU
        step.scale = 1.0
    synchronize(mod)
    t0 = time.perf_counter()
    busy = cpu = 0.0
    n_steps = 0
    for _ in range(epochs):
        for lo in range(0, data.n_rows, batch_size * record_every):
            c, s = time.thread_time(), time.perf_counter()
            for blo in range(lo, min(lo + batch_size * record_every, data.n_rows), batch_size):
                step(blo, min(blo + batch_size, data.n_rows))
                n_steps += 1
            synchronize(mod)
            e = time.perf_counter()
            busy += e - s
            cpu += time.thread_time() - c
            trace.span(0, "compute", s - t0, e - t0, step=n_steps)
            trace.update(e - t0, 0, n_steps, staleness=batch_size - 1)
        trace.record_quality(time.perf_counter() - t0, n_steps, problem.loss(weights()))
    return HogwildResult(f"batched-{name}{'-fused' if fused else ''}", 1, weights(), trace, data.nnz * epochs, busy,
                         time.perf_counter() - started, cpu)
