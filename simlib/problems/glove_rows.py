"""GloVe's table as one row per word: the vector, its AdaGrad sums, the bias and its sum side by side.

Row r of the table holds ``[v_0 .. v_{d-1}, G_0 .. G_{d-1}, b, G_b]`` and is padded to a multiple of
16 values (64 bytes in float32), so a word's row starts on a cache line: word i is row i (W, gW, bw,
gbw), context j is row V + j (C, gC, bc, gbc). One AdaGrad update reads and writes two rows, 7 cache
lines at d = 50, instead of eight places in eight separate arrays. :class:`RowLayout` is the one
accessor: it gives the eight GloVe arrays as strided views of a flat table, and the flat keys of a
set of rows; :func:`rows_kernel` is the AdaGrad kernel on it, with software prefetch of the rows a
few entries ahead.

Example::

    >>> lay = RowLayout(n_words=3, dim=2)
    >>> lay.stride, lay.width, lay.n_params
    (16, 6, 96)
    >>> w = np.arange(lay.n_params, dtype=np.float64)
    >>> W, C, bw, bc, gW, gC, gbw, gbc = lay.views(w)
    >>> W[1].tolist(), gW[1].tolist(), float(bw[1]), float(gbc[0])
    ([16.0, 17.0], [18.0, 19.0], 20.0, 53.0)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_LINE_VALUES = 16  # values per 64-byte cache line in float32: rows are padded to a multiple of it


@dataclass(frozen=True)
class RowLayout:
    """Where each GloVe value lives in the flat table: 2V rows of ``stride`` values (see the module docs)."""

    n_words: int
    dim: int

    @property
    def width(self) -> int:
        """Values used in a row: 2d + 2 (the vector, its sums, the bias, its sum)."""
        return 2 * self.dim + 2

    @property
    def stride(self) -> int:
        """Values per row: the width rounded up to a whole number of cache lines."""
        return -(-self.width // _LINE_VALUES) * _LINE_VALUES

    @property
    def n_params(self) -> int:
        """Size of the flat table: 2V rows (words, then contexts)."""
        return 2 * self.n_words * self.stride

    def matrix(self, w: Any) -> Any:
        """The flat table as its 2V x stride matrix of rows (a view; NumPy or CuPy)."""
        return w[: self.n_params].reshape(2 * self.n_words, self.stride)

    def views(self, w: Any) -> list[Any]:
        """W, C, bw, bc, gW, gC, gbw, gbc as strided views of the flat table (GloveParams' order)."""
        m, v, d = self.matrix(w), self.n_words, self.dim
        words, contexts = m[:v], m[v:]
        return [words[:, :d], contexts[:, :d], words[:, 2 * d], contexts[:, 2 * d],
                words[:, d : 2 * d], contexts[:, d : 2 * d], words[:, 2 * d + 1], contexts[:, 2 * d + 1]]

    def fill(self, w: np.ndarray, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
        """Write the eight arrays (GloveParams' order) into the table ``w``; returns ``w``."""
        for view, a in zip(self.views(w), arrays):
            view[...] = a
        return w

    def keys(self, words: np.ndarray, contexts: np.ndarray) -> np.ndarray:
        """Flat indices of the used values of word rows ``words`` then context rows ``contexts``, row after row."""
        starts = np.concatenate([words, self.n_words + contexts]).astype(np.int64) * self.stride
        return (starts[:, None] + np.arange(self.width)).ravel()


@intrinsic
def prefetch(typingctx: Any, arr: Any, idx: Any) -> Any:  # pragma: no cover - compiled
    """Ask the CPU to bring the cache line of ``arr[idx]`` in (LLVM's prefetch: for a write, kept close)."""
    sig = types.void(arr, idx)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


# Entries ahead whose rows are prefetched; their ids, log X and f(X) are prefetched twice as far ahead.
AHEAD = 8


@njit(nogil=True, cache=True, fastmath=True)
def rows_kernel(rows, cols, logx, fx, order, T, stride, cbase, dim, eta, clip, ahead) -> float:  # pragma: no cover
    """AdaGrad for entries ``order[0], order[1], ...`` on the flat row table ``T`` in place; returns sum 0.5 f diff^2.

    Word i is the row starting at i * stride, context j the row at (cbase + j) * stride (see the module
    docs). The update is :func:`simlib.problems.glove.adagrad_kernel`'s, value for value.
    NOTE: replaces adagrad_kernel on eight separate arrays. With 46 k words (gcide) the arrays outgrow the
    cache and each update waited on ~10 scattered cache misses, one after another, and on 4 more for the
    entry's id, log X and f(X) (the pass order is random); with the rows side by side and the next entries'
    lines prefetched ``ahead`` entries early the misses overlap. T may be float32 or float64 storage holding
    float32 values: every value is rounded to float32 as it is read, so the arithmetic is float32 on either.
    """
    cost = 0.0
    uw = np.empty(dim, dtype=np.float32)
    uc = np.empty(dim, dtype=np.float32)
    n = order.shape[0]
    line = 64 // T.itemsize
    width = 2 * dim + 2
    for t in range(n):
        if ahead > 0:
            if t + 2 * ahead < n:
                f = order[t + 2 * ahead]
                prefetch(rows, f)
                prefetch(cols, f)
                prefetch(logx, f)
                prefetch(fx, f)
            if t + ahead < n:
                f = order[t + ahead]
                a2 = rows[f] * stride
                b2 = (cbase + cols[f]) * stride
                for q in range(0, width, line):
                    prefetch(T, a2 + q)
                    prefetch(T, b2 + q)
        e = order[t]
        a = rows[e] * stride
        b = (cbase + cols[e]) * stride
        gw = a + dim
        gc = b + dim
        diff = np.float32(T[a + 2 * dim]) + np.float32(T[b + 2 * dim]) - logx[e]
        for k in range(dim):
            diff += np.float32(T[a + k]) * np.float32(T[b + k])
        g = fx[e] * diff
        cost += 0.5 * g * diff
        for k in range(dim):
            tw = min(max(g * np.float32(T[b + k]), -clip), clip) * eta
            tc = min(max(g * np.float32(T[a + k]), -clip), clip) * eta
            uw[k] = tw / np.sqrt(np.float32(T[gw + k]))
            uc[k] = tc / np.sqrt(np.float32(T[gc + k]))
            T[gw + k] = np.float32(T[gw + k]) + tw * tw
            T[gc + k] = np.float32(T[gc + k]) + tc * tc
        for k in range(dim):
            T[a + k] = np.float32(T[a + k]) - uw[k]
            T[b + k] = np.float32(T[b + k]) - uc[k]
        T[a + 2 * dim] = np.float32(T[a + 2 * dim]) - g / np.sqrt(np.float32(T[a + 2 * dim + 1]))
        T[b + 2 * dim] = np.float32(T[b + 2 * dim]) - g / np.sqrt(np.float32(T[b + 2 * dim + 1]))
        T[a + 2 * dim + 1] = np.float32(T[a + 2 * dim + 1]) + g * g
        T[b + 2 * dim + 1] = np.float32(T[b + 2 * dim + 1]) + g * g
    return cost


__all__ = ["RowLayout", "rows_kernel", "prefetch", "AHEAD"]
