"""Grade a class of 30 submissions of one assignment: time per submission and peak memory.

The class: copies of the solution (each made distinct by a trailing newline so the cache does not
serve them) and 4 hostile variants (an infinite loop, a 10 GB allocation, an early exit, a setsid +
double fork left running). Goal: the whole class in under 5 minutes on 2 cores, the master's own
check included; the sandbox used (bubblewrap or the watcher, with or without a cgroup per submission)
is printed.

    python benchmarks/grade.py [ASSIGNMENT] [--students 30]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simlib.grade import cgroup as cgroups  # noqa: E402
from simlib.grade import notebook as nbm  # noqa: E402
from simlib.grade.gradebook import grade_class  # noqa: E402
from simlib.grade.sandbox import Limits, choose  # noqa: E402
from record import record  # noqa: E402

HOSTILE = {
    "loop": "while True:\n    pass",
    "memory": "hog = bytearray(10 * 2**30)",
    "exits": "import os\nos._exit(0)",
    "escapes": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(600)\n"
               "    os._exit(0)",
}


def variant(master: dict, code: str) -> dict:
    """The master with its first answer cell replaced by ``code``."""
    nb = json.loads(json.dumps(master))
    first = next(c for c in nb["cells"] if nbm.is_answer(c) and c["cell_type"] == "code")
    first["source"] = code
    return nb


def build_class(master_path: Path, student_path: Path, folder: Path, n: int) -> None:
    """n submissions: the hostile variants, the rest solutions."""
    master = nbm.load(master_path)
    special = {k: variant(master, v) for k, v in HOSTILE.items()}
    for k, (name, nb) in enumerate(special.items()):
        (folder / f"{k:02d}-{name}.ipynb").write_text(nbm.dump(nb))
    for k in range(len(special), n):
        (folder / f"{k:02d}-solution.ipynb").write_text(nbm.dump(master) + "\n" * k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("assignment", nargs="?", default="01-ssp-rule")
    ap.add_argument("--students", type=int, default=30)
    ap.add_argument("--cell-timeout", type=float, default=10.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="grade-bench-") as tmp:
        tmp = Path(tmp)
        master = tmp / "solutions" / f"{a.assignment}.ipynb"
        master.parent.mkdir()
        shutil.copy(ROOT / "solutions" / master.name, master)
        subs = tmp / "submitted"
        subs.mkdir()
        build_class(master, ROOT / "assignments" / master.name, subs, a.students)
        limits = Limits(cell_s=a.cell_timeout)
        t0 = time.perf_counter()
        rows = grade_class(master, subs, tmp / "out", limits)
        total = time.perf_counter() - t0
        t1 = time.perf_counter()
        grade_class(master, subs, tmp / "out", limits, progress=None)
        cached = time.perf_counter() - t1
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    students = {r["student"] for r in rows}
    print(f"\n{'assignment':<16} {'students':>8} {'total s':>8} {'s/student':>9} {'re-run s':>8} "
          f"{'grader MB':>9} {'sandbox MB':>10}")
    print(f"{a.assignment:<16} {len(students):>8} {total:8.1f} {total / len(students):9.2f} {cached:8.2f} "
          f"{peak_self:9.0f} {peak_child:10.0f}")
    print(f"sandbox: {choose()[0]}, {cgroups.kind()}; cores: {os.cpu_count()}; "
          f"load average {os.getloadavg()[0]:.1f}")
    record(__file__, f"grading {len(students)} submissions of {a.assignment}, sandboxed", "the goal: 5 minutes",
           300 / total, "time", headline=True)
    print(f"goal: {len(students)} submissions in < 300 s on 2 cores -> {'met' if total < 300 else 'NOT met'} "
          "(total includes one run of the master notebook that compiles the library's kernels; "
          "the hostile variants include a loop stopped at the per-cell limit)")


if __name__ == "__main__":
    main()
