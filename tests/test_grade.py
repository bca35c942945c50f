"""The grader: markup and student versions, hostile submissions in the sandbox, the gradebook, nbgrader."""
from __future__ import annotations

import contextlib
import csv
import ctypes
import io
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from simlib.grade import export, probe

from simlib.grade import cgroup as cgroups
from simlib.grade import notebook as nbm
from simlib.grade.child import syscall_filter
from simlib.grade.export import uncell
from simlib.grade.gradebook import Progress, check_hidden, clean, find_submissions, grade_class, shown
from simlib.grade.sandbox import UID_BASE, Limits
from simlib.grade.sandbox import bwrap_problem as sandbox_problem

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
                      "from simlib.protocol import may_read as _reference\n### END HIDDEN TESTS", grade_id="t1", grade=True,
              locked=True, points=2),
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
# Every attack is one submission in one grading run (per sandbox kind); each test asserts its own
# outcome and that the control student "good", graded in the same run, still gets full marks.
TOKEN = f"sg{uuid.uuid4().hex[:13]}"  # the name (comm) of every process a submission tries to leave behind


def _left_behind(indent: str) -> str:
    """Lines naming their process TOKEN, then sleeping two minutes (no program can be started in the sandbox)."""
    lines = (f"ctypes.CDLL(None).prctl(15, {TOKEN.encode()!r})", "time.sleep(120)", "os._exit(0)")
    return "".join(f"{indent}{line}\n" for line in lines)


F = "\ndef f():\n    return 1"  # part 1's correct answer, after the attack
PLANTED = "planted-grader-secret-4711"
KEY = b"simlib-grade-test-key"
FILTERED = {"keyring", "vsock"}  # refused by the sandbox's seccomp filter
FILTER_PROBLEM = ("" if syscall_filter() is not None and "Seccomp:" in Path("/proc/self/status").read_text() else
                  f"no seccomp filter here (machine {platform.machine()}, or a kernel without seccomp)")


def _frame_code(payload: str) -> str:
    """Code writing ``payload`` (bytes literal) as one frame into the sandbox's result channel."""
    return ("import json, os, struct, sys\nfd = json.loads(sys.argv[-1])['result_fd']\n"
            f"data = {payload}\nos.write(fd, struct.pack('>I', len(data)) + data)")


ATTACKS = {  # name: (code replacing part 1's answer, (t1, t2) points, text the feedback must contain)
    # escape
    "setsid_double_fork": ("import ctypes, os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                           + _left_behind(" " * 8) + "    os._exit(0)\nos.wait()" + F, (2, 3), None),
    "clone_parent": ("import ctypes, os, platform, signal, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     "nr = {'x86_64': 56, 'aarch64': 220}[platform.machine()]\n"
                     "if libc.syscall(nr, 0x8000 | signal.SIGCHLD, 0, 0, 0, 0) == 0:\n    os.setsid()\n"
                     + _left_behind(" " * 4) + F, (2, 3), None),
    "starts_a_python": ("import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'])" + F, (0, 3),
                        "PermissionError: [Errno 1] Operation not permitted"),
    "spawns_a_python": ("import multiprocessing\np = multiprocessing.get_context('spawn').Process(target=print)\n"
                        "p.start()\np.join()\nif p.exitcode:\n"
                        "    raise OSError(f'the spawned Python exited with {p.exitcode}')" + F,
                        (0, 3), "the spawned Python exited with 255"),  # its exec failed
    "starts_a_subinterpreter": ("import _xxsubinterpreters\n_xxsubinterpreters.create()" + F, (0, 3),
                                "RuntimeError: interpreter creation failed"),
    "daemon_thread_spins": ("import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()"
                            + F, (2, 3), None),
    "reads_master": ("secret = open(MASTER).read()" + F, (0, 3), "No such file or directory"),
    "reads_other_student": ("other = open(GOOD).read()" + F, (0, 3), "No such file or directory"),
    "writes_gradebook": ("open(GRADEBOOK, 'w').write('good,t1,0,2')" + F, (0, 3), "No such file or directory"),
    "reads_etc_shadow": ("open('/etc/shadow').read()" + F, (0, 3), "No such file or directory"),
    "reads_host_environ": ("import glob\nraise RuntimeError(' '.join(open(p, 'rb').read().decode('latin-1') for p in "
                           "glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ')))" + F, (0, 3), None),
    "lists_host_processes": ("import os\nraise RuntimeError(str(sorted(p for p in os.listdir('/proc') if p.isdigit())))",
                             (0, 3), "RuntimeError: ['1', '2'"),
    "writes_python_tree": ("import numpy, os\nopen(os.path.join(os.path.dirname(numpy.__file__), 'x.py'), 'w')" + F,
                           (0, 3), None),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)" + F, (0, 3),
                "network access is disabled"),
    "keyring": ("import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "nr = {'x86_64': 248, 'aarch64': 217}[platform.machine()]\n"
                "for ring in (-4, -5, -3):  # add_key to the user's, the user session and the session keyring\n"
                f"    if libc.syscall(nr, b'user', {KEY!r}, b'for the next one', 16, ctypes.c_int(ring)) < 0:\n"
                "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))" + F, (0, 3), "PermissionError"),
    "vsock": ("import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "nr = {'x86_64': 41, 'aarch64': 198}[platform.machine()]\n"
              "if libc.syscall(nr, 40, 1, 0) < 0:  # socket(AF_VSOCK, SOCK_STREAM, 0), past the interpreter's audit hook\n"
              "    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))" + F, (0, 3), "PermissionError"),
    "mknod_disk": ("import os, stat\nos.mknod('sda', stat.S_IFBLK | 0o600, os.makedev(8, 0))" + F, (0, 3), "PermissionError"),
    "kills_grader": ("import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass" + F,
                     (2, 3), None),
    "fills_disk": ("open('big', 'wb').write(b'x' * (200 * 2**20))" + F, (0, 3), "OSError"),
    "fills_dev_shm": ("open('/dev/shm/big', 'wb').write(b'x' * (200 * 2**20))" + F, (0, 3), "OSError"),
    "shm_segment": ("from multiprocessing import shared_memory\nfrom simlib.parallel import SharedArray\n"
                    "leak = shared_memory.SharedMemory(name='simlib-grade-test-leak', create=True, size=4096)\n"
                    "leak2 = SharedArray.zeros(1000)" + F, (2, 3), None),
    "plants_kernels": ("import os\nfor d in (os.environ['NUMBA_CACHE_DIR'], '/run/numba-cache'):\n    try:\n"
                       "        open(os.path.join(d, 'planted.nbi'), 'w').write('x')\n    except OSError:\n        pass" + F,
                       (2, 3), None),
    # crash
    "exits": ("import os\nos._exit(0)", (0, 3), "exited with status 0"),
    "sys_exit": ("import sys\nsys.exit(3)", (0, 3), "SystemExit: 3"),
    "segfault": ("import ctypes\nctypes.string_at(0)", (0, 3), "killed by signal 11"),
    "aborts": ("import os\nos.abort()", (0, 3), "killed by signal 6"),
    "recursion": ("def r(n):\n    return r(n + 1)\nr(0)", (0, 3), "RecursionError"),
    "closes_stdout": ("import os\nos.close(1)\nos.close(2)" + F, (2, 3), None),
    "dup2_over_stdin": ("import os\nos.dup2(os.open('/dev/zero', os.O_RDONLY), 0)" + F, (2, 3), None),
    "reads_stdin_for_tests": ("import os, threading\nstolen = []\nthreading.Thread(target=lambda: stolen.append(os.read(0, 1 << 20)),"
                              " daemon=True).start()" + F, (2, 3), None),
    "channel_empty_list": (_frame_code("b'[]'"), (0, 3), "wrote into the grader's result channel"),
    "channel_deep_nesting": (_frame_code("b'[' * 100000 + b']' * 100000"), (0, 3), "wrote into the grader's result channel"),
    "channel_huge_length": ("import json, os, sys\nos.write(json.loads(sys.argv[-1])['result_fd'], b'\\xff' * 8)",
                            (0, 3), "wrote into the grader's result channel"),
    # hang
    "loop": ("while True:\n    pass", (0, 3), "time limit of 4 s per cell"),
    "sleeps_uninterruptibly": ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)",
                               (0, 3), "time limit of 4 s per cell"),
    "memory": ("hog = bytearray(10 * 2**30)" + F, (0, 3), "MemoryError"),
    "fork_bomb": ("import os, time\nfor _ in range(100):\n    if os.fork() == 0:\n        os.setsid()\n"
                  "        time.sleep(60)\n        os._exit(0)" + F, (0, 3), "more than 32 processes"),
    "output_flood": ("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)" + F, (0, 3),
                     "printed more than 8 MB"),
    # leak (of hidden tests into feedback)
    "quotes_hidden_tests": ("def f():\n    raise ValueError(\"assert f() + 1 == 2, 'hidden f'\")", (0, 3),
                            "message withheld: it quotes the hidden tests"),
    "huge_message": ("raise ValueError('x' * 10**6)" + F, (0, 3), "ValueError: xxx"),
    "forges_feedback_lines": ("raise ValueError('\\n- t1: 2 / 2 (passed)\\n- t2: 3 / 3 (passed)')" + F, (0, 3), "ValueError"),
    # tampering and impersonation
    "wrong_answer": ("def f():\n    return 2", (0, 3), "f() should be 1"),
    "forges_results_ahead": (_frame_code("b''") + "\nfor k in range(40):\n    d = json.dumps({'seq': k, 'nonce': 'x', 'ok': True})"
                             ".encode()\n    os.write(fd, struct.pack('>I', len(d)) + d)\ndef f():\n    return 2",
                             (0, 3), "wrote into the grader's result channel"),
    "patches_assert_message": ("import builtins\nbuiltins.AssertionError = Exception\ndef f():\n    return 2", (0, 3), "f() should be 1"),
    # the library's reference answer, imported: graded, and flagged to the instructor (see test_...flagged)
    "imports_reference": ("import simlib.protocol as p\nfrom simlib.protocol import may_read" + F, (2, 3), None),
    "builds_the_reference_name": ("import importlib, operator\nname = 'simlib.' + 'protocol'\n"
                                  "ref = getattr(importlib.import_module(name), 'may_' + 'read')\n"
                                  "via = operator.attrgetter('may_' + 'read')(__import__(name, fromlist=['']))" + F,
                                  (2, 3), None),
}


def _tampered(master, kind):
    nb = with_answer1(master, "def f():\n    return 2")
    if kind == "edits_tests":
        nb["cells"][2]["source"] = "pass"
    elif kind == "deletes_tests":
        del nb["cells"][2]
    elif kind == "claims_test_id":
        nb["cells"][1]["metadata"]["nbgrader"].update(grade=True, grade_id="t1", points=2)
        del nb["cells"][2]
    elif kind == "inflates_points":
        nb["cells"][2]["metadata"]["nbgrader"]["points"] = 100
    return nb


TAMPERED = {"edits_tests": ((0, 3), "f() should be 1"), "deletes_tests": ((0, 3), "f() should be 1"),
            "claims_test_id": ((0, 3), "NameError"), "inflates_points": ((0, 3), "f() should be 1")}

MALFORMED = {  # file name: (bytes, reason)
    "garbage.ipynb": (b"{not json", "not a valid notebook"),
    "empty.ipynb": (b"", "not a valid notebook"),
    "latin1.ipynb": ("{\"cells\": []} é".encode("latin-1"), "not a valid notebook"),
    "deep.ipynb": (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    "deep_cells.ipynb": (b'{"cells": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested too deeply"),
    "cells_not_list.ipynb": (b'{"cells": 3}', "no list of cells"),
    "metadata_string.ipynb": (json.dumps({"cells": [{"cell_type": "code", "metadata": "x", "source": ""}]}).encode(),
                              "metadata or its nbgrader entry is not a dictionary"),
    "source_numbers.ipynb": (json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": [1, 2]}]}).encode(),
                             "source is neither a string nor a list of strings"),
    "nbgrader_list.ipynb": (json.dumps({"cells": [{"cell_type": "code", "metadata": {"nbgrader": [1]}, "source": ""}]}).encode(),
                            "metadata or its nbgrader entry is not a dictionary"),
    "grade_id_dict.ipynb": (json.dumps({"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"grade_id": {}}},
                                                   "source": ""}]}).encode(), "grade_id is not a string"),
    "too_big.ipynb": (b" " * (21 * 2**20), "larger than 20 MB"),
}


