"""LDA's steps on the gpu substrate: every token of a batch resampled at once against one read of the counts.

Sequential Gibbs resamples one token at a time against counts that include every earlier move.
Here a batch of B tokens reads the count tables as they were before the batch (a gather), each
token's own assignment is taken out of its gathered rows, all B conditionals

    p(k) ∝ (n_dk + alpha)(n_wk + beta) / (n_k + V beta)        (a B x K array)

are built at once and inverted with one uniform per token (cumulative sum over K, then count the
entries below u * total), and the count changes of the whole batch land together with a
scatter-add. Two tokens of one batch never see each other's move: the same staleness trade-off as
AD-LDA's workers, with B playing the number of workers. A sweep visits the shard's tokens in a
random order, ``batch_size`` tokens per batch: smaller batches mean fresher counts and more, smaller
kernels.

:meth:`LDAProblem.device_steps <simlib.problems.lda_table.LDAProblem.device_steps>` is the gpu
substrate's hook (the shm and pipes substrates keep the exact sequential sweep). On CuPy the batch
also comes as two fused kernels (``device_kernel='fused'``, the default there): one thread per token
walks its K topics twice (the total, then the inverse CDF) against the snapshot, and one thread per
token moves its counts with atomic adds. :func:`resample_batch` builds a B x K table and launches a
dozen kernels per batch; it is the NumPy path and the fused kernels' reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from simlib.backend import array_module, cuda_kernels, segment_sum, use_fused


@dataclass
class DeviceShard:
    """A worker's tokens, their topics ``z`` and its doc-topic counts on one array module (int64, int32 counts)."""

    xp: ModuleType
    words: Any
    docs: Any
    z: Any
    n_dk: Any
    newz: Any = None  # the fused kernels' scratch buffer of new topics

    @classmethod
    def of(cls, state: Any, xp: ModuleType) -> "DeviceShard":
        """The device copy of a worker's Gibbs state."""
        corpus = state.corpus
        return cls(xp, xp.asarray(corpus.words.astype(np.int64)), xp.asarray(corpus.doc_of.astype(np.int64)),
                   xp.asarray(state.z.astype(np.int64)), xp.asarray(state.n_dk.astype(np.int32)))


def resample_batch(shard: DeviceShard, idx: Any, n_wk: Any, n_k: Any, alpha: float, beta: float, u: Any) -> None:
    """Redraw the topics of the shard's tokens ``idx`` from one snapshot of the counts, then scatter-add the changes."""
    xp, words, docs, z, n_dk = shard.xp, shard.words, shard.docs, shard.z, shard.n_dk
    D, K = n_dk.shape
    V = n_wk.shape[0]
    w, d, old = words[idx], docs[idx], z[idx]
    rows = xp.arange(idx.shape[0])
    # Gather the snapshot and take each token out of its own rows (the other tokens stay in).
    ndk = n_dk[d].astype(xp.float32)
    nwk = n_wk[w].astype(xp.float32)
    nk = xp.broadcast_to(n_k.astype(xp.float32), ndk.shape).copy()
    ndk[rows, old] -= 1
    nwk[rows, old] -= 1
    nk[rows, old] -= 1
    p = (ndk + alpha) * (nwk + beta) / (nk + V * beta)
    cdf = xp.cumsum(p, axis=1)
    # NOTE: inverse CDF with one uniform per token (count of cdf entries below u * total);
    # Gumbel-max would need B x K random numbers for the same draw.
    new = xp.minimum((cdf < (u * cdf[:, -1])[:, None]).sum(axis=1), K - 1).astype(z.dtype)
    z[idx] = new
    # Scatter-add of the whole batch's moves as two bincounts on flat indices (repeats accumulate).
    n_dk += (segment_sum(d * K + new, None, D * K) - segment_sum(d * K + old, None, D * K)).reshape(D, K).astype(n_dk.dtype)
    n_wk += (segment_sum(w * K + new, None, V * K) - segment_sum(w * K + old, None, V * K)).reshape(V, K).astype(n_wk.dtype)
    n_k += (segment_sum(new, None, K) - segment_sum(old, None, K)).astype(n_k.dtype)


