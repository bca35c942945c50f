"""Shotgun on real processes: P coordinate updates per round, computed against the same x, applied together.

The state lives in shared memory: the columns ``At`` (read-only), the iterate ``x``, the residual
r = A x - y, the schedule, and one slot per coordinate of the round for its delta. Each round has
two phases separated by barriers:

1. *compute*: worker w computes delta_j = S(x_j - A_j . r, l1) - x_j for the round's slots
   w, w + N, w + 2N, ... (reads x and r, writes only its own delta slots);
2. *apply*: worker w adds its slots' deltas to x and updates its own block of rows of the
   residual, r[rows_w] += sum_j delta_j A_j[rows_w] (every row written by exactly one worker).

So the number of coordinates per round (P, the algorithm) is independent of the number of
processes (N, the hardware), and the result equals the serial reference
:func:`simlib.problems.lasso.shotgun` on the same schedule up to floating-point summation order.

Example (run under ``if __name__ == "__main__":`` on spawn platforms)::

    >>> from simlib.problems.lasso import make_lasso, random_schedule
    >>> prob = make_lasso(n_rows=200, n_features=100, n_nonzero=10, seed=0)
    >>> run, trace = run_shotgun(prob, random_schedule(100, 4, 300, seed=0), n_workers=2)
    >>> round(float(run.objective[-1]), 4)
    6.9389
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.parallel.group import WorkerGroup
from simlib.parallel.shm import SharedArray
from simlib.parallel.worker import current
from simlib.problems.lasso import LassoProblem, ShotgunRun, check_schedule, soft_threshold
from simlib.trace import Trace


def run_shotgun(problem: LassoProblem, schedule: np.ndarray, n_workers: int = 2, record_every: int = 10,
                blowup: float = 1e6, start_method: str | None = None,
                timeout: float | None = 600.0) -> tuple[ShotgunRun, Trace]:
    """Run the rounds of ``schedule`` ((rounds, P) coordinate ids, -1 = empty slot) on N processes.

    Returns the objective every ``record_every`` rounds (as :class:`ShotgunRun`) and the group's
    trace (compute and wait spans per worker, quality recorded by worker 0). The run stops early,
    in every worker at the same round, once F exceeds ``blowup`` x F(0) (``diverged``).
    """
    check.positive_int("n_workers", n_workers)
    check.positive_int("record_every", record_every)
    check.positive("blowup", blowup)
    schedule = check_schedule(schedule, problem.n_features)
    if n_workers > problem.n_rows:
        raise ValueError(f"n_workers ({n_workers}) must be <= n_rows ({problem.n_rows})")
    At, y = np.ascontiguousarray(problem.At, dtype=np.float64), np.asarray(problem.y, dtype=np.float64)
    rounds, p = schedule.shape
    n_records = rounds // record_every + 2
    x0 = np.zeros(problem.n_features)
    f0 = problem.objective(x0)
    with WorkerGroup(n_workers, start_method, label=f"Shotgun P={p} on {n_workers} processes") as group:
        sh = {
            "At": group.copy_of(At),
            "beta": group.copy_of(np.asarray(problem.beta, dtype=np.float64)),
            "x": group.copy_of(x0),
            "r": group.copy_of(-y),  # r = A 0 - y
            "schedule": group.copy_of(schedule.astype(np.int64)),
            "delta": group.zeros(p),
            "objective": group.zeros(n_records),
            "status": group.zeros(2, np.int64),  # [stop flag, records written]
        }
        sh["objective"].array[0] = f0
        sh["status"].array[1] = 1
        barrier = group.barrier()
        group.run(_worker, sh, float(problem.l1), record_every, blowup * f0, barrier, timeout=timeout)
        n = int(sh["status"].array[1])
        values = sh["objective"].array[:n].copy()
        x = sh["x"].array.copy()
        diverged = bool(sh["status"].array[0])
        trace = group.trace
    recorded = np.minimum(np.arange(n) * record_every, rounds)
    if n > 1 and not diverged:
        recorded[-1] = rounds  # the last record is taken after the final round
    trace.metric = "objective"
    trace.meta.update(P=p, rounds=rounds, record_every=record_every, diverged=diverged)
    return ShotgunRun(recorded, values, x, diverged), trace


def _worker(wid: int, n_workers: int, sh: dict[str, SharedArray], l1: float, record_every: int, limit: float,
            barrier: Any) -> int:
    """One process's share of every round: its delta slots, then its residual rows and x slots."""
    At, beta, x, r = sh["At"].array, sh["beta"].array, sh["x"].array, sh["r"].array
    schedule, delta = sh["schedule"].array, sh["delta"].array
    objective, status = sh["objective"].array, sh["status"].array
    ctx = current()
    rounds, p = schedule.shape
    slots = np.arange(wid, p, n_workers)
    n_rows = At.shape[1]
    lo, hi = wid * n_rows // n_workers, (wid + 1) * n_rows // n_workers
    done = 0
    for t in range(rounds):
        coords = schedule[t]
        t0 = time.perf_counter()
        mine = coords[slots]
        live = mine >= 0
        j = mine[live]
        d = np.zeros(len(slots))
        d[live] = soft_threshold(x[j] - (At[j] @ r) / beta[j], l1 / beta[j]) - x[j]
        delta[slots] = d
        t1 = time.perf_counter()
        barrier.wait()
        t2 = time.perf_counter()
        if status[0]:  # worker 0 flagged divergence after the previous round; all stop here
            break
        x[j] += d[live]
        use = coords >= 0
        r[lo:hi] += delta[use] @ At[coords[use], lo:hi]
        t3 = time.perf_counter()
        barrier.wait()
        t4 = time.perf_counter()
        if ctx is not None:
            ctx.span("compute", t0, t1, step=t)
            ctx.span("wait", t1, t2, step=t)
            ctx.span("compute", t2, t3, step=t)
            ctx.span("wait", t3, t4, step=t)
        done = t + 1
        if wid == 0 and (done % record_every == 0 or done == rounds):
            # Reads only: the others are in the next compute phase, which writes nothing but deltas.
            f = float(0.5 * r @ r + l1 * np.abs(x).sum())
            objective[status[1]] = f
            status[1] += 1
            if ctx is not None:
                ctx.record_quality(done, f)
            if not np.isfinite(f) or f > limit:
                status[0] = 1
    return done
