"""How fast is the simulator? Its event rate against bare SimPy, and how it scales from 10^2 to 10^6 workers.

Prints two tables:
  * the peer: bare SimPy (N processes x M timeouts) against the simulator's machinery with a problem
    whose gradient is free (null math), same number of events;
  * the scaling table: the default logistic problem (10^4 features), 100 steps per worker, BSP, SSP(3)
    and async, at 10^2, 10^3, 10^4 workers with real math and at 10^4, 10^5 (and 10^6 x 10 steps) cost-only
    (``SimConfig(cost_only=True, step_keys=500)``: no math, each step charged its modelled time and
    500 keys each way, about a batch's). Each run is a fresh subprocess, so peak memory is its own:
    wall seconds, CPU seconds, peak RSS.
Goals: 10^4 workers real math < 30 CPU s per protocol; 10^5 cost-only < 60 s and 4 GB; 10^6 cost-only x 10 steps
< 60 s and 8 GB (a row of its own: ``--min-workers 1000000`` runs it alone, about 2 minutes).
The machine's load average is printed before and after: on a shared machine CPU seconds rise with it.

    python benchmarks/sim_speed.py                      # everything (about 10 minutes on 2 idle cores)
    python benchmarks/sim_speed.py --max-workers 1000   # a quick run
    python benchmarks/sim_speed.py --min-workers 10000 --max-workers 10000 --mode real --no-peer
                                                        # the 10^4 real-math rows alone (about 2 minutes)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np
import simpy
from record import record

STEPS = 100
STEP_KEYS = 500
PROTOCOLS = ("bsp", "ssp:3", "async")
GOAL_REAL_CPU, GOAL_COST_CPU, GOAL_COST_GB = 30.0, 60.0, 4.0
MILLION, MILLION_STEPS, GOAL_MILLION_GB = 1_000_000, 10, 8.0  # issue 48: 10^6 workers x 10 steps < 60 s and 8 GB


class NullProblem:
    """The parameter-server contract with free math: 8 fixed keys per batch, zero gradient."""

    metric, lower_is_better, n_params = "loss", True, 64

    def init_params(self, xp=np):
        return xp.zeros(self.n_params)

    def shards(self, n):
        return [(0, 1)] * n

    def batch(self, shard, step, batch_size):
        return step

    def keys(self, batch):
        return np.arange(8)

    def work(self, batch):
        return 100

    def step(self, values, batch, keys, lr):
        return keys, np.zeros(len(keys))

    def quality(self, w):
        return 0.0


def bare_simpy(n_procs: int, n_timeouts: int) -> float:
    """CPU seconds for n_procs processes each yielding n_timeouts timeouts."""
    env = simpy.Environment()

    def proc(env):
        for _ in range(n_timeouts):
            yield env.timeout(1.0)

    for _ in range(n_procs):
        env.process(proc(env))
    t = time.process_time()
    env.run()
    return time.process_time() - t


def peer_table(workers: int, steps: int, repeats: int) -> None:
    """Events per CPU second: bare SimPy against the simulator with null math (medians of ``repeats``)."""
    from simlib.sim import SimConfig
    from simlib.sim.engine import run_config

    cfg = SimConfig(n_workers=workers, steps=steps, protocol="bsp", lr=0.01, eval_every=10)
    runs = []
    for _ in range(repeats):
        t = time.process_time()
        run = run_config(cfg, NullProblem())
        runs.append((run.env.scheduled, time.process_time() - t))
    events, sim_s = runs[0][0], float(np.median([r[1] for r in runs]))
    bare_s = float(np.median([bare_simpy(workers, max(events // workers, 1)) for _ in range(repeats)]))
    print(f"peer: {workers} workers x {steps} BSP steps, null math, {events} events; medians of {repeats}")
    print(f"{'run':34s} {'CPU s':>7s} {'events/s':>10s} {'vs SimPy':>9s}")
    print(f"{'bare SimPy: timeouts':34s} {bare_s:7.2f} {events / bare_s:10.0f} {1.0:8.2f}x")
    print(f"{'simlib BSP, null math':34s} {sim_s:7.2f} {events / sim_s:10.0f} {bare_s / sim_s:8.2f}x")
    record(__file__, f"simulator machinery, null math ({workers:,} workers)", "bare SimPy, the same timeouts",
           bare_s / sim_s, "events per CPU second", headline=True)


def one(workers: int, mode: str, protocol: str, steps: int) -> dict:
    """One run in this process: the default problem, ``mode`` 'real' or 'cost-only'; seconds and peak RSS."""
    import simlib
    from simlib.sim import default_problem

    problem = default_problem()
    extra = dict(cost_only=True, step_keys=STEP_KEYS) if mode == "cost-only" else {}
    simlib.run(problem, "bsp", substrate="sim", n_workers=2, steps=2, **extra)  # the compiled kernels loaded first
    # lr: the sum of n gradients makes one BSP step, so the step shrinks with n (the run must not diverge).
    wall, cpu = time.perf_counter(), time.process_time()
    trace = simlib.run(problem, protocol, substrate="sim", n_workers=workers, steps=steps, lr=min(0.5, 10 / workers),
                       eval_every=10, **extra).trace
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    final = trace.quality[-1].value if trace.quality else float("nan")
    return {"wall": wall, "cpu": cpu, "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "updates": len(trace.updates), "spans": len(trace.spans), "final_loss": final}


def scaling_table(max_workers: int, steps: int, min_workers: int = 0, modes: tuple = ("real", "cost-only")) -> list[tuple]:
    sizes = ([(n, "real", steps) for n in (100, 1_000, 10_000)] + [(n, "cost-only", steps) for n in (10_000, 100_000)]
             + [(MILLION, "cost-only", MILLION_STEPS)])
    sizes = [size for size in sizes if min_workers <= size[0] <= max_workers and size[1] in modes]
    rows = []
    print("\nscaling: default logistic problem (10^4 features); each run a fresh process")
    print(f"{'workers':>9s} {'mode':10s} {'steps':>6s} {'protocol':9s} {'wall s':>8s} {'CPU s':>8s} {'peak GB':>8s} "
          f"{'updates':>10s} {'final loss':>10s}")
    for n, mode, n_steps in sizes:
        for proto in PROTOCOLS:
            out = subprocess.run([sys.executable, __file__, "--one", str(n), mode, proto, str(n_steps)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((n, mode, proto, r))
            loss = "-" if r["final_loss"] != r["final_loss"] else f"{r['final_loss']:.4f}"
            print(f"{n:9d} {mode:10s} {n_steps:6d} {proto:9s} {r['wall']:8.1f} {r['cpu']:8.1f} {r['rss_gb']:8.2f} "
                  f"{r['updates']:10d} {loss:>10s}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-workers", type=int, default=MILLION, help="largest worker count of the scaling table")
    ap.add_argument("--min-workers", type=int, default=0, help="smallest worker count of the scaling table")
    ap.add_argument("--mode", choices=("real", "cost-only", "both"), default="both",
                    help="the scaling table's rows with real math, cost-only, or both")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer table (bare SimPy against null math)")
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per worker in the scaling table")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the peer table's runs")
    ap.add_argument("--one", nargs=4, metavar=("WORKERS", "MODE", "PROTOCOL", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        n, mode, proto, steps = args.one
        print(json.dumps(one(int(n), mode, proto, int(steps))))
        return
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"SimPy {simpy.__version__}; load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if not args.no_peer:
        peer_table(min(args.max_workers, 1_000), 20, args.repeats)
    modes = ("real", "cost-only") if args.mode == "both" else (args.mode,)
    rows = scaling_table(args.max_workers, args.steps, args.min_workers, modes)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for n, mode, n_steps, cpu, gb in ((10_000, "real", STEPS, GOAL_REAL_CPU, None),
                                      (100_000, "cost-only", STEPS, GOAL_COST_CPU, GOAL_COST_GB),
                                      (MILLION, "cost-only", MILLION_STEPS, GOAL_COST_CPU, GOAL_MILLION_GB)):
        got = [r for m, md, _, r in rows if m == n and md == mode]
        if not got or (n < MILLION and args.steps != STEPS):
            continue
        met = all(r["cpu"] < cpu and (gb is None or r["rss_gb"] < gb) for r in got)
        goal = f"< {cpu:g} CPU s" + ("" if gb is None else f" and {gb:g} GB")
        cpus = ", ".join(f"{r['cpu']:.1f}" for r in got)
        print(f"goal {n:,} workers {mode} x {n_steps} steps {goal} per protocol: {'met' if met else 'NOT met'} "
              f"(CPU {cpus} s, peak {max(r['rss_gb'] for r in got):.2f} GB)")


if __name__ == "__main__":
    main()
