"""The logistic problem's local-step hook on a device table: array code (NumPy or CuPy) and fused CUDA kernels.

:meth:`LogisticProblem.local_steps` calls :func:`device_steps` when the table is not a NumPy array
(the ``gpu`` substrate with ``xp='cupy'``). Each mini-batch step does what the compiled CPU loop does:

1. every row of the batch reads the same weights: margins ``m_i = s x_i . v`` (``s`` the common
   scale of ``l2_on='all'``, 1 otherwise),
2. coefficients ``c_i = -y_i sigma(-y_i m_i) / B`` (the mean gradient),
3. ``l2_on='touched'``: each touched weight decays once, ``w_j *= 1 - lr l2``; ``l2_on='all'``:
   log s grows by log(1 - lr l2), kept on the host until the chunk ends,
4. scatter-add of ``-lr c_i x_i`` (divided by ``s (1 - lr l2)`` under ``l2_on='all'``).

Rows of a batch reading one set of weights is the GPU's form of Hogwild!: row i misses the i
updates before it. :func:`array_steps` is the array version (a dozen launches per batch; the
reference, tested on NumPy against the compiled loop); :class:`FusedSteps` is the same step as
three CUDA kernels, one warp per row (margins, decay-once, atomic updates), with no host sync
inside a chunk.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from simlib.backend import QUEUE_SOURCE, InFlight, RowQueue, array_module, cuda_kernels, device_copies, use_fused

_SOURCE = r"""
__device__ long long batch_row(long long start, long long n_rows, long long first_row, long long b) {
    return start + (first_row + b) % n_rows;
}

__device__ double common_scale(const double* w, const long long f, const double pending) {
    // l2_on='all': s = exp(log s + this chunk's decay so far), log s read on the device (f >= 0); else 1
    return f >= 0 ? exp(w[f] + pending) : 1.0;
}

extern "C" __global__ void sgd_margins(
    const long long* indptr, const long long* cols, const double* vals, const double* y, const double* w,
    const long long f, const double pending, const long long start, const long long n_rows,
    const long long first_row, const long long batch, double* coef)
{
    // One warp per row of the batch: lanes stride over its nonzeros, then a shuffle reduction.
    const long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (b >= batch) return;  // whole warps leave together: a warp owns one row
    const long long row = batch_row(start, n_rows, first_row, b);
    double s = 0.0;
    for (long long p = indptr[row] + lane; p < indptr[row + 1]; p += 32) s += vals[p] * w[cols[p]];
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) {
        const double yi = y[row];
        coef[b] = -yi / (1.0 + exp(yi * s * common_scale(w, f, pending)));  // -y sigma(-y m)
    }
}

extern "C" __global__ void sgd_decay_once(
    const long long* indptr, const long long* cols, const double* read, double* w, unsigned long long* seen,
    const unsigned long long tick, const double keep, const long long start, const long long n_rows,
    const long long first_row, const long long batch)
{
    // Every weight the batch touches decays once: the first lane to mark it with this step's tick adds
    // (keep - 1) times the value read (read is w itself, or the round's snapshot when reads are apart).
    const long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (b >= batch) return;
    const long long row = batch_row(start, n_rows, first_row, b);
    for (long long p = indptr[row] + lane; p < indptr[row + 1]; p += 32) {
        const long long j = cols[p];
        if (atomicExch(&seen[j], tick) != tick) w[j] += (keep - 1.0) * read[j];
    }
}

