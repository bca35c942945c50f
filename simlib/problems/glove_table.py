"""GloVe on the parameter-server contract: the table holds every GloVe array, flattened.

The table is W, C, the biases and all AdaGrad accumulators, flattened in the kernel's order
(float64 storage holding float32 values: the arithmetic is the reference C program's, in float32).
A worker pulls the rows its batch of co-occurrence entries touches, runs the AdaGrad kernel on its
local copy, and pushes the change; the server adds it. ``local_steps`` runs the same kernel on the
shared table in place (the shm substrate's fast path: under ``async`` that is GloVe's Hogwild).
Each pass over a shard takes its entries in that epoch's shuffled order
(:func:`simlib.problems.glove.epoch_order`), so ``lr = config.lr`` and one worker train as the reference
C program does (the tests check it against a trainer of their own), and :meth:`GloveProblem.epoch_costs` gives the C
program's cost per epoch after a real run.

Example::

    >>> from simlib.contract import check_problem, serial_reference
    >>> from simlib.problems.glove import Cooccurrence
    >>> cooc = Cooccurrence(np.array([0, 1], np.int32), np.array([1, 0], np.int32), np.array([3.0, 3.0], np.float32), 2)
    >>> prob = GloveProblem(cooc, GloveConfig(dim=4))
    >>> check_problem(prob)
    >>> w = serial_reference(prob, steps=50, batch_size=2, lr=0.05)
    >>> prob.quality(w) < prob.quality(prob.init_params())
    True

On processes sharing memory (two workers, two epochs, Hogwild)::

    >>> import simlib
    >>> res = simlib.run(prob, "async", substrate="shm", n_workers=2, steps=2 * prob.epoch_steps(2, 1), batch_size=1,
    ...                  lr=0.05)
    >>> costs = prob.epoch_costs(res)
    >>> len(costs), costs[1] < costs[0]
    (2, True)
"""
from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from simlib import _validate as check
from simlib.backend import InFlight, array_module, to_numpy
from simlib.problems.glove import (Cooccurrence, GloveConfig, GloveParams, adagrad_kernel, entry_terms, epoch_order,
                                   validate_training)
from simlib.problems.glove_prefetch import AHEAD


# float32 arrays as the reference program builds them, then the float64 table they are copied into
_BYTES_PER_VECTOR_ENTRY = 4 + 8
BLOCK = 1 << 18  # entries per compiled AdaGrad call on a NumPy table: about 0.1 s at d = 50


class PassRecords:
    """What GloVe's problems share: the C program's cost, one unit of work per entry, and each worker's record
    of its passes (``_passes``: shard -> pass -> [cost sum, entries]) that ``local_steps`` keeps."""

    metric = "cost"
    lower_is_better = True
    linear_step = False  # AdaGrad's accumulators do not scale with the step size
    # Where a substrate keeps the table in place (shm): float32, the values' own precision (the float64
    # storage elsewhere only holds float32 values), so the in-place kernel moves half the bytes.
    table_dtype = np.float32

    @property
    def lr(self) -> float:
        """Its own step size, ``config.lr``: simlib.run trains with it where lr= is left out, and refuses another."""
        return self.config.lr

    @property
    def epochs(self) -> int:
        """Its own run length, ``config.epochs`` passes: simlib.run's steps where steps= is left out."""
        return self.config.epochs

    def validate(self) -> None:
        """Check the co-occurrences again (they may have changed since): the AdaGrad kernels index them unchecked."""
        validate_training(self.cooc, self.config)

    def work(self, batch: np.ndarray) -> int:
        """One unit per co-occurrence entry updated."""
        return len(batch)

    def _record(self, shard: Any, first: int) -> dict[int, list[float]]:
        """The shard's record, pass -> [cost sum, entries]: a call from step 0 starts it afresh."""
        passes = self._passes.setdefault(shard, {})
        if first == 0:
            passes.clear()
        return passes

    def local_result(self, shard: Any) -> dict[int, list[float]]:
        """What a worker sends back of a real run: per pass over its shard, [cost sum, entries]."""
        return {p: [float(cost), m] for p, (cost, m) in self._passes.get(shard, {}).items()}


