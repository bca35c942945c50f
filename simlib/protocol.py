"""The protocol: when workers may read the shared table and which pushes count, written once.

Every substrate (the simulator, shared memory, pipes, Ray) asks these objects; none re-states the
rule. Nothing here knows about SimPy, processes or time sources: the caller passes ``now``.

* :class:`Protocol` -- one value naming the read rule: BSP = SSP(0), SSP(s), async = SSP(inf),
  with optional backup workers (drop the slowest b pushes of a step) and a deadline per step.
  ESSP(s) (eager SSP, Dai et al. 2015) reads under SSP(s)'s rule; its ``eager`` flag asks the
  substrate to push every applied update into every worker's cache (the simulator models it).
* :func:`may_read` -- *the* SSP read rule: a worker at clock c may read once every step < c - s
  is complete.
* :class:`Clocks` -- the bookkeeping that feeds it: pushes per step, complete steps, deadlines.
* :class:`StepRule` -- the staleness-aware step size the lectures teach (after arXiv 1511.05950):
  the server averages c = floor(lambda / n) pushes, each scaled by alpha0 / tau, where tau >= 1
  is the number of updates applied to the table between the push's read and its arrival.

Example::

    >>> p = Protocol.parse("ssp:2")
    >>> p.bound, p.label
    (2, 'SSP(2)')
    >>> c = Clocks(n_workers=2, protocol=p)
    >>> c.may_read(2), c.may_read(3)
    (True, False)
    >>> c.deliver(0), c.deliver(0), c.completed
    (True, True, 1)
    >>> c.may_read(3)
    True
"""
from __future__ import annotations

import inspect
import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from simlib import _validate as check

KINDS = ("bsp", "ssp", "async", "essp", "allreduce")
BOUNDED = ("ssp", "essp")  # the kinds that take a staleness bound s
KIND_LABELS = {"bsp": "BSP", "ssp": "SSP({s})", "essp": "ESSP({s})", "async": "Async", "allreduce": "AllReduce"}
MAX_BOUND = 1_000_000  # larger bounds never bind in any run this library can hold: say async
# A run's sizes on every substrate (the simulator's SimConfig and the contract's Training): beyond them a
# run only exhausts memory or never ends. MAX_WORKERS is the simulator's (a million simulated workers x 10 steps
# took 2.0 GB, cost-only: see SimConfig.cost_only; SimConfig checks a run's trace against memory); a real substrate starts a process or an actor per worker and
# takes at most MAX_REAL_WORKERS (checked by simlib.run).
MAX_WORKERS = MAX_STEPS = 1_000_000
MAX_BATCH = 10_000_000
MAX_REAL_WORKERS = 10_000
# Real substrates take more steps: Hogwild! is one step per row, and a step applied in place costs a microsecond.
MAX_REAL_STEPS = 1_000_000_000
# Protocol 'allreduce''s buckets, on every substrate (the simulator's SimConfig and the worker program's WorkerOptions):
# a bucket as large as the whole gradient is one all-reduce, and no gradient a run holds comes near 1 TiB.
MAX_BUCKET_BYTES = 1 << 40
_SPEC = re.compile(r"^\s*(bsp|async|essp|ssp|allreduce)\s*(?:[:(]\s*(\d+)\s*\)?)?\s*$", re.IGNORECASE)


def may_read(clock: int, completed: int, bound: float) -> bool:
    """The SSP read rule: a worker at ``clock`` may read iff clock - bound <= completed steps."""
    return clock - bound <= completed


ReadRule = Callable[[int, int, float], bool]


def staleness(bound: float, version: int, read_version: int) -> int:
    """tau of a push: updates applied between its read and now; 0 under BSP (bound 0), where a round's pushes,
    all read from the round's table, make one update (the lectures' hard-synchronous case)."""
    return 0 if bound == 0 else version - read_version


def check_read_rule(read_rule: Any) -> ReadRule | None:
    """``read_rule`` itself where it is a function or None; ValueError naming it otherwise."""
    if read_rule is not None and not callable(read_rule):
        raise ValueError(f"read_rule must be a function (clock, completed, bound) -> bool, got {read_rule!r}")
    try:
        signature = inspect.signature(read_rule) if read_rule is not None else None
    except (TypeError, ValueError):  # a callable without a signature (some builtins): its first call answers
        signature = None
    if signature is not None:
        try:
            signature.bind(0, 0, 0.0)
        except TypeError as e:
            name = getattr(read_rule, "__name__", type(read_rule).__name__)
            raise ValueError(f"read_rule must take three arguments (clock, completed, bound); {name}{signature} "
                             f"does not: {e}") from None
    return read_rule


