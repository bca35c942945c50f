"""The ``gpu`` substrate: the table as one device array, workers as lock-step batches (NumPy twin on the CPU).

Round c: every worker reads table[keys] for its mini-batch from the same table, computes its
update, and the updates are added in worker order, so worker i's push lands on top of i others:
tau = i, the GPU form of "row i of a batch misses i updates". No worker gets ahead of another, a
valid schedule under BSP, SSP(s) and async alike (clock lag 0). The array module comes from
``xp`` ('auto': CuPy when a device is present), and the problem's step must accept its arrays
(:class:`~simlib.problems.logistic.LogisticProblem` does).

Example::

    >>> import simlib
    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(1_000, 100, 5, seed=0), eval_rows=None)
    >>> res = simlib.run(prob, "async", substrate="gpu", n_workers=4, steps=5, xp="numpy")
    >>> sorted({u.staleness for u in res.trace.updates})
    [0, 1, 2, 3]
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from simlib.backend import get_xp, synchronize, to_numpy
from simlib.contract import ParamServer, Result, Training, new_trace
from simlib.diverged import check_metric
from simlib.protocol import Protocol


def run(problem: Any, protocol: Protocol, training: Training, xp: str = "auto") -> Result:
    """The substrate entry point (``simlib.run(..., substrate="gpu", xp="numpy"|"cupy"|"auto")``)."""
    if protocol.backup_workers or protocol.timeout is not None:
        raise ValueError("backup_workers and timeout need stragglers; lock-step GPU batches have none "
                         "(use substrate 'sim' or 'pipes')")
    mod = get_xp(xp)
    n = training.n_workers
    shards = problem.shards(n)
    # The contract's server on the device table: the read rule, the step rule and tau, as on every substrate.
    server = ParamServer(mod.asarray(problem.init_params()), n, protocol, training.rule, read_rule=training.read_rule)
    trace = new_trace(problem, protocol, training, "gpu", f"on {'CuPy' if mod is not np else 'NumPy'}", unit="batch",
                      xp=mod.__name__)
    t0 = time.perf_counter()
    trace.record_quality(0.0, 0, float(problem.quality(server.params)))
    for c in range(training.steps):
        start = time.perf_counter() - t0
        server.may_read(c)  # lock-step: every earlier round is complete, so the rule allows it or says why not
        version = server.version
        reads = []
        for i in range(n):
            batch = problem.batch(shards[i], c, training.batch_size)
            keys = problem.keys(batch)
            reads.append((batch, keys, server.params[mod.asarray(keys)]))
        taus = []
        for batch, keys, values in reads:
            keys, deltas = problem.step(values, batch, keys, training.lr)
            taus.append(server.push(c, mod.asarray(keys), deltas, version)[1])
        synchronize(mod)
        now = time.perf_counter() - t0
        for i in range(n):
            trace.span(i, "compute", start, now, step=c)
            trace.update(now, i, c, taus[i], True, clock_lag=0)
        if (c + 1) % training.eval_every == 0 or c + 1 == training.steps:
            if c + 1 == training.steps:
                server.finish()  # a partial accumulation group
            value = float(problem.quality(server.params))
            trace.record_quality(now, (c + 1) * n, value)
            check_metric(value, (c + 1) * n, problem, training.lr)
    return Result(trace, to_numpy(server.params), {"wall_seconds": time.perf_counter() - t0})
