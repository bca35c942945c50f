"""Model-parallel GloVe on the contract: each worker owns a slice of the embedding dimensions.

Worker p of N owns the dimensions [lo_p, hi_p) of W, C and their AdaGrad accumulators for every
word (worker 0 also owns the biases). The table holds :class:`GloveProblem`'s arrays (the same
layout, views and quality) and after them a partials region, N rows of B float32 values. One batch
of B entries is two steps:

    step 2b      worker p writes w_i[lo_p:hi_p] . c_j[lo_p:hi_p] of each entry (worker 0: + b_i + b'_j)
                 into row p of the partials region
    step 2b + 1  worker p sums the N partials into diff = w_i . c_j + b_i + b'_j - log X_ij and applies
                 AdaGrad to its own slice (worker 0: and to the biases)

Under BSP the substrate's step barrier (no worker starts step c before every worker finished step
c - 1) separates the two phases, so the parameters never move: only B floats per worker per batch
are exchanged. Within a batch the dot products are computed before the batch's updates (at most
B - 1 updates stale), so the result depends on B but not on N. Batches are taken per epoch, B
entries at a time in that epoch's shuffled order (:func:`~simlib.problems.glove.epoch_order`; the
last batch of an epoch may be shorter), so an epoch is :meth:`GloveSlices.epoch_steps` steps.

The steps exist only in place (``local_steps`` on a table in shared memory): this is not a
parameter-server pattern (workers exchange partial results about the examples, not rows of a table),
so there is no get / step / add, and :func:`simlib.run` accepts the problem under 'bsp' on substrate
'shm' only. :meth:`GloveSlices.epoch_costs` gives the C program's cost per epoch after a run.

Example::

    >>> import simlib
    >>> from simlib.data import load_kjv, Vocabulary
    >>> from simlib.problems.glove import count_cooccurrences
    >>> docs = load_kjv().docs[:200]
    >>> vocab = Vocabulary.build(docs, min_count=5)
    >>> ids, offsets = vocab.encode_docs(docs)
    >>> cooc = count_cooccurrences(ids, offsets, len(vocab), window=10)
    >>> config = GloveConfig(dim=20, epochs=3)
    >>> prob = GloveSlices(cooc, config, max_batch=4096)
    >>> res = simlib.run(prob, "bsp", substrate="shm", n_workers=2, batch_size=4096, lr=config.lr,
    ...                  steps=config.epochs * prob.epoch_steps(2, 4096))
    >>> costs = prob.epoch_costs(res)
    >>> len(costs), costs[-1] < costs[0]
    (3, True)
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit

from simlib import _validate as check
from simlib.problems.glove import Cooccurrence, GloveConfig, GloveParams
from simlib.problems.glove_table import GloveProblem, PassRecords


class DimSlice(NamedTuple):
    """Worker ``worker`` of ``n_workers``: it owns dimensions [lo, hi) (and the biases if it is worker 0)."""

    worker: int
    n_workers: int
    lo: int
    hi: int


class GloveSlices(PassRecords):
    """GloVe split by dimension: a worker's shard is its slice of the dimensions; two steps per batch.

    ``max_workers`` and ``max_batch`` size the partials region (``max_workers`` rows of ``max_batch``
    float32 values): a run may use up to that many workers and entries per batch. Only worker 0 records
    each pass's cost (its :meth:`local_result`; the others send back nothing).
    """

    in_place_only = True  # no get / step / add: the steps run only as local_steps on a shared table

    def __init__(self, cooc: Cooccurrence, config: GloveConfig, max_workers: int = 2, max_batch: int = 8192,
                 eval_entries: int = 20_000):
        self.glove = GloveProblem(cooc, config, eval_entries)  # validates cooc and config
        check.positive_int("max_workers", max_workers)
        if max_workers > config.dim:
            raise ValueError(f"max_workers must be <= dim ({config.dim}): each worker owns one dimension at least; "
                             f"got {max_workers}")
        check.positive_int("max_batch", max_batch)
        check.fits_memory("max_batch", max_batch, 4 * max_workers * max_batch, 4 * max_workers,
                          f"the partial dots of {max_workers} workers")
        self.cooc, self.config = cooc, config
        self.max_workers, self.max_batch = max_workers, max_batch
        self.n_params = self.glove.n_params + max_workers * max_batch
        self._passes: dict[DimSlice, dict[int, list[float]]] = {}  # worker 0's slice -> pass -> [cost sum, entries]

    def check_run(self, protocol: Any, substrate: str) -> None:
        """Refuse a protocol without the step barrier, and substrates that do not run the steps in shared memory."""
        if not protocol.rounds:
            raise ValueError(f"protocol: GloveSlices runs under 'bsp' only (a worker may sum the partial dots only "
                             f"once every worker has written them: the step barrier); got {protocol.spec!r}")
        if substrate != "shm":
            raise ValueError(f"substrate: GloveSlices runs on substrate 'shm' only (its steps exist only in place, "
                             f"on a table in shared memory, phase after phase at the step barrier); got {substrate!r}")

    def check_training(self, training: Any) -> None:
        """Refuse what the two phases cannot take: more workers or larger batches than the partials region holds,
        a read rule (it would replace the barrier), a step rule other than the plain one (it needs get / step / add)."""
        self.shards(training.n_workers)
        if training.batch_size > self.max_batch:
            raise ValueError(f"batch_size: this GloveSlices holds {self.max_batch} partial dots per worker "
                             f"(max_batch); got batch_size={training.batch_size}")
        if training.read_rule is not None:
            raise ValueError("read_rule: GloveSlices needs the BSP read rule (its phases meet at the step barrier)")
        if not training.rule.plain:
            raise ValueError("rule: GloveSlices runs its steps in place only, with the plain step rule "
                             "(no staleness_aware, accumulation or StepRule subclass)")

    def init_params(self, xp: Any = np) -> np.ndarray:
        """GloveProblem's flat table, then the partials region (zeros)."""
        return np.concatenate([self.glove.init_params(), np.zeros(self.max_workers * self.max_batch)])

    def unflatten(self, w: np.ndarray) -> GloveParams:
        """The GloVe arrays of a table (float32 copies)."""
        return self.glove.unflatten(w)

    def shards(self, n_workers: int) -> list[DimSlice]:
        """Contiguous slices of the dimensions, one per worker (worker 0 also owns the biases)."""
        check.positive_int("n_workers", n_workers)
        d = self.config.dim
        if n_workers > min(d, self.max_workers):
            raise ValueError(f"n_workers must be <= dim ({d}: each worker owns one dimension at least) and <= "
                             f"max_workers ({self.max_workers}: the rows of partial dots this GloveSlices holds); "
                             f"got {n_workers}")
        return [DimSlice(p, n_workers, d * p // n_workers, d * (p + 1) // n_workers) for p in range(n_workers)]

    def epoch_steps(self, n_workers: int, batch_size: int) -> int:
        """Steps per epoch: two (partial dots, update) per batch of ``batch_size`` entries, 2 ceil(nnz / B)."""
        return 2 * -(-self.cooc.nnz // batch_size)

    def _position(self, step: int, batch_size: int) -> tuple[int, int, int, int]:
        """(epoch, first entry position of the batch, its end, phase) of step ``step``."""
        epoch, r = divmod(step, self.epoch_steps(1, batch_size))
        start = (r // 2) * batch_size
        return epoch, start, min(start + batch_size, self.cooc.nnz), r % 2

    def batch(self, shard: DimSlice, step: int, batch_size: int) -> np.ndarray:
        """Entry ids of step ``step``'s batch (both phases of a batch take the same entries, for every worker)."""
        epoch, start, stop, _ = self._position(step, batch_size)
        return self.glove._order(epoch)[start:stop]

    def keys(self, *args: Any) -> Any:
        """Refused, as :meth:`step`: the steps run only in place (see the module docs)."""
        raise ValueError("GloveSlices has no get / step / add: its steps run in place on substrate 'shm'")

    step = keys

    def partials(self, w: np.ndarray, n_workers: int) -> np.ndarray:
        """The partials region of a table: row p holds worker p's partial dots of the current batch."""
        return w[self.glove.n_params:].reshape(self.max_workers, self.max_batch)[:n_workers]

    def local_steps(self, w: np.ndarray, shard: DimSlice, first: int, count: int, batch_size: int, lr: float) -> None:
        """Steps first .. first+count-1 of worker ``shard.worker`` on the table ``w`` in place (see the module docs).

        Worker 0 keeps each pass's cost (the sum of 0.5 f diff^2 before each update) for :meth:`local_result`;
        a call from step 0 starts the record afresh.
        """
        params = self.glove.views(w)
        parts = self.partials(w, shard.n_workers)
        terms = (self.cooc.rows, self.cooc.cols, self.glove.logx, self.glove.fx)
        eta, clip = np.float32(lr), np.float32(self.config.grad_clip)
        passes = self._record(shard, first)
        for c in range(first, first + count):
            epoch, start, stop, phase = self._position(c, batch_size)
            entries = self.glove._order(epoch)[start:stop]
            if phase == 0:
                partial_dots_kernel(terms, entries, params, shard, parts[shard.worker])
                continue
            cost = slice_update_kernel(terms, entries, params, shard, parts, eta, clip)
            if shard.worker == 0:
                record = passes.setdefault(epoch, [0.0, 0])
                record[0] += cost
                record[1] += stop - start

    def epoch_costs(self, result: Any) -> list[float]:
        """The C program's cost per epoch, mean 0.5 f diff^2 over the pass, of the passes completed (worker 0's record).

        ``result`` is a :func:`simlib.run` result of this problem (substrate 'shm').
        """
        parts = result.measured.get("local") or []
        if not parts or not parts[0]:
            raise ValueError("result: it holds no costs per pass; pass the result of simlib.run(GloveSlices(...), "
                             "'bsp', substrate='shm', ...) with at least one batch's update")
        record = parts[0]  # passes complete in order
        done = sum(m == self.cooc.nnz for _, m in record.values())
        return [record[p][0] / self.cooc.nnz for p in range(done)]

    def quality(self, w: np.ndarray) -> float:
        """The C program's cost 0.5 f diff^2 on GloveProblem's fixed sample of entries (the partials ignored)."""
        return self.glove.quality(w)


# NOTE: the split's two kernels, one per phase. Every worker sums the partials itself (the same sum, in the
# same order, on every worker), so the update of a slice needs nothing but its own dimensions. Both take the
# entries' (rows, cols, logx, fx), the batch's entry ids ``order``, GloveProblem's eight arrays (W, C, bw, bc,
# gW, gC, gbw, gbc) and the worker's DimSlice.
@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def partial_dots_kernel(entries, order, params, shard, out) -> None:  # pragma: no cover
    """out[t] = W[i, lo:hi] . C[j, lo:hi] (+ b_i + b'_j on worker 0) for entry order[t] = (i, j)."""
    rows, cols, _, _ = entries
    W, C, bw, bc, _, _, _, _ = params
    for t in range(order.shape[0]):
        e = order[t]
        i = rows[e]
        j = cols[e]
        s = bw[i] + bc[j] if shard.worker == 0 else np.float32(0.0)
        for k in range(shard.lo, shard.hi):
            s += W[i, k] * C[j, k]
        out[t] = s


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def slice_update_kernel(entries, order, params, shard, partials, eta, clip) -> float:  # pragma: no cover
    """diff = sum of the partial dots - log X; AdaGrad on dimensions [lo, hi) (and the biases); returns the cost."""
    rows, cols, logx, fx = entries
    W, C, bw, bc, gW, gC, gbw, gbc = params
    lo, hi, with_bias = shard.lo, shard.hi, shard.worker == 0
    cost = 0.0
    for t in range(order.shape[0]):
        e = order[t]
        i = rows[e]
        j = cols[e]
        diff = -logx[e]
        for p in range(partials.shape[0]):
            diff += partials[p, t]
        g = fx[e] * diff
        cost += 0.5 * g * diff
        for k in range(lo, hi):
            tw = min(max(g * C[j, k], -clip), clip) * eta
            tc = min(max(g * W[i, k], -clip), clip) * eta
            uw = tw / np.sqrt(gW[i, k])
            uc = tc / np.sqrt(gC[j, k])
            gW[i, k] += tw * tw
            gC[j, k] += tc * tc
            W[i, k] -= uw
            C[j, k] -= uc
        if with_bias:
            bw[i] -= g / np.sqrt(gbw[i])
            bc[j] -= g / np.sqrt(gbc[j])
            gbw[i] += g * g
            gbc[j] += g * g
    return cost


__all__ = ["GloveSlices", "DimSlice"]
