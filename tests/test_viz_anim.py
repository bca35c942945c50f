"""The reveal behind play mode and the exported animation (Agg backend)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import re

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from test_viz_plots import bsp_trace

from simlib.viz.anim import draw_runs, export_animation
from simlib.viz.plots import timeline_artists


def _figure() -> Figure:
    fig = Figure(figsize=(12, 7))
    FigureCanvasAgg(fig)
    return fig


def _runs():
    slow = bsp_trace(n_workers=4, steps=5, slow=3.0, label="BSP")
    even = bsp_trace(n_workers=4, steps=5, slow=1.0, label="SSP(3)")
    even.meta["config"] = {"protocol": "ssp"}
    return [slow, even]


def test_draw_runs_puts_one_timeline_per_run_above_the_loss():
    fig = _figure()
    runs = _runs()
    reveal = draw_runs(fig, runs)
    assert len(reveal.timelines) == 2 and reveal.loss_ax is not None
    assert reveal.t_end == max(r.makespan for r in runs)
    assert "sooner than BSP" in fig.get_suptitle()
    # Both timelines share one time axis, so the slower run is visibly longer.
    assert reveal.timelines[0].get_xlim() == reveal.timelines[1].get_xlim() == (0.0, reveal.t_end)


def test_reveal_shows_the_state_at_t_and_counts_waiting_workers():
    fig = _figure()
    runs = _runs()
    reveal = draw_runs(fig, runs)
    # BSP with worker 0 taking 3 s: at t = 2 s workers 1-3 have pushed (1.1 s) and wait for it.
    reveal(2.0)
    assert reveal.waiting_at(0, 2.0) == 3 and reveal.waiting_at(1, 2.0) == 0
    assert "3 of 4 waiting" in reveal._texts[0].get_text()
    assert list(reveal._cursors[0].get_xdata()) == [2.0, 2.0]
    bsp_line = [ln for ln in reveal.loss_ax.lines if ln.get_gid() == "loss:BSP"][0]
    assert len(bsp_line.get_xdata()) == 0  # BSP's first loss point comes at 3.2 s
    spans = timeline_artists(reveal.timelines[0])["span:compute"]
    x0, x1 = spans.get_clip_box().get_points()[:, 0]
    assert x1 == pytest.approx(reveal.timelines[0].transData.transform((2.0, 0))[0])
    reveal(reveal.t_end)
    assert len(bsp_line.get_xdata()) == len(runs[0].quality)
    assert not reveal._cursors[0].get_visible()


def test_the_waiting_count_covers_only_the_rows_drawn():
    reveal = draw_runs(_figure(), _runs(), max_workers=2)  # rows 0 and 1: worker 0 computes, 1 waits
    reveal(2.0)
    assert reveal.waiting_at(0, 2.0) == 1
    assert "1 of 2 waiting" in reveal._texts[0].get_text()


def test_a_window_zooms_and_pans_with_the_cursor():
    fig = _figure()
    reveal = draw_runs(fig, _runs(), window=4.0)
    ax = reveal.timelines[0]
    assert ax.get_xlim() == (0.0, 4.0)
    reveal(8.0)
    lo, hi = ax.get_xlim()
    assert hi - lo == pytest.approx(4.0) and lo < 8.0 < hi
    reveal(reveal.t_end)  # the whole run shows its start again, where every run has spans
    assert ax.get_xlim() == (0.0, 4.0)


@pytest.mark.parametrize("ext", [".html", ".gif"])
def test_export_writes_a_self_contained_animation(tmp_path, ext):
    path = export_animation(_runs(), str(tmp_path / f"anim{ext}"), frames=4, fps=4, dpi=40)
    data = open(path, "rb").read()
    if ext == ".html":
        text = data.decode()
        assert text.count("data:image/png;base64") == 4  # every frame is embedded
        assert "http://" not in text and "https://" not in text  # nothing is fetched: works offline
    else:
        from PIL import Image

        with Image.open(path) as im:
            assert im.n_frames == 4


def test_export_rejects_an_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="extension"):
        export_animation(_runs(), str(tmp_path / "anim.mp4"), frames=2)


def test_redraw_reusing_axes_renders_exactly_like_a_fresh_figure():
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    import simlib
    from simlib.sim import Stragglers, default_problem
    from simlib.viz.anim import draw_runs

    def runs(severity):
        base = dict(n_workers=4, steps=12, stragglers=Stragglers(slow_workers=1, slow_factor=severity))
        return [simlib.run(default_problem(), p, substrate="sim", **base).trace for p in ("bsp", "async")]

    def render(fig):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba()).copy()

    fresh = Figure(figsize=(10, 6), dpi=60)
    draw_runs(fresh, runs(5.0))
    reused = Figure(figsize=(10, 6), dpi=60)
    draw_runs(reused, runs(2.0))
    axes_before = list(reused.axes)
    draw_runs(reused, runs(5.0))
    assert reused.axes == axes_before  # the axes were kept ...
    assert np.array_equal(render(fresh), render(reused))  # ... and the picture is the fresh one
    draw_runs(reused, runs(5.0)[:1])  # a different layout rebuilds
    assert len(reused.axes) == 2 and reused.axes[0] is not axes_before[0]


def _jitter_runs(n_workers: int = 16, steps: int = 30):
    """BSP, SSP(20) and async runs with the live panel's default stragglers (jitter): BSP waits at every barrier."""
    import simlib
    from simlib.sim import Stragglers, default_problem

    base = dict(n_workers=n_workers, steps=steps, stragglers=Stragglers(jitter="lognormal", jitter_sigma=0.75))
    return [simlib.run(default_problem(), p, substrate="sim", **base).trace for p in ("bsp", "ssp:20", "async")]


