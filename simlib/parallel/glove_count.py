"""Co-occurrence counting as map-reduce over worker processes.

Map: each worker counts a shard of whole documents (balanced by tokens) into a bounded hash
table, spilling sorted runs and merging them (:func:`simlib.problems.glove.count_runs`), and
sends back one sorted run of unordered pairs. Reduce: the parent merges the runs pairwise in
linear time. Windows never cross documents, so splitting at document boundaries loses nothing:
the result equals the single-process count exactly (up to float summation order).

    >>> from simlib.data import load_kjv, Vocabulary
    >>> kjv = load_kjv(); vocab = Vocabulary.build(kjv.docs, min_count=5)
    >>> ids, offsets = vocab.encode_docs(kjv.docs)
    >>> cooc, trace = count_parallel(ids, offsets, len(vocab), window=10, n_workers=2)
"""
from __future__ import annotations

import numpy as np

from simlib import _validate as check
from simlib.data.corpus import shard_documents
from simlib.parallel.group import WorkerGroup
from simlib.parallel.shm import SharedArray
from simlib.parallel.worker import current
from simlib.problems.glove import Cooccurrence, count_runs, merge_runs, runs_to_cooccurrence, validate_counting
from simlib.trace import Trace


def _count_shard(worker_id: int, n_workers: int, ids: SharedArray, offsets: SharedArray, counting: tuple[int, int, int],
                 doc_lo: int, doc_hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker: count documents [doc_lo, doc_hi) and return the sorted run (keys, values).

    ``counting`` is (n_words, window, buffer_entries), the same for every worker.
    """
    ctx = current()
    assert ctx is not None
    n_words, window, buffer_entries = counting
    with ctx.timed("compute", step=0):
        run = count_runs(ids.array, offsets.array, n_words, window, doc_lo, doc_hi, buffer_entries)
    ctx.update(step=0)
    return run


def count_parallel(
    ids: np.ndarray, offsets: np.ndarray, n_words: int, window: int = 10, n_workers: int = 2,
    buffer_entries: int = 1 << 22, start_method: str | None = None,
) -> tuple[Cooccurrence, Trace]:
    """X_ij over same-document pairs 0 < |p - q| <= window, counted by ``n_workers`` processes; (cooc, trace)."""
    validate_counting(ids, offsets, n_words, window)
    check.positive_int("n_workers", n_workers)
    check.positive_int("buffer_entries", buffer_entries)
    bounds = shard_documents(offsets, n_workers).tolist()
    # The counting kernels compiled here, once, on a 4-token document of the same dtypes: forked workers
    # compiling them at the same time on a fresh checkout can crash (see simlib.contract.warm_up).
    count_runs(np.zeros(4, ids.dtype), np.array([0, 4], offsets.dtype), n_words, window, 0, 1, 64)
    with WorkerGroup(n_workers, start_method, label="glove-count") as group:
        shared_ids, shared_offsets = group.copy_of(ids), group.copy_of(offsets)
        runs = group.run(_count_shard, shared_ids, shared_offsets, (n_words, window, buffer_entries),
                         worker_args=list(zip(bounds[:-1], bounds[1:])))
        t = group.now()
        # Reduce pairwise (a tree), so each merge is linear; the last two are merged as they are expanded.
        while len(runs) > 2:
            runs = [merge_runs(runs[k], runs[k + 1]) if k + 1 < len(runs) else runs[k] for k in range(0, len(runs), 2)]
        cooc = runs_to_cooccurrence(*runs[0], n_words, other=runs[1] if len(runs) > 1 else None)
        group.trace.span(0, "compute", t, group.now(), step=1)
        group.trace.meta.update(tokens=int(ids.shape[0]), nnz=cooc.nnz, window=window)
        return cooc, group.trace
