"""``python -m simlib.grade``: generate student notebooks, or grade a class.

    python -m simlib.grade generate [--solutions solutions] [--assignments assignments] [--check]
    python -m simlib.grade ASSIGNMENT SUBMISSIONS_DIR [--out DIR] [--cell-timeout S] [--timeout S]
                           [--memory-mb MB] [--max-procs N] [--jobs N] [--solutions DIR]

ASSIGNMENT is a master notebook's path, its name ('02-hogwild') or number ('02'), looked up in
``--solutions``. Bad arguments print one message and exit with status 2.
"""
from __future__ import annotations

import argparse
import sys
from itertools import groupby
from pathlib import Path

from simlib.grade import notebook as nbm
from simlib.grade.gradebook import grade_class, part_totals
from simlib.grade.sandbox import Limits


def find_master(assignment: str, solutions: Path) -> Path:
    """The master notebook named by a path, a name or a number."""
    path = Path(assignment)
    if path.suffix == ".ipynb" and path.is_file():
        return path
    matches = sorted(solutions.glob(f"{assignment}.ipynb")) or sorted(solutions.glob(f"{assignment}*.ipynb"))
    if len(matches) != 1:
        names = ", ".join(p.stem for p in sorted(solutions.glob("[0-9]*.ipynb"))) or "none"
        raise ValueError(f"assignment: {assignment!r} names {'no' if not matches else 'more than one'} master notebook "
                         f"in {solutions} (there: {names})")
    return matches[0]


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["generate"]:
            return generate(argv[1:])
        return grade(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def generate(argv: list[str]) -> int:
    """Write (or with --check, verify) the student versions."""
    ap = argparse.ArgumentParser(prog="python -m simlib.grade generate")
    ap.add_argument("--solutions", type=Path, default=Path("solutions"))
    ap.add_argument("--assignments", type=Path, default=Path("assignments"))
    ap.add_argument("--check", action="store_true", help="only say whether assignments/ is up to date")
    a = ap.parse_args(argv)
    if a.check:
        stale = nbm.out_of_date(a.solutions, a.assignments)
        print("up to date" if not stale else "out of date: " + ", ".join(stale))
        return 1 if stale else 0
    for path in nbm.generate_all(a.solutions, a.assignments):
        print(f"wrote {path}")
    return 0


def grade(argv: list[str]) -> int:
    """Grade a folder of submissions; print the totals."""
    ap = argparse.ArgumentParser(prog="python -m simlib.grade", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("assignment")
    ap.add_argument("submissions", type=Path, metavar="submissions-dir")
    ap.add_argument("--out", type=Path, default=None, help="gradebook and feedback (default grades/ASSIGNMENT)")
    ap.add_argument("--solutions", type=Path, default=Path("solutions"))
    d = Limits()
    ap.add_argument("--cell-timeout", type=float, default=d.cell_s)
    ap.add_argument("--timeout", type=float, default=d.wall_s, help="seconds for a whole submission")
    ap.add_argument("--memory-mb", type=int, default=d.memory_mb)
    ap.add_argument("--max-procs", type=int, default=d.max_procs)
    ap.add_argument("--jobs", type=int, default=None, help="submissions graded side by side (default 2 as root, else 1)")
    a = ap.parse_args(argv)
    master = find_master(a.assignment, a.solutions)
    out = a.out if a.out is not None else Path("grades") / master.stem
    limits = Limits(cell_s=a.cell_timeout, wall_s=a.timeout, memory_mb=a.memory_mb, max_procs=a.max_procs)
    rows = grade_class(master, a.submissions, out, limits, jobs=a.jobs)
    # grade_class lists each student's rows together
    for student, parts in groupby(rows, key=lambda r: r["student"]):
        got, of = part_totals(list(parts))
        print(f"{student}: {got:g} / {of:g}")
    print(f"gradebook: {out / 'gradebook.csv'}; feedback: {out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
