"""``python -m simlib.grade``: generate student notebooks, or grade a class.

    python -m simlib.grade generate [--solutions DIR] [--assignments DIR] [--check]
    python -m simlib.grade ASSIGNMENT SUBMISSIONS_DIR [--out DIR] [--solutions DIR] [limits] [--jobs N]

ASSIGNMENT is a master notebook's path, its name ('02-hogwild') or number ('02'), looked up in
``--solutions`` (default: ./solutions, else the course's own solutions/ beside the simlib package, so
the grader runs from any folder). The master is graded first, in the same sandbox with the same limits, and must
score every autograded point (else: one line saying why, exit status 1). Bad arguments, missing or
empty folders print one line naming them and exit with status 2. Ctrl-C stops the running
submissions, writes the gradebook of those that finished, names the others and exits with status 130.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from itertools import groupby
from pathlib import Path
from typing import NoReturn

import simlib
from simlib.grade import notebook as nbm
from simlib.grade.gradebook import Refused, grade_class, part_totals
from simlib.grade.sandbox import FLAGS, Interrupted, Limits

COMMANDS = ("generate",)


class Usage(ValueError):
    """A command line that cannot be run: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line naming the problem (no usage block)."""

    def error(self, message: str) -> NoReturn:
        raise Usage(f"{message} (see {self.prog} --help)")


def find_master(assignment: str, solutions: Path) -> Path:
    """The master notebook named by a path, a name or a number."""
    path = Path(assignment)
    if path.suffix == ".ipynb":
        if path.is_file():
            return path
        raise ValueError(f"assignment: {assignment} is not a file")
    if not solutions.is_dir():
        raise ValueError(f"--solutions: {solutions} is not a folder (give the master notebooks' folder, "
                         "or the master's path)")
    matches = sorted(solutions.glob(f"{assignment}.ipynb")) or sorted(solutions.glob(f"{assignment}*.ipynb"))
    if len(matches) != 1:
        names = ", ".join(p.stem for p in sorted(solutions.glob("[0-9]*.ipynb"))) or "none"
        raise ValueError(f"assignment: {assignment!r} names {'no' if not matches else 'more than one'} master notebook "
                         f"in {solutions} (there: {names})")
    return matches[0]


def course_folder(name: str) -> Path:
    """./NAME if it is a folder, else the course's own NAME/ beside the simlib package (a checkout), else ./NAME."""
    here, course = Path(name), Path(simlib.__file__).resolve().parent.parent / name
    return course if not here.is_dir() and course.is_dir() else here


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["generate"]:
            return generate(argv[1:])
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1, cutoff=0.75) if argv else []
        if close and not Path(argv[0]).exists():
            raise Usage(f"unknown command {argv[0]!r}; did you mean '{close[0]}'? (see python -m simlib.grade --help)")
        return grade(argv)
    except Refused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted before the submissions were graded; no gradebook was written", file=sys.stderr)
        return 130
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def generate(argv: list[str]) -> int:
    """Write (or with --check, verify) the student versions."""
    ap = Parser(prog="python -m simlib.grade generate", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                description="Write assignments/NN-name.ipynb (student versions) from solutions/NN-name.ipynb.")
    ap.add_argument("--solutions", type=Path, default=Path("solutions"), help="folder of master notebooks")
    ap.add_argument("--assignments", type=Path, default=Path("assignments"), help="folder the student versions go to")
    ap.add_argument("--check", action="store_true", help="only say whether the student versions are up to date")
    a = ap.parse_args(argv)
    if not a.solutions.is_dir():
        raise ValueError(f"--solutions: {a.solutions} is not a folder")
    if not list(a.solutions.glob("[0-9]*.ipynb")):
        raise ValueError(f"--solutions: {a.solutions} holds no master notebooks (NN-name.ipynb)")
    if a.check:
        if not a.assignments.is_dir():
            raise ValueError(f"--assignments: {a.assignments} is not a folder")
        stale = nbm.out_of_date(a.solutions, a.assignments)
        print("up to date" if not stale else "out of date: " + ", ".join(stale))
        return 1 if stale else 0
    for path in nbm.generate_all(a.solutions, a.assignments):
        print(f"wrote {path}")
    return 0


def grade(argv: list[str]) -> int:
    """Grade a folder of submissions; print the totals."""
    ap = Parser(prog="python -m simlib.grade", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("assignment", help="master notebook: its path, name ('02-hogwild') or number ('02')")
    ap.add_argument("submissions", type=Path, metavar="submissions-dir",
                    help="folder of NAME.ipynb files or NAME/ folders (nbgrader's layout)")
    ap.add_argument("--out", type=Path, default=None, help="gradebook and feedback (default: grades/ASSIGNMENT)")
    ap.add_argument("--solutions", type=Path, default=None,
                    help="where ASSIGNMENT is looked up (default: solutions, here if there is one, else the "
                         "course's own beside the simlib package)")
    for name, (flag, metavar, meaning) in FLAGS.items():
        default = getattr(Limits(), name)
        ap.add_argument(flag, dest=name, type=type(default), default=default, metavar=metavar,
                        help=f"{meaning} (default: {default:g})")
    ap.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="submissions graded side by side (default: 2 in bubblewrap or as root, else 1)")
    ap.add_argument("--sandbox", choices=("auto", "bwrap", "watcher"), default="auto",
                    help="bwrap: bubblewrap namespaces; watcher: a process-tree watcher (weaker); "
                         "auto: bwrap where it runs (default: auto)")
    a = ap.parse_args(argv)
    master = find_master(a.assignment, a.solutions if a.solutions is not None else course_folder("solutions"))
    out = a.out if a.out is not None else Path("grades") / master.stem
    limits = Limits(**{name: getattr(a, name) for name in FLAGS})
    rows = grade_class(master, a.submissions, out, limits, jobs=a.jobs, sandbox=a.sandbox)
    # grade_class lists each student's rows together
    for student, parts in groupby(rows, key=lambda r: r["student"]):
        got, of = part_totals(list(parts))
        print(f"{student!r}: {got:g} / {of:g}" if not student.isprintable() else f"{student}: {got:g} / {of:g}")
    print(f"gradebook: {out / 'gradebook.csv'} (per student: {out / 'gradebook-wide.csv'}); hand grading: "
          f"{out / 'manual.csv'}; notes: {out / 'notes.txt'}; feedback: {out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
