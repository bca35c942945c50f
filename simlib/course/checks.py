"""Visible checks for lessons: each headline claim is asserted where it is made, and quick mode.

A lesson states a finding and proves it in the same cell::

    >>> check("4 shards are faster than one", 2.9 > 2)
    ✓ 4 shards are faster than one

A claim that does not hold raises ``AssertionError`` with the claim and the evidence, so a
regression in the library fails the lesson's notebook test. ``SIMLIB_QUICK=1`` in the environment
asks lessons for smaller runs (CI); :func:`sized` picks the size.
"""
from __future__ import annotations

import os
from typing import Any, TypeVar

T = TypeVar("T")
QUICK_ENV = "SIMLIB_QUICK"


def check(claim: str, ok: Any, evidence: str = "") -> None:
    """Print '✓ claim' if ``ok`` is true, else raise AssertionError('✗ claim: evidence')."""
    if not isinstance(claim, str) or not claim:
        raise ValueError(f"claim must be a non-empty sentence, got {claim!r}")
    if not bool(ok):
        raise AssertionError(f"✗ {claim}" + (f": {evidence}" if evidence else ""))
    print(f"✓ {claim}" + (f" ({evidence})" if evidence else ""))


def quick() -> bool:
    """True when ``SIMLIB_QUICK`` is set to anything but '', '0' or 'false' (small runs for CI)."""
    return os.environ.get(QUICK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def sized(default: T, quick_value: T) -> T:
    """``quick_value`` in quick mode, else ``default``: one place where a lesson shrinks."""
    return quick_value if quick() else default


def reveal(question: str, guess: Any, truth: Any, tolerance: float = 0.0, detail: str = "") -> None:
    """Say whether a student's ``guess`` matches ``truth`` (within ``tolerance`` for numbers), then show ``detail``.

    With ``guess`` None nothing of the answer is shown: the cell asks for a guess instead, so running
    a notebook top to bottom never answers a prediction that was not made. Prints, returns nothing,
    and never raises on a wrong guess: a wrong prediction is the point of the exercise.
    """
    if guess is None:
        print(f"{question} Predict first: set my_guess in this cell, then run it again to see the answer.")
        return
    if isinstance(truth, bool):  # a yes / no answer: 1 or "yes" is not True
        right = guess is truth
    elif isinstance(truth, (int, float)) and isinstance(guess, (int, float)):
        right = abs(guess - truth) <= tolerance
    else:
        right = guess == truth
    print(f"{question} You guessed {guess}; the run says {truth}: {'✓ right' if right else '✗ not quite'}."
          + (f" {detail}" if detail else ""))
