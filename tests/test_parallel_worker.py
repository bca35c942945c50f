"""WorkerContext: cheap local records relative to the run's start, shipped to the parent's trace."""
from __future__ import annotations

import time

import pytest

from simlib.parallel import current, run_workers
from simlib.parallel.worker import WorkerContext, record_span


def report_context(worker_id: int, n_workers: int) -> tuple[int, int, float]:
    """What a worker sees of itself."""
    ctx = current()
    assert ctx is not None
    return ctx.worker_id, ctx.n_workers, ctx.now()


def test_times_are_relative_to_the_run_start() -> None:
    t0 = time.perf_counter()
    ctx = WorkerContext(worker_id=1, n_workers=2, t0=t0)
    ctx.span("send", t0 + 0.5, t0 + 0.75, nbytes=64, step=3)
    with ctx.timed("compute", step=4):
        time.sleep(0.01)
    ctx.update(4, staleness=2)
    ctx.record_quality(5, 0.25)
    spans, updates, quality = ctx.records()
    assert spans[0] == ("send", pytest.approx(0.5), pytest.approx(0.75), 64, 3)
    kind, start, end, nbytes, step = spans[1]
    assert (kind, nbytes, step) == ("compute", 0, 4) and end - start >= 0.009
    assert updates[0][1:] == (4, 2, True, -1) and updates[0][0] >= end
    assert quality[0][1:] == (5, 0.25)


def test_unknown_span_kind_is_a_value_error() -> None:
    ctx = WorkerContext(0, 1, time.perf_counter())
    with pytest.raises(ValueError, match="span kind"):
        ctx.span("think", 0.0, 1.0)


def test_outside_a_worker_there_is_no_context_and_spans_are_dropped() -> None:
    assert current() is None
    record_span("compute", 0.0, 1.0)  # must not raise and must not create a context
    assert current() is None


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_each_worker_knows_its_id_and_the_clock_started_before_it(method: str) -> None:
    results, trace = run_workers(report_context, 3, start_method=method)
    assert [r[:2] for r in results] == [(0, 3), (1, 3), (2, 3)]
    assert all(0.0 < r[2] < 30.0 for r in results)  # seconds since the parent started the run
