"""Sparse logistic regression: the running example of data-parallel SGD (and of Hogwild!).

Labels are y in {-1, +1}; the objective is

    L(w) = (1/M) sum_i log(1 + exp(-y_i x_i . w)) + (l2 / 2) ||w||^2.

The data are CSR arrays (``indptr``, ``indices``, ``values``) so that a mini-batch touches only
the features its rows contain: a worker pulls those rows of the parameter table, computes a
sparse gradient, and pushes it back. That is the parameter-server contract every substrate
implements (see ``simlib.sim`` and ``simlib.parallel``).

Example::

    >>> data = make_sparse_classification(n_rows=1000, n_features=500, nnz_per_row=10, seed=0)
    >>> prob = LogisticProblem(data, l2=1e-4)
    >>> import numpy as np
    >>> w = prob.init_params()
    >>> round(prob.loss(w), 4)  # log(2) at w = 0
    0.6931
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from simlib import _validate as check
from simlib.backend import array_module
from simlib.problems.atomic import atomic_add, compare_swap

# NOTE: rows per compiled call of LogisticProblem.local_steps on a NumPy table (whole steps): a signal handler runs only
# between compiled calls, and the gpu substrate (in the caller's process) hands one worker every step up to the next
# evaluation in one chunk: at eval_every=10**8 that kept Ctrl-C waiting 5 s. Same steps to the bit.
BLOCK = 1 << 18
_DTYPES = {"indptr": np.int64, "indices": np.int32, "values": np.float32, "y": np.float32}


@dataclass
class SparseDataset:
    """Rows of a CSR matrix with labels y in {-1, +1}."""

    indptr: np.ndarray  # int64, n_rows + 1
    indices: np.ndarray  # int32 feature ids, sorted and unique within a row
    values: np.ndarray  # float32
    y: np.ndarray  # float32, -1 or +1
    n_features: int

    def __post_init__(self) -> None:
        for name in ("indptr", "indices", "values", "y"):  # lists are converted; the kernels need arrays
            a = getattr(self, name)
            if not isinstance(a, np.ndarray):
                if not isinstance(a, (list, tuple)):
                    raise ValueError(f"{name} must be a NumPy array or a list, got {type(a).__name__}")
                setattr(self, name, np.asarray(a, dtype=_DTYPES[name]))
        self.validate()

    @property
    def n_rows(self) -> int:
        """Number of examples."""
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        """Number of stored nonzeros."""
        return int(self.indptr[-1])

    def validate(self) -> None:
        """Check shapes, ranges and finiteness; raise ValueError naming the field."""
        check.positive_int("n_features", self.n_features)
        for name in ("indptr", "indices", "values", "y"):
            check.array(name, getattr(self, name), "iu" if name in ("indptr", "indices") else "")
        if len(self.indptr) < 2:  # 1-D: checked above
            raise ValueError("indptr must be a 1-D array of length n_rows + 1 >= 2")
        if self.indptr[0] != 0 or np.any(np.diff(self.indptr) < 0):
            raise ValueError("indptr must start at 0 and be non-decreasing")
        nnz = int(self.indptr[-1])
        if len(self.indices) != nnz or len(self.values) != nnz:
            raise ValueError(f"indices and values must have indptr[-1] = {nnz} entries, "
                             f"got {len(self.indices)} and {len(self.values)}")
        if len(self.y) != self.n_rows:
            raise ValueError(f"y must have one label per row ({self.n_rows}), got {len(self.y)}")
        if nnz and (self.indices.min() < 0 or self.indices.max() >= self.n_features):
            raise ValueError(f"indices must lie in [0, n_features={self.n_features})")
        if not np.all(np.isfinite(self.values)):
            raise ValueError("values must be finite (found NaN or inf)")
        if not np.all(np.isin(self.y, (-1.0, 1.0))):
            raise ValueError("y must hold labels -1 or +1")

    def require_features(self) -> None:
        """Refuse data whose every row is empty: every gradient but the L2 term is zero, nothing is learnt."""
        if self.nnz == 0:
            raise ValueError("data: every row is empty (indptr is all zeros, no nonzero feature), "
                             "so there is nothing to learn")

    def rows(self, start: int, stop: int) -> "SparseDataset":
        """The contiguous slice of rows [start, stop) as its own dataset (a shard)."""
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return SparseDataset(self.indptr[start : stop + 1] - lo, self.indices[lo:hi], self.values[lo:hi],
                             self.y[start:stop], self.n_features)

    def to_scipy(self) -> Any:
        """The same matrix as ``scipy.sparse.csr_matrix`` (for peers such as scikit-learn)."""
        from scipy.sparse import csr_matrix

        return csr_matrix((self.values, self.indices, self.indptr), shape=(self.n_rows, self.n_features))


def make_sparse_classification(n_rows: int = 20_000, n_features: int = 10_000, nnz_per_row: int = 20,
                               label_noise: float = 0.05, zipf: float = 1.1, seed: int = 0) -> SparseDataset:
    """An RCV1-like problem: Zipf-distributed feature ids, unit-norm tf-idf-like rows, noisy labels.

    Features are drawn with probability proportional to 1 / rank**zipf (a few words are common,
    most are rare), values are positive and each row has unit L2 norm, labels come from a hidden
    weight vector and are flipped with probability ``label_noise``.
    """
    for name, count in (("n_rows", n_rows), ("n_features", n_features), ("nnz_per_row", nnz_per_row)):
        check.positive_int(name, count)
    check.probability("label_noise", label_noise)
    check.non_negative("zipf", zipf)
    if nnz_per_row > n_features:
        raise ValueError(f"nnz_per_row ({nnz_per_row}) must be <= n_features ({n_features})")
    rng = np.random.default_rng(seed)
    # Sample feature ids by inverse CDF of the Zipf weights, then drop repeats within a row.
    weights = 1.0 / np.arange(1, n_features + 1, dtype=np.float64) ** zipf
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    perm = rng.permutation(n_features).astype(np.int32)  # so common features are not ids 0, 1, 2, ...
    raw = perm[np.searchsorted(cdf, rng.random((n_rows, nnz_per_row)), side="right").clip(0, n_features - 1)]
    raw.sort(axis=1)
    keep = np.diff(raw, axis=1, prepend=-1) != 0  # each row's first id, and every id unlike the one before it
    counts = keep.sum(axis=1)
    indices = raw[keep].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    # tf-idf-like values: log-normal term weights, rows normalised to unit length.
    values = rng.lognormal(0.0, 0.5, size=len(indices))
    row_of = np.repeat(np.arange(n_rows), counts)
    norms = np.sqrt(np.bincount(row_of, weights=values * values, minlength=n_rows))
    values = (values / norms[row_of]).astype(np.float32)
    # Hidden weights, scaled so the clean margin is informative (most |x.w| well above 1).
    w_true = rng.normal(0.0, 1.0, size=n_features) * np.sqrt(n_features / max(nnz_per_row, 1)) * 0.6
    margin = np.bincount(row_of, weights=values * w_true[indices], minlength=n_rows)
    y = np.where(margin >= 0, 1.0, -1.0)
    flip = rng.random(n_rows) < label_noise
    y[flip] = -y[flip]
    return SparseDataset(indptr, indices, values, y.astype(np.float32), n_features)


def sigmoid(z: Any) -> Any:
    """sigma(z) = 1 / (1 + exp(-z)), computed without overflow."""
    xp = array_module(z)
    ez = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1.0 / (1.0 + ez), ez / (1.0 + ez))


class Replica(NamedTuple):
    """A worker's private copy of the hot keys, and the data's rows split hot first (see :func:`_split_hot`)."""

    hot: np.ndarray  # int64 feature ids, ascending
    values: np.ndarray  # float64, the worker's copy
    base: np.ndarray  # float64, the copy as read from the table at the chunk's start
    split: np.ndarray  # int64 per row: where its nonzeros not in the replica start
    ids: np.ndarray  # int32 per nonzero: its replica slot (hot), else its feature id
    vals: np.ndarray  # float32 per nonzero, in that order
    least: float  # 1 / n_workers: the least part of its change a worker adds (see LogisticProblem.replica)
    pushes: np.ndarray  # int64, one: 2 x the replicas' pushes, + 1 while one holds it (the workers share it: a token)


L2_ON = ("touched", "all")
_FACTS_KEPT = 200_000  # batches whose keys are kept (cleared when full): a 10,000-worker simulation's distinct batches fit
MAX_DECAY = 300.0  # l2_on='all': the weights' common scale s stays above exp(-300), so 1 / s stays finite


class LogisticProblem:
    """Sparse L2-regularised logistic regression, split into the parameter-server contract.

    ``keys(batch)`` are the feature ids a mini-batch touches; ``gradient(w_keys, batch)`` is the
    mini-batch gradient restricted to those keys; ``loss(w)`` is the full objective above.
    ``work(batch)`` is the number of nonzeros, what compute costs. The L2 term is applied in one of
    two ways:

    * ``l2_on='touched'`` (default): l2 * w on the touched keys only, the usual sparse treatment in
      a parameter server (untouched weights are not sent). The table is w. Rare features are
      decayed less often, so this descends a frequency-weighted penalty, not the full one.
    * ``l2_on='all'``: the full objective's step w <- (1 - lr*l2) w - lr*g, every weight decayed
      every step, still touching only the batch's keys: the table holds v and one more key,
      log s, with w = s * v (scikit-learn's ``wscale``); a step adds log(1 - lr*l2) to log s and
      -lr*g / s_new to v. One worker at one row per step computes ``SGDClassifier``'s weights.
      :meth:`weights` turns the table into w.
    """

    metric = "loss"
    lower_is_better = True
    # A device table's steps: 'auto' (fused on CuPy), 'fused', 'array', or 'hogwild': each step's B rows
    # one by one at lr / B, lock-free, B rows in flight on CuPy (one at a time on NumPy).
    device_kernel = "auto"

    def __init__(self, data: SparseDataset, l2: float = 1e-4, eval_rows: int | None = 5_000, seed: int = 0,
                 l2_on: str = "touched"):
        if not isinstance(data, SparseDataset):
            raise ValueError(f"data must be a SparseDataset, got {type(data).__name__}")
        data.require_features()
        check.non_negative("l2", l2)
        check.one_of("l2_on", l2_on, L2_ON)
        self.l2_on = l2_on
        if eval_rows is not None:
            check.positive_int("eval_rows", eval_rows)
        self.data = data
        self.l2 = float(l2)
        self.n_params = data.n_features + (l2_on == "all")  # 'all': one more key, log s
        check.fits_memory("n_features", self.n_params, 8 * self.n_params, 8, "the float64 weights")
        # Loss is evaluated on a fixed sample of rows so that frequent evaluation stays cheap.
        self._eval = data
        if eval_rows is not None and eval_rows < data.n_rows:
            pick = np.sort(np.random.default_rng(seed).choice(data.n_rows, eval_rows, replace=False))
            self._eval = _take_rows(data, pick)
        self._eval_row_of = np.repeat(np.arange(self._eval.n_rows), np.diff(self._eval.indptr))
        self._facts: dict[bytes, tuple[np.ndarray, int]] = {}  # a batch's rows -> (keys, nonzeros)
        self._batches: dict[tuple[int, int, int, int], np.ndarray] = {}  # (start, stop, size, offset) -> rows
        self._last: tuple[Any, Any] = (None, None)  # the last batch asked about, and its facts
        self._split: dict[int, tuple[np.ndarray, ...]] = {}  # hot_keys -> the replica's hot keys and rows split

    def validate(self) -> None:
        """Check the data again (it may have changed since): the kernels index it without bounds checks."""
        self._facts.clear()  # batches' keys computed from the data as it was
        self._split.clear()
        self._last = (None, None)
        self.data.validate()
        self.data.require_features()

    def init_params(self, xp: Any = np) -> Any:
        """w = 0 (float64), the usual start for logistic regression."""
        return xp.zeros(self.n_params, dtype=np.float64)

    def shards(self, n_workers: int) -> list[tuple[int, int]]:
        """Row ranges [start, stop) giving each worker a contiguous, near-equal part of the data."""
        return check.even_ranges(n_workers, self.data.n_rows, "rows")

    def epoch_steps(self, n_workers: int, batch_size: int) -> int:
        """Steps per worker for one pass over the data: ceil(largest shard / batch_size)."""
        return -(-max(b - a for a, b in self.shards(n_workers)) // batch_size)

    def batch(self, shard: tuple[int, int], step: int, batch_size: int) -> np.ndarray:
        """Row ids of mini-batch number ``step`` in a shard (cycling through it in order)."""
        start, stop = shard
        # NOTE: a shard's batches repeat (it is cycled in order), so each is computed once and copied out:
        # 0.5 us instead of 1.9 (three array operations) in a 10,000-worker simulation's every step.
        tag = (start, stop, batch_size, step * batch_size % (stop - start))
        rows = self._batches.get(tag)
        if rows is None:
            rows = start + (np.arange(batch_size) + step * batch_size) % (stop - start)
            if len(self._batches) >= _FACTS_KEPT:
                self._batches.clear()
            self._batches[tag] = rows
        return rows.copy()

    def keys(self, batch: np.ndarray) -> np.ndarray:
        """Sorted unique feature ids touched by the rows in ``batch`` (then log s's key, with l2_on='all').

        Read-only: a shard's batches repeat (it is cycled in order), so each one's keys are computed
        once and kept (see :meth:`_batch_facts`).
        """
        return self._batch_facts(batch)[0]

    def _batch_facts(self, batch: np.ndarray) -> tuple[np.ndarray, int]:
        """(keys, nonzeros) of a batch, from a cache keyed by its rows."""
        # NOTE: a simulated cluster of 1,000 workers spent half its time sorting the same batches' feature
        # ids again (27 us a call); with shards of a few dozen rows, a worker's batches repeat every few steps.
        last = self._last  # NOTE: keys() then work() of one batch: the second call is a look here (1.5 % of a run)
        if last[0] is batch:
            return last[1]
        rows = np.asarray(batch, dtype=np.int64)
        tag = rows.tobytes()
        facts = self._facts.get(tag)
        if facts is None:
            d = self.data
            keys = _batch_keys(d.indptr, d.indices, rows)
            if self.l2_on == "all":
                keys = np.append(keys, d.n_features)
            keys.setflags(write=False)  # shared by every caller: a change in place would corrupt the cache
            facts = (keys, int(np.sum(d.indptr[rows + 1] - d.indptr[rows])))
            if len(self._facts) >= _FACTS_KEPT:
                self._facts.clear()
            self._facts[tag] = facts
        self._last = (batch, facts)  # one assignment: threads sharing the problem never see a torn pair
        return facts

    def weights(self, params: Any) -> Any:
        """w from the table: the table itself, or s * v with l2_on='all'."""
        return params[:-1] * math.exp(float(params[-1])) if self.l2_on == "all" else params

    def work(self, batch: np.ndarray) -> int:
        """Nonzeros in the batch: the unit the compute model charges."""
        return self._batch_facts(batch)[1]

    def gradient(self, w_keys: Any, batch: np.ndarray, keys: np.ndarray | None = None,
                 l2: float | None = None, scale: float = 1.0) -> tuple[np.ndarray, Any]:
        """(keys, scale * g): mean log-loss gradient over the batch plus l2 * w, on the touched features only."""
        d = self.data
        if keys is None:
            keys = _batch_keys(d.indptr, d.indices, np.asarray(batch, dtype=np.int64))
        l2 = self.l2 if l2 is None else l2
        if isinstance(w_keys, np.ndarray):  # NOTE: scale = -lr in the kernel: 4.0 us a step -> 3.0
            return keys, _batch_step(d.indptr, d.indices, d.values, d.y, np.asarray(batch, dtype=np.int64), keys,
                                     np.asarray(w_keys, dtype=np.float64), (l2, scale))
        keys, g = self.gradient_xp(w_keys, batch, keys, l2)
        return keys, g if scale == 1.0 else scale * g

    def gradient_xp(self, w_keys: Any, batch: np.ndarray, keys: np.ndarray | None = None,
                    l2: float | None = None) -> tuple[np.ndarray, Any]:
        """The same gradient in array-module code (NumPy or CuPy): the reference for the compiled kernel."""
        d = self.data
        lens = d.indptr[batch + 1] - d.indptr[batch]
        flat = _ranges(d.indptr[batch], lens)
        cols = d.indices[flat]
        if keys is None:
            keys = np.unique(cols)
        xp = array_module(w_keys)
        local_x = xp.asarray(np.searchsorted(keys, cols))
        vals = xp.asarray(d.values[flat], dtype=np.float64)
        row = xp.asarray(np.repeat(np.arange(len(batch)), lens))
        margin = xp.bincount(row, weights=vals * w_keys[local_x], minlength=len(batch))
        yb = xp.asarray(d.y[batch], dtype=np.float64)
        coef = -yb * sigmoid(-yb * margin) / len(batch)
        g = xp.bincount(local_x, weights=coef[row] * vals, minlength=len(keys))
        return keys, g + (self.l2 if l2 is None else l2) * w_keys

    def step(self, w_keys: Any, batch: np.ndarray, keys: np.ndarray, lr: float) -> tuple[np.ndarray, Any]:
        """(keys, -lr * g): the SGD update of the contract, from the values read (l2_on='all': of v and log s)."""
        if self.l2_on == "touched":
            return self.gradient(w_keys, batch, keys, scale=-lr)
        s, keep = self._scale(float(w_keys[-1])), self._keep(lr)
        _, g = self.gradient(w_keys[:-1] * s, batch, keys[:-1], l2=0.0, scale=-lr)
        xp = array_module(g)
        return keys, xp.concatenate([g / (s * keep), xp.full(1, math.log(keep))])

    def check_training(self, training: Any) -> None:
        """Refuse l2_on='all' runs whose decay the table cannot hold: lr * l2 >= 1, or s below exp(-300) by the end."""
        if self.l2_on != "all" or self.l2 == 0.0:
            return
        total = -training.n_workers * training.steps * math.log(self._keep(training.lr))
        if total > MAX_DECAY:
            raise ValueError(f"l2: with l2_on='all' this run would shrink the weights' common scale to exp(-{total:.4g}), "
                             f"below exp(-{MAX_DECAY:g}) (n_workers * steps * -log(1 - lr*l2)); use fewer steps, "
                             "a smaller l2, or l2_on='touched'")

    def _keep(self, lr: float) -> float:
        """The decay factor 1 - lr*l2 of l2_on='all'; ValueError unless it is positive."""
        if lr * self.l2 >= 1.0:
            raise ValueError(f"lr * l2 must be < 1 with l2_on='all' (the decay factor 1 - lr*l2 must stay positive), "
                             f"got {lr * self.l2:g}")
        return 1.0 - lr * self.l2

    def _scale(self, log_s: float) -> float:
        """s = exp(log s); ValueError naming l2 once the decay so far would make 1 / s overflow."""
        if log_s < -MAX_DECAY:
            raise ValueError(f"l2: with l2_on='all' the weights' common scale fell below exp(-{MAX_DECAY:g}) "
                             f"(lr * l2 * steps > {MAX_DECAY:g}); use fewer steps, a smaller l2, or l2_on='touched'")
        return math.exp(log_s)

    def local_steps(self, w: np.ndarray, shard: tuple[int, int], first: int, count: int, batch_size: int,
                    lr: float, read: Any = None, replica: "Replica | None" = None) -> Any:
        """Steps first .. first+count-1 of a shard applied to ``w`` in place, each exactly as get / step / add.

        The contract's local-step hook: a substrate sharing memory with the table calls it for a chunk of
        steps; several workers calling it on one ``w`` at once, unlocked, is Hogwild!. A table that is not a
        NumPy array (CuPy) takes :func:`simlib.problems.logistic_device.device_steps`: fused CUDA kernels, or
        the array code when ``device_kernel`` is 'array'. ``replica`` (from :meth:`replica`): the hot keys'
        weights are read into it at the chunk's start, updated there privately, and their change is added
        to ``w`` at the chunk's end; every other key is read and written in ``w`` as it goes.
        """
        if not isinstance(w, np.ndarray):  # a device table (the gpu substrate on CuPy)
            from simlib.problems.logistic_device import device_steps

            return device_steps(self, w, shard, first, count, batch_size, lr, read)
        if self.device_kernel == "hogwild":  # lock-free rows, one in flight: each row a step at lr / B
            first, count, lr, batch_size = first * batch_size, count * batch_size, lr / batch_size, 1
        if replica is not None and batch_size != 1:
            raise ValueError(f"hot_keys: replicas take one row per step (batch_size=1), got batch_size={batch_size}")
        if self.l2_on == "all":
            self._scale(float(w[-1]) + count * math.log(self._keep(lr)))
        d, rows, end = self.data, self._rows() if replica is None else replica, first + count
        hyper, per = (float(lr), self.l2, self.l2_on == "all"), max(1, BLOCK // batch_size)
        (seen, log_s), decay = _read_replica(w, rows), np.zeros(1)
        try:  # a compiled call per block of steps, not per chunk: Ctrl-C (and the run's timeout) is answered between
            for c in range(first, end, per):
                _local_sgd((d.indptr, d.indices, d.values, d.y), w, (shard[0], shard[1], c, min(per, end - c),
                                                                    batch_size), hyper, rows, decay)
        finally:  # the steps taken land whole: their decay of log s, the replica's change
            _end_chunk(w, rows, seen, log_s, decay[0])

    def replica(self, n_keys: int, batch_size: int, n_workers: int = 1) -> "Replica":
        """A private replica of the ``n_keys`` most frequent features (ties: lower id first), for :meth:`local_steps`.

        Under Hogwild! the frequent features are written by every worker on nearly every row, so each
        write takes the cache line from the other cores; a worker that updates its own copy of them and
        adds the change to the table once per chunk moves those lines once per chunk instead; with every
        feature replicated (``n_keys = n_features``) no line moves between two pushes. Holding a token (one
        push or read at a time), a worker whose chunk saw m pushes of other replicas adds 1 / (1 + m) of its
        change (at least 1 / n_workers): workers stepping the hot keys from the same values would otherwise
        add n steps computed for one (2 workers at 2,000-row chunks in lock-step: loss 0.583 against 0.5045
        without replicas; averaged, as HogWild++ does, 0.5055), while a chunk no other push overlapped
        (workers taking turns on one core) keeps its whole change. One worker takes the same steps as without one.
        """
        check.positive_int("hot_keys", n_keys)
        if n_keys > self.data.n_features:
            raise ValueError(f"hot_keys must be <= n_features ({self.data.n_features}), got {n_keys}")
        if batch_size != 1:
            raise ValueError(f"hot_keys: replicas take one row per step (batch_size=1), got batch_size={batch_size}")
        if self.device_kernel == "hogwild":
            raise ValueError("hot_keys: device_kernel='hogwild' is the gpu substrate's; use device_kernel='auto'")
        check.positive_int("n_workers", n_workers)
        split = self._split.get(n_keys)
        if split is None:  # NOTE: once per problem and size: 0.2-0.5 s at 200 k x 100 k, and the data do not change
            d = self.data
            # in id order, so each chunk's read and push of the replica walk the table forwards (prefetched)
            hot = np.sort(np.argsort(-np.bincount(d.indices, minlength=d.n_features), kind="stable")[:n_keys])
            slot = np.full(d.n_features, -1, dtype=np.int32)
            slot[hot] = np.arange(n_keys, dtype=np.int32)
            split = self._split[n_keys] = (hot.astype(np.int64), *_split_hot(d.indptr, d.indices, d.values, slot))
        hot, rest = split[0], split[1:]
        return Replica(hot, np.zeros(n_keys), np.zeros(n_keys), *rest, 1.0 / n_workers, np.zeros(1, dtype=np.int64))

    def _rows(self) -> Replica:
        """The data as :func:`_rows_sgd` reads it without a replica: no hot keys, each row's nonzeros as they are."""
        d = self.data
        return Replica(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), d.indptr[:-1], d.indices, d.values,
                       1.0, np.zeros(1, dtype=np.int64))

    @property
    def device_reads_apart(self) -> bool:
        """Whether the device hook takes ``read=``: one step computed from one table, its change added to another.

        The fused kernels do (the gpu substrate's BSP round then needs no copy per worker); the array
        code and the CPU loops do not.
        """
        return self.device_kernel in ("auto", "fused")

    def quality(self, params: Any) -> float:
        """The contract's metric: :meth:`loss` of the table's weights."""
        return self.loss(self.weights(params))

    def loss(self, w: Any) -> float:
        """L(w) on the evaluation rows: mean log-loss plus (l2 / 2) ||w||^2."""
        e, xp = self._eval, array_module(w)
        data_loss = (_mean_log_loss(e.indptr, e.indices, e.values, e.y, np.asarray(w, dtype=np.float64)) if xp is np
                     else xp.mean(xp.logaddexp(0.0, -xp.asarray(e.y, dtype=np.float64) * self._margins(w))))
        with np.errstate(over="ignore"):  # a diverged w: the loss is inf, and the caller says so by name
            return float(data_loss) + 0.5 * self.l2 * float(xp.dot(w, w))

    def accuracy(self, w: Any) -> float:
        """Fraction of evaluation rows whose sign(x . w) equals the label."""
        return float(np.mean(np.where(self._margins(np.asarray(w)) >= 0, 1.0, -1.0) == self._eval.y))

    def _margins(self, w: Any) -> Any:
        """x_i . w of every evaluation row, on ``w``'s array module."""
        e, xp = self._eval, array_module(w)
        vals = xp.asarray(e.values, dtype=np.float64)
        return xp.bincount(xp.asarray(self._eval_row_of), weights=vals * w[xp.asarray(e.indices)], minlength=e.n_rows)


# NOTE: the two kernels below replace ~15 NumPy calls per mini-batch (ranges, unique,
# searchsorted, two bincounts, sigmoid) whose fixed overhead dominates at ~500 nonzeros:
# keys + gradient take 16 us per batch instead of 93 us, and a 16 x 100 simulation 0.12 s
# instead of 0.41 s; the loss kernel likewise. ``gradient_xp`` keeps the array-module version (used on CuPy, and tested equal).
@njit(cache=True, nogil=True, inline="always")
def log_loss_slope(y: float, margin: float) -> float:  # pragma: no cover - compiled
    """d/dm log(1 + exp(-y m)) = -y sigma(-y m), computed so that exp never overflows."""
    z = y * margin
    if z >= 0.0:
        ez = np.exp(-z)
        return -y * ez / (1.0 + ez)
    return -y / (1.0 + np.exp(z))


@njit(cache=True, nogil=True)
def _batch_keys(indptr, indices, batch):  # pragma: no cover - compiled
    """Sorted unique column ids of the rows in ``batch``."""
    n = 0
    for r in batch:
        n += indptr[r + 1] - indptr[r]
    cols = np.empty(n, dtype=np.int64)
    k = 0
    for r in batch:
        for p in range(indptr[r], indptr[r + 1]):
            cols[k] = indices[p]
            k += 1
    cols.sort()
    m = 0
    for i in range(n):
        if i == 0 or cols[i] != cols[i - 1]:
            cols[m] = cols[i]
            m += 1
    return cols[:m].copy()


# NOTE: the step kernel takes the CSR arrays one by one, not as one tuple: it runs once per simulated step, and a
# tuple argument costs 0.12 us more per call to type (2.53 against 2.41 us for a 16-row step); the pair of floats
# ``rates`` costs 0.01 us (1.88 against 1.87 us).
@njit(cache=True, nogil=True)
def _batch_step(indptr, indices, values, y, batch, keys, w_keys, rates):  # pragma: no cover - compiled
    """scale * g, rates = (l2, scale): g_k = (1/B) sum_i -y_i sigma(-y_i x_i.w) x_ik + l2 w_k over the batch, at the
    given keys (which hold every column of the batch). scale = -lr gives the SGD step, each entry the same product
    as NumPy's -lr * g; scale = 1 the gradient itself."""
    l2, scale = rates
    # Column id -> position in keys. Only entries for this batch's columns are written and read,
    # so the table needs no clearing; it is per call so concurrent simulations cannot race on it.
    n = 0
    for k in keys:
        n = max(n, k + 1)
    where = np.empty(n, dtype=np.int64)
    for k in range(keys.shape[0]):
        where[keys[k]] = k
    g = l2 * w_keys
    inv_b = 1.0 / batch.shape[0]
    for r in batch:
        lo, hi = indptr[r], indptr[r + 1]
        margin = 0.0
        for p in range(lo, hi):
            margin += values[p] * w_keys[where[indices[p]]]
        coef = log_loss_slope(y[r], margin) * inv_b
        for p in range(lo, hi):
            g[where[indices[p]]] += coef * values[p]
    for k in range(g.shape[0]):
        g[k] = scale * g[k]
    return g


@njit(cache=True, nogil=True, inline="always")
def _gradient_into(data, w, where, scale, l2, g, seen, touched):  # pragma: no cover - compiled
    """g_j = l2 w_j + (1/B) sum_i slope(y_i, scale x_i.w) x_ij over one mini-batch's rows, in the scratch ``g``.

    where = (start, n_rows, c, batch_size): mini-batch c of the rows [start, start + n_rows). Returns
    (m, touched): the batch's features are touched[:m] (grown when a batch has more); ``seen`` marks them
    with c, so the scratch needs no clearing between batches.
    """
    indptr, indices, values, y = data
    start, n_rows, c, batch_size = where
    inv_b = 1.0 / batch_size
    m = 0
    for b in range(batch_size):
        r = start + (c * batch_size + b) % n_rows
        lo, hi = indptr[r], indptr[r + 1]
        margin = 0.0
        for p in range(lo, hi):
            j = indices[p]
            if seen[j] != c:
                seen[j] = c
                g[j] = l2 * w[j]
                if m == touched.shape[0]:
                    grown = np.empty(2 * m, dtype=np.int64)
                    grown[:m] = touched
                    touched = grown
                touched[m] = j
                m += 1
            margin += values[p] * (w[j] * scale)
        coef = log_loss_slope(y[r], margin) * inv_b
        for p in range(lo, hi):
            g[indices[p]] += coef * values[p]
    return m, touched


@njit(cache=True, nogil=True)
def _local_sgd(data, w, chunk, hyper, rep, decay):  # pragma: no cover - compiled
    """Mini-batches first .. first+count-1 of rows [start, stop) applied to ``w`` in place, one after the other.

    data = (indptr, indices, values, y); chunk = (start, stop, first, count, batch_size); hyper = (lr, l2,
    scaled): with ``scaled`` (l2_on='all') w[:-1] is v and w[-1] is log s, the weights s * v. Each batch is
    w[k] += -lr * g_k, g as in :func:`_batch_step`; the rounding is the serial get / step / add's exactly.
    One row per step reads its nonzeros through ``rep`` (a :class:`Replica`; with no hot keys, the data).
    ``decay[0]``: the decay of log s of the chunk's steps so far (l2_on='all'), not yet in w[-1]; grown by these
    steps' (:func:`_end_chunk` adds it; kept in an array, so a KeyboardInterrupt after any call finds it whole).
    """
    # NOTE: replaces get / step / add per mini-batch (a key sort, a gather into a copy, a 20,000-long
    # index map and a scatter per step) with one compiled pass over the chunk. A worker's own decay of log s
    # is added to the shared key once per chunk, not per step: with several workers, one key written every
    # step by all of them would bounce its cache line between cores.
    indptr, indices, values, y = data
    start, stop, first, count, batch_size = chunk
    lr, l2, scaled = hyper
    pending = decay[0]
    if batch_size == 1:
        decay[0] = _rows_sgd(indptr, y, w, chunk, hyper, rep, pending)
        return
    n_rows, f = stop - start, w.shape[0] - 1
    keep = 1.0 - lr * l2
    log_keep = np.log(keep)
    n = f if scaled else w.shape[0]
    g = np.empty(n)
    seen = np.full(n, -1, dtype=np.int64)
    touched = np.empty(batch_size * 64, dtype=np.int64)
    for c in range(first, first + count):
        s = np.exp(w[f] + pending) if scaled else 1.0  # x 1.0 and / 1.0 are exact: the unscaled sums as before
        m, touched = _gradient_into(data, w, (start, n_rows, c, batch_size), s, 0.0 if scaled else l2, g, seen,
                                    touched)
        div = s * keep if scaled else 1.0
        for q in range(m):
            j = touched[q]
            w[j] += -lr * g[j] / div
        pending += log_keep
    decay[0] = pending if scaled else 0.0


@njit(cache=True, nogil=True, inline="always")
def _take(pushes):  # pragma: no cover - compiled
    """Wait for the replicas' token and take it: pushes[0] = 2 x the pushes so far, + 1 while a worker holds it."""
    while True:
        c = pushes[0]
        if c % 2 == 0 and compare_swap(pushes, 0, c, c + 1):
            return c


@njit(cache=True, nogil=True)
def _read_replica(w, rep):  # pragma: no cover - compiled
    """A chunk's start: the replica's values and base read from w[hot] holding the token (no push half seen);
    (the token's count, w[-1]: log s with l2_on='all') then."""
    c = _take(rep.pushes)
    for q in range(rep.hot.shape[0]):
        rep.values[q] = w[rep.hot[q]]
        rep.base[q] = rep.values[q]
    log_s = w[w.shape[0] - 1]
    compare_swap(rep.pushes, 0, c + 1, c)
    return c, log_s


@njit(cache=True, nogil=True)
def _end_chunk(w, rep, seen, log_s, pending):  # pragma: no cover - compiled
    """A chunk's end: the replica's change to w[hot] and the chunk's decay ``pending`` to log s (w[-1], l2_on='all'
    only: else 0), as :func:`_push_replica` adds them."""
    if rep.hot.shape[0]:
        _push_replica(w, rep, seen, log_s, pending)
    elif pending != 0.0:
        atomic_add(w, w.shape[0] - 1, pending)  # other workers add theirs meanwhile: a plain += lost one now and then


@njit(cache=True, nogil=True)
def _split_hot(indptr, indices, values, slot):  # pragma: no cover - compiled
    """Each row's nonzeros reordered hot first: (split, ids, values), row r's hot ones at indptr[r]..split[r]-1
    with their replica slots as ids, the rest after them with their feature ids, each part in the row's order."""
    n = indptr.shape[0] - 1
    split = np.empty(n, dtype=np.int64)
    ids = np.empty_like(indices)
    vals = np.empty_like(values)
    for r in range(n):
        q = indptr[r]
        for p in range(indptr[r], indptr[r + 1]):
            if slot[indices[p]] >= 0:
                ids[q] = slot[indices[p]]
                vals[q] = values[p]
                q += 1
        split[r] = q
        for p in range(indptr[r], indptr[r + 1]):
            if slot[indices[p]] < 0:
                ids[q] = indices[p]
                vals[q] = values[p]
                q += 1
    return split, ids, vals


@njit(cache=True, nogil=True, inline="always")
def _rows_sgd(indptr, y, w, chunk, hyper, rep, pending):  # pragma: no cover - compiled
    """One-row steps of :func:`_local_sgd`, the hot keys (if any) in the replica ``rep``; the decay ``pending`` grown.

    rep.values = rep.base = w[hot] at the chunk's start (:func:`_read_replica`); a row's hot nonzeros (first, see
    :func:`_split_hot`) read and write rep.values, the others w; at its end (:func:`_end_chunk`) w[hot] +=
    share * (values - base) (:func:`_push_replica`; and log s += the chunk's decay). One worker (share 1) computes
    what it computes without a replica, up to the order of each margin's sum and the rounding of the push.
    """
    # NOTE: a branch per nonzero (hot or not) cost 3x the time per nonzero (mispredicted half the time);
    # rows split hot first once per run make both loops branch-free.
    start, stop, first, count, _ = chunk
    lr, l2, scaled = hyper
    rep_w, split, ids, vals = rep.values, rep.split, rep.ids, rep.vals
    n_rows, f = stop - start, w.shape[0] - 1
    keep = 1.0 - lr * l2
    log_keep = np.log(keep)
    log_s = w[f]  # log s is a replicated key too: this chunk's decay is added at its end
    for c in range(first, first + count):
        r = start + c % n_rows
        lo, mid, hi = indptr[r], split[r], indptr[r + 1]
        margin = 0.0
        if scaled:
            s = np.exp(log_s + pending)
            for p in range(lo, mid):
                margin += vals[p] * (rep_w[ids[p]] * s)
            for p in range(mid, hi):
                margin += vals[p] * (w[ids[p]] * s)
            step = -lr * log_loss_slope(y[r], margin) / (s * keep)
            for p in range(lo, mid):
                rep_w[ids[p]] += step * vals[p]
            for p in range(mid, hi):
                w[ids[p]] += step * vals[p]
            pending += log_keep
        else:
            for p in range(lo, mid):
                margin += vals[p] * rep_w[ids[p]]
            for p in range(mid, hi):
                margin += vals[p] * w[ids[p]]
            coef = log_loss_slope(y[r], margin)
            for p in range(lo, mid):
                rep_w[ids[p]] += -lr * (l2 * rep_w[ids[p]] + coef * vals[p])
            for p in range(mid, hi):
                w[ids[p]] += -lr * (l2 * w[ids[p]] + coef * vals[p])
    return pending


@njit(cache=True, nogil=True, inline="always")
def _push_replica(w, rep, seen, log_s, pending):  # pragma: no cover - compiled
    """Holding the token, share = max(1 / (1 + m), least) of the replica's change of the weights s * v added to
    w[hot], m the other pushes since the read (at token count ``seen``):
    v[hot] = (v[hot] + share * a * (g * values - base)) / g, g = exp(pending) the chunk's decay of s, a = exp(log_s -
    w[-1]) the other workers' decay since the read; then log s += pending. Without l2_on='all' (pending = 0):
    w[hot] += share * (values - base). So the hot keys decay by the share of each worker's decay, as they step."""
    # NOTE: v[hot] += share * (values - base) decayed them by every worker's decay but stepped them by the share:
    # l2 doubled on every replicated key; pushes without the token lost each other's rescaling (both push their
    # 100,000 keys at once in lock-step). 2 workers, every key replicated, had ended 1-2.5 % above scikit-learn's
    # loss; with both, -0.4 % (lock-step) to +0.8 % (chunks' quarters interleaved at random) in emulations.
    c, f, g = _take(rep.pushes), w.shape[0] - 1, np.exp(pending)
    part = max(1.0 / (1.0 + (c - seen) // 2), rep.least) * (np.exp(log_s - w[f]) if pending != 0.0 else 1.0)
    for q in range(rep.hot.shape[0]):
        w[rep.hot[q]] = (w[rep.hot[q]] + part * (g * rep.values[q] - rep.base[q])) * (1.0 / g)
    if pending != 0.0:  # else w[-1] is a feature, written by other workers meanwhile
        w[f] += pending  # under the token: no other replica adds to it now
    compare_swap(rep.pushes, 0, c + 1, c + 2)


@njit(cache=True, nogil=True)
def _mean_log_loss(indptr, indices, values, y, w):  # pragma: no cover - compiled
    """(1/M) sum_i log(1 + exp(-y_i x_i . w))."""
    total = 0.0
    m = indptr.shape[0] - 1
    for r in range(m):
        margin = 0.0
        for p in range(indptr[r], indptr[r + 1]):
            margin += values[p] * w[indices[p]]
        z = -y[r] * margin
        total += max(z, 0.0) + np.log1p(np.exp(-abs(z)))
    return total / m


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), vectorised."""
    # Output k, in range i (which starts at output offset_i = cumsum(lens)[i] - lens[i]), is k - (offset_i - s_i).
    starts, lens = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    return np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens - starts, lens)


def _take_rows(d: SparseDataset, rows: np.ndarray) -> SparseDataset:
    lens = d.indptr[rows + 1] - d.indptr[rows]
    flat = _ranges(d.indptr[rows], lens)
    return SparseDataset(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), d.indices[flat], d.values[flat],
                         d.y[rows], d.n_features)
