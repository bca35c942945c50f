"""Runs side by side, revealed as simulated time advances: the live panel's figure and its exported animation.

:func:`draw_runs` lays out one timeline per run (top row, shared time axis) above the loss
against time of all runs, and returns a :class:`Reveal`; calling it with a time ``t`` shows the
figure as it stood at ``t``: spans and messages drawn up to ``t``, a cursor, how many workers are
waiting, loss curves cut at ``t``. The live panel's play mode and :func:`export_animation` (a
self-contained HTML page or a GIF for slides) both go through it. Example::

    >>> from matplotlib.figure import Figure
    >>> reveal = draw_runs(Figure(), traces)          # doctest: +SKIP
    >>> reveal(0.5 * reveal.t_end)                     # doctest: +SKIP
"""
from __future__ import annotations

import base64
import html
import io
import os
import string
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox, TransformedBbox
from matplotlib.ticker import FuncFormatter, MaxNLocator

from simlib._validate import one_of, positive, positive_int
from simlib.trace import Trace
from simlib.viz.plots import (MAX_ARROWS, _as_list, default_target, finding, legend_handles, plot_loss, plot_timeline,
                              timeline_artists)
from simlib.viz.style import KIND_LABELS, OKABE_ITO, run_label, style

# Artists of a timeline that appear as time passes; labels and axes stay.
_REVEALED_GIDS = ("span:", "messages", "message-heads", "barriers")


