"""Grading a class: the units a submission runs, its score per part, the cache, gradebook and feedback.

Only this (the grader's) process writes the gradebook and the feedback; submissions run in
:mod:`simlib.grade.sandbox`. Before any student, the master notebook runs in the same sandbox with
the same limits and must score every autograded point, else grading is refused (:class:`Refused`).
A submission's result is cached under a hash of its bytes, the master's bytes, the limits, the
sandbox (and whether it has a cgroup), the interpreter and installed packages (:func:`environment`) and :data:`VERSION`, so
re-running gives the same gradebook and a student added later is graded alone. Whatever one
submission is or does, it ends as that student's rows (0 and a one-line reason at worst); the
gradebook is written for everyone.
"""
from __future__ import annotations

import csv
import errno
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import stat
import sys
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

import simlib
from simlib import _validate as check
from simlib.grade import cgroup as cgroups
from simlib.grade import notebook as nbm
from simlib.grade.sandbox import Limits, Outcome, SandboxError, Unit, choose, exposed, run_units

VERSION = "2"
COLUMNS = ("assignment", "student", "part", "points", "max_points", "status")
MAX_NOTEBOOK_MB = 20
MESSAGE_CHARS = 300  # per message in feedback
MAX_CELL_ERRORS = 20  # errors of the student's own cells listed in feedback
_SAFE = re.compile(r"[^A-Za-z0-9_.@-]+")
_PLAIN = re.compile(r"[A-Za-z0-9_@-][A-Za-z0-9_.@-]{0,99}")


class Refused(Exception):
    """Grading cannot start: the master notebook does not score full marks in the sandbox."""


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


def hidden_lines(master: dict[str, Any]) -> list[str]:
    """The hidden tests' lines worth looking for in a message (long enough not to match by chance)."""
    return [ln.strip() for cell in master["cells"] if nbm.is_test(cell)
            for ln in nbm.split_hidden(nbm.source(cell))[1].splitlines() if len(ln.strip()) >= 10]


def clean(text: str, secret: list[str]) -> str:
    """A message fit for feedback: one printable line, at most MESSAGE_CHARS, never quoting hidden tests."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(text))
    if any(line in text for line in secret) or any(line in " ".join(text.split()) for line in secret):
        return "(message withheld: it quotes the hidden tests)"
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


def refused(master: dict[str, Any], reason: str) -> dict[str, Any]:
    """The result of a submission that was not run: 0 for every autograded part, with the reason."""
    reason = clean(reason, [])
    rows = score(master, [], {}, [])
    for row in rows:
        if row["status"] != "needs manual grading":
            row.update(status=f"not graded: {reason}", messages=[])
    return {"parts": rows, "cell_errors": [], "notes": [reason], "refused": reason}


def grade_submission(master_path: Path, data: bytes, limits: Limits = Limits(), numba_cache: Path | None = None,
                     warm: bool = False, sandbox: str = "auto") -> dict[str, Any]:
    """Grade one notebook's bytes against the master: {'parts': rows, 'cell_errors': [...], 'notes': [...]}."""
    master = nbm.load(master_path)
    try:
        student = nbm.loads(data)
        units, part_of = build_units(master, student)
    except (nbm.NotebookError, ValueError, RecursionError, TypeError) as exc:
        return refused(master, str(exc))
    report = run_units(units, data, limits, numba_cache, warm, sandbox)
    secret = hidden_lines(master)
    outcomes = [Outcome(o.ok, clean(o.error, secret), o.fatal) for o in report.outcomes]
    errors = [f"{u.name[:80]}: {o.error}" for u, o in zip(units, outcomes) if u.kind == "code" and o.ok is False]
    if len(errors) > MAX_CELL_ERRORS:
        errors = errors[:MAX_CELL_ERRORS] + [f"... and {len(errors) - MAX_CELL_ERRORS} more"]
    return {"parts": score(master, units, part_of, outcomes), "cell_errors": errors, "notes": report.notes}


@functools.lru_cache(maxsize=None)
def environment() -> str:
    """sha256 of what a grade depends on besides the notebooks: the interpreter, every installed
    distribution's version and simlib's own source."""
    h = hashlib.sha256(f"{sys.version}\0{os.path.realpath(sys.executable)}\0".encode())
    # A set: the same distribution is found twice where the project's own folder is on sys.path (its
    # simlib.egg-info beside the installed metadata), which made the key depend on the working directory.
    dists = sorted({f"{d.metadata.get('Name', '?')}=={d.version}" for d in importlib.metadata.distributions()})
    h.update("\n".join(dists).encode())
    package = Path(simlib.__file__).parent
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def cache_key(master: bytes, submission: bytes, limits: Limits, sandbox: str) -> str:
    """sha256 of the grader version, the environment, the sandbox (and whether it has a cgroup), the limits,
    the master and the submission."""
    h = hashlib.sha256(f"{VERSION}\0{environment()}\0{sandbox}\0{cgroups.kind()}\0"
                       f"{json.dumps(asdict(limits), sort_keys=True)}\0".encode())
    h.update(hashlib.sha256(master).digest() + hashlib.sha256(submission).digest())
    return h.hexdigest()