def test_the_waiting_count_says_how_many_drawn_rows_are_in_a_wait_bar_at_the_cursor():
    fig = _figure()
    reveal = draw_runs(fig, _jitter_runs()[:1], max_workers=12)  # 12 of 16 rows drawn
    ax = reveal.timelines[0]
    waits = timeline_artists(ax)["span:wait"].get_path()  # the wait bars as drawn
    counted = []
    for t in np.linspace(0.0, reveal.t_end, 101)[1:-1]:
        reveal(t)
        label = reveal._texts[0].get_text()
        said = int(re.match(r"BSP: (\d+) of 12 waiting$", label).group(1))
        drawn = int(waits.contains_points(np.array([[t, row] for row in range(12)])).sum())
        assert said == drawn, f"at t = {t}: the title says {label!r}, {drawn} rows are in a wait bar"
        counted.append(said)
    # Not vacuous: BSP spends moments with most drawn rows waiting, and moments with none.
    assert max(counted) >= 9 and min(counted) == 0


def test_the_waiting_counts_cover_no_timeline_row_and_no_other_title():
    fig = Figure(figsize=(13.5, 8), dpi=80)  # the live panel's size
    FigureCanvasAgg(fig)
    reveal = draw_runs(fig, _jitter_runs(n_workers=64, steps=10), max_workers=64)  # the longest titles
    reveal(0.5 * reveal.t_end)
    renderer = fig.canvas.get_renderer()
    texts = [t.get_window_extent(renderer) for t in reveal._texts]
    assert all("of 64 waiting" in t.get_text() for t in reveal._texts)
    for i, box in enumerate(texts):
        for ax in reveal.timelines:
            assert not box.overlaps(ax.get_window_extent(renderer)), "a waiting count covers timeline rows"
        for j, other in enumerate(texts):
            assert i == j or not box.overlaps(other), "two waiting counts overlap"
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1  # inside the figure


def _drawn_texts(fig: Figure) -> list:
    """The texts a draw of ``fig`` shows: visible, non-empty, and of the tick labels only those in view."""
    from matplotlib.text import Text

    fig.canvas.draw()
    ticks, shown = set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks |= {lbl for tick in axis.get_major_ticks() + axis.get_minor_ticks() for lbl in (tick.label1, tick.label2)}
            shown |= {lbl for tick in axis._update_ticks() for lbl in (tick.label1, tick.label2)}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and (t not in ticks or t in shown)]


@pytest.mark.parametrize("n_workers", [16, 64])
def test_the_projector_layout_overlaps_no_text_and_cuts_none_off(n_workers):
    from simlib.app.live import PROJECTOR_DPI, PROJECTOR_FIGSIZE

    fig = Figure(figsize=PROJECTOR_FIGSIZE, dpi=PROJECTOR_DPI)  # the live panel's projector figure
    FigureCanvasAgg(fig)
    runs = _jitter_runs(n_workers=n_workers, steps=10)
    reveal = draw_runs(fig, runs, max_workers=n_workers, window=0.1 * max(r.makespan for r in runs), projector=True)
    for t in (reveal.t_end, 0.5 * reveal.t_end):  # the whole run, and a moment of Play (longer run titles)
        reveal(t)
        texts = _drawn_texts(fig)
        names = {t.get_text() for t in texts}
        assert {"compute", "wait", "loss", "worker", "BSP"} <= {n.split("\n")[0] for n in names}
        assert sum("time (" in n for n in names) == 1  # the time axis is labelled once
        assert min(t.get_fontsize() for t in texts) >= 14
        renderer = fig.canvas.get_renderer()
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
        for i, (name, box) in enumerate(boxes):
            assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, \
                f"{name!r} is cut off: {box.bounds}"
            for other, obox in boxes[i + 1:]:
                assert not box.overlaps(obox), f"{name!r} overlaps {other!r}"
            for ax in reveal.timelines:  # no title or label covers the rows
                assert name not in {a.get_title() for a in reveal.timelines} or not box.overlaps(ax.bbox)
    assert reveal._texts[0].get_text() == f"BSP\n{reveal.waiting_at(0, reveal.t)} of {n_workers} waiting"


def test_the_projector_layout_keeps_the_laptop_layout_apart():
    runs = _jitter_runs(n_workers=4, steps=10)
    fig = Figure(figsize=(13.5, 8), dpi=80)
    FigureCanvasAgg(fig)
    draw_runs(fig, runs)
    laptop = [ax.get_position().bounds for ax in fig.axes]
    draw_runs(fig, runs, projector=True)  # a different layout: the axes are rebuilt
    draw_runs(fig, runs)
    assert [ax.get_position().bounds for ax in fig.axes] == laptop
    assert fig.axes[0].get_title().startswith("BSP: ")
