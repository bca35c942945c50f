"""All-reduce among the processes of a :class:`~simlib.parallel.WorkerGroup`, and the worker that uses it.

Two ways to sum one float64 vector per process, every process getting the sum:

* :class:`ShmAllReduce` -- through shared segments. Direct (small vectors): each process copies its vector into its
  slot and, after one barrier, sums every slot itself. Else reduce-scatter then all-gather in place: process i copies
  every part but its own into its slot; after a barrier it sums part i (its own vector's and the others' slots'),
  leaving the sum in one of those slots; after a second barrier it copies the other parts' sums out
  (:func:`copies_per_byte`: the memory each moves per byte reduced).
* :class:`Ring` -- the ring over channels: n - 1 steps of reduce-scatter (send part i - s to the right,
  add part i - s - 1 from the left) and n - 1 of all-gather, each message len / n values.

:class:`ReplicaWorker` is the worker program's transport for protocol 'allreduce' on both: its own
replica, each bucket's sum from the collective (on a helper thread with ``overlap``, so that bucket k
is summed while the backward pass makes bucket k + 1), added to the replica at the step's end.
:func:`run_replicas` runs N such workers; the ``shm`` and ``pipes`` substrates differ only in the collective.
"""
from __future__ import annotations

import copy
import platform
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from simlib.contract import Result, Training, local_result, new_trace, record_start
from simlib.parallel.group import WorkerGroup
from simlib.parallel.worker import check_straggler, current, spin_until, straggle
from simlib.protocol import Protocol
from simlib.worker import AllReduce, Bucket, Compute, Plan, Pull, Reduced, allreduce_worker, dense_bucket, drive

_SPIN = 1e-3  # seconds a barrier looks again at once (yielding the core) before it sleeps between looks
# NOTE: the spinning barrier relies on x86-64's store order (a flag raised after the data is seen after it);
# elsewhere the group's semaphore barrier, which orders memory, is used instead.
TSO = platform.machine().lower() in ("x86_64", "amd64")


DIRECT_BYTES = 64 << 10  # up to this every process sums every slot itself: one barrier, where bytes cost less
PAIR_DIRECT_BYTES = 1 << 20  # the same for 2 processes, whose direct sum moves only 1.25x the bytes of the other way


def copies_per_byte(n: int, nbytes: int) -> float:
    """Copies' worth of memory one process moves per byte of :class:`ShmAllReduce` (a copy reads and writes a byte):
    direct, 1 in + (n + 1) / 2 (n reads and a write); else (n - 1) / n in, (n + 2) / (2n) on its part (n reads, the
    sum written twice), (n - 1) / n out: 2.5 - 1 / n."""
    return 1.0 + (n + 1) / 2.0 if _direct(n, nbytes) else 2.5 - 1.0 / n


def _direct(n: int, nbytes: int) -> bool:
    """Whether an all-reduce of ``nbytes`` over n processes goes direct (one barrier) rather than in place (two)."""
    return nbytes <= (PAIR_DIRECT_BYTES if n == 2 else DIRECT_BYTES)


