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

import contextlib
import errno
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import secrets
import shutil
import stat
import sys
import threading
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

import simlib
from simlib import _validate as check
from simlib.grade import cgroup as cgroups
from simlib.grade import export, probe
from simlib.grade import notebook as nbm
from simlib.grade.child import TAMPER, heads
from simlib.grade.sandbox import (Interrupted, Limits, Outcome, SandboxError, Unit, choose, exposed, run_units,
                                  sweep_scratch)

VERSION = "4"
MAX_NOTEBOOK_MB = 20
MESSAGE_CHARS = 300  # per message in feedback
MAX_CELL_ERRORS = 20  # errors of the student's own cells listed in feedback
_SAFE = re.compile(r"[^A-Za-z0-9_.@-]+")
_PLAIN = re.compile(r"[A-Za-z0-9_@-][A-Za-z0-9_.@-]{0,99}")


class Refused(Exception):
    """Grading cannot start: the master notebook does not score full marks in the sandbox."""


def build_units(master: dict[str, Any], student: dict[str, Any],
                drawn: dict[str, list[dict[str, Any]]] | None = None) -> list[Unit]:
    """What runs: the student's cells ('answer' units), with locked and test cells taken from the master.

    A test unit names the part (grade_id) it belongs to. Test cells run as two units (visible, then
    hidden) so feedback can say which failed; a part with calls in ``drawn`` (see
    :mod:`simlib.grade.probe`) sends those calls in place of its hidden tests. Locked cells the
    student deleted are appended at the end.
    """
    by_id = {str(nbm.meta(c)["grade_id"]): c for c in master["cells"] if nbm.meta(c).get("grade_id")}
    units: list[Unit] = []
    used: set[str] = set()

    def add_master(gid: str, cell: dict[str, Any]) -> None:
        used.add(gid)
        if nbm.is_test(cell):
            visible, hidden = nbm.split_hidden(nbm.source(cell))
            calls = (drawn or {}).get(gid)
            hidden_unit = (hidden, "test") if calls is None else (json.dumps(probe.sent(calls)), "probe")
            for label, (code, kind) in (("visible tests", (visible, "test")), ("hidden tests", hidden_unit)):
                if code.strip():
                    units.append(Unit(f"{gid}: {label}", code, kind, gid))
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
            units.append(Unit(gid, nbm.source(cell), "answer"))
        else:
            units.append(Unit(f"cell {k + 1}", nbm.source(cell), "answer"))
    for gid, mcell in by_id.items():
        if gid not in used and mcell.get("cell_type") == "code" and not nbm.is_answer(mcell):
            add_master(gid, mcell)
    # probes last: no cell of the student's runs after one, so nothing it saw can reach the feedback
    return sorted(units, key=lambda u: u.kind == "probe")


