"""Live lecture mode: sliders that re-run the simulator and redraw the runs side by side.

A lecturer asks "what if one worker is three times slower?" and moves a slider: the panel
re-simulates every chosen protocol (BSP, SSP(s), async) with :func:`simlib.run` (substrate `'sim'`), then
redraws their timelines side by side above loss against simulated time (:func:`simlib.viz.anim.draw_runs`).
Play mode reveals the runs as simulated time advances; Export writes the same animation as an
offline HTML page for slides. In a notebook::

    from simlib.app.live import LivePanel
    LivePanel()            # the panel displays itself

Runs go to a worker thread, so the kernel keeps answering the sliders while a large run is
simulated; a newer change cancels an older run at its next progress report. Outside an event
loop (scripts, tests) every change runs synchronously.
"""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import html
import io
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as W
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from simlib import _validate as check
from simlib.app.scenario import (COMPRESSIONS, PROTOCOLS, STRAGGLERS, LiveSettings, Runner, Superseded, extra_options,
                                 live_problem, shutdown_pool)
from simlib.options import Option
from simlib.protocol import KIND_LABELS
from simlib.trace import Trace
from simlib.viz.anim import Reveal, draw_runs, export_animation
from simlib.viz.style import style

__all__ = ["LivePanel", "live_panel", "LiveSettings", "Runner", "live_problem", "shutdown_pool"]

TOPOLOGY_NAMES = {"ps": "PS shards", "allreduce": "ring all-reduce"}
PLAY_FRAMES = 100
FIGSIZE = (13.5, 8.0)  # inches at laptop size
DPI = 80  # figure pixels per inch at laptop size; the browser scales the image to the space it has
# Projector mode draws the figure on fewer inches, so its text (14 pt and up, simlib.viz.style) is
# larger next to its plots: on the ~950 px a 1280x720 window gives the figure, 14 pt comes to
# 14 / 72 * 950 / 8.4 = 22 px. More pixels per inch keep it sharp where it is drawn larger.
PROJECTOR_FIGSIZE = (8.4, 5.5)
PROJECTOR_DPI = 120
_WIDE = {"style": {"description_width": "8.5em"}}
_NARROW = {"style": {"description_width": "5em"}}  # the play row's sliders
_SLIDER = {"continuous_update": False, **_WIDE}  # a slider re-runs when released, not while dragged
_LOG_SLIDER = {"base": 10, "step": 0.25, "readout_format": ".1e", **_SLIDER}
# The control of each LiveSettings field (the protocols are toggles; the seed has none): the panel's attribute,
# the widget, its description and arguments.
CONTROLS: dict[str, tuple[str, Any, str, dict[str, Any]]] = {
    "n_workers": ("c_workers", W.IntSlider, "workers", dict(min=1, max=64, **_SLIDER)),
    "steps": ("c_steps", W.IntSlider, "steps", dict(min=10, max=1000, step=10, **_SLIDER)),
    "staleness": ("c_staleness", W.IntSlider, "staleness s", dict(min=0, max=20, **_SLIDER)),
    "straggler": ("c_straggler", W.Dropdown, "stragglers", dict(options=STRAGGLERS, **_WIDE)),
    "severity": ("c_severity", W.FloatSlider, "severity (x)", dict(min=1.0, max=10.0, step=0.5, **_SLIDER)),
    "latency": ("c_latency", W.FloatLogSlider, "latency (s)", dict(min=-6, max=-1, **_LOG_SLIDER)),
    "bandwidth": ("c_bandwidth", W.FloatLogSlider, "bandwidth (B/s)", dict(min=6, max=11, **_LOG_SLIDER)),
    "topology": ("c_topology", W.ToggleButtons, "topology", dict(options=[(v, k) for k, v in TOPOLOGY_NAMES.items()],
                                                                 style={**_WIDE["style"], "button_width": ""})),
    "n_servers": ("c_servers", W.IntSlider, "PS shards", dict(min=1, max=8, **_SLIDER)),
    "compression": ("c_compression", W.Dropdown, "compression", dict(options=COMPRESSIONS, **_WIDE)),
}

