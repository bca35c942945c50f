"""The math of each lesson, substrate-agnostic: parameters, data shards, a step, a quality metric.

Each lesson's :class:`simlib.contract.Problem` lives beside its math:

* ``logistic`` -- sparse logistic regression (Hogwild, the simulator's default workload): ``LogisticProblem``
* ``textclass`` -- the shipped corpus as a sparse classification task
* ``glove`` and ``embedding_eval`` -- GloVe co-occurrence counting, AdaGrad, evaluation;
  ``glove_table`` -- ``GloveProblem`` (its in-place steps prefetch: ``glove_prefetch``); ``glove_slices`` --
  ``GloveSlices`` (split by dimension)
* ``lda`` and ``lda_gibbs`` -- LDA by collapsed Gibbs sampling; ``lda_table`` -- ``LDAProblem``
* ``lasso`` -- Lasso by (parallel) coordinate descent, for Shotgun: ``ShotgunProblem``
* ``mlp`` -- a multi-layer perceptron on scikit-learn's digits (or a larger synthetic set): ``MLPProblem``

Names below are imported on first use, so ``import simlib.problems`` stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

from simlib.signals import hold_while_compiling

hold_while_compiling()  # before the first kernel compiles: a Ctrl-C inside numba's compiler waits until it is done
from simlib.problems.logistic import LogisticProblem, SparseDataset, make_sparse_classification  # noqa: E402

_LAZY = {
    "GloveConfig": "glove", "GloveParams": "glove", "Cooccurrence": "glove", "count_cooccurrences": "glove",
    "LDACorpus": "lda", "make_synthetic_corpus": "lda", "kjv_corpus": "lda",
    "LassoProblem": "lasso", "make_lasso": "lasso", "make_uncorrelated_lasso": "lasso",
    "make_correlated_lasso": "lasso", "CorrelationScheduler": "lasso", "random_schedule": "lasso", "shotgun": "lasso",
    "ShotgunProblem": "lasso", "GloveProblem": "glove_table", "GloveSlices": "glove_slices", "LDAProblem": "lda_table",
    "MLPProblem": "mlp", "DenseDataset": "mlp", "digits_dataset": "mlp", "make_dense_classification": "mlp",
}

__all__ = ["LogisticProblem", "SparseDataset", "make_sparse_classification", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"simlib.problems.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'simlib.problems' has no attribute {name!r}")