@dataclass
class Submission:
    """One student's entry: the name shown in the gradebook, its notebook's bytes, or why it is refused."""

    student: str
    entry: str
    data: bytes = b""
    problem: str = ""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def read_notebook(path: Path) -> tuple[bytes, str]:
    """(bytes, '') of a regular file of at most MAX_NOTEBOOK_MB, else (b'', why not); never follows links."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        link = exc.errno == errno.ELOOP
        return b"", "the notebook is a symbolic link" if link else f"the notebook cannot be read ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b"", f"the notebook is {_kind(st.st_mode)}, not a regular file"
        cap = MAX_NOTEBOOK_MB * 1024 * 1024
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(cap + 1)
        if len(data) > cap:
            return b"", f"the notebook is larger than {MAX_NOTEBOOK_MB} MB"
        return data, ""
    except OSError as exc:
        return b"", f"the notebook cannot be read ({exc.strerror})"
    finally:
        os.close(fd)


def _notebook_in(folder: Path, assignment: str) -> tuple[Path | None, str]:
    """The notebook in a student's folder (ASSIGNMENT.ipynb first, else the first *.ipynb), or why none."""
    found: list[tuple[bool, str, Path]] = []
    seen = 0
    for here, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        seen += len(files)
        found += [(name != f"{assignment}.ipynb", os.path.join(here, name), Path(here) / name)
                  for name in files if name.endswith(".ipynb") and not name.startswith(".")]
        if seen > 10_000:
            return None, "the folder holds more than 10000 files"
    if not found:
        return None, "no notebook found in the submission"
    return min(found)[2], ""


def _unique(names: list[str]) -> list[str]:
    """The names, later repeats suffixed ' (2)', ' (3)', ... (an entry and a clash's entry name may meet)."""
    taken: dict[str, None] = {}  # a dict: the names in order
    for name in names:
        candidate, k = name, 1
        while candidate in taken:
            k += 1
            candidate = f"{name} ({k})"
        taken[candidate] = None
    return list(taken)


