"""Logging from worker processes: one format, the worker's name in every line, quiet by default.

Records from every process go through one ``multiprocessing-logging`` handler in the parent: its
queue carries them from the workers and its thread writes them, so lines from different
processes never interleave mid-line. Workers name themselves ``worker-<id>``, which the format
prints. Level is WARNING unless a run asks for ``verbose=True`` (INFO).
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import threading
from multiprocessing.context import BaseContext
from typing import Any

from multiprocessing_logging import MultiProcessingHandler

LOGGER_NAME = "simlib.parallel"
LOG_FORMAT = "%(asctime)s %(processName)s %(levelname)s %(name)s: %(message)s"

_handlers: dict[tuple[int, str], "_ContextHandler"] = {}


class _Stderr(logging.StreamHandler):
    """A handler to ``sys.stderr`` as it is when a record comes (a notebook, the CLI or pytest may have replaced it
    since the handler was made, and closed the one it had then), or to a stream given by ``setStream``."""

    _chosen: Any = None

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr if self._chosen is None else self._chosen

    @stream.setter
    def stream(self, value: Any) -> None:
        self._chosen = None if value is sys.stderr else value


class _ContextHandler(MultiProcessingHandler):
    """A MultiProcessingHandler to stderr in LOG_FORMAT, whose queue belongs to a chosen start-method context.

    The package's own handler makes its queue from the default context, which a ``spawn`` child
    on Linux cannot receive; this builds the same parts with the group's context instead.
    """

    def __init__(self, name: str, ctx: BaseContext):
        logging.Handler.__init__(self)
        self.sub_handler = _Stderr()
        self.setFormatter(logging.Formatter(LOG_FORMAT))  # the sub-handler's too
        self.queue = ctx.Queue(-1)
        self._is_closed = False
        self._receive_thread = threading.Thread(target=self._receive, name=name, daemon=True)
        self._receive_thread.start()


def logger() -> logging.Logger:
    """The logger every part of ``simlib.parallel`` writes to."""
    return logging.getLogger(LOGGER_NAME)


def parent_handler(ctx: BaseContext) -> _ContextHandler:
    """The parent's receiving handler for ``ctx`` (made once per process and start method)."""
    key = (os.getpid(), ctx.get_start_method())
    handler = _handlers.get(key)
    if handler is None:
        handler = _handlers[key] = _ContextHandler(f"simlib-log-{key[1]}", ctx)
    _use(handler, instead_of=_ContextHandler)
    return handler


def _use(handler: logging.Handler, instead_of: type = logging.Handler) -> None:
    """Send the logger's records to ``handler`` (and not up to the root logger) instead of its ``instead_of`` ones."""
    log = logger()
    for h in list(log.handlers):
        if isinstance(h, instead_of) and h is not handler:
            log.removeHandler(h)
    if handler not in log.handlers:
        log.addHandler(handler)
    log.propagate = False


def set_verbose(verbose: bool) -> None:
    """INFO when verbose, WARNING otherwise (for the calling process)."""
    logger().setLevel(logging.INFO if verbose else logging.WARNING)


def worker_setup(queue: Any, verbose: bool) -> None:
    """In a worker: send records to the parent's queue (under fork and spawn alike)."""
    _use(logging.handlers.QueueHandler(queue))  # every handler inherited under fork goes: their threads are not here
    set_verbose(verbose)


def worker_flush(queue: Any) -> None:
    """In a worker, before reporting back: detach from the queue and wait until it is written."""
    _use(logging.NullHandler(), instead_of=logging.handlers.QueueHandler)
    queue.close()
    queue.join_thread()  # records still buffered in this process would die with it otherwise
