"""The ``pipes`` substrate: a parameter server process and N worker processes joined by pipes.

Processes: one server and N workers (a :class:`~simlib.parallel.WorkerGroup` of N + 1; the
server is group member 0). Each worker owns one counted :class:`~simlib.parallel.Channel` to
the server and runs, for every step c:

    pull   send the keys its mini-batch touches (int32);  receive table[keys] (float64)
    compute  the problem's real update (:meth:`Problem.step`) on the values it read
    push   send one record array of (key int32, delta float64) per touched key

The server is :class:`simlib.contract.ParamServer`: it holds a pull for step c until the protocol
allows the read (BSP, SSP(s), async, backup workers), applies pushes through the step rule and
measures each push's tau. Byte counts are the simulator's with ``key_bytes=4, value_bytes=8``.

Under protocol ``'allreduce'`` there is no server: the N workers form a ring of pipes, each keeps a replica,
and each bucket of its gradient goes around the ring (:class:`simlib.parallel.allreduce.Ring`: reduce-scatter
then all-gather), on a helper thread while the backward pass goes on (``bucket_bytes``, ``overlap``).

With ``clock_batches=k`` a step is a clock of k mini-batches: one pull of the keys they touch, k
updates computed on the worker's copy (its own added locally first) and summed, one push at the
end. With ``managed_bandwidth=B`` too (Bosen's managed communication, :mod:`simlib.managed`),
between mini-batches the worker sends the pending keys of largest relative change first, tagged
'early', at most one message of up to ``MESSAGE_ENTRIES`` entries per gap and never sooner than
n / B seconds after an early message of n bytes (header included, as the channel counts it); the
server adds each on arrival, and the clock's push carries the rest.

Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(2_000, 500, 10, seed=0), eval_rows=500)
    >>> import simlib
    >>> res = simlib.run(prob, "bsp", substrate="pipes", n_workers=2, steps=5, batch_size=16)
    >>> len(res.trace.updates), res.trace.quality[-1].value < res.trace.quality[0].value
    (10, True)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.contract import ParamServer, Result, ServerRecord, Training, local_result, new_trace
from simlib.contract import served_trace, warm_up as contract_warm_up
from simlib.parallel.allreduce import Ring, run_replicas
from simlib.parallel.channel import Channel
from simlib.parallel.group import START_METHODS, WorkerGroup
from simlib.parallel.worker import check_straggler, current
from simlib.protocol import Protocol
from simlib.compress import worker_compressor
from simlib.worker import Plan, Pull, Push, Timed, WorkerOptions, drive, ps_worker
from simlib.trace import Trace

PUSH_DTYPE = np.dtype([("key", "<i4"), ("grad", "<f8")])  # 12 bytes per touched key
EARLY = "early"  # the tag of a managed-communication message: part of the clock's push, sent before its end


class DenseKeys:
    """A problem whose every step pulls and pushes all parameters (a dense model on the wire)."""

    def __init__(self, problem: Any):
        self.inner = problem  # n_params, metric and the rest are the inner problem's (__getattr__)
        self._all = np.arange(problem.n_params, dtype=np.int32)

    def keys(self, batch: np.ndarray) -> np.ndarray:
        """Every parameter id, whatever the batch."""
        return self._all

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not there yet while unpickling (spawn): asking for it here would recurse forever
            raise AttributeError(name)
        return getattr(self.inner, name)


def pull_keys(problem: Any, batch: np.ndarray) -> np.ndarray:
    """The keys a mini-batch pulls, as int32 (4 bytes each on the wire)."""
    return problem.keys(batch).astype(np.int32, copy=False)


def push_message(problem: Any, values: np.ndarray, batch: np.ndarray, keys: np.ndarray, lr: float = 1.0) -> np.ndarray:
    """The worker's compute: the problem's update on the values read, packed as (key, delta) records."""
    return _records(*problem.step(values, batch, keys, lr))


def warm_up(problem: Any) -> None:
    """:func:`simlib.contract.warm_up` with a pipe worker's types: int32 keys, values read-only off the wire."""
    contract_warm_up(problem, lambda batch: pull_keys(problem, batch), lambda v: np.frombuffer(v.tobytes(), v.dtype))


