"""The ``gpu`` substrate: the table as one device array, workers as lock-step batches (NumPy twin on the CPU).

Two paths, as on shared memory:

* **In place** (a problem with the local-step hook ``local_steps``, and a plain step rule): the
  problem's own kernels apply each mini-batch to the device table, every row of a batch reading the
  same weights (the GPU's Hogwild!: row i of a batch misses the i updates before it). The schedule
  is the one below: in round c every worker steps from the same read of the table and the changes
  are added. One worker runs whole chunks of steps between evaluations, with no host sync inside.
  On CuPy the problem must declare ``device_kernel`` (its hook takes device arrays; the logistic,
  GloVe and LDA problems do, with fused CUDA kernels). A problem whose device steps differ from its
  CPU ones supplies ``device_steps`` with the same signature, which this substrate prefers (LDA: a
  block per document drawing a few of its tokens at once, or batches of tokens, where the CPU sweep
  is sequential). A hook may return a
  :class:`~simlib.backend.InFlight` (lock-free device steps, ``device_kernel='hogwild'``): the most
  rows one of its rows missed becomes the update's staleness, and the totals go to
  ``trace.meta["in_flight"]``. A problem whose ``device_reads_apart`` is true takes ``read=`` in its
  hook on CuPy: each worker's step is computed from the round's snapshot and added to the table
  directly, where others get a scratch copy each.
* **Get / step / add** (any other rule): round c, every worker reads table[keys] from the same
  table, and the pushes go through :class:`~simlib.contract.ParamServer` in worker order, so worker
  i's push lands on top of i others: tau = i. No worker gets ahead of another, a valid schedule under
  BSP, SSP(s) and async alike.

* **All-reduce** (protocol ``'allreduce'``): every replica is the one device table; round c adds the
  sum of every worker's gradient (bucket by bucket with ``bucket_bytes``) to it once.

Each problem's device steps live beside its math (:mod:`simlib.problems.logistic_device`,
:mod:`~simlib.problems.glove_device`, :mod:`~simlib.problems.lda_device`); fused CUDA kernels are chosen
by :func:`simlib.backend.use_fused` and compiled once by :func:`simlib.backend.cuda_kernels`.

The array module comes from ``xp`` ('auto': CuPy when a device is present); the trace's ``path``
says which path ran. Example::

    >>> import simlib
    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(1_000, 100, 5, seed=0), eval_rows=None)
    >>> res = simlib.run(prob, "async", substrate="gpu", n_workers=4, steps=5, xp="numpy")
    >>> res.trace.meta["path"], sorted({u.staleness for u in res.trace.updates})
    ('in place', [0, 1, 2, 3])
    >>> from simlib.protocol import StepRule
    >>> aware = StepRule(staleness_aware=True)
    >>> res = simlib.run(prob, "async", substrate="gpu", n_workers=4, steps=5, xp="numpy", rule=aware)
    >>> res.trace.meta["path"], sorted({u.staleness for u in res.trace.updates})
    ('get / step / add', [0, 1, 2, 3])
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from simlib.backend import InFlight, get_xp, synchronize, to_numpy
from simlib.contract import ParamServer, Result, capabilities, Training, local_result, new_trace, record_metric, record_start
from simlib.protocol import Protocol, may_read, read_allowed, staleness
from simlib.compress import worker_compressor
from simlib.worker import AllReduce, Bucket, Compute, Gate, InPlace, Plan, Pull, Push, Reduced, WorkerOptions
from simlib.worker import allreduce_worker, drive_rounds, ps_worker


def run(problem: Any, protocol: Protocol, training: Training, xp: str = "auto", compression: Any = None,
        bucket_bytes: int | None = None) -> Result:
    """The substrate entry point (``simlib.run(..., substrate="gpu", xp="numpy"|"cupy"|"auto")``); ``compression``
    encodes each worker's push (the get / step / add path, on the NumPy twin: the compressors are NumPy code);
    ``bucket_bytes``: protocol 'allreduce' sums each worker's gradient in buckets of about this many bytes."""
    WorkerOptions(bucket_bytes=bucket_bytes, compression=compression)  # a bad size or spec named before anything runs
    mod = get_xp(xp)
    if compression not in (None, "none") and mod is not np:
        raise ValueError("compression: the compressors are NumPy code; use xp='numpy' with compression")
    shards, caps = problem.shards(training.n_workers), capabilities(problem)
    if protocol.kind == "allreduce":
        transport = _AllReduceRounds(problem, protocol, training, mod, shards, caps)
        plan = Plan(training.steps, training.batch_size, training.lr)
        programs = [allreduce_worker(problem, shard, plan, bucket_bytes=bucket_bytes) for shard in shards]
    else:
        # the hook: ``device_steps`` where a problem's device steps differ from its CPU ones (LDA's), else local_steps
        in_place = callable(caps.in_place) and training.rule.plain and compression in (None, "none") and (
            mod is np or caps.device_kernel is not None)
        transport = (_InPlace if in_place else _Rounds)(problem, protocol, training, mod, shards, caps)
        plan = Plan(training.steps, training.batch_size, training.lr, in_place=in_place)
        programs = [ps_worker(problem, shard, plan, worker_compressor(compression, problem.n_params, training.seed, i))
                    for i, shard in enumerate(shards)]
    drive_rounds(programs, transport)
    return transport.result()


