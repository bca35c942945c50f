"""Hold SIGINT and SIGTERM back around the few steps that must not be cut in half.

Starting a worker (``os.fork`` runs Python hooks) and creating a shared segment and taking
ownership of it are such steps: a KeyboardInterrupt in the middle of either leaves a lock held or
a segment no one will unlink until the interpreter exits. Inside :func:`held` the two signals are
only noted; when the block ends they are raised again, so Ctrl-C still arrives, a moment later::

    >>> with held():
    ...     pass

Python code cannot restore two handlers atomically: a Ctrl-C that lands once SIGINT's handler is
back raises before SIGTERM's is (``signal.signal`` runs pending handlers before it installs the
new one). So the note handler knows when no block is open: a signal that reaches a handler left
behind that way puts the real handler back and is delivered to it, never lost.

Inside :func:`guard_forks` the signals are raised at once, except while this process runs its
fork hooks (``os.register_at_fork``: ``logging`` releases its locks there, for instance, each
time a library starts a program with ``preexec_fn``). Python prints an exception raised in a
hook as "Exception ignored" and drops it, so a Ctrl-C that lands there would be lost; the guard
notes it and sends it again as soon as the fork is over::

    >>> with guard_forks():
    ...     pass
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
noted: list[tuple[int, int]] = []  # (pid, signal) noted inside a held block; a forked child notes its own too
_open = 0  # held blocks open in this process
_real: dict[int, Any] = {}  # each signal's handler outside every held block
_guards = 0  # guard_forks blocks open in this process
_forking = 0  # fork hooks running in this process (between its 'before' and 'after' hooks)
_hooked = False  # guard_forks's fork hooks registered
_kept: dict[int, Any] = {}  # handlers installed (install) inside guard_forks: in place once the guard ends


def _note(signum: int, frame: Any) -> None:
    """Note a signal for later; outside every block, hand it to the real handler."""
    if _open > 0 or (_guards > 0 and _forking > 0):
        noted.append((os.getpid(), signum))
        return
    real = _real.get(signum, signal.SIG_DFL)
    if _guards > 0 and real is signal.SIG_IGN:
        return
    if _guards > 0 and callable(real):  # the guard stays in place; the real handler acts now
        real(signum, frame)
        return
    signal.signal(signum, real)
    signal.raise_signal(signum)


def handler(signum: int) -> Any:
    """``signum``'s handler as it acts outside held blocks (what ``signal.getsignal`` would say)."""
    h = signal.getsignal(signum)
    return _real.get(signum, signal.SIG_DFL) if h is _note and _open == 0 else h


