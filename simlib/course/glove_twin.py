"""GloVe's speed-up predicted in the simulator before measuring it.

:func:`predict_speedup` runs :class:`~simlib.problems.glove_table.GloveProblem` (the real AdaGrad
updates on a parameter-server table) on the simulated cluster, charging each co-occurrence entry
the time measured for one process, and reports the simulated updates/s for 1, 2, ... workers.
"""
from __future__ import annotations

from typing import Any, Sequence

import simlib
from simlib import _validate as check
from simlib.problems.glove import Cooccurrence, GloveConfig
from simlib.problems.glove_table import GloveProblem

SHARED_MEMORY = {"latency": 2e-6, "bandwidth": 4e9}  # a "message" between processes on one machine is a copy


def predict_speedup(cooc: Cooccurrence, config: GloveConfig, updates_per_second: float, workers: Sequence[int] = (1, 2),
                    batch_size: int = 8192, epochs: float = 1.0, protocol: str = "async",
                    **cluster: Any) -> dict[int, dict[str, Any]]:
    """Predict updates/s for each worker count from one process's measured rate.

    Each entry costs ``1 / updates_per_second`` seconds of compute; every batch pulls and pushes
    its rows over the simulated cluster ``cluster`` (SimConfig's fields; default ``latency=2e-6``,
    ``bandwidth=4e9``: shared memory on one machine, where a "message" is a copy). Returns, per
    worker count, the simulated updates/s, the speed-up over the first count, and the trace.
    """
    check.positive("updates_per_second", updates_per_second)
    check.positive("epochs", epochs)
    problem = GloveProblem(cooc, config)
    out: dict[int, dict[str, Any]] = {}
    for n in workers:
        check.positive_int("workers", n)
        steps = max(1, int(round(epochs * cooc.nnz / (n * batch_size))))
        trace = simlib.run(problem, protocol, n_workers=n, steps=steps, batch_size=batch_size,
                           eval_every=max(1, steps // 10), **{**SHARED_MEMORY, **cluster},
                           compute_per_unit=1.0 / updates_per_second, compute_overhead=0.0).trace
        out[n] = {"updates_per_s": steps * n * batch_size / trace.makespan, "trace": trace}
    base = out[workers[0]]["updates_per_s"]
    for n in workers:
        out[n]["speedup"] = out[n]["updates_per_s"] / base
    return out
