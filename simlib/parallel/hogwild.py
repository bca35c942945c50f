"""Hogwild! for sparse logistic regression on real processes sharing one weight vector.

Four ways to run the same SGD on the same data with the same step size ``lr`` and L2 strength ``l2``
(the objective of :mod:`simlib.problems.logistic`):

* ``serial``  -- one process, rows in order: the reference.
* ``locked``  -- N processes, one lock held around every row's update (read, gradient, write).
* ``hogwild`` -- N processes, no locks at all: each worker updates the shared weights in place
  while the others do the same. Rows are sparse, so two workers rarely touch the same weight at
  the same moment, and the occasional overwrite costs less than any lock.
* ``bsp``     -- synchronous data parallelism for contrast: every step each worker computes a
  mini-batch gradient at the same weights, a barrier, then the workers sum the gradients
  (each for its slice of the features) and apply one averaged step, then a barrier again.

The inner loops are numba kernels (:mod:`simlib.parallel.hogwild_kernels`, which explains the
choice with measured numbers). The L2 decay ``(1 - lr*l2)`` per step is applied in one of
two ways, both touching only the row's features:

* ``decay='lazy'`` (default, the seeds' method): each weight catches up on the decay it missed when
  a row next touches it. Each worker keeps its own stamps, so with N workers each weight is
  decayed by every worker's steps, in whatever order the workers touch it: exact for one
  worker, off only by the interleaving otherwise.
* ``decay='scaled'`` (scikit-learn's method): ``w = v * prod(worker scales)``; a step multiplies
  the worker's scale by the decay and divides its update by the total scale. No per-feature
  state, so the loop is faster; the total decay of a run is bounded so the scale cannot
  underflow.

The step schedule is scikit-learn's ``learning_rate='constant'`` (``eta0 = lr``), so a run
of ``epochs`` passes is directly comparable with ``SGDClassifier(loss='log_loss',
penalty='l2', alpha=l2, learning_rate='constant', eta0=lr, fit_intercept=False,
shuffle=False, max_iter=epochs, tol=None)``: serial mode reproduces its weights to rounding.

Example::

    >>> from simlib.problems.logistic import make_sparse_classification
    >>> data = make_sparse_classification(5_000, 1_000, 20, seed=0)
    >>> res = train(data, "serial", lr=0.5, l2=1e-4, epochs=2)
    >>> res.trace.quality[-1].value < 0.69
    True
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.diverged import Diverged, check_finite, first_non_finite
from simlib.parallel.group import START_METHODS, WorkerGroup
from simlib.parallel.hogwild_kernels import apply_mean_gradient, catch_up, grad_rows, sgd_rows, sgd_rows_scaled
from simlib.parallel.shm import SharedArray
from simlib.parallel.worker import current
from simlib.problems.logistic import HogwildResult, LogisticProblem, SparseDataset, check_sgd
from simlib.trace import Trace

MODES = ("serial", "locked", "hogwild", "bsp")
DECAY_METHODS = ("lazy", "scaled")
MAX_TOTAL_DECAY = 300.0  # decay='scaled' keeps prod(scales) = exp(-lr*l2*steps) above 1e-130


@dataclass
class _Shared:
    """Everything the workers share, as shared arrays (pickled by name under spawn)."""

    indptr: SharedArray
    indices: SharedArray
    values: SharedArray
    y: SharedArray
    w: SharedArray
    stamps: SharedArray  # (n_workers, n_features): each worker's decay stamps (decay='lazy'), else (1, 1)
    scales: SharedArray  # (n_workers, 8): each worker's running decay scale in [k, 0], one cache line each
    clocks: SharedArray  # (n_workers,): rows processed by each worker so far
    grads: SharedArray  # (n_workers, n_features) for bsp, (1, 1) otherwise


@dataclass(frozen=True)
class _Config:
    """What a worker needs to know about the run."""

    mode: str
    lr: float
    l2: float
    epochs: int
    chunk_rows: int
    batch_size: int
    shards: tuple[tuple[int, int], ...]
    n_features: int
    decay: str = "lazy"


def validate(data: Any, mode: str, n_workers: int, lr: float, l2: float, epochs: int, batch_size: int, chunk_rows: int,
             monitor_every: float, w0: Any, decay: str = "lazy", start_method: str | None = None) -> None:
    """Check every argument; raise ValueError naming the field before any process starts."""
    if not isinstance(data, SparseDataset):
        raise ValueError(f"data must be a SparseDataset, got {type(data).__name__}")
    data.validate()  # shapes, index range, finite values, labels (arrays may have changed since)
    data.require_features()
    check.one_of("mode", mode, MODES)
    check.positive_int("n_workers", n_workers)
    if mode == "serial" and n_workers != 1:
        raise ValueError(f"n_workers must be 1 for mode='serial', got {n_workers}")
    if n_workers > data.n_rows:
        raise ValueError(f"n_workers ({n_workers}) must be <= the number of rows ({data.n_rows})")
    check_sgd(lr, l2, epochs, batch_size)
    check.positive_int("chunk_rows", chunk_rows)
    check.positive("monitor_every", monitor_every)
    check.one_of("decay", decay, DECAY_METHODS)
    if start_method is not None:
        check.one_of("start_method", start_method, START_METHODS)
    if decay == "scaled" and lr * l2 * epochs * data.n_rows > MAX_TOTAL_DECAY:
        raise ValueError(
            f"decay='scaled' needs lr * l2 * epochs * n_rows <= {MAX_TOTAL_DECAY:g} (the shared scale would "
            f"underflow), got {lr * l2 * epochs * data.n_rows:g}; use decay='lazy'"
        )
    if w0 is not None:
        w0 = np.asarray(w0)
        if w0.shape != (data.n_features,):
            raise ValueError(f"w0 must have shape ({data.n_features},) to match n_features, got {w0.shape}")
        if not np.all(np.isfinite(w0)):
            raise ValueError("w0 must be finite (found NaN or inf)")


def train(
    data: SparseDataset,
    mode: str = "hogwild",
    *,
    n_workers: int | None = None,
    lr: float = 0.2,
    l2: float = 1e-5,
    epochs: int = 5,
    batch_size: int = 256,
    chunk_rows: int = 10_000,
    start_method: str | None = None,
    monitor_every: float = 0.1,
    eval_rows: int = 2_000,
    w0: np.ndarray | None = None,
    verbose: bool = False,
    timeout: float | None = None,
    seed: int = 0,
    decay: str = "lazy",
) -> HogwildResult:
    """Train L2 logistic regression by SGD in ``mode`` (serial | locked | hogwild | bsp); see the module doc.

    ``n_workers`` defaults to 1 for serial and 2 otherwise. Rows are split into contiguous
    shards, one per worker, each visited in order ``epochs`` times. ``batch_size`` is the
    per-worker mini-batch of ``bsp``; ``chunk_rows`` is how many rows a worker processes
    between two trace records. The loss on ``eval_rows`` sampled rows is recorded about every
    ``monitor_every`` seconds of wall time. ``decay`` picks how the L2 decay is applied in the SGD
    modes: ``'lazy'`` (per-feature catch-up, the seeds' method) or ``'scaled'`` (one shared
    scale per worker, scikit-learn's method; faster, for runs whose total decay stays moderate).
    """
    if n_workers is None:
        n_workers = 1 if mode == "serial" else 2
    validate(data, mode, n_workers, lr, l2, epochs, batch_size, chunk_rows, monitor_every, w0, decay, start_method)
    check.positive_int("eval_rows", eval_rows)
    started = time.perf_counter()
    warm_up()
    problem = LogisticProblem(data, l2=l2, eval_rows=eval_rows, seed=seed)
    cfg = _Config(mode=mode, lr=float(lr), l2=float(l2), epochs=int(epochs), chunk_rows=int(chunk_rows),
                  batch_size=int(batch_size), shards=tuple(problem.shards(n_workers)), n_features=data.n_features,
                  decay=decay)
    w_init = np.zeros(data.n_features) if w0 is None else np.asarray(w0, dtype=np.float64)
    if mode == "serial":
        w, trace, cpu = _train_serial(data, problem, cfg, w_init, monitor_every)
    else:
        w, trace, cpu = _train_parallel(data, problem, cfg, w_init, n_workers, start_method, monitor_every, verbose, timeout)
    bad = first_non_finite(trace.quality)
    if bad is not None:  # the last snapshot, taken after the workers finished
        raise Diverged(bad[0], bad[1], "loss", f"lr={lr:g}")
    compute = [s for s in trace.spans if s.kind == "compute"]
    if mode == "serial":
        train_seconds = sum(s.end - s.start for s in compute)
    else:
        train_seconds = max(s.end for s in compute) - min(s.start for s in compute)
    trace.label = f"{mode}, {n_workers} process{'es' if n_workers > 1 else ''}"
    trace.meta.update(mode=mode, decay=decay if mode != "bsp" else "dense", lr=lr, l2=l2, epochs=epochs,
                      n_rows=data.n_rows, n_features=data.n_features, nnz=data.nnz * epochs, chunk_rows=chunk_rows,
                      batch_size=batch_size if mode == "bsp" else None,
                      update_unit="one mini-batch step" if mode == "bsp" else f"a chunk of up to {chunk_rows} rows")
    wall = time.perf_counter() - started
    return HogwildResult(mode, n_workers, w, trace, data.nnz * epochs, train_seconds, wall, cpu)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel for the dtypes used here, off the clock."""
    ip = np.zeros(2, np.int64)
    ix = np.zeros(1, np.int32)
    v = np.ones(1, np.float32)
    y = np.ones(1, np.float32)
    w = np.zeros(1)
    stamp = np.ones(1)
    sgd_rows(ip, ix, v, y, w, stamp, 0, 1, 1.0, 0.1, 0.0)
    catch_up(w, stamp, 1.0)
    sgd_rows_scaled(ip, ix, v, y, w, np.ones((1, 8)), 0, 0, 1, 0.1, 0.0)
    grads = np.zeros((1, 1))
    grad_rows(ip, ix, v, y, w, 0, 1, grads[0])
    apply_mean_gradient(w, grads, 0, 1, 0.1, 1.0)


# -- serial: the same kernel in this process -------------------------------------------------
def _train_serial(
    data: SparseDataset, problem: LogisticProblem, cfg: _Config, w: np.ndarray, monitor_every: float
) -> tuple[np.ndarray, Trace, float]:
    """One process, rows in order; evaluation happens between chunks and is not timed as compute."""
    trace = Trace(label="serial", substrate="parallel", n_workers=1)
    w = w.copy()
    stamp = np.ones_like(w)
    scales = np.ones((1, 8))
    scale, t, chunk, cpu = 1.0, 0, 0, 0.0
    t0 = time.perf_counter()
    trace.record_quality(0.0, 0, problem.loss(w))
    next_eval = t0 + monitor_every
    for _ in range(cfg.epochs):
        for start in range(0, data.n_rows, cfg.chunk_rows):
            stop = min(start + cfg.chunk_rows, data.n_rows)
            c, s = time.thread_time(), time.perf_counter()
            if cfg.decay == "lazy":
                scale = sgd_rows(data.indptr, data.indices, data.values, data.y, w, stamp, start, stop, scale, cfg.lr, cfg.l2)
            else:
                sgd_rows_scaled(data.indptr, data.indices, data.values, data.y, w, scales, 0, start, stop, cfg.lr, cfg.l2)
                scale = scales[0, 0]
            e = time.perf_counter()
            cpu += time.thread_time() - c
            t += stop - start
            trace.span(0, "compute", s - t0, e - t0, step=chunk)
            trace.update(e - t0, 0, chunk, 0)
            chunk += 1
            if e >= next_eval:
                now_w = w * (scale / stamp) if cfg.decay == "lazy" else w * scale
                loss = problem.loss(now_w)
                trace.record_quality(time.perf_counter() - t0, t, loss)
                check_finite(loss, t, "loss", f"lr={cfg.lr:g}")
                next_eval = time.perf_counter() + monitor_every
    if cfg.decay == "lazy":
        catch_up(w, stamp, scale)
    else:
        w *= scale
    trace.record_quality(time.perf_counter() - t0, t, problem.loss(w))
    check_finite(trace.quality[-1].value, t, "loss", f"lr={cfg.lr:g}")
    return w, trace, cpu


# -- processes: locked, hogwild, bsp ---------------------------------------------------------
def _train_parallel(data: SparseDataset, problem: LogisticProblem, cfg: _Config, w_init: np.ndarray, n_workers: int,
                    start_method: str | None, monitor_every: float, verbose: bool,
                    timeout: float | None) -> tuple[np.ndarray, Trace, float]:
    """Start the workers on shared copies of the data and weights; snapshot the loss while they run."""
    with WorkerGroup(n_workers, start_method, verbose=verbose, label=cfg.mode) as group:
        sgd = cfg.mode != "bsp"
        lazy = sgd and cfg.decay == "lazy"
        shared = _Shared(
            indptr=group.copy_of(data.indptr),
            indices=group.copy_of(data.indices),
            values=group.copy_of(data.values),
            y=group.copy_of(data.y),
            w=group.copy_of(w_init),
            stamps=group.zeros((n_workers, data.n_features) if lazy else (1, 1)),
            scales=group.zeros((n_workers, 8)),
            clocks=group.zeros(n_workers, np.int64),
            grads=group.zeros((1, 1) if sgd else (n_workers, data.n_features)),
        )
        shared.stamps.array.fill(1.0)
        shared.scales.array.fill(1.0)

        def current_weights() -> np.ndarray:
            """The weights with every worker's pending decay applied (a racy but harmless read)."""
            w = shared.w.array.copy()
            if lazy:
                w *= np.prod(shared.scales.array[:, :1] / shared.stamps.array, axis=0)
            elif sgd:
                w *= float(np.prod(shared.scales.array[:, 0]))
            return w

        def monitor(elapsed: float) -> None:
            step, loss = int(shared.clocks.array.sum()), problem.loss(current_weights())
            group.trace.record_quality(elapsed, step, loss)
            check_finite(loss, step, "loss", f"lr={cfg.lr:g}")  # stops the workers at once

        group.trace.record_quality(0.0, 0, problem.loss(current_weights()))
        extra = group.lock() if cfg.mode == "locked" else group.barrier() if cfg.mode == "bsp" else None
        worker = _bsp_worker if cfg.mode == "bsp" else _sgd_worker
        cpu = group.run(worker, shared, cfg, extra, monitor=monitor, monitor_every=monitor_every, timeout=timeout)
        return current_weights(), group.trace, float(sum(cpu))


def _sgd_worker(worker_id: int, n_workers: int, sh: _Shared, cfg: _Config, lock: Any) -> float:
    """Hogwild (lock is None) or locked SGD over this worker's shard; returns its CPU seconds."""
    ctx = current()
    warm_up()  # under spawn this loads the compiled kernels from the cache before the clock starts
    ip, ix, vals, y, w = sh.indptr.array, sh.indices.array, sh.values.array, sh.y.array, sh.w.array
    lazy = cfg.decay == "lazy"
    stamp = sh.stamps.array[worker_id] if lazy else sh.stamps.array[0]
    scales = sh.scales.array
    clocks = sh.clocks.array
    lo, hi = cfg.shards[worker_id]
    scale, t, chunk = 1.0, 0, 0
    cpu0 = time.thread_time()
    for _ in range(cfg.epochs):
        for start in range(lo, hi, cfg.chunk_rows):
            stop = min(start + cfg.chunk_rows, hi)
            others_before = int(clocks.sum()) - t
            s = time.perf_counter()
            if lock is None:
                if lazy:
                    scale = sgd_rows(ip, ix, vals, y, w, stamp, start, stop, scale, cfg.lr, cfg.l2)
                else:
                    sgd_rows_scaled(ip, ix, vals, y, w, scales, worker_id, start, stop, cfg.lr, cfg.l2)
            else:
                # NOTE: one kernel call per row, because the lock must cover each single update.
                for i in range(start, stop):
                    with lock:
                        if lazy:
                            scale = sgd_rows(ip, ix, vals, y, w, stamp, i, i + 1, scale, cfg.lr, cfg.l2)
                        else:
                            sgd_rows_scaled(ip, ix, vals, y, w, scales, worker_id, i, i + 1, cfg.lr, cfg.l2)
            e = time.perf_counter()
            t += stop - start
            clocks[worker_id] = t
            if lazy:
                scales[worker_id, 0] = scale
            if ctx is not None:
                ctx.span("compute", s, e, step=chunk)
                # staleness: other workers' updates interleaved with each of ours, on average
                ctx.update(chunk, staleness=round((int(clocks.sum()) - t - others_before) / (stop - start)))
            chunk += 1
    return time.thread_time() - cpu0


def _bsp_worker(worker_id: int, n_workers: int, sh: _Shared, cfg: _Config, barrier: Any) -> float:
    """Synchronous mini-batch SGD: gradient, barrier, sum and apply a feature slice, barrier; returns CPU seconds."""
    ctx = current()
    warm_up()
    ip, ix, vals, y, w = sh.indptr.array, sh.indices.array, sh.values.array, sh.y.array, sh.w.array
    grads = sh.grads.array
    lo, hi = cfg.shards[worker_id]
    sizes = [b - a for a, b in cfg.shards]
    n_steps = -(-max(sizes) // cfg.batch_size)  # every worker takes the same number of steps
    f_lo = cfg.n_features * worker_id // n_workers
    f_hi = cfg.n_features * (worker_id + 1) // n_workers
    keep = 1.0 - cfg.lr * cfg.l2
    t, step = 0, 0
    cpu0 = time.thread_time()
    for _ in range(cfg.epochs):
        for k in range(n_steps):
            start, stop = min(lo + k * cfg.batch_size, hi), min(lo + (k + 1) * cfg.batch_size, hi)
            total = sum(max(0, min((k + 1) * cfg.batch_size, n) - k * cfg.batch_size) for n in sizes)
            s = time.perf_counter()
            grad_rows(ip, ix, vals, y, w, start, stop, grads[worker_id])
            e = time.perf_counter()
            barrier.wait()
            e2 = time.perf_counter()
            if total:
                apply_mean_gradient(w, grads, f_lo, f_hi, cfg.lr / total, keep)
            e3 = time.perf_counter()
            barrier.wait()
            e4 = time.perf_counter()
            t += stop - start
            sh.clocks.array[worker_id] = t
            if ctx is not None:
                ctx.span("compute", s, e, step=step)
                ctx.span("wait", e, e2, step=step)
                ctx.span("compute", e2, e3, step=step)
                ctx.span("wait", e3, e4, step=step)
                ctx.update(step, staleness=0)
            step += 1
    return time.thread_time() - cpu0
