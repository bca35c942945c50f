"""The Ray substrate against the pipe parameter server and shared memory, and the simulator's prediction of it.

One job (sparse logistic regression, BSP, the same steps, batch and step size) runs on
``substrate="ray"``, ``"pipes"`` and ``"shm"`` with 1 and 2 workers. The table lists updates per
second of training (actor and process start-up excluded), bytes moved (pulls + pushes, as the
traces count them) and the final loss. Then the simulator predicts the Ray runs: Ray's
per-message cost is learned by a ping-pong to one echo actor
(:func:`simlib.calibration.ray_cost.ray_message_cost`): latency and bandwidth from one caller, the
server's CPU time per call from as many callers as the run has workers; the per-step compute by
timing the worker's local work (:func:`~simlib.calibration.ray_cost.step_cost`). ``substrate="sim"``
runs with that latency, bandwidth and compute model and a server that handles one request at a
time for the server time each (``server_time``), so two workers queue at the coordinator in the
simulation as they do on Ray. The calibration runs just before and just after each Ray run (a busy
machine's load drifts) and the prediction is the mean of the two; nothing is fitted to the runs
predicted. 'error' is predicted / measured - 1 of the time until the last worker's last span ends
(goal: within 25%). Run::

    python benchmarks/ray_ps.py            # 300 steps per worker
    python benchmarks/ray_ps.py --quick    # 100 steps
"""
from __future__ import annotations

import argparse
import os
import time

import simlib
from record import record
from simlib.calibration.ray_cost import ray_message_cost, sim_options, step_cost
from simlib.substrates.ray import connect
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
        per_unit, overhead = step_cost(prob, BATCH)
        rows, predictions, costs = [], [], {}

        def calibrate(n: int) -> list:
            return [ray_message_cost(callers=1)] + ([ray_message_cost(callers=n)] if n > 1 else [])

        def predict(n: int, cal: list) -> float:
            return simlib.run(prob, "bsp", substrate="sim", n_workers=n, steps=steps, batch_size=BATCH, lr=LR,
                              **sim_options(cal[0], per_unit, overhead, busy=cal[-1])).trace.makespan

        for n in (1, 2):
            for name in ("ray", "pipes", "shm"):
                if name == "ray":
                    # Calibrated just before and just after the run it predicts: the machine's load drifts.
                    costs[n, "before"] = calibrate(n)
                opts = {"evaluate": False} if name in ("ray", "pipes") else {}
                res = simlib.run(prob, "bsp", substrate=name, n_workers=n, steps=steps, batch_size=BATCH, lr=LR,
                                 **opts)
                rows.append(row(name, n, res))
                if name == "ray":
                    costs[n, "after"] = calibrate(n)
                    predictions.append((n, predict(n, costs[n, "before"]), predict(n, costs[n, "after"]),
                                        rows[-1]["seconds"]))
    finally:
        ray.shutdown()
    print("\nRay actor calls just before and after each Ray run: pulls and pushes to one server actor, mean round "
          "trip by bytes moved;\nthe fit (latency and bandwidth from 1 caller), the server's CPU time per call and the "
          "server time used")
    print(f"{'':>20}" + "".join(f"{size:>9,} B" for size in costs[1, "before"][0].sizes)
          + f"{'latency':>10}{'bandwidth':>12}{'CPU':>9}{'server':>9}")
    for (n, when), cs in costs.items():
        for c in cs:
            fit = (f"{c.latency * 1e6:>7.0f} us{c.bandwidth / 1e6:>7.0f} MB/s" if c.callers == 1 else f"{'':>22}")
            print(f"{n} worker{'s' if n > 1 else ' '}, {when:<6} {c.callers}c"
                  + "".join(f"{t * 1e6:>8.0f} us" for t in c.round_trips)
                  + fit + f"{c.server_cpu * 1e6:>6.0f} us{c.server_time * 1e6:>6.0f} us")
    print(f"step compute {overhead * 1e6:.0f} us + {per_unit * 1e9:.1f} ns per nonzero\n")
    print(f"{'substrate':<10}{'workers':>8}{'seconds':>9}{'updates/s':>11}{'MB moved':>10}{'loss':>9}")
    for r in rows:
        print(f"{r['substrate']:<10}{r['workers']:>8}{r['seconds']:>9.2f}{r['updates/s']:>11.0f}"
              f"{r['MB moved']:>10.2f}{r['loss']:>9.4f}")
    by = {(r["substrate"], r["workers"]): r["updates/s"] for r in rows}
    for n in (1, 2):
        print(f"{n} worker{'s' if n > 1 else ''}: pipes {by['pipes', n] / by['ray', n]:.1f}x, "
              f"shm {by['shm', n] / by['ray', n]:.1f}x the updates/s of ray")
        record(__file__, f"the Ray substrate, logistic parameter server, {n} worker{'s' if n > 1 else ''}",
               "the pipe parameter server, same job", by["ray", n] / by["pipes", n], "updates/s", headline=n == 2)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print("predicted: the simulator calibrated before the run, after it, and their mean; error of the mean")
    print(f"{'workers':>8}{'before s':>10}{'after s':>9}{'predicted s':>13}{'measured s':>12}{'error':>8}")
    for n, before, after, meas in predictions:
        pred = (before + after) / 2
        print(f"{n:>8}{before:>10.2f}{after:>9.2f}{pred:>13.2f}{meas:>12.2f}{pred / meas - 1:>+8.0%}")

if __name__ == "__main__":
    main()
