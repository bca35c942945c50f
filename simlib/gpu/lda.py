"""LDA on one GPU: every token of a batch resampled at once against a snapshot of the counts.

Sequential Gibbs resamples one token at a time against counts that include every earlier
move. Here a batch of B tokens reads the count tables as they were before the batch (a
gather), each token's own assignment is taken out of its gathered rows, all B conditionals

    p(k) ∝ (n_dk + alpha)(n_wk + beta) / (n_k + V beta)        (a B x K array)

are built at once and inverted with one uniform per token (cumulative sum over K, then count
the entries below u * total), and the count changes of the whole batch land together with a
scatter-add. Two tokens of one batch never see each other's move: the same staleness trade-off
as AD-LDA's workers, with B playing the number of workers. ``n_batches`` batches make a sweep;
more batches means fresher counts and more, smaller kernels.

On CuPy the batch also comes as two fused kernels (``kernel='fused'``, the default there): one
thread per token walks its K topics twice (the total, then the inverse CDF) against the
snapshot, and one thread per token moves its counts with atomic adds. The array step builds a
B x K table and launches a dozen kernels per batch; it stays as the NumPy path and as the fused
kernels' reference.

The array code takes its module from the counts (:func:`simlib.backend.array_module`), so the
same function runs on NumPy in tests and on CuPy on a GPU::

    >>> from simlib.problems.lda import make_synthetic_corpus
    >>> corpus, phi, _ = make_synthetic_corpus(seed=0)
    >>> run = train_batched(corpus, n_topics=8, alpha=0.5, n_sweeps=5, n_batches=10, xp="numpy")
    >>> run.trace.substrate
    'gpu'
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, get_xp, segment_sum, synchronize, to_numpy
from simlib.gpu import cuda_kernels, use_fused
from simlib.problems.lda import LDACorpus, check_corpus, check_hyper, count_tables, log_likelihood, random_assignments
from simlib.trace import Trace


@dataclass
class BatchedLDARun:
    """The trace and final state (host arrays) of a batched run."""

    trace: Trace
    z: np.ndarray
    n_dk: np.ndarray
    n_wk: np.ndarray
    n_k: np.ndarray
    tokens_per_s: float  # tokens resampled per second, log-likelihood checks excluded


def resample_batch(
    xp: ModuleType, idx: Any, words: Any, docs: Any, z: Any, n_dk: Any, n_wk: Any, n_k: Any,
    alpha: float, beta: float, u: Any,
) -> None:
    """Redraw the topics of tokens ``idx`` from one snapshot of the counts, then scatter-add the changes."""
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


def resample_fused(
    idx: Any, words: Any, docs: Any, z: Any, n_dk: Any, n_wk: Any, n_k: Any, alpha: float, beta: float, u: Any,
    newz: Any,
) -> None:  # pragma: no cover - needs a GPU
    """:func:`resample_batch` as two CUDA kernels (int32 counts, int64 indices; ``newz`` a scratch buffer)."""
    draw, move = cuda_kernels(_FUSED_SOURCE, ("lda_draw", "lda_move"))
    K = np.int32(n_dk.shape[1])
    n = np.int64(idx.shape[0])
    blocks = (-(-int(n) // 256),)
    draw(blocks, (256,), (idx, n, words, docs, z, n_dk, n_wk, n_k, K, np.float32(alpha), np.float32(beta),
                          np.float32(n_wk.shape[0] * beta), u, newz))
    move(blocks, (256,), (idx, n, words, docs, z, newz, n_dk, n_wk, n_k, K))


def train_batched(
    corpus: LDACorpus,
    n_topics: int,
    alpha: float = 0.1,
    beta: float = 0.01,
    n_sweeps: int = 20,
    n_batches: int = 8,
    seed: int = 0,
    xp: str | ModuleType = "auto",
    record_every: int = 1,
    kernel: str = "auto",
) -> BatchedLDARun:
    """Batched collapsed Gibbs on NumPy or CuPy: each sweep visits the tokens in ``n_batches`` random batches.

    Returns the final state and a Trace (substrate 'gpu', metric 'log_likelihood', higher is
    better) with the joint log p(w, z) every ``record_every`` sweeps against wall seconds of
    sampling, and one update per batch.
    """
    check_corpus(corpus)
    check_hyper(n_topics, alpha, beta)
    check.positive_int("n_sweeps", n_sweeps)
    check.positive_int("n_batches", n_batches)
    check.positive_int("record_every", record_every)
    if n_batches > corpus.n_tokens:
        raise ValueError(f"n_batches must be <= the number of tokens ({corpus.n_tokens}), got {n_batches}")
    mod = get_xp(xp) if isinstance(xp, str) else xp
    fused = use_fused(kernel, mod)
    K = n_topics
    z_host = random_assignments(corpus, K, seed)
    n_dk_h, n_wk_h, n_k_h = count_tables(corpus, z_host, K)
    words, docs = mod.asarray(corpus.words.astype(np.int64)), mod.asarray(corpus.doc_of.astype(np.int64))
    z = mod.asarray(z_host.astype(np.int64))
    n_dk, n_wk, n_k = mod.asarray(n_dk_h), mod.asarray(n_wk_h), mod.asarray(n_k_h)
    assert array_module(n_dk) is mod
    rng = np.random.default_rng(seed)
    newz = mod.empty(-(-corpus.n_tokens // n_batches) + 1, dtype=np.int64) if fused else None
    trace = Trace(label=f"lda-batched-{n_batches}", substrate="gpu", n_workers=1, metric="log_likelihood",
                  lower_is_better=False, meta=dict(n_batches=n_batches, n_topics=K, backend=mod.__name__,
                                                                  kernel="fused" if fused else "array"))
    trace.record_quality(0.0, 0, log_likelihood(n_dk_h, n_wk_h, n_k_h, alpha, beta))
    elapsed = 0.0
    for sweep in range(n_sweeps):
        start = time.perf_counter()
        # Host-side permutation and uniforms keep NumPy and CuPy runs on the same random stream.
        order = mod.asarray(rng.permutation(corpus.n_tokens))
        uniforms = mod.asarray(rng.random(corpus.n_tokens, dtype=np.float32))
        bounds = np.linspace(0, corpus.n_tokens, n_batches + 1).astype(np.int64)
        for b in range(n_batches):
            sl = slice(int(bounds[b]), int(bounds[b + 1]))
            if fused:  # pragma: no cover - needs a GPU
                resample_fused(order[sl], words, docs, z, n_dk, n_wk, n_k, float(alpha), float(beta), uniforms[sl], newz)
            else:
                resample_batch(mod, order[sl], words, docs, z, n_dk, n_wk, n_k, float(alpha), float(beta), uniforms[sl])
            trace.update(elapsed + time.perf_counter() - start, 0, sweep * n_batches + b, staleness=0)
        synchronize(mod)
        end = time.perf_counter()
        trace.span(0, "compute", elapsed, elapsed + end - start, step=sweep)
        elapsed += end - start
        if (sweep + 1) % record_every == 0 or sweep == n_sweeps - 1:
            trace.record_quality(elapsed, sweep + 1, log_likelihood(to_numpy(n_dk), to_numpy(n_wk), to_numpy(n_k), alpha, beta))
    return BatchedLDARun(trace, to_numpy(z).astype(np.int32), to_numpy(n_dk), to_numpy(n_wk), to_numpy(n_k),
                         corpus.n_tokens * n_sweeps / elapsed)

