"""Grading a class: the units a submission runs, its score per part, the cache, gradebook and feedback.

Only this (the grader's) process writes the gradebook and the feedback; submissions run in
:mod:`simlib.grade.sandbox`. A submission's result is cached under a hash of its bytes, the master
notebook's bytes, the limits and :data:`VERSION`, so re-running gives the same gradebook and a
student added later is graded alone.
"""
from __future__ import annotations

import csv
import hashlib
from concurrent.futures import ThreadPoolExecutor, as_completed
import json
import re
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, TextIO

from simlib.grade import notebook as nbm
from simlib.grade.sandbox import Limits, Outcome, Unit, exposed, parallel_safe, run_units

VERSION = "1"
COLUMNS = ("assignment", "student", "part", "points", "max_points", "status")
_SAFE = re.compile(r"[^A-Za-z0-9_.@-]+")


def build_units(master: dict[str, Any], student: dict[str, Any]) -> tuple[list[Unit], dict[int, str]]:
    """What runs: the student's cells, with locked and test cells taken from the master.

    Returns the units and, for test units, the grade_id of the part each belongs to. Test cells
    run as two units (visible, then hidden) so feedback can say which failed. Locked cells the
    student deleted are appended at the end.
    """
    by_id = {str(nbm.meta(c)["grade_id"]): c for c in master["cells"] if nbm.meta(c).get("grade_id")}
    units: list[Unit] = []
    part_of: dict[int, str] = {}
    used: set[str] = set()

    def add_master(gid: str, cell: dict[str, Any]) -> None:
        used.add(gid)
        if nbm.is_test(cell):
            visible, hidden = nbm.split_hidden(nbm.source(cell))
            for label, code in (("visible tests", visible), ("hidden tests", hidden)):
                if code.strip():
                    part_of[len(units)] = gid
                    units.append(Unit(f"{gid}: {label}", code, "test"))
        else:
            units.append(Unit(gid, nbm.source(cell), "code"))

    for k, cell in enumerate(student["cells"]):
        if cell.get("cell_type") != "code":
            continue
        gid = str(nbm.meta(cell).get("grade_id", ""))
        mcell = by_id.get(gid)
        if mcell is not None and mcell.get("cell_type") == "code" and not nbm.is_answer(mcell):
            if gid not in used:
                add_master(gid, mcell)
        elif mcell is not None and gid not in used:
            used.add(gid)
            units.append(Unit(gid, nbm.source(cell), "code"))
        else:
            units.append(Unit(f"cell {k + 1}", nbm.source(cell), "code"))
    for gid, mcell in by_id.items():
        if gid not in used and mcell.get("cell_type") == "code" and not nbm.is_answer(mcell):
            add_master(gid, mcell)
    return units, part_of


def score(master: dict[str, Any], units: list[Unit], part_of: dict[int, str], outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """One row per part: full points if every test unit of the part passed, else 0 and the messages."""
    rows = []
    for part in nbm.parts(master):
        row = {"part": part.grade_id, "points": 0.0, "max_points": part.points, "messages": []}
        if part.kind == "manual":
            row["status"] = "needs manual grading"
        else:
            mine = [i for i, gid in part_of.items() if gid == part.grade_id]
            failed = [i for i in mine if not outcomes[i].ok]
            if mine and not failed:
                row.update(points=part.points, status="passed")
            else:
                row["status"] = "failed" if mine else "failed: its tests did not run"
                row["messages"] = [f"{units[i].name} failed: {outcomes[i].error or 'not run'}" for i in failed]
        rows.append(row)
    return rows


def grade_submission(master_path: Path, submission: Path | None, limits: Limits = Limits(),
                     numba_cache: Path | None = None, warm: bool = False) -> dict[str, Any]:
    """Grade one notebook against the master: {'parts': rows, 'cell_errors': [...], 'notes': [...]}."""
    master = nbm.load(master_path)
    data = submission.read_bytes() if submission is not None else b""
    try:
        if submission is None:
            raise nbm.NotebookError("no notebook found in the submission")
        student = nbm.loads(data)
        units, part_of = build_units(master, student)
    except (nbm.NotebookError, ValueError) as exc:
        rows = score(master, [], {}, [])
        for row in rows:
            if row["status"] != "needs manual grading":
                row.update(status="failed", messages=[f"submission not graded: {exc}"])
        return {"parts": rows, "cell_errors": [], "notes": [str(exc)]}
    report = run_units(units, data, limits, numba_cache, warm)
    errors = [f"{u.name}: {o.error}" for u, o in zip(units, report.outcomes) if u.kind == "code" and o.ok is False]
    return {"parts": score(master, units, part_of, report.outcomes), "cell_errors": errors, "notes": report.notes}


def cache_key(master_path: Path, submission: Path | None, limits: Limits) -> str:
    """sha256 of the grader version, the limits, the master's and the submission's bytes."""
    h = hashlib.sha256(f"{VERSION}\0{json.dumps(asdict(limits), sort_keys=True)}\0".encode())
    h.update(master_path.read_bytes())
    h.update(b"\0" + (submission.read_bytes() if submission is not None else b"<missing>"))
    return h.hexdigest()


def find_submissions(folder: Path, assignment: str) -> dict[str, Path | None]:
    """student -> notebook: 'NAME.ipynb' files, or folders 'NAME/' holding the notebook (nbgrader's layout)."""
    if not folder.is_dir():
        raise ValueError(f"submissions-dir: {folder} is not a directory")
    out: dict[str, Path | None] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.suffix == ".ipynb":
            out[entry.stem] = entry
        elif entry.is_dir():
            found = sorted(entry.rglob(f"{assignment}.ipynb")) or sorted(entry.rglob("*.ipynb"))
            found = [p for p in found if ".ipynb_checkpoints" not in p.parts]
            out[entry.name] = found[0] if found else None
    return out


def part_totals(parts: list[dict[str, Any]]) -> tuple[float, float]:
    """(points scored, points autograded) summed over a submission's part rows."""
    return (sum(r["points"] for r in parts),
            sum(r["max_points"] for r in parts if r["status"] != "needs manual grading"))


def check_hidden(master_path: Path, out_dir: Path, submissions: Path) -> None:
    """ValueError if the sandbox could read the master (hidden tests), the gradebook or other submissions."""
    for what, path in (("the master notebook", master_path), ("--out", out_dir), ("submissions-dir", submissions)):
        root = exposed(path)
        if root is not None:
            raise ValueError(f"{what}: {path} lies inside {root}, which submissions may read; move it elsewhere")


class Progress:
    """A progress bar over students on a terminal; one plain line per student otherwise."""

    def __init__(self, total: int, stream: TextIO = sys.stderr):
        self.total, self.stream, self.done = total, stream, 0
        self.tty = stream.isatty()

    def step(self, student: str, points: float, max_points: float, cached: bool) -> None:
        """Count one student done."""
        self.done += 1
        note = " (cached)" if cached else ""
        if self.tty:
            width = 30
            fill = int(width * self.done / max(self.total, 1))
            self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {student[:20]:<20}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"graded {self.done}/{self.total}: {student} {points:g}/{max_points:g}{note}\n")
        self.stream.flush()