def score(master: dict[str, Any], units: list[Unit], outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """One row per part: full points if every test unit of the part passed, else 0 and the messages."""
    rows = []
    for part in nbm.parts(master):
        row = {"part": part.grade_id, "points": 0.0, "max_points": part.points, "messages": []}
        if part.kind == "manual":
            row["status"] = "needs manual grading"
        else:
            mine = [i for i, unit in enumerate(units) if unit.part == part.grade_id]
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
    return [ln.strip() for _, hidden in nbm.hidden_tests(master) for ln in hidden.splitlines() if len(ln.strip()) >= 10]


def clean(text: str, secret: list[str] = ()) -> str:
    """A message fit for feedback: one printable line, at most MESSAGE_CHARS, never quoting hidden tests; invisible
    characters shown escaped ('s02\\u200b'), so a name never looks like another."""
    printable = "".join(ch if ch.isprintable() else " " if ch.isspace() else ascii(ch)[1:-1] for ch in str(text))
    text = " ".join(printable.split())
    if any(line in printable or line in text for line in secret):
        return "(message withheld: it quotes the hidden tests)"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."


def refused(master: dict[str, Any], reason: str) -> dict[str, Any]:
    """The result of a submission that was not run: 0 for every autograded part, with the reason."""
    reason = clean(reason)
    rows = score(master, [], [])
    for row in rows:
        if row["status"] != "needs manual grading":
            row.update(status=f"not graded: {reason}", messages=[])
    return {"parts": rows, "cell_errors": [], "notes": [reason], "refused": reason}


@dataclass(frozen=True)
class Probes:
    """The calls drawn for the parts checked outside the sandbox, and the master's replies to them (None: this is
    the master's own run, which returns its replies)."""

    drawn: dict[str, list[Any]]
    expected: dict[str, Any] | None = None


def grade_submission(master_path: Path, data: bytes, limits: Limits = Limits(), numba_cache: Path | None = None,
                     warm: bool = False, sandbox: str = "auto", stop: threading.Event | None = None,
                     probes: Probes | None = None) -> dict[str, Any]:
    """Grade one notebook's bytes against the master: {'parts': rows, 'cell_errors': [...], 'notes': [...],
    'flags': [...]} (flags: where the student's code names the library's reference answer, for the instructor).

    A part with calls in ``probes.drawn`` passes only if the replies equal ``probes.expected`` (the master's); the
    master's own run (``expected`` None) returns its replies as 'probes'."""
    drawn, expected = (None, None) if probes is None else (probes.drawn, probes.expected)
    master = nbm.load(master_path)
    try:
        student = nbm.loads(data)
        units = build_units(master, student, drawn)
    except (nbm.NotebookError, ValueError, RecursionError, TypeError) as exc:
        return refused(master, str(exc))
    refs = nbm.references(master)
    report = run_units(units, data, limits, numba_cache, warm, sandbox, stop, sorted(refs))
    secret = hidden_lines(master)
    outcomes = [Outcome(o.ok, clean(o.error, secret)) for o in report.outcomes]
    replies, ran = {}, []
    known = {f"<{u.name}>" for u in units if u.kind == "answer"} | {"<string>", "the submission's code"} | {
        f"the name {h!r} the grader calls" for h in heads(list((drawn or {}).values()))}  # what the sandbox may report
    checks = {gid: probe.functions(hidden) for gid, hidden in nbm.hidden_tests(master) if gid in (drawn or {})}
    for i, (unit, got) in enumerate(zip(units, report.outcomes)):
        if unit.kind == "probe" and got.ok:
            replies[unit.name] = got.values
            want = got.values if expected is None else expected.get(unit.name, [])  # the master: every call answered
            why = probe.verdict(got.values, want, drawn[unit.part], checks[unit.part])
            outcomes[i] = Outcome(not why, why)
            ran += probe.ran_beyond(got.values, want, drawn[unit.part], refs | {TAMPER}, unit.name, known)
    errors = [f"{u.name[:80]}: {o.error}" for u, o in zip(units, outcomes) if u.kind in ("code", "answer") and o.ok is False]
    if len(errors) > MAX_CELL_ERRORS:
        errors = errors[:MAX_CELL_ERRORS] + [f"... and {len(errors) - MAX_CELL_ERRORS} more"]
    return {"parts": score(master, units, outcomes), "cell_errors": errors, "notes": report.notes,
            "flags": flags(refs, units, [Outcome(used=[(f if f in known else "<code built at run time>", line, ref)
                                                       for o in report.outcomes for f, line, ref in o.used] + ran)],
                           nbm.declared(master))} | (
                {"probes": replies} if expected is None else {})


def flags(refs: set[str], units: list[Unit], outcomes: list[Outcome], declared: set[str] = frozenset()) -> list[str]:
    """Each line of the student's own code that names the library's reference answer (see nbm.references), or
    that read or ran it at run time, however the name was built or the reference reached (the child's ``used``)."""
    mine = {f"<{u.name}>": u for u in units if u.kind == "answer"}
    found = {(f"<{u.name}>", line, ref) for u in mine.values() for line, ref in nbm.uses(u.source, refs, declared)}
    found.update(used for outcome in outcomes for used in outcome.used if used[2] in refs or used[2] == TAMPER)
    order = {name: k for k, name in enumerate(mine)}
    out = []
    for name, line, ref in sorted(found, key=lambda f: (order.get(f[0], len(order)), f[0], f[1], f[2])):
        lines = mine[name].source.splitlines() if name in mine else []
        text = lines[line - 1].strip() if 0 < line <= len(lines) else "(code the submission built at run time)"
        where = clean(mine[name].name if name in mine else f"code named {name}" if line else name)[:80]
        where += f" line {line}: {clean(text)[:200]}" if line or name in mine else ""
        what = (f"uses {clean(ref)}, the library's reference answer" if ref != TAMPER else
                "replaces or removes the grader's call watch, sys.setprofile: what its code ran is not known")
        out.append(f"{where} ({what})")
    return out[:MAX_CELL_ERRORS]


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


def cache_key(master: bytes, submission: bytes, limits: Limits, sandbox: str, calls: str = "{}") -> str:
    """sha256 of the grader version, the environment, the sandbox (and whether it has a cgroup), the limits,
    the probes' calls (JSON), the master and the submission."""
    h = hashlib.sha256(f"{VERSION}\0{environment()}\0{sandbox}\0{cgroups.kind()}\0"
                       f"{json.dumps(asdict(limits), sort_keys=True)}\0{calls}\0".encode())
    h.update(hashlib.sha256(master).digest() + hashlib.sha256(submission).digest())
    return h.hexdigest()


@dataclass
class Submission:
    """One student's entry: the name shown in the gradebook, its notebook's bytes, or why it is refused, and notes
    for the instructor (never for the student: they may name other students' entries)."""

    student: str
    entry: str
    data: bytes = b""
    problem: str = ""
    notes: list[str] = field(default_factory=list)


ARCHIVES = (".zip", ".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz", ".gz", ".7z", ".rar")
MAX_FILES = 10_000  # files and folders in one student's folder
MAX_DEPTH = 64  # folders nested in one student's folder (os.walk recurses: far deeper would raise RecursionError)


def shown(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (decoded by the OS as surrogates) shown as \\xNN."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder",
          stat.S_IFREG: "a regular file"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def _no_follow(path: str, flags: int) -> int:
    """open(2) that fails on a link (ELOOP) and never waits (on a FIFO)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def read_notebook(path: Path) -> tuple[bytes, str]:
    """(bytes, '') of a regular file of at most MAX_NOTEBOOK_MB, else (b'', why not); never follows links."""
    cap = MAX_NOTEBOOK_MB * 1024 * 1024
    try:
        with open(path, "rb", opener=_no_follow) as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                return b"", f"the notebook is {_kind(mode)}, not a regular file"
            data = f.read(cap + 1)
    except OSError as exc:  # open() refuses a folder itself
        why = {errno.ELOOP: "is a symbolic link", errno.EISDIR: "is a folder, not a regular file"}
        return b"", f"the notebook {why.get(exc.errno, f'cannot be read ({exc.strerror})')}"
    return (b"", f"the notebook is larger than {MAX_NOTEBOOK_MB} MB") if len(data) > cap else (data, "")


def _notebooks_in(folder: Path, assignment: str) -> tuple[list[Path], str]:
    """The notebooks in a student's folder, the one to grade first (ASSIGNMENT.ipynb, else the first by path),
    or why none; files and folders are counted against MAX_FILES."""
    found: list[Path] = []
    seen = 0
    for here, dirs, files in os.walk(folder, followlinks=False):
        if os.path.relpath(here, folder).count(os.sep) >= MAX_DEPTH:
            return [], f"the folder holds folders nested more than {MAX_DEPTH} deep"
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        seen += len(files) + len(dirs)
        found += [Path(here) / name for name in files if name.endswith(".ipynb") and not name.startswith(".")]
        if seen > MAX_FILES:
            return [], f"the folder holds more than {MAX_FILES} files and folders"
    if not found:
        return [], "no notebook found in the submission"
    return sorted(found, key=lambda path: (path.name != f"{assignment}.ipynb", str(path))), ""


def _fresh(name: str, taken: set[str], suffix: str, key: Callable[[str], str] = str) -> str:
    """``name``, else the first of ``name + suffix.format(2)``, ``(3)``, ... whose key is not yet taken; now taken."""
    candidate, k = name, 1
    while key(candidate) in taken:
        k += 1
        candidate = name + suffix.format(k)
    taken.add(key(candidate))
    return candidate


def _entry(entry: os.DirEntry, assignment: str) -> Submission | str:
    """One entry of the class folder: its submission, or a note saying why it is not one."""
    name = shown(entry.name)
    if name.startswith("."):
        return f"ignored {name!r}: a hidden entry (its name starts with '.'); rename it to grade it"
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError as exc:
        return Submission(name, name, problem=f"{name} cannot be read ({exc.strerror})")
    if stat.S_ISDIR(mode):
        paths, problem = _notebooks_in(Path(entry.path), assignment)
        data, problem = read_notebook(paths[0]) if paths else (b"", problem)
        sub = Submission(name, name + "/", data, problem)
        rel = [shown(str(p.relative_to(entry.path))) for p in paths]
        if len(rel) > 1:
            sub.notes.append(f"{name}/: graded {rel[0]}; not graded: {', '.join(rel[1:6])}"
                             + (f" and {len(rel) - 6} more" if len(rel) > 6 else ""))
        return sub
    archive = next((a for a in ARCHIVES if name.lower().endswith(a)), "")
    if archive and stat.S_ISREG(mode):
        stem = name[: -len(archive)] or name
        return Submission(stem, name, problem=f"{name} is an archive, not a notebook: unpack it into {stem}/ "
                                              "and grade again")
    if not stat.S_ISREG(mode):  # links and special files are refused by name
        return Submission(name.removesuffix(".ipynb") or name, name,
                          problem=f"{name} is {_kind(mode)}, not a notebook or a folder")
    if name.endswith(".ipynb"):
        return Submission(name.removesuffix(".ipynb") or name, name, *read_notebook(Path(entry.path)))
    return f"ignored {name!r}: {_kind(mode)}, neither a notebook nor a folder"


def find_submissions(folder: Path, assignment: str) -> tuple[list[Submission], list[str]]:
    """Every submission in ``folder`` ('NAME.ipynb' files, or 'NAME/' folders holding the notebook, as
    nbgrader lays them out), and notes on entries ignored. A name is any byte string. Names that clash
    (``alice.ipynb`` beside ``alice/``, or equal after Unicode normalisation, case folding and the removal of
    invisible characters) are each
    graded under its entry's name, with a note; symbolic links and special files are refused; archives
    get a row saying to unpack them; nothing is dropped silently."""
    if not folder.exists():
        raise ValueError(f"submissions-dir: {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"submissions-dir: {folder} is not a folder")
    entries = [_entry(entry, assignment) for entry in sorted(os.scandir(folder), key=lambda e: os.fsencode(e.name))]
    subs = [e for e in entries if isinstance(e, Submission)]
    notes = [e for e in entries if isinstance(e, str)]
    if not subs:
        raise ValueError(f"submissions-dir: {folder} holds no submissions (NAME.ipynb files or NAME/ folders)")
    clash: dict[str, list[Submission]] = {}
    for sub in subs:
        visible = "".join(ch for ch in sub.student if unicodedata.category(ch) != "Cf")  # no zero-width characters
        clash.setdefault(unicodedata.normalize("NFKC", visible).casefold(), []).append(sub)
    for group in clash.values():
        if len(group) > 1:
            entries = ", ".join(s.entry for s in group)
            for sub in group:
                sub.student = sub.entry
                sub.notes.append(f"{entries} name the same student up to case, width or accents (or invisible "
                                 "characters): each is graded "
                                 "under its entry's name; check which is whose")
    taken: set[str] = set()
    for sub in subs:  # later repeats suffixed ' (2)', ' (3)', ... (an entry and a clash's entry name may meet)
        sub.student = _fresh(sub.student, taken, " ({})")
    return subs, notes


def feedback_names(students: list[str]) -> dict[str, str]:
    """student -> feedback file name: the name itself where it is short and plain ASCII, else a
    readable prefix and a hash of the full name, so no two students share a file."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for student in students:
        stem = student if _PLAIN.fullmatch(student) else (
            f"{_SAFE.sub('_', student)[:60].strip('._-') or 'student'}-{hashlib.sha256(student.encode()).hexdigest()[:10]}")
        out[student] = _fresh(stem, taken, "-{}", str.casefold) + ".txt"
    return out


def part_totals(parts: list[dict[str, Any]]) -> tuple[float, float]:
    """(points scored, points autograded) summed over a submission's part rows."""
    return (sum(r["points"] for r in parts),
            sum(r["max_points"] for r in parts if r["status"] != "needs manual grading"))


def check_hidden(master_path: Path, out_dir: Path, submissions: Path) -> None:
    """ValueError if the sandbox could read the master (hidden tests), the gradebook or other submissions, or if
    --out lies in the class folder (the next run would grade the gradebook as a student)."""
    for what, path in (("the master notebook", master_path), ("--out", out_dir), ("submissions-dir", submissions)):
        root = exposed(path)
        if root is not None:
            raise ValueError(f"{what}: {path} lies inside {root}, which submissions may read; move it elsewhere")
    subs = os.path.realpath(submissions)
    if os.path.commonpath([os.path.realpath(out_dir), subs]) == subs:
        raise ValueError(f"--out: {out_dir} lies inside submissions-dir {submissions}, where the next run would "
                         "take it for a student; put it elsewhere")


class Progress:
    """Progress over students: a tqdm bar on a terminal; one plain line per student otherwise (a log to keep)."""

    def __init__(self, total: int, stream: TextIO = sys.stderr):
        from tqdm import tqdm

        self.total, self.stream, self.done = total, stream, 0
        self.bar = tqdm(total=total, unit="student", file=stream, disable=not stream.isatty())

    def step(self, student: str, points: float, max_points: float, cached: bool) -> None:
        """Count one student done."""
        self.done += 1
        student, note = clean(student), " (cached)" if cached else ""
        if self.bar.disable:
            print(f"graded {self.done}/{self.total}: {student} {points:g}/{max_points:g}{note}", file=self.stream,
                  flush=True)
            return
        self.bar.set_postfix_str(student[:20], refresh=False)
        self.bar.update(1)
        if self.done == self.total:
            self.bar.close()


INTERRUPTED = "grading was interrupted (Ctrl-C) before this submission was graded; grade again to finish"


def grade_class(master_path: Path, submissions: Path, out_dir: Path, limits: Limits = Limits(),
                progress: Callable[[int], Progress] | None = Progress, jobs: int | None = None,
                sandbox: str = "auto", log: TextIO | None = None) -> list[dict[str, Any]]:
    """Grade every submission (cached ones are not re-run); write the gradebooks, manual.csv, notes.txt and
    feedback/ (see :mod:`simlib.grade.export`); return the rows of the long gradebook.

    ``jobs`` submissions run side by side (default 2, each in its own sandbox). ``sandbox``: 'auto'
    (bubblewrap where it runs, else the watcher, said once on ``log``), 'bwrap' or 'watcher'.
    ValueError for bad arguments, :class:`Refused` if the master does not score full marks. On Ctrl-C,
    the running sandboxes are killed, everything is written for what finished (the rest: 'not graded'),
    then :class:`Interrupted` says what did not finish.

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
    found, notes = find_submissions(submissions, master_path.stem)
    hand = {p.grade_id: p.points for p in nbm.parts(master) if p.kind == "manual"}
    filled = export.read_manual(out_dir / "manual.csv", hand)
    if note:  # after every check of the arguments, so a bad one is still answered in one line
        print(note, file=log)
    stale = sweep_scratch()
    notes += list(dict.fromkeys(n for sub in found for n in sub.notes))  # a clash's note is on each of its entries
    notes += [f"removed {len(stale)} scratch folder(s) of graders that were killed"] if stale else []
    for line in notes:
        print(f"note: {clean(line)}", file=log)
    names = feedback_names([s.student for s in found])
    (out_dir / ".cache").mkdir(parents=True, exist_ok=True)
    (out_dir / "feedback").mkdir(exist_ok=True)
    master_bytes = master_path.read_bytes()
    drawn = drawn_calls(master, out_dir)
    calls = json.dumps(drawn, sort_keys=True)
    kernels, expected = check_master(master_path, out_dir, limits, kind, drawn)
    bar = progress(len(found)) if progress is not None else None
    results: dict[str, dict[str, Any]] = {}

    def finish(sub: Submission, result: dict[str, Any], cached: bool, hit: Path | None = None) -> None:
        if hit is not None and not result.get("refused", "").startswith("the grader"):
            hit.write_text(json.dumps(result, indent=1, sort_keys=True))
        results[sub.student] = result
        try:
            write_feedback(out_dir / "feedback" / names[sub.student], master_path.stem, sub.student, result)
        except OSError as exc:
            print(f"note: feedback for {clean(sub.student)} not written ({exc.strerror})", file=log)
        for flag in result.get("flags", []):
            print(f"flag: {clean(sub.student)}: {flag}", file=log)
        if bar is not None:
            bar.step(sub.student, *part_totals(result["parts"]), cached)

    todo: list[tuple[Submission, Path]] = []
    for sub in found:
        if sub.problem:
            finish(sub, refused(master, sub.problem), False)
            continue
        hit = out_dir / ".cache" / f"{cache_key(master_bytes, sub.data, limits, kind, calls)}.json"
        try:
            finish(sub, json.loads(hit.read_text()), True)
        except (OSError, ValueError):
            todo.append((sub, hit))
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=jobs)
    running = {pool.submit(_grade_one, master, master_path, sub.data, limits, kernels, kind, stop,
                           Probes(drawn, expected)):
               (sub, hit) for sub, hit in todo}
    try:
        for done in as_completed(running):
            finish(running[done][0], done.result(), False, running[done][1])
    except KeyboardInterrupt:
        stop.set()  # each running sandbox is killed within 0.1 s
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for done, (sub, hit) in running.items():  # those that finished while the others were stopped
        if sub.student not in results and not done.cancelled() and done.exception() is None:
            finish(sub, done.result(), False, hit)
    missing = [sub.student for sub in found if sub.student not in results]
    results.update({student: refused(master, INTERRUPTED) for student in missing})  # not cached, no feedback
    flagged = {"status": "passed; flagged (notes.txt)"}
    rows = [{"assignment": master_path.stem, "student": sub.student} | {k: row[k] for k in export.COLUMNS[2:]}
            | (flagged if row["status"] == "passed" and results[sub.student].get("flags") else {})
            for sub in found for row in results[sub.student]["parts"]]
    notes += [f"{sub.student}: flagged: {flag}" for sub in found for flag in results[sub.student].get("flags", [])]
    write_outputs(out_dir, master, found, rows, filled, notes + [f"{s}: {INTERRUPTED}" for s in missing])
    if missing:
        raise Interrupted(f"{len(found) - len(missing)} of {len(found)} submissions graded, written to "
                          f"{out_dir / 'gradebook.csv'}; not graded: {', '.join(map(repr, missing[:20]))}"
                          + (f" and {len(missing) - 20} more" if len(missing) > 20 else ""))
    return rows


def write_outputs(out_dir: Path, master: dict[str, Any], found: list[Submission], rows: list[dict[str, Any]],
                  filled: dict[tuple[str, str], float], notes: list[str]) -> None:
    """The long and wide gradebooks (hand-graded points merged), the hand-grading sheet and the notes."""
    hand = {p.grade_id for p in nbm.parts(master) if p.kind == "manual"}
    answers = {}
    for sub in found:
        with contextlib.suppress(nbm.NotebookError, RecursionError, TypeError, AttributeError):
            answers.update({(sub.student, gid): text for gid, text in nbm.answers(nbm.loads(sub.data), hand).items()}
                           if sub.data and not sub.problem else {})
    export.write_manual(out_dir / "manual.csv", rows, answers, filled)
    rows = export.merge_manual(rows, filled)
    export.write_gradebook(out_dir / "gradebook.csv", rows)
    export.write_wide(out_dir / "gradebook-wide.csv", rows, {sub.student: sub.entry for sub in found})
    (out_dir / "notes.txt").write_text("".join(f"{clean(n)}\n" for n in notes), encoding="utf-8")


def _grade_one(master: dict[str, Any], master_path: Path, data: bytes, limits: Limits, kernels: Path,
               kind: str, stop: threading.Event, probes: Probes) -> dict[str, Any]:
    """grade_submission, with whatever goes wrong inside the grader made this student's 0 and reason."""
    try:
        return grade_submission(master_path, data, limits, kernels, sandbox=kind, stop=stop, probes=probes)
    except Interrupted:
        raise
    except Exception as exc:  # noqa: BLE001 - one submission must never stop the class
        return refused(master, f"the grader could not grade this submission ({type(exc).__name__}: {exc})")


def check_master(master_path: Path, out_dir: Path, limits: Limits, sandbox: str,
                 drawn: dict[str, list[Any]] | None = None) -> tuple[Path, dict[str, Any]]:
    """Run the master (trusted) in the sandbox with the class's limits; it must score every autograded
    point with no cell raising, else :class:`Refused` with one line saying why. Returns the folder its run
    compiled the library's kernels into (submissions get a copy; a pass is remembered in .cache, which no
    submission reads) and its replies to the ``drawn`` calls, which students' replies must equal."""
    master_bytes = master_path.read_bytes()
    key = cache_key(master_bytes, master_bytes, limits, sandbox, json.dumps(drawn or {}, sort_keys=True))[:16]
    kernels = out_dir / ".numba-cache" / key
    # NOTE: the pass is kept in .cache, never beside the kernels: submissions read that folder (a copy, or
    # /run/numba-cache), and the master's replies there answered every probe of 02 (8 of 8 points, unsolved).
    passed = out_dir / ".cache" / f"master-{key}.passed"
    if passed.is_file() and kernels.is_dir():
        return kernels, json.loads(passed.read_text()).get("probes", {})
    for old in (out_dir / ".numba-cache").glob("*"):
        shutil.rmtree(old, ignore_errors=True)
    for old in (out_dir / ".cache").glob("master-*.passed"):
        old.unlink()
    kernels.mkdir(parents=True)
    try:
        result = grade_submission(master_path, master_bytes, limits, kernels, warm=True, sandbox=sandbox,
                                  probes=Probes(drawn or {}))
    except SandboxError as exc:
        shutil.rmtree(kernels, ignore_errors=True)
        raise Refused(f"the master notebook {master_path.name} could not run in the sandbox: {clean(str(exc))} "
                      f"(is --memory-mb {limits.memory_mb} too low?)") from None
    short = [r for r in result["parts"] if r["status"] not in ("passed", "needs manual grading")]
    if short or result["cell_errors"]:
        shutil.rmtree(kernels, ignore_errors=True)
        got, of = part_totals(result["parts"])
        why = result["cell_errors"][0] if result["cell_errors"] else (
            f"{short[0]['part']}: {(short[0]['messages'] or [short[0]['status']])[0]}")
        raise Refused(f"the master notebook {master_path.name} scores {got:g}/{of:g} in the sandbox"
                      f"{' with errors' if result['cell_errors'] else ''}, so students would lose points ({clean(why)}); "
                      f"check that {sys.executable} has every package the notebook imports and that --cell-timeout "
                      f"{limits.cell_s:g}, --timeout {limits.wall_s:g} and --memory-mb {limits.memory_mb} are enough")
    passed.write_text(json.dumps(result, indent=1, sort_keys=True))
    return kernels, result.get("probes", {})


def drawn_calls(master: dict[str, Any], out_dir: Path) -> dict[str, list[Any]]:
    """grade_id -> the calls of each part whose hidden tests define _probes, drawn with this grading folder's
    seed (made at random the first time, kept in .cache/probe-seed; delete it to draw new inputs)."""
    path = out_dir / ".cache" / "probe-seed"
    if not path.is_file():
        path.write_text(str(secrets.randbits(63)))
    seed = int(path.read_text())
    drawn = {gid: probe.calls(hidden, seed) for gid, hidden in nbm.hidden_tests(master)}
    return {gid: calls for gid, calls in drawn.items() if calls is not None}


def write_feedback(path: Path, assignment: str, student: str, result: dict[str, Any]) -> None:
    """Per-student feedback: points per part, failed tests with their messages (never hidden test code),
    errors raised by the student's own cells; bounded (see MESSAGE_CHARS, MAX_CELL_ERRORS)."""
    total, auto_max = part_totals(result["parts"])
    manual = sum(r["max_points"] for r in result["parts"] if r["status"] == "needs manual grading")
    lines = [f"{assignment}: feedback for {clean(student)}", "",
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
