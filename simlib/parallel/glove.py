"""Model-parallel GloVe on worker processes sharing memory: each process owns a slice of the dimensions.

Worker p owns the slice p of the embedding dimensions (of W, C and their AdaGrad accumulators,
held in shared memory as :class:`~simlib.parallel.SharedArray`) for every word. For each batch of
entries each worker writes its partial dot products w_i[slice] . c_j[slice] to shared memory
(worker 0 adds the biases); after a barrier every worker sums the partials into diff and updates
only its own slice with the AdaGrad update of :mod:`simlib.problems.glove`. Parameters never move;
only B floats per worker per batch do. Within a batch the dot products are computed before the
batch's updates (at most B - 1 updates stale).

This is not a parameter-server pattern (workers exchange partial results about the examples, not
rows of a table), so it stands beside :func:`simlib.run`; data-parallel GloVe (Hogwild, BSP) runs
through the contract: ``simlib.run(GloveProblem(cooc, config), "async", substrate="shm")``. The
result, a :class:`GloveRun`, has a trace (``substrate="parallel"``) with one quality point per
epoch: the C program's cost, the mean of 0.5 f diff^2 over the pass.

Example::

    >>> from simlib.data import load_kjv, Vocabulary
    >>> from simlib.problems.glove import count_cooccurrences
    >>> docs = load_kjv().docs[:2000]
    >>> vocab = Vocabulary.build(docs, min_count=5)
    >>> ids, offsets = vocab.encode_docs(docs)
    >>> cooc = count_cooccurrences(ids, offsets, len(vocab), window=10)
    >>> run = train_model_parallel(cooc, GloveConfig(dim=20, epochs=3), n_workers=2)
    >>> run.costs[-1] < run.costs[0], run.updates_per_s > 0
    (True, True)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from threading import Barrier
from typing import Any, Callable

import numpy as np
from numba import njit

from simlib import _validate as check
from simlib.parallel.group import WorkerGroup
from simlib.parallel.shm import SharedArray
from simlib.parallel.worker import current
from simlib.problems.glove import Cooccurrence, GloveConfig, GloveParams, entry_terms, epoch_order, validate_training
from simlib.trace import Trace

_ENTRIES = ("rows", "cols", "logx", "fx")  # the shared arrays of the co-occurrence entries, in this order
_BARRIER_TIMEOUT = 600.0  # a peer that died is noticed by the group long before this


@dataclass
class GloveRun:
    """What a model-parallel run returns: final parameters (copies), cost per epoch, speed, and the trace."""

    params: GloveParams
    costs: list[float]
    epoch_seconds: list[float]
    nnz: int
    trace: Trace
    n_workers: int
    extra: dict = field(default_factory=dict)

    @property
    def updates_per_s(self) -> float:
        """Entry updates per second over all epochs: epochs * nnz / total epoch time."""
        return len(self.epoch_seconds) * self.nnz / max(sum(self.epoch_seconds), 1e-12)


def _shard(n: int, worker_id: int, n_workers: int) -> slice:
    """Worker ``worker_id``'s contiguous share of n items."""
    return slice(n * worker_id // n_workers, n * (worker_id + 1) // n_workers)


def _setup(data: dict[str, SharedArray], config: GloveConfig) -> tuple:
    """A worker's context, its entry arrays (rows, cols, logx, fx), and the float32 step size and clip."""
    ctx = current()
    assert ctx is not None
    return ctx, *(data[k].array for k in _ENTRIES), np.float32(config.lr), np.float32(config.grad_clip)


# -- model-parallel -------------------------------------------------------------------------------


@njit(nogil=True, cache=True, fastmath=True)
def partial_dots_kernel(rows, cols, order, W, C, lo, hi, bw, bc, with_bias, out) -> None:
    """out[t] = W[i, lo:hi] . C[j, lo:hi] (+ b_i + b'_j if ``with_bias``) for entry order[t] = (i, j)."""
    for t in range(order.shape[0]):
        e = order[t]
        i = rows[e]
        j = cols[e]
        s = bw[i] + bc[j] if with_bias else np.float32(0.0)
        for k in range(lo, hi):
            s += W[i, k] * C[j, k]
        out[t] = s


@njit(nogil=True, cache=True, fastmath=True)
def slice_update_kernel(rows, cols, logx, fx, order, partials, W, C, gW, gC, lo, hi,
                        bw, bc, gbw, gbc, with_bias, eta, clip) -> float:
    """diff = sum of the partial dots - log X; AdaGrad on dimensions [lo, hi) (and the biases); returns cost."""
    cost = 0.0
    for t in range(order.shape[0]):
        e = order[t]
        i = rows[e]
        j = cols[e]
        diff = -logx[e]
        for p in range(partials.shape[0]):
            diff += partials[p, t]
        g = fx[e] * diff
        cost += 0.5 * g * diff
        for k in range(lo, hi):
            tw = min(max(g * C[j, k], -clip), clip) * eta
            tc = min(max(g * W[i, k], -clip), clip) * eta
            uw = tw / np.sqrt(gW[i, k])
            uc = tc / np.sqrt(gC[j, k])
            gW[i, k] += tw * tw
            gC[j, k] += tc * tc
            W[i, k] -= uw
            C[j, k] -= uc
        if with_bias:
            bw[i] -= g / np.sqrt(gbw[i])
            bc[j] -= g / np.sqrt(gbc[j])
            gbw[i] += g * g
            gbc[j] += g * g
    return cost


def _model_worker(worker_id: int, n_workers: int, data: dict[str, SharedArray], params: dict[str, SharedArray],
                  costs: SharedArray, partials: SharedArray, config: GloveConfig, batch: int, barrier) -> None:
    """Worker: own dimensions [lo, hi); per batch, publish partial dots, wait, update the own slice."""
    ctx, rows, cols, logx, fx, eta, clip = _setup(data, config)
    W, C, bw, bc, gW, gC, gbw, gbc = (params[k].array for k in GloveParams.ARRAYS)
    dims = _shard(config.dim, worker_id, n_workers)
    lo, hi = dims.start, dims.stop
    with_bias = worker_id == 0  # worker 0 owns the biases
    nnz = rows.shape[0]
    buf = partials.array
    for epoch in range(config.epochs):
        order = epoch_order(nnz, config.seed, epoch)
        cost = 0.0
        for b, start in enumerate(range(0, nnz, batch)):
            part = order[start:start + batch]
            # Double-buffered: batch b writes buffer b % 2, so one barrier per batch suffices.
            out = buf[b % 2, :, : part.shape[0]]
            with ctx.timed("compute", step=epoch):
                partial_dots_kernel(rows, cols, part, W, C, lo, hi, bw, bc, with_bias, out[worker_id])
            with ctx.timed("wait", step=epoch):
                barrier.wait(_BARRIER_TIMEOUT)
            with ctx.timed("compute", step=epoch):
                cost += slice_update_kernel(rows, cols, logx, fx, part, out, W, C, gW, gC, lo, hi,
                                            bw, bc, gbw, gbc, with_bias, eta, clip)
        costs.array[epoch, worker_id] = cost
        ctx.update(step=epoch, staleness=0)
        with ctx.timed("wait", step=epoch):
            barrier.wait(_BARRIER_TIMEOUT)
        if worker_id == 0:
            ctx.record_quality(epoch + 1, float(costs.array[epoch, 0] / nnz))


# -- the entry point ------------------------------------------------------------------------------


class _Held:
    """A plain array where a worker expects a SharedArray (``.array``)."""

    def __init__(self, array: np.ndarray):
        self.array = array


def _worker_args(zeros: Callable[..., Any], copy_of: Callable[[np.ndarray], Any], entries: tuple, n_words: int,
                 config: GloveConfig, n_workers: int, batch: int, barrier: Any) -> tuple:
    """The model-parallel worker's arguments (data, params, costs, partials, ...) on arrays made by ``zeros`` and ``copy_of``.

    ``entries`` is (rows, cols, logx, fx).
    """
    data = {k: copy_of(v) for k, v in zip(_ENTRIES, entries)}
    params = {k: zeros(shape, np.float32) for k, shape in GloveParams.shapes(n_words, config.dim).items()}
    GloveParams.init(n_words, config, out={k: v.array for k, v in params.items()})
    costs = zeros((config.epochs, n_workers), np.float64)
    return data, params, costs, zeros((2, n_workers, batch), np.float32), config, batch, barrier


_warmed: set[int] = set()


def _warm_up(n_workers: int) -> None:
    """Compile the kernels in this process, with the argument types of a real run, before any fork.

    NOTE: otherwise each forked worker compiled them itself; on a fresh checkout (no numba cache
    yet) two workers compiling and writing the cache at once died with SIGSEGV (seen in CI). So the
    worker function runs here, one worker after the other, on a 7-entry problem in batches of 2
    (full and partial batches: both array layouts), with a group of one worker or of two (1 and
    N > 1 give the same types).
    """
    n = min(n_workers, 2)
    if n in _warmed:
        return
    from simlib.parallel import worker

    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, 4, 7).astype(np.int32), rng.integers(0, 4, 7).astype(np.int32)
    tiny = GloveConfig(dim=max(2, n), epochs=1)
    # A barrier of one party never waits: the warm-up runs the workers one after the other.
    args = _worker_args(lambda shape, dtype: _Held(np.zeros(shape, dtype)), _Held,
                        (rows, cols, *entry_terms(np.ones(7, np.float32), tiny)), 4, tiny, n, 2, Barrier(1))
    try:
        for w in range(n):
            worker._install(worker.WorkerContext(w, n, 0.0))
            _model_worker(w, n, *args)
    finally:
        worker._install(None)
    _warmed.add(n)


