"""The protocol's clocks as SimPy events: waiting readers and deadlines around :class:`simlib.protocol.Clocks`.

The rule itself (who may read, which pushes count) is :mod:`simlib.protocol`'s; this wrapper only
turns "not yet" into an event that fires when the rule allows, and a deadline into a process.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import simpy

from simlib.protocol import Clocks, Protocol, ReadRule, may_read


class ClockTable:
    """:class:`~simlib.protocol.Clocks` with waiting workers woken by SimPy events."""

    def __init__(self, env: simpy.Environment, n_workers: int, protocol: Protocol, read_rule: ReadRule | None = None):
        self.env = env
        self.rule = Clocks(n_workers, protocol, read_rule)
        self._waiters: dict[int, list[simpy.Event]] = defaultdict(list)
        # A plugged-in read rule has no known "needed" step count: its waiters are re-asked on every completion.
        self._asking: list[tuple[int, simpy.Event]] | None = None if read_rule in (None, may_read) else []
        self.barriers: list[float] = []  # times at which a step became complete (drawn on timelines)

    @property
    def completed(self) -> int:
        """Steps 0 .. completed-1 are complete."""
        return self.rule.completed

    def gate(self, clock: int, waiter: Any) -> Any:
        """None if a worker at ``clock`` may read now, else ``waiter`` (anything with ``succeed()``: the kernel's
        process wake), to be succeeded when it may."""
        if self.rule.may_read(clock):
            return None
        if self._asking is not None:
            self._asking.append((clock, waiter))
        else:
            self._waiters[self.rule.needed(clock)].append(waiter)
        return waiter

    def open(self, clock: int) -> None:
        """A worker starts step ``clock``: arm the step's deadline if it has one."""
        deadline = self.rule.open(clock, self.env.now)
        if deadline is not None:
            self.env.process(self._deadline(clock, deadline - self.env.now))

    def deliver(self, clock: int) -> bool:
        """A push for step ``clock`` arrives; True if applied, False if dropped."""
        return self._wake(self.rule.deliver, clock)

    def _deadline(self, clock: int, delay: float):
        yield self.env.timeout(delay)
        self._wake(self.rule.expire, clock)  # a step still open at its deadline completes

    def _wake(self, change: Callable[[int], bool], clock: int) -> bool:
        """``change(clock)`` on the rule (a delivery, a deadline); wakes whoever the steps it completed let read."""
        before = self.rule.completed
        out = change(clock)
        for done in range(before + 1, self.rule.completed + 1):
            self.barriers.append(self.env.now)
            for ev in self._waiters.pop(done, ()):
                ev.succeed()
        if self._asking:
            self._asking = wake_ready(self._asking, self.rule.may_read)
        return out


def wake_ready(waiting: list[tuple[int, Any]], ready: Callable[[int], bool]) -> list[tuple[int, Any]]:
    """Succeed, in order, the (step, event) waiters whose step is ``ready`` now; returns the others."""
    still = []
    for step, ev in waiting:
        if ready(step):
            ev.succeed()
        else:
            still.append((step, ev))
    return still