class ShmAllReduce:
    """Sum over n processes of one float64 vector each (``capacity`` values at a time), through shared segments made
    by ``group``; process i calls ``ranks()[i]`` with vectors of the same lengths, in the same order.

    Direct (up to DIRECT_BYTES; PAIR_DIRECT_BYTES for 2 processes): each copies its vector into its slot, and after a
    barrier sums every slot into its own result; the slots alternate between two sets, so that the next call's copy
    cannot overwrite a slot a slower process still reads (it passed this call's barrier only once that process had
    finished the last call). Else reduce-scatter then all-gather in place: process i copies every part j != i of its
    vector into its slot; after a barrier it sums part i of its own vector and of the other slots into its result and
    into slot i + 1's part i (which no other process reads before the next barrier); after a second barrier it copies
    each other part j's sum from slot j + 1. Done, it says so (a barrier's arrival), and the next call waits for the
    others' word before it copies into set 0 again.

    ``blocking``: every barrier is the group's semaphore barrier, whose waiter sleeps in the kernel, holding neither
    a core nor the GIL: for the helper thread of an overlapped all-reduce, whose process computes meanwhile."""

    # NOTE: the flags' barrier spins (yielding the core), then polls every POLL s, taking the GIL at each look: on a
    # helper thread beside the backward pass, 2 processes on 2 cores, it took the time the overlap was to hide. MLP
    # (512, 512, 512, 512), batch 4, 1 MB buckets, 2 shm processes, load 9-13 from other work: 17.8 ms a step (best of
    # 3; median 20.7) at the semaphore barrier, 42.7 (44.6) at the flags. On its own thread a semaphore barrier costs
    # about as much as the flags: a 1 KB all-reduce took 32 us with it, 21-37 us with the flags (load 8).

    # NOTE: above 1 MB 2 processes reduce in place, not by the direct sum of both slots (one barrier, not two): it moves
    # 2 copies' worth of memory a byte, not 2.5, and the 2 processes' vectors, results and shared parts take 20 MB at
    # 4 MB, not the 24 MB that crowded the measured machine's 32 MB L3. Both ways interleaved in one run, 2 processes
    # on 2 cores at load 14-17 from other work, in place against direct (median round of 21, two runs): 2 MB
    # 1.10-1.35x, 4 MB 1.22-1.37x, 16 MB 0.94-1.11x, 64 MB 1.29-1.36x; at 0.25 and 1 MB 0.74x and 0.88x (its second
    # barrier costs more than the bytes it saves), so smaller vectors stay direct.

    def __init__(self, group: WorkerGroup, n: int, capacity: int, blocking: bool = False):
        self.n, self.rank, self.gen = n, 0, 0
        self.set, self.pending, self.free = 1, False, True  # the set last written; an arrival to await; all sets free
        self.slots = group.zeros((2, n, max(capacity, 1)))
        self.total = group.zeros(max(capacity, 1))
        self.flags = group.zeros((n, 8), np.int64)  # a cache line per process: raising one moves no other's line
        self.barrier = group.barrier(n) if blocking or not TSO else None

    def ranks(self) -> list["ShmAllReduce"]:
        """This collective as each process calls it (process i: the i-th)."""
        out = [copy.copy(self) for _ in range(self.n)]
        for i, me in enumerate(out):
            me.rank = i
        return out

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """sum over processes of x (into ``out`` where given)."""
        out = np.empty(len(x)) if out is None else out
        cap = self.total.array.size
        for lo in range(0, len(x), cap):
            self._once(x[lo:lo + cap], out[lo:lo + cap])
        return out

    def _once(self, x: np.ndarray, out: np.ndarray) -> None:
        """out = the sum of every process's x (the class docstring says how)."""
        n, m, me = self.n, len(x), self.rank
        if n == 1:
            out[:] = x
            return
        if _direct(n, 8 * m):
            slots = self._slots()
            slots[me, :m] = x
            self._wait()
            np.add(slots[0, :m], slots[1, :m], out=out)
            for k in range(2, n):
                out += slots[k, :m]
            return
        slots, parts = self._slots(), [self.part(m, j) for j in range(n)]
        for j in range(n):
            if j != me:
                slots[me, parts[j]] = x[parts[j]]
        self._wait()
        mine, others = parts[me], [k for k in range(n) if k != me]
        np.add(x[mine], slots[others[0], mine], out=out[mine])
        for k in others[1:]:
            out[mine] += slots[k, mine]
        slots[(me + 1) % n, mine] = out[mine]
        self._wait()
        for j in others:
            out[parts[j]] = slots[(j + 1) % n, parts[j]]
        self._arrive()
        self.pending = self.free = True

    def _slots(self) -> np.ndarray:
        """The set of slots this call writes: set 0 where every process is done reading (once the arrivals a call
        left are in), else the set the last call did not write (that call's barrier saw everyone done with it)."""
        if self.pending:
            self._await()
        self.set = 0 if self.free else 1 - self.set
        self.pending = self.free = False
        return self.slots.array[self.set]

    def part(self, m: int, i: int | None = None) -> slice:
        """Process i's part (this process's by default) of a vector of ``m`` values."""
        i = self.rank if i is None else i
        return slice(i * m // self.n, (i + 1) * m // self.n)

    def reduce_scatter(self, x: np.ndarray) -> np.ndarray:
        """This process's :meth:`part` of the sum over processes of x (a copy): the first half of an all-reduce."""
        m, sl = len(x), self.part(len(x))
        if m > self.total.array.size:
            raise ValueError(f"reduce_scatter: {m} values, more than the collective's capacity "
                             f"{self.total.array.size}")
        slots = self._slots()
        slots[self.rank, :m] = x
        self._wait()
        return slots[:self.n, sl].sum(axis=0)

    def all_gather(self, part: np.ndarray, m: int) -> np.ndarray:
        """The vector of ``m`` values whose :meth:`part` each process gives: the second half of an all-reduce."""
        total = self.total.array
        total[self.part(m)] = part  # no other process reads this part before the barrier below
        self._wait()
        return total[:m].copy()  # the total is written again only after the next call's barrier

    def _wait(self) -> None:
        """Every process has reached this barrier: its flag raised to the call's generation, the others' awaited."""
        self._arrive()
        self._await()

    def _arrive(self) -> None:
        """Reach the next barrier without waiting at it (the semaphore barrier waits in :meth:`_await` alone)."""
        if self.barrier is None:
            self.gen += 1
            self.flags.array[self.rank, 0] = self.gen

    def _await(self) -> None:
        """Wait until every process has reached the barrier this one last reached."""
        if self.barrier is not None:
            self.barrier.wait()
            return
        flags = self.flags.array[:, 0]
        spin_until(lambda: min(flags.tolist()) >= self.gen, _SPIN)


class Ring:
    """Process ``rank`` of a ring of n over channels: it sends to ``right`` and receives from ``left``; ``sent`` counts
    the payload bytes it sent, 2 (n - 1) / n of each vector's."""

    def __init__(self, rank: int, n: int, left: Any, right: Any):
        self.rank, self.n, self.left, self.right = rank, n, left, right
        self.sent = 0

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """sum over processes of x (any shape), into ``out`` where given (x itself may be it): ring reduce-scatter,
        then all-gather."""
        out, n, i = np.array(x, dtype=np.float64) if out is None else out, self.n, self.rank
        if out is not x:
            out[...] = x
        if n == 1:
            return out
        flat = out.reshape(-1)  # a view: the copy above is contiguous
        bounds = np.linspace(0, len(flat), n + 1).astype(int)
        part = [flat[bounds[k]:bounds[k + 1]] for k in range(n)]
        buf = np.empty(int(np.diff(bounds).max()))
        for s in range(n - 1):  # part (i + 1) mod n ends as the full sum here
            got = self._exchange(part[(i - s) % n], buf[:len(part[(i - s - 1) % n])])
            part[(i - s - 1) % n] += got
        for s in range(n - 1):
            self._exchange(part[(i + 1 - s) % n], part[(i - s) % n])
        return out

    def _exchange(self, send: np.ndarray, into: np.ndarray) -> np.ndarray:
        """Send ``send`` right and receive ``into`` from the left; process 0 receives first, so that a message
        larger than a pipe's buffer never has every process blocked in its send."""
        if self.rank == 0:
            self.left.conn.recv_bytes_into(into)
            self.right.conn.send_bytes(send)
        else:
            self.right.conn.send_bytes(send)
            self.left.conn.recv_bytes_into(into)
        self.sent += send.nbytes
        return into


class ReplicaWorker:
    """Worker i's transport under all-reduce: pulls read its replica, each bucket is summed by ``reduce`` (on a
    helper thread with ``overlap``), and the sums are added to the replica at :class:`Reduced`."""

    def __init__(self, i: int, replica: np.ndarray, reduce: Callable[..., np.ndarray], overlap: bool,
                 straggler: tuple[int, float] | None = None):
        self.i, self.w, self.reduce, self.ctx, self.straggler = i, replica, reduce, current(), straggler
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="all-reduce") if overlap else None
        self.pending: list[tuple[Any, Any]] = []  # (keys, the sum or its Future)

    def pull(self, effect: Pull) -> tuple[np.ndarray, int]:
        return self.w[effect.keys], 0

    def compute(self, effect: Compute) -> Any:
        with self.ctx.timed("compute", effect.step):
            return effect.fn(*effect.args)

    def all_reduce(self, effect: AllReduce) -> None:
        self.bucket(dense_bucket(effect, len(self.w)))

    def bucket(self, effect: Bucket) -> None:
        x = np.asarray(effect.deltas, dtype=np.float64)
        total = self._summed(effect.step, x) if self.pool is None else self.pool.submit(self._summed, effect.step, x)
        self.pending.append((effect.keys, total))

    def _summed(self, c: int, x: np.ndarray) -> np.ndarray:
        """The bucket's sum over every worker, written over the bucket, its all-reduce recorded as one send span."""
        # NOTE: a fresh result faulted its pages in on every call: two fresh 6.6 MB arrays took 4.0 ms (1,142 page
        # faults) against 0.6 ms where the memory was reused, on the measured 2-core virtual machine under load
        with self.ctx.timed("send", c, x.nbytes):
            return self.reduce(x, x)

    def reduced(self, effect: Reduced) -> None:
        straggle(self.straggler, self.i)  # a slow machine's steps take longer: every replica waits for its buckets
        for keys, total in self.pending:
            self.w[keys] += total.result() if isinstance(total, Future) else total
        self.pending = []
        self.ctx.update(effect.step, 0, True, 0)

    def close(self) -> None:
        """Stop the helper thread without waiting: after a failure it may be held at a barrier no peer will reach
        (the group then stops this process; the failure must reach the group first)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def run_replicas(problem: Any, protocol: Protocol, training: Training, opts: Any, substrate: str, where: str,
                 links: Callable[[WorkerGroup, int], list[Any]]) -> Result:
    """N workers, each with a replica, on the collective ``links(group, n)`` gives (one callable per worker,
    ``reduce(x, out)``, which sums x over the workers into ``out``: here x itself); ``opts``: the substrate's
    WorkerOptions (bucket_bytes, overlap, start_method, timeout, straggler: that worker sleeps so long after each
    step's backward pass). Result.params is worker 0's replica; ``measured['replica_spread']`` the largest
    |w_i - w_0|."""
    n = training.n_workers
    check_straggler(getattr(opts, "straggler", None), n)
    shards = problem.shards(n)
    w0 = np.asarray(problem.init_params(), dtype=np.float64)
    trace = new_trace(problem, protocol, training, substrate, where, bucket_bytes=opts.bucket_bytes,
                      overlap=bool(opts.overlap and opts.bucket_bytes), path="all-reduce")
    record_start(trace, problem, w0)
    started = time.perf_counter()
    with WorkerGroup(n, opts.start_method, label=f"{substrate} all-reduce") as group:
        reducers = links(group, n)
        out = group.run(_member, problem, shards, training, opts, w0, worker_args=[(r,) for r in reducers],
                        timeout=opts.timeout)
    wall = time.perf_counter() - started
    trace.spans, trace.updates = group.trace.spans, group.trace.updates
    params = out[0][0]
    trace.record_quality(wall, n * training.steps, float(problem.quality(params)))
    compute = [s for s in trace.spans if s.kind == "compute"]
    train = max(s.end for s in trace.spans) - min(s.start for s in compute) if compute else 0.0
    spread = max(float(np.max(np.abs(w - params))) for w, _ in out)
    return Result(trace, params, {"wall_seconds": wall, "train_seconds": train, "replica_spread": spread,
                                  "local": [local for _, local in out]})


def _member(i: int, n: int, problem: Any, shards: list, training: Training, opts: Any, w0: np.ndarray,
            reduce: Callable[..., np.ndarray]) -> tuple[np.ndarray, Any]:
    """Worker i: the all-reduce worker program on its own replica; returns the replica at the end and the worker's
    local state (:func:`simlib.contract.local_result`: LDA's topics, which its counts are the counts of)."""
    transport = ReplicaWorker(i, w0.copy(), reduce, opts.overlap, getattr(opts, "straggler", None))
    plan = Plan(training.steps, training.batch_size, training.lr)
    try:
        drive(allreduce_worker(problem, shards[i], plan, bucket_bytes=opts.bucket_bytes), transport)
    finally:
        transport.close()
    return transport.w, local_result(problem, shards[i])
