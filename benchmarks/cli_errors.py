"""How long a person waits for the command line's answer: `--help` and every bad value's one-line error.

Each case is the real command in a fresh interpreter (`python -m simlib ...`), timed from start to
exit, as a user at a terminal experiences it. The cases are the table of `tests/test_cli_errors.py`.
The peer is the interpreter itself: `python -c pass` and `python -c "import numpy"`, measured in the
same run, so the table says how much of the wait is simlib's.

    python benchmarks/cli_errors.py            # 5 repetitions of --help, 3 of every bad value
    python benchmarks/cli_errors.py --quick    # 3 of --help, 1 of every bad value
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import record

ROOT = Path(__file__).resolve().parents[1]
HELP_GOAL_S = 0.5
ERROR_GOAL_S = 2.0


def bad_cases() -> list[tuple[list[str], str]]:
    """The bad and extreme values of tests/test_cli_errors.py (one table for the test and this script)."""
    spec = importlib.util.spec_from_file_location("cli_error_cases", ROOT / "tests" / "test_cli_errors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BAD


def timed(argv: list[str], cwd: str) -> tuple[float, int]:
    """Seconds from start to exit of one fresh interpreter, and its exit status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=120)
    return time.perf_counter() - start, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    help_reps, bad_reps = (3, 1) if args.quick else (5, 3)
    py = sys.executable
    rows: list[tuple[str, list[float], float | None]] = []
    with tempfile.TemporaryDirectory() as cwd:
        timed([py, "-m", "simlib", "--help"], cwd)  # warm the file cache and bytecode once
        for label, argv, goal in [
            ("peer: python -c pass", [py, "-c", "pass"], None),
            ("peer: python -c 'import numpy'", [py, "-c", "import numpy"], None),
            ("python -m simlib --help", [py, "-m", "simlib", "--help"], HELP_GOAL_S),
            ("python -m simlib compare --help", [py, "-m", "simlib", "compare", "--help"], HELP_GOAL_S),
            ("python -m simlib run --help", [py, "-m", "simlib", "run", "--help"], HELP_GOAL_S),
        ]:
            rows.append((label, [timed(argv, cwd)[0] for _ in range(help_reps)], goal))
        per_case: list[float] = []
        wrong_status = []
        for case, _flag in bad_cases():
            times = []
            for _ in range(bad_reps):
                seconds, status = timed([py, "-m", "simlib", *case], cwd)
                times.append(seconds)
                if status != 2:
                    wrong_status.append((case, status))
            per_case.append(statistics.median(times))
        rows.append((f"{len(per_case)} bad values (median of each)", per_case, ERROR_GOAL_S))

    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.1f} at the end; seconds from start to exit")
    print(f"{'command':<40} {'median':>7} {'max':>7} {'goal':>6}  met")
    print(f"{'-' * 40} {'-' * 7} {'-' * 7} {'-' * 6}  ---")
    for label, times, goal in rows:
        med, worst = statistics.median(times), max(times)
        met = "" if goal is None else ("yes" if worst <= goal else "no")
        goal_text = "" if goal is None else f"{goal:.1f}"
        print(f"{label:<40} {med:7.3f} {worst:7.3f} {goal_text:>6}  {met}")
    medians = {label: statistics.median(times) for label, times, _ in rows}
    bad = next((m for label, m in medians.items() if "bad values" in label), None)
    if bad:
        record(__file__, "a bad command-line value answered (median over the cases)", "python -c 'import numpy'",
               medians["peer: python -c 'import numpy'"] / bad, "time")
    if wrong_status:
        print(f"{len(wrong_status)} case(s) did not exit with status 2, e.g. {wrong_status[0]}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
