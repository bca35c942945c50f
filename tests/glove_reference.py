"""GloVe's single-process trainer, the tests' independent reference for simlib.run(GloveProblem, ...).

Shuffled AdaGrad passes over every entry with :func:`simlib.problems.glove.adagrad_kernel`, on the
float32 arrays of :class:`~simlib.problems.glove.GloveParams`, as the reference C program trains.
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
    total = adagrad_kernel(cooc.rows, cooc.cols, logx, fx, order, *params.arrays(),
                           np.float32(config.lr), np.float32(config.grad_clip))
    return total / cooc.nnz


def train(cooc: Cooccurrence, config: GloveConfig) -> tuple[GloveParams, list[float]]:
    """Single-process GloVe: ``config.epochs`` shuffled AdaGrad passes; returns params and cost per epoch."""
    validate_training(cooc, config)
    params = GloveParams.init(cooc.n_words, config)
    terms = entry_terms(cooc.values, config)
    costs = [train_epoch(params, cooc, config, epoch, terms) for epoch in range(config.epochs)]
    return params, costs
