"""simlib: distributed machine learning you can run, measure and grade.

Substrates (``simlib.sim``, ``simlib.parallel``, ``simlib.gpu``) run the same problems
(``simlib.problems``) and return the same :class:`~simlib.trace.Trace`, which ``simlib.viz`` plots.
"""
from simlib.trace import QualityPoint, Span, Trace, Update

__version__ = "0.1.0"
__all__ = ["Trace", "Span", "Update", "QualityPoint", "__version__"]