def read_allowed(read_rule: ReadRule, clock: int, completed: int, bound: float) -> bool:
    """``read_rule(clock, completed, bound)``, refusing a rule that would stall the run.

    A read rule must allow a read once every earlier step is complete (completed >= clock):
    nothing else can ever complete, so a refusal there would leave every worker waiting for ever
    (the simulator ended with an empty run, the real substrates hung until their timeout).
    """
    if read_rule(clock, completed, bound):
        return True
    if completed >= clock:
        name = getattr(read_rule, "__name__", type(read_rule).__name__)
        raise ValueError(f"read_rule: {name}({clock}, {completed}, {bound}) refused a read at clock {clock} with every "
                         "earlier step complete; nothing else can complete, so the run would stall")
    return False


@dataclass(frozen=True)
class Protocol:
    """BSP, SSP(s), ESSP(s) or async, with backup workers and a per-step deadline; or 'allreduce' (synchronous data
    parallelism without a server: every worker's gradient summed into every worker's replica, bound 0).

    ``Protocol.parse`` accepts 'bsp', 'async', 'ssp:3', 'SSP(3)', 'essp:3', 'ESSP(3)', 'allreduce' (any case).
    Bad values raise a ValueError naming the field.
    """

    kind: str = "bsp"
    staleness: int = 0
    backup_workers: int = 0
    timeout: float | None = None

    def __post_init__(self) -> None:
        check.one_of("protocol", self.kind, KINDS)
        check.non_negative_int("staleness", self.staleness)
        if self.kind not in BOUNDED and self.staleness != 0:
            raise ValueError(f"staleness applies to protocol 'ssp' only (and 'essp'); use 'ssp:{self.staleness}', not "
                             f"{self.kind!r} with staleness={self.staleness}")
        if self.staleness > MAX_BOUND:
            raise ValueError(f"staleness must be <= {MAX_BOUND} (a larger bound never binds: use 'async'), "
                             f"got {self.staleness}")
        check.non_negative_int("backup_workers", self.backup_workers)
        if self.timeout is not None:
            check.positive("timeout", self.timeout)
        if self.kind == "async" and (self.backup_workers or self.timeout is not None):
            raise ValueError("backup_workers and timeout need a clocked protocol: use 'bsp' or 'ssp:S', not 'async'")
        if self.kind == "allreduce" and (self.backup_workers or self.timeout is not None):
            raise ValueError("backup_workers and timeout: an all-reduce sums every worker's gradient into every "
                             "replica, so it cannot drop the slowest; use 'bsp' with backup workers")

    @classmethod
    def parse(cls, spec: "str | Protocol", **extra: Any) -> "Protocol":
        """'bsp' | 'async' | 'ssp:S' | 'SSP(S)' | 'essp:S' | 'ESSP(S)' (or a Protocol, returned as is) -> Protocol."""
        if isinstance(spec, Protocol):
            return replace(spec, **extra) if extra else spec
        m = _SPEC.match(spec) if isinstance(spec, str) else None
        if m is None:  # not a string, or not a protocol's spelling
            raise ValueError(f"protocol: unknown protocol {spec!r}; use 'bsp', 'ssp:S' (e.g. 'ssp:3'), 'essp:S', "
                             "'async' or 'allreduce'")
        kind, bound = m.group(1).lower(), m.group(2)
        if kind in BOUNDED and bound is None:
            raise ValueError(f"protocol: {kind.upper()} needs a staleness bound such as '{kind}:3', got {spec!r}")
        if kind not in BOUNDED and bound is not None:
            raise ValueError(f"protocol: only SSP takes a bound ('ssp:{bound}', or ESSP's 'essp:{bound}'), "
                             f"got {spec!r}")
        # leading zeros are a valid spelling ('ssp:007' is SSP(7)); more digits than MAX_BOUND's never bind
        if bound is not None and len(bound.lstrip("0")) > len(str(MAX_BOUND)):
            raise ValueError(f"protocol: staleness must be <= {MAX_BOUND} (a larger bound never binds: use 'async'), "
                             f"got {spec!r}")
        return cls(kind, int(bound or 0), **extra)

    def merged(self, backup_workers: int = 0, timeout: float | None = None) -> "Protocol":
        """This protocol with backup workers / a deadline given beside it (0 and None: not given).

        ValueError naming the field where a value given contradicts the protocol's own.
        """
        given = {name: value for name, value, unset in (("backup_workers", backup_workers, 0),
                                                         ("timeout", timeout, None)) if value != unset}
        for name, value in given.items():
            own = getattr(self, name)
            if own not in (0, None) and own != value:
                raise ValueError(f"{name}={value!r} contradicts the protocol's own {name}={own!r}; give it once")
        return replace(self, **given) if given else self

    @property
    def bound(self) -> float:
        """The staleness bound: 0 (BSP), s (SSP), infinity (async)."""
        return math.inf if self.kind == "async" else self.staleness

    @property
    def rounds(self) -> bool:
        """True when every read waits for the whole previous step (BSP, or a bound of 0): a round is one update."""
        return self.bound == 0

    @property
    def eager(self) -> bool:
        """True for ESSP: the server pushes every applied update to every worker's cache (SSP's read rule)."""
        return self.kind == "essp"

    @property
    def clocked(self) -> bool:
        """True for BSP and SSP (steps complete, so backup workers and deadlines make sense)."""
        return self.kind != "async"

    @property
    def spec(self) -> str:
        """The string form that :meth:`parse` reads back: 'bsp', 'ssp:3', 'essp:3', 'async'."""
        return f"{self.kind}:{self.staleness}" if self.kind in BOUNDED else self.kind

    @property
    def label(self) -> str:
        """'BSP', 'SSP(3)', 'ESSP(3)', 'Async', with ' b=1' and ' T=0.01s' for backup workers and deadlines."""
        base = KIND_LABELS[self.kind].format(s=self.staleness)
        if self.backup_workers:
            base += f" b={self.backup_workers}"
        if self.timeout is not None:
            base += f" T={self.timeout:g}s"
        return base

    def check_workers(self, n_workers: int) -> None:
        """Raise ValueError if the protocol cannot run on ``n_workers`` workers."""
        if self.backup_workers >= n_workers:
            raise ValueError(f"backup_workers must be < n_workers ({n_workers}), got {self.backup_workers}")