@dataclass(frozen=True)
class PipesOptions(WorkerOptions):
    """The substrate's own options, ``simlib.run(..., substrate="pipes", **options)``.

    Deadlines (``Protocol.timeout``) are simulated only: a real server would need timers, so they are
    refused here; ``timeout`` is the hang guard.
    """

    start_method: str | None = None
    timeout: float | None = 120.0  # seconds for the whole run
    evaluate: bool = True  # False: the metric at the start and the end only (for timing runs)
    straggler: tuple[int, float] | None = None  # (i, s): worker i sleeps s seconds after each step, a slow machine

    def __post_init__(self) -> None:
        super().__post_init__()
        # named before the warm-up compiles anything (the worker group named these only once it was made, and 'yes'
        # passed for evaluate)
        if self.start_method is not None:
            check.one_of("start_method", self.start_method, START_METHODS)
        if self.timeout is not None:
            check.positive("timeout", self.timeout)
        check.boolean("evaluate", self.evaluate)

def run(problem: Any, protocol: Protocol, training: Training, **options: Any) -> Result:
    """The substrate entry point (``simlib.run(..., substrate="pipes")``); ``options``: :class:`PipesOptions`."""
    opts = check.options(PipesOptions, options, "substrate 'pipes'")
    if protocol.kind == "allreduce":  # every worker a replica; each bucket summed around a ring of pipes
        return run_replicas(problem, protocol, training, opts, "pipes", "over a ring of pipes", _ring)
    n_workers = training.n_workers
    check_straggler(opts.straggler, n_workers)
    shards = problem.shards(n_workers)  # raises ValueError naming n_workers if too many
    warm_up(problem)
    started = time.perf_counter()
    roles = ["parameter server"] + [f"worker {i}" for i in range(n_workers)]
    with WorkerGroup(n_workers + 1, opts.start_method, label="pipe PS", roles=roles) as group:
        pairs = [group.channel_pair() for _ in range(n_workers)]
        worker_args = [(tuple(a for a, _ in pairs),)] + [(b,) for _, b in pairs]  # the server gets every pipe's end
        out = group.run(_member, (problem, shards, protocol, training, opts), worker_args=worker_args,
                        timeout=opts.timeout)
    wall = time.perf_counter() - started
    w, served, early = out[0]
    trace = new_trace(problem, protocol, training, "pipes", "over pipes", substrate_detail="pipe parameter server",
                      wall_seconds=wall, start_method=group.start_method)
    # member 0 is the server; workers become 0 .. N-1 as in the simulator
    worker_seconds = served_trace(trace, ((s.worker - 1, *s[1:]) for s in group.trace.spans if s.worker > 0), served,
                                  problem, training.lr)
    if opts.clock_batches > 1:
        trace.meta["clock_batches"] = opts.clock_batches
    if opts.managed_bandwidth is not None:  # each worker returned (its local result, its early messages)
        trace.meta["managed"] = {"budget": opts.managed_bandwidth, **early,
                                 "log": [[t, n, i] for i, (_, log) in enumerate(out[1:]) for t, n in log]}
    return Result(trace, w, {"wall_seconds": wall, "worker_seconds": worker_seconds,
                             "local": [local for local, _ in out[1:]]})


run.options = PipesOptions  # type: ignore[attr-defined]  # simlib.run checks the option names against its fields


def _member(member: int, n_members: int, job: tuple[Any, list, Protocol, Training, PipesOptions],
            ends: Channel | tuple[Channel, ...]) -> Any:
    """Group entry point: member 0 serves the ``ends`` of every pipe, the others are workers 0 .. N-1 on the other end
    of theirs; ``job`` is the same for every member."""
    problem, shards, protocol, training, opts = job
    if member == 0:
        return _serve(problem, list(ends), protocol, training, opts.evaluate)
    i = member - 1
    shard = shards[i]
    plan = Plan(training.steps, training.batch_size, training.lr, clock_batches=opts.clock_batches)

    def source(j: int) -> tuple[Any, np.ndarray]:
        batch = problem.batch(shard, j, training.batch_size)
        return batch, pull_keys(problem, batch)  # int32, as warm_up compiled the kernels for

    transport = _PipeWorker(i, ends, opts)
    compressor = worker_compressor(opts.compression, problem.n_params, training.seed, i)
    drive(ps_worker(problem, shard, plan, compressor, source), transport)
    return local_result(problem, shard), transport.log


