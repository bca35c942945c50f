"""GloVe's local-step hook on a device table: batched AdaGrad in array code (NumPy or CuPy) and fused CUDA kernels.

:meth:`GloveProblem.local_steps` calls :func:`device_pass` when the table is not a NumPy array (the
``gpu`` substrate with ``xp='cupy'``). The entries of one step are processed at once: every entry
reads the rows as they were before the step (gather), computes its clipped AdaGrad steps, and all
steps are added back (scatter-add), so two entries of one step that share a word both land, each
computed from the same old row: the GPU analogue of Hogwild's races, made deterministic. With a
batch of 1 this is exactly the CPU kernel (:func:`simlib.problems.glove.adagrad_kernel`), which
applies a step's entries one after another.

The batch is a staleness knob with a limit: a frequent word appears in many entries of one batch,
and all their steps, computed from the same old row, add up. On the KJV vocabulary (5,323 words)
batches of 1,024 and 8,192 entries reach the sequential cost after three epochs (0.0202 and 0.0199),
while 65,536 diverges (cost 2,587 after the first epoch). Keep the batch near the vocabulary size or
below.

On CuPy the step also comes as three fused kernels (``device_kernel='fused'``, the default there):
one warp per entry computes its weighted error and bias steps, one thread per (entry, dimension)
its clipped AdaGrad steps from the old rows, and one thread per (entry, dimension) adds them with
atomics. The array step launches about thirty kernels per batch and is launch-bound on a GPU; it
stays as the NumPy-tested reference of the fused kernels.

``device_kernel='hogwild'`` drops the step boundaries: one launch per pass segment, B warps taking
entries in order from a queue (:class:`simlib.backend.RowQueue`), :data:`CHUNK` at a time, each reading
the rows as they are and adding its AdaGrad steps with atomics, GloVe's Hogwild on a GPU. Each pass's order is drawn on
the device (:func:`device_order`), and nothing waits between passes.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from simlib.backend import QUEUE_SOURCE, RowQueue, array_module, cuda_kernels, device_copies, scatter_add, use_fused


def adagrad_batch(entries: tuple[Any, ...], batch: Any, arrays: tuple[Any, ...], eta: float, clip: float) -> Any:
    """One batched AdaGrad step over entries ``batch`` (all read before any write); arguments as :func:`adagrad_kernel`'s.

    Returns sum 0.5 f diff^2 as a 0-d array on the parameters' device: reading it back to the
    host every batch would stall the GPU's queue, so the caller adds these up and converts once.
    """
    rows, cols, logx, fx = entries
    W, C, bw, bc, gW, gC, gbw, gbc = arrays
    xp = array_module(W)
    i, j = rows[batch], cols[batch]
    wi, cj = W[i], C[j]
    diff = xp.sum(wi * cj, axis=1) + bw[i] + bc[j] - logx[batch]
    fdiff = fx[batch] * diff
    cost = 0.5 * xp.sum(fdiff * diff, dtype=xp.float64)
    g = fdiff[:, None]
    tw = xp.clip(g * cj, -clip, clip) * eta
    tc = xp.clip(g * wi, -clip, clip) * eta
    # every change is computed from the arrays as they were, before any lands; the biases' steps have no eta (as in C)
    changes = ((W, i, -tw / xp.sqrt(gW[i])), (C, j, -tc / xp.sqrt(gC[j])), (gW, i, tw * tw), (gC, j, tc * tc),
               (bw, i, -fdiff / xp.sqrt(gbw[i])), (bc, j, -fdiff / xp.sqrt(gbc[j])), (gbw, i, fdiff * fdiff),
               (gbc, j, fdiff * fdiff))
    for target, at, change in changes:
        scatter_add(target, at, change)
    return cost


_FUSED_SOURCE = r"""
extern "C" __global__ void glove_errors(
    const int* rows, const int* cols, const float* logx, const float* fx, const long long* batch,
    const long long n, const int dim, const float* W, const float* C, const float* bw, const float* bc,
    const float* gbw, const float* gbc, float* fdiff, float* sbw, float* sbc, double* cost)
{
    // One warp per entry: w_i . c_j by a shuffle reduction, then the weighted error and bias steps.
    const long long e = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (e >= n) return;  // a warp owns one entry, so whole warps leave together
    const long long b = batch[e];
    const long long i = rows[b], j = cols[b];
    float s = 0.0f;
    for (int k = lane; k < dim; k += 32) s += W[i * dim + k] * C[j * dim + k];
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) {
        const float diff = s + bw[i] + bc[j] - logx[b];
        const float fd = fx[b] * diff;
        fdiff[e] = fd;
        sbw[e] = fd / sqrtf(gbw[i]);
        sbc[e] = fd / sqrtf(gbc[j]);
        atomicAdd(cost, 0.5 * (double)(fd * diff));
    }
}

