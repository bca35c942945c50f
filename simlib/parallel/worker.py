"""The worker's side of a run: who am I, and a cheap local record of spans, updates and quality.

Inside a worker started by :class:`~simlib.parallel.WorkerGroup`, :func:`current` returns a
:class:`WorkerContext`. Records stay in the worker's memory (appending a tuple, well under a
microsecond) and travel to the parent once, with the worker's result, where they are merged
into the run's :class:`~simlib.trace.Trace`. Record per chunk of work, not per row.

Times are ``time.perf_counter()`` readings taken relative to the run's start ``t0``, which the
parent passes in; on Linux, macOS and Windows that clock is system-wide, so the workers'
timelines line up with each other and with the parent's.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from simlib import _validate as check
from simlib.trace import SPAN_KINDS

# A straggler's sleep after each step: an hour at most, as the simulator bounds a step's own times (a sleep of 1e9 s
# per step was taken, and the run waited for its timeout= doing nothing)
MAX_STRAGGLE_S = 3600.0
POLL = 5e-5  # seconds between two looks once a wait has spun for its while (see spin_until)


@dataclass
class WorkerContext:
    """This worker's id, the group size, the run's clock origin and its local records."""

    worker_id: int
    n_workers: int
    t0: float
    spans: list[tuple[str, float, float, int, int]] = field(default_factory=list)
    updates: list[tuple[float, int, int, bool, int]] = field(default_factory=list)
    quality: list[tuple[float, int, float]] = field(default_factory=list)

    def now(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.t0

    def span(self, kind: str, start: float, end: float, nbytes: int = 0, step: int = -1) -> None:
        """Record ``kind`` over [start, end), given as ``time.perf_counter()`` readings."""
        if kind not in SPAN_KINDS:
            raise ValueError(f"span kind must be one of {SPAN_KINDS}, got {kind!r}")
        self.spans.append((kind, start - self.t0, end - self.t0, int(nbytes), int(step)))

    @contextmanager
    def timed(self, kind: str, step: int = -1, nbytes: int = 0) -> Iterator[None]:
        """Record the enclosed block as one span of ``kind``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.span(kind, start, time.perf_counter(), nbytes, step)

    def update(self, step: int, staleness: int = 0, applied: bool = True, clock_lag: int = -1) -> None:
        """Record one contribution (or one chunk of them) made now, with its tau and clock lag."""
        self.updates.append((self.now(), int(step), int(staleness), bool(applied), int(clock_lag)))

    def record_quality(self, step: int, value: float) -> None:
        """Record the metric as this worker saw it now."""
        self.quality.append((self.now(), int(step), float(value)))

    def records(self) -> tuple[list, list, list]:
        """Everything recorded, for shipping to the parent."""
        return self.spans, self.updates, self.quality


_current: WorkerContext | None = None


def current() -> WorkerContext | None:
    """The running worker's context, or None outside a worker."""
    return _current


def _install(ctx: WorkerContext | None) -> None:
    global _current
    _current = ctx


def check_straggler(straggler: Any, n_workers: int) -> None:
    """ValueError naming 'straggler' unless None or (worker id in [0, n_workers), seconds in [0, MAX_STRAGGLE_S])."""
    ok = straggler is None or (
        isinstance(straggler, (tuple, list)) and len(straggler) == 2 and check._is_int(straggler[0])
        and 0 <= straggler[0] < n_workers and check._is_number(straggler[1]) and 0 <= straggler[1] <= MAX_STRAGGLE_S)
    if not ok:
        raise ValueError(f"straggler must be (worker, seconds) with worker in [0, {n_workers}) and seconds in "
                         f"[0, {MAX_STRAGGLE_S:g}] (that worker sleeps so long after each step), got {straggler!r}")


def straggle(straggler: tuple[int, float] | None, worker: int) -> None:
    """Sleep ``straggler[1]`` seconds if this is the straggling worker: a slow machine, made on purpose."""
    if straggler is not None and straggler[0] == worker and straggler[1] > 0:
        time.sleep(straggler[1])


def spin_until(ready: Callable[[], bool], spin: float) -> None:
    """Return once ``ready()``: looking again at once (yielding the core) for ``spin`` seconds, then every POLL s.

    NOTE: a sleep lasts 80-130 us at the least (timer slack, the scheduler), so a short wait that sleeps between
    looks costs far more than it waits. Looking again at once, yielding the core to any other runnable process,
    brought model-parallel GloVe's two BSP barriers per batch from ~200 to ~40 us (two workers, batches of 64
    entries, measured on 2 cores).
    """
    until = time.perf_counter() + spin
    while not ready():
        if time.perf_counter() < until:
            os.sched_yield()
        else:
            time.sleep(POLL)


def record_span(kind: str, start: float, end: float, nbytes: int = 0, step: int = -1) -> None:
    """Record a span in the current worker's context; does nothing outside a worker."""
    if _current is not None:
        _current.span(kind, start, end, nbytes, step)
