"""Atomic operations on one element of a NumPy array, for compiled kernels that share memory with other processes.

``atomic_add(arr, i, v)`` is ``arr[i] += v`` as one indivisible read-modify-write (integers and floats);
``compare_swap(arr, i, old, new)`` sets ``arr[i] = new`` only if it holds ``old`` and says whether it did
(acquire-release: what one process wrote before releasing a lock word, the next one to take it sees).
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _pointer(context, builder, signature, args):  # pragma: no cover - compiled
    """The address of arr[index] (args: the array, the index)."""
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    return aryty, cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])


@intrinsic
def atomic_add(typingctx, arr, index, value):  # pragma: no cover - compiled
    """arr[index] += value as one atomic read-modify-write (LLVM atomicrmw add, or fadd on floats)."""
    def codegen(context, builder, signature, args):
        aryty, ptr = _pointer(context, builder, signature, args)
        val = context.cast(builder, args[2], signature.args[2], aryty.dtype)
        builder.atomic_rmw("fadd" if isinstance(aryty.dtype, types.Float) else "add", ptr, val, "monotonic")
        return context.get_dummy_value()
    return types.void(arr, index, value), codegen


@intrinsic
def compare_swap(typingctx, arr, index, expected, value):  # pragma: no cover - compiled
    """arr[index] = value if it holds ``expected`` (LLVM cmpxchg, acquire-release); True if it did."""
    def codegen(context, builder, signature, args):
        aryty, ptr = _pointer(context, builder, signature, args)
        old = context.cast(builder, args[2], signature.args[2], aryty.dtype)
        new = context.cast(builder, args[3], signature.args[3], aryty.dtype)
        return builder.extract_value(builder.cmpxchg(ptr, old, new, "acq_rel", "acquire"), 1)
    return types.boolean(arr, index, expected, value), codegen
