"""Shotgun's rounds priced in simulated time: the real Lasso math, a cluster's clock.

A round on N workers holding P coordinate slots (worker w owns slots w, w + N, ...):

1. *compute*: worker w computes its deltas, each a dot product with the residual:
   time = compute model(units = live slots x n_rows), with the config's stragglers;
2. *exchange*: a ring all-gather of the (key, value) deltas: (N - 1) phases of
   latency + (slots per worker) (key_bytes + value_bytes) / bandwidth;
3. *apply*: every worker updates its n_rows / N rows of the residual with all P deltas:
   time = compute_per_unit x P x n_rows / N (no noise: it is a fixed, tiny cost).

The round ends when the slowest worker finishes (a barrier), so the round time is
max(compute) + all-gather + max(apply). Rounds are lock-step, so their event times have this
closed form and need no event queue; the math runs :func:`simlib.problems.lasso.shotgun` (its rounds
priced through its ``before_round`` hook) on the same schedule, so the objective per round equals the serial
reference exactly.

Why this is not a run of the engine (``simlib.run(ShotgunProblem(...), "bsp", substrate="sim")``,
which works, on the engine's cost model): Shotgun is model-parallel, its workers exchange their
P deltas with each other by an all-gather and each keeps its own residual. The engine has two
topologies, neither of which is that exchange: ``ps`` routes every pull (all of x, since the
residual needs it) and push through server links, and ``allreduce`` sums dense gradients of the
whole table (n_features values, not P pairs) in a ring. The closed form above, which lesson 04
uses to show P = 8 reaching the target sooner in simulated time, needs an all-gather topology in
:mod:`simlib.sim.engine`.

Example::

    >>> from simlib.problems.lasso import make_lasso, random_schedule
    >>> from simlib.sim import SimConfig
    >>> prob = make_lasso(n_rows=200, n_features=100, n_nonzero=10, seed=0)
    >>> run, trace = simulate_shotgun(prob, random_schedule(100, 4, 300, seed=0), SimConfig(n_workers=4))
    >>> round(float(run.objective[-1]), 4), trace.substrate
    (6.9389, 'sim')
"""
from __future__ import annotations

import numpy as np

from simlib import _validate as check
from simlib.problems.lasso import LassoProblem, ShotgunProblem, ShotgunRun, shotgun
from simlib.sim.config import SimConfig
from simlib.sim.network import allgather_time
from simlib.sim.stragglers import ComputeModel
from simlib.trace import Trace


def simulate_shotgun(problem: LassoProblem, schedule: np.ndarray, cfg: SimConfig | None = None, record_every: int = 10,
                     blowup: float = 1e6) -> tuple[ShotgunRun, Trace]:
    """Run Shotgun's rounds on the simulated cluster ``cfg`` (n_workers, network, compute, stragglers).

    Returns the objective every ``record_every`` rounds and a trace (``substrate='sim'``) with
    per-worker compute, wait and send spans and the objective against simulated seconds.
    """
    cfg = SimConfig() if cfg is None else cfg
    if not isinstance(cfg, SimConfig):
        raise ValueError(f"cfg must be a SimConfig, got {type(cfg).__name__}")
    check.positive_int("record_every", record_every)
    schedule = ShotgunProblem(problem, schedule).schedule  # validated as the contract's adapter does
    n, (rounds, p) = cfg.n_workers, schedule.shape
    compute = ComputeModel(cfg, np.random.SeedSequence(cfg.seed))
    owner = np.arange(p) % n  # worker owning each slot
    pair = cfg.entry_bytes
    apply_time = cfg.compute_per_unit * p * problem.n_rows / n
    slots = np.bincount(owner, minlength=n)
    exchange = allgather_time(n, int(slots.max()) * pair, cfg.latency, cfg.bandwidth)
    trace = Trace(label=f"Shotgun P={p} on {n} workers", substrate="sim", n_workers=n, metric="objective")
    ends = [0.0]  # the simulated time at the end of each round (entry 0: the start)

    def price(t: int) -> None:
        """Round t's compute, wait, exchange and apply spans, from the time the round before ended."""
        now, coords = ends[-1], schedule[t]
        live = np.bincount(owner[coords >= 0], minlength=n)
        busy = [compute.time(w, int(live[w]) * problem.n_rows) if live[w] else 0.0 for w in range(n)]
        barrier = now + max(busy)
        for w in range(n):
            trace.span(w, "compute", now, now + busy[w], step=t)
            trace.span(w, "wait", now + busy[w], barrier, step=t)
            trace.span(w, "send", barrier, barrier + exchange, nbytes=int(slots[w]) * pair * (n - 1), step=t)
            trace.span(w, "compute", barrier + exchange, barrier + exchange + apply_time, step=t)
            trace.update(barrier, w, t, 0, bool(live[w]))
        ends.append(barrier + exchange + apply_time)

    run = shotgun(problem, schedule, record_every, blowup, before_round=price)
    for t, f in zip(run.rounds, run.objective):
        trace.record_quality(ends[t], t, f)
    trace.meta.update(config=cfg.to_dict(), P=p, rounds=rounds, record_every=record_every, diverged=run.diverged)
    return run, trace
