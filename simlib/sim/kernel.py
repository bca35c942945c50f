"""SimPy with a fast path for plain delays: a process may ``yield seconds`` (a float) instead of a Timeout.

NOTE: a simulated step is mostly plain delays (a message on a link, a compute span). A SimPy
``Timeout`` is an Event object, a scheduling call and a resume through ``Process._resume``; here a
delay is one queue entry pointing at the waiting process's reusable :class:`_Wake`, and the run loop
resumes the generator directly. Everything else (events, ``all_of``, interrupts, process ends) is
SimPy's own. The order is SimPy's exactly: a delay takes its event id when it is yielded, which is
when ``env.timeout`` would have taken it, so a run gives the same trace bit for bit. With the engine's
pull and push inlined and its records kept as columns, 10,000 workers x 30 BSP steps with real math
went from 24.0 to 12.2 CPU s (the two engines one after the other on the same loaded machine).
"""
from __future__ import annotations

import numbers
from collections import deque
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import EmptySchedule
from simpy.events import NORMAL, URGENT

__all__ = ["Environment", "Process"]

_ENDED = object()  # what Process._step returns once the generator has returned or raised


class _Wake:
    """What a process waiting on a plain delay waits on; ``callbacks`` empty once an interrupt took it away.

    A process may also yield its own wake (``env.active_process.wake``) to sleep until someone calls its
    :meth:`succeed`, as it would wait on a fresh event: the same wake-up order, the run loop's fast path.
    """

    __slots__ = ("proc", "callbacks", "_ok", "_value")

    def __init__(self, proc: "Process"):
        self.proc = proc
        self.callbacks = [proc._resume]
        self._ok = True
        self._value = None

    def succeed(self, value: Any = None) -> "_Wake":
        """Wake the process now (its yield gives None), as ``Event.succeed`` would schedule an event it waits on."""
        self.proc.env.schedule(self)
        return self


class Process(simpy.Process):
    """A SimPy process that may also yield a float: resume after that many seconds."""

    def __init__(self, env: "Environment", generator: Any):
        super().__init__(env, generator)
        self._wake = _Wake(self)

    @property
    def wake(self) -> _Wake:
        """What this process yields to sleep until something calls its ``succeed()`` (see :class:`_Wake`)."""
        if not self._wake.callbacks:  # an interrupt took the last one away
            self._wake = _Wake(self)
        return self._wake

    def _resume(self, event: Any) -> None:
        """SimPy's ``Process._resume``, plus: a yielded float schedules this process's wake-up."""
        self.env._active_proc = self
        target = self._step(event)
        if target is not _ENDED:
            self._wait(target)

    def _step(self, event: Any) -> Any:
        """Resume the generator with ``event``'s outcome: what it yields next, or _ENDED if it returned or raised
        (the process is then triggered). The one copy of the resume: :meth:`_resume` and the run loop's fast path."""
        try:
            if event._ok:
                return self._generator.send(event._value)
            event._defused = True
            return self._generator.throw(_copy(event._value))
        except StopIteration as e:
            self._ok, self._value = True, (e.args[0] if len(e.args) else None)
        except BaseException as e:
            e.__traceback__ = e.__traceback__.tb_next  # this frame: the traceback starts in the generator
            self._ok, self._value = False, e
        # The generator returned or raised: the process, an event itself, is triggered.
        self._target = None
        self.env.schedule(self)
        self.env._active_proc = None
        return _ENDED

    def _wait(self, target: Any) -> None:
        """Wait for what the generator yielded: a delay (a number) or an event."""
        env = self.env
        if type(target) is float:
            env.schedule(self.wake, NORMAL, target)  # (the property: a fresh wake if an interrupt took the last away)
            target = self._wake
        elif target is not self._wake:  # (its own wake: asleep until someone calls its succeed())
            try:
                callbacks = target.callbacks
            except AttributeError:
                if isinstance(target, numbers.Real) and not isinstance(target, bool):  # an int or a NumPy float
                    if target < 0:
                        raise ValueError(f"negative delay {target}") from None
                    self._wait(float(target))
                    return
                raise RuntimeError(f'Invalid yield value "{target}" in process {self.name}') from None
            if callbacks is None:  # already processed: its value at once, as SimPy's loop does
                self._resume(target)
                return
            callbacks.append(self._resume)
        self._target = target
        env._active_proc = None


