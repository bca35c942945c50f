"""Time every lesson from a fresh kernel, cold (empty numba cache) and warm, against the 60 s goal.

Each lesson runs top to bottom in its own fresh kernel, in default mode (``SIMLIB_QUICK`` unset)
unless ``--quick``. The cold run points ``NUMBA_CACHE_DIR`` at a new empty folder, so every
compiled kernel the lesson uses is compiled again, as on a student's first run; the warm run
reuses that folder. The time includes starting the kernel. Prints one row per lesson:

    lesson                            cold (s)  warm (s)  goal 60 s  slowest cell (warm)
    01-simulator                          21.0      12.3  ok         [13] 6.1 s

    python benchmarks/lessons.py                      # every lesson, cold and warm
    python benchmarks/lessons.py 07 10-calibration    # some lessons (number or name)
    python benchmarks/lessons.py --warm-only --cells  # warm only; per-cell times too
    python benchmarks/lessons.py --load 2             # with two busy loops beside it (a student's busy laptop)

Timings depend on what else the machine is doing: the script prints the load average before
and after, and a lesson's row should be read against it. ``--load N`` starts N busy loops (one
process each, spinning on a core) for the whole run and stops them at the end: every lesson's
checks must still hold, and each lesson should stay within the goal.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from record import record

ROOT = pathlib.Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
GOAL_S = 60.0


def lesson_paths(names: list[str]) -> list[pathlib.Path]:
    """The lesson notebooks named by number ('07') or stem ('07-lda'); all numbered ones if none."""
    every = sorted(p for p in LESSONS.glob("[0-9][0-9]-*.ipynb"))
    if not names:
        return every
    chosen = []
    for n in names:
        hits = [p for p in every if p.stem == n or p.stem.split("-", 1)[0] == n]
        if not hits:
            raise ValueError(f"lessons: no lesson named {n!r}; choose from {[p.stem for p in every]}")
        chosen += hits
    return chosen


def run_lesson(path: pathlib.Path, numba_cache: str | None, quick: bool,
               timeout: int) -> tuple[float, list[tuple[int, float]], str]:
    """Execute ``path`` in a fresh kernel; return (seconds, (cell index, seconds) per code cell, error or '').

    ``numba_cache`` None keeps numba's usual cache (``__pycache__`` beside the library).
    """
    import warnings

    import nbclient
    import nbformat

    with warnings.catch_warnings():  # a cell without an id is not this benchmark's concern
        warnings.simplefilter("ignore")
        nb = nbformat.read(str(path), as_version=4)
    env_before = dict(os.environ)
    if numba_cache is not None:
        os.environ["NUMBA_CACHE_DIR"] = numba_cache  # the kernel inherits this process's environment
    os.environ["MPLBACKEND"] = "Agg"
    if quick:
        os.environ["SIMLIB_QUICK"] = "1"
    else:
        os.environ.pop("SIMLIB_QUICK", None)
    work = tempfile.mkdtemp(prefix="lesson-run-")
    cell_times: list[float] = []
    error = ""
    try:
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                         resources={"metadata": {"path": work}})
        t0 = time.perf_counter()
        try:
            with client.setup_kernel():
                for i, cell in enumerate(nb.cells):
                    if cell.cell_type != "code":
                        continue
                    c0 = time.perf_counter()
                    client.execute_cell(cell, i)
                    cell_times.append((i, time.perf_counter() - c0))
        except Exception as exc:  # a failing lesson is reported in its row, the others still run
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:120] if str(exc).strip() else ''}"
        seconds = time.perf_counter() - t0
    finally:
        os.environ.clear()
        os.environ.update(env_before)
        shutil.rmtree(work, ignore_errors=True)
    return seconds, cell_times, error


@contextlib.contextmanager
def busy_loops(n: int):
    """``n`` processes spinning on a core each while the block runs; stopped (and reaped) when it ends."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield loops
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()


# The lesson whose cold run beside busy loops is the README's row: the slowest one, with its Ray cell.
HEADLINE_LESSON = "02-parameter-server"


def main(argv: list[str] | None = None) -> int:
    """Print the table; return 1 if a lesson failed, else 0 (being over the goal is reported, not an error)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lessons", nargs="*", help="lesson numbers or names (default: all)")
    ap.add_argument("--quick", action="store_true", help="set SIMLIB_QUICK=1 (what CI runs) instead of default mode")
    ap.add_argument("--warm-only", action="store_true",
                    help="one run per lesson with numba's usual cache (warm after any earlier run), no cold run")
    ap.add_argument("--cells", action="store_true", help="also print each lesson's code-cell times (warm run)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    ap.add_argument("--load", type=int, default=0, metavar="N", help="run N busy loops beside the lessons")
    args = ap.parse_args(argv)
    try:
        paths = lesson_paths(args.lessons)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    if not 0 <= args.load <= 64:
        print("load must be a number of busy loops from 0 to 64", file=sys.stderr)
        return 2
    with busy_loops(args.load):
        return _run(args, paths)


def _run(args: argparse.Namespace, paths: list[pathlib.Path]) -> int:
    """Time the lessons and print the table (see :func:`main`)."""
    mode = "quick (SIMLIB_QUICK=1)" if args.quick else "default mode"
    print(f"{len(paths)} lessons, {mode}, {args.load} busy loops, {os.cpu_count()} cores, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    header = f"{'lesson':34s} {'cold (s)':>9s} {'warm (s)':>9s}  {'goal 60 s':10s} slowest cell (warm)"
    print(header)
    print("-" * len(header))
    failed = False
    details = []
    for path in paths:
        if args.warm_only:
            cold, err_cold = 0.0, ""
            warm, cells, err_warm = run_lesson(path, None, args.quick, args.timeout)
        else:
            cache = tempfile.mkdtemp(prefix="numba-cache-")
            try:
                cold, _, err_cold = run_lesson(path, cache, args.quick, args.timeout)
                warm, cells, err_warm = run_lesson(path, cache, args.quick, args.timeout)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        err = err_cold or err_warm
        failed |= bool(err)
        worst = max(cold, warm)
        verdict = "FAILED" if err else ("ok" if worst < GOAL_S else f"over {worst / GOAL_S:.1f}x")
        slow = max(cells, key=lambda c: c[1]) if cells else (-1, 0.0)
        cold_s = "-" if args.warm_only else f"{cold:9.1f}"
        print(f"{path.stem:34s} {cold_s:>9s} {warm:9.1f}  {verdict:10s} [{slow[0]}] {slow[1]:.1f} s"
              + (f"  {err}" if err else ""), flush=True)
        details.append((path.stem, cells))
        if not err and not args.warm_only and not args.quick:
            record(__file__, f"lesson {path.stem}, cold" + (f", {args.load} busy loops beside it" if args.load else ""),
                   f"the {GOAL_S:g} s goal per lesson", GOAL_S / cold, "time",
                   headline=bool(args.load) and path.stem == HEADLINE_LESSON)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.cells:
        for stem, cells in details:
            print(f"\n{stem}: " + ", ".join(f"[{i}] {t:.1f}" for i, t in cells))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
