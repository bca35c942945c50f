"""Shared fixtures: small problems that build in milliseconds."""
import pytest

from simlib.problems.logistic import LogisticProblem, make_sparse_classification


@pytest.fixture(scope="session")
def small_data():
    """A 2,000 x 500 sparse classification problem (deterministic)."""
    return make_sparse_classification(n_rows=2_000, n_features=500, nnz_per_row=10, seed=0)


@pytest.fixture(scope="session")
def small_problem(small_data):
    """Logistic regression on ``small_data``."""
    return LogisticProblem(small_data, l2=1e-4, eval_rows=1_000)