class _PipeWorker(Timed):
    """Worker i's end of its pipe as the worker program's transport; the server gates reads and records updates."""

    def __init__(self, i: int, ch: Channel, opts: PipesOptions):
        super().__init__(i, opts.straggler, opts.managed_bandwidth)
        self.ch, self.ctx = ch, current()
        self.span = self.ctx.span
        self.log: list[tuple[float, int]] = []  # early messages: (seconds since the run started, bytes sent)

    def pull(self, effect: Pull) -> tuple[np.ndarray, None]:
        self.ch.send_array(effect.keys)
        return self.ch.recv_array(), None

    def send_early(self, step: int, keys: np.ndarray, deltas: np.ndarray, now: float) -> int:
        n = self.ch.send_array(_records(keys, deltas), tag=EARLY, step=step)  # send spans of clock ``step``
        self.log.append((now - self.ctx.t0, n))
        return n

    def push(self, effect: Push) -> tuple[bool, int]:
        self.ch.send_array(_records(effect.keys, effect.deltas))
        return True, effect.step + 1  # the server decides what counts; the worker goes on


def _ring(group: WorkerGroup, n: int) -> list[Ring]:
    """A ring of n workers: pipe i joins worker i (its right) to worker i + 1 (its left)."""
    pairs = [group.channel_pair() for _ in range(n)]
    return [Ring(i, n, pairs[i - 1][1], pairs[i][0]) for i in range(n)]


def _records(keys: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """(key, delta) records as a push carries them."""
    msg = np.empty(len(keys), PUSH_DTYPE)
    msg["key"] = keys
    msg["grad"] = deltas
    return msg


def _serve(problem: Any, chans: list[Channel], protocol: Protocol, training: Training,
           evaluate: bool) -> tuple[np.ndarray, Trace, dict]:
    """The server: answer pulls when :class:`ParamServer` allows, apply pushes, record tau per push.

    Returns the table, a trace of its updates and metric points, and its counts of early messages."""
    n, steps = len(chans), training.steps
    server = ParamServer(problem.init_params(), n, protocol, training.rule, read_rule=training.read_rule)
    clock = [-1] * n  # the step of each worker's last pull
    read_version, lag = [0] * n, [0] * n
    held: list[tuple[int, np.ndarray]] = []  # (worker, keys): pulls the protocol holds back
    now = getattr(current(), "now", time.perf_counter)
    # updates with the pushing worker's id, metric points
    record = ServerRecord(problem, training, evaluate, "pipe parameter server", "pipes")
    record.metric(now(), server.params)
    done = 0
    early = {"messages": 0, "entries": 0}

    def answer(pulls: list[tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray]]:
        """Answer the pulls the protocol allows now; the rest, held back."""
        later = []
        for j, keys in pulls:
            if not server.may_read(clock[j]):
                later.append((j, keys))
                continue
            values, read_version[j] = server.pull(keys)
            lag[j] = server.clocks.clock_lag(clock[j])
            chans[j].send_array(values)
        return later

    while done < n:
        for ch in wait(chans):
            i = chans.index(ch)  # type: ignore[arg-type]
            msg = ch.recv_array()
            if msg.dtype.kind != "V":  # a pull's int32 keys; a push's (key, delta) records travel as raw 'V12' bytes
                clock[i] += 1
                held += answer([(i, msg)])
                continue
            c, rec = clock[i], msg.view(PUSH_DTYPE)
            if ch.tag == EARLY:  # part of clock c's push, before its end: into the table, no update yet
                server.add_early(rec["key"], rec["grad"])
                early["messages"] += 1
                early["entries"] += len(rec)
                continue
            applied, tau = server.push(c, rec["key"], rec["grad"], read_version[i])
            if record.update(now(), i, c, tau, applied, lag[i]):
                record.metric(now(), server.params)
            done += c == steps - 1
            held = answer(held)
    server.finish()
    record.metric(now(), server.params)
    return server.params, record.served, early