def _write_class(subs: Path, master: dict, master_path: Path, out: Path) -> dict[str, Any]:
    """Every hostile submission above into ``subs``; returns what the tests expect of each."""
    good = subs / "good.ipynb"
    good.write_text(nbm.dump(master))
    expect = {"good": ((2, 3), "Autograded: 5 / 5 points")}
    for name, (code, points, reason) in ATTACKS.items():
        code = (code.replace("MASTER", repr(str(master_path))).replace("GOOD", repr(str(good)))
                .replace("GRADEBOOK", repr(str(out / "gradebook.csv"))))
        (subs / f"{name}.ipynb").write_text(nbm.dump(with_answer1(master, code)))
        expect[name] = (points, reason)
    for name, outcome in TAMPERED.items():
        (subs / f"{name}.ipynb").write_text(nbm.dump(_tampered(master, name)))
        expect[name] = outcome
    flood = with_answer1(master, "def f():\n    return 1")
    flood["cells"].insert(1, _cell("code", "import sys\nsys.stdout.write('y' * (9 * 2**20))"))
    for k in range(3):  # 6 MB per cell, under the cap of 8 MB per cell, 18 MB in all
        flood["cells"].insert(0, _cell("code", "import sys\nsys.stdout.write('z' * (6 * 2**20))"))
    (subs / "flood_then_correct.ipynb").write_text(nbm.dump(flood))
    expect["flood_then_correct"] = ((2, 3), "printed more than 8 MB")
    many = with_answer1(master, "def f():\n    return 1")
    many["cells"] += [_cell("code", f"raise ValueError('{k}' * 500)") for k in range(300)]
    (subs / "many_errors.ipynb").write_text(nbm.dump(many))
    expect["many_errors"] = ((2, 3), "... and 280 more")
    for name, (data, reason) in MALFORMED.items():
        (subs / name).write_bytes(data)
        expect[name.removesuffix(".ipynb")] = ((0, 0), reason)
    # files and folders that are not what they seem
    os.mkfifo(subs / "fifo.ipynb")
    expect["fifo"] = ((0, 0), "is a FIFO")
    (subs / "link_to_master.ipynb").symlink_to(master_path)
    expect["link_to_master"] = ((0, 0), "is a symbolic link")
    (subs / "link_to_good.ipynb").symlink_to(good)
    expect["link_to_good"] = ((0, 0), "is a symbolic link")
    (subs / "linked_folder").symlink_to(master_path.parent, target_is_directory=True)
    expect["linked_folder"] = ((0, 0), "is a symbolic link")
    for name, make in (("fifo_in_folder", lambda p: os.mkfifo(p)), ("link_in_folder", lambda p: p.symlink_to(master_path))):
        (subs / name / "ps1").mkdir(parents=True)
        make(subs / name / "ps1" / "07-toy.ipynb")
        expect[name] = ((0, 0), "FIFO" if "fifo" in name else "symbolic link")
    (subs / "no_notebook").mkdir()
    (subs / "no_notebook" / "notes.txt").write_text("hello")
    expect["no_notebook"] = ((0, 0), "no notebook found")
    long = "L" * 255
    (subs / long / "ps1").mkdir(parents=True)
    (subs / long / "ps1" / "07-toy.ipynb").write_text(nbm.dump(master))
    expect[long] = ((2, 3), "Autograded: 5 / 5 points")
    # names that collide, or look alike
    for name in ("José", "Josи", "a b", "a_b", "new\nline"):
        (subs / f"{name}.ipynb").write_text(nbm.dump(master))
        expect[name] = ((2, 3), "Autograded: 5 / 5 points")
    (subs / "alice.ipynb").write_text(nbm.dump(master))
    (subs / "alice" / "ps1").mkdir(parents=True)
    (subs / "alice" / "ps1" / "07-toy.ipynb").write_text(nbm.dump(master))
    (subs / "Bob.ipynb").write_text(nbm.dump(master))
    (subs / "bob.ipynb").write_text(nbm.dump(master))
    (subs / "Zo\u00eb.ipynb").write_text(nbm.dump(master))
    (subs / "Zoe\u0308.ipynb").write_text(nbm.dump(master))
    (subs / "dave.ipynb").write_text(nbm.dump(master))
    (subs / "\uff44\uff41\uff56\uff45.ipynb").write_text(nbm.dump(master))  # fullwidth
    for student in CLASHES:  # graded apart under their entries' names; the instructor gets a note
        expect[student] = ((2, 3), "Autograded: 5 / 5 points")
    # names that are not UTF-8, or that a spreadsheet would run as a formula: graded like any other
    for raw in ODD_NAMES:
        (subs / os.fsdecode(raw + b".ipynb")).write_text(nbm.dump(master))
        expect[shown(os.fsdecode(raw))] = ((2, 3), "Autograded: 5 / 5 points")
    (subs / ".hidden.ipynb").write_text(nbm.dump(master))  # a note, no row
    (subs / "work.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    expect["work"] = ((0, 0), "work.zip is an archive, not a notebook")
    (subs / "two" / "ps1").mkdir(parents=True)  # two notebooks: the assignment's is graded, the other noted
    (subs / "two" / "ps1" / "07-toy.ipynb").write_text(nbm.dump(master))
    (subs / "two" / "draft.ipynb").write_text("{}")
    expect["two"] = ((2, 3), "Autograded: 5 / 5 points")
    for k in range(10_001):  # folders count against the guard as files do
        (subs / "many_folders" / str(k)).mkdir(parents=True)
    (subs / "many_folders" / "07-toy.ipynb").write_text(nbm.dump(master))
    expect["many_folders"] = ((0, 0), "more than 10000 files and folders")
    (subs / "README.txt").write_text("not a submission")
    return expect


CLASHES = ("alice.ipynb", "alice/", "Bob.ipynb", "bob.ipynb", "Zo\u00eb.ipynb", "Zoe\u0308.ipynb", "dave.ipynb",
           "\uff44\uff41\uff56\uff45.ipynb")
ODD_NAMES = (b"nina\xff", b"=1+2", b"@SUM(A1)", b"+1", b"-2", b"\tx")


def _processes_with(token: str) -> list[int]:
    """Live processes on this machine named ``token`` (only this test's submissions name theirs so). A zombie keeps
    its name until whoever inherited it reaps it, but it has ended: it holds no pipe, no memory, no CPU."""
    out = []
    for name in os.listdir("/proc"):
        try:
            stat_text = Path(f"/proc/{name}/stat").read_text()
            if Path(f"/proc/{name}/comm").read_bytes().strip() == token.encode() \
                    and stat_text[stat_text.rfind(")") + 2:].split()[0] != "Z":
                out.append(int(name))
        except (OSError, IndexError):
            pass
    return out


def _descendants(root: int) -> set[int]:
    """Processes descending from ``root`` now."""
    parent = {}
    for name in os.listdir("/proc"):
        try:
            stat_text = Path(f"/proc/{name}/stat").read_text()
            parent[int(name)] = int(stat_text[stat_text.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _zombie_children() -> set[int]:
    """This process's children that have died and not been reaped."""
    out = set()
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{tid}/children") as f:
            for pid in f.read().split():
                try:
                    if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                        out.add(int(pid))
                except OSError:
                    pass
    return out


def _key_users() -> dict[int, int] | None:
    """uid -> the keys it holds in the kernel (/proc/key-users), for the uids this process gives its sandboxes."""
    first = UID_BASE + (os.getpid() % 4096) * 256
    try:
        rows = [line.split() for line in Path("/proc/key-users").read_text().splitlines()]
    except OSError:
        return None
    return {int(r[0].rstrip(":")): int(r[2].split("/")[0]) for r in rows if first <= int(r[0].rstrip(":")) < first + 256}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in sorted(folder.rglob("*")) if not stat.S_ISFIFO(os.lstat(p).st_mode)}


def _rows(out: Path) -> dict[tuple[str, str], tuple[float, str]]:
    with open(out / "gradebook.csv", newline="", encoding="utf-8") as f:
        return {(uncell(r["student"]), r["part"]): (float(r["points"]), r["status"]) for r in csv.DictReader(f)}


def _feedback(out: Path) -> dict[str, str]:
    """student -> feedback text, read from the files' first lines (names may be hashed on disk)."""
    texts = {}
    for path in (out / "feedback").iterdir():
        text = path.read_text(encoding="utf-8")
        texts[text.splitlines()[0].split(": feedback for ", 1)[1]] = text
    return texts


@contextlib.contextmanager
def _watching_cgroups():
    """Record every submission cgroup the grader makes: its counters and what is left in it after the
    grader's teardown kill, and samples of its pids.current taken every 2 ms from outside."""
    seen: dict[str, Any] = {"removed": [], "samples": {}}
    found = cgroups.layout()[0]
    if found is None:
        yield seen
        return
    real_remove, stop = cgroups.Cgroup.remove, threading.Event()

    def remove(group):
        stats = group.stats()
        group.kill()  # what Cgroup.remove does first; then look inside before the folders go
        left = group.members()
        real_remove(group)
        seen["removed"].append({"stats": stats, "left": left, "dirs": list(group.dirs.values()),
                                "exists": [d.exists() for d in group.dirs.values()]})

    def sample():
        parent = found.parents.get("pids", found.parents.get("unified"))
        while not stop.wait(0.002):
            for folder in parent.glob(f"{cgroups.PREFIX}{os.getpid()}-*"):
                try:
                    n = int((folder / "pids.current").read_text())
                except (OSError, ValueError):
                    continue
                seen["samples"][folder.name] = max(seen["samples"].get(folder.name, 0), n)

    sampler = threading.Thread(target=sample, daemon=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cgroups.Cgroup, "remove", remove)
        sampler.start()
        try:
            yield seen
        finally:
            stop.set()
            sampler.join()


def _leftover_cgroups() -> list[Path]:
    """Cgroup folders this test process's grader made and did not remove."""
    found = cgroups.layout()[0]
    parents = found.parents.values() if found is not None else []
    return [p for parent in parents for p in parent.glob(f"{cgroups.PREFIX}{os.getpid()}-*")]


HOSTILE_LIMITS = Limits(cell_s=4, wall_s=60, output_mb=8, disk_mb=64)


def _grade_hostile(tmp_path_factory, sandbox, write=None, limits=HOSTILE_LIMITS, master=None):
    base = tmp_path_factory.mktemp(f"course-{sandbox}")
    master = master or toy_master()
    master_path = base / "solutions" / "07-toy.ipynb"
    master_path.parent.mkdir()
    master_path.write_text(nbm.dump(master))
    subs, out, scratch = base / "submitted", base / "grades", base / "tmp"
    subs.mkdir()
    scratch.mkdir()
    expect = (write or _write_class)(subs, master, master_path, out)
    if sandbox == "watcher" and cgroups.problem() and "clone_parent" in expect:
        # a process leaving the tree with CLONE_PARENT is the watcher's known gap, unless a cgroup holds it
        (subs / "clone_parent.ipynb").unlink()
        del expect["clone_parent"]
    before = _snapshot(subs), master_path.read_bytes(), set(os.listdir("/dev/shm"))
    zombies = _zombie_children()
    keys = _key_users()
    log = io.StringIO()
    old_tmp, os.environ["SIMLIB_TEST_PLANTED"] = tempfile.tempdir, PLANTED
    tempfile.tempdir = str(scratch)  # the grader's scratch folders, to check that none is left
    try:
        with _watching_cgroups() as seen:
            t0 = time.monotonic()
            grade_class(master_path, subs, out, limits, progress=lambda n: Progress(n, log), sandbox=sandbox, log=log)
            seconds = time.monotonic() - t0
    finally:
        tempfile.tempdir = old_tmp
        del os.environ["SIMLIB_TEST_PLANTED"]
    time.sleep(0.2)  # a survivor, if any, would have exec'd by now
    return {"base": base, "master": master_path, "subs": subs, "out": out, "limits": limits, "log": log.getvalue(),
            "expect": expect, "seconds": seconds, "sandbox": sandbox, "scratch": scratch,
            "changed": (before[0] != _snapshot(subs), before[1] != master_path.read_bytes()),
            "new_shm": set(os.listdir("/dev/shm")) - before[2], "survivors": _processes_with(TOKEN),
            "children": _descendants(os.getpid()), "cgroups": seen, "leftover_cgroups": _leftover_cgroups(),
            "zombies": _zombie_children() - zombies,
            "new_keys": None if keys is None else {u: n for u, n in _key_users().items() if n > keys.get(u, 0)}}


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    if sandbox_problem():
        pytest.skip(f"bubblewrap cannot run here: {sandbox_problem()}")
    return _grade_hostile(tmp_path_factory, "bwrap")


@pytest.fixture(scope="module")
def hostile_class_watcher(tmp_path_factory):
    return _grade_hostile(tmp_path_factory, "watcher")


def _check_student(graded, student):
    points, reason = graded["expect"][student]
    rows, texts = _rows(graded["out"]), _feedback(graded["out"])
    text = texts[clean(student, [])]
    got = (rows[(student, "t1")][0], rows[(student, "t2")][0])
    assert all(g in (want if isinstance(want, tuple) else (want,)) for g, want in zip(got, points)), text
    assert rows[(student, "q")] == (0, "needs manual grading")
    if reason is not None:
        assert reason in text, text
    if points == (0, 0):  # refused: one line in the gradebook, the same in the feedback
        status = rows[(student, "t1")][1]
        assert status.startswith("not graded: ") and "\n" not in status and reason in status
        assert status.removeprefix("not graded: ") in text
    assert rows[("good", "t1")][0] == 2 and rows[("good", "t2")][0] == 3
    assert "Autograded: 5 / 5 points; 1 more points are graded by hand." in texts["good"]


def _all_students():
    return sorted(set(ATTACKS) | set(TAMPERED) | {n.removesuffix(".ipynb") for n in MALFORMED} | {
        "flood_then_correct", "many_errors", "fifo", "link_to_master", "link_to_good", "linked_folder",
        "fifo_in_folder", "link_in_folder", "no_notebook", "L" * 255, "José", "Josи", "a b", "a_b", "new\nline",
        "work", "two", "many_folders", *CLASHES, *(shown(os.fsdecode(n)) for n in ODD_NAMES)})


@pytest.mark.parametrize("student", _all_students(), ids=lambda s: s[:30].encode("ascii", "backslashreplace").decode())
def test_each_hostile_submission_loses_only_what_it_breaks(hostile_class, student):
    if student in FILTERED and FILTER_PROBLEM:
        pytest.skip(FILTER_PROBLEM)
    _check_student(hostile_class, student)


WATCHER_GROUP = ["setsid_double_fork", "clone_parent", "reads_master", "writes_gradebook", "reads_host_environ", "network", "exits",
                 "segfault", "channel_empty_list", "channel_deep_nesting", "loop", "memory", "fork_bomb", "output_flood",
                 "quotes_hidden_tests", "forges_results_ahead", "garbage", "deep", "metadata_string", "fifo",
                 "link_to_master", "José", "Josи", "alice/", "flood_then_correct"]
WATCHER_REASONS = {"reads_master": "PermissionError", "writes_gradebook": "PermissionError", "reads_host_environ": None}


@pytest.mark.slow
@pytest.mark.parametrize("student", WATCHER_GROUP)
def test_the_fallback_watcher_holds_too(hostile_class_watcher, student):
    graded = hostile_class_watcher
    if student not in graded["expect"]:
        pytest.skip(f"without a cgroup ({cgroups.problem()}), CLONE_PARENT escapes the watcher (the README says so)")
    if student in WATCHER_REASONS:
        graded = {**graded, "expect": {**graded["expect"], student: (graded["expect"][student][0], WATCHER_REASONS[student])}}
    _check_student(graded, student)


def test_the_class_is_large_and_graded_quickly(hostile_class):
    assert len(hostile_class["expect"]) >= 70
    assert len(_rows(hostile_class["out"])) == 3 * len(hostile_class["expect"])
    assert len(list((hostile_class["out"] / "feedback").iterdir())) == len(hostile_class["expect"])
    assert "ignored 'README.txt'" in hostile_class["log"]
    assert hostile_class["seconds"] < 120


@pytest.mark.parametrize("graded", ["hostile_class", pytest.param("hostile_class_watcher", marks=pytest.mark.slow)])
def test_nothing_is_left_behind(graded, request):
    graded = request.getfixturevalue(graded)
    assert graded["survivors"] == []  # setsid + double fork, clone(CLONE_PARENT), all carrying TOKEN
    assert not [pid for pid in graded["children"] if b"simlib.grade.child" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert "simlib-grade-test-leak" not in graded["new_shm"] and "big" not in graded["new_shm"]
    assert list(graded["scratch"].iterdir()) == []
    assert graded["changed"] == (False, False)  # the submissions and the master are as they were
    assert [p.name for p in graded["out"].iterdir()] and not list(graded["out"].rglob("planted*"))
    assert sorted(p.name for p in graded["out"].iterdir()) == [".cache", ".numba-cache", "feedback", "gradebook-wide.csv",
                                                               "gradebook.csv", "manual.csv", "notes.txt"]
    assert graded["leftover_cgroups"] == []
    assert [r for r in graded["cgroups"]["removed"] if r["left"] or any(r["exists"])] == []
    # a clone(CLONE_PARENT) child is the grader's own: killed, it must be reaped too (a zombie of the grader
    # failed the next test module's no-children check in full runs)
    assert graded["zombies"] == set()


def test_no_kernel_key_outlives_a_submission(hostile_class):
    """Keyrings are not namespaced: a key added in the sandbox stayed in the kernel under its uid, for whichever
    submission gets that uid next (the "keyring" student tries each keyring)."""
    if FILTER_PROBLEM or hostile_class["new_keys"] is None:
        pytest.skip(FILTER_PROBLEM or "no /proc/key-users: a kernel without keyrings")
    assert hostile_class["new_keys"] == {}
    libc = ctypes.CDLL(None, use_errno=True)
    search = {"x86_64": 250, "aarch64": 219}[platform.machine()]  # keyctl(KEYCTL_SEARCH, ring, "user", KEY, 0)
    assert [libc.syscall(search, 10, ctypes.c_int(ring), b"user", KEY, 0) for ring in (-3, -4, -5)] == [-1] * 3


def test_the_syscall_filter_refuses_what_it_names_and_nothing_else():
    """In a forked process under the filter: EPERM for socket(AF_VSOCK) (high bits of the family ignored, as the
    kernel does), io_uring_setup, add_key, execve, execveat and an x32 call; AF_UNIX sockets and files as before."""
    if FILTER_PROBLEM:
        pytest.skip(FILTER_PROBLEM)
    from simlib.grade.child import seccomp

    nr = {"x86_64": (41, 248, 59, 322), "aarch64": (198, 217, 221, 281)}[platform.machine()]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            got = [seccomp(syscall_filter())]
            for call in [(nr[0], ctypes.c_long(40 | 1 << 32), 1, 0), (425, 8, None),
                         (nr[1], b"user", KEY, b"x", 1, ctypes.c_int(-3)), (0x40000000 | 41, 40, 1, 0),
                         (nr[2], b"/no/such/program", None, None), (nr[3], -100, b"/no/such/program", None, None, 0)]:
                got.append((libc.syscall(*call), ctypes.get_errno()))
            got.append(libc.syscall(nr[0], 1, 1, 0) >= 0 and os.path.exists(os.devnull))
            os.write(w, json.dumps(got).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = json.loads(os.read(r, 4096) or b"null")
    os.close(r)
    os.waitpid(pid, 0)
    assert got == [True, [-1, 1], [-1, 1], [-1, 1], [-1, 1], [-1, 1], [-1, 1], True]  # EPERM, not ENOENT, for exec


def test_feedback_is_bounded_and_never_shows_hidden_tests_or_the_host(hostile_class):
    texts = _feedback(hostile_class["out"])
    for student, text in texts.items():
        assert "SECRET-HIDDEN-CODE" not in text and "g() * 2" not in text and "f() + 1" not in text, student
        assert PLANTED not in text, student
        assert len(text) < 9000, student
    for student in ("reads_host_environ", "lists_host_processes"):  # nothing of the host's processes
        assert "pytest" not in texts[student] and str(os.getpid()) not in texts[student]
    assert len(texts["huge_message"]) < 2000
    assert not [line for line in texts["forges_feedback_lines"].splitlines() if line.startswith("- t1: 2")]


def test_collisions_are_kept_apart(hostile_class):
    names = sorted(p.name for p in (hostile_class["out"] / "feedback").iterdir())
    assert len(names) == len(set(n.casefold() for n in names))
    assert all(len(n.encode()) <= 120 for n in names)
    assert "good.txt" in names and "a_b.txt" in names
    texts = _feedback(hostile_class["out"])
    assert "feedback for José" in texts["José"] and "feedback for Josи" in texts["Josи"]
    notes = (hostile_class["out"] / "notes.txt").read_text(encoding="utf-8")
    for group in ("alice/, alice.ipynb", "Bob.ipynb, bob.ipynb", "dave.ipynb, \uff44\uff41\uff56\uff45.ipynb"):
        assert notes.count(f"{group} name the same student up to case, width or accents") == 1, notes
        assert hostile_class["log"].count(f"{group} name the same student up to case, width or accents") == 1
    assert "alice.ipynb" not in texts["alice/"] and "dave" not in texts["\uff44\uff41\uff56\uff45.ipynb"]  # not told the others


def test_every_entry_is_in_the_gradebook_or_the_notes_and_no_cell_is_a_formula(hostile_class):
    out, subs = hostile_class["out"], hostile_class["subs"]
    with open(out / "gradebook-wide.csv", newline="", encoding="utf-8") as f:
        wide = list(csv.reader(f))
    with open(out / "gradebook.csv", newline="", encoding="utf-8") as f:
        long = list(csv.reader(f))
    assert wide[0] == ["id", "name", "total", "t1", "t2", "q"] and len(wide) == 1 + len(hostile_class["expect"])
    cells = [c for table in (wide, long) for row in table for c in row]
    assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))]
    assert {"'=1+2", "'@SUM(A1)", "'+1", "'-2", "'\tx", "nina\\xff"} <= {row[0] for row in wide}
    notes = (out / "notes.txt").read_text(encoding="utf-8")
    entries = {uncell(row[1]) for row in wide[1:]}
    for raw in os.listdir(os.fsencode(subs)):
        name = shown(os.fsdecode(raw))
        assert name in entries or name + "/" in entries or f"ignored {name!r}" in notes, name
    assert "ignored '.hidden.ipynb': a hidden entry" in notes
    assert "two/: graded ps1/07-toy.ipynb; not graded: draft.ipynb" in notes


def test_a_submission_using_the_reference_answer_is_flagged_with_its_line(hostile_class):
    notes = (hostile_class["out"] / "notes.txt").read_text(encoding="utf-8")
    flagged = [line for line in notes.splitlines() if ": flagged: " in line]
    uses = "(uses simlib.protocol.may_read, the library's reference answer)"
    watch = "(replaces or removes the grader's call watch, sys.setprofile: what its code ran is not known)"
    # ctypes in a process forked off: the watch counts as removed, noted when that detached process gets to run
    # before the grader's last reply (beside two busy loops, a fresh-clone suite run saw neither note)
    detached = {f"clone_parent: flagged: the submission's code {watch}",
                f"setsid_double_fork: flagged: the submission's code {watch}"}
    assert [line for line in flagged if line not in detached] == [  # the literal import, and the names built at
        # run time (noted in the sandbox as they are read)
        f"builds_the_reference_name: flagged: a1 line 3: ref = getattr(importlib.import_module(name), 'may_' + 'read') {uses}",
        "builds_the_reference_name: flagged: a1 line 4: via = operator.attrgetter('may_' + 'read')(__import__(name, "
        f"fromlist=[''])) {uses}",
        f"imports_reference: flagged: a1 line 2: from simlib.protocol import may_read {uses}"]
    assert _rows(hostile_class["out"])[("imports_reference", "t1")] == (2, "passed; flagged (notes.txt)")
    assert _rows(hostile_class["out"])[("builds_the_reference_name", "t1")] == (2, "passed; flagged (notes.txt)")
    assert _rows(hostile_class["out"])[("good", "t1")] == (2, "passed")
    assert "flag: imports_reference: a1 line 2" in hostile_class["log"]


def test_regrading_is_cached_and_gives_the_same_gradebook(hostile_class):
    out = hostile_class["out"]
    first = (out / "gradebook.csv").read_bytes()
    log = io.StringIO()
    t0 = time.monotonic()
    grade_class(hostile_class["master"], hostile_class["subs"], out, hostile_class["limits"],
                progress=lambda n: Progress(n, log), log=log)
    assert time.monotonic() - t0 < 20
    assert (out / "gradebook.csv").read_bytes() == first
    graded = [s for s, (points, _) in hostile_class["expect"].items() if points != (0, 0)]
    assert log.getvalue().count("(cached)") >= len(graded)


# heavy: 20 s of grading the class again (the suite ran 907 s against its 15-minute budget); the default run keeps
# the cached regrade, which must give the same gradebook too.
@pytest.mark.heavy
def test_grading_again_from_scratch_one_at_a_time_gives_the_same_gradebook(hostile_class, tmp_path):
    grade_class(hostile_class["master"], hostile_class["subs"], tmp_path / "again", hostile_class["limits"],
                progress=None, jobs=1, log=io.StringIO())
    assert (tmp_path / "again" / "gradebook.csv").read_bytes() == (hostile_class["out"] / "gradebook.csv").read_bytes()


def test_a_late_student_is_graded_alone(hostile_class):
    subs, out = hostile_class["subs"], hostile_class["out"]
    late = subs / "late.ipynb"
    late.write_text(hostile_class["master"].read_text() + "\n")  # new bytes: not in the cache
    log = io.StringIO()
    try:
        grade_class(hostile_class["master"], subs, out, hostile_class["limits"], progress=lambda n: Progress(n, log),
                    log=log)
    finally:
        late.unlink()
    assert "late 5/5\n" in log.getvalue()
    assert "late 5/5 (cached)" not in log.getvalue()


def test_hidden_tests_inside_a_readable_tree_are_refused(tmp_path):
    master = ROOT / "simlib" / "grade" / "07-toy.ipynb"  # inside the package the sandbox may read
    with pytest.raises(ValueError, match="which submissions may read"):
        check_hidden(master, tmp_path / "out", tmp_path)


# -- hidden checks outside the student's interpreter (simlib.grade.probe) ---------------------------
def probe_master():
    """The toy master, its part 1 (f(x) = 2x + 1) checked by calls on inputs drawn per grading folder."""
    master = toy_master("def f(x):\n    return 2 * x + 1")
    master["cells"][2]["source"] = (
        "assert f(0) == 1, 'f(0) should be 1'\n### BEGIN HIDDEN TESTS\nassert f(7) == 15, 'hidden f: PROBED-PART-SECRET'\n"
        "def _probes(rng):\n    return [{'call': 'f', 'args': [int(x)]} for x in rng.integers(10**6, 10**7, 20)] + [\n"
        "        {'call': 'np.asarray', 'args': [[{'call': 'f', 'args': [0.25]}]]}]\n### END HIDDEN TESTS")
    return master


SCAN = ("import base64, gc, marshal, types\nneedle = 'PROBED' + '-PART-SECRET'\n"
        "def consts(c):\n    for k in c.co_consts:\n        yield from consts(k) if isinstance(k, types.CodeType) else [k]\n"
        "codes = [o for o in gc.get_objects() if isinstance(o, types.CodeType)]\n"
        "codes += [marshal.loads(base64.b64decode(o['code'])) for o in gc.get_objects() if isinstance(o, dict) and "
        "isinstance(o.get('code'), str)]\n"
        "found = [k for c in codes for k in consts(c) if isinstance(k, str) and needle in k]\n"
        "raise RuntimeError('hidden: ' + (base64.b64encode(repr(found).encode()).decode() if found else 'none found'))")
PROBE_CHEATS = {  # name: (code replacing part 1's answer, (t1, t2) points, text the feedback must contain)
    "good": ("def f(x):\n    return 2 * x + 1", (2, 3), "Autograded: 5 / 5 points"),
    "right_on_the_visible_inputs_only": ("def f(x):\n    return 2 * x + (x < 5 * 10**6)", (0, 3),
                                         "differs from the master's on inputs drawn for this grading"),
    "replaces_exec": ("import builtins\nbuiltins.exec = lambda *a, **k: None\ndef f(x):\n    return 1", (0, 3),
                      "differs from the master's"),
    "patches_the_reply": ("import simlib.grade.probe as p\np.answer = lambda *a: {'value': 1}\ndef f(x):\n    return 1",
                          (0, 3), "differs from the master's"),
    "forges_every_frame_ok": ("import json, os, struct\nreal = os.write\ndef fake(fd, data):\n    try:\n"
                              "        d = json.loads(data[4:])\n        d.update(ok=True, error='', values=[{'value': 1}] * 21)\n"
                              "        data = json.dumps(d).encode()\n        data = struct.pack('>I', len(data)) + data\n"
                              "    except Exception:\n        pass\n    return real(fd, data)\nos.write = fake\n"
                              "def f(x):\n    return 1", (0, 3), "differs from the master's"),
    "smuggles_in_a_class_name": ("def f(x):\n    if x > 100:\n        raise type('LEAK' + 'Z' * 40, (Exception,), {})()\n"
                                 "    return 2 * x + 1", (0, 3), "raised an exception"),
    "returns_an_object": ("def f(x):\n    return 2 * x + 1 if x < 100 else object()", (0, 3), "raised TypeError"),
    "returns_too_much": ("def f(x):\n    return 2 * x + 1 if x < 100 else [0] * 10**6", (0, 3), "more than 100000 items"),
    "returns_over_a_megabyte": ("def f(x):\n    return 2 * x + 1 if x < 100 else 'x' * 2**20", (0, 3), "larger than 1 MB"),
    "looks_for_the_hidden_tests": ("def f(x):\n    return 2 * x + 1\n" + SCAN, (2, 3), "hidden: none found"),
    "sends_the_inputs_in_an_error": ("import json, sys\nch = sys.modules['simlib.grade.child']\ndef named(calls, ns):\n"
                                     "    raise ValueError('L1:' + json.dumps(calls))\nch.named = named\n"
                                     "def f(x):\n    return 2 * x + 1", (0, 3), "the sandbox did not answer the calls (it raised "
                                     "ValueError)"),
    "sends_the_inputs_encoded": ("import base64, json, sys, zlib\nimport simlib.grade.probe as p\ndef leak(call, ns, kept):\n"
                                 "    f = sys._getframe(1)\n    while 'calls' not in f.f_locals:\n        f = f.f_back\n"
                                 "    raise SystemExit('L2:' + base64.b85encode(zlib.compress(json.dumps(f.f_locals['calls'])"
                                 ".encode())).decode())\np.answer = leak\ndef f(x):\n    return 2 * x + 1", (0, 3),
                                 "the sandbox did not answer the calls (it raised SystemExit)"),
}


def _write_probe_class(subs: Path, master: dict, master_path: Path, out: Path) -> dict[str, Any]:
    for name, (code, _, _) in PROBE_CHEATS.items():
        (subs / f"{name}.ipynb").write_text(nbm.dump(with_answer1(master, code)))
    (subs / "blank.ipynb").write_text(nbm.dump(nbm.student_version(master, 1)))
    return {name: (points, reason) for name, (_, points, reason) in PROBE_CHEATS.items()} | {
        "blank": ((0, 0), "raised NameError")}


@pytest.fixture(scope="module")
def probe_class(tmp_path_factory):
    if sandbox_problem():
        pytest.skip(f"bubblewrap cannot run here: {sandbox_problem()}")
    return _grade_hostile(tmp_path_factory, "bwrap", _write_probe_class, master=probe_master())


@pytest.mark.parametrize("student", sorted(PROBE_CHEATS))
def test_a_probed_part_is_scored_on_values_outside_the_sandbox(probe_class, student):
    _check_student(probe_class, student)


def test_the_blank_version_scores_zero_on_a_probed_part(probe_class):
    rows = _rows(probe_class["out"])
    assert rows[("blank", "t1")][0] == 0 and rows[("blank", "t2")][0] == 0
    assert "call 1 of 21 (f) raised NameError" in _feedback(probe_class["out"])["blank"]


def test_no_master_value_and_no_hidden_test_of_a_probed_part_reaches_feedback(probe_class):
    out = probe_class["out"]
    leaked = _feedback(out)["sends_the_inputs_in_an_error"]  # the drawn inputs have 7 digits; the message <= 80 chars
    assert not re.search(r"\d{7}", leaked) and "L1:" not in leaked, leaked
    assert "L2:" not in _feedback(out)["sends_the_inputs_encoded"]  # compressed and encoded: no digit shows
    master = json.loads(next(out.glob(".cache/master-*.passed")).read_text())
    values = [r["value"] for r in master["probes"]["t1: hidden tests"]]
    assert len(values) == 21 and values[-1] == [1.5] and all(2 * 10**6 < v < 2 * 10**7 for v in values[:-1])
    for student, text in _feedback(out).items():
        assert not [v for v in values[:-1] if str(v) in text], student
        assert "PROBED-PART" not in text and "LEAKZ" not in text and "_probes" not in text, student
    seed = (out / ".cache" / "probe-seed").read_text()
    assert not [p for p in probe_class["subs"].rglob("*") if seed in p.read_text(errors="replace")]


# -- the library's reference, reached at run time --------------------------------------------------
# Part 2 of this master is the SSP read rule, g(clock, completed, bound), whose answer the library holds
# (simlib.protocol.may_read). Each submission reaches it by a name or a path built at run time; the grader must
# flag where (the probe values alone cannot tell: they are right).
REF = "(vars(sys.modules['simlib.' + 'protocol'])['may' + '_read'])"
REACHES = {  # name: (part 2's answer, a fragment the flag must hold)
    "vars_module": (f"import sys, simlib.protocol\ng = {REF}", "the name 'g' the grader calls"),
    "globals_dict": ("import simlib.protocol as p\nglobals()['g'] = p.__dict__['may' + '_read']",
                     "the name 'g' the grader calls"),
    "dunder_import": ("m = __import__('simlib.' + 'protocol', fromlist=['x'])\ndef g(c, d, s):\n"
                      "    return vars(m)['may' + '_read'](c, d, s)", "a2 line 3: return vars(m)['may' + '_read'](c, d, s)"),
    "sys_modules_dict": ("import importlib, sys\nimportlib.import_module('simlib.' + 'protocol')\n"
                         "ref = sys.modules['simlib.' + 'protocol'].__dict__.get('may' + '_read')\n"
                         "def g(c, d, s):\n    return ref(c, d, s)", "a2 line 5: return ref(c, d, s)"),
    "garbage_collector": ("import gc, types\nref = next(o for o in gc.get_objects() if isinstance(o, types.FunctionType) "
                          "and o.__name__ == 'may' + '_read' and o.__module__ == 'simlib.' + 'protocol')\n"
                          "def g(c, d, s):\n    return ref(c, d, s)", "a2 line 4: return ref(c, d, s)"),
    "through_the_library": ("import math\nfrom simlib.protocol import Clocks\ndef g(c, d, s):\n"
                            "    k = Clocks(1, 'async' if s == math.inf else 'bsp' if s == 0 else f'ssp:{s}')\n"
                            "    k.completed = d\n    return getattr(k, 'may_' + 'read')(c)",
                            "a2 line 6: return getattr(k, 'may_' + 'read')(c)"),
    "clones_its_code": (f"import sys, types, simlib.protocol\ng = types.FunctionType({REF}.__code__, {{}})",
                        "(uses simlib.protocol.may_read"),
    "copies_its_source": (f"import inspect, sys, simlib.protocol\nexec(inspect.getsource({REF}).replace(' -> bool', '')"
                          ".replace(': int', '').replace(': float', '').replace('may' + '_read', 'g'))",
                          "code named <string> line 1"),
    "removes_the_watch": (f"import sys, simlib.protocol\nref = {REF}\ndef g(c, d, s):\n    sys.setprofile(None)\n"
                          "    return ref(c, d, s)", "a2 line 4: sys.setprofile(None) (replaces or removes the grader's call watch"),
    "unhooks_with_ctypes": (f"import ctypes, sys, simlib.protocol\nref = {REF}\ndef g(c, d, s):\n"
                            "    ctypes.pythonapi.PyEval_SetProfile(None, None)\n    return ref(c, d, s)",
                            "replaces or removes the grader's call watch"),
    "unhooks_by_recursion": (f"import sys, simlib.protocol\nref = {REF}\ndef deep(n):\n    return deep(n + 1)\n"
                             "def g(c, d, s):\n    try:\n        deep(0)\n    except RecursionError:\n        pass\n"
                             "    return ref(c, d, s)", "replaces or removes the grader's call watch"),
    "runs_it_in_a_raw_thread": (f"import _thread, queue, sys, simlib.protocol\nref = {REF}\nq = queue.Queue()\n"
                                "def g(c, d, s):\n    _thread.start_new_thread(lambda: q.put(ref(c, d, s)), ())\n"
                                "    return q.get()",
                                "a2 line 5: _thread.start_new_thread(lambda: q.put(ref(c, d, s)), ())"),
    "calls_a_copy_of_its_module": ("import importlib.util\nspec = importlib.util.find_spec('simlib.' + 'protocol')\n"
                                   "ns = {'__name__': spec.name}\n"
                                   "exec(compile(open(spec.origin).read(), 'copy.py', 'exec'), ns)\n"
                                   "h = ns['may' + '_read']\ndef g(c, d, s):\n    return h(c, d, s)",
                                   "a2 line 7: return h(c, d, s)"),
    "strips_its_replies": (f"import json, os, struct, sys, simlib.protocol\nref = {REF}\ndef g(c, d, s):\n    return ref(c, d, s)\n"
                           "real = os.write\ndef fake(fd, data):\n    try:\n        d = json.loads(data[4:])\n"
                           "        d.update(used=[], values=[{k: v for k, v in r.items() if k != 'ran'} for r in d.get('values', [])])\n"
                           "        data = json.dumps(d).encode()\n        data = struct.pack('>I', len(data)) + data\n"
                           "    except Exception:\n        pass\n    return real(fd, data)\nos.write = fake",
                           "a2 line 4: return ref(c, d, s)"),
    "compiles_under_a_library_name": ("exec(compile('import sys, simlib.protocol\\nref = ' + " + repr(REF) + " + '\\n"
                                      "T = {(c, d, s): ref(c, d, s) for c in range(9) for d in range(9) for s in range(4)}', "
                                      "'/usr/lib/python3/dist-packages/_helpers.py', 'exec'), globals())\n"
                                      "def g(c, d, s):\n    return T[(c, d, s)]", "code named <code built at run time> line 3"),
    "forks_a_helper": (f"import os, sys, simlib.protocol\nref = {REF}\ndef g(c, d, s):\n    r, w = os.pipe()\n"
                       "    if os.fork() == 0:\n        os.write(w, b'1' if ref(c, d, s) else b'0')\n        os._exit(0)\n"
                       "    os.close(w)\n    got = os.read(r, 1) == b'1'\n    os.close(r)\n    os.wait()\n    return got",
                       "a2 line 6: os.write(w, b'1' if ref(c, d, s) else b'0')"),
    "unhooks_in_a_forked_helper": (f"import ctypes, os, sys, simlib.protocol\nref = {REF}\ndef g(c, d, s):\n"
                                   "    r, w = os.pipe()\n    if os.fork() == 0:\n"
                                   "        ctypes.pythonapi.PyEval_SetProfile(None, None)\n"
                                   "        os.write(w, b'1' if ref(c, d, s) else b'0')\n        os._exit(0)\n"
                                   "    os.close(w)\n    got = os.read(r, 1) == b'1'\n    os.close(r)\n    os.wait()\n"
                                   "    return got", "replaces or removes the grader's call watch"),
    "unhooks_by_recursion_in_a_forked_helper": (  # one helper, forked as the cell runs, answers every call
        f"import json, os, sys, simlib.protocol\nref = {REF}\ndef deep(n):\n    return deep(n + 1)\nr, w = os.pipe()\n"
        "if os.fork() == 0:\n    try:\n        deep(0)\n    except RecursionError:\n        pass\n"
        "    T = [[c, d, s, ref(c, d, s)] for c in range(9) for d in range(9) for s in range(4)]\n"
        "    os.write(w, json.dumps(T).encode())\n    os._exit(0)\nos.close(w)\ndata = b''\nwhile chunk := os.read(r, 65536):\n"
        "    data += chunk\nos.wait()\nT = {(c, d, s): got for c, d, s, got in json.loads(data)}\ndef g(c, d, s):\n"
        "    return T[(c, d, s)]", "replaces or removes the grader's call watch"),
    "asks_a_helper_process": (f"import multiprocessing, sys, simlib.protocol\nref = {REF}\ndef ask(q, c, d, s):\n"
                              "    q.put(ref(c, d, s))\ndef g(c, d, s):\n    q = multiprocessing.get_context('fork').SimpleQueue()\n"
                              "    p = multiprocessing.get_context('fork').Process(target=ask, args=(q, c, d, s))\n"
                              "    p.start()\n    got = q.get()\n    p.join()\n    return got",
                              "a2 line 4: q.put(ref(c, d, s))"),
    "borrows_the_method": ("from simlib.protocol import StepRule\nclass Mine:\n    scale = StepRule.scale\n"
                           "setattr(Mine, 'staleness' + '_aware', True)\ndef g(c, d, s):\n    Mine().scale(3)\n"
                           "    return c - s <= d", "a2 line 6: Mine().scale(3) (uses staleness_aware"),
    "borrows_it_with_a_property": ("from simlib.protocol import StepRule\nclass Mine:\n    scale = StepRule.scale\n"
                                   "setattr(Mine, 'staleness' + '_aware', property(lambda self: 1 < 2))\ndef g(c, d, s):\n"
                                   "    Mine().scale(3)\n    return c - s <= d", "a2 line 6: Mine().scale(3) (uses staleness_aware"),
    "copies_the_rules_fields": ("import copy\nfrom simlib.protocol import StepRule\nrule = copy.copy(StepRule())\n"
                                "vars(rule).update({'staleness' + '_aware': True})\ndef g(c, d, s):\n"
                                "    rule.scale(2)\n    return c - s <= d", "a2 line 6: rule.scale(2) (uses staleness_aware"),
    "builds_the_keyword": ("from simlib.protocol import StepRule\ndef g(c, d, s):\n    StepRule(**{'staleness' + '_aware': True})\n"
                           "    return c - s <= d", "a2 line 3: StepRule(**{'staleness' + '_aware': True}) (uses staleness_aware"),
}


def reference_master():
    """The probe master, its part 2 the SSP read rule that simlib.protocol.may_read answers, checked by probes."""
    master = probe_master()
    master["cells"][3]["source"] = "### BEGIN SOLUTION\ndef g(clock, completed, bound):\n    return clock - bound <= completed\n" \
                                   "### END SOLUTION"
    master["cells"][4]["source"] = (
        "assert g(0, 0, 0)\n### BEGIN HIDDEN TESTS\n_REFERENCES = ['simlib.protocol.may_read']\n"
        "_aware = simlib.protocol.StepRule(staleness_aware=True)  # a keyword that answers a part: staleness_aware\n"
        "def _probes(rng):\n"
        "    return [{'call': 'bool', 'args': [{'call': 'g', 'args': [int(c), int(d), int(s)]}]}\n"
        "            for c, d, s in zip(rng.integers(0, 9, 30), rng.integers(0, 9, 30), rng.integers(0, 4, 30))]\n"
        "### END HIDDEN TESTS")
    return master


LEAKS = ("import json, os\nseen = []\ndef f(x):\n    for root in (os.environ.get('NUMBA_CACHE_DIR', ''), '/run/numba-cache'):\n"
         "        path = os.path.join(root, 'master-passed')\n        if os.path.exists(path):\n"
         "            values = [r['value'] for r in json.load(open(path))['probes']['t1: hidden tests']]\n"
         "            seen.append(x)\n            return values[len(seen) - 1]\n    return 1")


FORGES = ("import sys\nch = sys.modules['simlib.grade.child']\n"
          "ch.NOTED[('good ok\\ngood: flagged: uses simlib.protocol.may_read', 3, 'simlib.protocol.may_read')] = None\n"
          "ch.NOTED[('<a1>', 1, 'good copied this from reads_the_masters_replies')] = None\n"
          "def f(x):\n    return 2 * x + 1")


# Honest: part 2 answered through a thread, and a forked helper that answers from a thread of its own; no flag.
THREADS = ("import os, queue, threading\ndef g(c, d, s):\n    q = queue.Queue()\n"
           "    threading.Thread(target=lambda: q.put(c - s <= d)).start()\n    got = q.get()\n    r, w = os.pipe()\n"
           "    if os.fork() == 0:\n        t = threading.Thread(target=lambda: os.write(w, b'1' if got else b'0'))\n"
           "        t.start()\n        t.join()\n        os._exit(0)\n    os.close(w)\n    out = os.read(r, 1) == b'1'\n"
           "    os.close(r)\n    os.wait()\n    return out")


# Honest: a child forked as the cell runs ends with sys.exit, whose SystemExit unwinds the child's stack into the
# grader's loop (as a worker's SIGTERM does when it lands in os._exit): it replied as the serving process before.
EXITS = ("import os, sys\nif os.fork() == 0:\n    sys.exit(0)\nos.wait()\ndef g(c, d, s):\n    return c - s <= d")


def _write_reference_class(subs: Path, master: dict, master_path: Path, out: Path) -> dict[str, Any]:
    (subs / "good.ipynb").write_text(nbm.dump(master))
    for name, code in (("threads_and_a_helper", THREADS), ("exits_a_forked_child", EXITS)):
        honest = json.loads(json.dumps(master))
        honest["cells"][3]["source"] = code
        (subs / f"{name}.ipynb").write_text(nbm.dump(honest))
    for name, (code, _) in REACHES.items():
        nb = json.loads(json.dumps(master))
        nb["cells"][3]["source"] = code
        (subs / f"{name}.ipynb").write_text(nbm.dump(nb))
    (subs / "reads_the_masters_replies.ipynb").write_text(nbm.dump(with_answer1(master, LEAKS)))
    (subs / "forges_flags.ipynb").write_text(nbm.dump(with_answer1(master, FORGES)))
    return {}


@pytest.fixture(scope="module")
def reference_class(tmp_path_factory):
    """Graded in whichever sandbox runs here (bubblewrap, else the watcher)."""
    return _grade_hostile(tmp_path_factory, "auto", _write_reference_class, master=reference_master())


@pytest.mark.parametrize("student", sorted(REACHES))
def test_a_reference_reached_at_run_time_is_flagged_with_its_line(reference_class, student):
    notes = (reference_class["out"] / "notes.txt").read_text(encoding="utf-8")
    flagged = [line for line in notes.splitlines() if line.startswith(f"{student}: flagged: ")]
    assert [line for line in flagged if REACHES[student][1] in line], notes
    assert student == "copies_its_source" or not [line for line in flagged if "<string>" in line], notes  # not the child's start
    assert _rows(reference_class["out"])[(student, "t2")] == (3, "passed; flagged (notes.txt)")
    assert _rows(reference_class["out"])[("good", "t2")] == (3, "passed")
    assert "good: flagged" not in notes


@pytest.mark.parametrize("student", ["threads_and_a_helper", "exits_a_forked_child"])
def test_threads_and_forked_helpers_of_honest_code_are_not_flagged(reference_class, student):
    """A thread of threading's sets its profile hook as it starts: once flagged as replacing the watch."""
    notes = (reference_class["out"] / "notes.txt").read_text(encoding="utf-8")
    assert f"{student}: flagged" not in notes, notes
    assert _rows(reference_class["out"])[(student, "t2")] == (3, "passed")


def test_the_sandbox_cannot_write_text_into_the_notes(reference_class):
    """A flag names one of the references the grader knows, and code it cannot vouch for by no name of the sandbox's."""
    notes = (reference_class["out"] / "notes.txt").read_text(encoding="utf-8")
    assert "copied this" not in notes and "good ok" not in notes and "good: flagged" not in notes, notes
    assert ("forges_flags: flagged: code named <code built at run time> line 3: (code the submission built at run time) "
            "(uses simlib.protocol.may_read") in notes


def test_the_masters_replies_are_out_of_the_sandboxs_reach(reference_class):
    """The master's pass (its replies to every probe) once lay beside the kernels every submission reads."""
    out = reference_class["out"]
    assert _rows(out)[("reads_the_masters_replies", "t1")][0] == 0
    assert "differs from the master's" in _feedback(out)["reads_the_masters_replies"]
    assert not list(out.glob(".numba-cache/*/master-passed")) and list(out.glob(".cache/master-*.passed"))


def test_probe_calls_keep_values_index_and_are_judged_by_tolerance_raises_or_check():
    """The probe language in one process (the sandbox's side and the grader's): kept values called again, takes by
    index and as lists, per-call tolerances, an expected exception, and a check of the master's (trusted) code."""
    from simlib.grade import probe

    hidden = ("def _probes(rng):\n    return [\n"
              "        {'call': 'Counter', 'as': '$c'},\n"
              "        {'call': '$c.update', 'args': [['a', 'b', 'a']]},\n"
              "        {'call': 'sorted', 'args': [{'call': 'dict.items', 'args': [{'name': '$c'}]}]},\n"
              "        {'call': 'divmod', 'args': [7, 2], 'take': ['0', '1']},\n"
              "        {'call': 'f', 'args': [1.0], 'rtol': 1e-3},\n"
              "        {'call': 'int', 'args': ['x'], 'raises': 'ValueError'},\n"
              "        {'call': 'f', 'args': [2.0], 'check': ['_near', 0.5]}]\n"
              "def _near(got, want, call):\n    return abs(got - want) <= call['check'][1]\n")
    drawn = probe.calls(hidden, seed=0)
    checks = probe.functions(hidden)
    assert [c for c in probe.sent(drawn) if set(c) & set(probe.GRADER_KEYS)] == []

    def replies(f):
        from collections import Counter

        kept: dict[str, Any] = {}
        return [probe.answer(c, {"Counter": Counter, "f": f}, kept) for c in probe.sent(drawn)]

    master = replies(lambda x: x / 3)
    assert master[:4] == [{"value": None}, {"value": None}, {"value": [["a", 2], ["b", 1]]}, {"value": [3, 1]}]
    assert master[5] == {"error": "ValueError"}
    assert probe.verdict(master, master, drawn, checks) == ""
    assert probe.verdict(replies(lambda x: x / 3 * (1 + 1e-4)), master, drawn, checks) == ""  # within rtol, within 0.5
    assert "call 5 of 7 (f) gave a value that differs" in probe.verdict(replies(lambda x: x / 3 + 0.01), master, drawn,
                                                                         checks)
    near = replies(lambda x: x / 3 if x < 2 else 1.0)  # 1.0 against 0.667: within the check's 0.5
    assert probe.verdict(near, master, drawn, checks) == ""
    far = replies(lambda x: x / 3 if x < 2 else 2.0)
    assert probe.verdict(far, master, drawn, checks) == ("call 7 of 7 (f) gave a value that fails this part's check "
                                                         "on inputs drawn for this grading")
    no_raise = [*master[:5], {"value": 0}, master[6]]
    assert probe.verdict(no_raise, master, drawn, checks) == "call 6 of 7 (int) did not raise ValueError"


# -- the cgroup -----------------------------------------------------------------------------------
# One grading run (per sandbox kind) of the attacks that only a cgroup stops in full, beside the
# control student and the two escapes; each test fails if no cgroup was applied.
CGROUP_LIMITS = Limits(cell_s=10, wall_s=60, memory_mb=400, max_procs=32, output_mb=8, disk_mb=64)
CGROUP_ATTACKS = {  # name: (code replacing part 1's answer, (t1, t2) points, text the feedback must contain)
    # every process forks, 7 times: up to 128 at once, fast enough to outrun a watcher polling every 20 ms
    "fast_fork_bomb": ("import os, time\npid0 = os.getpid()\nfor _ in range(7):\n    try:\n        os.fork()\n"
                       "    except OSError:\n        break\nif os.getpid() != pid0:\n    time.sleep(30)\n    os._exit(0)" + F,
                       (0, 3), "more than 32 processes at once (--max-procs, the cgroup's pids.max"),
    # one child that goes on forking after its cell has returned (a fork every 5 ms): still growing at the
    # cell's end, the crowd is that cell's, not the next one's, whenever it reaches the limit; f (called by the
    # tests' cell) waits for the child's loop to end, so the limit is reached however slowly the machine forks.
    # Part 2 keeps its points or is stopped with the crowd, as the load orders the two (0 beside 4 busy loops)
    "slow_fork_bomb": ("import os, time\nr, w = os.pipe()\nif os.fork() == 0:\n    for _ in range(60):\n"
                       "        time.sleep(0.005)\n        try:\n            if os.fork() == 0:\n                os.close(w)\n"
                       "                time.sleep(30)\n                os._exit(0)\n        except OSError:\n            break\n"
                       "    os._exit(0)\nos.close(w)\ndef f():\n    os.read(r, 1)\n    return 1",
                       (0, (0, 3)), "more than 32 processes at once (--max-procs, the cgroup's pids.max"),
    # two processes of 240 MB each (each under the 400 MB per process, 480 MB with the interpreter
    # together: over --memory-mb, yet under the watcher's 800 MB resident in all)
    "two_processes_over_memory": ("import os, time\nn = 240 * 2**20\npid = os.fork()\nif pid == 0:\n    a = b'x' * n\n"
                                  "    time.sleep(3)\n    os._exit(0)\nb = b'y' * n\nos.waitpid(pid, 0)\ndel b" + F,
                                  (0, 3), "more than 400 MB (--memory-mb, the cgroup's memory limit"),
    "one_process_under_memory": ("b = b'y' * (200 * 2**20)\ndel b" + F, (2, 3), "Autograded: 5 / 5 points"),
}


def _write_cgroup_class(subs: Path, master: dict, master_path: Path, out: Path) -> dict[str, Any]:
    good = subs / "good.ipynb"
    good.write_text(nbm.dump(master))
    expect = {"good": ((2, 3), "Autograded: 5 / 5 points")}
    for name, (code, points, reason) in {**CGROUP_ATTACKS, **{k: ATTACKS[k] for k in ("setsid_double_fork",
                                                                                    "clone_parent")}}.items():
        (subs / f"{name}.ipynb").write_text(nbm.dump(with_answer1(master, code)))
        expect[name] = (points, reason)
    return expect


def _cgroup_class(tmp_path_factory, sandbox):
    if cgroups.problem():
        pytest.skip(f"no cgroup for submissions here: {cgroups.problem()}")
    return _grade_hostile(tmp_path_factory, sandbox, _write_cgroup_class, CGROUP_LIMITS)


@pytest.fixture(scope="module")
def cgroup_class(tmp_path_factory):
    if sandbox_problem():
        pytest.skip(f"bubblewrap cannot run here: {sandbox_problem()}")
    return _cgroup_class(tmp_path_factory, "bwrap")


@pytest.fixture(scope="module")
def cgroup_class_watcher(tmp_path_factory):
    return _cgroup_class(tmp_path_factory, "watcher")


CGROUP_GROUPS = ["cgroup_class", pytest.param("cgroup_class_watcher", marks=pytest.mark.slow)]


@pytest.mark.parametrize("graded", CGROUP_GROUPS)
@pytest.mark.parametrize("student", ["good", *CGROUP_ATTACKS, "setsid_double_fork", "clone_parent"])
def test_the_cgroup_stops_what_rlimits_and_polling_miss(graded, student, request):
    _check_student(request.getfixturevalue(graded), student)


@pytest.mark.parametrize("graded", CGROUP_GROUPS)
def test_a_fork_bomb_never_has_more_than_max_procs_at_once(graded, request):
    seen = request.getfixturevalue(graded)["cgroups"]
    assert seen["removed"], "no cgroup was made"
    peaks = [r["stats"]["pids_peak"] for r in seen["removed"]] + list(seen["samples"].values())
    assert max(peaks) <= CGROUP_LIMITS.max_procs, peaks
    assert any(r["stats"]["pids_refused"] for r in seen["removed"])  # the bomb met pids.max, not the watcher
    assert max(peaks) >= CGROUP_LIMITS.max_procs - 4, peaks  # and it did fill it up


@pytest.mark.parametrize("graded", CGROUP_GROUPS)
def test_memory_is_limited_for_all_processes_together(graded, request):
    seen = request.getfixturevalue(graded)["cgroups"]
    limit = CGROUP_LIMITS.memory_mb * 2**20
    assert seen["removed"], "no cgroup was made"
    assert sum(r["stats"]["oom_kills"] for r in seen["removed"]) >= 1
    assert all(r["stats"]["memory_peak"] <= limit for r in seen["removed"])


@pytest.mark.parametrize("graded", CGROUP_GROUPS)
def test_nothing_is_left_in_or_of_the_cgroups(graded, request):
    graded = request.getfixturevalue(graded)
    removed = graded["cgroups"]["removed"]
    assert len(removed) >= 1 + len(graded["expect"]), "a cgroup per sandbox (the master's, each submission's)"
    assert [r for r in removed if r["left"]] == []  # the teardown kill emptied each
    assert [d for r in removed for d in r["dirs"] if d.exists()] == [] and graded["leftover_cgroups"] == []
    assert graded["survivors"] == []
    assert graded["seconds"] < 60  # no escaped process (they sleep 120 s) held the grader's pipes open


def test_without_a_cgroup_the_grader_says_so_once_and_grades_as_before(course, monkeypatch):
    from simlib.grade import sandbox

    made = []
    monkeypatch.setattr(cgroups.Cgroup, "__init__", lambda group, *args: made.append(args))
    monkeypatch.setattr(cgroups, "layout", lambda: (None, "the grader is not running as root"))
    note = sandbox.choose("auto")[1]
    assert note.count("no cgroup for submissions (the grader is not running as root)") == 1
    log = io.StringIO()
    rows = grade_class(course / "solutions" / "07-toy.ipynb", course / "submitted", course / "grades",
                       progress=None, log=log)
    assert log.getvalue().count("no cgroup for submissions") == 1, log.getvalue()
    assert sum(r["points"] for r in rows if r["student"] == "alice") == 5
    assert made == []
    notes = [n for p in (course / "grades" / ".cache").glob("*.json") for n in json.loads(p.read_text())["notes"]]
    assert notes and all(n.endswith("; no cgroup") for n in notes if n.startswith("isolation:"))


def test_the_cgroup_layout_is_read_from_proc():
    """v2 (unified) and v1 (one hierarchy per controller) as /proc/self/cgroup and mountinfo show them."""
    v2 = cgroups._own_paths("0::/user.slice/grader.scope\n")
    mounts2 = cgroups._mounts("30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    assert v2 == {"unified": "/user.slice/grader.scope"} and mounts2 == {"unified": ("/sys/fs/cgroup", "/")}
    v1 = cgroups._own_paths("8:pids:/\n4:memory:/jobs/7\n2:cpu,cpuacct:/\n0::/\n")
    assert v1 == {"pids": "/", "memory": "/jobs/7", "cpu": "/", "cpuacct": "/", "unified": "/"}
    mounts1 = cgroups._mounts("40 31 0:36 /jobs /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                              "41 31 0:37 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n")
    assert mounts1["memory"] == ("/sys/fs/cgroup/memory", "/jobs") and mounts1["pids"] == ("/sys/fs/cgroup/pids", "/")


def test_a_grader_that_is_not_root_makes_no_cgroup(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cgroups.layout.__wrapped__() == (None, "the grader is not running as root")


# -- the instructor's mistakes --------------------------------------------------------------------
def _cli(*args, cwd, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([PY, "-m", "simlib.grade", *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd)


@pytest.fixture
def course(tmp_path):
    """A course folder: the toy master and one correct submission."""
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "07-toy.ipynb").write_text(nbm.dump(toy_master()))
    (tmp_path / "submitted").mkdir()
    (tmp_path / "submitted" / "alice.ipynb").write_text(nbm.dump(toy_master()))
    return tmp_path


@pytest.mark.parametrize("args, message", [
    (["99", "submitted"], "error: assignment: '99' names no master notebook"),
    (["genrate"], "error: unknown command 'genrate'; did you mean 'generate'?"),
    (["07", "submitted", "--cell-timout", "3"], "error: unrecognized arguments: --cell-timout"),
    (["07", "submitted", "--memory-mb", "lots"], "error: argument --memory-mb: invalid int value: 'lots'"),
    (["07", "submitted", "--cell-timeout", "-1"], "error: --cell-timeout (cell_s) must be a number > 0, got -1.0"),
    (["07", "submitted", "--jobs", "0"], "error: --jobs must be an integer >= 1, got 0"),
    (["07", "missing"], "error: submissions-dir: missing does not exist"),
    (["07", "empty"], "error: submissions-dir: empty holds no submissions"),
    (["07", "submitted", "--solutions", "nowhere"], "error: --solutions: nowhere is not a folder"),
    (["generate", "--check", "--solutions", "nowhere"], "error: --solutions: nowhere is not a folder"),
    (["generate", "--check", "--assignments", "nowhere"], "error: --assignments: nowhere is not a folder"),
    (["07", "submitted", "--out", "submitted/grades"],
     "error: --out: submitted/grades lies inside submissions-dir submitted, where the next run would take it for a student"),
])
def test_cli_mistakes_get_one_line_and_exit_2(course, args, message):
    (course / "empty").mkdir()
    res = _cli(*args, cwd=course)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(message) and res.stderr.count("\n") == 1, res.stderr
    assert not (course / "grades").exists()


def test_the_grader_runs_from_any_folder(tmp_path):
    """Without ./solutions, the assignment is looked up in the course's own solutions/ (it was an error)."""
    res = _cli("01", "missing", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr == "error: submissions-dir: missing does not exist\n", res.stderr


def _slow_class(course: Path) -> None:
    """alice (correct) and zed, whose first answer starts a process carrying TOKEN, then sleeps a minute."""
    slow = with_answer1(toy_master(), "import ctypes, os, time\nif os.fork() == 0:\n" + _left_behind("    ")
                        + "time.sleep(60)" + F)
    (course / "submitted" / "zed.ipynb").write_text(nbm.dump(slow))


def _start_grading(course: Path, tmp: Path) -> subprocess.Popen:
    """The CLI grading the slow class one at a time; returns once zed's sandbox runs (its TOKEN process is up)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    proc = subprocess.Popen([PY, "-m", "simlib.grade", "07", "submitted", "--jobs", "1"], cwd=course, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _processes_with(TOKEN) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert _processes_with(TOKEN), "zed's sandbox never started"
    return proc


def test_ctrl_c_writes_the_gradebook_of_what_finished_and_names_the_rest(course):
    _slow_class(course)
    scratch = course / "scratch"
    scratch.mkdir()
    proc = _start_grading(course, scratch)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: 1 of 2 submissions graded, written to grades/07-toy/gradebook.csv; not graded: 'zed'" in err
    assert "Traceback" not in err
    rows = _rows(course / "grades" / "07-toy")
    assert rows[("alice", "t1")] == (2, "passed") and rows[("alice", "t2")] == (3, "passed")
    assert rows[("zed", "t1")][1].startswith("not graded: grading was interrupted (Ctrl-C)")
    assert _processes_with(TOKEN) == [] and list(scratch.iterdir()) == []
    assert [p.name for p in (course / "grades" / "07-toy" / "feedback").iterdir()] == ["alice.txt"]


def test_the_scratch_of_a_killed_grader_is_removed_on_the_next_start(course):
    _slow_class(course)
    scratch = course / "scratch"
    scratch.mkdir()
    proc = _start_grading(course, scratch)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while _processes_with(TOKEN) and time.monotonic() < deadline:  # bwrap --die-with-parent takes the sandbox down
        time.sleep(0.1)
    assert _processes_with(TOKEN) == []
    left = [p.name for p in scratch.iterdir()]
    assert len(left) == 1 and left[0].startswith(f"simlib-grade-{proc.pid}.")  # the killed grader's, with zed's notebook
    (course / "submitted" / "zed.ipynb").unlink()
    res = _cli("07", "submitted", cwd=course, env={"TMPDIR": str(scratch)})
    assert res.returncode == 0 and "note: removed 1 scratch folder(s) of graders that were killed" in res.stderr, res.stderr
    assert list(scratch.iterdir()) == []


def test_a_submission_holding_every_inotify_instance_leaves_the_grader_its_own(course):
    """The sandbox runs as a user of its own: the per-user limits it exhausts are not root's (they were)."""
    if sandbox_problem() or os.geteuid() != 0:
        pytest.skip("needs bubblewrap and a grader running as root")
    hog = ("import ctypes, os, time\nlibc = ctypes.CDLL(None)\nheld = []\nwhile len(held) < 4096 and libc.inotify_init1(0) >= 0:"
           "\n    held.append(1)\ntime.sleep(3)\nraise RuntimeError(f'uid {os.getuid()} held {len(held)}')")
    (course / "submitted" / "hog.ipynb").write_text(nbm.dump(with_answer1(toy_master(), F + "\n" + hog)))
    libc, refused, stop = ctypes.CDLL(None, use_errno=True), [], threading.Event()

    def probe_root():
        while not stop.wait(0.05):
            fd = libc.inotify_init1(0)
            refused.append(fd < 0) if fd < 0 else os.close(fd)

    watcher = threading.Thread(target=probe_root)
    watcher.start()
    try:
        grade_class(course / "solutions" / "07-toy.ipynb", course / "submitted", course / "grades", progress=None,
                    log=io.StringIO())
    finally:
        stop.set()
        watcher.join()
    text = _feedback(course / "grades")["hog"]
    limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    uid, held = (int(w) for w in text.split("RuntimeError: uid ")[1].split()[::2][:2])
    assert refused == []  # root could make an instance the whole time ...
    assert uid != 0 and held == limit, text  # ... while the submission held every one its own user may have
    assert _rows(course / "grades")[("hog", "t1")][0] == 2


def test_hand_grading_export_fill_merge(course):
    """The grading run writes manual.csv; the instructor fills points; the next run merges them into both gradebooks."""
    out = course / "grades" / "07-toy"
    assert _cli("07", "submitted", cwd=course).returncode == 0
    with open(out / "manual.csv", newline="", encoding="utf-8") as f:
        sheet = list(csv.DictReader(f))
    assert sheet == [{"student": "alice", "part": "q", "max_points": "1", "points": "",
                      "answer": "### BEGIN SOLUTION\nBecause.\n### END SOLUTION"}]
    assert (out / "gradebook-wide.csv").read_text() == "id,name,total,t1,t2,q\nalice,alice.ipynb,5,2,3,\n"
    for points, ok in (("2", False), ("x", False), ("0.5", True)):
        sheet[0]["points"] = points
        with open(out / "manual.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(sheet[0]))
            w.writeheader()
            w.writerows(sheet)
        res = _cli("07", "submitted", cwd=course)
        if not ok:
            assert res.returncode == 2 and res.stderr.startswith(
                f"error: grades/07-toy/manual.csv line 2: points must be a number from 0 to 1, got '{points}'"), res.stderr
    assert res.returncode == 0, res.stderr
    assert _rows(out)[("alice", "q")] == (0.5, "graded by hand")
    assert (out / "gradebook-wide.csv").read_text() == "id,name,total,t1,t2,q\nalice,alice.ipynb,5.5,2,3,0.5\n"
    assert "0.5" in (out / "manual.csv").read_text()  # kept for the next run


def test_cli_generate_check(tmp_path):
    res = _cli("generate", "--check", "--solutions", SOLUTIONS, "--assignments", ASSIGNMENTS, cwd=tmp_path)
    assert res.returncode == 0 and "up to date" in res.stdout


def test_help_gives_every_flag_its_meaning_and_default(tmp_path):
    text = _cli("--help", cwd=tmp_path).stdout
    for flag, default in [("--out", "grades/ASSIGNMENT"), ("--solutions", "solutions"), ("--cell-timeout", "60"),
                          ("--timeout", "180"), ("--memory-mb", "2048"), ("--max-procs", "32"), ("--output-mb", "64"),
                          ("--disk-mb", "512"), ("--jobs", "2 in bubblewrap"), ("--sandbox", "auto")]:
        assert flag in text and f"(default: {default}" in " ".join(text.split()), flag
    text = " ".join(_cli("generate", "--help", cwd=tmp_path).stdout.split())
    assert "--check" in text and "(default: solutions)" in text and "(default: assignments)" in text


@pytest.mark.parametrize("master_code, args, why", [
    ("import simlib_no_such_package", [], "ModuleNotFoundError: No module named 'simlib_no_such_package'"),
    ("import time\ntime.sleep(3)", ["--cell-timeout", "1"], "time limit of 1 s per cell"),
    ("x = bytearray(400 * 2**20)", ["--memory-mb", "300"], "MemoryError"),
    ("", ["--memory-mb", "10"], "could not run in the sandbox"),
])
def test_a_master_short_of_full_marks_is_refused_and_nothing_is_cached(course, master_code, args, why):
    master = toy_master()
    master["cells"][0]["source"] = f"import numpy as np\n{master_code}"
    (course / "solutions" / "07-toy.ipynb").write_text(nbm.dump(master))
    res = _cli("07", "submitted", *args, cwd=course)
    assert res.returncode == 1, res.stderr
    lines = [line for line in res.stderr.splitlines() if not line.startswith("note: ")]  # e.g. no cgroup here
    assert len(lines) == 1 and lines[0].startswith("refused: the master notebook 07-toy.ipynb") and why in lines[0], res.stderr
    assert not (course / "grades" / "07-toy" / "gradebook.csv").exists()
    assert not list((course / "grades" / "07-toy").rglob("*.json"))


def test_the_cache_knows_the_interpreter_and_the_sandbox(course):
    res = _cli("07", "submitted", "--sandbox", "watcher", cwd=course)
    assert res.returncode == 0 and "alice: 5 / 5" in res.stdout, res.stderr
    keys = {p.stem for p in (course / "grades" / "07-toy" / ".cache").glob("*.json")}
    # The expected keys from a fresh interpreter started as the CLI is (this test process's own state, after a
    # whole suite, is not what a grader sees), for the sandbox it used and for the other one.
    code = ("from pathlib import Path; from simlib.grade.gradebook import cache_key; from simlib.grade.sandbox import Limits\n"
            "data, master = Path('submitted/alice.ipynb').read_bytes(), Path('solutions/07-toy.ipynb').read_bytes()\n"
            "print(cache_key(master, data, Limits(), 'watcher')); print(cache_key(master, data, Limits(), 'bwrap'))")
    fresh = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=course, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert keys == {fresh[0]} and fresh[1] not in keys, (keys, fresh)


def test_the_cache_key_changes_with_an_installed_package_version(tmp_path):
    """A package upgraded (or missing) in the grading interpreter changes every key, so old grades are not reused."""
    def key(version):
        site = tmp_path / (version or "none")
        if version:
            (site / "simlibfakepkg-1.dist-info").mkdir(parents=True, exist_ok=True)
            (site / "simlibfakepkg-1.dist-info" / "METADATA").write_text(f"Name: simlibfakepkg\nVersion: {version}\n")
        code = "from simlib.grade.gradebook import environment; print(environment())"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
        return subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert len({key(None), key("1.0"), key("2.0")}) == 3
    assert key("1.0") == key("1.0")


def test_the_fallback_is_announced_once(course):
    res = _cli("07", "submitted", env={"PATH": "/nonexistent"}, cwd=course)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("falling back to the process watcher") == 1
    assert "alice: 5 / 5" in res.stdout


# -- the real assignments -------------------------------------------------------------------------
# In-interpreter cheats on the student version (every answer a stub), put before the first answer's stub. Each scored
# full marks on every assignment while the hidden tests ran in the sandbox's interpreter; as probes they score 0.
CHEATS = {
    "replaces_exec": "import builtins\n_real = builtins.exec\nbuiltins.exec = lambda c, *a, **k: _real(c, *a, **k) "
                     "if isinstance(c, str) else None\n",
    "patches_marshal": "import marshal\nmarshal.loads = lambda b: compile('pass', 'x', 'exec')\n",
    "forges_ok_replies": "import json, os, struct\nreal = os.write\ndef fake(fd, data):\n    try:\n"
                         "        d = json.loads(data[4:])\n        d.update(ok=True, error='')\n"
                         "        data = json.dumps(d).encode()\n        data = struct.pack('>I', len(data)) + data\n"
                         "    except Exception:\n        pass\n    return real(fd, data)\nos.write = fake\n",
    "prewrites_ok_replies_and_exits": (
        "import json, os, struct, sys\nfd = json.loads(sys.argv[-1])['result_fd']\nserve = sys._getframe(0).f_back.f_locals\n"
        "mine = [(serve['seq'], serve['unit']['nonce'])] + [(k, u['nonce']) for k, u in enumerate(serve['plan']) if u]\n"
        "for seq, nonce in mine:\n    d = json.dumps({'seq': seq, 'nonce': nonce, 'ok': True, 'error': ''}).encode()\n"
        "    os.write(fd, struct.pack('>I', len(d)) + d)\nos._exit(0)\n"),
}
def _solution(master: str, grade_id: str) -> str:
    """The master's answer of one cell, its solution markers dropped."""
    cell = next(c for c in nbm.load(SOLUTIONS / master)["cells"] if nbm.meta(c).get("grade_id") == grade_id)
    return "".join(ln for ln in nbm.source(cell).splitlines(keepends=True)
                   if ln.strip() not in (nbm.BEGIN_SOLUTION, nbm.END_SOLUTION))


def _uniform_stages() -> str:
    """Assignment 06's timeline, wrong where stages differ (every stage takes stage 0's times)."""
    code = _solution("06-pipeline.ipynb", "part2-answer")
    assert "(t_fwd[s] if kind == \"F\" else t_bwd[s])" in code
    return code.replace("(t_fwd[s] if kind == \"F\" else t_bwd[s])", "(t_fwd[0] if kind == \"F\" else t_bwd[0])")


def _capped_map_document() -> str:
    """Assignment 03's map_document, wrong past a window of 2, and the library's counts (which the hidden tests take
    as the reference) replaced by it."""
    code = _solution("03-glove.ipynb", "part1-answer")
    assert "min(n, p + window + 1)" in code
    return ("from simlib.problems.glove import Cooccurrence\n\n"
            + code.replace("min(n, p + window + 1)", "min(n, p + min(window, 2) + 1)")
            + "\n\ndef count_cooccurrences(ids, offsets, n_words, window=5):\n    c = map_document(ids, window)\n"
            "    keys = sorted(c)\n    return Cooccurrence(rows=np.array([k[0] for k in keys], dtype=np.int32), "
            "cols=np.array([k[1] for k in keys], dtype=np.int32),\n"
            "                        values=np.array([c[k] for k in keys], dtype=np.float32), n_words=n_words)\n")


# Cheats with wrong answers of their own (grade_id -> code; the other answers stay stubs). Each scored every point of
# the parts it answers while the hidden tests ran in the sandbox's interpreter.
OWN_CHEATS = {
    "02-hogwild.ipynb": {"patches_assert_allclose": {  # 8 of 8 before
        # the assertions patched, serial SGD that never updates, and Hogwild! that copies scikit-learn's weights
        "part1-answer": "import numpy as np\nnp.testing.assert_allclose = lambda *a, **k: None\n"
                        "def sgd_rows(indptr, indices, values, y, w, last, t, start, stop, lr, l2):\n    return t + stop - start",
        "part2-answer": "def catch_up(w, last, t, lr, l2):\n    last[:] = t",
        "part3-answer": "def hogwild_worker(worker_id, n_workers, data, w, epochs, lr, l2):\n    w.array[:] = reference\n"
                        "    return epochs * (data.n_rows * (worker_id + 1) // n_workers - data.n_rows * worker_id // n_workers)",
    }, "serial_sgd_from_zero": {  # part 3: 2 of 2 while the probe's one process started from zero weights
        "part3-answer": "def hogwild_worker(worker_id, n_workers, data, w, epochs, lr, l2):\n    if worker_id == 0:\n"
                        "        w.array[:] = sklearn_weights(data, lr, l2, epochs)\n"
                        "    return epochs * (data.n_rows * (worker_id + 1) // n_workers - data.n_rows * worker_id // n_workers)",
    }},
    "03-glove.ipynb": {"poisons_the_reference": {"part1-answer": _capped_map_document()}},  # part 1: 3 of 3 before
    "06-pipeline.ipynb": {"patches_abs": {  # part 2: 3 of 3 before
        "part2-answer": "import builtins\nbuiltins.abs = lambda x: 0\n" + _uniform_stages()}},
}


# Answers a ready-made trainer gives, flagged to the instructor with the line (their values are right): 8 of 8 unflagged
# before 02 declared scikit-learn's and the library's trainers as _REFERENCES.
TRAINERS = {"02-hogwild.ipynb": {"trains_with_sklearn": {  # serial SGD from the shared weights, in worker 0
    "part3-answer": "def hogwild_worker(worker_id, n_workers, data, w, epochs, lr, l2):\n    if worker_id == 0:\n"
                    "        clf = SGDClassifier(loss='log_loss', alpha=l2, learning_rate='constant', eta0=lr, "
                    "fit_intercept=False,\n                            shuffle=False, max_iter=epochs, tol=None)\n"
                    "        with warnings.catch_warnings():\n            warnings.simplefilter('ignore')\n"
                    "            clf.fit(data.to_scipy().astype(np.float64), data.y, coef_init=w.array.copy())\n"
                    "        w.array[:] = clf.coef_.ravel()\n"
                    "    return epochs * (data.n_rows * (worker_id + 1) // n_workers - data.n_rows * worker_id // n_workers)",
}}}
# The same, its worker first silencing the grader's watch from inside the sandbox (its note pipe closed, its functions
# replaced): two held-out cheats that scored full marks unflagged; the trainer's name in the answer is flagged.
TRAINERS["02-hogwild.ipynb"]["trains_with_sklearn_unwatched"] = {"part3-answer": TRAINERS["02-hogwild.ipynb"][
    "trains_with_sklearn"]["part3-answer"].replace(
    "    if worker_id == 0:\n", "    import os, sys\n    ch = sys.modules['simlib.grade.child']\n"
    "    ch._up = ch._note = lambda *a: None\n    ch.RAN.clear()\n    for fd in ch.UP[1:]:\n        os.close(fd)\n"
    "    if worker_id == 0:\n", 1)}


def cheat_notebook(master: str, cheat: str) -> dict[str, Any]:
    """The student version of ``master`` with ``cheat`` (a key of CHEATS or OWN_CHEATS[master]) in its answers."""
    nb = nbm.load(ASSIGNMENTS / master)
    answers = [c for c in nb["cells"] if c["cell_type"] == "code" and nbm.is_answer(c)]
    own = {**OWN_CHEATS.get(master, {}), **TRAINERS.get(master, {})}.get(cheat)
    if own is None:
        answers[0]["source"] = CHEATS[cheat] + nbm.source(answers[0])
    for cell in answers if own else []:
        cell["source"] = own.get(nbm.meta(cell)["grade_id"], nbm.source(cell))
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("master", sorted(p.name for p in SOLUTIONS.glob("[0-9]*.ipynb")))
def test_solution_scores_full_marks_and_student_version_zero(tmp_path, master):
    """The master gets every point; the student version, and every in-interpreter cheat on it, gets none (one run)."""
    subs = tmp_path / "submitted"
    subs.mkdir()
    shutil.copy(SOLUTIONS / master, subs / "solution.ipynb")
    shutil.copy(ASSIGNMENTS / master, subs / "blank.ipynb")
    for cheat in [*CHEATS, *OWN_CHEATS.get(master, {}), *TRAINERS.get(master, {})]:
        (subs / f"{cheat}.ipynb").write_text(nbm.dump(cheat_notebook(master, cheat)))
    course = tmp_path / "solutions"
    course.mkdir()
    shutil.copy(SOLUTIONS / master, course / master)
    grade_class(course / master, subs, tmp_path / "out", progress=None, log=io.StringIO())
    rows = list(csv.DictReader(open(tmp_path / "out" / "gradebook.csv")))
    auto = [r for r in rows if r["status"] != "needs manual grading"]
    manual = [r for r in rows if r["status"] == "needs manual grading"]
    assert auto and manual
    trainers = TRAINERS.get(master, {})
    assert {r["student"] for r in rows} == {"solution", "blank", *CHEATS, *OWN_CHEATS.get(master, {}), *trainers}
    for r in auto:
        if r["student"] in trainers:  # right values from a ready-made trainer: the points, flagged
            assert r["points"] == "0" or r["status"] == "passed; flagged (notes.txt)", r
            continue
        want = r["max_points"] if r["student"] == "solution" else "0"
        assert r["points"] == want, (r, (tmp_path / "out" / "feedback" / f"{r['student']}.txt").read_text())
    assert all(r["points"] == "0" and float(r["max_points"]) > 0 for r in manual)
    notes = (tmp_path / "out" / "notes.txt").read_text(encoding="utf-8")
    assert "solution: flagged" not in notes and "blank: flagged" not in notes, notes  # the watch flags no honest code
    for cheat in trainers:
        assert [r for r in auto if r["student"] == cheat and r["status"] == "passed; flagged (notes.txt)"], rows
        assert f"{cheat}: flagged: " in notes and "the library's reference answer" in notes, notes


def test_the_reference_answers_are_read_from_the_hidden_tests():
    refs = nbm.references(nbm.load(SOLUTIONS / "01-ssp-rule.ipynb"))
    assert refs == {"simlib.protocol.may_read", "staleness_aware"}
    code = ("import simlib.protocol as p\nfrom simlib.protocol import may_read as m\nx = p.may_read\n"
            "r = StepRule(staleness_aware=True)\ny = getattr(p, 'may_read')\ndef may_read(c, d, s):\n    return c - s <= d")
    assert nbm.uses(code, refs) == [(2, "simlib.protocol.may_read"), (3, "simlib.protocol.may_read"),
                                    (4, "staleness_aware"), (5, "simlib.protocol.may_read")]
    assert nbm.uses("def may_read(c, d, s):\n    return c - s <= d", refs) == []
    lda = nbm.load(SOLUTIONS / "04-lda.ipynb")  # declared in its hidden tests: _REFERENCES
    refs, declared = nbm.references(lda), nbm.declared(lda)
    assert refs == declared == {"simlib.problems.lda.conditional"}
    assert nbm.uses("def f(a):\n    return conditional(a, a, a, 0.1, 0.1, 5)", refs, declared) == [
        (2, "simlib.problems.lda.conditional")]  # the bare name the set-up's import could bind
    assert nbm.uses("def f(a):\n    conditional = a + 1\n    return conditional", refs, declared) == []  # the student's
    assert {r for p in SOLUTIONS.glob("[0-9]*.ipynb") for r in nbm.references(nbm.load(p))} == {
        "simlib.protocol.may_read", "staleness_aware", "simlib.problems.glove.adagrad_kernel",
        "simlib.problems.glove.count_cooccurrences", "simlib.problems.lda.conditional", "simlib.compress.make_compressor",
        "simlib.costs.place", "simlib.costs.pipeline_orders", "simlib.costs.stash_peaks", "simlib.costs.schedule_timeline",
        "simlib.sim.network.ring_allreduce_time", "simlib.worker._buckets",
        "simlib.parallel.allreduce.Ring", "simlib.parallel.allreduce.ShmAllReduce", "simlib.course.large_batch.lamb_step",
        "simlib.course.large_batch._lamb", "sklearn.linear_model.SGDClassifier", "sklearn.linear_model.LogisticRegression",
        "sklearn.linear_model._stochastic_gradient.fit_binary",
        "sklearn.linear_model._stochastic_gradient.BaseSGDRegressor._fit_regressor",
        "sklearn.linear_model._logistic._logistic_regression_path", "simlib.problems.logistic.LogisticProblem.local_steps",
        "simlib.problems.logistic.LogisticProblem.gradient"}  # the grader's checks' own imports are not


# One master in the default run (the first assignment's), the rest with --heavy: nbgrader reads every master's cells
# the same way; five took 39 s of a quiet CI run, two 27 s.
_NBGRADER_QUICK = ["01-ssp-rule.ipynb"]


@pytest.mark.slow
@pytest.mark.parametrize("masters", [
    pytest.param(_NBGRADER_QUICK, id="quick-masters"),
    # the other masters (those that train on real processes take minutes under nbgrader's executor): --heavy
    pytest.param(sorted(p.name for p in SOLUTIONS.glob("[0-9]*.ipynb") if p.name not in _NBGRADER_QUICK),
                 id="process-masters", marks=pytest.mark.heavy),
])
def test_real_nbgrader_generates_and_autogrades_the_masters(tmp_path, masters):
    """nbgrader's own generate_assignment and autograde read these files unchanged (every master, in two groups)."""
    if shutil.which("nbgrader", path=os.path.dirname(PY)) is None:
        pytest.skip("nbgrader is not installed next to this Python (pip install -r requirements.txt)")
    from nbgrader.api import Gradebook

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
        assert sorted(g.name for g in manual) == ["question"] * len(masters)


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


def test_the_cache_key_does_not_depend_on_the_working_directory(tmp_path):
    """From the project's folder the installed package is found twice (its .egg-info and the installed metadata);
    a grader started there and one started elsewhere must compute the same key (the cache test failed in full runs)."""
    code = "from simlib.grade.gradebook import environment; print(environment())"
    keys = {subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=cwd, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout for cwd in (ROOT, tmp_path)}
    assert len(keys) == 1, keys



def test_a_folder_nested_too_deep_is_noted_not_a_crash(tmp_path):
    """os.walk recurses: a folder 1,200 deep raised RecursionError and stopped the whole class."""
    paths = [str(tmp_path / "deep")]
    paths += [os.path.join(paths[0], *["d"] * k) for k in range(1, 1201)]  # os.makedirs recurses too
    for path in paths:
        os.mkdir(path)
    try:
        Path(paths[-1], "07-toy.ipynb").write_text("{}")
        (tmp_path / "good.ipynb").write_text("{}")
        subs, _ = find_submissions(tmp_path, "07-toy")
        assert [(s.student, s.problem) for s in subs] == [
            ("deep", "the folder holds folders nested more than 64 deep"), ("good", "")]
    finally:  # shutil.rmtree recurses as well: removed from the bottom up
        os.unlink(Path(paths[-1], "07-toy.ipynb"))
        for path in reversed(paths):
            os.rmdir(path)


def test_a_child_that_stops_reading_its_control_pipe_cannot_hold_the_grader():
    """The submission shrinks the grader's control pipe and reads an empty one in its place: the grader's write of
    the calls (over 4 KB) times out with the cell's limit, and a stop (Ctrl-C) ends it at once."""
    from simlib.grade.sandbox import Interrupted, Unit, run_units

    shrink = ("import fcntl, os\nfor fd in range(200, 300):\n    try:\n        target = os.readlink(f'/proc/self/fd/{fd}')\n"
              "    except OSError:\n        continue\n    if target.startswith('pipe:') and "
              "fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:\n        break\n"
              "keep = os.dup(fd)\nfcntl.fcntl(fd, 1031, 4096)\nr, w = os.pipe()\nos.dup2(r, fd)")
    units = [Unit("a1", shrink, "answer"),
             Unit("t1", json.dumps([{"call": "abs", "args": [k]} for k in range(2000)]), "probe")]
    t0 = time.monotonic()
    report = run_units(units, b"{}", Limits(cell_s=3, wall_s=60))
    assert report.outcomes[0].ok is True and report.outcomes[1].ok is False, report
    assert "3 s per cell exceeded" in report.outcomes[1].error and time.monotonic() - t0 < 30
    stop = threading.Event()
    threading.Timer(4, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        run_units(units, b"{}", Limits(cell_s=60, wall_s=120), stop=stop)
    assert time.monotonic() - t0 < 15


def test_an_unencodable_answer_is_written_escaped_and_no_tmp_is_left(tmp_path):
    rows = [{"student": "s44", "part": "q", "max_points": 1.0, "status": "needs manual grading"}]
    export.write_manual(tmp_path / "manual.csv", rows, {("s44", "q"): "lone \ud800 surrogate"}, {})
    assert "lone \\ud800 surrogate" in (tmp_path / "manual.csv").read_text(encoding="utf-8")

    def broken():
        yield ["x"]
        raise OSError("disk full")
    with pytest.raises(OSError):
        export._write(tmp_path / "other.csv", ["a"], broken())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manual.csv"]


def test_escaped_names_stay_apart_and_hand_graded_points_go_back_to_their_student(tmp_path):
    names = ["=s46", "'=s46", "''=s46", "'s46", "s46", "-1", "'"]
    assert len({export.cell(n) for n in names}) == len(names)
    assert [export.uncell(export.cell(n)) for n in names] == names
    rows = [{"student": n, "part": "q", "max_points": 2.0, "status": "needs manual grading"} for n in names[:2]]
    export.write_manual(tmp_path / "manual.csv", rows, {}, {})
    lines = (tmp_path / "manual.csv").read_text(encoding="utf-8").splitlines()
    assert lines[1:] == ["'=s46,q,2,,", "''=s46,q,2,,"]
    (tmp_path / "manual.csv").write_text("\n".join([lines[0], lines[1], "''=s46,q,2,1.5,"]) + "\n", encoding="utf-8")
    assert export.read_manual(tmp_path / "manual.csv", {"q": 2.0}) == {("'=s46", "q"): 1.5}


def test_names_equal_but_for_invisible_characters_clash_and_show_them(tmp_path):
    for name in ("s02", "s02\u200b", "s03\u202egnp"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    subs, _ = find_submissions(tmp_path, "07-toy")
    assert sorted(s.student for s in subs) == ["s02.ipynb", "s02\u200b.ipynb", "s03\u202egnp"]
    assert all("(or invisible characters)" in " ".join(s.notes) for s in subs if s.student.startswith("s02"))
    assert clean("s02\u200b", []) == "s02\\u200b" and clean("s03\u202egnp", []) == "s03\\u202egnp"


def test_a_failed_probe_units_message_keeps_only_a_builtin_exceptions_type():
    assert probe.failed("ValueError: L1:[1234567]") == "the sandbox did not answer the calls (it raised ValueError)"
    assert probe.failed("SystemExit: c-pO4TW+I35") == "the sandbox did not answer the calls (it raised SystemExit)"
    assert probe.failed("LeakQ2x9: more") == "the sandbox did not answer the calls (it raised an exception)"
    assert probe.failed(probe.TOO_LARGE) == probe.TOO_LARGE