class _Rounds:
    """The device's transport: round c, every worker reads table[keys] from the same table (the pushes wait for
    the round's end), then the pushes go through the contract's server in worker order (worker i's on top of i
    others: tau = i under async and SSP, 0 under BSP)."""

    path = "get / step / add"  # the trace's meta['path']

    def __init__(self, problem: Any, protocol: Protocol, training: Training, mod: Any, shards: list, caps: Any,
                 table: Any = None, **meta: Any):
        # The contract's server on the device table: the read rule, the step rule and tau, as on every substrate.
        self.server = ParamServer(mod.asarray(problem.init_params()) if table is None else table, training.n_workers,
                                  protocol, training.rule, read_rule=training.read_rule)
        self.problem, self.protocol, self.training, self.mod, self.shards = problem, protocol, training, mod, shards
        self.trace = new_trace(problem, protocol, training, "gpu", f"on {'CuPy' if mod is not np else 'NumPy'}",
                               unit="batch", xp=mod.__name__, path=self.path, **meta)
        self.t0 = time.perf_counter()
        record_start(self.trace, problem, self.table)
        self.start = 0.0
        self.taus: list[int] = []

    @property
    def table(self) -> Any:
        return self.server.params

    def gate(self, i: int, effect: Gate) -> int:
        if i == 0:  # the round starts
            self.start, self.taus = time.perf_counter() - self.t0, []
            self.server.may_read(effect.step)  # lock-step: the rule allows it or says why not
        return 1

    def pull(self, i: int, effect: Pull) -> tuple[Any, int]:
        return self.table[self.mod.asarray(effect.keys)], self.server.version

    def compute(self, i: int, effect: Compute) -> Any:
        return effect.fn(*effect.args)

    def push(self, i: int, effect: Push) -> tuple[bool, int]:
        start = time.perf_counter() - self.t0
        self.taus.append(self.server.push(effect.step, self.mod.asarray(effect.keys), effect.deltas,
                                          effect.version)[1])
        self.trace.span(i, "send", start, time.perf_counter() - self.t0, nbytes=effect.nbytes, step=effect.step)
        return True, effect.step + 1

    def round_end(self, last: int) -> None:
        """Steps up to ``last`` done by every worker: their spans and updates, the metric where it is due."""
        synchronize(self.mod)
        now = time.perf_counter() - self.t0
        for i, tau in enumerate(self.taus):
            self.trace.span(i, "compute", self.start, now, step=last)
            self.trace.update(now, i, last, tau, True, clock_lag=0)
        done, tr = last + 1, self.training
        if done % tr.eval_every == 0 or done == tr.steps:
            if done == tr.steps:
                self.finish()
            record_metric(self.trace, self.problem, time.perf_counter() - self.t0, done * tr.n_workers, self.table,
                          tr.lr)

    def finish(self) -> None:
        """The run's end: a partial accumulation group is applied."""
        self.server.finish()

    def result(self) -> Result:
        return Result(self.trace, to_numpy(self.table), {"wall_seconds": time.perf_counter() - self.t0,
                                                         "local": [local_result(self.problem, s) for s in self.shards]})


