"""The math of each lesson, substrate-agnostic: parameters, data shards, a step, a quality metric."""
from simlib.problems.logistic import LogisticProblem, SparseDataset, make_sparse_classification

__all__ = ["LogisticProblem", "SparseDataset", "make_sparse_classification"]
