"""Behaviour of simlib.viz.plots on small synthetic traces (Agg backend, no display)."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.colors import to_hex

from simlib.trace import Trace
from simlib.viz.plots import timeline_artists
from simlib.viz import (
    KIND_COLORS,
    barrier_times,
    compare_figure,
    default_target,
    finding,
    plot_loss,
    plot_speedup,
    plot_timeline,
    speedups,
    style,
)


def bar_count(artist) -> int:
    """Number of bars in a span artist drawn by plot_timeline (one MOVETO per bar of its compound path)."""
    from matplotlib.path import Path

    return int(np.count_nonzero(artist.get_path().codes == Path.MOVETO))


def bsp_trace(n_workers: int = 4, steps: int = 5, slow: float = 2.0, label: str = "BSP",
              substrate: str = "sim", loss_rate: float = 1.0) -> Trace:
    """BSP by hand: worker 0 computes ``slow`` s, others 1 s; push 0.1 s; barrier; pull 0.1 s."""
    tr = Trace(label=label, substrate=substrate, n_workers=n_workers, meta={"config": {"protocol": "bsp"}})
    t = 0.0
    for k in range(steps):
        comp = [slow if w == 0 else 1.0 for w in range(n_workers)]
        barrier = t + max(comp) + 0.1
        for w in range(n_workers):
            tr.span(w, "compute", t, t + comp[w], step=k)
            tr.span(w, "send", t + comp[w], t + comp[w] + 0.1, nbytes=400, step=k)
            tr.span(w, "wait", t + comp[w] + 0.1, barrier, step=k)
            tr.span(w, "recv", barrier, barrier + 0.1, nbytes=400, step=k)
            tr.update(t + comp[w] + 0.1, w, k, staleness=0)
        t = barrier + 0.1
        tr.record_quality(t, (k + 1) * n_workers, math.exp(-loss_rate * (k + 1)))
    return tr


def curve_trace(label: str, times: list[float], values: list[float], substrate: str = "sim",
                protocol: str = "ssp") -> Trace:
    """A trace with only a quality curve (one step per point)."""
    tr = Trace(label=label, substrate=substrate, n_workers=1, meta={"config": {"protocol": protocol}})
    for i, (t, v) in enumerate(zip(times, values)):
        tr.record_quality(t, i + 1, v)
    return tr


def _spans_drawn(ax, kind: str):
    return timeline_artists(ax).get(f"span:{kind}")


def _bar_vertices(artist) -> np.ndarray:
    """(n, 5, 2): the corners of each bar (closed)."""
    return artist.get_path().vertices.reshape(-1, 5, 2)


def test_timeline_draws_one_bar_per_span_coloured_by_kind():
    tr = bsp_trace(n_workers=4, steps=5)
    ax = plot_timeline(tr)
    for kind in ("compute", "send", "recv", "wait"):
        expected = sum(1 for s in tr.spans if s.kind == kind)
        coll = _spans_drawn(ax, kind)
        assert coll is not None and bar_count(coll) == expected, kind
        assert to_hex(coll.get_facecolor()) == KIND_COLORS[kind].lower()
    assert len({KIND_COLORS[k] for k in KIND_COLORS}) == len(KIND_COLORS)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("wait" in t for t in legend) and any("compute" in t for t in legend)
    # The bars sit on the worker's row: worker 2's compute bar spans y in [1.6, 2.4].
    verts = _bar_vertices(_spans_drawn(ax, "compute"))[2]
    assert verts[:, 1].min() == pytest.approx(1.6) and verts[:, 1].max() == pytest.approx(2.4)


def test_timeline_marks_each_bsp_barrier_and_clips_to_t_max():
    tr = bsp_trace(n_workers=4, steps=5, slow=2.0)
    assert np.allclose(barrier_times(tr), [2.1 + 2.2 * k for k in range(5)])
    ax = plot_timeline(tr, t_max=5.0)
    barriers = timeline_artists(ax)["barriers"]
    assert len(barriers.get_segments()) == 2  # 2.1 and 4.3 lie before 5.0
    spans = timeline_artists(ax, "span:").values()
    assert sum(bar_count(a) for a in spans) == sum(1 for s in tr.spans if s.start < 5.0)
    assert max(_bar_vertices(a)[:, :, 0].max() for a in spans) <= 5.0
    assert ax.get_xlim() == (0.0, 5.0)


def test_timeline_uses_recorded_barriers_and_draws_one_arrow_per_message():
    tr = bsp_trace(n_workers=3, steps=2)
    tr.meta["barriers"] = [0.5]
    ax = plot_timeline(tr)
    barriers = timeline_artists(ax)["barriers"]
    assert [s[0][0] for s in barriers.get_segments()] == [0.5]
    msgs = timeline_artists(ax)["messages"]
    n_messages = sum(1 for s in tr.spans if s.kind in ("send", "recv"))
    assert np.count_nonzero(np.isnan(msgs.get_xdata())) == n_messages  # one NaN ends each arrow
    heads = timeline_artists(ax)["message-heads"]
    arrivals = sorted(s.end for s in tr.spans if s.kind in ("send", "recv"))
    assert sorted(heads.get_xdata()) == pytest.approx(arrivals)  # a dot where each message lands
    assert "servers" in [t.get_text() for t in ax.get_yticklabels()]
    ax2 = plot_timeline(tr, arrows=False)
    assert "messages" not in timeline_artists(ax2)


def test_timeline_caps_workers_and_says_so():
    tr = bsp_trace(n_workers=40, steps=1)
    ax = plot_timeline(tr, max_workers=8)
    compute = _spans_drawn(ax, "compute")
    assert bar_count(compute) == 8
    assert "8 of 40" in ax.get_ylabel()


@pytest.mark.parametrize("substrate, unit", [("sim", "simulated seconds"), ("processes", "wall seconds")])
def test_axis_units_follow_the_substrate(substrate, unit):
    tr = bsp_trace(substrate=substrate)
    assert unit in plot_timeline(tr).get_xlabel()
    assert unit in plot_loss([tr], x="time").get_xlabel()
    assert "steps" in plot_loss([tr], x="steps").get_xlabel()
    assert "rounds" in plot_loss([tr], x="rounds").get_xlabel()


def _luminance(color: str) -> float:
    """Relative luminance (WCAG): what a grey print keeps of a colour."""
    from matplotlib.colors import to_rgb

    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(color)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_push_pull_compute_and_wait_differ_in_grey_print_and_for_colour_blind_readers():
    from simlib.viz.style import KIND_STYLES, OKABE_ITO

    kinds = ("compute", "send", "recv", "wait")
    assert all(KIND_COLORS[k] in OKABE_ITO.values() for k in kinds)  # the palette made for colour-vision deficiencies
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            hatched = bool(KIND_STYLES[a].get("hatch")) != bool(KIND_STYLES[b].get("hatch"))
            assert hatched or abs(_luminance(KIND_COLORS[a]) - _luminance(KIND_COLORS[b])) > 0.1, (a, b)
    assert _luminance(KIND_COLORS["send"]) - _luminance(KIND_COLORS["recv"]) > 0.3  # push light, pull mid
    ax = plot_timeline(bsp_trace(n_workers=3, steps=4, slow=2.0))
    assert _spans_drawn(ax, "wait").get_hatch() == "///"
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    assert legend["wait"].get_hatch() == "///" and legend["send (push)"].get_hatch() is None


def test_the_figure_counts_rounds_as_the_table_does():
    from simlib.course.experiments import compare, default_cluster, summary_rows

    runs = compare(["bsp", "async"], default_cluster(n_workers=4, steps=30))
    target = 0.6
    rows = {r["run"]: r["rounds_to_target"] for r in summary_rows(runs, target)}
    ax = plot_loss(runs, x="rounds", target=target)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    for run, rounds in rows.items():
        assert rounds is not None and f"{run} (at round {rounds:.4g})" in labels, (rows, labels)


def test_timeline_title_states_the_waiting_fraction():
    tr = bsp_trace(n_workers=4, steps=5, slow=2.0)
    frac = tr.summary()["wait_fraction"]
    assert f"{frac:.0%}" in plot_timeline(tr).get_title()


def test_loss_plot_labels_runs_marks_target_and_time_to_target():
    a = curve_trace("BSP", [1, 2, 3, 4], [0.9, 0.7, 0.5, 0.4], protocol="bsp")
    b = curve_trace("SSP(3)", [1, 2, 3, 4], [0.8, 0.5, 0.3, 0.2])
    ax = plot_loss([a, b], target=0.5)
    target = [ln for ln in ax.lines if ln.get_gid() == "target"]
    assert len(target) == 1 and list(target[0].get_ydata()) == [0.5, 0.5]
    marks = {ln.get_gid(): (ln.get_xdata()[0], ln.get_ydata()[0]) for ln in ax.lines
             if (ln.get_gid() or "").startswith("reached:")}
    assert marks == {"reached:BSP": (3, 0.5), "reached:SSP(3)": (2, 0.5)}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("BSP") and "at 3 s" in t for t in legend)
    assert any(t.startswith("SSP(3)") for t in legend)
    assert "1.5x sooner than BSP" in ax.get_title()


def test_loss_plot_rejects_unknown_axis():
    with pytest.raises(ValueError, match="x"):
        plot_loss([bsp_trace()], x="epochs")


def test_finding_computes_the_ratio_against_bsp():
    bsp = curve_trace("BSP", [1.0, 2.0, 2.8], [0.8, 0.6, 0.45], protocol="bsp")
    ssp = curve_trace("SSP(3)", [1.0, 2.0], [0.7, 0.45])
    asy = curve_trace("async", [1.0, 2.0, 3.0], [0.9, 0.8, 0.7], protocol="async")
    assert finding([bsp, ssp, asy], target=0.45) == "SSP(3) reaches loss 0.45 1.4x sooner than BSP"
    fast_bsp = curve_trace("BSP", [1.0], [0.4], protocol="bsp")
    assert finding([fast_bsp, ssp], target=0.45) == "BSP reaches loss 0.45 first, 2.0x sooner than SSP(3)"
    assert finding([asy, ssp], target=0.45).endswith("async never does")
    same = curve_trace("SSP(1)", [1.0], [0.4])
    assert finding([fast_bsp, same], target=0.45) == "BSP and SSP(1) reach loss 0.45 at the same time"
    also = curve_trace("Async", [1.0], [0.4], protocol="async")
    assert finding([fast_bsp, same, also], target=0.45) == "BSP, SSP(1) and Async reach loss 0.45 at the same time"


def test_default_target_is_reached_by_every_run():
    runs = [bsp_trace(loss_rate=r, label=f"r{r}") for r in (0.3, 1.0, 2.0)]
    target = default_target(runs)
    assert all(t.time_to(target) is not None for t in runs)
    assert target > min(q.value for q in runs[0].quality)


def test_speedup_from_times_and_from_traces_with_ideal_line():
    ax = plot_speedup({"BSP": {1: 8.0, 2: 4.0, 4: 2.5}, "async": {1: 8.0, 4: 2.0}})
    lines = {ln.get_gid(): ln for ln in ax.lines}
    assert list(lines["ideal"].get_xdata()) == [1, 2, 4] and list(lines["ideal"].get_ydata()) == [1, 2, 4]
    assert list(lines["speedup:BSP"].get_ydata()) == pytest.approx([1.0, 2.0, 3.2])
    assert "4.0x on 4 workers" in ax.get_title()
    traces = [bsp_trace(n_workers=n, steps=3, slow=1.0) for n in (2, 4)]
    s = speedups({tr.n_workers: tr.makespan / tr.summary()["updates_applied"] for tr in traces})
    ax2 = plot_speedup({"BSP": traces})
    assert list(ax2.lines[1].get_ydata()) == pytest.approx([s[2], s[4]])
    assert s[4] == pytest.approx(4.0)  # equal compute, so twice the workers give twice the updates per second
    assert ax2.get_xlabel() == "workers" and "speed-up" in ax2.get_ylabel()


def test_compare_figure_has_a_timeline_per_run_and_states_the_finding():
    bsp = bsp_trace(label="BSP", slow=3.0, loss_rate=1.0)
    ssp = bsp_trace(label="SSP(3)", slow=1.0, loss_rate=1.0)
    ssp.meta["config"] = {"protocol": "ssp"}
    fig = compare_figure([bsp, ssp], target=0.1)
    expected = bsp.time_to(0.1) / ssp.time_to(0.1)
    assert fig.get_suptitle() == f"SSP(3) reaches loss 0.1 {expected:.1f}x sooner than BSP"
    timelines = [ax for ax in fig.axes if timeline_artists(ax, "span:")]
    assert len(timelines) == 2
    assert any(ax.get_xlabel() == "rounds (one step of every worker)" for ax in fig.axes)
    fig.canvas.draw()  # the whole figure renders


def test_style_is_projector_sized_and_colour_blind_safe():
    import matplotlib as mpl

    with style():
        assert mpl.rcParams["font.size"] >= 14
        assert min(mpl.rcParams["xtick.labelsize"], mpl.rcParams["legend.fontsize"]) >= 14
        colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
        assert colors[:3] == ["#0072B2", "#E69F00", "#009E73"]
    ax = plot_timeline(bsp_trace())
    assert ax.xaxis.label.get_fontsize() >= 14 and ax.title.get_fontsize() >= 14
