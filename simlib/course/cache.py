"""A worker-side parameter cache: what it saves (pulls) and what it costs (stale reads).

N workers take turns (worker t mod N makes global step t) on one table. Each keeps a cache of
the rows it has read; a read of a cached row costs nothing on the network but returns the value
as it was when fetched, plus the worker's own later writes (write-through), missing what the
other workers added since. Every ``refresh`` of its own steps a worker empties its cache. A
read's *age* is the number of other workers' updates that touched the row since it was fetched.
``refresh = 1`` is no cache: every read is fresh and pulled. Example::

    >>> from simlib.problems.logistic import LogisticProblem, make_sparse_classification
    >>> prob = LogisticProblem(make_sparse_classification(400, 50, 5, seed=0), eval_rows=None)
    >>> _, none = cached_sgd(prob, n_workers=2, steps=20, batch_size=8, lr=0.5, refresh=1)
    >>> none.hit_rate, none.mean_age
    (0.0, 0.0)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.contract import check_problem


@dataclass(frozen=True)
class CacheStats:
    """Reads served from the cache, keys pulled from the server, and how old the cached reads were."""

    reads: int
    hits: int
    pulled_keys: int
    age_sum: int

    @property
    def hit_rate(self) -> float:
        """hits / reads."""
        return self.hits / self.reads if self.reads else 0.0

    @property
    def mean_age(self) -> float:
        """Mean over all reads of the other workers' updates a read missed (0 for a pulled row)."""
        return self.age_sum / self.reads if self.reads else 0.0


def cached_sgd(problem: Any, n_workers: int, steps: int, batch_size: int, lr: float,
               refresh: int) -> tuple[Any, CacheStats]:
    """SGD by N round-robin workers with write-through caches emptied every ``refresh`` own steps."""
    check_problem(problem)
    for name, value in (("n_workers", n_workers), ("steps", steps), ("batch_size", batch_size), ("refresh", refresh)):
        check.positive_int(name, value)
    check.positive("lr", lr)
    w = problem.init_params()
    shards = problem.shards(n_workers)
    writes = np.zeros(problem.n_params, dtype=np.int64)  # updates that touched each row so far
    # Per worker: its cached values, each row's writes when fetched (-1: not cached), its own writes since.
    caches: list[Any] = [None] * n_workers
    reads = hits = pulled = age = 0
    for t in range(steps):
        i, c = t % n_workers, t // n_workers
        if c % refresh == 0:
            caches[i] = (np.zeros_like(w), np.full_like(writes, -1), np.zeros_like(writes))
        value, seen, own = caches[i]
        batch = problem.batch(shards[i], c, batch_size)
        keys = problem.keys(batch)
        miss = keys[seen[keys] < 0]
        value[miss], seen[miss], own[miss] = w[miss], writes[miss], 0
        hit = np.setdiff1d(keys[seen[keys] >= 0], miss, assume_unique=True)
        reads += len(keys)
        hits += len(hit)
        pulled += len(miss)
        age += int((writes[hit] - seen[hit] - own[hit]).sum())
        keys, deltas = problem.step(value[keys], batch, keys, lr)
        w[keys] += deltas
        writes[keys] += 1
        value[keys] += deltas  # write-through: the worker sees its own update
        own[keys] += 1
    return w, CacheStats(reads, hits, pulled, age)