class Clocks:
    """Which steps are complete: step c completes when n - b pushes for it are applied, or at its deadline.

    ``completed`` counts the complete prefix of steps (0 .. completed-1). Pushes for a step that is
    already complete are dropped (backup workers, deadlines). The caller supplies times and acts on
    what the methods return; the simulator wraps these calls in SimPy events, the real servers call
    them directly. ``read_rule`` replaces :func:`may_read` (same arguments; an assignment plugs a
    student's rule in here); it must allow a read once every earlier step is complete, or runs stall.
    """

    def __init__(self, n_workers: int, protocol: Protocol | str = "bsp", read_rule: ReadRule | None = None):
        check.positive_int("n_workers", n_workers)
        self.read_rule: ReadRule = may_read if read_rule is None else check_read_rule(read_rule)
        self.protocol = Protocol.parse(protocol)
        self.protocol.check_workers(n_workers)
        self.n_workers = n_workers
        self.bound = self.protocol.bound
        self.quorum = n_workers - self.protocol.backup_workers
        self.completed = 0
        self._done: set[int] = set()
        self._accepted: dict[int, int] = defaultdict(int)
        self.open_time: dict[int, float] = {}

    def may_read(self, clock: int) -> bool:
        """Whether a worker about to compute step ``clock`` may read now (:func:`may_read` by default)."""
        if self.read_rule is may_read:  # it allows every read with the earlier steps complete: nothing to check
            return may_read(clock, self.completed, self.bound)
        return read_allowed(self.read_rule, clock, self.completed, self.bound)

    def may_read_from(self, clock: int, completed: int) -> bool:
        """Whether a worker at ``clock`` may read a copy holding every step < ``completed`` (a cached row)."""
        return read_allowed(self.read_rule, clock, completed, self.bound)

    def needed(self, clock: int) -> int:
        """How many complete steps a read at ``clock`` waits for (clock - s)."""
        return int(clock - self.bound)

    def clock_lag(self, clock: int) -> int:
        """Steps the parameters may be missing at a read at ``clock``: clock - complete steps."""
        return max(clock - self.completed, 0)

    def open(self, clock: int, now: float) -> float | None:
        """A worker starts step ``clock``; returns the step's deadline if this call opened it and one is set."""
        if clock in self.open_time:
            return None
        self.open_time[clock] = now
        return None if self.protocol.timeout is None else now + self.protocol.timeout

    def is_complete(self, clock: int) -> bool:
        """Whether step ``clock`` is complete (its later pushes are dropped)."""
        return clock < self.completed or clock in self._done

    def deliver(self, clock: int) -> bool:
        """A push for step ``clock`` arrives: True if it counts (is applied), False if dropped."""
        if self.is_complete(clock):
            return False
        self._accepted[clock] += 1
        if self._accepted[clock] >= self.quorum:
            self._finish(clock)
        return True

    def expire(self, clock: int) -> bool:
        """The deadline of step ``clock`` passed: complete it if it is not; True if that changed anything."""
        if self.is_complete(clock):
            return False
        self._finish(clock)
        return True

    def _finish(self, clock: int) -> None:
        self._done.add(clock)
        self._accepted.pop(clock, None)
        while self.completed in self._done:
            self._done.discard(self.completed)
            self.completed += 1