class _AllReduceRounds(_Rounds):
    """All-reduce in device rounds: every worker's replica is the one device table (they are equal at every step's
    start); round c sums every worker's gradient (bucket by bucket) and adds the sum to it once."""

    path = "all-reduce"

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.total = self.mod.zeros_like(self.table)

    def pull(self, i: int, effect: Pull) -> tuple[Any, int]:
        if i == 0:  # the round starts
            self.start = time.perf_counter() - self.t0
        return self.table[self.mod.asarray(effect.keys)], 0

    def all_reduce(self, i: int, effect: AllReduce) -> None:
        self.bucket(i, Bucket(effect.step, 0, self.mod.asarray(effect.keys), effect.deltas))

    def bucket(self, i: int, effect: Bucket) -> None:
        start = time.perf_counter() - self.t0
        self.total[effect.keys] += effect.deltas  # a push's keys are distinct, as the server's add takes them
        self.trace.span(i, "send", start, time.perf_counter() - self.t0, nbytes=int(effect.deltas.nbytes),
                        step=effect.step)

    def reduced(self, i: int, effect: Reduced) -> None:
        if i == self.training.n_workers - 1:  # every worker's gradient is in: the sum lands once
            self.table[...] += self.total
            self.total[...] = 0
            self.taus = [0] * self.training.n_workers


class _InPlace(_Rounds):
    """The fast path: the problem's ``hook`` on the device table, on the get / step / add path's schedule (one
    worker: every step up to the next evaluation in one call)."""

    path = "in place"

    def __init__(self, problem: Any, protocol: Protocol, training: Training, mod: Any, shards: list, caps: Any):
        n, self.hook = training.n_workers, caps.in_place
        super().__init__(problem, protocol, training, mod, shards, caps,
                         mod.asarray(np.asarray(problem.init_params()).astype(caps.table_dtype)),
                         update_unit="one step" if n > 1 else f"a chunk of up to {training.eval_every} steps")
        self.inflight = InFlight()
        # a device hook that reads one table and adds to another needs no scratch copy per worker
        self.apart = n > 1 and mod is not np and caps.device_reads_apart
        self.snapshot = mod.empty_like(self.table) if n > 1 else None
        self.scratch = mod.empty_like(self.table) if n > 1 and not self.apart else None

    def gate(self, i: int, effect: Gate) -> int:
        c, tr = effect.step, self.training
        if i == 0:
            read_allowed(tr.read_rule or may_read, c, c, self.protocol.bound)  # names a rule that would stall
            self.start, self.taus = time.perf_counter() - self.t0, []
            if self.snapshot is not None:  # round c: every worker's step from the same read, the changes added
                self.snapshot[...] = self.table
        return min(tr.steps, (c // tr.eval_every + 1) * tr.eval_every) - c if tr.n_workers == 1 else 1

    def in_place(self, i: int, effect: InPlace) -> None:
        tr, table, shard, c, k = self.training, self.table, self.shards[i], effect.step, effect.count
        if self.snapshot is None:
            seen = self.hook(table, shard, c, k, tr.batch_size, tr.lr)
        elif self.apart:  # the step computed from the snapshot, its change added to the table
            seen = self.hook(table, shard, c, 1, tr.batch_size, tr.lr, read=self.snapshot)
        else:
            self.scratch[...] = self.snapshot
            seen = self.hook(self.scratch, shard, c, 1, tr.batch_size, tr.lr)
            table += self.scratch
            table -= self.snapshot
        # as on the get / step / add path: worker i's change lands on top of i others (BSP: one update)
        tau = staleness(self.protocol.bound, i, 0)
        if isinstance(seen, InFlight):  # lock-free device steps: the most rows one of them missed
            self.inflight += seen
            tau = max(tau, seen.missed_max)
        self.taus.append(tau)

    def push(self, i: int, effect: Push) -> tuple[bool, int]:
        return True, effect.step + 1

    def finish(self) -> None:
        """Nothing is held back: every step landed in the table."""

    def result(self) -> Result:
        res, inflight = super().result(), self.inflight
        if inflight.items:
            res.trace.meta["in_flight"] = {"items": inflight.items, "missed_mean": inflight.missed_mean,
                                           "missed_max": inflight.missed_max}
        # evaluations excluded
        res.measured["train_seconds"] = sum(span.end - span.start for span in res.trace.spans if span.worker == 0)
        return res
