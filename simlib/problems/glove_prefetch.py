"""Software prefetch for GloVe's AdaGrad kernel: the next entries' rows are on their way while one is updated.

With a vocabulary of tens of thousands of words (46,838 on gcide, d = 50) the eight arrays outgrow
a core's cache, and the entries are visited in a shuffled order, so every update waits on cache misses:
the entry's word ids, log X and f(X) (four arrays indexed by a random entry id), then the two words'
vectors, AdaGrad sums and biases. Out-of-order execution cannot overlap them across updates (an update
is a long dependent chain), so one update's misses come one after another. With ``ahead > 0``,
:func:`simlib.problems.glove.adagrad_kernel` calls :func:`prefetch_ahead` before each update: it asks for
the entry data ``2 * ahead`` entries early and for the rows ``ahead`` entries early (their ids have
arrived by then), so the misses of many entries overlap. Prefetching changes no value.

NOTE: measured on gcide's 46,838 words, Hogwild through simlib.run (benchmarks/glove.py, 5 epochs, two runs back
to back at load ~5 on 2 cores): 0.95 M -> 2.36 M updates/s on one process, 0.87 M -> 3.39 M on two; the kernel
alone, at load ~2: 2.6-2.9 M on one process, 5.2 M on two. Keeping a word's vector, sums and bias in one row
(fewer cache lines) measured no faster once the rows were prefetched, so the table keeps its eight arrays.
"""
from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# Entries ahead whose rows are prefetched (their ids, log X and f(X): twice as far). One pass over gcide's entries,
# one process, d = 50, 2 busy cores (load 2-4): 8 ahead 1.3 M updates/s, 16 ahead 1.6-2.9 M, 32 ahead 2.5-2.6 M.
AHEAD = 16


@intrinsic
def prefetch(typingctx: Any, arr: Any, idx: Any) -> Any:  # pragma: no cover - compiled
    """Ask the CPU for the cache line of ``arr[idx]`` (1-D ``arr``; LLVM's prefetch for a write, kept close)."""
    sig = types.void(arr, idx)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        # (address, write = 1, locality = 3: keep in all levels, data cache = 1)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True, fastmath=True, inline="always", error_model="numpy")
def prefetch_ahead(entries, params, order, t, ahead) -> None:  # pragma: no cover - compiled
    """While entry ``order[t]`` is updated: ask for the data of entry ``order[t + 2 ahead]`` (its word ids, log X, f(X))
    and for every cache line of entry ``order[t + ahead]``'s two words (vectors, AdaGrad sums, biases, their sums)."""
    rows, cols, logx, fx = entries
    W, C, bw, bc, gW, gC, gbw, gbc = params
    n = order.shape[0]
    if t + 2 * ahead < n:
        f = order[t + 2 * ahead]
        prefetch(rows, f)
        prefetch(cols, f)
        prefetch(logx, f)
        prefetch(fx, f)
    if t + ahead < n:
        e = order[t + ahead]
        i = rows[e]
        j = cols[e]
        dim = W.shape[1]
        line = 64 // W.itemsize
        wi, cj, gwi, gcj = W[i], C[j], gW[i], gC[j]  # row views
        for q in range(0, dim + line - 1, line):  # the row's first value's line, then one per 64 bytes, and its last
            k = min(q, dim - 1)
            prefetch(wi, k)
            prefetch(cj, k)
            prefetch(gwi, k)
            prefetch(gcj, k)
        prefetch(bw, i)
        prefetch(bc, j)
        prefetch(gbw, i)
        prefetch(gbc, j)


__all__ = ["prefetch", "prefetch_ahead", "AHEAD"]