class GloveProblem(PassRecords):
    """GloVe in the parameter-server contract: keys are flat indices of the rows a batch touches."""

    # A device table's steps: 'auto' (fused on CuPy), 'fused', 'array', or 'hogwild' (entries lock-free,
    # B in flight on CuPy; on NumPy entries are applied one after another in every case).
    device_kernel = "auto"

    def __init__(self, cooc: Cooccurrence, config: GloveConfig, eval_entries: int = 20_000):
        validate_training(cooc, config)
        check.positive_int("eval_entries", eval_entries)
        self.cooc, self.config = cooc, config
        self.v, self.d = cooc.n_words, config.dim
        per_dim = _BYTES_PER_VECTOR_ENTRY * 4 * self.v  # W, C and their accumulators gain V entries per dimension
        check.fits_memory("dim", self.d, per_dim * self.d, per_dim, f"the vectors of {self.v} words")
        sizes = [math.prod(shape) for shape in GloveParams.shapes(self.v, self.d).values()]  # W, C, bw, bc, gW, ...
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n_params = int(self.offsets[-1])
        self.logx, self.fx = entry_terms(cooc.values, config)
        self._orders: dict[int, np.ndarray] = {}  # the latest passes' shuffled orders (see _order)
        self._passes: dict[tuple[int, int], dict[int, list[float]]] = {}  # shard -> pass -> [cost sum, entries]
        rng = np.random.default_rng(config.seed + 1)
        self.eval_idx = np.sort(rng.choice(cooc.nnz, min(eval_entries, cooc.nnz), replace=False))

    def init_params(self, xp: Any = np) -> np.ndarray:
        """The flat table, initialised as :meth:`GloveParams.init` does (float64 storage)."""
        p = GloveParams.init(self.v, self.config)
        return np.concatenate([a.ravel() for a in p.arrays()]).astype(np.float64)

    def unflatten(self, w: np.ndarray) -> GloveParams:
        """The flat table as GloveParams (float32 copies)."""
        return GloveParams(*(a.astype(np.float32) for a in self.views(w)))

    def shards(self, n_workers: int) -> list[tuple[int, int]]:
        """Contiguous ranges of the shuffled entry order, one per worker."""
        return check.even_ranges(n_workers, self.cooc.nnz, "entries")

    def epoch_steps(self, n_workers: int, batch_size: int) -> int:
        """Steps per worker for one pass over the entries: ceil(largest shard / batch_size)."""
        return -(-max(b - a for a, b in self.shards(n_workers)) // batch_size)

    def _order(self, p: int) -> np.ndarray:
        """The shuffled order of all entries in pass ``p`` (epoch_order), the last few kept."""
        if p not in self._orders:
            if len(self._orders) >= 2:  # workers are at most a pass apart; each order is nnz int64
                del self._orders[min(self._orders)]
            self._orders[p] = epoch_order(self.cooc.nnz, self.config.seed, p)
        return self._orders[p]

    def batch(self, shard: tuple[int, int], step: int, batch_size: int) -> np.ndarray:
        """Entry ids of batch ``step`` in the shard: positions t = step*B .. step*B+B-1, pass t // n, in that pass's order."""
        t = step * batch_size
        return np.concatenate([self._order(p)[lo:hi] for _, p, lo, hi in self._segments(shard, t, t + batch_size)])

    @staticmethod
    def _segments(shard: tuple[int, int], t: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """(t, p, lo, hi) for each pass p that the shard's positions t .. end-1 touch (position t = pass t // n at
        t % n, n the shard's length): that pass's order holds their entries at lo .. hi-1; t is the first's position."""
        start, stop = shard
        while t < end:
            p, pos = divmod(t, stop - start)
            hi = min(stop, start + pos + end - t)
            yield t, p, start + pos, hi
            t += hi - start - pos

    def _rows(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.unique(self.cooc.rows[batch]), np.unique(self.cooc.cols[batch])

    def keys(self, batch: np.ndarray) -> np.ndarray:
        """Flat indices of W, C, biases and accumulators of the batch's words and contexts (sorted)."""
        ui, uj = self._rows(batch)
        # Row u of an array of width w (d for W, C, gW, gC; 1 for the biases) starts at base + u * w.
        return np.concatenate([(base + u[:, None] * w + np.arange(w)).ravel()
                               for base, u, w in zip(self.offsets, (ui, uj) * 4, (self.d, self.d, 1, 1) * 2)])

    def step(self, values: np.ndarray, batch: np.ndarray, keys: np.ndarray, lr: float) -> tuple[np.ndarray, np.ndarray]:
        """(keys, change): AdaGrad with base rate ``lr`` on the pulled rows, as deltas to add."""
        ui, uj = self._rows(batch)
        shapes = [(len(ui), self.d), (len(uj), self.d), (len(ui),), (len(uj),)] * 2  # W, C, bw, bc, then their G
        cuts = np.concatenate([[0], np.cumsum([math.prod(shape) for shape in shapes])])
        rows = np.searchsorted(ui, self.cooc.rows[batch]).astype(np.int32)
        cols = np.searchsorted(uj, self.cooc.cols[batch]).astype(np.int32)
        new = np.array(values, dtype=np.float64)
        local = [new[cuts[k] : cuts[k + 1]].reshape(shape) for k, shape in enumerate(shapes)]
        adagrad_kernel((rows, cols, self.logx[batch], self.fx[batch]), np.arange(len(batch), dtype=np.int64),
                       tuple(local), np.float32(lr), np.float32(self.config.grad_clip))
        return keys, new - values

    def views(self, w: Any) -> tuple[Any, ...]:
        """W, C, bw, bc, gW, gC, gbw, gbc as views of the flat table (NumPy or CuPy; the kernels' ``params``).

        The one way to read the table: the model-parallel split and the device steps go through it too."""
        return tuple(w[self.offsets[k] : self.offsets[k + 1]].reshape(shape)
                     for k, shape in enumerate(GloveParams.shapes(self.v, self.d).values()))

    def local_steps(self, w: np.ndarray, shard: tuple[int, int], first: int, count: int, batch_size: int,
                    lr: float) -> Any:
        """Steps first .. first+count-1 of a shard applied to ``w`` in place, each exactly as get / step / add.

        The contract's local-step hook: entry after entry of the shard's passes, AdaGrad on the shared
        rows; several workers calling it on one ``w`` at once, unlocked, is GloVe's Hogwild. On a device table
        (CuPy) the entries of one step read the rows at once (:mod:`simlib.problems.glove_device`). Each pass's
        cost (the sum of 0.5 f diff^2 before each update) is kept for :meth:`local_result`; a call from
        step 0 starts the record afresh.
        """
        passes = self._record(shard, first)
        views = self.views(w)
        eta, clip = np.float32(lr), np.float32(self.config.grad_clip)
        counts = []  # lock-free device steps: each launch's queue counts (what their entries missed)
        for t, p, lo, hi in self._segments(shard, first * batch_size, (first + count) * batch_size):  # a call per pass
            if isinstance(w, np.ndarray):
                terms, order = (self.cooc.rows, self.cooc.cols, self.logx, self.fx), self._order(p)
                # a compiled call per block, not per pass: Ctrl-C (and the run's timeout) is answered between them
                cost = sum(adagrad_kernel(terms, order[a:min(a + BLOCK, hi)], views, eta, clip, AHEAD)
                           for a in range(lo, hi, BLOCK))
            else:  # a device table (the gpu substrate on CuPy): glove_device's steps, no wait between passes
                from simlib.problems.glove_device import device_order, device_pass

                order = device_order(self, array_module(w), p) if self.device_kernel == "hogwild" else self._order(p)
                cost, seen = device_pass(self, w, order[lo:hi], t, batch_size, eta, clip)
                if seen is not None:
                    counts.append(seen)
            record = passes.setdefault(p, [0.0, 0])
            record[0] += cost
            record[1] += hi - lo
        return sum((InFlight.of(c) for c in counts), InFlight()) if counts else None

    def epoch_costs(self, result: Any) -> list[float]:
        """The C program's cost per epoch, mean 0.5 f diff^2 over the pass, of the passes every worker completed.

        ``result`` is a :func:`simlib.run` result from a substrate that ran ``local_steps`` (shm).
        """
        parts = result.measured.get("local") or []
        if not parts or not all(parts):
            raise ValueError("result: it holds no costs per pass; run on substrate 'shm' with the plain step rule")
        done = min(sum(m == b - a for _, m in part.values()) for part, (a, b) in zip(parts, self.shards(len(parts))))
        return [sum(part[p][0] for part in parts) / self.cooc.nnz for p in range(done)]

    def quality(self, w: np.ndarray) -> float:
        """The C program's cost 0.5 f diff^2, averaged over a fixed sample of entries."""
        W, C, bw, bc = self.views(to_numpy(w))[:4]  # a device table is read back (the sample's rows are few)
        e = self.eval_idx
        r, c = self.cooc.rows[e], self.cooc.cols[e]
        diff = np.einsum("ij,ij->i", W[r], C[c]) + bw[r] + bc[c] - self.logx[e]
        return float(np.mean(0.5 * self.fx[e] * diff * diff))


__all__ = ["GloveProblem", "PassRecords"]
