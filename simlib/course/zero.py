"""Adam under synchronous data parallelism, with its state replicated or sharded (ZeRO stage 1), on real processes.

Adam keeps two moments per parameter, m and v: with the parameters and the gradient, four copies of the
model per worker. Replicated, every worker all-reduces the gradient and runs the same Adam step on all of
theta. ZeRO's stage 1 (Rajbhandari et al., 2020) cuts the moments into n parts: worker i receives only part i
of the summed gradient (a reduce-scatter), steps part i of theta with its own 1/n of m and v, and the parts
are put back together on every worker (an all-gather). A reduce-scatter and an all-gather move exactly the
bytes of one all-reduce, so the sharding is free in communication and saves 2 (n - 1) / n of the model's
size, twice, on every worker. The math is the same: the n parts' Adam steps are the one step's parts.

Both run on n processes of a :class:`~simlib.parallel.WorkerGroup` through the shared-memory collective
:class:`~simlib.parallel.allreduce.ShmAllReduce`. Each worker measures the memory its optimizer state holds
and, with :mod:`tracemalloc`, the peak of what it allocated while training. Example::

    >>> from simlib.problems.mlp import MLPProblem
    >>> prob = MLPProblem()
    >>> full, sharded = (train_adam(prob, n_workers=2, steps=5, shard_state=s) for s in (False, True))
    >>> bool(np.allclose(full.params, sharded.params, rtol=1e-12)), sharded.state_bytes[0] * 2 == full.state_bytes[0]
    (True, True)
"""
from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.course.large_batch import adam_direction, check_decay
from simlib.parallel.allreduce import ShmAllReduce
from simlib.parallel.group import WorkerGroup, check_processes
from simlib.protocol import MAX_BATCH, MAX_REAL_STEPS, MAX_REAL_WORKERS


@dataclass(frozen=True)
class Adam:
    """Adam's constants: step size, the moments' decays and the denominator's guard."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check.positive("lr", self.lr)
        for name in ("beta1", "beta2"):
            check_decay(name, getattr(self, name))
        check.positive("eps", self.eps)

    def step(self, theta: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int) -> None:
        """theta -= lr m_hat / (sqrt(v_hat) + eps), m and v updated in place (t counts from 1)."""
        theta -= self.lr * adam_direction(g, m, v, t, (self.beta1, self.beta2), self.eps)


@dataclass
class AdamRun:
    """The final parameters (worker 0's; ``spread`` the largest difference from any other worker's), and per worker
    the bytes of its optimizer state and the peak bytes it allocated while training (tracemalloc)."""

    params: np.ndarray
    state_bytes: list[int]
    peak_bytes: list[int]
    spread: float


def _worker(i: int, n: int, problem: Any, steps: int, batch_size: int, adam: Adam, shard: bool,
            reduce: ShmAllReduce) -> tuple[np.ndarray, int, int]:
    """Worker i: mean gradient of its mini-batches, summed over the workers, Adam on all of theta or on its part."""
    tracemalloc.start()
    theta = np.asarray(problem.init_params(), dtype=np.float64)
    mine = reduce.part(len(theta)) if shard else slice(0, len(theta))
    m, v = np.zeros(mine.stop - mine.start), np.zeros(mine.stop - mine.start)
    rows = problem.shards(n)[i]
    for t in range(1, steps + 1):
        g = problem.gradient(theta, problem.batch(rows, t - 1, batch_size))
        if shard:
            part = theta[mine].copy()
            adam.step(part, reduce.reduce_scatter(g) / n, m, v, t)
            theta = reduce.all_gather(part, len(theta))
        else:
            adam.step(theta, reduce(g) / n, m, v, t)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return theta, m.nbytes + v.nbytes, peak


def train_adam(problem: Any, n_workers: int = 2, steps: int = 50, batch_size: int = 32, adam: Adam = Adam(),
               shard_state: bool = True, timeout: float = 120.0) -> AdamRun:
    """``steps`` synchronous Adam steps of ``problem`` (one with a ``gradient(theta, batch)`` of the mean loss) on
    ``n_workers`` processes, the global batch being every worker's ``batch_size`` rows; ``shard_state``: ZeRO-1."""
    check.positive_int("n_workers", n_workers, most=MAX_REAL_WORKERS)
    check_processes(n_workers, "train_adam (a process per worker)")
    check.positive_int("steps", steps, most=MAX_REAL_STEPS)
    check.positive_int("batch_size", batch_size, most=MAX_BATCH)
    check.boolean("shard_state", shard_state)
    check.positive("timeout", timeout)
    if not isinstance(adam, Adam):
        raise ValueError(f"adam must be an Adam(...), got {type(adam).__name__}")
    if not callable(getattr(problem, "gradient", None)):
        raise ValueError(f"problem: {type(problem).__name__} has no gradient(theta, batch) for Adam to step on")
    check.fits_memory("n_workers", n_workers, 16.0 * n_workers * problem.n_params, 16.0 * problem.n_params,
                      "the collective's slots (two of n_params float64 per worker)")
    with WorkerGroup(n_workers, label="adam") as group:
        ranks = ShmAllReduce(group, n_workers, problem.n_params).ranks()
        out = group.run(_worker, problem, steps, batch_size, adam, shard_state, worker_args=[(r,) for r in ranks],
                        timeout=timeout)
    params = out[0][0]
    return AdamRun(params, [o[1] for o in out], [o[2] for o in out],
                   max(float(np.max(np.abs(o[0] - params))) for o in out))
