"""The examples in the core modules' docstrings run and print what they say."""
import doctest
import importlib

import pytest

MODULES = [
    "simlib.trace",
    "simlib.sim",
    "simlib.sim.config",
    "simlib.sim.engine",
    "simlib.problems.logistic",
    "simlib.problems.glove_table",
    "simlib.problems.lda_table",
    "simlib.problems.lasso",
    "simlib.parallel.pipe_ps",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
