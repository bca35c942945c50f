"""GloVe on the parameter-server contract: the table holds every GloVe array, flattened.

The table is W, C, the biases and all AdaGrad accumulators, flattened in the kernel's order
(float64 storage). A worker pulls the rows its batch of co-occurrence entries touches, runs the
real AdaGrad kernel (:func:`simlib.problems.glove.adagrad_kernel`) on its local copy, and pushes
the change; the server adds it. ``lr`` is AdaGrad's base rate, so a run with
``lr = config.lr`` and one worker equals :func:`simlib.problems.glove.train_epoch`
on the same order.

Example::

    >>> from simlib.contract import check_problem, serial_reference
    >>> from simlib.problems.glove import Cooccurrence
    >>> cooc = Cooccurrence(np.array([0, 1], np.int32), np.array([1, 0], np.int32), np.array([3.0, 3.0], np.float32), 2)
    >>> prob = GloveProblem(cooc, GloveConfig(dim=4))
    >>> check_problem(prob)
    >>> w = serial_reference(prob, steps=50, batch_size=2, lr=0.05)
    >>> prob.quality(w) < prob.quality(prob.init_params())
    True
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.problems.glove import Cooccurrence, GloveConfig, GloveParams, adagrad_kernel, entry_terms, epoch_order, validate_training


# float32 arrays as the reference program builds them, then the float64 table they are copied into
_BYTES_PER_VECTOR_ENTRY = 4 + 8


class GloveProblem:
    """GloVe in the parameter-server contract: keys are flat indices of the rows a batch touches."""

    metric = "cost"
    lower_is_better = True
    linear_step = False  # AdaGrad's accumulators do not scale with the step size

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
        self.order = epoch_order(cooc.nnz, config.seed, 0)
        rng = np.random.default_rng(config.seed + 1)
        self.eval_idx = np.sort(rng.choice(cooc.nnz, min(eval_entries, cooc.nnz), replace=False))

    def validate(self) -> None:
        """Check the co-occurrences again (they may have changed since): the AdaGrad kernels index them unchecked."""
        validate_training(self.cooc, self.config)

    def init_params(self, xp: Any = np) -> np.ndarray:
        """The flat table, initialised as :meth:`GloveParams.init` does (float64 storage)."""
        p = GloveParams.init(self.v, self.config)
        return np.concatenate([a.ravel() for a in p.arrays()]).astype(np.float64)

    def unflatten(self, w: np.ndarray) -> GloveParams:
        """The flat table as GloveParams (float32 copies)."""
        return GloveParams(**{n: w[self.offsets[k] : self.offsets[k + 1]].astype(np.float32).reshape(shape)
                              for k, (n, shape) in enumerate(GloveParams.shapes(self.v, self.d).items())})

    def shards(self, n_workers: int) -> list[tuple[int, int]]:
        """Contiguous ranges of the shuffled entry order, one per worker."""
        check.positive_int("n_workers", n_workers)
        if n_workers > self.cooc.nnz:
            raise ValueError(f"n_workers ({n_workers}) must be <= the number of entries ({self.cooc.nnz})")
        bounds = np.linspace(0, self.cooc.nnz, n_workers + 1).astype(int)
        return [(int(bounds[i]), int(bounds[i + 1])) for i in range(n_workers)]

    def batch(self, shard: tuple[int, int], step: int, batch_size: int) -> np.ndarray:
        """Entry ids of batch ``step`` in the shard (cycling)."""
        start, stop = shard
        return self.order[start + (np.arange(batch_size) + step * batch_size) % (stop - start)]

    def work(self, batch: np.ndarray) -> int:
        """One unit per co-occurrence entry updated."""
        return len(batch)

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
        local = [np.ascontiguousarray(values[cuts[k] : cuts[k + 1]], dtype=np.float32).reshape(shape)
                 for k, shape in enumerate(shapes)]
        rows = np.searchsorted(ui, self.cooc.rows[batch]).astype(np.int32)
        cols = np.searchsorted(uj, self.cooc.cols[batch]).astype(np.int32)
        adagrad_kernel(rows, cols, self.logx[batch], self.fx[batch], np.arange(len(batch), dtype=np.int64), *local,
                       np.float32(lr), np.float32(self.config.grad_clip))
        new = np.concatenate([x.ravel() for x in local]).astype(np.float64)
        return keys, new - values

    def quality(self, w: np.ndarray) -> float:
        """The C program's cost 0.5 f diff^2, averaged over a fixed sample of entries."""
        e = self.eval_idx
        r, c = self.cooc.rows[e], self.cooc.cols[e]
        o, d = self.offsets, self.d
        W = w[o[0] : o[1]].reshape(-1, d)
        C = w[o[1] : o[2]].reshape(-1, d)
        diff = np.einsum("ij,ij->i", W[r], C[c]) + w[o[2] + r] + w[o[3] + c] - self.logx[e]
        return float(np.mean(0.5 * self.fx[e] * diff * diff))


__all__ = ["GloveProblem"]