@dataclass(frozen=True)
class StepRule:
    """How the server turns pushes into table updates (the lectures' staleness-aware SGD).

    ``accumulation`` is lambda: the server averages c = max(1, floor(lambda / n_workers)) pushes
    into one update (None: c = 1, every push is an update). With ``staleness_aware`` each push is
    scaled by 1 / max(tau, 1), i.e. step size alpha0 / tau, tau = updates applied since its read.
    A subclass may override :meth:`scale` (another staleness-aware rule); every server calls it.

        >>> rule = StepRule(staleness_aware=True, accumulation=8)
        >>> rule.group_size(4), rule.scale(0), rule.scale(4)
        (2, 1.0, 0.25)
    """

    staleness_aware: bool = False
    accumulation: int | None = None

    def __post_init__(self) -> None:
        check.boolean("staleness_aware", self.staleness_aware)
        if self.accumulation is not None:
            check.positive_int("accumulation", self.accumulation)

    def group_size(self, n_workers: int) -> int:
        """c = floor(lambda / n), at least 1: pushes averaged into one update."""
        return 1 if self.accumulation is None else max(1, self.accumulation // n_workers)

    def scale(self, tau: int) -> float:
        """alpha(tau) / alpha0 = 1 / max(tau, 1) when staleness-aware, else 1."""
        return 1.0 / max(tau, 1) if self.staleness_aware else 1.0

    @property
    def plain(self) -> bool:
        """Whether every push lands as it is (the built-in rule, not staleness-aware, no accumulation)."""
        return type(self) is StepRule and not self.staleness_aware and self.accumulation is None

    def scaled(self, deltas: Any, tau: int) -> Any:
        """deltas * scale(tau): a push as the table receives it. Every substrate's server calls this."""
        scale = self.scale(tau)
        return deltas if scale == 1.0 else deltas * scale

    def land(self, table: Any, keys: Any, deltas: Any, tau: int) -> None:
        """table[keys] += scaled(deltas, tau), in the table's own type: one push applied where it lands at once."""
        table[keys] += np.asarray(self.scaled(deltas, tau), dtype=table.dtype)


class Accumulator:
    """The server side of :class:`StepRule`: collects scaled pushes, emits one averaged update per c.

    ``version`` counts updates applied to the table; a push read at version v arriving now has
    tau = version - v. Deltas are kept per key in a dict so that pushes with different keys merge.
    """

    def __init__(self, rule: StepRule, n_workers: int):
        self.rule = rule
        self.c = rule.group_size(n_workers)
        self.version = 0
        self._pending: list[tuple[Any, Any]] = []

    def push(self, keys: Any, deltas: Any, read_version: int, tau: int | None = None) -> tuple[int, list[tuple[Any, Any]]]:
        """Take one push; return (its tau, the (keys, deltas) to add to the table now, maybe none).

        ``tau`` overrides version - read_version where the server counts updates otherwise (BSP: rounds).
        """
        tau = self.version - read_version if tau is None else tau
        if self.c == 1:
            self.version += 1
            return tau, [(keys, self.rule.scaled(deltas, tau))]
        self._pending.append((keys, deltas * (self.rule.scale(tau) / self.c)))
        return tau, self.flush() if len(self._pending) >= self.c else []

    def flush(self) -> list[tuple[Any, Any]]:
        """The pending pushes, as one update: a full group, or at the end of a run a partial one."""
        out, self._pending = self._pending, []
        if out:
            self.version += 1
        return out
