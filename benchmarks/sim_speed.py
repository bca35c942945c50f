"""How fast is the simulator? Events per second against bare SimPy, and a 1,000-worker run.

Prints one table:
  * bare SimPy: N processes x M timeouts (the peer, nothing but the event loop);
  * SimPy + the step's NumPy work only: five timeouts per step and nothing but the pull, gradient
    and apply a null step must do -- a ceiling on the ratio any engine can reach;
  * simlib, null math: the same cluster machinery (gates, links, clocks, trace) with a problem
    whose gradient is free, so the ratio isolates the simulator's own overhead; once more with
    the trace's records switched off, to show what recording costs;
  * simlib, real math: the default logistic problem (10^4 features), 1,000 workers x 100 BSP steps.
Goals (issue): simulated events/s >= 0.5x bare SimPy; 1,000 x 100 BSP with real math < 60 s.

    python benchmarks/sim_speed.py            # full
    python benchmarks/sim_speed.py --quick    # 100 workers x 20 steps
"""
from __future__ import annotations

import argparse
import contextlib
import platform
import time

import numpy as np
import simpy

from simlib.sim import SimConfig, default_problem, simulate
from simlib.sim.engine import run_config
from simlib.trace import Trace


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


def bare_simpy(n_procs: int, n_timeouts: int) -> tuple[int, float]:
    """Wall seconds for n_procs processes each yielding n_timeouts timeouts."""
    env = simpy.Environment()

    def proc(env):
        for _ in range(n_timeouts):
            yield env.timeout(1.0)

    for _ in range(n_procs):
        env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return n_procs * n_timeouts, time.perf_counter() - t


def simpy_with_step_math(n_procs: int, n_steps: int) -> tuple[int, float]:
    """A ceiling for any PS worker on SimPy: per step five timeouts and only the step's NumPy work.

    Pull (read the 8 keys' values), gradient (here zeros, as NullProblem's), apply (w[keys] -=
    lr * g): no trace, no clocks, no links, no shards. Whatever an engine adds to this costs on
    top, so this row's ratio bounds every engine's from above.
    """
    env = simpy.Environment()
    w = np.zeros(64)

    def proc(env):
        for step in range(n_steps):
            keys = np.arange(8)
            yield env.timeout(1.0)  # request travels
            values = w[keys].copy()
            yield env.timeout(1.0)  # reply travels
            yield env.timeout(1.0)  # compute
            g = np.zeros(len(keys)) + 0.0 * values
            yield env.timeout(1.0)  # push travels
            w[keys] -= 0.01 * g
            yield env.timeout(1.0)  # the barrier (here a timeout: the cheapest event there is)

    for _ in range(n_procs):
        env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return n_procs * n_steps * 5, time.perf_counter() - t


@contextlib.contextmanager
def trace_records_off():
    """Make Trace.span and Trace.update do nothing, to see what recording costs (a diagnostic only)."""
    span, update = Trace.span, Trace.update
    Trace.span = Trace.update = lambda self, *a, **k: None
    try:
        yield
    finally:
        Trace.span, Trace.update = span, update


def timed(cfg: SimConfig, problem) -> tuple[int, float, object]:
    t = time.perf_counter()
    run = run_config(cfg, problem)
    # SimPy numbers every scheduled event from one counter: its next value is the total.
    return next(run.env._eid), time.perf_counter() - t, run.trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    workers, steps = (100, 20) if args.quick else (1000, 100)
    # lr is small because 1,000 summed gradients make one BSP step; the run must not diverge.
    cfg = SimConfig(n_workers=workers, steps=steps, protocol="bsp", lr=0.01, eval_every=10)

    rows = []
    null_runs = [timed(cfg, NullProblem()) for _ in range(args.repeats)]
    ev = null_runs[0][0]
    null_s = float(np.median([r[1] for r in null_runs]))
    # Bare SimPy does the same number of events as timeouts, spread over the same number of processes.
    bare = [bare_simpy(workers, max(ev // workers, 1)) for _ in range(args.repeats)]
    bare_ev, bare_s = bare[0][0], float(np.median([b[1] for b in bare]))
    floor = [simpy_with_step_math(workers, steps) for _ in range(args.repeats)]
    floor_ev, floor_s = floor[0][0], float(np.median([f[1] for f in floor]))
    with trace_records_off():
        quiet_s = float(np.median([timed(cfg, NullProblem())[1] for _ in range(args.repeats)]))
    problem = default_problem()
    simulate(SimConfig(n_workers=2, steps=2), problem)  # load the compiled kernels before timing
    t0 = time.perf_counter()
    events, real_s, trace = timed(cfg, problem)
    _ = time.perf_counter() - t0

    rows.append(("bare SimPy (peer): timeouts", bare_ev, bare_s, bare_ev / bare_s, 1.0))
    rows.append(("SimPy + the step's NumPy work only (ceiling)", floor_ev, floor_s, floor_ev / floor_s,
                 (floor_ev / floor_s) / (bare_ev / bare_s)))
    rows.append(("simlib BSP, null math", ev, null_s, ev / null_s, (ev / null_s) / (bare_ev / bare_s)))
    rows.append(("simlib BSP, null math, no trace records", ev, quiet_s, ev / quiet_s,
                 (ev / quiet_s) / (bare_ev / bare_s)))
    rows.append((f"simlib BSP, real math (10^4 features)", events, real_s, events / real_s, (events / real_s) / (bare_ev / bare_s)))

    print(f"simulator speed, {workers} workers x {steps} BSP steps; {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, SimPy {simpy.__version__}; medians of {args.repeats} (real math: 1 run)")
    print(f"{'run':46s} {'events':>10s} {'wall s':>8s} {'events/s':>11s} {'vs SimPy':>9s}")
    for name, e, s, rate, ratio in rows:
        print(f"{name:46s} {e:10d} {s:8.2f} {rate:11.0f} {ratio:8.2f}x")
    goal_ratio = rows[2][4] >= 0.5
    goal_wall = real_s < 60 or args.quick
    steps_run = workers * steps
    print(f"trace records cost {(null_s - quiet_s) / steps_run * 1e6:.1f} us per step; the 0.5x goal leaves the "
          f"engine {(ev / (0.5 * bare_ev / bare_s) - floor_s) / steps_run * 1e6:.1f} us per step beyond the ceiling row")
    print(f"goal events/s >= 0.5x SimPy (null math): {'met' if goal_ratio else 'NOT met'}; "
          f"goal {workers} x {steps} real math < 60 s: {'met' if goal_wall else 'NOT met'} ({real_s:.1f} s); "
          f"final loss {trace.quality[-1].value:.4f}")


if __name__ == "__main__":
    main()
