"""Clock bookkeeping for BSP, SSP(s) and async, with backup workers and deadlines.

A worker at clock c (about to compute step c) may read the parameters once every step
< c - s is *complete*: BSP is s = 0 (a barrier), async is s = infinity. Step c is complete when
n_workers - b gradients for it have been applied (backup workers: the slowest b are dropped),
or when its deadline (the moment the first worker opened it, plus ``timeout``) passes. Pushes
for a complete step are dropped. The staleness of a read is c minus the number of complete steps.
"""
from __future__ import annotations

import math
from collections import defaultdict

import simpy


class ClockTable:
    """Which steps are complete, and who is waiting for which."""

    def __init__(self, env: simpy.Environment, n_workers: int, bound: float, backup: int = 0, timeout: float | None = None):
        self.env = env
        self.n_workers = n_workers
        self.bound = bound
        self.quorum = n_workers - backup
        self.timeout = timeout
        self.completed = 0  # steps 0 .. completed-1 are complete
        self._done: set[int] = set()
        self._accepted: dict[int, int] = defaultdict(int)
        self._waiters: dict[int, list[simpy.Event]] = defaultdict(list)
        self.open_time: dict[int, float] = {}
        self.barriers: list[float] = []  # times at which a step became complete (drawn on timelines)

    def gate(self, clock: int) -> simpy.Event | None:
        """None if a worker at ``clock`` may read now, else an event that fires when it may."""
        need = clock - self.bound
        if need <= self.completed or math.isinf(self.bound):
            return None
        ev = self.env.event()
        self._waiters[int(need)].append(ev)
        return ev

    def staleness(self, clock: int) -> int:
        """How many steps of updates a read at ``clock`` may be missing: clock - complete steps."""
        return max(clock - self.completed, 0)

    def open(self, clock: int) -> None:
        """A worker starts step ``clock``: remember when the step opened and arm its deadline."""
        if clock not in self.open_time:
            self.open_time[clock] = self.env.now
            if self.timeout is not None:
                self.env.process(self._deadline(clock))

    def deliver(self, clock: int) -> bool:
        """A gradient for step ``clock`` arrives; True if applied, False if dropped (step already complete)."""
        if clock in self._done:
            return False
        self._accepted[clock] += 1
        if self._accepted[clock] >= self.quorum:
            self._complete(clock)
        return True

    def _deadline(self, clock: int):
        yield self.env.timeout(self.timeout)
        if clock not in self._done:
            self._complete(clock)

    def _complete(self, clock: int) -> None:
        self._done.add(clock)
        while self.completed in self._done:
            self.completed += 1
            self.barriers.append(self.env.now)
            for ev in self._waiters.pop(self.completed, ()):
                ev.succeed()