def find_submissions(folder: Path, assignment: str) -> tuple[list[Submission], list[str]]:
    """Every submission in ``folder`` ('NAME.ipynb' files, or 'NAME/' folders holding the notebook, as
    nbgrader lays them out), and notes on entries ignored. Names that clash (``alice.ipynb`` beside
    ``alice/``, or equal after Unicode normalisation and case folding) are all refused, each under its
    entry's name; symbolic links and special files are refused; nothing is dropped silently."""
    if not folder.exists():
        raise ValueError(f"submissions-dir: {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"submissions-dir: {folder} is not a folder")
    subs: list[Submission] = []
    notes: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        name = entry.name
        if name.startswith("."):
            continue
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError as exc:
            subs.append(Submission(name, name, problem=f"{name} cannot be read ({exc.strerror})"))
            continue
        if stat.S_ISDIR(mode):
            path, problem = _notebook_in(Path(entry.path), assignment)
            sub = Submission(name, name + "/", problem=problem)
            if path is not None:
                sub.data, sub.problem = read_notebook(path)
            subs.append(sub)
        elif name.endswith(".ipynb") or not stat.S_ISREG(mode):  # links and special files are refused by name
            sub = Submission(name.removesuffix(".ipynb") or name, name)
            if stat.S_ISREG(mode):
                sub.data, sub.problem = read_notebook(Path(entry.path))
            else:
                sub.problem = f"{name} is {_kind(mode)}, not a notebook or a folder"
            subs.append(sub)
        else:
            notes.append(f"ignored {name!r}: {_kind(mode)}, neither a notebook nor a folder")
    if not subs:
        raise ValueError(f"submissions-dir: {folder} holds no submissions (NAME.ipynb files or NAME/ folders)")
    clash: dict[str, list[Submission]] = {}
    for sub in subs:
        clash.setdefault(unicodedata.normalize("NFKC", sub.student).casefold(), []).append(sub)
    for group in clash.values():
        if len(group) > 1:
            entries = ", ".join(s.entry for s in group)
            for sub in group:
                sub.student = sub.entry
                sub.data, sub.problem = b"", f"{entries} all name the same student; keep one and grade again"
    for sub, name in zip(subs, _unique([s.student for s in subs])):
        sub.student = name
    return subs, notes


def feedback_names(students: list[str]) -> dict[str, str]:
    """student -> feedback file name: the name itself where it is short and plain ASCII, else a
    readable prefix and a hash of the full name, so no two students share a file."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for student in students:
        stem = student if _PLAIN.fullmatch(student) else (
            f"{_SAFE.sub('_', student)[:60].strip('._-') or 'student'}-{hashlib.sha256(student.encode()).hexdigest()[:10]}")
        k = 1
        while f"{stem}.txt".casefold() in taken:
            k += 1
            stem = f"{stem}-{k}"
        taken.add(f"{stem}.txt".casefold())
        out[student] = f"{stem}.txt"
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
    """Progress over students: a tqdm bar on a terminal; one plain line per student otherwise (a log to keep)."""

    def __init__(self, total: int, stream: TextIO = sys.stderr):
        from tqdm import tqdm

        self.total, self.stream, self.done = total, stream, 0
        self.bar = tqdm(total=total, unit="student", file=stream, disable=not stream.isatty())

    def step(self, student: str, points: float, max_points: float, cached: bool) -> None:
        """Count one student done."""
        self.done += 1
        student, note = clean(student, []), " (cached)" if cached else ""
        if self.bar.disable:
            self.stream.write(f"graded {self.done}/{self.total}: {student} {points:g}/{max_points:g}{note}\n")
            self.stream.flush()
            return
        self.bar.set_postfix_str(student[:20], refresh=False)
        self.bar.update(1)
        if self.done == self.total:
            self.bar.close()


def grade_class(master_path: Path, submissions: Path, out_dir: Path, limits: Limits = Limits(),
                progress: Callable[[int], Progress] | None = Progress, jobs: int | None = None,
                sandbox: str = "auto", log: TextIO | None = None) -> list[dict[str, Any]]:
    """Grade every submission (cached ones are not re-run); write gradebook.csv and feedback/; return the rows.

    ``jobs`` submissions run side by side (default 2, each in its own sandbox). ``sandbox``: 'auto'
    (bubblewrap where it runs, else the watcher, said once on ``log``), 'bwrap' or 'watcher'.
    ValueError for bad arguments, :class:`Refused` if the master does not score full marks.

    >>> grade_class("solutions/01-ssp-rule.ipynb", "submitted", "grades/01")  # doctest: +SKIP
    """
    log = sys.stderr if log is None else log
    master_path, submissions, out_dir = Path(master_path), Path(submissions), Path(out_dir)
    master = nbm.load(master_path)
    check_hidden(master_path, out_dir, submissions)
    kind, note = choose(sandbox)
    jobs = (2 if kind == "bwrap" or os.getuid() == 0 else 1) if jobs is None else jobs
    check.positive_int("--jobs", jobs)
    if jobs > 1 and kind != "bwrap" and os.getuid() != 0:
        raise ValueError("--jobs: submissions run side by side only in bubblewrap or as root "
                         "(each needs a private /dev/shm); use 1")
    found, ignored = find_submissions(submissions, master_path.stem)
    if note:  # after every check of the arguments, so a bad one is still answered in one line
        print(note, file=log)
    for line in ignored:
        print(f"note: {clean(line, [])}", file=log)
    names = feedback_names([s.student for s in found])
    (out_dir / ".cache").mkdir(parents=True, exist_ok=True)
    (out_dir / "feedback").mkdir(exist_ok=True)
    master_bytes = master_path.read_bytes()
    kernels = check_master(master_path, out_dir, limits, kind)
    bar = progress(len(found)) if progress is not None else None
    results: dict[str, dict[str, Any]] = {}

    def finish(sub: Submission, result: dict[str, Any], cached: bool) -> None:
        results[sub.student] = result
        try:
            write_feedback(out_dir / "feedback" / names[sub.student], master_path.stem, sub.student, result)
        except OSError as exc:
            print(f"note: feedback for {clean(sub.student, [])} not written ({exc.strerror})", file=log)
        if bar is not None:
            bar.step(sub.student, *part_totals(result["parts"]), cached)

    todo: list[tuple[Submission, Path]] = []
    for sub in found:
        if sub.problem:
            finish(sub, refused(master, sub.problem), False)
            continue
        hit = out_dir / ".cache" / f"{cache_key(master_bytes, sub.data, limits, kind)}.json"
        try:
            finish(sub, json.loads(hit.read_text()), True)
        except (OSError, ValueError):
            todo.append((sub, hit))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running = {pool.submit(_grade_one, master, master_path, sub.data, limits, kernels, kind): (sub, hit)
                   for sub, hit in todo}
        for done in as_completed(running):
            sub, hit = running[done]
            result = done.result()
            if "refused" not in result or not result["refused"].startswith("the grader"):
                hit.write_text(json.dumps(result, indent=1, sort_keys=True))
            finish(sub, result, False)
    rows = [{"assignment": master_path.stem, "student": sub.student} | {k: row[k] for k in COLUMNS[2:]}
            for sub in found for row in results[sub.student]["parts"]]
    write_gradebook(out_dir / "gradebook.csv", rows)
    return rows


def _grade_one(master: dict[str, Any], master_path: Path, data: bytes, limits: Limits, kernels: Path,
               kind: str) -> dict[str, Any]:
    """grade_submission, with whatever goes wrong inside the grader made this student's 0 and reason."""
    try:
        return grade_submission(master_path, data, limits, kernels, sandbox=kind)
    except Exception as exc:  # noqa: BLE001 - one submission must never stop the class
        return refused(master, f"the grader could not grade this submission ({type(exc).__name__}: {exc})")


def check_master(master_path: Path, out_dir: Path, limits: Limits, sandbox: str) -> Path:
    """Run the master (trusted) in the sandbox with the class's limits; it must score every autograded
    point with no cell raising, else :class:`Refused` with one line saying why. Its run compiles the library's kernels
    into the folder returned, which submissions get a copy of; a pass is remembered there."""
    master_bytes = master_path.read_bytes()
    key = cache_key(master_bytes, master_bytes, limits, sandbox)[:16]
    kernels = out_dir / ".numba-cache" / key
    if (kernels / "master-passed").is_file():
        return kernels
    for old in (out_dir / ".numba-cache").glob("*"):
        shutil.rmtree(old, ignore_errors=True)
    kernels.mkdir(parents=True)
    try:
        result = grade_submission(master_path, master_bytes, limits, kernels, warm=True, sandbox=sandbox)
    except SandboxError as exc:
        shutil.rmtree(kernels, ignore_errors=True)
        raise Refused(f"the master notebook {master_path.name} could not run in the sandbox: {clean(str(exc), [])} "
                      f"(is --memory-mb {limits.memory_mb} too low?)") from None
    short = [r for r in result["parts"] if r["status"] not in ("passed", "needs manual grading")]
    if short or result["cell_errors"]:
        shutil.rmtree(kernels, ignore_errors=True)
        got, of = part_totals(result["parts"])
        why = result["cell_errors"][0] if result["cell_errors"] else (
            f"{short[0]['part']}: {(short[0]['messages'] or [short[0]['status']])[0]}")
        raise Refused(f"the master notebook {master_path.name} scores {got:g}/{of:g} in the sandbox"
                      f"{' with errors' if result['cell_errors'] else ''}, so students would lose points ({clean(why, [])}); "
                      f"check that {sys.executable} has every package the notebook imports and that --cell-timeout "
                      f"{limits.cell_s:g}, --timeout {limits.wall_s:g} and --memory-mb {limits.memory_mb} are enough")
    (kernels / "master-passed").write_text(json.dumps(result, indent=1, sort_keys=True))
    return kernels


def write_gradebook(path: Path, rows: list[dict[str, Any]]) -> None:
    """The gradebook: one row per student and part (written whole, then moved into place)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows({**row, "points": f"{row['points']:g}", "max_points": f"{row['max_points']:g}"} for row in rows)
    os.replace(tmp, path)


def write_feedback(path: Path, assignment: str, student: str, result: dict[str, Any]) -> None:
    """Per-student feedback: points per part, failed tests with their messages (never hidden test code),
    errors raised by the student's own cells; bounded (see MESSAGE_CHARS, MAX_CELL_ERRORS)."""
    total, auto_max = part_totals(result["parts"])
    manual = sum(r["max_points"] for r in result["parts"] if r["status"] == "needs manual grading")
    lines = [f"{assignment}: feedback for {clean(student, [])}", "",
             f"Autograded: {total:g} / {auto_max:g} points" + (f"; {manual:g} more points are graded by hand." if manual else ""), ""]
    if result.get("refused"):
        lines += [f"Your submission was not graded: {result['refused']}", ""]
    for r in result["parts"]:
        status = "not graded" if r["status"].startswith("not graded") else r["status"]
        lines.append(f"- {r['part']}: {r['points']:g} / {r['max_points']:g} ({status})")
        lines.extend(f"    {m}" for m in r["messages"])
    if result["cell_errors"]:
        lines += ["", "Errors raised by your cells:"] + [f"- {e}" for e in result["cell_errors"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
