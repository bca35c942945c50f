"""GloVe on one GPU: batched lock-free AdaGrad (gather rows, compute, scatter-add), NumPy or CuPy.

A batch of B co-occurrence entries is processed at once: every entry reads the rows as they
were before the batch (gather), computes its clipped AdaGrad steps, and all steps are added
back with a scatter-add, so two entries of one batch that share a word both land, each computed
from the same old row -- the GPU analogue of Hogwild's races, made deterministic. With B = 1
this is exactly the sequential update of :func:`simlib.problems.glove.adagrad_kernel`.

The array code takes its module from the parameters (:func:`simlib.backend.array_module`), so
the same function runs on NumPy in tests and on CuPy on a GPU::

    >>> params, costs = train_batched(cooc, GloveConfig(dim=50, epochs=5), batch=65536, xp="auto")
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, get_xp, to_numpy
from simlib.problems.glove import Cooccurrence, GloveConfig, GloveParams, entry_terms, epoch_order, validate_training


def scatter_add(xp: ModuleType, target: Any, index: Any, values: Any) -> None:
    """target[index] += values, accumulating repeated indices (np.add.at / cupyx.scatter_add)."""
    if xp is np:
        np.add.at(target, index, values)
    else:  # pragma: no cover - needs a GPU
        import cupyx

        cupyx.scatter_add(target, index, values)


def adagrad_batch(arrays: tuple[Any, ...], rows: Any, cols: Any, logx: Any, fx: Any, batch: Any,
                  eta: float, clip: float) -> float:
    """One batched AdaGrad step over entries ``batch`` (all read before any write); returns sum 0.5 f diff^2."""
    W, C, bw, bc, gW, gC, gbw, gbc = arrays
    xp = array_module(W)
    i, j = rows[batch], cols[batch]
    wi, cj = W[i], C[j]
    diff = xp.sum(wi * cj, axis=1) + bw[i] + bc[j] - logx[batch]
    fdiff = fx[batch] * diff
    cost = float(0.5 * xp.sum(fdiff * diff, dtype=xp.float64))
    g = fdiff[:, None]
    tw = xp.clip(g * cj, -clip, clip) * eta
    tc = xp.clip(g * wi, -clip, clip) * eta
    uw = tw / xp.sqrt(gW[i])
    uc = tc / xp.sqrt(gC[j])
    ub = fdiff  # the C update gives the biases no learning rate
    step_bw = ub / xp.sqrt(gbw[i])
    step_bc = ub / xp.sqrt(gbc[j])
    scatter_add(xp, W, i, -uw)
    scatter_add(xp, C, j, -uc)
    scatter_add(xp, gW, i, tw * tw)
    scatter_add(xp, gC, j, tc * tc)
    scatter_add(xp, bw, i, -step_bw)
    scatter_add(xp, bc, j, -step_bc)
    scatter_add(xp, gbw, i, ub * ub)
    scatter_add(xp, gbc, j, ub * ub)
    return cost


def train_batched(cooc: Cooccurrence, config: GloveConfig, batch: int = 65536,
                  xp: str = "auto") -> tuple[GloveParams, list[float]]:
    """GloVe with batched lock-free AdaGrad on ``xp`` ('numpy', 'cupy', 'auto'); (NumPy params, cost per epoch)."""
    check.positive_int("batch", batch)
    validate_training(cooc, config)
    mod = get_xp(xp)
    host = GloveParams.init(cooc.n_words, config)
    arrays = tuple(mod.asarray(a) for a in host.arrays())
    logx, fx = (mod.asarray(a) for a in entry_terms(cooc.values, config))
    rows, cols = mod.asarray(cooc.rows), mod.asarray(cooc.cols)
    eta, clip = np.float32(config.learning_rate), np.float32(config.grad_clip)
    costs = []
    for epoch in range(config.epochs):
        order = mod.asarray(epoch_order(cooc.nnz, config.seed, epoch))
        total = 0.0
        for start in range(0, cooc.nnz, batch):
            total += adagrad_batch(arrays, rows, cols, logx, fx, order[start:start + batch], eta, clip)
        costs.append(total / cooc.nnz)
    out = GloveParams(*(to_numpy(a) for a in arrays))
    return out, costs
