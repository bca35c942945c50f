"""GloVe: word vectors from a weighted least-squares fit to log co-occurrence counts.

The co-occurrence count X_ij sums 1/distance over every pair of positions (p, q) in the same
document with 0 < |p - q| <= L, word i at p and word j at q (so X is symmetric). GloVe fits

    J = sum_{X_ij > 0} f(X_ij) (w_i . c_j + b_i + b'_j - log X_ij)^2,
    f(x) = min(1, (x / x_max) ** alpha),   alpha = 0.75, x_max = 100,

with AdaGrad, one co-occurrence entry at a time. The update follows the reference C program
(stanfordnlp/GloVe, current master) exactly, so that its loss per epoch is comparable: with
g = f(X_ij) * diff (the factor 2 of the gradient folded into the step sizes),

    t = eta * clip(g c_j),  w_i -= t / sqrt(G_w_i),  G_w_i += t^2   (element-wise; same for c_j)
    b_i -= g / sqrt(G_b_i),  G_b_i += g^2                          (same for b'_j; no eta here)

where every accumulator G starts at 1 and clip limits each component to +-grad_clip. The reported cost is the C program's: the mean over the
entries of a pass of 0.5 f diff^2, each measured just before its update.

Example::

    >>> from simlib.data import load_kjv, Vocabulary
    >>> kjv = load_kjv()
    >>> vocab = Vocabulary.build(kjv.docs, min_count=5)
    >>> ids, offsets = vocab.encode_docs(kjv.docs)
    >>> cooc = count_cooccurrences(ids, offsets, len(vocab), window=10)
    >>> config = GloveConfig(dim=50)
    >>> params = GloveParams.init(len(vocab), config)
    >>> logx, fx = entry_terms(cooc.values, config)
    >>> total = adagrad_kernel((cooc.rows, cooc.cols, logx, fx), epoch_order(cooc.nnz, config.seed, 0), params.arrays(),
    ...                        np.float32(config.lr), np.float32(config.grad_clip))    # one pass, in place

Training runs through :func:`simlib.run` on :class:`simlib.problems.glove_table.GloveProblem` (every
substrate); the tests keep a single-process trainer of their own as the independent reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from simlib import _validate as check
from simlib.problems.glove_prefetch import prefetch_ahead

# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GloveConfig:
    """Hyperparameters of GloVe training (defaults: the reference C program's)."""

    dim: int = 50
    x_max: float = 100.0
    alpha: float = 0.75
    lr: float = 0.05
    grad_clip: float = 100.0
    # passes over the entries: simlib.run trains epochs x problem.epoch_steps(n_workers, batch_size) steps where it is
    # given no steps= (it trained 50 steps whatever the epochs: epochs=1 and epochs=50 gave the same parameters)
    epochs: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        check.positive_int("dim", self.dim)
        for name in ("x_max", "alpha", "lr", "grad_clip"):
            check.positive(name, getattr(self, name))
        check.positive_int("epochs", self.epochs)
        check.non_negative_int("seed", self.seed)


def weight(x: np.ndarray, x_max: float = 100.0, alpha: float = 0.75) -> np.ndarray:
    """GloVe weight f(x) = (x / x_max) ** alpha, capped at 1."""
    return np.minimum(1.0, (np.asarray(x, dtype=np.float64) / x_max) ** alpha)


# -- co-occurrence counting -----------------------------------------------------------------------


@dataclass
class Cooccurrence:
    """A symmetric co-occurrence matrix as COO entries (``rows[k], cols[k]) -> values[k]``)."""

    rows: np.ndarray  # int32
    cols: np.ndarray  # int32
    values: np.ndarray  # float32, > 0
    n_words: int

    @property
    def nnz(self) -> int:
        """Number of stored (nonzero) entries."""
        return int(self.values.shape[0])

    def to_dense(self) -> np.ndarray:
        """The matrix as a dense float64 array (for small vocabularies and tests)."""
        dense = np.zeros((self.n_words, self.n_words))
        np.add.at(dense, (self.rows, self.cols), self.values)
        return dense


_EMPTY = -1


@njit(nogil=True, cache=True)
def _mix(key: int) -> int:
    """A 64-bit finaliser (murmur3's) so that linear probing sees well-spread slots."""
    key ^= key >> 33
    key *= -49064778989728563  # 0xff51afd7ed558ccd as a signed 64-bit constant
    key ^= key >> 33
    return key


@njit(nogil=True, cache=True)
def count_pairs_kernel(corpus, table, at, end_doc, limit):
    """Add 1/(q - p) to the slot of the unordered pair (min, max) for every window pair, from ``at``.

    ``corpus`` is (ids, offsets, n_words, window), ``table`` is (keys, vals): an open-addressing hash
    table (size a power of two, -1 = empty) keyed by i * n_words + j, i <= j; ``at`` is (doc, pos, used).
    Stops early, before the token at which ``used`` would pass ``limit``, and returns
    (doc, pos, used) to resume from; returns (end_doc, 0, used) when done.
    NOTE: replaces a Python dict keyed by (i, j) (~0.3 M tokens/s at L = 10) with a flat table
    in compiled code, which keeps the memory for a full table bounded by ``limit``.
    """
    ids, offsets, n_words, window = corpus
    keys, vals = table
    doc, pos, used = at
    mask = keys.shape[0] - 1
    d = doc
    while d < end_doc:
        lo = offsets[d]
        hi = offsets[d + 1]
        p = max(pos, lo) if d == doc else lo
        while p < hi:
            if used >= limit:
                return d, p, used
            a = ids[p]
            if a >= 0:
                for q in range(max(p - window, lo), p):
                    b = ids[q]
                    if b < 0:
                        continue
                    inc = 1.0 / (p - q)
                    key = a * n_words + b if a <= b else b * n_words + a
                    h = _mix(key) & mask
                    while True:
                        k = keys[h]
                        if k == key:
                            vals[h] += inc
                            break
                        if k == _EMPTY:
                            keys[h] = key
                            vals[h] = inc
                            used += 1
                            break
                        h = (h + 1) & mask
            p += 1
        d += 1
    return end_doc, 0, used


@njit(nogil=True, cache=True)
def drain_kernel(keys, vals, used):
    """The table's ``used`` filled slots as (keys, values), unsorted; the table is left empty."""
    out_keys = np.empty(used, dtype=np.int64)
    out_vals = np.empty(used, dtype=np.float64)
    n = 0
    for h in range(keys.shape[0]):
        if keys[h] != _EMPTY:
            out_keys[n] = keys[h]
            out_vals[n] = vals[h]
            keys[h] = _EMPTY
            vals[h] = 0.0
            n += 1
    return out_keys, out_vals


@njit(nogil=True, cache=True, inline="always")
def _merged(a, b, x, y):  # pragma: no cover - compiled
    """The next entry of the merge of the key-sorted runs a and b, read at x and y (equal keys summed): (key, value,
    x, y after it)."""
    ka, va = a
    kb, vb = b
    if y >= kb.shape[0] or (x < ka.shape[0] and ka[x] < kb[y]):
        return ka[x], va[x], x + 1, y
    if x >= ka.shape[0] or kb[y] < ka[x]:
        return kb[y], vb[y], x, y + 1
    return ka[x], va[x] + vb[y], x + 1, y + 1


@njit(nogil=True, cache=True)
def merge_sorted_kernel(a, b, out_k, out_v) -> int:
    """Merge two key-sorted runs (keys, values) into ``out_*``, summing the values of equal keys; returns the length."""
    x = y = n = 0
    while x < a[0].shape[0] or y < b[0].shape[0]:
        out_k[n], out_v[n], x, y = _merged(a, b, x, y)
        n += 1
    return n


def sort_run(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort a run of (key, value) by key."""
    # NOTE: sorting packed (key << s | position) with np.sort avoids np.argsort, which is ~3x slower
    # on int64 here; it works while keys fit in 63 - s bits (vocabularies up to ~2 M words).
    n = keys.shape[0]
    s = max(1, int(n - 1).bit_length())
    if n == 0 or int(keys.max()) >= (1 << (63 - s)):
        order = np.argsort(keys, kind="stable")
        return keys[order], vals[order]
    packed = np.sort((keys << s) | np.arange(n, dtype=np.int64))
    order = packed & ((1 << s) - 1)
    return packed >> s, vals[order]


def merge_runs(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge two sorted (keys, values) runs into one, summing equal keys."""
    out_k = np.empty(a[0].shape[0] + b[0].shape[0], dtype=np.int64)
    out_v = np.empty(out_k.shape[0], dtype=np.float64)
    n = merge_sorted_kernel(a, b, out_k, out_v)
    return out_k[:n], out_v[:n]  # views: a copy would move every entry once more


def table_capacity(max_entries: int) -> int:
    """Hash-table size (a power of two) that holds ``max_entries`` at a load of at most 1/2."""
    return 1 << max(4, int(2 * max_entries - 1).bit_length())


def count_runs(ids: np.ndarray, offsets: np.ndarray, n_words: int, window: int, doc_lo: int, doc_hi: int,
               buffer_entries: int) -> tuple[np.ndarray, np.ndarray]:
    """Count documents [doc_lo, doc_hi) into a table of ``buffer_entries`` slots, spilling sorted runs and merging them.

    Returns the unordered pairs (key = i * n_words + j, i <= j) sorted by key, with their summed
    weights. Peak memory is the table plus the merged result, however long the documents.
    """
    keys = np.full(table_capacity(buffer_entries), _EMPTY, dtype=np.int64)
    vals = np.zeros(keys.shape[0], dtype=np.float64)
    # Leave room for one token's window past the limit: the kernel checks before each token.
    limit = max(1, buffer_entries - window)
    merged = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
    doc, pos, used = doc_lo, 0, 0
    while True:
        doc, pos, used = count_pairs_kernel((ids, offsets, n_words, window), (keys, vals), (doc, pos, 0), doc_hi, limit)
        run = sort_run(*drain_kernel(keys, vals, used))
        merged = run if merged[0].shape[0] == 0 else merge_runs(merged, run)
        if doc >= doc_hi:
            return merged


def runs_to_cooccurrence(keys: np.ndarray, vals: np.ndarray, n_words: int,
                         other: tuple[np.ndarray, np.ndarray] | None = None) -> Cooccurrence:
    """Expand unordered pairs (i <= j) to the symmetric matrix: (i, j) and (j, i), diagonal doubled.

    With ``other`` (a second key-sorted run), the two runs merged (equal keys summed, as :func:`merge_runs`)
    are expanded without building the merge. Entries come in key order, then the mirrored (j, i) of the
    off-diagonal ones in key order.
    """
    b = other if other is not None else (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
    return Cooccurrence(*symmetric_kernel((keys, vals), b, n_words), n_words=n_words)  # rows, cols, values


@njit(nogil=True, cache=True)
def symmetric_kernel(a, b, n_words):  # pragma: no cover - compiled
    """(rows, cols, values) of the runs a and b merged and expanded (see :func:`runs_to_cooccurrence`).

    NOTE: one compiled walk to size the output and one to fill it, in place of a merged copy and ten
    NumPy passes (two integer divisions per key among them): the row is tracked as the sorted keys rise.
    """
    n, m = _symmetric_walk(a, b, n_words, (np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32)), -1)
    out = (np.empty(n + m, np.int32), np.empty(n + m, np.int32), np.empty(n + m, np.float32))
    _symmetric_walk(a, b, n_words, out, n)
    return out


@njit(nogil=True, cache=True, inline="always")
def _symmetric_walk(a, b, n_words, out, first):  # pragma: no cover - compiled
    """Walk the merge of the runs a and b; where ``first`` >= 0, write entry n at n and its mirror at first + m.
    Returns (n, m): the merged entries and the off-diagonal ones among them."""
    rows, cols, values = out
    x = y = n = m = 0
    row, row_start = 0, 0  # the row of the key: keys i * n_words + j rise, so i only grows
    while x < a[0].shape[0] or y < b[0].shape[0]:
        k, v, x, y = _merged(a, b, x, y)
        while k >= row_start + n_words:
            row += 1
            row_start += n_words
        col = k - row_start
        if first >= 0:
            rows[n], cols[n] = row, col
            values[n] = v if row != col else 2.0 * v  # a pair of equal words counts in both orders
            if row != col:
                rows[first + m], cols[first + m], values[first + m] = col, row, v
        if row != col:
            m += 1
        n += 1
    return n, m


def validate_counting(ids: np.ndarray, offsets: np.ndarray, n_words: int, window: int) -> None:
    """Check the counting inputs; raise ValueError naming the field."""
    check.positive_int("window", window)
    check.positive_int("n_words", n_words)
    if n_words < 2:
        raise ValueError(f"n_words (the vocabulary size) must be >= 2 for co-occurrences, got {n_words}")
    check.array("ids", ids)
    check.array("offsets", offsets, "iu")
    if offsets.shape[0] < 2 or offsets[0] != 0 or offsets[-1] != ids.shape[0]:
        raise ValueError("offsets must start at 0 and end at len(ids), one more entry than documents")
    lengths = np.diff(offsets)
    if np.any(lengths < 0):  # the kernel walks [offsets[d], offsets[d + 1]) and would read outside ids
        raise ValueError(f"offsets must be non-decreasing, got a decrease at document {int(np.argmax(lengths < 0))}")
    if ids.shape[0] == 0:
        raise ValueError("ids (the corpus) is empty: no token is in the vocabulary")
    if ids.dtype != np.int32:
        raise ValueError(f"ids must be int32, got {ids.dtype}")
    if int(ids.max()) >= n_words:
        raise ValueError(f"ids must be < n_words ({n_words}), got {int(ids.max())}")
    if int(lengths.max()) < 2:
        raise ValueError("offsets: no document has two tokens, so there are no co-occurrences to count "
                         "(documents are counted separately: join short ones into longer documents)")


def count_cooccurrences(ids: np.ndarray, offsets: np.ndarray, n_words: int, window: int = 10,
                        buffer_entries: int = 1 << 22) -> Cooccurrence:
    """X_ij = sum of 1/|p - q| over same-document position pairs 0 < |p - q| <= window (one process).

    ``ids``/``offsets`` come from :meth:`simlib.data.Vocabulary.encode_docs`; negative ids are
    skipped but keep their position. ``buffer_entries`` bounds the counting table.
    """
    validate_counting(ids, offsets, n_words, window)
    check.positive_int("buffer_entries", buffer_entries)
    keys, vals = count_runs(ids, offsets, n_words, window, 0, offsets.shape[0] - 1, buffer_entries)
    return runs_to_cooccurrence(keys, vals, n_words)


# -- parameters and training ---------------------------------------------------------------------


@dataclass
class GloveParams:
    """Word vectors W, context vectors C, their biases, and the AdaGrad accumulators of each (float32)."""

    W: np.ndarray
    C: np.ndarray
    bw: np.ndarray
    bc: np.ndarray
    gW: np.ndarray
    gC: np.ndarray
    gbw: np.ndarray
    gbc: np.ndarray

    ARRAYS = ("W", "C", "bw", "bc", "gW", "gC", "gbw", "gbc")

    @staticmethod
    def shapes(n_words: int, dim: int) -> dict[str, tuple[int, ...]]:
        """The shape of each array, by name."""
        return dict(zip(GloveParams.ARRAYS, [(n_words, dim), (n_words, dim), (n_words,), (n_words,)] * 2))

    @classmethod
    def init(cls, n_words: int, config: GloveConfig, out: dict[str, np.ndarray] | None = None) -> "GloveParams":
        """Vectors and biases uniform in [-0.5, 0.5) / dim, accumulators 1 (as the C program); fills ``out`` if given."""
        rng = np.random.default_rng(config.seed)
        arrays = out if out is not None else {name: np.empty(shape, dtype=np.float32)
                                               for name, shape in cls.shapes(n_words, config.dim).items()}
        for name in ("W", "C", "bw", "bc"):
            arrays[name][...] = (rng.random(arrays[name].shape, dtype=np.float32) - 0.5) / config.dim
        for name in ("gW", "gC", "gbw", "gbc"):
            arrays[name][...] = 1.0
        return cls(**{name: arrays[name] for name in cls.ARRAYS})

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The eight arrays in kernel order: W, C, bw, bc, gW, gC, gbw, gbc."""
        return tuple(getattr(self, name) for name in self.ARRAYS)

    def vectors(self) -> np.ndarray:
        """The embedding used for evaluation: W + C (as the C program's default output)."""
        return self.W + self.C


def entry_terms(values: np.ndarray, config: GloveConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per-entry (log X_ij, f(X_ij)) as float32, computed once so each update needs no log or pow."""
    return np.log(values).astype(np.float32), weight(values, config.x_max, config.alpha).astype(np.float32)


@njit(nogil=True, cache=True, fastmath=True, inline="always", error_model="numpy")
def entry_residual(W, C, bw, bc, logx_e, i, j) -> float:  # pragma: no cover - compiled
    """w_i . c_j + b_i + b'_j - log X_ij: what the weighted least squares drives to zero."""
    diff = np.float32(bw[i]) + np.float32(bc[j]) - logx_e
    for k in range(W.shape[1]):
        diff += np.float32(W[i, k]) * np.float32(C[j, k])
    return diff


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def adagrad_kernel(entries, order, params, eta, clip, ahead=0) -> float:
    """Apply the AdaGrad update for entries ``order[0], order[1], ...`` in place; return sum of 0.5 f diff^2.

    ``entries`` is (rows, cols, logx, fx) of every co-occurrence entry (:func:`entry_terms`), ``params`` the eight
    arrays of :meth:`GloveParams.arrays` (W, C, bw, bc, gW, gC, gbw, gbc), ``eta`` and ``clip`` float32.
    With ``ahead > 0`` each update first prefetches the entries ``ahead`` and ``2 ahead`` further on
    (:mod:`simlib.problems.glove_prefetch`; :data:`~simlib.problems.glove_prefetch.AHEAD` is the measured best):
    the same values, much faster once the table outgrows the cache.

    NOTE: one fused compiled loop replaces the per-entry NumPy version (gather two rows, dot,
    two clipped AdaGrad row updates), which spends most of its time in call overhead.
    ``fastmath`` lets the row loops vectorise (1/sqrt over 50 floats) -- see benchmarks/glove.py -- and
    ``error_model="numpy"`` lets them at all: numba's default tests every float division for a zero divisor
    (to raise ZeroDivisionError), and that branch kept the loops scalar. KJV, d = 50, one epoch on one core:
    175-192 against 318-376 ns of CPU per update, the same cost to the last digit.
    The arrays may be float32 (GloveParams) or float64 storage holding float32 values (the flat table of
    :mod:`simlib.problems.glove_table`): every value is rounded to float32 before it is used and after it is
    updated, so the arithmetic is the C program's float32 on either (the casts are no-ops on float32).
    """
    rows, cols, logx, fx = entries
    W, C, bw, bc, gW, gC, gbw, gbc = params
    dim = W.shape[1]
    cost = 0.0
    uw = np.empty(dim, dtype=np.float32)
    uc = np.empty(dim, dtype=np.float32)
    for t in range(order.shape[0]):
        if ahead > 0:
            prefetch_ahead(entries, params, order, t, ahead)
        e = order[t]
        i = rows[e]
        j = cols[e]
        diff = entry_residual(W, C, bw, bc, logx[e], i, j)
        g = fx[e] * diff
        cost += 0.5 * g * diff
        for k in range(dim):
            tw = min(max(g * np.float32(C[j, k]), -clip), clip) * eta
            tc = min(max(g * np.float32(W[i, k]), -clip), clip) * eta
            uw[k] = tw / np.sqrt(np.float32(gW[i, k]))
            uc[k] = tc / np.sqrt(np.float32(gC[j, k]))
            gW[i, k] = np.float32(gW[i, k]) + tw * tw
            gC[j, k] = np.float32(gC[j, k]) + tc * tc
        for k in range(dim):
            W[i, k] = np.float32(W[i, k]) - uw[k]
            C[j, k] = np.float32(C[j, k]) - uc[k]
        bw[i] = np.float32(bw[i]) - g / np.sqrt(np.float32(gbw[i]))
        bc[j] = np.float32(bc[j]) - g / np.sqrt(np.float32(gbc[j]))
        gbw[i] = np.float32(gbw[i]) + g * g
        gbc[j] = np.float32(gbc[j]) + g * g
    return cost


def validate_training(cooc: Cooccurrence, config: GloveConfig) -> None:
    """Check every array the compiled kernels index; raise ValueError naming the field."""
    for name, value, kind in (("cooc", cooc, Cooccurrence), ("config", config, GloveConfig)):
        if not isinstance(value, kind):
            raise ValueError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
    check.positive_int("cooc.n_words", cooc.n_words)
    if cooc.n_words < 2:
        raise ValueError(f"n_words (the vocabulary size) must be >= 2, got {cooc.n_words}")
    # NOTE: the kernels do no bounds checks; an id out of range wrote outside shared memory (signal 11).
    for name in ("rows", "cols", "values"):
        check.array(f"cooc.{name}", getattr(cooc, name), "f" if name == "values" else "iu")
    if not (cooc.rows.shape == cooc.cols.shape == cooc.values.shape):
        raise ValueError(f"cooc.rows, cooc.cols and cooc.values must have the same length, got "
                         f"{cooc.rows.shape[0]}, {cooc.cols.shape[0]} and {cooc.values.shape[0]}")
    if cooc.nnz == 0:
        raise ValueError("cooc (the co-occurrence matrix) has no entries: the corpus is empty or too short")
    for name in ("rows", "cols"):
        a = getattr(cooc, name)
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= cooc.n_words:
            raise ValueError(f"cooc.{name} must lie in [0, n_words={cooc.n_words}), got ids from {lo} to {hi}")
    bad = ~(np.isfinite(cooc.values) & (cooc.values > 0))
    if bad.any():  # the loss takes log X_ij, and f(X_ij) divides by x_max only for X_ij > 0
        raise ValueError(f"cooc.values must be finite and > 0 (log X is taken), got {cooc.values[bad][0]!r} "
                         f"at entry {int(np.flatnonzero(bad)[0])}")


def epoch_order(nnz: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled order of all entries in ``epoch``: one seeded permutation that every process can recompute."""
    return np.random.default_rng([seed, epoch]).permutation(nnz).astype(np.int64)


def loss(params: GloveParams, cooc: Cooccurrence, config: GloveConfig, chunk: int = 1 << 20) -> float:
    """J = sum f(X_ij) (w_i . c_j + b_i + b'_j - log X_ij)^2 over all entries (evaluated in chunks)."""
    total = 0.0
    for lo in range(0, cooc.nnz, chunk):
        r, c, x = cooc.rows[lo:lo + chunk], cooc.cols[lo:lo + chunk], cooc.values[lo:lo + chunk]
        diff = np.einsum("ij,ij->i", params.W[r], params.C[c], dtype=np.float64) + params.bw[r] + params.bc[c] - np.log(x)
        total += float(np.sum(weight(x, config.x_max, config.alpha) * diff * diff))
    return total
