"""GloVe's single-process trainers, the tests' independent references for simlib.run(GloveProblem | GloveSlices, ...).

:func:`train`: shuffled AdaGrad passes over every entry with :func:`simlib.problems.glove.adagrad_kernel`, on
the float32 arrays of :class:`~simlib.problems.glove.GloveParams`, as the reference C program trains.
:func:`train_batched`: the same passes with each batch's dot products read before its updates (model
parallelism's arithmetic), written in plain NumPy.
"""
from __future__ import annotations

import numpy as np

from simlib.problems.glove import (Cooccurrence, GloveConfig, GloveParams, adagrad_kernel, entry_terms, epoch_order,
                                   validate_training)


def train_epoch(params: GloveParams, cooc: Cooccurrence, config: GloveConfig, epoch: int,
                terms: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """One AdaGrad pass over all entries in the order of ``epoch``; returns the pass's mean 0.5 f diff^2."""
    logx, fx = terms if terms is not None else entry_terms(cooc.values, config)
    order = epoch_order(cooc.nnz, config.seed, epoch)
    total = adagrad_kernel((cooc.rows, cooc.cols, logx, fx), order, params.arrays(),
                           np.float32(config.lr), np.float32(config.grad_clip))
    return total / cooc.nnz


def train(cooc: Cooccurrence, config: GloveConfig) -> tuple[GloveParams, list[float]]:
    """Single-process GloVe: ``config.epochs`` shuffled AdaGrad passes; returns params and cost per epoch."""
    validate_training(cooc, config)
    params = GloveParams.init(cooc.n_words, config)
    terms = entry_terms(cooc.values, config)
    costs = [train_epoch(params, cooc, config, epoch, terms) for epoch in range(config.epochs)]
    return params, costs


def train_batched(cooc: Cooccurrence, config: GloveConfig, batch: int) -> tuple[GloveParams, list[float]]:
    """GloVe as model parallelism computes it, in plain NumPy: per epoch, batches of ``batch`` entries in the epoch's
    order; every entry's diff from the parameters at its batch's start, then AdaGrad entry after entry (float32).

    With ``batch=1`` this is :func:`train`. Returns params and cost per epoch.
    """
    validate_training(cooc, config)
    params = GloveParams.init(cooc.n_words, config)
    W, C, bw, bc, gW, gC, gbw, gbc = params.arrays()
    logx, fx = entry_terms(cooc.values, config)
    eta, clip = np.float32(config.lr), np.float32(config.grad_clip)
    costs = []
    for epoch in range(config.epochs):
        order = epoch_order(cooc.nnz, config.seed, epoch)
        total = 0.0
        for start in range(0, cooc.nnz, batch):
            part = order[start:start + batch]
            rows, cols = cooc.rows[part], cooc.cols[part]
            diffs = np.einsum("td,td->t", W[rows], C[cols]) + bw[rows] + bc[cols] - logx[part]
            for e, i, j, diff in zip(part, rows, cols, diffs):
                g = fx[e] * diff
                total += float(0.5 * g * diff)  # summed in float64, as the kernels do
                tw = np.clip(g * C[j], -clip, clip) * eta
                tc = np.clip(g * W[i], -clip, clip) * eta
                W[i] -= tw / np.sqrt(gW[i])
                C[j] -= tc / np.sqrt(gC[j])
                gW[i] += tw * tw
                gC[j] += tc * tc
                bw[i] -= g / np.sqrt(gbw[i])
                bc[j] -= g / np.sqrt(gbc[j])
                gbw[i] += g * g
                gbc[j] += g * g
        costs.append(total / cooc.nnz)
    return params, costs
