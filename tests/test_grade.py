"""The grader: markup and student versions, hostile submissions in the sandbox, the gradebook, nbgrader."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from simlib.grade import notebook as nbm
from simlib.grade.gradebook import Progress, grade_class
from simlib.grade.sandbox import Limits

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, ASSIGNMENTS = ROOT / "solutions", ROOT / "assignments"
PY = sys.executable


def _meta(**kw):
    return {"nbgrader": {"grade": False, "locked": False, "solution": False, "schema_version": 3, **kw}}


def _cell(kind, source, **meta):
    cell = {"cell_type": kind, "metadata": _meta(**meta) if meta else {}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def toy_master(answer1="def f():\n    return 1", answer2="def g():\n    return 2"):
    """Two autograded parts (2 and 3 points) and a hand-graded question (1 point)."""
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        _cell("code", "import numpy as np", grade_id="setup", locked=True),
        _cell("code", f"### BEGIN SOLUTION\n{answer1}\n### END SOLUTION", grade_id="a1", solution=True),
        _cell("code", "assert f() == 1, 'f() should be 1'\n### BEGIN HIDDEN TESTS\nassert f() + 1 == 2, 'hidden f'\n"
                      "### END HIDDEN TESTS", grade_id="t1", grade=True, locked=True, points=2),
        _cell("code", f"### BEGIN SOLUTION\n{answer2}\n### END SOLUTION", grade_id="a2", solution=True),
        _cell("code", "assert g() == 2\n### BEGIN HIDDEN TESTS\nassert g() * 2 == 4, 'hidden g: SECRET-HIDDEN-CODE'\n"
                      "### END HIDDEN TESTS", grade_id="t2", grade=True, locked=True, points=3),
        _cell("markdown", "### BEGIN SOLUTION\nBecause.\n### END SOLUTION", grade_id="q", grade=True, solution=True,
              points=1),
    ]}


def with_answer1(master, code):
    """A submission: the master with part 1's answer replaced by ``code``."""
    nb = json.loads(json.dumps(master))
    nb["cells"][1]["source"] = code
    return nb


# -- markup ---------------------------------------------------------------------------------------
def test_student_version_strips_solutions_and_hidden_tests():
    student = nbm.student_version(toy_master(), 7)
    text = json.dumps(student)
    assert "BEGIN SOLUTION" not in text and "HIDDEN" not in text and "hidden g" not in text
    assert nbm.source(student["cells"][1]) == 'raise NotImplementedError("Assignment 7, part 1")'
    assert nbm.source(student["cells"][3]) == 'raise NotImplementedError("Assignment 7, part 2")'
    assert nbm.source(student["cells"][2]) == "assert f() == 1, 'f() should be 1'"
    assert nbm.source(student["cells"][5]) == nbm.ANSWER_HERE
    assert [p.grade_id for p in nbm.parts(student)] == ["t1", "t2", "q"]


def test_solution_blocks_keep_their_indentation():
    text = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"
    assert nbm.strip_solution(text, "raise NotImplementedError()") == "def f(x):\n    raise NotImplementedError()"
    with pytest.raises(ValueError, match="END SOLUTION"):
        nbm.strip_solution("### BEGIN SOLUTION\nx = 1\n", "pass")
    assert nbm.split_hidden("a\n### BEGIN HIDDEN TESTS\nb\n### END HIDDEN TESTS\nc\n") == ("a\nc\n", "b\n")


def test_assignments_are_up_to_date_with_solutions():
    masters = sorted(p.name for p in SOLUTIONS.glob("[0-9]*.ipynb"))
    assert masters, "no master notebooks in solutions/"
    assert nbm.out_of_date(SOLUTIONS, ASSIGNMENTS) == [], "run: python -m simlib.grade generate"


