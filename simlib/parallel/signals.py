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
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
noted: list[tuple[int, int]] = []  # (pid, signal) noted inside a held block; a forked child notes its own too
_open = 0  # held blocks open in this process
_real: dict[int, Any] = {}  # each signal's handler outside every held block


def _note(signum: int, frame: Any) -> None:
    """Note a signal for later; outside every block, hand it to the real handler."""
    if _open > 0:
        noted.append((os.getpid(), signum))
        return
    signal.signal(signum, _real.get(signum, signal.SIG_DFL))
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


def forked() -> None:
    """In a child forked inside a held block: no block is open here (the child never leaves the parent's)."""
    global _open
    _open = 0
    _real.clear()


def noted_here(signum: int) -> bool:
    """Whether this process noted ``signum`` in a held block (a forked child checks this at start)."""
    return (os.getpid(), signum) in noted
