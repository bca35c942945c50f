"""The trace format: recording, summary arithmetic, persistence, validation."""
import math

import pytest

from simlib.trace import Trace


def _two_worker_trace():
    t = Trace(label="t", substrate="sim", n_workers=2)
    t.span(0, "compute", 0.0, 2.0, step=0)
    t.span(0, "send", 2.0, 3.0, nbytes=100, step=0)
    t.span(1, "compute", 0.0, 1.0, step=0)
    t.span(1, "send", 1.0, 2.0, nbytes=100, step=0)
    t.span(1, "wait", 2.0, 3.0, step=0)
    t.update(3.0, worker=0, step=0, staleness=0)
    t.update(3.0, worker=1, step=0, staleness=2, applied=False)
    t.record_quality(0.0, 0, 1.0)
    t.record_quality(3.0, 1, 0.4)
    return t


def test_summary_arithmetic():
    s = _two_worker_trace().summary()
    assert s["makespan"] == 3.0
    assert s["steps_per_worker"] == 1.0
    assert s["time_per_step"] == 3.0
    assert s["wait_fraction"] == pytest.approx(1.0 / 6.0)
    assert s["bytes_sent"] == 200.0
    assert s["updates_applied"] == 1.0 and s["updates_dropped"] == 1.0
    assert s["max_staleness"] == 2.0 and s["mean_staleness"] == 1.0
    assert s["final_loss"] == 0.4


def test_time_to_target_both_directions():
    t = _two_worker_trace()
    assert t.time_to(0.5) == 3.0
    assert t.steps_to(0.5) == 1
    assert t.time_to(0.1) is None
    t.lower_is_better = False
    assert t.time_to(0.9) == 0.0


def test_zero_length_spans_are_dropped_and_kinds_checked():
    t = Trace(label="t", substrate="sim", n_workers=1)
    t.span(0, "compute", 1.0, 1.0)
    assert t.spans == []
    with pytest.raises(ValueError, match="span kind"):
        t.span(0, "nap", 0.0, 1.0)


def test_roundtrip_json(tmp_path):
    t = _two_worker_trace()
    t.meta["protocol"] = "bsp"
    path = tmp_path / "trace.json"
    t.save(str(path))
    assert Trace.load(str(path)) == t


def test_empty_trace_summary_is_defined():
    s = Trace(label="e", substrate="sim", n_workers=3).summary()
    assert s["makespan"] == 0.0 and math.isnan(s["time_per_step"]) and s["wait_fraction"] == 0.0


def test_network_load_spreads_each_transfer_over_its_time_and_keeps_every_byte():
    import numpy as np

    t = Trace(label="load", substrate="sim", n_workers=2)
    t.span(0, "compute", 0.0, 1.0)
    t.span(0, "send", 1.0, 1.5, nbytes=1000)    # bins 8..11 of 32 (each 0.125 s)
    t.span(1, "recv", 1.25, 1.375, nbytes=500)  # bin 10
    t.span(1, "compute", 1.5, 4.0)
    starts, load = t.network_load(bins=32)
    width = t.makespan / 32
    assert starts[1] == pytest.approx(width) and load.sum() * width == pytest.approx(1500)
    assert np.count_nonzero(load) == 4 and load[:8].sum() == 0 and load[12:].sum() == 0
    assert load[10] == pytest.approx(load[8] + 500 / width)  # the recv lands on top of the send
    with pytest.raises(ValueError, match="bins"):
        t.network_load(bins=0)


def test_column_logs_read_as_the_lists_they_replace(tmp_path):
    import pickle

    from simlib.trace import Span, SpanLog, Update, UpdateLog

    rows = [Span(0, "compute", 0.0, 0.5, 0, 0), Span(1, "send", 0.25, 1.0, 4096, 0), Span(0, "wait", 0.5, 2.0, 0, 1)]
    log = SpanLog(rows)
    assert list(log) == rows and log == rows and rows == log and len(log) == 3
    assert log[1] == rows[1] and log[-1] == rows[-1] and log[1:] == rows[1:]
    assert pickle.loads(pickle.dumps(log)) == log
    log.add(2, 2, 1.0, 1.0)  # empty: dropped, as Trace.span drops it
    assert len(log) == 3
    with pytest.raises(ValueError, match="span kind"):
        log.append((0, "nap", 0.0, 1.0, 0, 0))
    ups = UpdateLog([Update(1.0, 0, 0, 2, False, 1)])
    assert list(ups) == [Update(1.0, 0, 0, 2, False, 1)] and list(ups)[0].applied is False
    t = Trace(label="x", substrate="sim", n_workers=2, spans=log, updates=ups)
    t.save(str(tmp_path / "t.json"))
    back = Trace.load(str(tmp_path / "t.json"))
    assert back == t and back.summary() == t.summary()


def test_a_log_still_grows_after_its_summary_and_the_summary_counts_the_new_records() -> None:
    """summary() reads the columns through views: they must be gone by the time the run records again."""
    from simlib.trace import SpanLog, UpdateLog

    t = Trace("x", "sim", 1)
    t.spans, t.updates = SpanLog(), UpdateLog()
    t.spans.add(0, 0, 0.0, 1.0)
    t.updates.append((1.0, 0, 0, 0, True, 0))
    assert t.summary()["compute_fraction"] == 1.0
    t.spans.add(0, 3, 1.0, 3.0)  # a wait: would raise BufferError if a view of the column were still alive
    t.updates.append((3.0, 0, 1, 2, True, 0))
    s = t.summary()
    assert s["wait_fraction"] == 2.0 / 3.0 and s["mean_staleness"] == 1.0 and s["makespan"] == 3.0
