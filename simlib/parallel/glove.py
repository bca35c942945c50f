"""GloVe training on worker processes sharing memory: Hogwild, model-parallel, synchronous data-parallel.

All three run the AdaGrad update of :mod:`simlib.problems.glove` on parameters held in shared
memory (:class:`~simlib.parallel.SharedArray`), and return a :class:`GloveRun` whose trace
(``substrate="parallel"``) has one quality point per epoch: the C program's cost, the mean of
0.5 f diff^2 over the pass.

* ``mode="hogwild"``: each epoch the entries are shuffled and cut into one contiguous shard per
  worker; every worker runs the compiled AdaGrad loop on its shard, reading and writing the
  shared rows with no lock. Two workers rarely touch the same row at the same instant, and
  when they do one update may be partly lost -- the race is the lesson.
* ``mode="model"``: worker p owns the slice p of the embedding dimensions (of W, C and their
  accumulators) for every word. For each batch of entries each worker writes its partial dot
  products w_i[slice] . c_j[slice] to shared memory (worker 0 adds the biases); after a barrier
  every worker sums the partials into diff and updates only its own slice. Parameters never
  move; only B floats per worker per batch do. Within a batch the dot products are computed
  before the batch's updates (at most B - 1 updates stale).
* ``mode="sync"``: synchronous data-parallel. For each batch every worker computes the gradient
  of its half of the batch at the same parameters into a private buffer; after a barrier,
  worker p sums all buffers for its block of rows and applies one AdaGrad step to them. One
  update per row per batch: far fewer steps per epoch than the two asynchronous modes.

Example::

    >>> from simlib.data import load_kjv, Vocabulary
    >>> from simlib.problems.glove import count_cooccurrences
    >>> docs = load_kjv().docs[:2000]
    >>> vocab = Vocabulary.build(docs, min_count=5)
    >>> ids, offsets = vocab.encode_docs(docs)
    >>> cooc = count_cooccurrences(ids, offsets, len(vocab), window=10)
    >>> run = train_parallel(cooc, GloveConfig(dim=20, epochs=3), n_workers=2, mode="hogwild")
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
from simlib.problems.glove import (
    Cooccurrence,
    GloveConfig,
    GloveParams,
    adagrad_kernel,
    entry_residual,
    entry_terms,
    epoch_order,
    validate_training,
)
from simlib.trace import Trace

MODES = ("hogwild", "model", "sync")
_ENTRIES = ("rows", "cols", "logx", "fx")  # the shared arrays of the co-occurrence entries, in this order
_BARRIER_TIMEOUT = 600.0  # a peer that died is noticed by the group long before this


@dataclass
class GloveRun:
    """What a parallel run returns: final parameters (copies), cost per epoch, speed, and the trace."""

    params: GloveParams
    costs: list[float]
    epoch_seconds: list[float]
    nnz: int
    trace: Trace
    mode: str
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


# -- Hogwild --------------------------------------------------------------------------------------


def _hogwild_worker(worker_id: int, n_workers: int, data: dict[str, SharedArray], params: dict[str, SharedArray],
                    costs: SharedArray, config: GloveConfig, barrier) -> None:
    """Worker: each epoch, AdaGrad over this worker's shard of the shuffled entries, no locks."""
    ctx, rows, cols, logx, fx, eta, clip = _setup(data, config)
    arrays = tuple(params[k].array for k in GloveParams.ARRAYS)
    for epoch in range(config.epochs):
        order = epoch_order(rows.shape[0], config.seed, epoch)[_shard(rows.shape[0], worker_id, n_workers)]
        with ctx.timed("compute", step=epoch):
            costs.array[epoch, worker_id] = adagrad_kernel(rows, cols, logx, fx, order, *arrays, eta, clip)
        ctx.update(step=epoch, staleness=0)
        with ctx.timed("wait", step=epoch):
            barrier.wait(_BARRIER_TIMEOUT)
        if worker_id == 0:
            ctx.record_quality(epoch + 1, float(costs.array[epoch].sum() / rows.shape[0]))


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


# -- synchronous data-parallel --------------------------------------------------------------------


@njit(nogil=True, cache=True, fastmath=True)
def batch_gradient_kernel(rows, cols, logx, fx, order, W, C, bw, bc, gW, gC, gbw, gbc) -> float:
    """Accumulate g c_j, g w_i, g, g (g = f diff) of each entry into the buffers at fixed parameters."""
    dim = W.shape[1]
    cost = 0.0
    for t in range(order.shape[0]):
        e = order[t]
        i = rows[e]
        j = cols[e]
        diff = entry_residual(W, C, bw, bc, logx[e], i, j)
        g = fx[e] * diff
        cost += 0.5 * g * diff
        for k in range(dim):
            gW[i, k] += g * C[j, k]
            gC[j, k] += g * W[i, k]
        gbw[i] += g
        gbc[j] += g
    return cost


