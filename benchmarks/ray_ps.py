"""The Ray substrate against the pipe parameter server and shared memory, and the simulator's prediction of it.

One job (sparse logistic regression, BSP, the same steps, batch and step size) runs on
``substrate="ray"``, ``"pipes"`` and ``"shm"`` with 1 and 2 workers. The table lists updates per
second of training (actor and process start-up excluded), bytes moved (pulls + pushes, as the
traces count them) and the final loss. Then the simulator predicts the Ray runs: Ray's
per-message cost is learned by a ping-pong from n caller actors to one echo actor
(:func:`simlib.calibration.ray_cost.ray_message_cost`), the per-step compute by timing the
worker's local work (:func:`~simlib.calibration.ray_cost.step_cost`), and ``substrate="sim"``
runs with that latency, bandwidth and compute model; 'error' is predicted / measured - 1 of the
time until the last worker's last span ends (goal: within 25%). Run::

    python benchmarks/ray_ps.py            # 300 steps per worker
    python benchmarks/ray_ps.py --quick    # 100 steps
"""
from __future__ import annotations

import argparse
import os
import time

import simlib
from simlib.calibration.ray_cost import ray_message_cost, sim_options, step_cost
from simlib.ray_ps import connect
from simlib.problems.logistic import LogisticProblem, make_sparse_classification

BATCH, LR = 64, 0.5


def job(quick: bool) -> LogisticProblem:
    """20 k rows x 10 k features, 20 nonzeros a row: a batch of 64 pulls about 1,100 keys."""
    return LogisticProblem(make_sparse_classification(20_000, 10_000, 20, seed=0), l2=1e-4, eval_rows=2_000)


def row(name: str, n: int, res: simlib.contract.Result) -> dict:
    """One table row from a run's Result."""
    s = res.trace.summary()
    secs = res.measured.get("worker_seconds") or s["makespan"]
    return {"substrate": name, "workers": n, "seconds": secs, "updates/s": len(res.trace.updates) / secs,
            "MB moved": (s["bytes_sent"] + s["bytes_received"]) / 1e6, "loss": res.quality}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 steps per worker instead of 300")
    args = ap.parse_args()
    steps = 100 if args.quick else 300
    prob = job(args.quick)
    import ray

    started = time.perf_counter()
    connect(None, None)  # a local Ray for the whole benchmark (tried again if its node is slow to start)
    print(f"Ray up in {time.perf_counter() - started:.1f} s; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores; {steps} BSP steps per worker, batch {BATCH}")
    try:
        costs = {n: ray_message_cost(callers=n) for n in (1, 2)}
        per_unit, overhead = step_cost(prob, BATCH)
        rows, predictions = [], []
        for n in (1, 2):
            for name in ("ray", "pipes", "shm"):
                opts = {"evaluate": False} if name in ("ray", "pipes") else {}
                res = simlib.run(prob, "bsp", substrate=name, n_workers=n, steps=steps, batch_size=BATCH, lr=LR,
                                 **opts)
                rows.append(row(name, n, res))
                if name == "ray":
                    sim = simlib.run(prob, "bsp", substrate="sim", n_workers=n, steps=steps, batch_size=BATCH,
                                     lr=LR, **sim_options(costs[n], per_unit, overhead))
                    predictions.append((n, sim.trace.makespan, rows[-1]["seconds"]))
    finally:
        ray.shutdown()
    print("\nRay actor call, ping-pong from 1 and 2 caller actors to one echo actor (median of 100 round trips):")
    for k, size in enumerate(costs[1].sizes):
        print(f"  {size:>8,} B  {costs[1].round_trips[k] * 1e6:8.0f} us  {costs[2].round_trips[k] * 1e6:8.0f} us")
    for n, cost in costs.items():
        print(f"  fit, {n} caller{'s' if n > 1 else ''}: latency {cost.latency * 1e6:.0f} us one way, "
              f"bandwidth {cost.bandwidth / 1e6:.0f} MB/s")
    print(f"  step compute {overhead * 1e6:.0f} us + {per_unit * 1e9:.1f} ns per nonzero\n")
    print(f"{'substrate':<10}{'workers':>8}{'seconds':>9}{'updates/s':>11}{'MB moved':>10}{'loss':>9}")
    for r in rows:
        print(f"{r['substrate']:<10}{r['workers']:>8}{r['seconds']:>9.2f}{r['updates/s']:>11.0f}"
              f"{r['MB moved']:>10.2f}{r['loss']:>9.4f}")
    by = {(r["substrate"], r["workers"]): r["updates/s"] for r in rows}
    for n in (1, 2):
        print(f"{n} worker{'s' if n > 1 else ''}: pipes {by['pipes', n] / by['ray', n]:.1f}x, "
              f"shm {by['shm', n] / by['ray', n]:.1f}x the updates/s of ray")
    print(f"\n{'workers':>8}{'predicted s':>13}{'measured s':>12}{'error':>8}")
    for n, pred, meas in predictions:
        print(f"{n:>8}{pred:>13.2f}{meas:>12.2f}{pred / meas - 1:>+8.0%}")


if __name__ == "__main__":
    main()
