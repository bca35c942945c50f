"""Hold SIGINT and SIGTERM back around the few steps that must not be cut in half.

Starting a worker (``os.fork`` runs Python hooks) and creating a shared segment and taking
ownership of it are such steps: a KeyboardInterrupt in the middle of either leaves a lock held or
a segment no one will unlink until the interpreter exits. Inside :func:`held` the two signals are
only noted; when the block ends they are raised again, so Ctrl-C still arrives, a moment later::

    >>> with held():
    ...     pass
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
noted: list[tuple[int, int]] = []  # (pid, signal) noted inside a held block; a forked child notes its own too


def _note(signum: int, frame: Any) -> None:
    """Note a signal for later instead of acting on it."""
    noted.append((os.getpid(), signum))


@contextmanager
def held() -> Iterator[None]:
    """Run the block with SIGINT / SIGTERM noted, then raise the noted ones again (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread runs Python signal handlers or may change them
        return
    mark = len(noted)
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    previous = {s: h for s, h in previous.items() if h is not None}  # None: set outside Python, leave it
    for s in previous:
        signal.signal(s, _note)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        caught = sorted({signum for pid, signum in noted[mark:] if pid == os.getpid()})
        del noted[mark:]
        for s in caught:
            signal.raise_signal(s)


def noted_here(signum: int) -> bool:
    """Whether this process noted ``signum`` in a held block (a forked child checks this at start)."""
    return (os.getpid(), signum) in noted
