"""simlib.viz.lesson_plots draws what it is given, titled, in the projector style."""
import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.colors import to_hex

from simlib.trace import Trace
from simlib.viz import (OKABE_ITO, plot_bars, plot_curves, plot_gantt, plot_link_load, plot_staleness,
                        plot_traces_side_by_side, schedule_rows)
from simlib.viz.style import MIN_FONT_PT


def test_plot_curves_draws_each_series_with_the_palette() -> None:
    ax = plot_curves([1, 2, 4], {"a": [1, 2, 3], "b": [3, 2, 1]}, "workers", "speed-up (x)", "a wins at 4",
                     vline=3, logx=True)
    lines = {l.get_gid(): l for l in ax.get_lines()}
    assert to_hex(lines["curve:a"].get_color()) == OKABE_ITO["blue"].lower()
    assert list(lines["curve:b"].get_ydata()) == [3, 2, 1]
    assert "vline" in lines and ax.get_xscale() == "log"
    assert ax.get_title() == "a wins at 4" and ax.get_xlabel() == "workers"
    assert ax.title.get_fontsize() >= MIN_FONT_PT


def test_plot_curves_rejects_mismatch_and_missing_title() -> None:
    with pytest.raises(ValueError, match="series"):
        plot_curves([1, 2], {"a": [1]}, "x", "y", "t")
    with pytest.raises(ValueError, match="title"):
        plot_curves([1], {"a": [1]}, "x", "y", "")
    with pytest.raises(ValueError, match="logz: not an option of plot_curves; did you mean 'logy'"):
        plot_curves([1], {"a": [1]}, "x", "y", "t", logz=True)


def test_plot_curves_shades_a_spread_and_dashes_a_reference() -> None:
    ax = plot_curves([1, 2, 4], {"measured": [1, 1.9, 4.2], "ideal": [1, 2, 4]}, "P", "speed-up (x)", "close to ideal",
                     spread={"measured": ([0.9, 1.7, 3.6], [1.1, 2.2, 4.9])}, dashed=["ideal"])
    band = [c for c in ax.collections if c.get_gid() == "spread:measured"]
    assert len(band) == 1
    ys = band[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.9) and ys.max() == pytest.approx(4.9)
    lines = {l.get_gid(): l for l in ax.get_lines()}
    assert lines["curve:ideal"].get_linestyle() == "--" and lines["curve:measured"].get_linestyle() == "-"
    with pytest.raises(ValueError, match="spread"):
        plot_curves([1, 2], {"a": [1, 2]}, "x", "y", "t", spread={"a": ([1], [2])})
    with pytest.raises(ValueError, match="do not exist"):
        plot_curves([1, 2], {"a": [1, 2]}, "x", "y", "t", dashed=["b"])


def test_plot_bars_writes_values_and_highlights() -> None:
    ax = plot_bars({"1 server": 3.0, "4 shards": 1.0, "never": float("nan")}, "time (ms)", "4 shards: 3x",
                   highlight="4 shards")
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["3", "1", "never"]
    colors = [to_hex(p.get_facecolor()) for p in ax.patches]
    assert colors[1] == OKABE_ITO["vermillion"].lower() and colors[0] == OKABE_ITO["blue"].lower()
    zoomed = plot_bars({"a": 0.44, "b": 0.42}, "loss (axis from 0.4)", "b is lower", ylim=(0.4, 0.45))
    assert zoomed.get_ylim() == (0.4, 0.45)


def test_schedule_rows_and_gantt_mark_idle_slots() -> None:
    grid = np.array([[0, 1, -1], [-1, 0, 1]])
    rows = schedule_rows(grid, slot=2.0, item="mb")
    assert rows["stage 0"] == [(0.0, 2.0, "mb0"), (2.0, 4.0, "mb1"), (4.0, 6.0, "idle")]
    ax = plot_gantt(rows, "time (ms)", "bubble 1/3")
    assert sum(1 for p in ax.patches if p.get_gid() == "idle") == 2
    assert sum(1 for p in ax.patches if p.get_gid() == "op:mb0") == 2
    with pytest.raises(ValueError, match="grid"):
        schedule_rows(np.zeros(3))