extern "C" __global__ void sgd_updates(
    const long long* indptr, const long long* cols, const double* vals, const double* coef, const double* read,
    double* w, const double factor, const long long f, const double pending, const double keep,
    const double log_s_add, const long long start, const long long n_rows, const long long first_row,
    const long long batch)
{
    // One warp per row: w[j] += factor * c_row * x (divided by s * keep under l2_on='all', s from read);
    // repeated features add up atomically. The updates never touch read's log s, so every warp reads
    // the same s; with reads apart (read is not w) the first thread also adds the step's decay to w's.
    const long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (b == 0 && lane == 0 && log_s_add != 0.0) w[f] += log_s_add;
    if (b >= batch) return;
    const long long row = batch_row(start, n_rows, first_row, b);
    const double c = factor * coef[b] / (f >= 0 ? common_scale(read, f, pending) * keep : 1.0);
    for (long long p = indptr[row] + lane; p < indptr[row + 1]; p += 32) atomicAdd(&w[cols[p]], c * vals[p]);
}
"""
_NAMES = ("sgd_margins", "sgd_decay_once", "sgd_updates")

_HOGWILD_SOURCE = QUEUE_SOURCE + r"""
extern "C" __global__ void sgd_hogwild(
    const long long* indptr, const long long* cols, const double* vals, const double* y, double* w,
    const long long start, const long long n_rows, const long long first_row, const long long total,
    const double rate, const double l2, const long long f, const double log_keep, unsigned long long* queue)
{
    // Rows first_row .. first_row + total - 1 of the shard, taken in order by whichever warp is free:
    // each reads the weights as they are now and adds its own SGD step with atomics (Hogwild!).
    const int lane = threadIdx.x % 32;
    const double keep = exp(log_keep);
    long long missed, missed_sum = 0, missed_most = 0;
    for (;;) {
        const long long t = queue_take(queue, total, 1, &missed);
        if (t >= total) break;
        const long long row = start + (first_row + t) % n_rows;
        const double s = f >= 0 ? exp(w[f] + (double)t * log_keep) : 1.0;  // l2_on='all': log s is w[f]
        double m = 0.0;
        for (long long p = indptr[row] + lane; p < indptr[row + 1]; p += 32) m += vals[p] * w[cols[p]];
        for (int off = 16; off > 0; off /= 2) m += __shfl_xor_sync(0xffffffffu, m, off);
        const double yi = y[row];
        const double coef = -yi / (1.0 + exp(yi * m * s));  // -y sigma(-y m)
        for (long long p = indptr[row] + lane; p < indptr[row + 1]; p += 32) {
            const long long j = cols[p];
            if (f >= 0) atomicAdd(&w[j], -rate * coef * vals[p] / (s * keep));
            else atomicAdd(&w[j], -rate * (l2 * w[j] + coef * vals[p]));
        }
        queue_done(queue, 1, missed, &missed_sum, &missed_most);
    }
    queue_leave(queue, missed_sum, missed_most);
}
"""


class DeviceData:
    """One problem's rows on one array module, copied once and kept (see :func:`device_data`)."""

    def __init__(self, data: Any, xp: Any):
        self.xp = xp
        self.indptr = xp.asarray(np.asarray(data.indptr, dtype=np.int64))
        self.indices = xp.asarray(np.asarray(data.indices, dtype=np.int64))
        self.values = xp.asarray(np.asarray(data.values, dtype=np.float64))
        self.y = xp.asarray(np.asarray(data.y, dtype=np.float64))
        self.fused: FusedSteps | None = None
        self.queue = RowQueue(xp)  # the lock-free rows' queue (four counters)


def device_data(problem: Any, xp: Any) -> DeviceData:
    """The problem's rows on ``xp``, made on first use and kept while the problem lives."""
    return device_copies(problem, xp, lambda m: DeviceData(problem.data, m))


def device_steps(problem: Any, w: Any, shard: tuple[int, int], first: int, count: int, batch_size: int,
                 lr: float, read: Any = None) -> InFlight | None:
    """Steps first .. first+count-1 of a shard on the device table ``w``, in place (the hook's device branch).

    ``problem.device_kernel`` chooses: 'fused' (CuPy), 'array', 'auto' (fused on CuPy), or 'hogwild':
    the chunk's rows one by one at ``lr / batch_size``, ``batch_size`` warps at a time with no barrier
    (:func:`hogwild_rows`; then the rows each step missed are returned). With ``read`` (fused kernels
    only, one step), the step is computed from the table ``read`` and its change added to ``w``: a BSP
    round's workers on one snapshot, with no copy per worker.
    """
    xp = array_module(w)
    if problem.device_kernel == "hogwild":  # pragma: no cover - needs a GPU
        return hogwild_rows(problem, w, shard, first * batch_size, count * batch_size, batch_size, lr / batch_size)
    if use_fused(problem.device_kernel, xp):  # pragma: no cover - needs a GPU
        dev = device_data(problem, xp)
        if dev.fused is None:
            dev.fused = FusedSteps(dev, w.shape[0])
        dev.fused(problem, w, shard, first, count, batch_size, lr, read)
    elif read is not None:
        raise ValueError(f"read= needs the fused kernels (device_kernel 'auto' or 'fused' on CuPy), "
                         f"not {problem.device_kernel!r}")
    else:
        array_steps(problem, w, shard, first, count, batch_size, lr)
    return None


