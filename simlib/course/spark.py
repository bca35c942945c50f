"""Spark's programming model in miniature: a partitioned dataset with lazy transformations and ``cache()``.

A transformation (:meth:`RDD.map`) only records what to do; an action (:meth:`RDD.reduce`) runs the
whole chain partition by partition. Without ``cache()`` every action starts again from the source
(Hadoop MapReduce's way: read and parse the input every iteration); with it the first action keeps
each partition in memory and later ones start there. ``reads`` counts what the source delivered.
The partitions run one after another in this process: the model, not a cluster. Example::

    >>> rdd = RDD.source(lambda i: [i, i + 1], n_parts=3)
    >>> squares = rdd.map(lambda part: [x * x for x in part]).cache()
    >>> rdd.reads[0]                        # nothing has run yet: transformations are lazy
    0
    >>> squares.map(sum).reduce(lambda a, b: a + b), squares.map(len).reduce(lambda a, b: a + b), rdd.reads[0]
    (19, 6, 3)
    >>> tight = rdd.map(list).cache(capacity=2)   # 3 partitions, room for 2: a scan evicts what it needs next
    >>> [tight.map(len).reduce(lambda a, b: a + b) for _ in range(2)], rdd.reads[0] - 3
    ([6, 6], 6)
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

import numpy as np

from simlib import _validate as check


class RDD:
    """A dataset of ``n_parts`` partitions, each computed on demand by ``compute(i)``."""

    def __init__(self, compute: Callable[[int], Any], n_parts: int, reads: list[int]) -> None:
        check.positive_int("n_parts", n_parts)
        self._compute, self.n_parts, self.reads = compute, n_parts, reads

    @classmethod
    def source(cls, read: Callable[[int], Any], n_parts: int) -> "RDD":
        """The input: partition i is ``read(i)``; every call is counted in ``reads[0]``."""
        reads = [0]

        def counted(i: int) -> Any:
            reads[0] += 1
            return read(i)
        return cls(counted, n_parts, reads)

    def map(self, f: Callable[[Any], Any]) -> "RDD":
        """Lazy: a new RDD whose partition i is f(this RDD's partition i) (Spark's mapPartitions)."""
        return RDD(lambda i: f(self._compute(i)), self.n_parts, self.reads)

    def cache(self, capacity: int | None = None) -> "RDD":
        """Lazy too: the first action that computes a partition keeps it in memory for the next ones, at most
        ``capacity`` partitions (None: all), the least recently used evicted first, as Spark's memory store does."""
        if capacity is not None:
            check.positive_int("capacity", capacity)
        return RDD(functools.lru_cache(maxsize=capacity)(self._compute), self.n_parts, self.reads)

    def reduce(self, op: Callable[[Any, Any], Any]) -> Any:
        """An action: compute every partition through the chain and combine the results with ``op``."""
        out = self._compute(0)
        for i in range(1, self.n_parts):
            out = op(out, self._compute(i))
        return out


def write_text_partitions(data: Any, folder: str, n_parts: int) -> list[str]:
    """Write ``data`` (a SparseDataset) as ``n_parts`` text files in svmlight format ('y id:value ...')."""
    from sklearn.datasets import dump_svmlight_file

    check.positive_int("n_parts", n_parts, most=data.n_rows)
    X, paths = data.to_scipy(), []
    for p, (a, b) in enumerate(check.even_ranges(n_parts, data.n_rows, "rows")):
        paths.append(os.path.join(folder, f"part-{p:05d}.txt"))
        dump_svmlight_file(X[a:b], data.y[a:b], paths[-1], zero_based=True)
    return paths


def text_file(paths: list[str]) -> RDD:
    """Spark's ``textFile``: partition i is the bytes of ``paths[i]``, read from disk when an action needs it."""
    def read(i: int) -> bytes:
        with open(paths[i], "rb") as f:
            return f.read()
    return RDD.source(read, len(paths))


def parse_points(raw: bytes, n_features: int) -> tuple[Any, np.ndarray]:
    """The lectures' ``parsePoint`` for a whole partition: svmlight text -> (X as CSR, y in {-1, +1})."""
    import io

    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(io.BytesIO(raw), n_features=n_features, zero_based=True)
    return X, y
