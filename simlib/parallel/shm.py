"""Shared arrays: one NumPy array in ``multiprocessing.shared_memory`` with exactly one owner.

The process that creates a :class:`SharedArray` owns the segment and unlinks it exactly once:
on :meth:`SharedArray.unlink`, at the end of a ``with`` block, when the owner object is garbage
collected, or at interpreter exit (a ``weakref.finalize``). Pickling a SharedArray (passing it to
a worker under ``spawn``, or through a pipe) sends only its name, shape and dtype; the receiver
attaches to the same memory and never unlinks. A forked child inherits the owner object but not
the ownership (the finaliser checks the process id). If the owner is killed outright (SIGKILL),
Python's resource tracker still removes the segment when the owner's process tree goes away.

Segment names start with ``simlib_`` so a leak is easy to see in ``/dev/shm``. Example::

    >>> with SharedArray.zeros((3,), "float64") as a:
    ...     a.array[:] = [1.0, 2.0, 3.0]
    ...     float(a.array.sum())
    6.0
"""
from __future__ import annotations

import contextlib
import os
import secrets
import sys
import weakref
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from simlib import _validate as check
from simlib.signals import held

PREFIX = "simlib_"
_LIVE: "weakref.WeakValueDictionary[str, SharedArray]" = weakref.WeakValueDictionary()


def _new_name() -> str:
    """A short unique segment name: simlib_<pid>_<random hex> (macOS allows 31 characters)."""
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"


class _Segment(shared_memory.SharedMemory):
    """A SharedMemory whose close() never unmaps while ndarray views may still point into it."""

    def close(self) -> None:
        """Close the file descriptor only; the mapping goes when its last view is collected."""
        # NOTE: SharedMemory.close() unmaps even if a NumPy array still reads the memory (NumPy
        # does not hold the buffer export), and touching that array then segfaults.
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            os.close(fd)
            self._fd = -1


def _open_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach without registering with the resource tracker: only the owner's registration counts."""
    if sys.version_info >= (3, 13):
        return _Segment(name=name, create=False, track=False)
    # NOTE: before 3.13 attaching also registered the segment, so a late attach could make the
    # tracker report (and re-unlink) a segment the owner had already released.
    tracker = shared_memory.resource_tracker
    register = tracker.register
    tracker.register = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        return _Segment(name=name, create=False)
    finally:
        tracker.register = register  # type: ignore[assignment]


def _release(shm: shared_memory.SharedMemory, owner_pid: int) -> None:
    """Unlink (in the owner process only) and close the descriptor; safe to call twice."""
    if os.getpid() == owner_pid:
        # held: unlink and the resource tracker's unregister go together; already gone: unlink is idempotent here
        with held(), contextlib.suppress(FileNotFoundError):
            shm.unlink()
    shm.close()


class SharedArray:
    """An ndarray backed by a named shared-memory segment; ``.array`` is the view."""

    def __init__(self, shm: shared_memory.SharedMemory, shape: tuple[int, ...], dtype: np.dtype, owner: bool):
        self._shm = shm
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.owner = owner
        self._owner_pid = os.getpid() if owner else -1
        self.array: np.ndarray = np.ndarray(self.shape, dtype=self.dtype, buffer=shm.buf)
        self._finalizer = weakref.finalize(self, _release, shm, self._owner_pid)
        if owner:
            _LIVE[shm.name] = self

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def zeros(cls, shape: int | tuple[int, ...], dtype: Any = np.float64) -> "SharedArray":
        """A new zero-filled shared array owned by the calling process."""
        shape_t = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        for i, s in enumerate(shape_t):
            check.non_negative_int(f"shape[{i}]", s)
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError(f"dtype must be a plain numeric dtype, got {dt}")
        nbytes = max(int(np.prod(shape_t, dtype=np.int64)) * dt.itemsize, 1)  # size 0 is not allowed by the OS
        with held():  # a Ctrl-C between creating the segment and owning it would leak it until exit
            shm = _Segment(name=_new_name(), create=True, size=nbytes)
            out = cls(shm, shape_t, dt, owner=True)
        out.array.fill(0)
        return out

    @classmethod
    def copy_of(cls, a: np.ndarray) -> "SharedArray":
        """A new shared array holding a copy of ``a`` (same shape and dtype)."""
        a = np.asarray(a)
        out = cls.zeros(a.shape, a.dtype)
        out.array[...] = a
        return out

    @classmethod
    def attach(cls, name: str, shape: tuple[int, ...], dtype: Any) -> "SharedArray":
        """Map an existing segment by name (a non-owner: it will never unlink)."""
        try:
            shm = _open_untracked(name)
        except FileNotFoundError:
            raise ValueError(f"no shared segment named {name!r} (was it already unlinked?)") from None
        return cls(shm, shape, np.dtype(dtype), owner=False)

    def __reduce__(self) -> tuple[Any, tuple[str, tuple[int, ...], str]]:
        """Pickle as a reference: the receiver attaches by name."""
        return (SharedArray.attach, (self.name, self.shape, self.dtype.str))

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The segment's name (``/dev/shm/<name>`` on Linux)."""
        return self._shm.name

    @property
    def nbytes(self) -> int:
        """Bytes of array data."""
        return int(self.array.nbytes)

    @property
    def closed(self) -> bool:
        """True once released in this process."""
        return not self._finalizer.alive

    def unlink(self) -> None:
        """Release the segment: the owner unlinks its name (once); memory goes with the last view."""
        with held():  # the finalizer marks itself done before it unlinks: no Ctrl-C in between
            self._finalizer()

    close = unlink

    def __enter__(self) -> "SharedArray":
        return self

    def __exit__(self, *exc: object) -> None:
        self.unlink()

    def __repr__(self) -> str:
        role = "owner" if self.owner else "attached"
        return f"SharedArray(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, {role})"


def live_segments() -> list[str]:
    """Names of segments this process owns and has not yet unlinked."""
    return [name for name, a in list(_LIVE.items()) if not a.closed and a._owner_pid == os.getpid()]


def unlink_all() -> int:
    """Unlink every segment this process still owns; returns how many were released."""
    arrays = [a for a in list(_LIVE.values()) if not a.closed and a._owner_pid == os.getpid()]
    for a in arrays:
        a.unlink()
    return len(arrays)