@contextmanager
def held() -> Iterator[None]:
    """Run the block with SIGINT / SIGTERM noted, then raise the noted ones again (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread runs Python signal handlers or may change them
        return
    global _open
    mark = len(noted)
    outermost = _open == 0
    previous: dict[int, Any] = {}
    _open += 1
    try:
        for s in SIGNALS:
            h = signal.getsignal(s)
            if h is None:  # set outside Python: leave it
                continue
            if outermost:
                _real[s] = _real.get(s, signal.SIG_DFL) if h is _note else h
            previous[s] = h  # before the change, so that the clean-up restores it whatever comes next
            signal.signal(s, _note)
        yield
    finally:
        caught: list[int] = []
        try:
            _open -= 1  # from here on a signal may raise (see the module's docstring)
            for s, h in previous.items():
                signal.signal(s, h)
            caught = sorted({signum for pid, signum in noted[mark:] if pid == os.getpid()})
        finally:
            del noted[mark:]  # never left for a later block (or a forked child) to find
        for s in caught:
            signal.raise_signal(s)


def _before_fork() -> None:
    global _forking
    _forking += 1


def _after_fork_in_parent() -> None:
    """The fork is over: send again what was noted during its hooks (held blocks send their own)."""
    global _forking
    _forking -= 1
    if _forking or _open:
        return
    pid = os.getpid()
    again = sorted({signum for p, signum in noted if p == pid})
    noted[:] = [n for n in noted if n[0] != pid]
    for signum in again:  # from a thread, a moment later: raised in this hook, it would be dropped again
        threading.Timer(0.005, os.kill, (pid, signum)).start()


def _after_fork_in_child() -> None:
    global _forking
    _forking = 0


@contextmanager
def guard_forks() -> Iterator[None]:
    """Run the block with SIGINT / SIGTERM raised at once, but never inside a fork hook (main thread only).

    A handler the block's code installs (Ray's SIGTERM handler, for one) is left in place at the
    end; only the guard's own is replaced by what was there before.
    """
    global _guards, _hooked
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _hooked:  # registered late, so that it runs around the hooks of every module loaded so far
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_after_fork_in_child)
        _hooked = True
    previous: dict[int, Any] = {}
    _guards += 1
    try:
        for s in SIGNALS:
            h = signal.getsignal(s)
            if h is None or h is _note:  # set outside Python, or already guarded or held: leave it
                continue
            _real[s] = previous[s] = h
            signal.signal(s, _note)
        yield
    finally:
        _guards -= 1
        for s, h in previous.items():
            if signal.getsignal(s) is _note:
                signal.signal(s, _kept.pop(s, h))


def install(signum: int, h: Callable[[int, Any], Any]) -> None:
    """Make ``h`` ``signum``'s handler. Inside :func:`guard_forks` it is put behind the guard (a signal that lands
    in a fork hook still waits for the fork to end) and stays in place when the guard ends."""
    if _guards > 0 and signal.getsignal(signum) is _note:
        _real[signum] = _kept[signum] = h
    else:
        signal.signal(signum, h)


def forked() -> None:
    """In a child forked inside a held block: no block is open here (the child never leaves the parent's)."""
    global _open, _guards
    _open = _guards = 0
    _real.clear()


_compiler_hold: Any = None  # the numba listener hold_while_compiling registered, once per process


def hold_while_compiling() -> None:
    """From now on, hold SIGINT / SIGTERM back (as :func:`held` does) while numba holds its compiler lock.

    A Ctrl-C that landed inside numba's compiler (a first call compiles for seconds) left numba broken for the rest
    of the process: in one run 26 of 30 later compiles failed with KeyError, a notebook's kernel until restarted."""
    global _compiler_hold
    if _compiler_hold is not None:
        return
    from numba.core import event

    class Hold(event.Listener):
        blocks: list[Any] = []  # the held() blocks open, one per nested acquisition (main thread only)

        def on_start(self, ev: Any) -> None:
            if threading.current_thread() is threading.main_thread():
                block = held()
                block.__enter__()
                self.blocks.append(block)

        def on_end(self, ev: Any) -> None:
            if threading.current_thread() is threading.main_thread() and self.blocks:
                self.blocks.pop().__exit__(None, None, None)  # a noted Ctrl-C is raised here, the lock released

    _compiler_hold = Hold()
    event.register("numba:compiler_lock", _compiler_hold)


@contextmanager
def ctrl_c_unwrapped() -> Iterator[None]:
    """Let a Ctrl-C out as the KeyboardInterrupt it is.

    A compiled (numba) function that returns an array, interrupted as it returns, hands back a
    ``SystemError("... returned a result with an exception set")`` caused by the KeyboardInterrupt
    (296 of 300 Ctrl-Cs timed to land in a loop of such calls)::

        >>> with ctrl_c_unwrapped():
        ...     pass
    """
    try:
        yield
    except SystemError as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):
            raise exc.__cause__ from None
        raise


def watch(pid: int) -> Callable[[float | None], bool]:
    """``ended(timeout)``: whether process ``pid`` has ended, waiting up to ``timeout`` s (None: until it has).

    A pidfd reads as ready once its process has ended (a zombie included), so no polling of /proc is needed; a
    process already gone when watched has ended. The watchdogs of shm workers and of a local Ray use it.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return lambda timeout=None: True
    return lambda timeout=None: bool(wait([fd], timeout))
