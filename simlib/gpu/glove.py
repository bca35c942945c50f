"""GloVe on one GPU: batched lock-free AdaGrad (gather rows, compute, scatter-add), NumPy or CuPy.

A batch of B co-occurrence entries is processed at once: every entry reads the rows as they
were before the batch (gather), computes its clipped AdaGrad steps, and all steps are added
back with a scatter-add, so two entries of one batch that share a word both land, each computed
from the same old row -- the GPU analogue of Hogwild's races, made deterministic. With B = 1
this is exactly the sequential update of :func:`simlib.problems.glove.adagrad_kernel`.

The batch is a staleness knob with a limit: a frequent word appears in many entries of one
batch, and all their steps, computed from the same old row, add up. On the KJV vocabulary
(5,323 words) batches of 1,024 and 8,192 entries reach the sequential cost after three epochs
(0.0202 and 0.0199), while 65,536 diverges (cost 2,587 after the first epoch). Keep the batch
near the vocabulary size or below; the default is 8,192.

On CuPy the same batch step also comes as three fused kernels (``kernel='fused'``, the default
there): one warp per entry computes its weighted error and bias steps, one thread per (entry,
dimension) its clipped AdaGrad steps from the old rows, and one thread per (entry, dimension)
adds them with atomics. The array step launches about thirty kernels per batch and is
launch-bound on a GPU; it stays as the NumPy path and as the fused kernels' reference.

The array code takes its module from the parameters (:func:`simlib.backend.array_module`), so
the same function runs on NumPy in tests and on CuPy on a GPU::

    >>> from simlib.data import load_kjv, Vocabulary
    >>> from simlib.problems.glove import count_cooccurrences
    >>> docs = load_kjv().docs[:2000]
    >>> vocab = Vocabulary.build(docs, min_count=5)
    >>> ids, offsets = vocab.encode_docs(docs)
    >>> cooc = count_cooccurrences(ids, offsets, len(vocab), window=10)
    >>> params, costs = train_batched(cooc, GloveConfig(dim=20, epochs=3), batch=1024, xp="auto")
    >>> costs[-1] < costs[0]  # the weighted least-squares cost falls epoch by epoch
    True
"""
from __future__ import annotations

from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, get_xp, scatter_add, to_numpy
from simlib.gpu import cuda_kernels, use_fused
from simlib.problems.glove import Cooccurrence, GloveConfig, GloveParams, entry_terms, epoch_order, validate_training


def adagrad_batch(arrays: tuple[Any, ...], rows: Any, cols: Any, logx: Any, fx: Any, batch: Any,
                  eta: float, clip: float) -> Any:
    """One batched AdaGrad step over entries ``batch`` (all read before any write).

    Returns sum 0.5 f diff^2 as a 0-d array on the parameters' device: reading it back to the
    host every batch would stall the GPU's queue, so the caller adds these up and converts once.
    """
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
    uw = tw / xp.sqrt(gW[i])
    uc = tc / xp.sqrt(gC[j])
    ub = fdiff  # the C update gives the biases no learning rate
    step_bw = ub / xp.sqrt(gbw[i])
    step_bc = ub / xp.sqrt(gbc[j])
    scatter_add(W, i, -uw)
    scatter_add(C, j, -uc)
    scatter_add(gW, i, tw * tw)
    scatter_add(gC, j, tc * tc)
    scatter_add(bw, i, -step_bw)
    scatter_add(bc, j, -step_bc)
    scatter_add(gbw, i, ub * ub)
    scatter_add(gbc, j, ub * ub)
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


def _fused_epoch(arrays: tuple[Any, ...], rows: Any, cols: Any, logx: Any, fx: Any, order: Any, batch: int,
                 eta: np.float32, clip: np.float32) -> float:  # pragma: no cover - needs a GPU
    """One pass of fused batch steps over ``order``; returns sum 0.5 f diff^2 (read back once)."""
    import cupy

    W, C, bw, bc, gW, gC, gbw, gbc = arrays
    errors, steps, apply = cuda_kernels(_FUSED_SOURCE, ("glove_errors", "glove_steps", "glove_apply"))
    dim = np.int32(W.shape[1])
    fdiff, sbw, sbc = (cupy.empty(batch, dtype=np.float32) for _ in range(3))
    uw, uc, tw2, tc2 = (cupy.empty(batch * int(dim), dtype=np.float32) for _ in range(4))
    cost = cupy.zeros(1, dtype=np.float64)
    for start in range(0, order.shape[0], batch):
        part = order[start:start + batch]
        n = np.int64(part.shape[0])
        errors((-(-int(n) * 32 // 256),), (256,), (rows, cols, logx, fx, part, n, dim, W, C, bw, bc, gbw, gbc,
                                                 fdiff, sbw, sbc, cost))
        blocks = (-(-int(n) * int(dim) // 256),)
        steps(blocks, (256,), (rows, cols, part, n, dim, W, C, gW, gC, fdiff, eta, clip, uw, uc, tw2, tc2))
        apply(blocks, (256,), (rows, cols, part, n, dim, uw, uc, tw2, tc2, fdiff, sbw, sbc, W, C, gW, gC, bw, bc,
                               gbw, gbc))
    return float(cost[0])


def train_batched(cooc: Cooccurrence, config: GloveConfig, batch: int = 8192,
                  xp: str = "auto", kernel: str = "auto") -> tuple[GloveParams, list[float]]:
    """GloVe with batched lock-free AdaGrad on ``xp`` ('numpy', 'cupy', 'auto'); (NumPy params, cost per epoch).

    ``kernel`` is 'array' (:func:`adagrad_batch`, NumPy or CuPy), 'fused' (three CUDA kernels per
    batch; CuPy only) or 'auto' (fused on CuPy).
    """
    check.positive_int("batch", batch)
    validate_training(cooc, config)
    mod = get_xp(xp)
    fused = use_fused(kernel, mod)
    host = GloveParams.init(cooc.n_words, config)
    arrays = tuple(mod.asarray(a) for a in host.arrays())
    logx, fx = (mod.asarray(a) for a in entry_terms(cooc.values, config))
    rows, cols = mod.asarray(cooc.rows.astype(np.int32)), mod.asarray(cooc.cols.astype(np.int32))
    eta, clip = np.float32(config.lr), np.float32(config.grad_clip)
    costs = []
    for epoch in range(config.epochs):
        order = mod.asarray(epoch_order(cooc.nnz, config.seed, epoch))
        if fused:  # pragma: no cover - needs a GPU
            costs.append(_fused_epoch(arrays, rows, cols, logx, fx, order, batch, eta, clip) / cooc.nnz)
            continue
        total = 0.0
        for start in range(0, cooc.nnz, batch):
            total += adagrad_batch(arrays, rows, cols, logx, fx, order[start:start + batch], eta, clip)
        costs.append(float(total) / cooc.nnz)
    return GloveParams(*(to_numpy(a) for a in arrays)), costs
