"""The ``shm`` substrate: N worker processes sharing the table in shared memory, for any Problem.

The table is a :class:`~simlib.parallel.SharedArray`; so are each worker's finished clock and the
table's version (updates applied). One step of worker i at clock c:

    wait   until the protocol allows the read: ``may_read(c, min(finished clocks), bound)``
    get    copy table[keys] and the version v it was read at
    step   the problem's update on the values read (no lock held)
    add    under a short lock: tau = version - v, table[keys] += deltas * rule.scale(tau), version += 1
    clock  publish finished clock c + 1

The get and the add each hold one short lock, so tau is exact and no read sees half an add; the
step, where the time goes, runs unlocked. Each worker is the one worker program
(:func:`simlib.worker.ps_worker`) on this transport, so its features hold here too: ``compression``
(each push encoded by its worker), ``clock_batches`` and ``managed_bandwidth`` (Bosen's clocks, early
writes within a budget), ESSP (every read is of the table itself), and backup workers: under the
lock the table counts each open step's pushes, a step completes with its n - b-th push, later pushes
for it are dropped and their worker rejoins at the first step not complete.

Under protocol ``'allreduce'`` every worker keeps a replica of the table instead, and each bucket of its
gradient is summed with the others' through shared segments (:class:`simlib.parallel.allreduce.ShmAllReduce`:
direct for small vectors, else reduce-scatter then all-gather in place), on a helper thread while the backward pass goes on
(``bucket_bytes``, ``overlap``); the metric is recorded at the start and the end.

A problem with the local-step hook (``problem.local_steps(table, shard, first, count, batch_size,
lr)``, which applies a chunk of steps to the table in place, compiled) runs on the fast path
instead whenever every push lands as it is (the plain step rule): each worker reads the clocks,
applies as many steps as the protocol allows (at most ``chunk`` of them; under a bound of at least
``chunk`` - 1 steps a worker waits until a whole chunk is allowed) straight to the shared table,
unlocked (a problem that names ``in_place_words`` gets that many shared int32 words as ``shared=``:
LDA's locks on blocks of rows and its word kernel's lists), and publishes its clock. Under async
that is Hogwild!. Reads then race with other workers' writes (the lesson), so tau is measured per chunk, as the other
workers' steps completed during it per step of this worker, and the trace holds one update per chunk.

With ``hot_keys=K`` (a problem with ``replica``, LogisticProblem at one row per step), each worker
also keeps a private replica of the K most frequent keys: read from the table at a chunk's start,
updated there during the chunk, its change added to the table at the chunk's end, 1 / (1 + m) of it
where m other replicas pushed meanwhile (overlapping replicas' changes averaged, as in HogWild++:
they stepped the hot keys from the same values, so their whole changes added would overshoot), one
read or push at a time (a token). Under Hogwild! the frequent features are written by every worker
on nearly every row, and each such write takes the cache line from the other cores; with the replica
they move once per chunk (with K = every key, no line moves between two pushes). The price is
staleness: a worker sees the others' changes to them once per chunk. One update of the trace is
then also the push of that chunk's replica (its count is in the table's version key).

Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> import simlib
    >>> prob = LogisticProblem(make_sparse_classification(2_000, 200, 10, seed=0), eval_rows=500)
    >>> res = simlib.run(prob, "ssp:1", substrate="shm", n_workers=2, steps=10)
    >>> res.trace.summary()["max_clock_lag"] <= 1, res.trace.meta["path"]
    (True, 'in place')
"""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.contract import Result, Training, capabilities, local_result, new_trace, record_metric
from simlib.contract import warm_up
from simlib.parallel.allreduce import ShmAllReduce, run_replicas
from simlib.parallel.group import START_METHODS, WorkerGroup
from simlib.parallel.worker import check_straggler, current, spin_until
from simlib.protocol import Protocol, may_read, read_allowed, staleness
from simlib.worker import Gate, InPlace, Plan, Pull, Push, Timed, WorkerOptions, drive, ps_worker
from simlib.compress import worker_compressor

_SPIN = 5e-4  # seconds a worker held back by the protocol looks again at once (yielding its core) before it sleeps


CHUNK_WORK = 10_000  # rows (batch_size x steps) a fast-path worker applies between two looks at the clocks


