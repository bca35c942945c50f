"""The files an instructor opens or imports: the long and wide gradebooks, the hand-grading sheet, the notes.

* ``gradebook.csv``: one row per student and part (``assignment, student, part, points, max_points, status``).
* ``gradebook-wide.csv``: one row per student (``id, name, total``, then one column per part), as an LMS
  imports it; a hand-graded part is empty until it is graded.
* ``manual.csv``: one row per student and hand-graded part (``student, part, max_points, points, answer``):
  the instructor fills ``points``; the next grading run (everything else comes from the cache) keeps
  what was filled and merges it into both gradebooks, with the status ``graded by hand``.
* ``notes.txt``: what the instructor should know (entries not graded, clashing names, flagged submissions).

Every text cell is escaped against spreadsheet formulas (OWASP's rule: a leading ``=``, ``+``, ``-``,
``@``, tab or carriage return gets a ``'`` in front), so a student named ``=HYPERLINK(...)`` stays text; a leading
``'`` gets one too, so two texts never escape alike (``=x`` and ``'=x``).
"""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any, Iterable

COLUMNS = ("assignment", "student", "part", "points", "max_points", "status")
MANUAL = ("student", "part", "max_points", "points", "answer")
HAND = "graded by hand"
_FORMULA = tuple("=+-@\t\r'")  # a leading ' too: the escape stays reversible
MAX_ANSWER_CHARS = 5000


def cell(text: str) -> str:
    """A CSV text cell a spreadsheet never evaluates: ``'`` before a leading = + - @ tab, CR or '."""
    return "'" + text if text.startswith(_FORMULA) else text


def uncell(text: str) -> str:
    """The text :func:`cell` escaped."""
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA) else text


def _write(path: Path, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    """A CSV written whole, then moved into place (a reader never sees half of it); text cells escaped."""
    tmp = path.with_name(path.name + ".tmp")
    try:  # a lone surrogate in a student's answer is written escaped: one student's text never fails the class
        with open(tmp, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow([cell(c) for c in columns])
            w.writerows([cell(v) if isinstance(v, str) else f"{v:g}" for v in row] for row in rows)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_gradebook(path: Path, rows: list[dict[str, Any]]) -> None:
    """The long gradebook: one row per student and part."""
    _write(path, COLUMNS, ([r[c] for c in COLUMNS] for r in rows))


def write_wide(path: Path, rows: list[dict[str, Any]], names: dict[str, str]) -> None:
    """The wide gradebook: id, name (the entry handed in), total, then each part's points (empty: not graded yet)."""
    parts = list(dict.fromkeys(r["part"] for r in rows))
    by_student: dict[str, dict[str, Any]] = {}
    for r in rows:
        by_student.setdefault(r["student"], {})[r["part"]] = r
    table = []
    for student, mine in by_student.items():
        points = ["" if mine[p]["status"] == "needs manual grading" else mine[p]["points"] for p in parts]
        table.append([student, names.get(student, student), sum(p for p in points if p != ""), *points])
    _write(path, ["id", "name", "total", *parts], table)


def read_manual(path: Path, max_points: dict[str, float]) -> dict[tuple[str, str], float]:
    """(student, part) -> points filled in ``manual.csv``; ValueError naming the line of a bad entry."""
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet may save a byte-order mark
        reader = csv.DictReader(f)
        if not set(MANUAL[:4]) <= set(reader.fieldnames or ()):
            raise ValueError(f"{path}: the columns must include {', '.join(MANUAL[:4])} (as the grader wrote them)")
        filled = {}
        for line, row in enumerate(reader, 2):
            text, part = (row["points"] or "").strip(), uncell(row["part"] or "")
            if not text:
                continue
            if part not in max_points:
                raise ValueError(f"{path} line {line}: part {part!r} is not a hand-graded part "
                                 f"({', '.join(max_points) or 'there are none'})")
            try:
                points = float(text)
            except ValueError:
                points = math.nan
            if not 0 <= points <= max_points[part]:
                raise ValueError(f"{path} line {line}: points must be a number from 0 to {max_points[part]:g}, "
                                 f"got {text!r}")
            filled[(uncell(row["student"] or ""), part)] = points
    return filled


def write_manual(path: Path, rows: list[dict[str, Any]], answers: dict[tuple[str, str], str],
                 filled: dict[tuple[str, str], float]) -> None:
    """The hand-grading sheet: a row per student and hand-graded part, with the answer and the points filled so far."""
    _write(path, MANUAL, ([r["student"], r["part"], r["max_points"], filled.get((r["student"], r["part"]), ""),
                           answers.get((r["student"], r["part"]), "")[:MAX_ANSWER_CHARS]]
                          for r in rows if r["status"] in ("needs manual grading", HAND)))


def merge_manual(rows: list[dict[str, Any]], filled: dict[tuple[str, str], float]) -> list[dict[str, Any]]:
    """The rows with the points filled by hand in place of 'needs manual grading'."""
    return [r | {"points": filled[(r["student"], r["part"])], "status": HAND}
            if r["status"] == "needs manual grading" and (r["student"], r["part"]) in filled else r for r in rows]