_FUSED_SOURCE = r"""
extern "C" __global__ void lda_draw(
    const long long* idx, const long long n, const long long* words, const long long* docs,
    const long long* z, const int* n_dk, const int* n_wk, const int* n_k, const int K,
    const float alpha, const float beta, const float vbeta, const float* u, long long* newz)
{
    // One thread per token: p(k) from the snapshot with the token's own assignment taken out,
    // summed once for the total, then walked again to the first k whose CDF reaches u * total.
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const long long tok = idx[t], w = words[tok], d = docs[tok], old = z[tok];
    float total = 0.0f;
    for (int k = 0; k < K; ++k) {
        const float own = (k == old) ? 1.0f : 0.0f;
        total += ((float)n_dk[d * K + k] - own + alpha) * ((float)n_wk[w * K + k] - own + beta)
                 / ((float)n_k[k] - own + vbeta);
    }
    const float target = u[t] * total;
    float cdf = 0.0f;
    long long pick = K - 1;
    for (int k = 0; k < K; ++k) {
        const float own = (k == old) ? 1.0f : 0.0f;
        cdf += ((float)n_dk[d * K + k] - own + alpha) * ((float)n_wk[w * K + k] - own + beta)
               / ((float)n_k[k] - own + vbeta);
        if (cdf >= target) { pick = k; break; }
    }
    newz[t] = pick;
}

extern "C" __global__ void lda_move(
    const long long* idx, const long long n, const long long* words, const long long* docs,
    long long* z, const long long* newz, int* n_dk, int* n_wk, int* n_k, const int K)
{
    // One thread per token: the batch's moves land together (tokens of one batch are distinct).
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const long long tok = idx[t], old = z[tok], nw = newz[t];
    if (nw == old) return;
    const long long w = words[tok], d = docs[tok];
    z[tok] = nw;
    atomicAdd(&n_dk[d * K + nw], 1);
    atomicSub(&n_dk[d * K + old], 1);
    atomicAdd(&n_wk[w * K + nw], 1);
    atomicSub(&n_wk[w * K + old], 1);
    atomicAdd(&n_k[nw], 1);
    atomicSub(&n_k[old], 1);
}
"""


def resample_fused(shard: DeviceShard, idx: Any, n_wk: Any, n_k: Any, alpha: float, beta: float,
                   u: Any) -> None:  # pragma: no cover - needs a GPU
    """:func:`resample_batch` as two CUDA kernels (int32 counts, int64 indices; ``shard.newz`` a scratch buffer)."""
    words, docs, z, n_dk, newz = shard.words, shard.docs, shard.z, shard.n_dk, shard.newz
    draw, move = cuda_kernels(_FUSED_SOURCE, ("lda_draw", "lda_move"))
    K = np.int32(n_dk.shape[1])
    n = np.int64(idx.shape[0])
    blocks = (-(-int(n) // 256),)
    draw(blocks, (256,), (idx, n, words, docs, z, n_dk, n_wk, n_k, K, np.float32(alpha), np.float32(beta),
                          np.float32(n_wk.shape[0] * beta), u, newz))
    move(blocks, (256,), (idx, n, words, docs, z, newz, n_dk, n_wk, n_k, K))


def device_sweeps(problem: Any, table: Any, shard: Any, first: int, count: int, batch_size: int) -> None:
    """Sweeps first .. first+count-1 of a shard on the device table (n_wk then n_k, int32), in place.

    Each sweep's token order and uniforms come from the host generator seeded by the shard's sweep
    seed, so NumPy and CuPy runs draw the same stream.
    """
    xp = array_module(table)
    n_wk, n_k = problem.split(table)
    if shard.device is None or shard.device.xp is not xp:
        shard.device = DeviceShard.of(shard.state, xp)
    dev = shard.device
    fused = use_fused(problem.device_kernel, xp)
    resample = resample_fused if fused else resample_batch
    n = int(dev.z.shape[0])
    if fused and (dev.newz is None or dev.newz.shape[0] < min(batch_size, n)):  # pragma: no cover - needs a GPU
        dev.newz = xp.empty(min(batch_size, n), dtype=np.int64)
    for clock in range(first, first + count):
        shard.clock = clock
        rng = np.random.default_rng(shard.sweep_seed())
        order = xp.asarray(rng.permutation(n))
        uniforms = xp.asarray(rng.random(n, dtype=np.float32))
        for lo in range(0, n, batch_size):
            sl = slice(lo, min(lo + batch_size, n))
            resample(dev, order[sl], n_wk, n_k, problem.alpha, problem.beta, uniforms[sl])