def grade_class(master_path: Path, submissions: Path, out_dir: Path, limits: Limits = Limits(),
                progress: Callable[[int], Progress] | None = Progress, jobs: int | None = None) -> list[dict[str, Any]]:
    """Grade every submission (cached ones are not re-run); write gradebook.csv and feedback/; return the rows.

    ``jobs`` submissions run side by side (default: 2 where each gets a private /dev/shm, else 1).
    """
    master_path, submissions, out_dir = Path(master_path), Path(submissions), Path(out_dir)
    nbm.load(master_path)
    check_hidden(master_path, out_dir, submissions)
    jobs = (2 if parallel_safe() else 1) if jobs is None else jobs
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    if jobs > 1 and not parallel_safe():
        raise ValueError("jobs: submissions run side by side only as root (each needs a private /dev/shm); use 1")
    found = find_submissions(submissions, master_path.stem)
    cache = out_dir / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    (out_dir / "feedback").mkdir(exist_ok=True)
    kernels = warm_kernels(master_path, out_dir, limits)
    bar = progress(len(found)) if progress is not None else None
    results: dict[str, dict[str, Any]] = {}

    def finish(student: str, result: dict[str, Any], cached: bool) -> None:
        results[student] = result
        write_feedback(out_dir / "feedback" / f"{_SAFE.sub('_', student)}.txt", master_path.stem, student, result)
        if bar is not None:
            bar.step(student, *part_totals(result["parts"]), cached)

    todo: dict[str, tuple[Path | None, Path]] = {}
    for student, path in found.items():
        hit = cache / f"{cache_key(master_path, path, limits)}.json"
        if hit.exists():
            finish(student, json.loads(hit.read_text()), True)
        else:
            todo[student] = (path, hit)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running = {pool.submit(grade_submission, master_path, path, limits, kernels): (student, hit)
                   for student, (path, hit) in todo.items()}
        for done in as_completed(running):
            student, hit = running[done]
            result = done.result()
            hit.write_text(json.dumps(result, indent=1, sort_keys=True))
            finish(student, result, False)
    rows = [{"assignment": master_path.stem, "student": student} | {k: row[k] for k in COLUMNS[2:]}
            for student in found for row in results[student]["parts"]]
    write_gradebook(out_dir / "gradebook.csv", rows)
    return rows


def warm_kernels(master_path: Path, out_dir: Path, limits: Limits) -> Path:
    """Compile the library's kernels once by running the master notebook (trusted) in the sandbox.

    Also a check of the master itself: a warning if it does not score full marks.
    """
    key = cache_key(master_path, master_path, limits)[:16]
    kernels = out_dir / ".numba-cache" / key
    if kernels.is_dir():
        return kernels
    for old in (out_dir / ".numba-cache").glob("*"):
        shutil.rmtree(old, ignore_errors=True)
    kernels.mkdir(parents=True)
    result = grade_submission(master_path, master_path, limits, kernels, warm=True)
    short = [r["part"] for r in result["parts"] if r["status"] not in ("passed", "needs manual grading")]
    if short:
        print(f"warning: the master notebook fails {', '.join(short)}: {result['parts']}", file=sys.stderr)
    return kernels


def write_gradebook(path: Path, rows: list[dict[str, Any]]) -> None:
    """The gradebook: one row per student and part."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({**row, "points": f"{row['points']:g}", "max_points": f"{row['max_points']:g}"})


def write_feedback(path: Path, assignment: str, student: str, result: dict[str, Any]) -> None:
    """Per-student feedback: points per part, failed tests with their messages (never hidden test code)."""
    total, auto_max = part_totals(result["parts"])
    manual = sum(r["max_points"] for r in result["parts"] if r["status"] == "needs manual grading")
    lines = [f"{assignment}: feedback for {student}", "",
             f"Autograded: {total:g} / {auto_max:g} points" + (f"; {manual:g} more points are graded by hand." if manual else ""), ""]
    for r in result["parts"]:
        lines.append(f"- {r['part']}: {r['points']:g} / {r['max_points']:g} ({r['status']})")
        lines.extend(f"    {m}" for m in r["messages"])
    if result["cell_errors"]:
        lines += ["", "Errors raised by your cells:"] + [f"- {e}" for e in result["cell_errors"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
