"""Hogwild! at GPU scale: a whole batch of rows updates the weights at once, without locks.

On a CPU, Hogwild lets a few processes write the shared weights while the others read them.
A GPU runs thousands of rows at the same moment, so the same idea becomes one batched step:

1. gather ``w`` at every nonzero of the batch's rows,
2. margins ``m_i = x_i . w`` by a segmented sum over the row id of each nonzero
   (:func:`simlib.backend.segment_sum`: no read-back to the host, so launches stay queued),
3. coefficients ``c_i = -y_i sigma(-y_i m_i)``,
4. decay ``w *= (1 - alpha*lam) ** B`` (the B steps' L2) and scatter-add ``-alpha c_i x_i``
   (:func:`simlib.backend.scatter_add`: repeated features add up).

Every row of a batch reads the same weights, as if each update were B-1 updates stale; the
batch size is therefore the staleness knob. With ``batch_size=1`` this is exactly serial SGD
(tested); larger batches trade a little loss per epoch for far fewer, larger kernel launches.
"""
from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, get_xp, scatter_add, segment_sum, to_numpy
from simlib.parallel.hogwild import HogwildResult
from simlib.problems.logistic import LogisticProblem, SparseDataset, check_sgd, sigmoid
from simlib.trace import Trace


def batch_step(
    w: Any, indptr: np.ndarray, indices: Any, values: Any, y: Any, row_of: Any, lo: int, hi: int, alpha: float, lam: float
) -> None:
    """Rows [lo, hi) in one step: w <- keep**B w - alpha * sum_i c_i x_i, every c_i from the same w.

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
    w *= (1.0 - alpha * lam) ** (hi - lo)
    scatter_add(w, cols, (-alpha) * coef[rows] * vals)


def _sync(xp: ModuleType) -> None:
    """Wait for queued GPU work, so that wall-clock readings mean something."""
    if xp is not np:  # pragma: no cover - needs a GPU
        xp.cuda.Device().synchronize()


def train_batched(
    data: SparseDataset,
    *,
    alpha: float = 0.2,
    lam: float = 1e-5,
    epochs: int = 5,
    batch_size: int = 256,
    xp: str | ModuleType = "auto",
    eval_rows: int = 2_000,
    record_every: int = 50,
    seed: int = 0,
) -> HogwildResult:
    """Batched lock-free SGD over ``data`` for ``epochs`` passes; weights come back as NumPy.

    A compute span and an update are recorded every ``record_every`` batches, and the loss on
    ``eval_rows`` sampled rows after every epoch.
    """
    if not isinstance(data, SparseDataset):
        raise ValueError(f"data must be a SparseDataset, got {type(data).__name__}")
    data.validate()
    check_sgd(alpha, lam, epochs, batch_size)
    check.positive_int("eval_rows", eval_rows)
    check.positive_int("record_every", record_every)
    mod = get_xp(xp) if isinstance(xp, str) else xp
    started = time.perf_counter()
    problem = LogisticProblem(data, l2=lam, eval_rows=eval_rows, seed=seed)
    indices = mod.asarray(data.indices.astype(np.int64))
    values = mod.asarray(data.values, dtype=np.float64)
    y = mod.asarray(data.y, dtype=np.float64)
    row_of = mod.asarray(np.repeat(np.arange(data.n_rows, dtype=np.int64), np.diff(data.indptr)))
    w = mod.zeros(data.n_features, dtype=np.float64)
    name = "numpy" if mod is np else "cupy"
    trace = Trace(label=f"batched ({name}, B={batch_size})", substrate="gpu", n_workers=1)
    trace.meta.update(xp=name, batch_size=batch_size, alpha=alpha, lam=lam, epochs=epochs, nnz=data.nnz * epochs)
    trace.record_quality(0.0, 0, problem.loss(to_numpy(w)))
    batch_step(w, data.indptr, indices, values, y, row_of, 0, 1, alpha, 0.0)  # warm-up launch
    w[:] = 0.0
    _sync(mod)
    t0 = time.perf_counter()
    busy = cpu = 0.0
    step = 0
    for _ in range(epochs):
        for lo in range(0, data.n_rows, batch_size * record_every):
            c, s = time.thread_time(), time.perf_counter()
            for blo in range(lo, min(lo + batch_size * record_every, data.n_rows), batch_size):
                batch_step(w, data.indptr, indices, values, y, row_of, blo, min(blo + batch_size, data.n_rows), alpha, lam)
                step += 1
            _sync(mod)
            e = time.perf_counter()
            busy += e - s
            cpu += time.thread_time() - c
            trace.span(0, "compute", s - t0, e - t0, step=step)
            trace.update(e - t0, 0, step, staleness=batch_size - 1)
        trace.record_quality(time.perf_counter() - t0, step, problem.loss(to_numpy(w)))
    return HogwildResult(f"batched-{name}", 1, to_numpy(w), trace, data.nnz * epochs, busy, time.perf_counter() - started, cpu)