def hogwild_rows(problem: Any, w: Any, shard: tuple[int, int], first_row: int, rows: int, in_flight: int,
                 rate: float) -> InFlight:  # pragma: no cover - needs a GPU
    """Rows first_row .. first_row+rows-1 of a shard, each an SGD step at ``rate``, ``in_flight`` warps at once.

    One launch for the whole chunk: warps take rows in order from a queue and add their steps with
    atomics as soon as they are computed, so a row misses at most about ``in_flight`` earlier ones
    (counted, and returned). With ``in_flight=1`` this is the compiled CPU loop at batch size 1.
    """
    dev, l2, scaled = device_data(problem, array_module(w)), problem.l2, problem.l2_on == "all"
    (kernel,) = cuda_kernels(_HOGWILD_SOURCE, ("sgd_hogwild",))
    log_keep = math.log(1.0 - rate * l2) if scaled else 0.0
    counts = dev.queue.launch(kernel, in_flight, rows, (dev.indptr, dev.indices, dev.values, dev.y, w, np.int64(shard[0]),
                                         np.int64(shard[1] - shard[0]), np.int64(first_row), np.int64(rows),
                                         np.float64(rate), np.float64(l2), np.int64(w.shape[0] - 1 if scaled else -1),
                                         np.float64(log_keep)))
    if scaled:
        w[-1] += rows * log_keep
    return InFlight.of(counts)


def array_steps(problem: Any, w: Any, shard: tuple[int, int], first: int, count: int, batch_size: int,
                lr: float) -> None:
    """The steps in array code on ``w``'s array module (:meth:`LogisticProblem.gradient_xp` at the batch's keys):
    the NumPy-tested reference of :class:`FusedSteps`."""
    xp, scaled = array_module(w), problem.l2_on == "all"
    keep = 1.0 - lr * problem.l2
    log_s, pending = (float(w[-1]), 0.0) if scaled else (0.0, 0.0)
    for c in range(first, first + count):
        rows = problem.batch(shard, c, batch_size)
        keys = problem.keys(rows)[:-1] if scaled else problem.keys(rows)
        at = xp.asarray(keys)
        s = math.exp(log_s + pending)
        _, g = problem.gradient_xp(w[at] * s, rows, keys, 0.0 if scaled else problem.l2)
        w[at] += (-lr / (s * keep)) * g if scaled else -lr * g
        pending += math.log(keep) if scaled else 0.0
    if scaled:
        w[-1] += pending


class FusedSteps:  # pragma: no cover - needs a GPU
    """:func:`array_steps` as three CUDA kernels per step, launched back to back with no host sync."""

    def __init__(self, dev: DeviceData, n_params: int):
        self.margins, self.decay, self.updates = cuda_kernels(_SOURCE, _NAMES)
        self.dev = dev
        self.coef = dev.xp.zeros(1, dtype=np.float64)
        self.seen = dev.xp.zeros(n_params, dtype=np.uint64)
        self.tick = 0

    def __call__(self, problem: Any, w: Any, shard: tuple[int, int], first: int, count: int, batch_size: int,
                 lr: float, read: Any = None) -> None:
        d, l2, scaled = self.dev, problem.l2, problem.l2_on == "all"
        if read is not None and count != 1:
            raise ValueError(f"a step read from another table is one step; got count={count}")
        src = w if read is None else read
        if self.coef.shape[0] < batch_size:
            self.coef = d.xp.zeros(batch_size, dtype=np.float64)
        start, n_rows = np.int64(shard[0]), np.int64(shard[1] - shard[0])
        keep = 1.0 - lr * l2
        f = np.int64(w.shape[0] - 1 if scaled else -1)  # log s stays on the device: no wait for it
        log_s_add = np.float64(math.log(keep) if scaled and read is not None else 0.0)  # reads apart: in the kernel
        pending = 0.0
        grid, block, batch = (-(-batch_size * 32 // 256),), (256,), np.int64(batch_size)
        rows = (d.indptr, d.indices)
        for c in range(first, first + count):
            first_row = np.int64(c * batch_size)
            self.margins(grid, block, (*rows, d.values, d.y, src, f, np.float64(pending), start, n_rows, first_row,
                                       batch, self.coef))
            if not scaled and l2:
                self.tick += 1
                self.decay(grid, block, (*rows, src, w, self.seen, np.uint64(self.tick), np.float64(keep), start,
                                         n_rows, first_row, batch))
            self.updates(grid, block, (*rows, d.values, self.coef, src, w, np.float64(-lr / batch_size), f,
                                       np.float64(pending), np.float64(keep), log_s_add, start, n_rows, first_row,
                                       batch))
            if scaled:
                pending += math.log(keep)
        if scaled and read is None:
            w[-1] += pending