@njit(nogil=True, cache=True, fastmath=True)
def apply_summed_kernel(lo, hi, grads_W, grads_C, grads_bw, grads_bc, W, C, bw, bc, aW, aC, abw, abc, eta, clip) -> None:
    """For rows [lo, hi): sum the workers' buffers, take one AdaGrad step as the C update does, zero the buffers."""
    n_workers = grads_W.shape[0]
    dim = W.shape[1]
    for r in range(lo, hi):
        for k in range(dim):
            sw = np.float32(0.0)
            sc = np.float32(0.0)
            for p in range(n_workers):
                sw += grads_W[p, r, k]
                sc += grads_C[p, r, k]
                grads_W[p, r, k] = 0.0
                grads_C[p, r, k] = 0.0
            if sw != 0.0:
                sw = min(max(sw, -clip), clip) * eta
                W[r, k] -= sw / np.sqrt(aW[r, k])
                aW[r, k] += sw * sw
            if sc != 0.0:
                sc = min(max(sc, -clip), clip) * eta
                C[r, k] -= sc / np.sqrt(aC[r, k])
                aC[r, k] += sc * sc
        sb = np.float32(0.0)
        sbc = np.float32(0.0)
        for p in range(n_workers):
            sb += grads_bw[p, r]
            sbc += grads_bc[p, r]
            grads_bw[p, r] = 0.0
            grads_bc[p, r] = 0.0
        if sb != 0.0:
            bw[r] -= sb / np.sqrt(abw[r])
            abw[r] += sb * sb
        if sbc != 0.0:
            bc[r] -= sbc / np.sqrt(abc[r])
            abc[r] += sbc * sbc


def _sync_worker(worker_id: int, n_workers: int, data: dict[str, SharedArray], params: dict[str, SharedArray],
                 costs: SharedArray, grads: dict[str, SharedArray], config: GloveConfig, batch: int, barrier) -> None:
    """Worker: per batch, gradient of its half at shared parameters; barrier; sum and apply for its rows."""
    ctx, rows, cols, logx, fx, eta, clip = _setup(data, config)
    W, C, bw, bc, aW, aC, abw, abc = (params[k].array for k in GloveParams.ARRAYS)
    gW, gC, gbw, gbc = (grads[k].array for k in ("W", "C", "bw", "bc"))
    mine = _shard(W.shape[0], worker_id, n_workers)
    nnz = rows.shape[0]
    for epoch in range(config.epochs):
        order = epoch_order(nnz, config.seed, epoch)
        cost = 0.0
        for start in range(0, nnz, batch):
            part = order[start:start + batch]
            part = part[_shard(part.shape[0], worker_id, n_workers)]
            with ctx.timed("compute", step=epoch):
                cost += batch_gradient_kernel(rows, cols, logx, fx, part, W, C, bw, bc,
                                              gW[worker_id], gC[worker_id], gbw[worker_id], gbc[worker_id])
            with ctx.timed("wait", step=epoch):
                barrier.wait(_BARRIER_TIMEOUT)
            with ctx.timed("compute", step=epoch):
                apply_summed_kernel(mine.start, mine.stop, gW, gC, gbw, gbc, W, C, bw, bc, aW, aC, abw, abc, eta, clip)
            with ctx.timed("wait", step=epoch):
                barrier.wait(_BARRIER_TIMEOUT)
        costs.array[epoch, worker_id] = cost
        ctx.update(step=epoch, staleness=0)
        barrier.wait(_BARRIER_TIMEOUT)
        if worker_id == 0:
            ctx.record_quality(epoch + 1, float(costs.array[epoch].sum() / nnz))


# -- the entry point ------------------------------------------------------------------------------


class _Held:
    """A plain array where a worker expects a SharedArray (``.array``)."""

    def __init__(self, array: np.ndarray):
        self.array = array


