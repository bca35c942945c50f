"""simlib: distributed machine learning you can run, measure and grade.

One entry point runs any problem under any protocol on any substrate and returns one Result::

    >>> import simlib
    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(1_000, 100, 5, seed=0), eval_rows=None)
    >>> res = simlib.run(prob, "ssp:2", substrate="sim", n_workers=4, steps=10)
    >>> res.trace.summary()["max_clock_lag"] <= 2
    True

Problems (``simlib.problems``) follow :class:`simlib.contract.Problem`; protocols are
:class:`simlib.protocol.Protocol` values; substrates (``simlib.substrates.names()``) return the same
:class:`~simlib.trace.Trace`, which ``simlib.viz`` plots.
"""
from __future__ import annotations

# NOTE: nothing is imported here, not even typing (the annotations stay strings): ``python -m simlib`` runs
# this module before its Ctrl-C handling starts, and an import here under load was wide enough for a Ctrl-C
# to land in it (a traceback and status -2 instead of one line and 130).

# Imported on first use (PEP 562), so that ``python -m simlib`` reaches its own code -- and its
# Ctrl-C handling -- before anything else runs.
_LAZY = {"Protocol": "simlib.protocol", "Trace": "simlib.trace", "Span": "simlib.trace", "Update": "simlib.trace",
         "QualityPoint": "simlib.trace"}

__version__ = "0.1.0"
__all__ = ["Protocol", "Trace", "Span", "Update", "QualityPoint", "run", "__version__"]


def run(problem: Any, protocol: Any = "bsp", substrate: str = "sim", **options: Any) -> Any:
    """Train ``problem`` under ``protocol`` on ``substrate`` (see :func:`simlib.substrates.run`)."""
    from simlib.substrates import run as _run

    return _run(problem, protocol, substrate, **options)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'simlib' has no attribute {name!r}")
