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
also comes as two fused kernels (``device_kernel='fused'``): one thread per token
walks its K topics twice (the total, then the inverse CDF) against the snapshot, and one thread per
token moves its counts with atomic adds. :func:`resample_batch` builds a B x K table and launches a
dozen kernels per batch; it is the NumPy path and the fused kernels' reference.

``device_kernel='hogwild'`` (and 'auto', the default, on NumPy and CuPy alike, up to
:data:`MAX_CHAIN_TOPICS` topics) needs no batches. It
keeps Gibbs sequential where it matters, within a document: one block of
W warps per document (W = ``batch_size``, at most 32), its doc-topic counts in the block's shared
memory, each warp drawing every W-th token of the document in turn from the counts as they are
(the word's row read through L2, where the other blocks' atomic adds land), the 32 lanes splitting
the K topics. The topic totals n_k are the block's own copy, its moves applied at once and
exchanged with the global totals every 8 rounds. A document has W tokens in flight, the corpus a
few thousand, and a sweep is one launch. Every move lands, so the counts stay exact.
:func:`chain_sweep` is its NumPy twin: the same uniforms (a hash of the sweep's seed and the token),
the same topic order, the documents one after another and each document's W warps in lock step.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from numba import njit

from simlib.backend import array_module, cuda_kernels, segment_sum, use_fused
from simlib.problems.lda_gibbs import blocks


@dataclass
class DeviceShard:
    """A worker's tokens, their topics ``z`` and its doc-topic counts on one array module (int64, int32 counts)."""

    xp: ModuleType
    words: Any
    docs: Any
    z: Any
    n_dk: Any
    newz: Any = None  # the fused kernels' scratch buffer of new topics
    chains: Any = None  # the lock-free sweep's (document offsets, documents longest first)

    @classmethod
    def of(cls, state: Any, xp: ModuleType) -> "DeviceShard":
        """The device copy of a worker's Gibbs state."""
        corpus = state.corpus
        longest_first = np.argsort(-np.diff(corpus.offsets), kind="stable").astype(np.int32)  # the last wave is short
        return cls(xp, xp.asarray(corpus.words.astype(np.int64)), xp.asarray(corpus.doc_of.astype(np.int64)),
                   xp.asarray(state.z.astype(np.int64)), xp.asarray(state.n_dk.astype(np.int32)),
                   chains=(xp.asarray(corpus.offsets.astype(np.int64)), xp.asarray(longest_first)))


def resample_batch(shard: DeviceShard, idx: Any, n_wk: Any, n_k: Any, alpha: float, beta: float, u: Any) -> None:
    """Redraw the topics of the shard's tokens ``idx`` from one snapshot of the counts, then scatter-add the changes."""
    xp, words, docs, z, n_dk = shard.xp, shard.words, shard.docs, shard.z, shard.n_dk
    D, K = n_dk.shape
    V = n_wk.shape[0]
    w, d, old = words[idx], docs[idx], z[idx]
    # Gather the snapshot in float32 and take each token out of its own rows (the other tokens stay in).
    own = xp.arange(K) == old[:, None]
    ndk, nwk, nk = (a.astype(xp.float32) - own for a in (n_dk[d], n_wk[w], n_k))
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
    grid = (-(-int(n) // 256),)
    draw(grid, (256,), (idx, n, words, docs, z, n_dk, n_wk, n_k, K, np.float32(alpha), np.float32(beta),
                          np.float32(n_wk.shape[0] * beta), u, newz))
    move(grid, (256,), (idx, n, words, docs, z, newz, n_dk, n_wk, n_k, K))


def device_sweeps(problem: Any, table: Any, shard: Any, first: int, count: int, batch_size: int) -> None:
    """Sweeps first .. first+count-1 of a shard on the device table (n_wk then n_k, int32), in place.

    Lock-free (:func:`chain_sweep`), or in batches: then each sweep's token order and uniforms come
    from the host generator seeded by the shard's sweep seed, so NumPy and CuPy runs draw the same stream.
    """
    xp = array_module(table)
    n_wk, n_k = problem.split(table)
    if shard.device is None or shard.device.xp is not xp:
        shard.device = DeviceShard.of(shard.state, xp)
    dev = shard.device
    n = int(dev.z.shape[0])
    kernel = problem.device_kernel
    chains = kernel == "hogwild" or (kernel == "auto" and n_k.shape[0] <= MAX_CHAIN_TOPICS)
    fused = not chains and use_fused(kernel, xp)  # 'auto' past MAX_CHAIN_TOPICS: the batches, fused on CuPy
    resample = resample_fused if fused else resample_batch
    if fused and (dev.newz is None or dev.newz.shape[0] < min(batch_size, n)):  # pragma: no cover - needs a GPU
        dev.newz = xp.empty(min(batch_size, n), dtype=np.int64)
    for clock in range(first, first + count):
        shard.clock = clock
        if chains:
            chain_sweep(dev, n_wk, n_k, (problem.alpha, problem.beta), shard.sweep_seed(), batch_size)
            continue
        rng = np.random.default_rng(shard.sweep_seed())
        order = xp.asarray(rng.permutation(n))
        uniforms = xp.asarray(rng.random(n, dtype=np.float32))
        for lo in range(0, n, batch_size):
            sl = slice(lo, min(lo + batch_size, n))
            resample(dev, order[sl], n_wk, n_k, problem.alpha, problem.beta, uniforms[sl])


_CHAINS_SOURCE = r"""
#define K __K__
#define PER ((K + 31) / 32)
#define REFRESH 8

__device__ __forceinline__ float uniform(unsigned long long seed, long long t) {
    // splitmix64 of (seed, token): 24 bits in [0, 1); chain_uniform is the same on the host
    unsigned long long x = seed + (unsigned long long)t * 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

extern "C" __global__ void lda_chains(
    const int* __restrict__ order, const long long* __restrict__ offsets, const long long* __restrict__ words,
    long long* __restrict__ z, int* __restrict__ n_dk, int* __restrict__ n_wk, int* __restrict__ n_k,
    const float alpha, const float beta, const float vbeta, const unsigned long long seed)
{
    // A block per document: its counts n_dk, and its view of the totals n_k, in shared memory. Warp j draws
    // tokens j, j + W, ... in rounds, lane l holding topics l, l + 32, ... (the order the CDF is walked in).
    // n_k is the block's copy: read at the start and every REFRESH rounds, the block's own moves applied
    // to it at once; they reach the global n_k at those refreshes (all blocks reading the same K counts
    // from L2 for every token, and adding to them, made a few cache lines the whole sweep's bottleneck).
    __shared__ int ndk[K], nk[K], base[K];
    volatile int* vdk = ndk;
    volatile int* vnk = nk;
    const long long d = order[blockIdx.x];
    const long long lo = offsets[d], hi = offsets[d + 1];
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        ndk[k] = n_dk[d * K + k];
        nk[k] = base[k] = __ldcg(n_k + k);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const long long rounds = (hi - lo + warps - 1) / warps;
    long long t = lo + (threadIdx.x >> 5);
    long long w = t < hi ? words[t] : 0;
    int old = t < hi ? (int)z[t] : 0;
    for (long long r = 0; r < rounds; ++r, t += warps) {
        long long w_next = 0;  // the warp's next token, loaded while this one is drawn (only this warp writes its z)
        int old_next = 0;
        if (t + warps < hi) {
            w_next = words[t + warps];
            old_next = (int)z[t + warps];
        }
        if (t < hi) {
            const int* row = n_wk + w * K;
            float p[PER];
            float own_sum = 0.0f;
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                const int k = lane + 32 * j;
                float v = 0.0f;
                if (k < K) {  // the token's own count comes out of all three (it is counted until it moves)
                    const float own = (k == old) ? 1.0f : 0.0f;
                    v = __fdividef(((float)vdk[k] - own + alpha) * ((float)__ldcg(row + k) - own + beta),
                                   (float)vnk[k] - own + vbeta);
                }
                p[j] = v;
                own_sum += v;
            }
            float incl = own_sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            const float u = uniform(seed, t) * __shfl_sync(0xffffffffu, incl, 31);
            const unsigned hit = __ballot_sync(0xffffffffu, incl > u);
            const int src = hit ? __ffs(hit) - 1 : 0;
            int pick = -1, last = -1;
            float cdf = incl - own_sum;
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                cdf += p[j];
                if (p[j] > 0.0f) last = lane + 32 * j;
                if (pick < 0 && p[j] > 0.0f && u < cdf) pick = lane + 32 * j;
            }
            if (pick < 0) pick = last;  // rounding left u past the lane's sum: its last topic
            pick = __shfl_sync(0xffffffffu, hit ? pick : old, src);
            if (lane == 0 && pick >= 0 && pick != old) {
                z[t] = pick;
                atomicSub(&ndk[old], 1);
                atomicAdd(&ndk[pick], 1);
                atomicSub(&nk[old], 1);
                atomicAdd(&nk[pick], 1);
                atomicSub(n_wk + w * K + old, 1);
                atomicAdd(n_wk + w * K + pick, 1);
            }
        }
        w = w_next;
        old = old_next;
        if ((r + 1) % REFRESH == 0 || r + 1 == rounds) {  // the same rounds for every warp of the block
            __syncthreads();
            for (int k = threadIdx.x; k < K; k += blockDim.x) {
                const int moved = nk[k] - base[k];
                if (moved != 0) atomicAdd(n_k + k, moved);
            }
            __syncthreads();
            for (int k = threadIdx.x; k < K; k += blockDim.x) nk[k] = base[k] = __ldcg(n_k + k);
            __syncthreads();
        }
    }
    for (int k = threadIdx.x; k < K; k += blockDim.x) n_dk[d * K + k] = ndk[k];
}
"""

#: The lock-free sweep keeps three rows of K counts in a block's shared memory (48 KB by default).
MAX_CHAIN_TOPICS = 4_000


@functools.lru_cache(maxsize=None)
def _chains_kernel(n_topics: int) -> tuple[Any, int]:  # pragma: no cover - needs a GPU
    """The kernel for ``n_topics``, and the most warps a block of it may have (its registers bound that)."""
    (kernel,) = cuda_kernels(_CHAINS_SOURCE.replace("__K__", str(n_topics)), ("lda_chains",))
    return kernel, getattr(kernel, "max_threads_per_block", 1024) // 32


def chain_sweep(dev: DeviceShard, n_wk: Any, n_k: Any, prior: tuple[float, float], seed: int, warps: int) -> None:
    """One lock-free sweep of a shard: ``warps`` tokens of each document in flight (1 to 32), the counts exact."""
    D, K = dev.n_dk.shape
    if K > MAX_CHAIN_TOPICS:
        raise ValueError(f"n_topics: device_kernel='hogwild' keeps a document's counts in shared memory, so at most "
                         f"{MAX_CHAIN_TOPICS:,} topics, got {K:,}; use 'fused' (CuPy) or 'array'")
    offsets, order = dev.chains
    warps = max(1, min(int(warps), 32))
    alpha, beta = prior
    vbeta, seed = n_wk.shape[0] * beta, np.uint64(seed % 2**64)
    if dev.xp is np:  # a compiled call per block of documents (lda_gibbs.BLOCK tokens): Ctrl-C is answered between them
        ptr = np.concatenate([[0], np.cumsum(offsets[order + 1] - offsets[order])])
        cuts = blocks(ptr, 0, len(order))
        for a, b in zip(cuts[:-1], cuts[1:]):
            _chain_sweep_host(order[a:b], offsets, dev.words, (dev.z, dev.n_dk, n_wk, n_k), (alpha, beta, vbeta), seed,
                              warps)
        return
    kernel, most = _chains_kernel(K)  # pragma: no cover - needs a GPU
    kernel((D,), (32 * min(warps, most),), (order, offsets, dev.words, dev.z, dev.n_dk, n_wk, n_k,  # pragma: no cover
                                            np.float32(alpha), np.float32(beta), np.float32(vbeta), seed))


@njit(cache=True)
def chain_uniform(seed, t):  # pragma: no cover - compiled
    """The lock-free sweep's uniform for token ``t`` of a sweep seeded ``seed`` (uint64): the kernel's hash, float32."""
    x = seed + np.uint64(t) * np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return np.float32(x >> np.uint64(40)) * np.float32(1.0 / 16777216.0)


@njit(cache=True)
def _chain_draw(t, counts, prior, seed):  # pragma: no cover - compiled
    """Token t's new topic from the counts as they are: the kernel's lane-major walk in float32."""
    words, z, n_dk_row, n_wk, n_k = counts
    alpha, beta, vbeta = prior
    K = n_k.shape[0]
    w, old = words[t], z[t]
    per = (K + 31) // 32
    p = np.zeros((32, per), np.float32)
    sums = np.zeros(32, np.float32)
    for lane in range(32):
        for j in range(per):
            k = lane + 32 * j
            if k < K:
                own = np.float32(1.0) if k == old else np.float32(0.0)
                p[lane, j] = ((np.float32(n_dk_row[k]) - own + np.float32(alpha))
                              * (np.float32(n_wk[w, k]) - own + np.float32(beta))
                              / (np.float32(n_k[k]) - own + np.float32(vbeta)))
                sums[lane] += p[lane, j]
    incl = np.cumsum(sums)
    u = chain_uniform(seed, t) * incl[31]
    for lane in range(32):
        if incl[lane] > u:
            cdf, last = incl[lane] - sums[lane], -1
            for j in range(per):
                cdf += p[lane, j]
                if p[lane, j] > 0:
                    last = lane + 32 * j
                    if u < cdf:
                        return lane + 32 * j
            return last
    return old


@njit(cache=True)
def _chain_sweep_host(order, offsets, words, state, prior, seed, warps):  # pragma: no cover - compiled
    """The lock-free sweep on the host: documents in turn, each document's ``warps`` draws of a round from one read."""
    z, n_dk, n_wk, n_k = state
    picks = np.empty(warps, np.int64)
    for d in order:
        lo, hi = offsets[d], offsets[d + 1]
        for first in range(lo, hi, warps):
            last = min(first + warps, hi)
            for t in range(first, last):
                picks[t - first] = _chain_draw(t, (words, z, n_dk[d], n_wk, n_k), prior, seed)
            for t in range(first, last):
                new, old, w = picks[t - first], z[t], words[t]
                if new >= 0 and new != old:
                    z[t] = new
                    n_dk[d, old] -= 1
                    n_dk[d, new] += 1
                    n_wk[w, old] -= 1
                    n_wk[w, new] += 1
                    n_k[old] -= 1
                    n_k[new] += 1