# The panel's own style sheet (live.css): the figure fits the window, projector mode gives it most of the screen.
PANEL_CSS = Path(__file__).with_name("live.css").read_text(encoding="utf-8")


class LivePanel:
    """The lecture panel: controls on the left, runs side by side on the right, play and export below.

    ``panel.settings`` is the current :class:`LiveSettings`; ``panel.traces`` the runs drawn;
    ``panel.refresh()`` re-runs and redraws now (synchronously). Displaying the panel shows
    ``panel.widget``.
    """

    def __init__(self, settings: LiveSettings | None = None, problem: Any = None, figsize: tuple[float, float] = FIGSIZE,
                 debounce: float = 0.15, export_dir: str | None = None, processes: int | None = None,
                 progress_after: float = 0.3) -> None:
        check.non_negative("debounce", debounce)
        check.non_negative("progress_after", progress_after)
        self.progress_after = progress_after  # seconds a run may take before the progress bar appears
        self.settings = settings or LiveSettings()
        if processes is None:
            # One core stays with the kernel (drawing) and the browser: on 2 busy cores a pool of 2
            # simulated the three runs slower than this process (8 of 10 settings, 1.4x in total), and
            # each worker process costs memory.
            processes = min(len(PROTOCOLS), max(1, (os.cpu_count() or 1) - 1))
        self.runner = Runner(problem, processes=processes)
        self.debounce = debounce
        self.export_dir = export_dir
        self.traces: list[Trace] = []
        self.reveal: Reveal | None = None
        self.redraws = 0
        self.last_redraw_s = float("nan")
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="simlib-live")
        self._export_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="simlib-export")
        self._gen = 0
        self._pending: asyncio.TimerHandle | None = None
        self._last_progress = 0.0
        self._laptop_figsize = figsize
        self.projector = False
        with style():
            self.fig = Figure(figsize=figsize, dpi=DPI)
        # An image, not an ipympl canvas: a canvas has a fixed pixel size (and a resize handle), an
        # image scales with the browser window. The panel sends the Agg canvas's PNGs to it.
        self.canvas = FigureCanvasAgg(self.fig)
        self._image = W.Image(format="png").add_class("simlib-figure")
        self._build()
        self._warming = False
        # The first figure is simulated in this process: starting the worker processes (each imports
        # the simulator) took longer than the three runs. They start once it is drawn (_finish_draw).
        if self._loop is None:
            self.refresh(pool=False)
        else:
            # In a kernel, in the worker thread: the cell returns at once, so the page and its widgets
            # load while the runs are simulated, instead of after them (Voilà sends the page only when
            # the notebook has run).
            self.status.value = "simulating the first runs..."
            self._gen += 1
            self._start(self._gen)

    # -- controls ---------------------------------------------------------------------------
    def _build(self) -> None:
        # The controls are made, then show the settings (_sync_controls, at the end).
        self._fields: dict[str, Any] = {}  # the control of each LiveSettings field (but protocols and seed)
        for field, (attr, widget, description, kw) in CONTROLS.items():
            self._fields[field] = control = widget(description=description, **kw)
            setattr(self, attr, control)
        # Four toggles of 5.75em (and their 2 px margins) fill the 25em controls column.
        self.c_protocols = {p: W.ToggleButton(layout=W.Layout(width="5.75em")) for p in PROTOCOLS}
        for b in self.c_protocols.values():
            # A chosen protocol is drawn in the accent colour: the default grey pressed state is hard to see projected.
            b.observe(lambda ch: setattr(ch["owner"], "button_style", "primary" if ch["new"] else ""), names="value")
        self.c_staleness.observe(lambda ch: self._name_bounded(ch["new"]), names="value")
        self.c_window = W.IntSlider(10, min=1, max=100, description="zoom (% of run)", **_SLIDER)
        self.c_large = W.ToggleButton(False, description="projector mode",
                                      tooltip="the figure on most of the screen, its text large enough for the back row "
                                              "(a full-screen browser on a projector)")
        self.c_large.observe(self._on_large, names="value")
        # Every other SimConfig option, a control generated from its field's metadata, in a collapsed section.
        self.c_more = {o.name: OptionControl(o, o.default) for o in extra_options()}
        self.more = W.Accordion(children=[W.VBox([c.widget for c in self.c_more.values()])], selected_index=None,
                                titles=("more settings",)).add_class("simlib-more")
        for c in [*self._fields.values(), *self.c_protocols.values(), *self.c_more.values()]:
            c.observe(self._on_change, names="value")
        self.c_window.observe(lambda _: self._draw(), names="value")
        self._sync_controls()
        self._name_bounded(self.settings.staleness)

        # Play is driven by the kernel, not by a timer in the browser: each frame is drawn, then the
        # figure and the time slider are sent together, so they never disagree (a browser-side
        # timer ran ahead of the figure by up to 2 s on a busy machine). Slow frames are skipped.
        self.play = W.ToggleButton(False, description="Play", icon="play", tooltip="play the runs in simulated time")
        self.play.observe(self._on_play, names="value")
        self.stop_button = W.Button(description="Stop", icon="stop", tooltip="stop and show the whole run")
        self.stop_button.on_click(lambda _: self.stop())
        self.c_speed = W.FloatLogSlider(1.0, base=2, min=-2, max=2, step=0.5, description="speed (x)", **_NARROW)
        self.c_speed.observe(lambda _: self._rebase_play(), names="value")
        self.time_slider = W.IntSlider(PLAY_FRAMES, min=0, max=PLAY_FRAMES, description="time (%)", **_NARROW)
        self.time_slider.observe(self._on_time, names="value")
        self._play_task: asyncio.Task | None = None
        self._play_origin = (0.0, 0.0)  # (loop time, frame) Play counts from
        self._setting_time = False  # True while the kernel itself moves the time slider
        self.export_button = W.Button(description="Export HTML")
        self.export_button.on_click(lambda _: self.export(wait=False))
        self.export_note = W.HTML()
        self.progress = W.FloatProgress(max=1.0, layout=W.Layout(width="20em", visibility="hidden"))
        self.status = W.HTML().add_class("simlib-live-status")

        title = W.HTML("<style>" + PANEL_CSS + "</style><h2>Live: BSP, SSP and async on a simulated cluster</h2>")
        left = W.VBox([
            W.HTML("<b>cluster</b>"), self.c_workers, self.c_steps,
            W.HTML("<b>protocols</b>"), W.HBox(list(self.c_protocols.values())), self.c_staleness,
            W.HTML("<b>stragglers</b>"), self.c_straggler, self.c_severity,
            W.HTML("<b>network</b>"), self.c_latency, self.c_bandwidth, self.c_topology, self.c_servers,
            self.c_compression, self.more, W.HTML("<b>view</b>"), self.c_window, self.c_large,
        ]).add_class("simlib-controls")
        playrow = W.HBox([self.play, self.stop_button, self.c_speed, self.time_slider, self.export_button])
        right = W.VBox([self._image, playrow.add_class("simlib-playrow"), W.HBox([self.progress, self.export_note]),
                        self.status]).add_class("simlib-main")
        self._columns = (left, right)
        self.widget = W.VBox([title, W.HBox([left, right], layout=W.Layout(width="100%"))],
                             layout=W.Layout(width="100%")).add_class("simlib-live")

    def _name_bounded(self, s: int) -> None:
        """The toggles show the protocols' labels, the bound included: 'BSP', 'SSP(3)', 'ESSP(3)', 'Async'."""
        for p, button in self.c_protocols.items():
            button.description = KIND_LABELS[p].format(s=s)

    def _read_controls(self) -> LiveSettings:
        """The settings the controls show now."""
        chosen = tuple(p for p in PROTOCOLS if self.c_protocols[p].value) or ("bsp",)
        # The float sliders' values are floats already (their traits cast them).
        extra = {n: c.value for n, c in self.c_more.items() if c.value != c.option.default}
        return LiveSettings(protocols=chosen, seed=self.settings.seed, extra=extra,
                            **{f: c.value for f, c in self._fields.items()})

    def set(self, **changes: Any) -> None:
        """Change settings from code (as the sliders do) and re-run synchronously."""
        self.settings = LiveSettings.from_dict({**self.settings.to_dict(), **changes})
        self._sync_controls()
        self.refresh()

    def _sync_controls(self) -> None:
        """Show ``self.settings`` on the controls without triggering runs."""
        s = self.settings
        self._muted = True
        try:
            for f, c in self._fields.items():
                c.value = getattr(s, f)
            for p, b in self.c_protocols.items():
                b.value = p in s.protocols
            extra = dict(s.extra)
            for n, c in self.c_more.items():
                c.value = extra.get(n, c.option.default)
        finally:
            self._muted = False

    _muted = False

    # -- running ----------------------------------------------------------------------------
    def _on_change(self, _change: dict[str, Any]) -> None:
        """A control moved: re-run after ``debounce`` seconds of quiet (or now, without an event loop)."""
        if self._muted:
            return
        try:
            self.settings = self._read_controls()
        except ValueError as exc:
            self._show_error(exc)
            return
        self.c_servers.disabled = self.settings.topology != "ps"
        self.c_staleness.disabled = not {"ssp", "essp"} & set(self.settings.runnable())
        for p in ("ssp", "essp", "async"):
            self.c_protocols[p].disabled = self.settings.topology == "allreduce"
        if self._loop is None:
            self.refresh()
            return
        self._gen += 1  # cancels a run in flight at its next progress report
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self._loop.call_later(self.debounce, self._start, self._gen)

    def refresh(self, pool: bool = True) -> list[Trace]:
        """Re-run the current settings and redraw, synchronously; returns the traces."""
        self._gen += 1
        t0 = time.perf_counter()
        try:
            traces = self.runner.run(self.settings.configs(self.runner.nnz_per_row), pool=pool)
        except ValueError as exc:
            self._show_error(exc)
            return self.traces
        self._finish_draw(traces, t0)
        return traces

    def _start(self, gen: int) -> None:
        """Submit the run for generation ``gen`` to the worker thread (a config refused comes back as its error)."""
        self._pending = None
        if gen != self._gen:
            return
        t0 = time.perf_counter()
        settings, loop = self.settings, self._loop
        assert loop is not None

        def progress(frac: float, label: str) -> None:
            if gen != self._gen:
                raise Superseded()
            now = time.perf_counter()
            # The bar once a run has taken a moment; a widget message per report would flood the browser.
            if now - t0 >= self.progress_after and now - self._last_progress > 0.05:
                self._last_progress = now
                loop.call_soon_threadsafe(self._show_bar, frac, label, gen)

        # Until the worker processes have started, simulate in this process's worker thread.
        fut = self._executor.submit(lambda: self.runner.run(settings.configs(self.runner.nnz_per_row), progress,
                                                            pool=self.runner.warm))
        then = functools.partial(self._finish_draw, t0=t0)
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._finished, f, then, gen))

    def _finished(self, fut: concurrent.futures.Future, then: Callable[[Any], None], gen: int | None = None) -> None:
        """Hide the progress bar, then pass the result on (a run or an export) or say what went wrong; a run
        (``gen``) that is no longer the newest is dropped."""
        if gen is not None and gen != self._gen:
            return
        self.progress.layout.visibility = "hidden"
        exc = fut.exception()
        if exc is None:
            then(fut.result())
        elif not isinstance(exc, Superseded):
            self._show_error(exc)

    def _show_error(self, exc: BaseException) -> None:
        """Say what is wrong in the status line instead of drawing."""
        self.status.value = f"<span style='color:#D55E00'>cannot run: {exc}</span>"

    # -- drawing ----------------------------------------------------------------------------
    def _finish_draw(self, traces: list[Trace], t0: float) -> None:
        """Draw ``traces`` and report how long the change took to show."""
        self.traces = traces
        self.play.value = False  # new runs: shown whole; Play starts over from their beginning
        self._set_time(PLAY_FRAMES)
        self._draw()
        self.last_redraw_s = time.perf_counter() - t0
        self.redraws += 1
        self._write_status()
        if self._loop is not None and self.runner.processes > 1 and not self._warming:
            self._warming = True
            # A thread of its own: a slider moved meanwhile runs at once, in this process.
            threading.Thread(target=self.runner.warm_up, name="simlib-warm-up", daemon=True).start()

    def _draw(self) -> None:
        """Redraw the figure from ``self.traces``."""
        if not self.traces:
            return
        with style():
            self.reveal = draw_runs(self.fig, self.traces, window=self._window(), max_workers=self.rows(),
                                    projector=self.projector)
        self._show_frame(self.time_slider.value)  # the moment the slider shows (during Play too)

    def _show(self, frame: int) -> None:
        """Push the figure to the browser as one PNG, which names the moment it shows and the height of its
        smallest text in the PNG's pixels (text chunks: the browser test turns the latter into screen pixels)."""
        buf = io.BytesIO()
        dpi = self.fig.get_dpi()
        meta = {"simlib:frame": str(frame), "simlib:time": repr(self.reveal.t),
                "simlib:text-px": f"{smallest_text_pt(self.fig) * dpi / 72:.2f}"}
        # The dpi is passed, not left to savefig.dpi: a kernel's rc may set its own.
        # NOTE: zlib level 1 instead of 6: the PNG grows ~10% and encodes ~3x faster (a frame of Play).
        self.fig.savefig(buf, format="png", dpi=dpi, bbox_inches=None, metadata=meta, pil_kwargs={"compress_level": 1})
        self._image.value = buf.getvalue()

    def _window(self) -> float:
        """Seconds of simulated time the timelines show: the zoom slider's share of the longest run."""
        return (max(t.makespan for t in self.traces) or 1.0) * self.c_window.value / 100

    def rows(self) -> int:
        """Timeline rows drawn: every worker of the run (the workers slider goes to 64)."""
        return max((t.n_workers for t in self.traces), default=1)

    def _on_large(self, change: dict[str, Any]) -> None:
        """Projector mode: the figure on most of the screen (a CSS class), drawn on fewer inches so its text is large."""
        self.projector = bool(change["new"])
        (self.widget.add_class if self.projector else self.widget.remove_class)("simlib-projector")
        # The per-run summary moves under the controls, so the figure gets the window's height.
        home, away = self._columns if self.projector else self._columns[::-1]
        away.children = tuple(c for c in away.children if c is not self.status)
        if self.status not in home.children:
            home.children = (*home.children, self.status)
        self.fig.set_size_inches(PROJECTOR_FIGSIZE if self.projector else self._laptop_figsize, forward=False)
        self.fig.set_dpi(PROJECTOR_DPI if self.projector else DPI)
        self._draw()

    def _set_time(self, frame: int) -> None:
        """Move the time slider from the kernel (the figure is drawn by the caller)."""
        self._setting_time = True
        try:
            self.time_slider.value = frame
        finally:
            self._setting_time = False

    def _on_time(self, change: dict[str, Any]) -> None:
        """The lecturer moved the time slider: show the runs up to that share of the longest run."""
        if self._setting_time:
            return
        self._show_frame(change["new"])
        self._rebase_play()

    def _show_frame(self, frame: int) -> None:
        """Reveal the runs up to ``frame`` / PLAY_FRAMES of the longest run, then move the slider there."""
        if self.reveal is None:
            return
        self.reveal(frame / PLAY_FRAMES * self.reveal.t_end)
        # The figure first, then the slider: the slider never shows a moment the figure has not reached.
        self._show(frame)
        self._set_time(frame)

    # -- play -------------------------------------------------------------------------------
    def frame_seconds(self) -> float:
        """Wall-clock seconds per play frame: 0.1 s at speed 1 (the whole run in 10 s)."""
        return 0.1 / float(self.c_speed.value)

    def _rebase_play(self) -> None:
        """Count play time from now and the slider's frame (after a speed change or a drag)."""
        if self._loop is not None:
            self._play_origin = (self._loop.time(), float(self.time_slider.value))

    def _on_play(self, change: dict[str, Any]) -> None:
        """Play (from the start if at the end) or Pause (the figure stays where it is)."""
        self.play.description, self.play.icon = ("Pause", "pause") if change["new"] else ("Play", "play")
        if not change["new"] or self._loop is None:
            return
        if self.time_slider.value >= PLAY_FRAMES:
            self._show_frame(0)
        self._rebase_play()
        if self._play_task is None or self._play_task.done():
            self._play_task = self._loop.create_task(self._play())

    async def _play(self) -> None:
        """Advance one frame per tick of ``frame_seconds`` of wall time; frames drawn too late are skipped."""
        assert self._loop is not None
        while self.play.value and self.reveal is not None:
            started, first = self._play_origin
            due = first + (self._loop.time() - started) / self.frame_seconds()
            frame = min(int(due), PLAY_FRAMES)
            if frame > self.time_slider.value:
                self._show_frame(frame)
            if frame >= PLAY_FRAMES:
                self.play.value = False
                break
            # Sleep until the next frame is due; asyncio.sleep(0) at least lets slider and button messages in.
            wait = (int(due) + 1 - first) * self.frame_seconds() - (self._loop.time() - started)
            await asyncio.sleep(max(0.0, wait))

    def stop(self) -> None:
        """Stop Play and show the whole run (never blank axes)."""
        self.play.value = False
        self._show_frame(PLAY_FRAMES)

    def _write_status(self) -> None:
        """One line per run: time per step, waiting share, staleness, bytes; plus the redraw count."""
        rows = [f"<b>{label}</b>: {s['time_per_step'] * 1e3:.3g} ms/step, {s['wait_fraction']:.0%} waiting, "
                f"max staleness {s['max_staleness']:.0f}, {s['bytes_sent'] / 1e6:.3g} MB sent"
                for label, s in ((tr.label, tr.summary()) for tr in self.traces)]
        self.status.value = (
            f"<div data-redraws='{self.redraws}'>" + "<br>".join(rows) +
            f"<br><small>redraw #{self.redraws} in {self.last_redraw_s:.2f} s</small></div>"
        )

    def export(self, path: str | None = None, frames: int = 30, wait: bool = True) -> str:
        """Write the play-mode animation to a self-contained HTML (or .gif) file; returns its path.

        By default into a fresh temporary folder (never the checkout). With ``wait=False`` the
        frames are drawn in a background thread while the progress bar fills, so the panel stays live.
        """
        if path is None:
            folder = self.export_dir or tempfile.mkdtemp(prefix="simlib-live-export-")
            path = os.path.join(folder, "live-animation.html")
        path = os.path.abspath(path)
        work = functools.partial(export_animation, list(self.traces), path, frames=frames, window=self._window(),
                                 max_workers=self.rows())
        loop = self._loop
        if wait or loop is None:
            self._export_done(work())
            return path
        self.export_button.disabled = True
        self._show_bar(0.0, "export")
        fut = self._export_executor.submit(
            work, progress=lambda frac: loop.call_soon_threadsafe(self._show_bar, frac, "export"))
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._export_finished, f))
        return path

    def _show_bar(self, frac: float, label: str, gen: int | None = None) -> None:
        """Show the progress bar at ``frac``, labelled with what it measures (a run ``gen`` while newest, or the
        export)."""
        if gen is not None and gen != self._gen:
            return
        self.progress.layout.visibility = "visible"
        self.progress.description = label
        self.progress.value = frac

    def _export_finished(self, fut: concurrent.futures.Future) -> None:
        self.export_button.disabled = False
        self._finished(fut, self._export_done)  # an export is never Superseded

    def _export_done(self, path: str) -> None:
        """Offer the animation as a download (a data link works wherever the page is served) and say where it is."""
        data = Path(path).read_bytes()
        mime = "image/gif" if path.lower().endswith(".gif") else "text/html"
        href = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        self.export_note.value = (
            f"<a class='simlib-export-link' href='{href}' download='{html.escape(os.path.basename(path))}'>"
            f"download the animation</a> ({len(data) / 1e6:.1f} MB, also saved as <code>{html.escape(path)}</code>)")

    def close(self) -> None:
        """Stop the worker thread and release the figure's widget."""
        self._gen += 1
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._export_executor.shutdown(wait=True, cancel_futures=True)
        self.widget.close()

    def settings_dict(self) -> dict[str, Any]:
        """The current settings as a plain dict (for notes or reproducing a run: ``live_panel(**d)``); the extra
        options appear by their SimConfig names."""
        return self.settings.to_dict()

    def _ipython_display_(self) -> None:
        """Display the panel's widget."""
        from IPython.display import display

        display(self.widget)