def test_traces_side_by_side_has_a_timeline_and_a_loss_per_trace() -> None:
    traces = []
    for sub in ("sim", "pipes"):
        t = Trace(label="BSP", substrate=sub, n_workers=2)
        for w in range(2):
            t.span(w, "compute", 0.0, 1.0, step=0)
        t.record_quality(0.0, 0, 0.7)
        t.record_quality(1.0, 2, 0.6)
        traces.append(t)
    fig = plot_traces_side_by_side(traces, suptitle="same loss")
    axes = fig.get_axes()
    assert len([a for a in axes if a.get_xlabel()]) >= 4
    assert "wall seconds" in axes[1].get_xlabel() or "wall seconds" in axes[3].get_xlabel()
    with pytest.raises(ValueError, match="titles"):
        plot_traces_side_by_side(traces, titles=["one"])


def _pushes(label: str, taus: list[int]) -> Trace:
    t = Trace(label=label, substrate="sim", n_workers=1)
    for k, tau in enumerate(taus):
        t.update(float(k), worker=0, step=k, staleness=tau, clock_lag=min(tau, 2))
    return t


def test_plot_staleness_draws_each_runs_shares_and_mean() -> None:
    ax = plot_staleness([_pushes("lazy", [0, 4, 4, 8]), _pushes("eager", [1, 1, 2, 0])], "eager reads are fresher")
    lines = {l.get_gid(): l for l in ax.get_lines()}
    assert list(lines["staleness:lazy"].get_ydata()) == [0.25, 0, 0, 0, 0.5, 0, 0, 0, 0.25]
    assert list(lines["staleness:eager"].get_ydata())[:3] == [0.25, 0.5, 0.25]
    assert lines["mean:lazy"].get_xdata()[0] == pytest.approx(4.0) and lines["mean:eager"].get_xdata()[0] == 1.0
    assert "mean 4.0" in ax.get_legend().get_texts()[0].get_text() and ax.get_ylabel() == "share of pushes"
    lag = plot_staleness([_pushes("lazy", [0, 4, 4, 8])], "lags", field="clock_lag")
    assert list({l.get_gid(): l for l in lag.get_lines()}["staleness:lazy"].get_ydata()) == [0.25, 0, 0.75]
    assert lag.get_xlabel().startswith("clock lag")


def test_plot_staleness_refuses_empty_runs_and_unknown_fields() -> None:
    with pytest.raises(ValueError, match="field"):
        plot_staleness([_pushes("a", [1])], "t", field="tau")
    with pytest.raises(ValueError, match="at least one update"):
        plot_staleness([Trace(label="empty", substrate="sim", n_workers=1)], "t")
    with pytest.raises(ValueError, match="title"):
        plot_staleness([_pushes("a", [1])], "")


def test_plot_link_load_draws_a_panel_per_trace_with_the_budget() -> None:
    bursts, steady = Trace("bursts", "sim", 2), Trace("steady", "sim", 2)
    bursts.span(0, "send", 0.0, 0.001, nbytes=4000)
    bursts.span(1, "send", 0.009, 0.010, nbytes=4000)
    for k in range(10):
        steady.span(k % 2, "send", k * 0.001, (k + 1) * 0.001, nbytes=800)
    steady.meta["config"] = {"managed_bandwidth": 4e5}
    fig = plot_link_load([bursts, steady], width=0.001, title="steady use")
    top, bottom = fig.axes
    assert "80%" in top.get_title() and "0%" in bottom.get_title()  # bins with nothing sent, over the run
    assert [l.get_gid() for l in bottom.get_lines()] == ["budget"]
    assert bottom.get_lines()[0].get_ydata()[0] == pytest.approx(0.8)  # 2 workers x 0.4 MB/s
    assert not top.get_lines() and fig._suptitle.get_text() == "steady use"
    with pytest.raises(ValueError, match="worker"):
        plot_link_load([bursts], width=0.001, title="t", worker=5)
    with pytest.raises(ValueError, match="title"):
        plot_link_load([bursts], width=0.001, title="")
