"""Every simlib module's docstring examples run and print what they say."""
import doctest
import importlib
import pkgutil

import pytest

import simlib

# Packages a module may need that this install may lack; a module whose import needs one is skipped.
OPTIONAL = {"cupy": "needs CuPy and a CUDA GPU", "ipywidgets": "the live panel needs ipywidgets"}


def all_modules() -> list[str]:
    """Every module and package under simlib, found by walking the package (nothing hand-picked)."""
    found = ["simlib"] + [m.name for m in pkgutil.walk_packages(simlib.__path__, "simlib.")]
    return sorted(n for n in found if not n.endswith("__main__"))


@pytest.mark.parametrize("name", all_modules())
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL:
            raise
        pytest.skip(f"{name}: {OPTIONAL[e.name]} ({e.name} is not installed)")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_discovery_finds_the_core_modules():
    found = set(all_modules())
    assert {"simlib.trace", "simlib.sim.engine", "simlib.substrates.pipes", "simlib.app.scenario",
            "simlib.calibration.validate", "simlib.problems.logistic"} <= found
    assert len(found) > 40
