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

The array code takes its module from the parameters (:func:`simlib.backend.array_module`), so
the same function runs on NumPy in tests and on CuPy on a GPU::

    >>> params, costs = train_batched(cooc, GloveConfig(dim=50, epochs=5), batch=8192, xp="auto")
"""
from __future__ import annotations

from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.backend import array_module, get_xp, scatter_add, to_numpy
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


def train_batched(cooc: Cooccurrence, config: GloveConfig, batch: int = 8192,
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
        costs.append(float(total) / cooc.nnz)
    out = GloveParams(*(to_numpy(a) for a in arrays))
    return out, costs
