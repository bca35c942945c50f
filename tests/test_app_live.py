"""The live lecture panel, driven from Python: controls, redraws, play mode, export, the background path."""
from __future__ import annotations

import asyncio

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

pytest.importorskip("ipywidgets", reason="the live panel needs ipywidgets (pip install ipywidgets ipympl)")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from simlib.app.live import LivePanel  # noqa: E402
from simlib.app.scenario import LiveSettings  # noqa: E402

# One persistently slow worker and SSP(3): the tests below reason about that worker.
SMALL = dict(n_workers=4, steps=20, straggler="slow worker", staleness=3)


@pytest.fixture
def panel(tiny_problem):
    p = LivePanel(LiveSettings(**SMALL), problem=tiny_problem, figsize=(10, 6))
    yield p
    p.close()


def _pixels(panel: LivePanel) -> np.ndarray:
    canvas = FigureCanvasAgg(panel.fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()


def test_panel_draws_the_chosen_protocols_side_by_side(panel):
    assert [t.label for t in panel.traces] == ["BSP", "SSP(3)", "Async"]
    assert len(panel.reveal.timelines) == 3
    assert "BSP" in panel.status.value and "waiting" in panel.status.value
    assert panel.fig.get_suptitle()  # the finding, computed from the runs


def test_moving_a_slider_reruns_and_changes_the_figure(panel):
    before, makespan = _pixels(panel), panel.traces[0].makespan
    redraws = panel.redraws
    panel.c_severity.value = 8.0  # worker 0 becomes 8x slower
    assert panel.redraws == redraws + 1
    assert panel.settings.severity == 8.0
    assert panel.traces[0].makespan > makespan  # BSP waits for the slow worker every step
    assert not np.array_equal(before, _pixels(panel))
    assert f"data-redraws='{panel.redraws}'" in panel.status.value


def test_only_changed_runs_are_simulated_again(panel):
    done = panel.runner.simulated
    panel.c_staleness.value = 5  # BSP and async do not depend on s
    assert panel.runner.simulated == done + 1
    panel.c_staleness.value = 3  # back to a setting already run: all from the cache
    assert panel.runner.simulated == done + 1


def test_protocol_toggles_and_allreduce(panel):
    panel.c_protocols["async"].value = False
    assert [t.label for t in panel.traces] == ["BSP", "SSP(3)"]
    panel.c_topology.value = "allreduce"
    assert [t.label for t in panel.traces] == ["BSP all-reduce"]
    assert panel.c_protocols["ssp"].disabled and panel.c_servers.disabled


def test_a_run_the_simulator_rejects_is_reported_in_the_panel(panel):
    kept = list(panel.traces)
    panel.settings = LiveSettings(**SMALL, compression="bogus:1")
    panel.refresh()  # the simulator names the field; the lecture goes on
    assert "cannot run" in panel.status.value and "compression" in panel.status.value
    assert panel.traces == kept


def test_play_mode_reveals_time_and_counts_waiting(panel):
    panel.c_severity.value = 6.0
    panel.time_slider.value = 30
    assert panel.reveal.t == pytest.approx(0.3 * panel.reveal.t_end)
    assert "waiting" in panel.reveal._texts[0].get_text()
    frame = _pixels(panel)
    panel.time_slider.value = 100
    assert not np.array_equal(frame, _pixels(panel))
    panel.c_speed.value = 2.0
    assert panel.frame_seconds() == pytest.approx(0.05)


def _png_text(panel: LivePanel) -> dict:
    """The text chunks of the PNG the panel last sent to the browser."""
    import io

    from PIL import Image

    return dict(Image.open(io.BytesIO(panel._image.value)).text)


def test_projector_mode_draws_the_figure_on_fewer_inches_so_its_text_is_large(panel):
    from simlib.app.live import PROJECTOR_DPI, PROJECTOR_FIGSIZE

    laptop_png = panel._image.value
    laptop = float(_png_text(panel)["simlib:text-px"])
    assert laptop == pytest.approx(14 * 80 / 72, abs=0.01)  # the style's 14 pt at the laptop's 80 dpi
    panel.c_large.value = True
    assert "simlib-projector" in panel.widget._dom_classes  # the style sheet's projector rules hang on it
    assert tuple(panel.fig.get_size_inches()) == PROJECTOR_FIGSIZE and panel.fig.dpi == PROJECTOR_DPI
    # Text of the same size in points on a figure of fewer inches: drawn to the same width on
    # screen, it comes out larger, by 13.5 in / 8.4 in at the panel's laptop size.
    assert float(_png_text(panel)["simlib:text-px"]) == pytest.approx(14 * PROJECTOR_DPI / 72, abs=0.01)
    assert panel.status in panel.widget.children[1].children[0].children  # the summary moved under the controls
    assert panel.fig.axes[0].get_title().startswith("BSP\n")  # the projector layout: run titles on two lines
    panel.c_large.value = False
    assert "simlib-projector" not in panel.widget._dom_classes
    assert panel.status in panel.widget.children[1].children[1].children
    assert panel._image.value == laptop_png  # the laptop figure is back, pixel for pixel


def test_the_ssp_toggle_names_the_current_staleness(panel):
    assert panel.c_protocols["ssp"].description == "SSP(3)"
    panel.c_staleness.value = 5
    assert panel.c_protocols["ssp"].description == "SSP(5)"


def test_export_writes_the_animation(panel, tmp_path):
    path = panel.export(str(tmp_path / "lecture.html"), frames=3)
    assert open(path, encoding="utf-8").read().count("data:image/png;base64") == 3
    assert "lecture.html" in panel.export_note.value
    # The note's link downloads the file itself: a file:// link does not open from a served page.
    import base64
    import re

    link = re.search(r"href='data:text/html;base64,([^']+)' download='lecture.html'", panel.export_note.value)
    assert link and base64.b64decode(link.group(1)) == open(path, "rb").read()
    assert "file://" not in panel.export_note.value


def test_export_by_default_writes_a_small_file_outside_the_checkout(tiny_problem):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    p = LivePanel(LiveSettings(n_workers=16, steps=100), problem=tiny_problem)
    try:
        path = Path(p.export())
        assert path.is_file() and repo not in path.parents
        assert path.stat().st_size < 3e6
        text = path.read_text(encoding="utf-8")
        assert text.count("data:image/png;base64") == 30 and "https://" not in text and "http://" not in text
        assert "playing = true" in text  # it plays on load
        assert str(path) in p.export_note.value
    finally:
        p.close()
        if "path" in locals():
            import shutil

            shutil.rmtree(path.parent, ignore_errors=True)


def test_export_in_the_background_keeps_the_panel_live(panel, tmp_path):
    async def scenario() -> tuple[bool, bool, str]:
        panel._loop = asyncio.get_running_loop()
        path = panel.export(str(tmp_path / "bg.html"), frames=4, wait=False)
        busy = panel.export_button.disabled  # the kernel got control back before the frames were drawn
        for _ in range(2400):
            await asyncio.sleep(0.05)
            if not panel.export_button.disabled:
                break
        return busy, panel.export_button.disabled, path

    busy, still, path = asyncio.run(scenario())
    assert busy and not still
    assert open(path, encoding="utf-8").read().count("data:image/png;base64") == 4
    assert "bg.html" in panel.export_note.value


async def _first_figure(p: LivePanel) -> int:
    """Wait for a panel made in an event loop to draw its first figure; the loop's turns meanwhile."""
    turns = 0
    for turns in range(6000):
        if p.redraws:
            return turns
        await asyncio.sleep(0.01)
    raise AssertionError(f"no first figure after 60 s: {p.status.value}")


def test_in_an_event_loop_the_first_figure_is_drawn_in_the_background(tiny_problem):
    async def scenario() -> tuple[int, int, int]:
        p = LivePanel(LiveSettings(**SMALL), problem=tiny_problem, figsize=(8, 5))
        try:
            before = p.redraws  # the constructor returned before the runs were simulated
            turns = await _first_figure(p)
            return before, turns, len(p.traces)
        finally:
            p.close()

    before, turns, runs = asyncio.run(scenario())
    assert before == 0 and turns >= 1 and runs == len(LiveSettings().protocols)


def test_changes_in_an_event_loop_run_in_the_background_and_coalesce(tiny_problem):
    async def scenario() -> tuple[int, float, int]:
        p = LivePanel(LiveSettings(**SMALL), problem=tiny_problem, figsize=(8, 5), debounce=0.05)
        try:
            await _first_figure(p)
            start = p.redraws
            for sev in (4.0, 5.0, 6.0):  # three quick moves: one redraw, of the last value
                p.c_severity.value = sev
            for _ in range(6000):  # three runs simulated: up to 60 s on a loaded machine
                await asyncio.sleep(0.01)
                if p.redraws > start:
                    break
            await asyncio.sleep(0.2)
            return p.redraws - start, p.traces[0].meta["config"]["stragglers"]["slow_factor"], p.runner.simulated
        finally:
            p.close()

    redraws, slow_factor, simulated = asyncio.run(scenario())
    assert redraws == 1 and slow_factor == 6.0
    assert simulated == 6  # the first draw's three runs plus the last value's three


def test_a_long_run_shows_progress_and_the_kernel_stays_responsive(tiny_problem):
    """The run asked for (64 workers x 1,000 steps, the sliders' most) cannot end before the loop has turned and the
    bar has shown: the test looks until it has seen both, then closes the panel, which stops the run."""
    async def scenario() -> tuple[int, set[str], float]:
        p = LivePanel(LiveSettings(n_workers=16, steps=60, protocols=("bsp",)), problem=tiny_problem, figsize=(8, 5),
                      debounce=0.0, processes=1, progress_after=0.0)
        shown: set[str] = set()
        try:
            await _first_figure(p)
            start, ticks = p.redraws, 0
            p.c_workers.value, p.c_steps.value = 64, 1000  # a run far longer than what the loop below waits for
            while p.redraws == start and not (ticks >= 3 and "visible" in shown and p.progress.value > 0.0):
                await asyncio.sleep(0.01)  # the event loop (the kernel) keeps running during the run
                ticks += 1
                shown.add(p.progress.layout.visibility)
            return ticks, shown, p.progress.value
        finally:
            p.close()

    ticks, shown, last = asyncio.run(scenario())
    assert ticks >= 3  # a synchronous run would have blocked the loop: zero ticks until it finished
    assert "visible" in shown and last > 0.0


def test_changing_the_workers_changes_the_rows_drawn_and_the_time_per_step(tiny_problem):
    p = LivePanel(LiveSettings(n_workers=4, steps=20, protocols=("bsp",)), problem=tiny_problem, figsize=(10, 6))
    try:
        def shown() -> tuple[float, float]:
            lo, hi = sorted(p.reveal.timelines[0].get_ylim())
            return hi - lo, p.traces[0].summary()["time_per_step"]

        rows4, step4 = shown()
        p.c_workers.value = 12
        rows12, step12 = shown()
        assert p.rows() == 12 and rows12 >= rows4 + 8  # one row per worker
        assert step12 > step4  # BSP waits for the slowest of more jittered workers
    finally:
        p.close()


def _shown(panel: LivePanel) -> tuple[int, float]:
    """The frame and simulated time the PNG sent to the browser says it shows."""
    from io import BytesIO

    from PIL import Image

    with Image.open(BytesIO(panel._image.value)) as im:
        return int(im.text["simlib:frame"]), float(im.text["simlib:time"])


def test_play_advances_figure_and_slider_together_and_stop_shows_the_whole_run(panel):
    async def scenario() -> list[tuple[int, int, float]]:
        panel._loop = asyncio.get_running_loop()
        panel.c_speed.value = 4.0  # 25 ms a frame: slower than drawing, so frames are skipped
        panel.play.value = True
        assert panel.play.description == "Pause"
        assert panel.time_slider.value == 0 == _shown(panel)[0]  # from the end, Play starts over at once
        seen, paused = [], None
        while panel.play.value:
            await asyncio.sleep(0.02)
            frame, t = _shown(panel)
            seen.append((panel.time_slider.value, frame, t))
            # Pause once, mid-run (on a busy machine a frame takes long to draw, and the first few
            # looks may already be near the end: Play at the end would start over)
            if paused is None and 0 < frame < 100:
                panel.play.value = False  # Pause keeps the moment on screen
                paused = panel.time_slider.value
                await asyncio.sleep(0.3)
                assert panel.time_slider.value == paused == _shown(panel)[0]
                panel.play.value = True  # and Play goes on from there
        return seen, paused

    seen, paused = asyncio.run(scenario())
    assert paused is not None, seen  # the pause was tried
    t_end = panel.reveal.t_end
    assert all(slider == frame for slider, frame, _ in seen), seen  # what the slider says is what is drawn
    assert all(t == pytest.approx(frame / 100 * t_end) for _, frame, t in seen)
    frames = [f for _, f, _ in seen]
    assert frames == sorted(frames) and frames[-1] == 100  # it played to the end (a first look after a stall may be late)
    assert panel.play.description == "Play"

    panel.time_slider.value = 40
    panel.stop()  # Stop: the whole run, never blank axes
    assert panel.time_slider.value == 100 and panel.reveal.t == t_end and _shown(panel)[0] == 100
    curves = [ln for ln in panel.reveal.loss_ax.lines if (ln.get_gid() or "").startswith("loss:")]
    assert curves and all(len(ln.get_xdata()) == len(tr.quality) for ln, tr in zip(curves, panel.traces))


def test_a_new_run_stops_play_and_shows_the_whole_run(panel):
    panel.time_slider.value = 30
    assert _shown(panel) == (30, pytest.approx(0.3 * panel.reveal.t_end))
    panel.c_severity.value = 5.0
    assert panel.time_slider.value == 100 and _shown(panel)[0] == 100 and not panel.play.value


# -- the generated controls: every other SimConfig option, from its field's metadata --------------------------
def _eligible_fields() -> set[str]:
    """SimConfig's fields a generated control must cover, read from the dataclass itself."""
    import dataclasses

    from simlib.app.scenario import NOT_OFFERED, PANEL_FIELDS
    from simlib.sim import SimConfig

    return {f.name for f in dataclasses.fields(SimConfig)
            if f.metadata.get("option", True) is not False and f.name not in PANEL_FIELDS + NOT_OFFERED}


def test_every_other_simconfig_option_has_a_generated_control(panel):
    import ipywidgets as W

    from simlib.options import options
    from simlib.sim import SimConfig

    assert set(panel.c_more) == _eligible_fields()
    assert {"sites", "wan_latency", "server_time", "backup_workers", "timeout", "clock_batches"} <= set(panel.c_more)
    assert panel.more.selected_index is None  # collapsed
    for opt in options(SimConfig):
        control = panel.c_more.get(opt.name)
        if control is None:
            continue
        kind = (W.Dropdown if opt.choices else W.Checkbox if opt.type is bool else
                W.IntText if opt.type is int else W.FloatText)
        assert isinstance(control.input, kind), opt.name
        assert opt.help in control.input.tooltip, opt.name
        assert (control.switch is not None) == opt.optional, opt.name
        assert control.value == opt.default, opt.name  # untouched: SimConfig's default (None: off)


def test_a_generated_control_changes_the_config_the_panel_runs(panel):
    panel.c_more["server_time"].value = 2e-4
    assert all(c.server_time == 2e-4 for c in panel.settings.configs())
    assert all(t.meta["config"]["server_time"] == 2e-4 for t in panel.traces)
    panel.c_protocols["async"].value = False  # a deadline needs clocks
    timeout = panel.c_more["timeout"]
    timeout.input.value = 0.5
    assert panel.settings.configs()[0].timeout is None  # still switched off
    timeout.switch.value = True
    assert panel.settings.configs()[0].timeout == 0.5
    panel.c_more["backup_workers"].value = 1
    assert [t.label for t in panel.traces] == ["BSP b=1 T=0.5s", "SSP(3) b=1 T=0.5s"]


def test_a_bad_generated_value_is_refused_by_name_and_the_panel_goes_on(panel):
    kept = list(panel.traces)
    panel.c_more["sites"].value = 0  # out of the field's range
    assert "cannot run" in panel.status.value and "sites" in panel.status.value
    assert panel.traces == kept
    panel.c_more["sites"].value = 2
    assert all(t.meta["config"]["sites"] == 2 for t in panel.traces)
    panel.c_more["significance"].value = 0.1  # in range, but only per-site servers filter: the config refuses it
    assert "cannot run" in panel.status.value and "significance" in panel.status.value
    panel.c_more["hierarchy"].value = "per-site"
    assert all(t.meta["config"]["significance"] == 0.1 for t in panel.traces)
    with pytest.raises(ValueError, match="sitez: not a setting of the live panel; did you mean 'sites'"):
        panel.set(sitez=3)


def test_settings_round_trip_through_a_dict_extra_options_included(panel, tiny_problem):
    from simlib.app.live import live_panel

    panel.set(sites=2, wan_latency=0.01, staleness_aware=True, accumulation=None)
    d = panel.settings_dict()
    assert d["sites"] == 2 and d["wan_latency"] == 0.01 and d["staleness_aware"] is True
    assert "accumulation" not in d  # an option left at its default is not written
    again = LiveSettings.from_dict(d)
    assert again == panel.settings and again.configs() == panel.settings.configs()
    other = LivePanel(again, problem=tiny_problem, figsize=(10, 6))
    try:
        assert other.c_more["sites"].value == 2 and other.c_more["staleness_aware"].value is True
        assert [t.meta["config"] for t in other.traces] == [t.meta["config"] for t in panel.traces]
    finally:
        other.close()
    with pytest.raises(ValueError, match="bogus: not a setting of the live panel"):
        live_panel(**d, bogus=1)
