"""Bosen's managed communication (Wei et al., SoCC 2015) in the simulator: a bandwidth budget spent between clocks.

A clock spans ``SimConfig.clock_batches`` mini-batches. The worker reads the rows they touch once, at
the clock's start (as fresh as the protocol allows), computes each mini-batch's real update on its
copy (its own updates included: they are added locally first, the seeds' "combiner"), and sums them
in a pending buffer. Without a budget the whole sum goes at the clock's end: SSP's burst, with the
network idle in between. With ``SimConfig.managed_bandwidth`` = B bytes/s, while the worker computes,
a sender takes the pending keys of largest relative change |delta| / (|value| + eps) first, in
messages of at most ``MESSAGE_ENTRIES`` entries (:mod:`simlib.managed`), never faster than B on average (a message of n
bytes is followed by n / B of silence). The server adds each early message to the table on arrival,
so the next reads see it; the clock's end pushes whatever is still pending as before, and only that
push completes the clock, so the SSP bound holds unchanged and every update arrives exactly once.

How fresh a read is: at each pull the run records the L1 mass of the other workers' updates already
computed but not yet in the table (pending, or on the wire) in ``trace.meta['clocked']['unseen']``.

The early messages are ``send`` spans of the worker (they overlap its compute) and are listed in
``trace.meta['managed']``; :meth:`simlib.trace.Trace.link_load` turns send spans into bytes/s per
worker link over time.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import simpy

from simlib.managed import MESSAGE_ENTRIES, Pending


class _Pending(Pending):
    """:class:`simlib.managed.Pending` that wakes a sender waiting for something to send."""

    wake: simpy.Event | None = None

    def add(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        super().add(keys, deltas)
        self._wake()

    def rest(self) -> tuple[np.ndarray, np.ndarray]:
        out = super().rest()
        self._wake()
        return out

    def _wake(self) -> None:
        if self.wake is not None:
            self.wake.succeed()
            self.wake = None


def clocked_worker(run: Any, i: int):
    """Worker i of a parameter-server run whose clocks span ``clock_batches`` mini-batches (a SimPy process)."""
    cfg, env, trace, p = run.cfg, run.env, run.trace, run.problem
    k, budget = cfg.clock_batches, cfg.managed_bandwidth
    log = run.trace.meta.setdefault("managed", {"messages": 0, "bytes": 0, "entries": 0, "pushed_entries": 0,
                                                "log": []}) if budget is not None else None
    next_send = [0.0]  # the budget's clock: no early message starts before this time
    fresh = run.__dict__.setdefault("_unseen", _Unseen(cfg.n_workers, trace))

    def step(i: int, c: int):
        """Clock c: read its rows, compute its mini-batches (sending early if managed), push the rest."""
        t0 = env.now
        gate = run.clocks.gate(c)
        if gate is not None:
            yield gate
            trace.span(i, "wait", t0, env.now, step=c)
        run.clocks.open(c)
        lag = run.clocks.rule.clock_lag(c)
        batches = [p.batch(run.shards[i], c * k + j, cfg.batch_size) for j in range(k)]
        batch_keys = [p.keys(b) for b in batches]
        keys = np.unique(np.concatenate(batch_keys))
        t_pull = env.now
        fresh.read(i)
        values, version, req_bytes, resp_bytes = yield from run._pull(i, keys)
        trace.span(i, "recv", t_pull, env.now, nbytes=req_bytes + resp_bytes, step=c)
        pending = _Pending(keys, np.asarray(values, dtype=np.float64))
        fresh.pending[i] = pending
        local = pending.values.copy()  # the worker's copy: its own updates are added locally first
        if budget is not None:
            env.process(_sender(run, i, c, pending, budget, next_send, log, fresh))
        t_comp = env.now
        for batch, bkeys in zip(batches, batch_keys):
            units = p.work(batch) if cfg.cost_unit == "nonzero" else len(batch)
            yield env.timeout(run.compute.time(i, units))
            out_keys, g = p.step(local[pending.index(bkeys)], batch, bkeys, cfg.lr)
            g = np.asarray(g, dtype=np.float64)
            local[pending.index(np.asarray(out_keys))] += g
            pending.add(np.asarray(out_keys), g)
        trace.span(i, "compute", t_comp, env.now, step=c)
        # The clock's end: what is still pending goes now, and this push alone completes the clock.
        rest_keys, rest = pending.rest()
        nbytes = len(rest_keys) * cfg.entry_bytes
        t_push = env.now
        fresh.flying[i] += float(np.abs(rest).sum())
        if len(rest_keys):
            yield from run._push(i, rest_keys, nbytes)
        else:  # everything went early: the clock's message still tells the server the clock is done
            yield from run._to_server(i, 0, 0, cfg.server_time)
        trace.span(i, "send", t_push, env.now, nbytes=nbytes, step=c)
        if log is not None:
            log["pushed_entries"] += len(rest_keys)
        applied, tau = run.server.push(c, rest_keys, rest, version)
        fresh.flying[i] -= float(np.abs(rest).sum())
        trace.update(env.now, i, c, tau, applied, clock_lag=lag)
        run._count_step(applied)
        return c + 1

    yield from run._steps(i, step)


def _sender(run: Any, i: int, c: int, pending: _Pending, budget: float, next_send: list[float], log: dict,
            fresh: "_Unseen"):
    """While clock c computes: send the largest pending changes, at most ``budget`` bytes/s on average."""
    cfg, env = run.cfg, run.env
    while not pending.closed:
        if next_send[0] > env.now:
            yield env.timeout(next_send[0] - env.now)
            continue
        keys, deltas = pending.take(MESSAGE_ENTRIES)
        if not len(keys):
            pending.wake = env.event()
            yield pending.wake
            continue
        # One early message, queued on each shard's in-link now (so the clock's push, sent later, lands after it).
        nbytes = len(keys) * cfg.entry_bytes
        t0 = arrive = env.now
        for k, sel in run._split(keys):
            part = nbytes * (sel.stop - sel.start) / len(keys)
            done = run.nodes[0][k].inlink.reserve(t0, part, cfg.bandwidth, cfg.server_time) + cfg.latency
            run.lan_bytes += part
            env.process(_land(run, done - t0, keys[sel], deltas[sel], i, fresh))
            arrive = max(arrive, done)
        run.trace.span(i, "send", t0, arrive, nbytes=nbytes, step=c)
        log["messages"] += 1
        log["bytes"] += nbytes
        log["entries"] += len(keys)
        log["log"].append([t0, arrive, nbytes, i, c])
        fresh.flying[i] += float(np.abs(deltas).sum())
        next_send[0] = t0 + nbytes / budget


def _land(run: Any, delay: float, keys: np.ndarray, deltas: np.ndarray, i: int, fresh: "_Unseen"):
    """An early message reaches its shard: the server adds it to the table (the plain step rule: as it is)."""
    yield run.env.timeout(delay)
    run.server.add_early(keys, deltas)
    fresh.flying[i] -= float(np.abs(deltas).sum())


class _Unseen:
    """Per worker, the updates it computed that the table lacks: its open clock's pending sums and its messages in flight."""

    def __init__(self, n_workers: int, trace: Any):
        self.pending: list[Pending | None] = [None] * n_workers
        self.flying = [0.0] * n_workers
        self.log = trace.meta.setdefault("clocked", {"unseen": []})["unseen"]

    def read(self, i: int) -> None:
        """Worker i reads: record the L1 mass of the other workers' computed updates not in the table."""
        mass = sum(self.flying[j] + (0.0 if p is None else float(np.abs(p.acc).sum()))
                   for j, p in enumerate(self.pending) if j != i)
        self.log.append(mass)