class Reveal:
    """Shows a figure drawn by :func:`draw_runs` as it stood at time t (t >= makespan shows everything)."""

    def __init__(self, fig: Figure, traces: Sequence[Trace], timelines: Sequence[Axes], loss_ax: Axes | None,
                 window: float | None = None, max_workers: int | None = None, title_sep: str = ": ") -> None:
        self.fig = fig
        self.title_sep = title_sep  # between a run's name and its waiting count (a line break in projector layout)
        self.traces = list(traces)
        self.timelines = list(timelines)
        self.loss_ax = loss_ax
        self.t_end = max((t.makespan for t in self.traces), default=1.0) or 1.0
        self.window = self.t_end if window is None else min(window, self.t_end)
        # Count only the rows drawn: a box saying "31 waiting" over 16 rows reads as a bug.
        self.rows = [tr.n_workers if max_workers is None else min(tr.n_workers, max_workers) for tr in self.traces]
        self._waits = [self._wait_columns(tr, n) for tr, n in zip(self.traces, self.rows)]
        lines = [] if loss_ax is None else list(loss_ax.lines)
        self._curves = [(ln, np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float))
                        for ln in lines if (ln.get_gid() or "").startswith("loss:")]
        self._marks = [(ln, float(ln.get_xdata()[0])) for ln in lines if (ln.get_gid() or "").startswith("reached:")]
        axes = self.timelines if loss_ax is None else [*self.timelines, loss_ax]
        self._cursors = [ax.axvline(self.t_end, color=OKABE_ITO["black"], linewidth=1.5 if ax is loss_ax else 2.5,
                                    zorder=6, gid="cursor") for ax in axes]
        # The waiting count lives in each timeline's title, above the rows: a box inside the axes hid rows.
        self._texts = [ax.title for ax in self.timelines]
        self._titles = [ax.get_title() for ax in self.timelines]
        self.t = self.t_end

    @staticmethod
    def _wait_columns(tr: Trace, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Start and end of every wait span of workers 0..rows-1, for counting who waits at t."""
        w = [(s.start, s.end) for s in tr.spans if s.kind == "wait" and 0 <= s.worker < rows]
        arr = np.asarray(w, dtype=float).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def waiting_at(self, i: int, t: float) -> int:
        """Number of drawn workers of run ``i`` inside a wait span at time t."""
        start, end = self._waits[i]
        return int(np.count_nonzero((start <= t) & (t < end)))

    def __call__(self, t: float) -> list[Artist]:
        """Reveal everything up to time t; returns the artists that changed (for FuncAnimation)."""
        self.t = t = float(min(max(t, 0.0), self.t_end))
        changed: list[Artist] = []
        for i, ax in enumerate(self.timelines):
            if self.window < self.t_end:
                # The timeline pans so the cursor stays in the last quarter of the window; the whole
                # run (t = t_end) shows its start, as drawn: the end of the longest run would show
                # the runs that finished sooner as empty axes.
                lo = min(max(0.0, t - 0.75 * self.window), self.t_end - self.window) if t < self.t_end else 0.0
                ax.set_xlim(lo, lo + self.window)
            # Clip to the part of the axes left of the cursor: the axes' own box, cut at t.
            x0, x1 = ax.get_xlim()
            y0, y1 = sorted(ax.get_ylim())
            box = TransformedBbox(Bbox([[x0, y0], [min(max(t, x0), x1), y1]]), ax.transData)
            for gid, art in timeline_artists(ax).items():
                if gid.startswith(_REVEALED_GIDS):
                    art.set_clip_box(box)
                    changed.append(art)
            waiting = f"{self.waiting_at(i, t)} of {self.rows[i]} waiting"
            self._texts[i].set_text(f"{run_label(self.traces[i])}{self.title_sep}{waiting}" if t < self.t_end
                                    else self._titles[i])
            changed.append(self._texts[i])
        for cursor in self._cursors:
            cursor.set_xdata([t, t])
            cursor.set_visible(t < self.t_end)
        for line, xs, ys in self._curves:
            line.set_data(xs[xs <= t], ys[xs <= t])
        for mark, when in self._marks:
            mark.set_visible(when <= t)
        return [*changed, *self._cursors, *(line for line, _, _ in self._curves), *(mark for mark, _ in self._marks)]


def messages_before(trace: Trace, t: float, n_workers: int) -> int:
    """Number of send/recv spans of the first ``n_workers`` workers that start before t."""
    return sum(1 for s in trace.spans if s.kind in ("send", "recv") and s.start < t and s.worker < n_workers)


def draw_runs(fig: Figure, traces: Sequence[Trace], target: float | None = None, max_workers: int = 16,
              title: str | None = None, window: float | None = None, projector: bool = False) -> Reveal:
    """Draw each run's timeline side by side above loss against time of all runs; title = :func:`finding`.

    ``window`` (seconds) zooms the timelines to [0, window] so single messages stay visible;
    arrows are drawn when the window holds at most ``MAX_ARROWS`` messages. A figure without
    a layout engine gets fixed margins, which keeps a live redraw from re-solving the layout.
    ``projector=True`` lays out a small figure whose text is large next to its plots (see
    :data:`PROJECTOR_MARGINS_PT`): fewer ticks, the time label once, run titles on two lines,
    the loss legend beside its axes.
    """
    positive_int("max_workers", max_workers)
    runs = _as_list(traces)
    has_quality = all(t.quality for t in runs)
    if target is None and has_quality:
        target = default_target(runs)
    k = len(runs)
    t_end = max(t.makespan for t in runs) or 1.0
    window = t_end if window is None else min(float(window), t_end)
    fixed = fig.get_layout_engine() is None
    # NOTE: a live redraw with the same runs keeps its axes and replaces only what they show:
    # building axes (ticks above all) was about half of a redraw. Tested pixel-equal to a fresh draw.
    layout = (k, has_quality, max_workers, projector, tuple(fig.get_size_inches()))
    kept = getattr(fig, "_simlib_runs_axes", None)
    reuse = kept is not None and kept[0] == layout and all(a.figure is fig for a in kept[1])
    if reuse:
        for a in kept[1]:
            _wipe(a)
        for leg in list(fig.legends):
            leg.remove()
    elif projector:
        fig.clear()
        cells = _projector_grid(fig, k, has_quality)
    else:
        fig.clear()
        margins = dict(left=0.09, right=0.98, top=0.82, bottom=0.08, hspace=0.35, wspace=0.06) if fixed else {}
        gs = fig.add_gridspec(2, k, height_ratios=[3, 2] if has_quality else [1, 0.001], **margins)
        cells = [gs[0, i] for i in range(k)], gs[1, :]
    with style():
        sep = "\n" if projector else ": "
        timelines: list[Axes] = []
        for i, tr in enumerate(runs):
            first = timelines[0] if timelines else None
            ax = kept[1][i] if reuse else fig.add_subplot(cells[0][i], sharex=first, sharey=first)
            arrows = messages_before(tr, window, max_workers) <= MAX_ARROWS
            plot_timeline(tr, ax=ax, max_workers=max_workers, legend=False, arrows=arrows,
                          title=f"{run_label(tr)}{sep}{tr.summary()['wait_fraction']:.0%} waiting")
            # Projector: at most three ticks without trailing zeros ("0.0025", not "0.00250"): at 14 pt more
            # ran into each other and into the next timeline's.
            ax.xaxis.set_major_locator(MaxNLocator(2 if projector else 4))
            if i:
                ax.set_ylabel("")
                ax.tick_params(labelleft=False)
            if projector:
                ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
                ax.title.set_fontsize(PROJECTOR_RUN_TITLE_PT)
                # The time label once: under the loss plot, or under the middle timeline without one.
                if has_quality or i != k // 2:
                    ax.set_xlabel("")
            timelines.append(ax)
        timelines[0].set_xlim(0.0, window)
        if projector:
            _clear_server_row(timelines[0])  # the timelines share their y ticks
        # The span colours are explained once, in a row under the title, so the plots keep the full width.
        # Projector: short names and tight spacing keep the legend to one row across the figure's width.
        handles = legend_handles(timelines, {**KIND_LABELS, **(_SHORT_KIND_LABELS if projector else {})})
        fig_h = fig.get_figheight() * 72
        place = dict(bbox_to_anchor=(0.5, 1 - PROJECTOR_MARGINS_PT["legend"] / fig_h), borderaxespad=0,
                     columnspacing=1.0, **_TIGHT_LEGEND) if projector else dict(bbox_to_anchor=(0.5, 0.935))
        fig.legend(handles=handles, loc="upper center", ncols=max(len(handles), 1), frameon=False, **place)
        loss_ax = None
        if has_quality:
            loss_ax = kept[1][k] if reuse else fig.add_subplot(cells[1])
            plot_loss(runs, x="time", ax=loss_ax, target=target, title="")
            loss_ax.set_xlim(0.0, t_end)
            if projector:
                loss_ax.xaxis.set_major_locator(MaxNLocator(5))
                loss_ax.yaxis.set_major_locator(MaxNLocator(3))
                # Beside the axes, not over the curves: inside, four rows would cover most of a short plot.
                loss_ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, borderaxespad=0.4,
                               labelspacing=0.3, **_TIGHT_LEGEND)
        heading = title if title is not None else (finding(runs, target) if target is not None else "")
        fig.suptitle(heading, y=1 - PROJECTOR_MARGINS_PT["pad"] / fig_h if projector else 0.99)
    fig._simlib_runs_axes = (layout, [*timelines, *([loss_ax] if loss_ax is not None else [])])
    return Reveal(fig, runs, timelines, loss_ax, window=window, max_workers=max_workers, title_sep=sep)


# Projector layout, in points from the figure's edges (its text is 14-20 pt, so the margins are
# fixed in points, not in fractions of a figure that is small on purpose): the title and one legend
# row above the two-line run titles; tick labels and one time label below; the loss legend right of
# the loss plot, where it hides no curve.
PROJECTOR_MARGINS_PT = {"pad": 3.0, "legend": 31.0, "top": 95.0, "left": 92.0, "right": 10.0, "legend_width": 190.0,
                        "bottom": 46.0, "between": 34.0, "wspace": 36.0}
PROJECTOR_RUN_TITLE_PT = 15
_SHORT_KIND_LABELS = {"send": "send", "recv": "receive", "down": "down"}
_TIGHT_LEGEND = dict(borderpad=0, handlelength=1.4, handletextpad=0.4)


def _clear_server_row(ax: Axes) -> None:
    """Drop the worker labels the large ticks would print over the 'servers' (or 'network') row's label."""
    ticks, labels = list(ax.get_yticks()), [t.get_text() for t in ax.get_yticklabels()]
    rows = [i for i, label in enumerate(labels) if not label.isdigit()]
    if not rows:
        return
    y0, y1 = ax.get_ylim()
    pt_per_row = ax.get_position().height * ax.get_figure().get_figheight() * 72 / abs(y1 - y0)
    room = 1.2 * float(ax.yaxis.get_ticklabels()[0].get_fontsize()) if labels else 0.0
    server = ticks[rows[0]]
    keep = [i for i, y in enumerate(ticks) if i in rows or abs(y - server) * pt_per_row >= room]
    ax.set_yticks([ticks[i] for i in keep], [labels[i] for i in keep])


def _projector_grid(fig: Figure, k: int, has_quality: bool) -> tuple[list, object]:
    """Cells for the k timelines and the loss plot, with :data:`PROJECTOR_MARGINS_PT` margins."""
    m = PROJECTOR_MARGINS_PT
    w, h = fig.get_figwidth() * 72, fig.get_figheight() * 72
    left, right, top, bottom = m["left"] / w, 1 - m["right"] / w, 1 - m["top"] / h, m["bottom"] / h
    split = bottom + (top - bottom - m["between"] / h) * 0.4 if has_quality else bottom
    col = (right - left) * w / k
    top_gs = fig.add_gridspec(1, k, left=left, right=right, top=top, bottom=split + m["between"] / h if has_quality
                              else bottom, wspace=m["wspace"] / max(col - m["wspace"], 1.0))
    loss_gs = fig.add_gridspec(1, 1, left=left, right=right - m["legend_width"] / w, top=split, bottom=bottom)
    return [top_gs[0, i] for i in range(k)], loss_gs[0, 0]


def _wipe(ax: Axes) -> None:
    """Remove what an axes shows (artists, legend, title, data limits), keeping the axes and its ticks."""
    for artist in [*ax.collections, *ax.lines, *ax.patches, *ax.texts, *ax.images, *ax.artists]:
        artist.remove()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.set_title("")
    ax.dataLim.set_points(Bbox.null().get_points())
    ax.ignore_existing_data_limits = True
    ax.set_autoscale_on(True)


# The page export_animation writes: no fonts, icons or scripts from elsewhere (player.html).
_PLAYER = string.Template(Path(__file__).with_name("player.html").read_text(encoding="utf-8"))


def _small_png(fig: Figure) -> bytes:
    """The figure as a PNG of at most 32 colours: the plots use a handful, and a palette PNG is ~4x smaller."""
    from PIL import Image

    fig.canvas.draw()
    rgb = Image.frombuffer("RGBA", fig.canvas.get_width_height(), bytes(fig.canvas.buffer_rgba())).convert("RGB")
    buf = io.BytesIO()
    rgb.quantize(colors=32, method=Image.Quantize.MEDIANCUT).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def export_animation(traces: Sequence[Trace], path: str, frames: int = 30, fps: float = 10.0,
                     progress: Callable[[float], None] | None = None, dpi: int = 60,
                     figsize: tuple[float, float] = (13.5, 8), **draw: Any) -> str:
    """Write the play-mode animation to ``path``: '.html' (self-contained, autoplays, no kernel needed) or '.gif'.

    ``draw`` goes to :func:`draw_runs` (``target``, ``max_workers``, ``window``): the frames reveal its
    figure from time 0 to the makespan. ``progress(fraction)`` is called after each frame is drawn.
    """
    positive("fps", fps)
    positive_int("frames", frames)
    ext = os.path.splitext(path)[1].lower()
    one_of("path extension", ext, (".html", ".gif"))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with style():
        # Fixed margins: a layout re-solved per frame would make the axes jump as the cursor text changes.
        fig = Figure(figsize=figsize, dpi=dpi)
        FigureCanvasAgg(fig)
        reveal = draw_runs(fig, traces, **draw)
        times = np.linspace(0.0, reveal.t_end, frames)
        done = (lambda k, n: None) if progress is None else (lambda k, n: progress((k + 1) / n))
        if ext == ".gif":
            from matplotlib.animation import FuncAnimation, PillowWriter

            FuncAnimation(fig, lambda k: reveal(times[k]), frames=frames, blit=False).save(
                path, writer=PillowWriter(fps=fps), dpi=dpi, progress_callback=done)
            return path
        uris = []
        for k, t in enumerate(times):
            reveal(t)
            uris.append('"data:image/png;base64,' + base64.b64encode(_small_png(fig)).decode("ascii") + '"')
            done(k, frames)
    title = html.escape(fig.get_suptitle() or "simlib animation")
    page = _PLAYER.substitute(title=title, last=frames - 1, frames=",\n".join(uris), interval=max(10, int(1000 / fps)))
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
