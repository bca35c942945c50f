"""Bosen's managed communication (Wei et al., SoCC 2015), the part every substrate shares: what to send first.

A clock spans several mini-batches; a worker sums their updates in a :class:`Pending` buffer and,
between mini-batches, sends the keys of largest relative change |delta| / (|value| + eps) first,
in messages of at most :data:`MESSAGE_ENTRIES` entries, never faster than its budget of B bytes/s
on average (a message of n bytes is followed by n / B of silence). At the clock's end the rest goes
as the clock's push, which alone completes the clock: the staleness bound is checked as without it.
The server adds early messages as they arrive (:meth:`simlib.contract.ParamServer.add_early`).

The simulator's workers are :mod:`simlib.sim.managed`; the pipe substrate's are in
:mod:`simlib.substrates.pipes`. :func:`check` is the one set of refusals both apply;
:func:`check_clocks` bounds the work a run's clocks imply: at most ``MAX_STEPS`` (1,000,000)
mini-batches per worker, as many as a run of one mini-batch per step takes.

    >>> pend = Pending(np.array([1, 2, 3]), np.array([10.0, 0.1, 1.0]))
    >>> pend.add(np.array([1, 2, 3]), np.array([5.0, 0.2, -0.1]))   # relative: 0.5, 2, 0.1
    >>> pend.take(2)[0].tolist()
    [1, 2]
"""
from __future__ import annotations

import numpy as np

from simlib.protocol import MAX_STEPS, Protocol

# Entries per early message (8 bytes each with the simulator's 4-byte keys and values, 12 on pipes): small
# enough that a budget of a few hundred kB/s sends several messages per clock, large enough that latency
# stays cheap.
MESSAGE_ENTRIES = 32
# The eps of the priority |delta| / (|value| + eps): parameters still at 0 rank by |delta| alone.
EPS = 1e-6


def priority(delta: np.ndarray, value: np.ndarray, eps: float = EPS) -> np.ndarray:
    """Bosen's relative magnitude: |delta| / (|value| + eps)."""
    return np.abs(delta) / (np.abs(value) + eps)


def check_clocks(steps: int, clock_batches: int) -> None:
    """ValueError naming clock_batches unless steps x clock_batches, the mini-batches per worker, is <= MAX_STEPS."""
    total = steps * clock_batches
    if total > MAX_STEPS:
        raise ValueError(f"clock_batches: steps x clock_batches = {steps:,} x {clock_batches:,} = {total:,} "
                         f"mini-batches per worker, more than the {MAX_STEPS:,} a run takes; use fewer steps or a "
                         "smaller clock_batches")


def check(protocol: "Protocol", clock_batches: int, managed_bandwidth: float | None, plain_rule: bool,
          bandwidth: float | None = None) -> None:
    """Raise ValueError naming the field where managed communication is meaningless or not modelled."""
    if managed_bandwidth is None:
        return
    if clock_batches < 2:
        raise ValueError("managed_bandwidth needs clock_batches >= 2 (--clock-batches): with one mini-batch per "
                         "clock nothing is pending between clocks, so there is nothing to send early")
    if protocol.rounds:
        raise ValueError("managed_bandwidth needs a stale protocol ('ssp:S' or 'async'): under BSP an early update "
                         "would reach reads of the round it belongs to")
    if bandwidth is not None and managed_bandwidth > bandwidth:
        raise ValueError(f"managed_bandwidth ({managed_bandwidth:g} B/s) must be <= bandwidth ({bandwidth:g} B/s): "
                         "the budget is spent on the same link")
    for bad, name in ((not plain_rule, "staleness_aware, accumulation and rule="),
                      (protocol.backup_workers or protocol.timeout is not None, "backup_workers and timeout")):
        if bad:
            raise ValueError(f"managed_bandwidth: {name} are not modelled with managed communication (early "
                             "updates land as they are, once)")


class Pending:
    """One worker's updates of one clock not yet sent: a sum per key over the clock's (sorted) keys."""

    def __init__(self, keys: np.ndarray, values: np.ndarray):
        self.keys = keys
        self.values = values  # the values read at the clock's start: the priority's denominator
        self.acc = np.zeros(len(keys), dtype=np.float64)
        self.held = np.zeros(len(keys), dtype=bool)  # which keys have an update pending
        self.closed = False

    def index(self, keys: np.ndarray) -> np.ndarray:
        """Positions of ``keys`` (each one of the clock's) in the buffer."""
        idx = np.searchsorted(self.keys, keys)
        if len(keys) and (idx.max() >= len(self.keys) or not np.array_equal(self.keys[idx], keys)):
            raise ValueError("a mini-batch's update touched a key its clock did not read")
        return idx

    def add(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Accumulate one mini-batch's update."""
        idx = self.index(keys)
        np.add.at(self.acc, idx, deltas)
        self.held[idx] = True

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove and return the (at most) n pending keys of largest priority, in key order, with their sums."""
        where = np.flatnonzero(self.held)
        if len(where) > n:
            order = np.argsort(-priority(self.acc[where], self.values[where]), kind="stable")
            where = np.sort(where[order[:n]])
        out = self.keys[where], self.acc[where].copy()
        self.acc[where] = 0.0
        self.held[where] = False
        return out

    def rest(self) -> tuple[np.ndarray, np.ndarray]:
        """Close the clock: every key still pending, with its sum."""
        self.closed = True
        return self.take(len(self.keys))