@dataclass(frozen=True)
class ShmOptions(WorkerOptions):
    """The substrate's own options, ``simlib.run(..., substrate="shm", **options)``.

    ``chunk``: the most steps a worker applies between two looks at the clocks on the fast path
    (default: the problem's ``in_place_chunk`` if it has one, else 10,000 rows' worth,
    ``max(1, 10_000 // batch_size)``). ``locked=True``: one lock held around every step's read, compute
    and write (the locked baseline Hogwild! is measured against). ``straggler=(i, s)``: worker i sleeps
    s seconds after each step (after each chunk on the fast path), a slow machine. ``hot_keys=K`` (fast
    path, problems with ``replica``): each worker keeps a private replica of the problem's K hot keys,
    updates it during a chunk, and adds its change to the table at the chunk's end (1 / (1 + m) of it
    where m other replicas pushed during the chunk); every other key is written in place as before. The
    trace's update per chunk is then also the push of that chunk's replica.
    """

    start_method: str | None = None
    timeout: float | None = 120.0  # seconds for the whole run
    monitor_every: float = 0.05  # seconds between two records of the metric
    chunk: int | None = None
    locked: bool = False
    straggler: tuple[int, float] | None = None
    hot_keys: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk is not None:
            check.positive_int("chunk", self.chunk)
        check.boolean("locked", self.locked)
        if self.start_method is not None:  # named before the warm-up compiles anything
            check.one_of("start_method", self.start_method, START_METHODS)
        check.non_negative_int("hot_keys", self.hot_keys)  # 0: no replica
        check.positive("monitor_every", self.monitor_every)  # (the worker group named it only after the warm-up)
        if self.timeout is not None:
            check.positive("timeout", self.timeout)


