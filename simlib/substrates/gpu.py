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
from simlib.contract import ParamServer, Result, Training, local_result, new_trace, record_metric, record_start
from simlib.protocol import Protocol, may_read, read_allowed, staleness


def run(problem: Any, protocol: Protocol, training: Training, xp: str = "auto") -> Result:
    """The substrate entry point (``simlib.run(..., substrate="gpu", xp="numpy"|"cupy"|"auto")``)."""
    if protocol.backup_workers or protocol.timeout is not None:
        raise ValueError("backup_workers and timeout need stragglers; lock-step GPU batches have none "
                         "(use substrate 'sim' or 'pipes')")
    mod = get_xp(xp)
    n = training.n_workers
    shards = problem.shards(n)
    # the hook: ``device_steps`` where a problem's device steps differ from its CPU ones (LDA's), else local_steps
    hook = getattr(problem, "device_steps", None) or getattr(problem, "local_steps", None)
    if callable(hook) and training.rule.plain and (mod is np or getattr(problem, "device_kernel", None) is not None):
        return _run_in_place(problem, protocol, training, mod, shards, hook)
    # The contract's server on the device table: the read rule, the step rule and tau, as on every substrate.
    server = ParamServer(mod.asarray(problem.init_params()), n, protocol, training.rule, read_rule=training.read_rule)
    trace = new_trace(problem, protocol, training, "gpu", f"on {'CuPy' if mod is not np else 'NumPy'}", unit="batch",
                      xp=mod.__name__, path="get / step / add")
    t0 = time.perf_counter()
    record_start(trace, problem, server.params)
    for c in range(training.steps):
        start = time.perf_counter() - t0
        server.may_read(c)  # lock-step: every earlier round is complete, so the rule allows it or says why not
        version = server.version
        batches = [problem.batch(shard, c, training.batch_size) for shard in shards]
        keys = [problem.keys(batch) for batch in batches]
        values = [server.params[mod.asarray(k)] for k in keys]  # every worker reads the round's table before any push
        taus = []
        for batch, k, v in zip(batches, keys, values):
            out_keys, deltas = problem.step(v, batch, k, training.lr)
            taus.append(server.push(c, mod.asarray(out_keys), deltas, version)[1])
        synchronize(mod)
        now = time.perf_counter() - t0
        for i in range(n):
            trace.span(i, "compute", start, now, step=c)
            trace.update(now, i, c, taus[i], True, clock_lag=0)
        if (c + 1) % training.eval_every == 0 or c + 1 == training.steps:
            if c + 1 == training.steps:
                server.finish()  # a partial accumulation group
            record_metric(trace, problem, now, (c + 1) * n, server.params, training.lr)
    return Result(trace, to_numpy(server.params), {"wall_seconds": time.perf_counter() - t0})


def _run_in_place(problem: Any, protocol: Protocol, training: Training, mod: Any, shards: list, hook: Any) -> Result:
    """The fast path: the problem's ``hook`` on the device table; the schedule is the get / step / add path's."""
    n, steps, every = training.n_workers, training.steps, training.eval_every
    table = mod.asarray(np.asarray(problem.init_params()).astype(getattr(problem, "table_dtype", np.float64)))
    trace = new_trace(problem, protocol, training, "gpu", f"on {'CuPy' if mod is not np else 'NumPy'}", unit="batch",
                      xp=mod.__name__, path="in place",
                      update_unit="one step" if n > 1 else f"a chunk of up to {every} steps")
    inflight = InFlight()
    # a device hook that reads one table and adds to another needs no scratch copy per worker
    apart = n > 1 and mod is not np and getattr(problem, "device_reads_apart", False)
    snapshot = mod.empty_like(table) if n > 1 else None
    scratch = mod.empty_like(table) if n > 1 and not apart else None
    t0 = time.perf_counter()
    record_start(trace, problem, table)
    c = 0
    while c < steps:
        read_allowed(training.read_rule or may_read, c, c, protocol.bound)  # names a rule that would stall
        start = time.perf_counter() - t0
        if n == 1:  # every step up to the next evaluation in one call
            k = min(steps, (c // every + 1) * every) - c
            seen = [hook(table, shards[0], c, k, training.batch_size, training.lr)]
        else:  # round c: every worker's step from the same read, the steps' changes added
            k = 1
            snapshot[...] = table
            seen = []
            for i in range(n):
                if apart:  # the step computed from the snapshot, its change added to the table
                    seen.append(hook(table, shards[i], c, 1, training.batch_size, training.lr, read=snapshot))
                    continue
                scratch[...] = snapshot
                seen.append(hook(scratch, shards[i], c, 1, training.batch_size, training.lr))
                table += scratch
                table -= snapshot
        synchronize(mod)
        now = time.perf_counter() - t0
        for i in range(n):  # as on the get / step / add path: worker i's change lands on top of i others (BSP: one update)
            trace.span(i, "compute", start, now, step=c + k - 1)
            tau = staleness(protocol.bound, i, 0)
            if isinstance(seen[i], InFlight):  # lock-free device steps: the most rows one of them missed
                inflight += seen[i]
                tau = max(tau, seen[i].missed_max)
            trace.update(now, i, c + k - 1, tau, True, clock_lag=0)
        c += k
        if c % every == 0 or c == steps:
            record_metric(trace, problem, time.perf_counter() - t0, c * n, table, training.lr)
    if inflight.items:
        trace.meta["in_flight"] = {"items": inflight.items, "missed_mean": inflight.missed_mean,
                                   "missed_max": inflight.missed_max}
    train = sum(span.end - span.start for span in trace.spans if span.worker == 0)  # evaluations excluded
    return Result(trace, to_numpy(table), {"wall_seconds": time.perf_counter() - t0, "train_seconds": train,
                                            "local": [local_result(problem, s) for s in shards]})
