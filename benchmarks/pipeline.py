"""Pipeline parallelism on 2 processes against its formula and its cost model, m = 1 .. 16 micro-batches.

For each m and schedule (GPipe, 1F1B) one training step of an MLP on digits is run on two stage processes
(``simlib.modelpar.run_pipeline``); the table gives the measured idle share beside the bubble formula
(p - 1) / (m + p - 1), and the measured step time beside the cost model's (``simlib.costs.schedule_timeline``,
priced with the forward, backward and transfer times measured in the same run). Exits 1 if an idle share is off
the formula by more than ``--idle-bound`` (share points) or a prediction off by more than ``--bound`` (relative).

    python benchmarks/pipeline.py                  # 2 stages, m = 1 .. 16, hidden width 512, batch 1024
    python benchmarks/pipeline.py --quick          # m = 1, 2, 4, 8, 16, recording nothing
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import record  # noqa: E402

from simlib import costs  # noqa: E402
from simlib.modelpar import balanced_mlp, run_pipeline, split_layers  # noqa: E402
from simlib.problems.mlp import MLPProblem  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Print the table; return 0 if every row is within both bounds, else 1."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=512, help="hidden width (layers are about width x width)")
    ap.add_argument("--batch", type=int, default=1024, help="rows per training step (digits has 1437)")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is a warm-up")
    ap.add_argument("--quick", action="store_true", help="m = 1, 2, 4, 8, 16 only, recording nothing")
    ap.add_argument("--bound", type=float, default=0.25, help="largest allowed |predicted / measured - 1|")
    ap.add_argument("--idle-bound", type=float, default=0.10, help="largest allowed |idle - formula| (share)")
    args = ap.parse_args(argv)
    if not (16 <= args.width <= 4096 and 16 <= args.batch <= 1437 and 2 <= args.steps <= 100):
        print("width must be in [16, 4096], batch in [16, 1437], steps in [2, 100]", file=sys.stderr)
        return 2
    prob, batch = balanced_mlp(args.width), np.arange(args.batch)
    ms = [1, 2, 4, 8, 16] if args.quick else list(range(1, 17))
    load = os.getloadavg()[0]
    print(f"MLP {prob.sizes}, stages {[tuple(r) for r in split_layers(prob, 2)]}, batch {args.batch}, "
          f"load average {load:.1f} on {os.cpu_count()} cores")
    print(f"{'schedule':8s} {'m':>3s} {'formula':>8s} {'idle':>6s} {'off':>6s} {'measured':>9s} {'predicted':>10s} "
          f"{'error':>7s}")
    worst = {name: (0.0, 0.0, []) for name in costs.SCHEDULES}
    for m in ms:
        for name in costs.SCHEDULES:  # back to back, so both see the same load
            run = run_pipeline(prob, batch, stages=2, microbatches=m, schedule=name, steps=args.steps)
            off, err = run.idle_share - costs.pipeline_bubble(2, m), run.predicted / run.step_time - 1
            print(f"{name:8s} {m:3d} {costs.pipeline_bubble(2, m):8.3f} {run.idle_share:6.3f} {off:+6.3f} "
                  f"{run.step_time * 1e3:7.1f}ms {run.predicted * 1e3:8.1f}ms {err:+7.1%}")
            gap, miss, ratios = worst[name]
            worst[name] = (max(gap, abs(off)), max(miss, abs(err)), ratios + [run.predicted / run.step_time])
    print(f"load average now {os.getloadavg()[0]:.1f}")
    ok = True
    for name, (gap, miss, ratios) in worst.items():
        print(f"{name}: idle share within {gap:.3f} of the formula, prediction within {miss:.1%} of the measured step")
        if not args.quick:
            record(__file__, f"pipeline, 2 processes, {name}, m = {ms[0]}..{ms[-1]}, step time",
                   "cost model (simlib.costs.schedule_timeline, same run's costs)", float(np.median(ratios)),
                   "predicted / measured step time (median over m)", idle_gap=round(gap, 3), worst_error=round(miss, 3))
        ok &= gap <= args.idle_bound and miss <= args.bound
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
