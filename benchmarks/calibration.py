"""Calibrate this machine, then check the simulator's wall-time predictions against real runs.

Prints the calibration (median and IQR of each measured cost) and a table of workload, workers,
predicted seconds, measured seconds (median of repeats), relative error and the two speed-ups;
exits with status 1 if any |error| exceeds ``--bound`` (default 0.25).

    python benchmarks/calibration.py            # full calibration, 5 repeats per run
    python benchmarks/calibration.py --quick    # quick calibration, 3 repeats
    python benchmarks/calibration.py --workloads "ps dense 200k"   # a known gap of the model (exits 1)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from simlib.calibration.calibrate import calibrate
from simlib.calibration.validate import KNOWN_GAPS, WORKLOADS, compare


def main(argv: list[str] | None = None) -> int:
    """Run the check; return 0 if every prediction is within the bound, else 1."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick calibration and 3 repeats")
    ap.add_argument("--repeats", type=int, default=None, help="real runs per workload and worker count")
    ap.add_argument("--bound", type=float, default=0.25, help="largest allowed |relative error|")
    ap.add_argument("--workloads", nargs="*", default=None,
                    help=f"names among {list(WORKLOADS)} (the default: all of them) and the model's known gaps "
                         f"{list(KNOWN_GAPS)}")
    args = ap.parse_args(argv)
    if not (0 < args.bound < 10):
        print("bound must be a number in (0, 10)", file=sys.stderr)
        return 2
    names = args.workloads or list(WORKLOADS)
    every = {**WORKLOADS, **KNOWN_GAPS}
    unknown = [n for n in names if n not in every]
    if unknown:
        print(f"workloads: unknown {unknown}; choose from {list(every)}", file=sys.stderr)
        return 2
    repeats = args.repeats or (3 if args.quick else 5)
    t0 = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cal = calibrate(quick=args.quick)
    print(cal)
    print()
    result = compare([every[n] for n in names], workers=(1, 2), repeats=repeats, cal=cal)
    print(result.table(bound=args.bound))
    print()
    for name, share in result.loads.items():
        print(f"CPU share around '{name}': " + ", ".join(f"{n} busy: {s.median:.2f}" for n, s in share.items()))
    worst = result.max_error()
    print(f"\nlargest |error| {worst:.1%} (bound {args.bound:.0%}); load average {load:.2f} at start; "
          f"{time.perf_counter() - t0:.1f} s in all on {os.cpu_count()} cores")
    return 0 if worst <= args.bound else 1


if __name__ == "__main__":
    sys.exit(main())
