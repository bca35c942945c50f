"""Divergence, reported as an error instead of a NaN printed as if it were a result.

:class:`Diverged` is a ``ValueError``: a step size too large for the problem is a configuration
error, and every entry point (the CLI included) already reports ValueErrors by message alone.
It carries the step and the first non-finite value. Example::

    >>> check_finite(0.5, step=3, what="loss")
    >>> try:
    ...     check_finite(float("nan"), step=7, what="loss", hint="lr=1e6")
    ... except Diverged as e:
    ...     (e.step, str(e))
    (7, 'training diverged: the loss at step 7 was nan (lr=1e6 is too large?)')
"""
from __future__ import annotations

import math
from typing import Any


class Diverged(ValueError):
    """Training produced a non-finite metric; ``step`` and ``value`` say where and what."""

    def __init__(self, step: int, value: float, what: str = "loss", hint: str = ""):
        # args are the fields, so that copies made as type(e)(*e.args) (SimPy, pickle) keep them
        super().__init__(int(step), float(value), what, hint)
        self.step, self.value, self.what, self.hint = int(step), float(value), what, hint

    def __str__(self) -> str:
        extra = f" ({self.hint} is too large?)" if self.hint else ""
        return f"training diverged: the {self.what} at step {self.step} was {self.value}{extra}"


def check_finite(value: Any, step: int, what: str = "loss", hint: str = "") -> None:
    """Raise :class:`Diverged` if ``value`` is NaN or infinite."""
    if not math.isfinite(float(value)):
        raise Diverged(step, float(value), what, hint)


def check_metric(value: Any, step: int, problem: Any, lr: float) -> None:
    """:func:`check_finite` for ``problem``'s metric after ``step`` updates at step size ``lr`` (every substrate)."""
    check_finite(value, step, getattr(problem, "metric", "loss"), f"lr={lr:g}")

