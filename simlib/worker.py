"""The one worker program: what a parameter-server worker does, written once for every substrate.

A worker is a generator of *effects*; a substrate is a *transport* that performs them (SimPy events
and links, pipes, the shared table, a serial table) and sends each result back, as SimPy resumes a
process with an event's value. Step c of worker i:

    Gate(c)                      -> k          wait until the read rule lets step c read; k steps may run now
    Pull(c, keys)                -> (values, version)   table[keys], as fresh as the protocol allows
    Compute(c, batch, fn, args)  -> fn(*args)  the problem's math (the simulator charges the batch's work)
    Early(c, pending)            -> None       between a clock's mini-batches: a chance to send part of its push
    Push(c, keys, deltas, version, nbytes) -> (applied, completed)   the server applies it through the step rule
    AllReduce(c, keys, deltas)   -> None       every worker's update summed into every replica (no server)
    Bucket(c, k, keys, deltas)   -> None       start bucket k of step c's all-reduce (may return before its end)
    Reduced(c)                   -> None       wait until every all-reduce of step c is in the replica
    InPlace(c, k)                -> None       steps c .. c+k-1 applied to a shared table in place (a compiled chunk)

A dropped push (backup workers, deadlines) makes the worker rejoin at the first step not yet
complete, as synchronous SGD with backup workers does. With ``clock_batches`` > 1 a step is a clock
of several mini-batches: one pull, each mini-batch's update added to the worker's own copy first
and summed, one push (Bosen's clocks; with a budget, managed communication spends the Early
effects). A compressor (:mod:`simlib.compress`) encodes each push in the worker, whatever carries it.

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(200, 20, 4, seed=0), eval_rows=None)
    >>> w = prob.init_params()
    >>> run_serial(prob, prob.shards(1)[0], Plan(steps=3, batch_size=8, lr=0.5), w)
    >>> bool(prob.quality(w) < prob.quality(prob.init_params()))
    True
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Generator, NamedTuple

import numpy as np

from simlib import _validate as check
from simlib.compress import parse_spec
from simlib.managed import MESSAGE_ENTRIES, Pending
from simlib.protocol import MAX_BUCKET_BYTES, MAX_STEPS


class Gate(NamedTuple):
    """Wait until step ``step`` may read; the transport answers how many steps may run now (1 but in place)."""

    step: int


class Pull(NamedTuple):
    """Read table[keys]; the transport answers (values, the version they were read at)."""

    step: int
    keys: np.ndarray


class Compute(NamedTuple):
    """Run ``fn(*args)`` (the problem's math) for ``batch``; the simulator charges the batch's work first."""

    step: int
    batch: Any
    fn: Callable[..., Any]
    args: tuple


class Early(NamedTuple):
    """Between a clock's mini-batches: the transport may send part of ``pending`` now (managed communication)."""

    step: int
    pending: Pending


class Push(NamedTuple):
    """Send step ``step``'s update; the transport answers (applied, steps complete)."""

    step: int
    keys: Any
    deltas: Any
    version: Any
    nbytes: int


class AllReduce(NamedTuple):
    """Sum step ``step``'s (keys, deltas) over every worker and add the sum to every worker's replica."""

    step: int
    keys: Any
    deltas: Any


class Bucket(NamedTuple):
    """Start the all-reduce of bucket ``index`` of step ``step``'s update: ``deltas`` on the contiguous ``keys``
    (a slice), summed over every worker; the transport may return before it ends (overlap with the backward pass)."""

    step: int
    index: int
    keys: slice
    deltas: Any


def dense_bucket(effect: AllReduce, n_params: int) -> Bucket:
    """An :class:`AllReduce` of a sparse update as one bucket of every key (the update's keys may repeat)."""
    dense = np.zeros(n_params)
    np.add.at(dense, effect.keys, effect.deltas)
    return Bucket(effect.step, 0, slice(None), dense)


class Reduced(NamedTuple):
    """Wait until every all-reduce of step ``step`` has been added to the worker's replica."""

    step: int


class InPlace(NamedTuple):
    """Apply steps ``step`` .. ``step + count - 1`` to the shared table in place (the problem's ``local_steps``)."""

    step: int
    count: int


@dataclass(frozen=True)
class Plan:
    """What one worker does: its steps (from ``first``), batch size, step size, mini-batches per clock, path."""

    steps: int
    batch_size: int
    lr: float
    clock_batches: int = 1
    in_place: bool = False  # the problem's compiled local_steps on a table the transport shares
    first: int = 0
    entry_bytes: int = 12  # wire bytes of one uncompressed (key, delta) pair: int32 + float64 on real substrates


Program = Generator[Any, Any, None]


@dataclass(frozen=True)
class WorkerOptions:
    """The worker program's own options, which every substrate whose workers send pushes takes."""

    clock_batches: int = 1  # mini-batches per clock: one pull, their updates summed, one push
    managed_bandwidth: float | None = None  # bytes/s per worker: Bosen's managed communication (simlib.managed)
    compression: Any = None  # a simlib.compress spec ('topk:0.1', 'onebit', ...): each push encoded by its worker
    bucket_bytes: int | None = None  # protocol 'allreduce': gradients all-reduced in buckets of about this many bytes
    overlap: bool = True  # protocol 'allreduce' with buckets: each bucket's all-reduce overlaps the rest of the backward

    def __post_init__(self) -> None:
        check.positive_int("clock_batches", self.clock_batches, most=MAX_STEPS)
        if self.bucket_bytes is not None:
            check.positive_int("bucket_bytes", self.bucket_bytes, most=MAX_BUCKET_BYTES)
        check.boolean("overlap", self.overlap)
        if self.managed_bandwidth is not None:
            check.positive("managed_bandwidth", self.managed_bandwidth)
        if self.compression is not None:
            parse_spec(self.compression)  # a ValueError naming 'compression' before anything starts


def ps_worker(problem: Any, shard: Any, plan: Plan, compressor: Any = None,
              source: Callable[[int], tuple[Any, np.ndarray]] | None = None) -> Program:
    """The parameter-server worker: gate, pull, compute, push, for each step (or clock) of ``plan``.

    ``source(j)`` gives mini-batch j and its keys (default: the problem's batch j of ``shard``).
    """
    source = source or _batches(problem, shard, plan.batch_size)
    # NOTE: effects built by tuple.__new__, not through NamedTuple's Python-level __new__, and the plan read into
    # locals: the simulator runs this loop a million times for 10^4 workers x 100 steps (0.3 us an effect).
    new, step, lr, steps, entry_bytes = tuple.__new__, problem.step, plan.lr, plan.steps, plan.entry_bytes
    in_place, one_batch = plan.in_place, plan.clock_batches == 1
    c = plan.first
    while c < steps:
        k = yield new(Gate, (c,))
        if in_place:
            yield new(InPlace, (c, k))
            yield new(Push, (c + k - 1, None, None, None, 0))
            c += k
            continue
        if one_batch:
            batch, keys = source(c)
            values, version = yield new(Pull, (c, keys))
            keys, deltas = yield new(Compute, (c, batch, step, (values, batch, keys, lr)))
        else:
            keys, deltas, version = yield from _clock(problem, plan, c, source)
        if compressor is None:
            nbytes = len(keys) * entry_bytes
        else:
            keys, deltas, nbytes = encode(compressor, keys, deltas)
        applied, completed = yield new(Push, (c, keys, deltas, version, nbytes))
        c = c + 1 if applied else max(c + 1, completed)


def allreduce_worker(problem: Any, shard: Any, plan: Plan,
                     source: Callable[[int], tuple[Any, np.ndarray]] | None = None,
                     bucket_bytes: int | None = None) -> Program:
    """Synchronous data parallelism by all-reduce: each step reads the worker's replica, computes the gradient and
    all-reduces it, so every replica takes the sum of every worker's update (no server, no staleness).

    With ``bucket_bytes`` (a problem with ``backward_layers``), the backward pass runs layer by layer, last layer
    first, and each bucket of about ``bucket_bytes`` of gradient goes out as soon as its layers are done."""
    source = source or _batches(problem, shard, plan.batch_size)
    layered = bucket_bytes is not None and callable(getattr(problem, "backward_layers", None))
    for c in range(plan.first, plan.steps):
        batch, keys = source(c)
        values, _ = yield Pull(c, keys)
        if layered:
            yield from _buckets(problem, c, batch, values, plan.lr, bucket_bytes)
        else:
            keys, deltas = yield Compute(c, batch, problem.step, (values, batch, keys, plan.lr))
            yield AllReduce(c, keys, deltas)
        yield Reduced(c)


def _buckets(problem: Any, c: int, batch: Any, values: Any, lr: float, bucket_bytes: int) -> Program:
    """Step c's backward pass layer by layer (one Compute each; the first runs the forward too), each bucket of
    consecutive layers' -lr * gradient sent once it holds ``bucket_bytes`` (and the rest at the end)."""
    layers = problem.backward_layers(values, batch)
    held: list[tuple[slice, Any]] = []
    index = 0
    while True:
        out = yield Compute(c, batch, next, (layers, None))  # the first runs the forward pass too
        if out is not None:
            held.append(out)
        if held and (out is None or sum(g.nbytes for _, g in held) >= bucket_bytes):
            # layers come last first, so the bucket's keys run from the last layer's start to the first one's stop
            keys = slice(held[-1][0].start, held[0][0].stop)
            bucket = np.concatenate([g for _, g in reversed(held)])  # a new array (CuPy's own on CuPy): scaled in place
            bucket *= -lr
            yield Bucket(c, index, keys, bucket)
            held, index = [], index + 1
        if out is None:
            return


def _batches(problem: Any, shard: Any, batch_size: int) -> Callable[[int], tuple[Any, np.ndarray]]:
    """The default source: mini-batch j of ``shard`` and the keys it touches."""
    def source(j: int) -> tuple[Any, np.ndarray]:
        batch = problem.batch(shard, j, batch_size)
        return batch, problem.keys(batch)
    return source


def _clock(problem: Any, plan: Plan, c: int, source: Callable[[int], tuple[Any, np.ndarray]]) -> Program:
    """Clock c of k mini-batches: one pull of their keys, each update computed on the worker's copy (its own
    updates added first) and summed in a :class:`~simlib.managed.Pending`; returns (keys, sums, version)."""
    k = plan.clock_batches
    inputs = [source(c * k + j) for j in range(k)]
    keys = np.unique(np.concatenate([bkeys for _, bkeys in inputs]))
    values, version = yield Pull(c, keys)
    pending = Pending(keys, np.asarray(values, dtype=np.float64))
    local = pending.values.copy()
    for j, (batch, bkeys) in enumerate(inputs):
        out, d = yield Compute(c, batch, problem.step, (local[pending.index(bkeys)], batch, bkeys, plan.lr))
        out, d = np.asarray(out), np.asarray(d, dtype=np.float64)
        local[pending.index(out)] += d
        pending.add(out, d)
        if j < k - 1:
            yield Early(c, pending)
    rest_keys, rest = pending.rest()
    return rest_keys, rest, version


def encode(compressor: Any, keys: Any, deltas: Any) -> tuple[Any, Any, int]:
    """(keys, deltas as the server will add them, wire bytes) of a push encoded by ``compressor``."""
    k, d, nbytes = compressor(np.asarray(keys), deltas)
    return np.asarray(k), np.asarray(d, dtype=np.float64), int(nbytes)


# The transport's method that performs each effect; an effect a transport has no method for does nothing (Early
# without a budget, InPlace off the in-place path).
METHODS = {Gate: "gate", Pull: "pull", Compute: "compute", Early: "early", Push: "push", AllReduce: "all_reduce",
           Bucket: "bucket", Reduced: "reduced", InPlace: "in_place"}


def drive(program: Program, transport: Any) -> None:
    """Run ``program`` on a transport that performs each effect at once (``transport.gate(effect)``, ...)."""
    value = None
    send = program.send
    perform = {effect: getattr(transport, name, _ignore) for effect, name in METHODS.items()}
    while True:
        try:
            effect = send(value)
        except StopIteration:
            return
        value = perform[type(effect)](effect)


def drive_rounds(programs: list[Program], transport: Any) -> None:
    """Run the workers' programs in lock-step rounds (device rounds): every worker's effects up to its push (or, under
    all-reduce, up to its Reduced), then the round's ends in worker order, then ``transport.round_end(the round's last
    step)``. Transport methods take (worker, effect)."""
    perform = {effect: getattr(transport, name, _ignore) for effect, name in METHODS.items()}
    sends, values = [p.send for p in programs], [None] * len(programs)
    while True:
        pushes = []
        for i, send in enumerate(sends):
            while True:
                try:
                    effect = send(values[i])
                except StopIteration:
                    break
                if type(effect) in (Push, Reduced):
                    pushes.append((i, effect))
                    break
                values[i] = perform[type(effect)](i, effect)
        if not pushes:
            return
        for i, effect in pushes:
            values[i] = perform[type(effect)](i, effect)
        transport.round_end(pushes[0][1].step)


class Timed:
    """What every real transport shares: the problem's math timed as a 'compute' span (worker ``straggler[0]``
    sleeps ``straggler[1]`` s after it: a slow machine), and managed communication's pacing (at most one early
    message per gap between mini-batches, and none sooner than n / ``budget`` s after one of n bytes).

    A subclass gives ``span(kind, start, end, nbytes, step)``, times as ``clock()`` reads them, and
    ``send_early(step, keys, deltas, now)``, which sends an early message and returns its bytes."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, i: int, straggler: tuple[int, float] | None = None, budget: float | None = None):
        self.i, self.straggler, self.budget = i, straggler, budget
        self.mark = self.next_send = 0.0  # the end of the last effect; the earliest start of the next early message

    def gate(self, effect: Gate) -> int:
        return 1  # a server's transport: the server holds the pull's reply until the protocol lets the step read

    def compute(self, effect: Compute) -> Any:
        start = self.clock()
        out = effect.fn(*effect.args)
        self.straggle()  # before the push: a slow machine's steps take longer
        self.mark = self.clock()
        self.span("compute", start, self.mark, 0, effect.step)
        return out

    def straggle(self) -> None:
        """Sleep ``straggler[1]`` seconds if this is the straggling worker."""
        if self.straggler is not None and self.straggler[0] == self.i:
            time.sleep(self.straggler[1])

    def early(self, effect: Early) -> None:
        now = self.clock()
        if self.budget is None or now < self.next_send:
            return
        keys, deltas = effect.pending.take(MESSAGE_ENTRIES)
        if len(keys):
            self.next_send = now + self.send_early(effect.step, keys, deltas, now) / self.budget


def _ignore(*effect: Any) -> None:
    """An effect a transport has nothing to do for (Early without a budget)."""
    return None


class Serial:
    """The serial transport: one worker on a table in this process; reads may lag ``delay`` updates behind.

    ``delay`` = d makes step t read the table as it was after step t - d (the analysed model of
    delayed SGD behind the SSP bound: every push has tau = d)."""

    def __init__(self, table: Any, delay: int = 0):
        self.table = table
        self.history: deque = deque([table.copy()], maxlen=delay + 1) if delay else None

    def gate(self, effect: Gate) -> int:
        return 1

    def pull(self, effect: Pull) -> tuple[Any, int]:
        return (self.table if self.history is None else self.history[0])[effect.keys], 0

    def compute(self, effect: Compute) -> Any:
        return effect.fn(*effect.args)

    def push(self, effect: Push) -> tuple[bool, int]:
        self.table[effect.keys] += effect.deltas
        if self.history is not None:
            self.history.append(self.table.copy())
        return True, effect.step + 1


def run_serial(problem: Any, shard: Any, plan: Plan, table: Any, delay: int = 0) -> None:
    """The worker program on the serial transport: ``table`` trained in place."""
    drive(ps_worker(problem, shard, plan), Serial(table, delay))
