"""Bosen's managed communication (Wei et al., SoCC 2015) in the simulator: a bandwidth budget spent between clocks.

A clock spans ``SimConfig.clock_batches`` mini-batches. The worker reads the rows they touch once, at
the clock's start (as fresh as the protocol allows), computes each mini-batch's real update on its
copy (its own updates included: they are added locally first, the lectures' "combiner"), and sums them
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

from simlib.managed import MESSAGE_ENTRIES, Pending


class Sender:
    """Worker i's side of managed communication on the simulated cluster (the worker program's Early effects)."""

    def __init__(self, run: Any, i: int):
        cfg = run.cfg
        self.run, self.i, self.budget = run, i, cfg.managed_bandwidth
        self.log = run.trace.meta.setdefault("managed", {"messages": 0, "bytes": 0, "entries": 0,
                                                         "pushed_entries": 0, "log": []}) if self.budget else None
        self.next_send = 0.0  # the budget's clock: no early message starts before this time
        self.fresh = run.__dict__.setdefault("_unseen", _Unseen(cfg.n_workers, run.trace))
        self.pending: Pending | None = None

    def read(self) -> None:
        """The worker pulls: record how much of the others' computed updates the table lacks."""
        self.fresh.read(self.i)

    def early(self, c: int, pending: Pending) -> None:
        """A mini-batch of clock c was added to ``pending``: start the clock's sender, or wake it."""
        self.fresh.pending[self.i] = pending
        if self.budget is None:
            return
        if pending is not self.pending:
            self.pending = pending
            self.run.env.process(self._sender(c, pending))
        else:
            _wake(pending)

    def push(self, c: int, keys: np.ndarray, rest: np.ndarray, nbytes: int):
        """The clock's end: what is still pending goes now, and this push alone completes the clock."""
        run = self.run
        if self.pending is not None:
            _wake(self.pending)  # closed: its sender stops
        self.fresh.flying[self.i] += float(np.abs(rest).sum())
        if len(keys):
            yield from run._push(self.i, keys, nbytes)
        else:  # everything went early: the clock's message still tells the server the clock is done
            yield from run._to_server(self.i, 0, 0, run.cfg.server_time)
        if self.log is not None:
            self.log["pushed_entries"] += len(keys)

    def landed(self, rest: np.ndarray) -> None:
        """The clock's push reached the table."""
        self.fresh.flying[self.i] -= float(np.abs(rest).sum())

    def _sender(self, c: int, pending: Pending):
        """While clock c computes: send the largest pending changes, at most ``budget`` bytes/s on average."""
        run, i, log = self.run, self.i, self.log
        cfg, env = run.cfg, run.env
        while not pending.closed:
            if self.next_send > env.now:
                yield env.timeout(self.next_send - env.now)
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
                env.process(self._land(done - t0, keys[sel], deltas[sel]))
                arrive = max(arrive, done)
            run.trace.span(i, "send", t0, arrive, nbytes=nbytes, step=c)
            log["messages"] += 1
            log["bytes"] += nbytes
            log["entries"] += len(keys)
            log["log"].append([t0, arrive, nbytes, i, c])
            self.fresh.flying[i] += float(np.abs(deltas).sum())
            self.next_send = t0 + nbytes / self.budget

    def _land(self, delay: float, keys: np.ndarray, deltas: np.ndarray):
        """An early message reaches its shard: the server adds it to the table (the plain step rule: as it is)."""
        yield self.run.env.timeout(delay)
        self.run.server.add_early(keys, deltas)
        self.fresh.flying[self.i] -= float(np.abs(deltas).sum())


def _wake(pending: Pending) -> None:
    """Wake a sender waiting for something to send from ``pending``."""
    wake = getattr(pending, "wake", None)
    if wake is not None:
        pending.wake = None
        wake.succeed()


class _Unseen:
    """Per worker, the updates it computed that the table lacks: its open clock's pending sums and its messages in
    flight."""

    def __init__(self, n_workers: int, trace: Any):
        self.pending: list[Pending | None] = [None] * n_workers
        self.flying = [0.0] * n_workers
        self.log = trace.meta.setdefault("clocked", {"unseen": []})["unseen"]

    def read(self, i: int) -> None:
        """Worker i reads: record the L1 mass of the other workers' computed updates not in the table."""
        mass = sum(self.flying[j] + (0.0 if p is None else float(np.abs(p.acc).sum()))
                   for j, p in enumerate(self.pending) if j != i)
        self.log.append(mass)