def test_notebooks_are_committed_without_outputs():
    for path in sorted(SOLUTIONS.glob("*.ipynb")) + sorted(ASSIGNMENTS.glob("*.ipynb")):
        for cell in nbm.load(path)["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name


def test_invalid_notebooks_are_reported():
    with pytest.raises(nbm.NotebookError, match="not a valid notebook"):
        nbm.loads(b"{not json")
    with pytest.raises(nbm.NotebookError, match="no list of cells"):
        nbm.loads(b'{"cells": 3}')


# -- a hostile class ------------------------------------------------------------------------------
def _descendants_and_children() -> set[int]:
    out = set()
    for name in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if b"simlib.grade.child" in cmd:
            out.add(int(name))
    return out


def _rows(out: Path) -> dict[tuple[str, str], float]:
    with open(out / "gradebook.csv", newline="") as f:
        return {(r["student"], r["part"]): float(r["points"]) for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    base = tmp_path_factory.mktemp("course")
    master = toy_master()
    master_path = base / "solutions" / "07-toy.ipynb"
    master_path.parent.mkdir()
    master_path.write_text(nbm.dump(master))
    subs, out = base / "submitted", base / "grades"
    subs.mkdir()
    students = {
        "good": master,
        "blank": nbm.student_version(master, 7),
        "loop": with_answer1(master, "while True:\n    pass"),
        "memory": with_answer1(master, "hog = bytearray(10 * 2**30)\ndef f():\n    return 1"),
        "forks": with_answer1(master, "import os, time\nfor _ in range(100):\n    if os.fork() == 0:\n"
                                      "        os.setsid()\n        time.sleep(60)\n        os._exit(0)\n"
                                      "def f():\n    return 1"),
        "reader": with_answer1(master, f"secret = open({str(master_path)!r}).read()\n"
                                       f"other = open({str(subs / 'good.ipynb')!r}).read()\ndef f():\n    return 1"),
        "writer": with_answer1(master, f"open({str(out / 'gradebook.csv')!r}, 'w').write('good,t1,0,2')\n"
                                       f"open({str(out / 'feedback' / 'good.txt')!r}, 'w').write('0 points')\n"
                                       "def f():\n    return 1"),
        "exits": with_answer1(master, "import os\nos._exit(0)"),
        "killer": with_answer1(master, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                                       "def f():\n    return 1"),
        "shm": with_answer1(master, "from multiprocessing import shared_memory\n"
                                    "from simlib.parallel import SharedArray\n"
                                    "leak = shared_memory.SharedMemory(name='simlib-grade-test-leak', create=True, size=4096)\n"
                                    "leak2 = SharedArray.zeros(1000)\ndef f():\n    return 1"),
        "tamper": with_answer1(master, "def f():\n    return 2"),
    }
    for name, nb in students.items():
        (subs / f"{name}.ipynb").write_text(nbm.dump(nb))
    (subs / "garbage.ipynb").write_text("{not json")
    before_shm = set(os.listdir("/dev/shm"))
    before_procs = _descendants_and_children()
    log = io.StringIO()
    limits = Limits(cell_s=4, wall_s=60)
    grade_class(master_path, subs, out, limits, progress=lambda n: Progress(n, log))
    return {"base": base, "master": master_path, "subs": subs, "out": out, "limits": limits, "log": log.getvalue(),
            "new_shm": set(os.listdir("/dev/shm")) - before_shm,
            "left_procs": _descendants_and_children() - before_procs}


EXPECTED = {  # student: (t1, t2)
    "good": (2, 3), "blank": (0, 0), "loop": (0, 3), "memory": (0, 3), "forks": (0, 3), "reader": (0, 3),
    "writer": (0, 3), "exits": (0, 3), "killer": (0, 3), "shm": (2, 3), "tamper": (0, 3), "garbage": (0, 0),
}


def test_each_hostile_submission_loses_only_what_it_breaks(hostile_class):
    rows = _rows(hostile_class["out"])
    got = {s: (rows[(s, "t1")], rows[(s, "t2")]) for s in EXPECTED}
    assert got == EXPECTED
    assert all(rows[(s, "q")] == 0 for s in EXPECTED)


@pytest.mark.parametrize("student, reason", [
    ("loop", "time limit of 4 s per cell"),
    ("memory", "MemoryError"),
    ("forks", "more than 32 processes"),
    ("reader", "PermissionError"),
    ("writer", "PermissionError"),
    ("exits", "exited with status 0"),
    ("killer", "PermissionError"),
    ("garbage", "not a valid notebook"),
    ("blank", "NotImplementedError: Assignment 7, part 1"),
    ("tamper", "f() should be 1"),
])
def test_feedback_gives_the_reason(hostile_class, student, reason):
    text = (hostile_class["out"] / "feedback" / f"{student}.txt").read_text()
    assert reason in text


def test_feedback_never_shows_hidden_test_code(hostile_class):
    for path in (hostile_class["out"] / "feedback").iterdir():
        assert "SECRET-HIDDEN-CODE" not in path.read_text()
        assert "g() * 2" not in path.read_text()


def test_grades_and_feedback_of_others_survive(hostile_class):
    good = (hostile_class["out"] / "feedback" / "good.txt").read_text()
    assert "Autograded: 5 / 5 points; 1 more points are graded by hand." in good
    assert len(list((hostile_class["out"] / "feedback").iterdir())) == len(EXPECTED)


def test_nothing_is_left_behind(hostile_class):
    assert hostile_class["left_procs"] == set()
    # /dev/shm is shared with whatever else runs on the machine: look for the segment the submission named.
    assert "simlib-grade-test-leak" not in os.listdir("/dev/shm")
    assert not any(name.startswith("simlib-grade-test") for name in hostile_class["new_shm"])
    assert list(Path(tempfile.gettempdir()).glob("simlib-grade-*")) == []


def test_regrading_is_cached_and_gives_the_same_gradebook(hostile_class):
    out = hostile_class["out"]
    first = (out / "gradebook.csv").read_bytes()
    log = io.StringIO()
    grade_class(hostile_class["master"], hostile_class["subs"], out, hostile_class["limits"],
                progress=lambda n: Progress(n, log))
    assert (out / "gradebook.csv").read_bytes() == first
    assert log.getvalue().count("(cached)") == len(EXPECTED)


def test_grading_again_from_scratch_one_at_a_time_gives_the_same_gradebook(hostile_class, tmp_path):
    grade_class(hostile_class["master"], hostile_class["subs"], tmp_path / "again", hostile_class["limits"],
                progress=None, jobs=1)
    assert (tmp_path / "again" / "gradebook.csv").read_bytes() == (hostile_class["out"] / "gradebook.csv").read_bytes()


def test_a_late_student_is_graded_alone(hostile_class):
    subs, out = hostile_class["subs"], hostile_class["out"]
    late = subs / "late.ipynb"
    late.write_text(hostile_class["master"].read_text() + "\n")  # new bytes: not in the cache
    log = io.StringIO()
    try:
        grade_class(hostile_class["master"], subs, out, hostile_class["limits"], progress=lambda n: Progress(n, log))
    finally:
        late.unlink()
    assert log.getvalue().count("(cached)") == len(EXPECTED)
    assert "late 5/5\n" in log.getvalue()


def test_hidden_tests_inside_a_readable_tree_are_refused(tmp_path):
    master = ROOT / "simlib" / "grade" / "07-toy.ipynb"  # inside the package the sandbox may read
    with pytest.raises(ValueError, match="which submissions may read"):
        from simlib.grade.gradebook import check_hidden
        check_hidden(master, tmp_path / "out", tmp_path)


def test_cli_errors_exit_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([PY, "-m", "simlib.grade", "99", str(tmp_path), "--solutions", str(SOLUTIONS)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 2 and "assignment: '99' names no master notebook" in res.stderr
    res = subprocess.run([PY, "-m", "simlib.grade", "generate", "--check", "--solutions", str(SOLUTIONS),
                          "--assignments", str(ASSIGNMENTS)], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and "up to date" in res.stdout


# -- the real assignments -------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("master", sorted(p.name for p in SOLUTIONS.glob("[0-9]*.ipynb")))
def test_solution_scores_full_marks_and_student_version_zero(tmp_path, master):
    subs = tmp_path / "submitted"
    subs.mkdir()
    shutil.copy(SOLUTIONS / master, subs / "solution.ipynb")
    shutil.copy(ASSIGNMENTS / master, subs / "blank.ipynb")
    course = tmp_path / "solutions"
    course.mkdir()
    shutil.copy(SOLUTIONS / master, course / master)
    grade_class(course / master, subs, tmp_path / "out", progress=None)
    rows = list(csv.DictReader(open(tmp_path / "out" / "gradebook.csv")))
    auto = [r for r in rows if r["status"] != "needs manual grading"]
    manual = [r for r in rows if r["status"] == "needs manual grading"]
    assert auto and manual
    for r in auto:
        want = r["max_points"] if r["student"] == "solution" else "0"
        assert r["points"] == want, (r, (tmp_path / "out" / "feedback" / f"{r['student']}.txt").read_text())
    assert all(r["points"] == "0" and float(r["max_points"]) > 0 for r in manual)


@pytest.mark.slow
def test_real_nbgrader_generates_and_autogrades_the_masters(tmp_path):
    """nbgrader's own generate_assignment and autograde read these files unchanged."""
    if shutil.which("nbgrader", path=os.path.dirname(PY)) is None:
        pytest.skip("nbgrader is not installed next to this Python (pip install -r requirements.txt)")
    from nbgrader.api import Gradebook

    masters = ["01-ssp-rule.ipynb", "05-compression.ipynb"]
    (tmp_path / "source" / "ps1").mkdir(parents=True)
    for name in masters:
        shutil.copy(SOLUTIONS / name, tmp_path / "source" / "ps1" / name)
    (tmp_path / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.CourseDirectory.root = {str(tmp_path)!r}\nc.CourseDirectory.course_id = 'simlib'\n"
        "c.ExecutePreprocessor.timeout = 300\n")
    # nbgrader runs 'alembic' from PATH, and the kernels must import this checkout's simlib.
    env = {**os.environ, "PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    nbgrader = os.path.join(os.path.dirname(PY), "nbgrader")
    subprocess.run([nbgrader, "generate_assignment", "ps1"], cwd=tmp_path, env=env, check=True, capture_output=True)
    for name in masters:
        released = nbm.load(tmp_path / "release" / "ps1" / name)
        assert "BEGIN SOLUTION" not in json.dumps(released) and "HIDDEN TESTS" not in json.dumps(released)
        for student, source in (("alice", tmp_path / "source" / "ps1"), ("bob", tmp_path / "release" / "ps1")):
            (tmp_path / "submitted" / student / "ps1").mkdir(parents=True, exist_ok=True)
            shutil.copy(source / name, tmp_path / "submitted" / student / "ps1" / name)
    subprocess.run([nbgrader, "autograde", "ps1", "--create"], cwd=tmp_path, env=env, check=True, capture_output=True)
    auto_max = sum(p.points for name in masters for p in nbm.parts(nbm.load(SOLUTIONS / name)) if p.kind == "tests")
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        alice, bob = gb.find_submission("ps1", "alice"), gb.find_submission("ps1", "bob")
        assert alice.score == auto_max and bob.score == 0
        manual = [g for nb in alice.notebooks for g in nb.grades if g.needs_manual_grade]
        assert sorted(g.name for g in manual) == ["question", "question"]


def test_a_fork_bomb_is_blamed_on_its_own_cell_however_late_the_watcher_looks(monkeypatch):
    """A busy machine starves the watcher thread; the unit that left the processes is still the one stopped."""
    from simlib.grade import sandbox

    monkeypatch.setattr(sandbox.Child, "watch_every", 30.0)  # the watcher never looks during the run
    units = [sandbox.Unit("bomb", "import os, time\nfor _ in range(40):\n    if os.fork() == 0:\n"
                                  "        time.sleep(60)\n        os._exit(0)\n", "code"),
             sandbox.Unit("after", "x = 1", "code"),
             sandbox.Unit("check", "assert x == 1", "test")]
    report = sandbox.run_units(units, b"{}", Limits(cell_s=10, wall_s=60, max_procs=32))
    bomb, after, check = report.outcomes
    assert bomb.ok is False and "more than 32 processes" in bomb.error
    assert after.ok is True and check.ok is True