def smallest_text_pt(fig: Figure) -> float:
    """Font size in points of the figure's smallest shown text (titles, tick labels, legends, axis labels)."""
    return min((t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()), default=0.0)


def live_panel(**settings: Any) -> LivePanel:
    """A :class:`LivePanel` started from keyword settings, e.g. ``live_panel(n_workers=8, straggler='jitter')``;
    any other SimConfig option by its name too (``sites=3``, ``server_time=1e-5``); an unknown name is refused."""
    return LivePanel(LiveSettings.from_dict(settings))


class OptionControl:
    """The panel's control for one SimConfig option, made from its metadata: a dropdown for choices, a checkbox for
    a flag, a number box otherwise (its help, unit and range as the tooltip); an optional one (None: off) has a
    checkbox that switches it on. ``value`` is what the option gets (None when off)."""

    def __init__(self, option: Option, value: Any) -> None:
        self.option = o = option
        tip = o.help + (f" ({o.unit})" if o.unit else "") + (f"; {o.range_text()}" if o.range_text() else "")
        label = o.name.replace("_", " ") + (f" ({o.unit})" if o.unit else "")
        if o.choices is not None:
            self.input: Any = W.Dropdown(options=list(o.choices), value=o.default, description=label, **_WIDE)
        elif o.type is bool:
            self.input = W.Checkbox(value=bool(o.default), description=label, indent=False)
        else:
            self.input = (W.IntText if o.type is int else W.FloatText)(value=self._start(), description=label, **_WIDE)
        self.input.tooltip = tip
        self.switch: W.Checkbox | None = None
        self.widget: Any = self.input
        if o.optional:
            self.switch = W.Checkbox(value=False, indent=False, tooltip=f"{o.name}: on (off: not used)",
                                     layout=W.Layout(width="1.6em"))
            W.dlink((self.switch, "value"), (self.input, "disabled"), transform=lambda on: not on)
            self.widget = W.HBox([self.switch, self.input])
        self.value = value

    def _start(self) -> float:
        """What the number box shows while an optional option is off: its default, else the least value allowed."""
        o = self.option
        if o.default is not None:
            return o.default
        lo = 0 if o.min is None else o.min
        return lo + 1 if o.min_open else lo

    @property
    def value(self) -> Any:
        """The option's value: the input's, or None while an optional option is switched off."""
        return None if self.switch is not None and not self.switch.value else self.input.value

    @value.setter
    def value(self, value: Any) -> None:
        if self.switch is not None:
            self.switch.value = value is not None
        if value is not None:
            self.input.value = value

    def observe(self, callback: Callable[[dict[str, Any]], None], names: str = "value") -> None:
        """Call ``callback`` when the value changes (the input, or the on/off switch)."""
        self.input.observe(callback, names=names)
        if self.switch is not None:
            self.switch.observe(callback, names=names)