def epoch_seconds(trace: Trace, epochs: int) -> list[float]:
    """Wall time of each epoch: from the first span of that step to the last, over all workers."""
    per_epoch = [[s for s in trace.spans if s.step == epoch] for epoch in range(epochs)]
    return [max(s.end for s in spans) - min(s.start for s in spans) if spans else 0.0 for spans in per_epoch]


def train_model_parallel(
    cooc: Cooccurrence, config: GloveConfig, n_workers: int = 2, batch: int = 8192, start_method: str | None = None,
    timeout: float | None = None,
) -> GloveRun:
    """Train GloVe on ``n_workers`` processes, each owning a slice of the dimensions; see the module docs."""
    check.positive_int("n_workers", n_workers)
    check.positive_int("batch", batch)
    validate_training(cooc, config)
    if n_workers > config.dim:
        raise ValueError(f"n_workers must be <= dim ({config.dim}) in model-parallel mode, got {n_workers}")
    _warm_up(n_workers)
    logx, fx = entry_terms(cooc.values, config)
    with WorkerGroup(n_workers, start_method, label="glove-model") as group:
        args = _worker_args(group.zeros, group.copy_of, (cooc.rows, cooc.cols, logx, fx), cooc.n_words, config,
                            n_workers, batch, group.barrier())
        params, costs = args[1], args[2]
        group.run(_model_worker, *args, timeout=timeout)
        trace = group.trace
        trace.meta.update(mode="model", nnz=cooc.nnz, dim=config.dim, epochs=config.epochs, batch=batch)
        result = GloveParams(**{k: params[k].array.copy() for k in GloveParams.ARRAYS})
        return GloveRun(params=result, costs=(costs.array[:, 0] / cooc.nnz).tolist(), nnz=cooc.nnz, trace=trace,
                        n_workers=n_workers, epoch_seconds=epoch_seconds(trace, config.epochs))