def _worker_call(mode: str, zeros: Callable[..., Any], copy_of: Callable[[np.ndarray], Any], entries: tuple,
                 n_words: int, config: GloveConfig, n_workers: int, batch: int, barrier: Any) -> tuple[Callable, tuple]:
    """``mode``'s worker function and its arguments, on arrays made by ``zeros(shape, dtype)`` and ``copy_of``.

    ``entries`` is (rows, cols, logx, fx); the arguments start (data, params, costs, ...).
    """
    data = {k: copy_of(v) for k, v in zip(_ENTRIES, entries)}
    shapes = GloveParams.shapes(n_words, config.dim)
    params = {k: zeros(shape, np.float32) for k, shape in shapes.items()}
    GloveParams.init(n_words, config, out={k: v.array for k, v in params.items()})
    costs = zeros((config.epochs, n_workers), np.float64)
    if mode == "hogwild":
        return _hogwild_worker, (data, params, costs, config, barrier)
    if mode == "model":
        return _model_worker, (data, params, costs, zeros((2, n_workers, batch), np.float32), config, batch, barrier)
    grads = {k: zeros((n_workers, *shapes[k]), np.float32) for k in ("W", "C", "bw", "bc")}
    return _sync_worker, (data, params, costs, grads, config, batch, barrier)


_warmed: set[tuple[str, int]] = set()


def _warm_up(mode: str, n_workers: int) -> None:
    """Compile ``mode``'s kernels in this process, with the argument types of a real run, before any fork.

    NOTE: otherwise each forked worker compiled them itself; on a fresh checkout (no numba cache
    yet) two workers compiling and writing the cache at once died with SIGSEGV (seen in CI, model
    and sync modes). So the worker functions run here, one after the other, on a 7-entry problem
    in batches of 2 (full and partial batches: both array layouts), with a group of one worker or
    of two (1 and N > 1 give the same types).
    """
    n = min(n_workers, 2)
    if (mode, n) in _warmed:
        return
    from simlib.parallel import worker

    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, 4, 7).astype(np.int32), rng.integers(0, 4, 7).astype(np.int32)
    tiny = GloveConfig(dim=max(2, n), epochs=1)
    # A barrier of one party never waits: the warm-up runs the workers one after the other.
    fn, args = _worker_call(mode, lambda shape, dtype: _Held(np.zeros(shape, dtype)), _Held,
                            (rows, cols, *entry_terms(np.ones(7, np.float32), tiny)), 4, tiny, n, 2, Barrier(1))
    try:
        for w in range(n):
            worker._install(worker.WorkerContext(w, n, 0.0))
            fn(w, n, *args)
    finally:
        worker._install(None)
    _warmed.add((mode, n))


def epoch_seconds(trace: Trace, epochs: int) -> list[float]:
    """Wall time of each epoch: from the first span of that step to the last, over all workers."""
    per_epoch = [[s for s in trace.spans if s.step == epoch] for epoch in range(epochs)]
    return [max(s.end for s in spans) - min(s.start for s in spans) if spans else 0.0 for spans in per_epoch]


def train_parallel(
    cooc: Cooccurrence, config: GloveConfig, n_workers: int = 2, mode: str = "hogwild", batch: int = 8192,
    start_method: str | None = None, timeout: float | None = None,
) -> GloveRun:
    """Train GloVe on ``n_workers`` processes in ``mode`` ('hogwild', 'model' or 'sync'); see the module docs."""
    check.positive_int("n_workers", n_workers)
    check.one_of("mode", mode, MODES)
    check.positive_int("batch", batch)
    validate_training(cooc, config)
    if mode == "model" and n_workers > config.dim:
        raise ValueError(f"n_workers must be <= dim ({config.dim}) in model-parallel mode, got {n_workers}")
    _warm_up(mode, n_workers)
    logx, fx = entry_terms(cooc.values, config)
    with WorkerGroup(n_workers, start_method, label=f"glove-{mode}") as group:
        fn, args = _worker_call(mode, group.zeros, group.copy_of, (cooc.rows, cooc.cols, logx, fx), cooc.n_words,
                                config, n_workers, batch, group.barrier())
        params, costs = args[1], args[2]
        group.run(fn, *args, timeout=timeout)
        trace = group.trace
        trace.meta.update(mode=mode, nnz=cooc.nnz, dim=config.dim, epochs=config.epochs, batch=batch)
        result = GloveParams(**{k: params[k].array.copy() for k in GloveParams.ARRAYS})
        per_epoch = costs.array.sum(axis=1) if mode != "model" else costs.array[:, 0].copy()
        return GloveRun(params=result, costs=(per_epoch / cooc.nnz).tolist(), nnz=cooc.nnz, trace=trace, mode=mode,
                        n_workers=n_workers, epoch_seconds=epoch_seconds(trace, config.epochs))
