"""Worker logging: one format naming the worker, quiet by default, under fork and spawn."""
from __future__ import annotations

import io
import multiprocessing
import sys
import time

import pytest

from simlib.parallel import run_workers
from simlib.parallel import log as plog

METHODS = ["fork", "spawn"]


def log_lines(worker_id: int, n_workers: int) -> None:
    """Emit one line at INFO and one at WARNING."""
    plog.logger().info("info from %d", worker_id)
    plog.logger().warning("warning from %d", worker_id)


@pytest.mark.parametrize("method", METHODS)
def test_logging_is_quiet_by_default_and_names_the_worker(method: str) -> None:
    sink = io.StringIO()
    handler = plog.parent_handler(multiprocessing.get_context(method))
    old = handler.sub_handler.setStream(sink)
    try:
        run_workers(log_lines, 2, start_method=method)
        _wait_for(lambda: sink.getvalue().count("warning from") == 2)
        quiet = sink.getvalue()
        run_workers(log_lines, 2, start_method=method, verbose=True)
        _wait_for(lambda: sink.getvalue().count("info from") == 2)
    finally:
        handler.sub_handler.setStream(old)
        plog.set_verbose(False)
    assert "info from" not in quiet
    assert "worker-1 WARNING simlib.parallel: warning from 1" in quiet
    assert "worker-0 INFO simlib.parallel: info from 0" in sink.getvalue()


def _wait_for(cond, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)



def test_worker_lines_go_to_the_stderr_of_the_moment(monkeypatch) -> None:
    """The parent's handler is made once per process; a program (or pytest) that replaces sys.stderr afterwards, and
    closes the old one, still gets the workers' lines, and no 'I/O operation on closed file'."""
    plog.parent_handler(multiprocessing.get_context("fork"))
    sink = io.StringIO()
    monkeypatch.setattr(sys, "stderr", sink)
    run_workers(log_lines, 1, start_method="fork")
    _wait_for(lambda: "warning from 0" in sink.getvalue())
    assert "worker-0 WARNING simlib.parallel: warning from 0" in sink.getvalue()