class Environment(simpy.Environment):
    """``simpy.Environment`` whose processes may yield plain delays (floats); ``run()`` runs to the end.

    NOTE: SimPy keeps one heap of (time, priority, event id, event). Here the heap holds each distinct
    time once, and a dict maps a time to its events in the order they were scheduled (the urgent ones
    apart): the same order as SimPy's, since event ids grow with every schedule. At 100,000 workers a
    BSP barrier puts 100,000 events on one time, and popping them off SimPy's heap (ties broken by
    comparing tuples, 17 levels deep) was the largest cost of the run (24 % of it).
    """

    def __init__(self) -> None:
        super().__init__()
        self.process = lambda generator: Process(self, generator)  # type: ignore[method-assign]
        self._times: list[float] = []  # a heap of the distinct times that have events
        self._normal: dict[float, Any] = {}  # time -> its one event, or a deque of them in schedule order
        self._urgent: dict[float, deque] = {}  # time -> urgent events (process starts, interrupts)
        self.scheduled = 0  # events scheduled so far (SimPy numbers them: the benchmark counts them)

    def schedule(self, event: Any, priority: int = NORMAL, delay: float = 0) -> None:
        """Schedule ``event`` at now + delay (``priority`` URGENT: before the normal events of that time)."""
        t = self._now + delay
        self.scheduled += 1
        if priority == NORMAL:
            b = self._normal.get(t)
            if b is None:
                self._normal[t] = event
                if t not in self._urgent:
                    heappush(self._times, t)
            elif type(b) is deque:
                b.append(event)
            else:
                self._normal[t] = deque((b, event))
            return
        if priority != URGENT:
            raise ValueError(f"priority must be URGENT or NORMAL, got {priority}")
        if t not in self._urgent and t not in self._normal:
            heappush(self._times, t)
        self._urgent.setdefault(t, deque()).append(event)

    def peek(self) -> float:
        """The time of the next event (infinity if none)."""
        return self._times[0] if self._times else float("inf")

    def run(self, until: Any = None) -> Any:
        """Process every event (SimPy's ``step`` inlined, with the delays' fast path)."""
        if until is not None:
            raise ValueError("this environment runs to the end: run() takes no 'until'")
        normal, urgent, times = self._normal, self._urgent, self._times
        while times:
            # the next event, as step() takes it, inlined (one call less per event)
            t = times[0]
            self._now = t
            if urgent and t in urgent:
                u = urgent[t]
                event = u.popleft()
                if not u:
                    del urgent[t]
                    if t not in normal:
                        heappop(times)
            else:
                b = normal[t]
                if type(b) is deque:
                    event = b.popleft()
                    if not b:
                        del normal[t]
                        heappop(times)
                else:
                    event = b
                    del normal[t]
                    heappop(times)
            if type(event) is _Wake:
                if not event.callbacks:  # taken away by an interrupt
                    continue
                # The fast path: resume the generator; another delay goes straight back on the queue.
                proc = event.proc
                self._active_proc = proc
                target = proc._step(event)
                if type(target) is float:  # schedule(event, NORMAL, target), inlined
                    t = self._now + target
                    self.scheduled += 1
                    b = normal.get(t)
                    if b is None:
                        normal[t] = event
                        if t not in urgent:
                            heappush(times, t)
                    elif type(b) is deque:
                        b.append(event)
                    else:
                        normal[t] = deque((b, event))
                    self._active_proc = None
                elif target is not _ENDED:
                    proc._wait(target)
                continue
            self._fire(event)
        return None

    def step(self) -> None:
        """One event (as SimPy's), the delays' wake-ups included (a wake fired so is used up: the next is a fresh one).

        The clock moves to the event's time; the urgent events of a time go before its normal ones.
        """
        times = self._times
        if not times:
            raise EmptySchedule
        t = times[0]
        self._now = t
        queues = self._urgent if t in self._urgent else self._normal
        b = queues[t]
        event = b.popleft() if type(b) is deque else b
        if type(b) is not deque or not b:  # the last of its queue
            del queues[t]
            if t not in self._urgent and t not in self._normal:
                heappop(times)
        self._fire(event)

    @staticmethod
    def _fire(event: Any) -> None:
        """Run an event's callbacks; a failure nobody handled is raised again here, as SimPy's ``step`` raises it."""
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            raise _copy(event._value)


def _copy(exc: BaseException) -> BaseException:
    """A fresh exception like ``exc``, caused by it (SimPy re-raises a failed event's value this way)."""
    out = type(exc)(*exc.args)
    out.__cause__ = exc
    return out