def run(problem: Any, protocol: Protocol, training: Training, **options: Any) -> Result:
    """The substrate entry point (``simlib.run(..., substrate="shm")``); ``options``: :class:`ShmOptions`.

    Records the metric every ``monitor_every`` s. ``measured`` holds ``wall_seconds``, ``train_seconds``
    (first compute span's start to the last's end), ``cpu_seconds`` (the CPU time the workers' loops got,
    summed), and ``local``, each worker's :func:`simlib.contract.local_result` (None where the problem keeps no
    part of a worker's state).
    """
    opts = check.options(ShmOptions, options, "substrate 'shm'")
    if protocol.kind == "allreduce":  # every worker a replica; each bucket summed through shared segments
        for name, value in (("locked", opts.locked), ("hot_keys", opts.hot_keys)):
            if value:
                raise ValueError(f"{name}: the shared table's option; under protocol 'allreduce' every worker has a "
                                 "replica of its own")
        return run_replicas(problem, protocol, training, opts, "shm", "on shared memory",
                            lambda group, n: ShmAllReduce(group, n, problem.n_params,
                                                          blocking=bool(opts.overlap and opts.bucket_bytes)).ranks())
    if protocol.backup_workers and training.read_rule is not None:
        raise ValueError("read_rule: with backup_workers the shared table counts pushes only for the steps SSP's own "
                         "rule lets open (a ring of bound + 2); use the built-in read rule")
    check_straggler(opts.straggler, training.n_workers)
    # compression and clocks of several mini-batches change what a push is: the get / step / add path
    plain_push = opts.compression in (None, "none") and opts.clock_batches == 1 and not protocol.backup_workers
    caps = capabilities(problem)
    if not plain_push and caps.in_place_only:
        raise ValueError(f"compression, clock_batches: {type(problem).__name__}'s steps exist only in place, where "
                         "there is no push to compress or to sum over a clock")
    fast = caps.local_steps is not None and training.rule.plain and plain_push
    replica = _replica(problem, caps, opts.hot_keys, fast, opts.locked, training)
    # a problem whose one step is already a lot of work (LDA: a sweep) names its own chunk (1: publish every step)
    chunk = opts.chunk or caps.in_place_chunk or max(1, CHUNK_WORK // training.batch_size)
    n = training.n_workers
    shards = problem.shards(n)
    # A problem may keep its table in a narrower type here (LDA's counts as int32, GloVe's floats as float32):
    # nothing crosses a wire, and the in-place kernels then move half the bytes.
    dtype = caps.table_dtype
    # The problem's kernels compiled here, once, not by every forked worker at the same time.
    warm_up(problem, values=lambda v: v.astype(dtype))
    if fast:  # with the types the workers pass; two steps, as a problem's steps may take turns (GloveSlices' phases)
        # on the miniature where the problem has one: its shard is its whole state (LDA's topics), not to be stepped here
        warm = problem if caps.miniature is None else caps.miniature()
        warm.local_steps(_initial_table(warm, dtype), shards[0] if warm is problem else warm.shards(1)[0], 0, 2, 1, 0.0,
                         **({} if replica is None else {"replica": replica}))
    started = time.perf_counter()
    with WorkerGroup(n, opts.start_method, label="shm table") as group:
        table = group.copy_of(_initial_table(problem, dtype))
        clocks = group.zeros(n, np.int64)
        version = group.zeros(1, np.int64)
        lock = group.lock()
        ready = group.zeros(n, np.int64)
        # the in-place steps' own shared words (LDA's block locks and word lists), where the problem names how many
        n_words = caps.in_place_words(n) if fast and n > 1 and caps.in_place_words is not None else 0
        step_words = group.zeros(n_words, np.int32) if n_words else None
        # backup workers: [steps complete, then the pushes counted for each open step, a ring of bound + 2]
        done = group.zeros(int(protocol.bound) + 3, np.int64) if protocol.backup_workers else None
        setup = _Setup(shards, protocol.bound, training, table, clocks, ready, lock, opts, chunk, replica, step_words,
                       fast, n - protocol.backup_workers, done)

        def monitor(elapsed: float) -> None:
            """The metric now; Diverged (which stops the workers) if it is not finite."""
            record_metric(group.trace, problem, elapsed, int(clocks.array.sum()), table.array.copy(), training.lr)

        monitor(0.0)
        out = group.run(_member, problem, setup, version, monitor=monitor, monitor_every=opts.monitor_every,
                        timeout=opts.timeout)
        params = table.array.copy()
    wall = time.perf_counter() - started
    trace = new_trace(problem, protocol, training, "shm", "on shared memory" + (", locked" if opts.locked else ""),
                      wall_seconds=wall, start_method=group.start_method,
                      path="in place" if fast else "get / step / add",
                      update_unit=_update_unit(fast, chunk, opts.hot_keys))
    trace.spans, trace.updates, trace.quality = group.trace.spans, group.trace.updates, group.trace.quality
    compute = [s for s in trace.spans if s.kind == "compute"]
    train = max(s.end for s in compute) - min(s.start for s in compute) if compute else 0.0
    return Result(trace, params, {"wall_seconds": wall, "train_seconds": train,
                                  "cpu_seconds": float(sum(cpu for cpu, _ in out)),
                                  "local": [local for _, local in out]})


run.options = ShmOptions  # type: ignore[attr-defined]  # simlib.run checks the option names against its fields


@dataclass(frozen=True)
class _Setup:
    """What every worker of one run is given: the shards, the protocol's bound, the settings, the shared arrays."""

    shards: list[tuple[int, int]]
    bound: float
    training: Training
    table: Any  # SharedArray: the parameters
    clocks: Any  # SharedArray: each worker's finished steps
    ready: Any  # SharedArray: 1 once a worker has started (see _member)
    lock: Any
    opts: ShmOptions  # its ``locked`` (one lock around each whole step: the locked baseline) and ``straggler``
    chunk: int  # fast path: the most steps between two looks at the clocks
    replica: Any  # fast path: the problem's replica of its hot keys, or None
    step_words: Any  # fast path: SharedArray of the words the problem's in-place steps share (LDA's locks, lists) or None
    fast: bool  # the in-place path (local_steps), else get / step / add
    quorum: int  # pushes that complete a step: n - backup workers
    done: Any  # with backup workers, SharedArray [steps complete, pushes counted per open step (a ring)]; else None


def _member(i: int, n: int, problem: Any, setup: _Setup, version: Any) -> tuple[float, Any]:
    """One worker: wait until every worker has started, run its path's steps; its CPU seconds and ``local_result``."""
    # NOTE: processes start 5-30 ms apart (fork, import); a 2-worker Hogwild! run of 0.2 s lost up to 15 % of
    # its training time with one worker alone at the start. The wait yields the core, and comes before any span.
    ready = setup.ready.array
    ready[i] = 1
    while int(ready.min()) == 0:
        os.sched_yield()
    cpu0 = time.thread_time()
    tr, opts = setup.training, setup.opts
    plan = Plan(tr.steps, tr.batch_size, tr.lr, clock_batches=opts.clock_batches, in_place=setup.fast,
                entry_bytes=4 + np.dtype(setup.table.array.dtype).itemsize)
    compressor = worker_compressor(opts.compression, problem.n_params, tr.seed, i)
    drive(ps_worker(problem, setup.shards[i], plan, compressor), _ShmWorker(i, problem, setup, version))
    return time.thread_time() - cpu0, local_result(problem, setup.shards[i])


def _replica(problem: Any, caps: Any, hot_keys: int, fast: bool, locked: bool, training: Training) -> Any:
    """The problem's private replica of its ``hot_keys`` hot keys (None for 0); ValueError where it cannot apply."""
    if not hot_keys:
        return None
    if not fast or caps.replica is None:
        raise ValueError(f"hot_keys: {type(problem).__name__} keeps no replica on this path (it needs the in-place "
                         "local_steps with a replica, and the plain step rule)")
    if locked:
        raise ValueError("hot_keys: the locked baseline applies each step to the table under the lock; "
                         "use hot_keys=0 with locked=True")
    return caps.replica(int(hot_keys), training.batch_size, training.n_workers)


def _update_unit(fast: bool, chunk: int, hot_keys: int) -> str:
    """What one update of the trace stands for on this path (hot keys only on the fast path: see _replica)."""
    unit = f"a chunk of up to {chunk} steps" if fast and chunk > 1 else "one step"
    return unit + (f", and the push of its {hot_keys} hot keys' replica at its end" if hot_keys else "")


def _initial_table(problem: Any, dtype: np.dtype) -> np.ndarray:
    """The table at the start, in ``dtype``: ``problem.init_table(dtype)`` where offered (no float64 copy), else cast."""
    init = capabilities(problem).init_table
    return np.asarray(problem.init_params()).astype(dtype) if init is None else init(dtype)


def _wait_to_read(read_rule: Any, clock: int, fin: np.ndarray, bound: float) -> tuple[int, bool]:
    """Wait until the protocol lets a worker at ``clock`` read; (steps every worker has completed, whether it waited)."""
    # NOTE: min of a list, not fin.min(): 0.3 us instead of 2 (NumPy's reduction set-up) per look, 2 looks a chunk.
    if read_allowed(read_rule, clock, completed := min(fin.tolist()), bound):
        return completed, False
    spin_until(lambda: read_allowed(read_rule, clock, min(fin.tolist()), bound), _SPIN)
    return min(fin.tolist()), True


class _ShmWorker(Timed):
    """Worker i's transport over the shared table: the clocks gate reads, get and add hold one short lock.

    ``opts.locked``: one lock held from the read to the write (the locked baseline Hogwild! is measured against).
    In place (the fast path): the steps the protocol allows, up to a chunk, applied to the table straight away;
    tau per chunk is the other workers' steps completed during it per step of this one."""

    def __init__(self, i: int, problem: Any, setup: _Setup, version: Any):
        super().__init__(i, setup.opts.straggler, setup.opts.managed_bandwidth)
        self.problem, self.setup, self.ctx = problem, setup, current()
        self.span = self.ctx.span
        self.training, self.bound, self.shard = setup.training, setup.bound, setup.shards[i]
        self.w, self.fin, self.ver = setup.table.array, setup.clocks.array, version.array
        self.read_rule = setup.training.read_rule
        self.outer, self.inner = (setup.lock, nullcontext()) if setup.opts.locked else (nullcontext(), setup.lock)
        self.shared = {}  # what the problem's in-place steps share besides the table
        if setup.replica is not None:  # the replicas count their pushes in the version key, unused in place
            self.shared["replica"] = setup.replica._replace(pushes=version.array)
        if setup.step_words is not None:
            self.shared["shared"] = setup.step_words.array
        self.completed = self.others = 0
        # the steps complete: every worker's finished clock, or with backup workers the count of the quorums reached
        self.steps_done = self.fin if setup.done is None else setup.done.array[:1]

    def gate(self, effect: Gate) -> int:
        c, setup = effect.step, self.setup
        t0 = time.perf_counter()
        # NOTE: in place under a bound (SSP) a worker ahead waits until a whole chunk may run, not only its first
        # step: each chunk ends in a look at the clocks and a replica's push (hot_keys: every replicated key), and a
        # worker at its bound ran chunks of a step or two back to back (2 Hogwild! processes with replicas under
        # SSP: median 1.29-1.44x scikit-learn against async's 1.59-1.61x). Waiting longer than the bound asks is
        # allowed; the worker's own clock lets it, so nobody waits for a worker that waits (chunk - 1 <= bound).
        want = min(setup.chunk, self.training.steps - c) if setup.fast and not self.read_rule else 1
        last = c + want - 1 if want - 1 <= self.bound else c
        self.completed, waited = _wait_to_read(self.read_rule or may_read, last, self.steps_done, self.bound)
        t1 = time.perf_counter()
        if waited or not setup.fast:
            self.ctx.span("wait", t0, t1, step=c)
        self.mark = t1
        if not setup.fast:
            return 1
        # Steps c .. c+k-1 may all read now: the SSP rule allows step j while j - bound <= completed.
        # A plugged-in rule is asked step by step.
        k = min(setup.chunk, self.training.steps - c,
                1 if self.read_rule else int(min(self.completed + self.bound - c + 1, setup.chunk)))
        self.others = sum(self.fin.tolist()) - c
        return k

    def pull(self, effect: Pull) -> tuple[np.ndarray, int]:
        self.outer.__enter__()
        with self.inner:  # a consistent (values, version) pair; the add takes the same lock
            values, version = self.w[effect.keys].copy(), int(self.ver[0])
        self.ctx.span("recv", self.mark, time.perf_counter(), nbytes=int(values.nbytes + effect.keys.nbytes),
                      step=effect.step)
        return values, version

    def in_place(self, effect: InPlace) -> None:
        tr, c, k = self.training, effect.step, effect.count
        if not self.setup.opts.locked:
            self.problem.local_steps(self.w, self.shard, c, k, tr.batch_size, tr.lr, **self.shared)
        else:
            for j in range(c, c + k):  # NOTE: one call per step, because the lock must cover each single update
                with self.setup.lock:
                    self.problem.local_steps(self.w, self.shard, j, 1, tr.batch_size, tr.lr)
        self.straggle()

    def send_early(self, step: int, keys: np.ndarray, deltas: np.ndarray, now: float) -> int:
        """Managed communication: the largest pending changes written to the table as they are (not an update:
        the clock's push completes the clock)."""
        with self.inner:
            self.training.rule.land(self.w, keys, deltas, 0)
        nbytes = len(keys) * (4 + self.w.itemsize)
        self.ctx.span("send", now, time.perf_counter(), nbytes=nbytes, step=step)
        return nbytes

    def push(self, effect: Push) -> tuple[bool, int]:
        c = effect.step
        if effect.keys is None:  # in place: the chunk ending at step c is in the table; publish its clock
            k = c + 1 - self.fin[self.i]
            self.fin[self.i] = c + 1
            t2 = time.perf_counter()
            self.ctx.span("compute", self.mark, t2, step=c)
            # other workers' steps per step of this chunk (under BSP a round is one update: 0)
            tau = staleness(self.bound, round((sum(self.fin.tolist()) - c - 1 - self.others) / k), 0)
        else:
            with self.inner:
                tau = staleness(self.bound, int(self.ver[0]), effect.version)
                applied = self.setup.done is None or self._count(c)
                if applied:
                    self.training.rule.land(self.w, effect.keys, effect.deltas, tau)
                    self.ver[0] += 1
                complete = int(min(self.steps_done.tolist()))
            self.outer.__exit__(None, None, None)
            # a dropped push (backup workers) rejoins at the first step not complete, as the worker program does
            self.fin[self.i] = c + 1 if applied else max(c + 1, complete)
            self.ctx.span("send", self.mark, time.perf_counter(), nbytes=effect.nbytes, step=c)
            self.ctx.update(c, staleness=tau, applied=applied, clock_lag=c - self.completed)
            return applied, complete
        self.ctx.update(c, staleness=tau, clock_lag=c - self.completed)
        return True, c + 1

    def _count(self, c: int) -> bool:
        """Under the lock: count a push for step c (False: the step is complete, the push is dropped); step c
        completes with its quorum's push, and the complete steps advance over every step that has its quorum."""
        done = self.setup.done.array
        ring = done[1:]
        if c < done[0]:
            return False
        ring[c % len(ring)] += 1
        while ring[done[0] % len(ring)] >= self.setup.quorum:
            ring[done[0] % len(ring)] = 0
            done[0] += 1
        return True