extern "C" __global__ void glove_steps(
    const int* rows, const int* cols, const long long* batch, const long long n, const int dim,
    const float* W, const float* C, const float* gW, const float* gC, const float* fdiff,
    const float eta, const float clip, float* uw, float* uc, float* tw2, float* tc2)
{
    // One thread per (entry, dimension): clipped AdaGrad steps from the rows as they were.
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    const long long e = t / dim, k = t % dim, b = batch[e];
    const long long wi = (long long)rows[b] * dim + k, cj = (long long)cols[b] * dim + k;
    const float g = fdiff[e];
    const float tw = fminf(fmaxf(g * C[cj], -clip), clip) * eta;
    const float tc = fminf(fmaxf(g * W[wi], -clip), clip) * eta;
    uw[t] = tw / sqrtf(gW[wi]);
    uc[t] = tc / sqrtf(gC[cj]);
    tw2[t] = tw * tw;
    tc2[t] = tc * tc;
}

extern "C" __global__ void glove_apply(
    const int* rows, const int* cols, const long long* batch, const long long n, const int dim,
    const float* uw, const float* uc, const float* tw2, const float* tc2, const float* fdiff,
    const float* sbw, const float* sbc, float* W, float* C, float* gW, float* gC, float* bw,
    float* bc, float* gbw, float* gbc)
{
    // One thread per (entry, dimension): every step lands, repeated words included.
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    const long long e = t / dim, k = t % dim, b = batch[e];
    const long long i = rows[b], j = cols[b];
    atomicAdd(&W[i * dim + k], -uw[t]);
    atomicAdd(&C[j * dim + k], -uc[t]);
    atomicAdd(&gW[i * dim + k], tw2[t]);
    atomicAdd(&gC[j * dim + k], tc2[t]);
    if (k == 0) {
        const float fd = fdiff[e];
        atomicAdd(&bw[i], -sbw[e]);
        atomicAdd(&bc[j], -sbc[e]);
        atomicAdd(&gbw[i], fd * fd);
        atomicAdd(&gbc[j], fd * fd);
    }
}
"""

#: Entries a warp of the lock-free pass takes from the queue at a time.
CHUNK = 8

_HOGWILD_SOURCE = QUEUE_SOURCE + f"#define GLOVE_CHUNK {CHUNK}\n" + r"""
extern "C" __global__ void glove_hogwild(
    const int* rows, const int* cols, const float* logx, const float* fx, const long long* order,
    const long long total, const int dim, float* W, float* C, float* bw, float* bc, float* gW, float* gC,
    float* gbw, float* gbc, const float eta, const float clip, double* cost, unsigned long long* queue)
{
    // Entries order[0 .. total-1], taken in order, GLOVE_CHUNK at a time, by whichever warp is free (lanes
    // over the dimensions): each reads the rows as they are now and adds its AdaGrad steps with atomics
    // (GloVe's Hogwild). One entry a take held the kernel at 200 M entries/s on an H100: every warp
    // added to the queue's two counters for each entry, and 8 a take ran at 870 M/s, same cost.
    const int lane = threadIdx.x % 32;
    double mine = 0.0;
    long long missed, missed_sum = 0, missed_most = 0;
    for (;;) {
        const long long first = queue_take(queue, total, GLOVE_CHUNK, &missed);
        if (first >= total) break;
        const long long last = first + GLOVE_CHUNK < total ? first + GLOVE_CHUNK : total;
        for (long long t = first; t < last; ++t) {
            const long long e = order[t];
            const long long i = rows[e], j = cols[e];
            float s = 0.0f;
            for (int k = lane; k < dim; k += 32) s += W[i * dim + k] * C[j * dim + k];
            for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
            const float diff = s + bw[i] + bc[j] - logx[e];
            const float g = fx[e] * diff;
            for (int k = lane; k < dim; k += 32) {
                const long long a = i * dim + k, b = j * dim + k;
                const float tw = fminf(fmaxf(g * C[b], -clip), clip) * eta;
                const float tc = fminf(fmaxf(g * W[a], -clip), clip) * eta;
                const float uw = tw / sqrtf(gW[a]), uc = tc / sqrtf(gC[b]);
                atomicAdd(&gW[a], tw * tw);
                atomicAdd(&gC[b], tc * tc);
                atomicAdd(&W[a], -uw);
                atomicAdd(&C[b], -uc);
            }
            if (lane == 0) {
                mine += 0.5 * (double)(g * diff);
                const float sbw = g / sqrtf(gbw[i]), sbc = g / sqrtf(gbc[j]);
                atomicAdd(&bw[i], -sbw);
                atomicAdd(&bc[j], -sbc);
                atomicAdd(&gbw[i], g * g);
                atomicAdd(&gbc[j], g * g);
            }
            __threadfence_block();  // the next entry's lanes read what this one's lane 0 added (its biases)
            __syncwarp();
        }
        queue_done(queue, last - first, missed, &missed_sum, &missed_most);
    }
    queue_leave(queue, missed_sum, missed_most);
    if (lane == 0 && mine != 0.0) atomicAdd(cost, mine);
}
"""


def device_pass(problem: Any, w: Any, entries: Any, offset: int, batch_size: int, eta: np.float32,
                clip: np.float32) -> tuple[Any, Any]:
    """AdaGrad over ``entries`` (ids, one pass's segment) on the device table ``w``: (cost sum, in flight).

    Steps are ``batch_size`` entries, aligned with the shard's positions: ``offset`` is the position
    of the first entry, so a step that crosses the segment's end is finished by the next call.
    ``device_kernel='hogwild'`` runs the segment as one lock-free launch instead, ``batch_size``
    entries in flight (:func:`hogwild_entries`); then the cost is a device scalar and the second item the
    queue's counts (:meth:`~simlib.backend.InFlight.of`), nothing waited for.
    """
    xp = array_module(w)
    terms = device_copies(problem, xp, lambda m: tuple(m.asarray(a) for a in (
        problem.cooc.rows.astype(np.int32), problem.cooc.cols.astype(np.int32), problem.logx, problem.fx)))
    views = problem.views(w)
    ids = xp.asarray(entries).astype(np.int64, copy=False)  # host ids, or a device order's slice
    if problem.device_kernel == "hogwild":  # pragma: no cover - needs a GPU
        return hogwild_entries(terms, ids, views, batch_size, eta, clip)
    cuts = list(range(batch_size - offset % batch_size, len(entries), batch_size))
    parts = [ids[a:b] for a, b in zip([0] + cuts, cuts + [len(entries)]) if b > a]
    if use_fused(problem.device_kernel, xp):  # pragma: no cover - needs a GPU
        return _fused(terms, parts, views, batch_size, eta, clip), None
    return float(sum(adagrad_batch(terms, part, views, eta, clip) for part in parts)), None


def hogwild_entries(entries: tuple[Any, ...], ids: Any, arrays: tuple[Any, ...], in_flight: int,
                    eta: np.float32, clip: np.float32) -> tuple[Any, Any]:  # pragma: no cover - needs a GPU
    """Entries ``ids`` in order, one warp each, ``in_flight`` at once, in one launch.

    Returns (the cost sum, the queue's counts), both on the device and not waited for: read the
    counts with :meth:`~simlib.backend.InFlight.of`. With ``in_flight=1`` this is the CPU kernel's
    sequence of updates (float32, the dot product summed in another order).
    """
    xp = array_module(ids)
    (kernel,) = cuda_kernels(_HOGWILD_SOURCE, ("glove_hogwild",))
    cost = xp.zeros(1, dtype=np.float64)
    counts = RowQueue(xp).launch(kernel, in_flight, int(ids.shape[0]), (*entries, ids, np.int64(ids.shape[0]),
                                                                        np.int32(arrays[0].shape[1]), *arrays, eta,
                                                                        clip, cost))
    return cost[0], counts


def device_order(problem: Any, xp: Any, p: int) -> Any:  # pragma: no cover - needs a GPU
    """Pass ``p``'s shuffled order drawn on the device (lock-free runs): seeded, but not :func:`epoch_order`'s.

    The entries sorted by a 64-bit hash of (seed, pass, entry): a host permutation of every entry,
    or a fresh device generator, each pass costs more than the pass itself on a GPU. The last two
    orders are kept, as on the host.
    """
    orders = problem.__dict__.setdefault("_device_orders", {})
    if p not in orders:
        if len(orders) >= 2:
            del orders[min(orders)]
        salt = np.uint64((problem.config.seed * 1_000_003 + p + 1) % 2**64)
        keys = _order_keys(xp)(salt, xp.empty(problem.cooc.nnz, dtype=np.uint64))
        orders[p] = xp.argsort(keys).astype(np.int64, copy=False)
    return orders[p]


@functools.lru_cache(maxsize=None)
def _order_keys(xp: Any) -> Any:  # pragma: no cover - needs a GPU
    """splitmix64 of (entry + salt * golden ratio), entry = the element's index ``i``: compiled once."""
    return xp.ElementwiseKernel("uint64 salt", "uint64 key", """
        unsigned long long z = (unsigned long long)i + salt * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        key = z ^ (z >> 31);""", "simlib_order_keys")


def _fused(entries: tuple[Any, ...], parts: list[Any], arrays: tuple[Any, ...], batch: int,
           eta: np.float32, clip: np.float32) -> float:  # pragma: no cover - needs a GPU
    """The steps ``parts`` as fused kernel triples; returns sum 0.5 f diff^2 (read back once)."""
    rows, cols, logx, fx = entries
    W, C, bw, bc, gW, gC, gbw, gbc = arrays
    xp = array_module(W)
    errors, steps, apply = cuda_kernels(_FUSED_SOURCE, ("glove_errors", "glove_steps", "glove_apply"))
    dim = np.int32(W.shape[1])
    fdiff, sbw, sbc = (xp.empty(batch, dtype=np.float32) for _ in range(3))
    uw, uc, tw2, tc2 = (xp.empty(batch * int(dim), dtype=np.float32) for _ in range(4))
    cost = xp.zeros(1, dtype=np.float64)
    for part in parts:
        n = np.int64(part.shape[0])
        errors((-(-int(n) * 32 // 256),), (256,), (rows, cols, logx, fx, part, n, dim, W, C, bw, bc, gbw, gbc,
                                                 fdiff, sbw, sbc, cost))
        blocks = (-(-int(n) * int(dim) // 256),)
        steps(blocks, (256,), (rows, cols, part, n, dim, W, C, gW, gC, fdiff, eta, clip, uw, uc, tw2, tc2))
        apply(blocks, (256,), (rows, cols, part, n, dim, uw, uc, tw2, tc2, fdiff, sbw, sbc, W, C, gW, gC, bw, bc,
                               gbw, gbc))
    return float(cost[0])
