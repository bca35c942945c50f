"""Small figures the lessons share: curves, bars, staleness distributions, Gantt charts, traces side by side.

These draw arrays and traces only (no simulation here): a lesson computes, then calls one of
these with a title that states its finding. Everything draws in the projector style
(:func:`simlib.viz.style`), with the Okabe-Ito palette and fonts of at least 14 pt. Example::

    >>> ax = plot_curves([1, 2, 4], {"measured": [1.0, 1.9, 3.5]}, xlabel="workers",
    ...                  ylabel="speed-up (x)", title="3.5x on 4 workers")
    >>> ax.get_title()
    '3.5x on 4 workers'
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import cycle
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simlib import _validate as check
from simlib.trace import Trace
from simlib.viz.plots import _as_list, plot_loss, plot_timeline, styled_axes
from simlib.viz.style import OKABE_ITO, RUN_COLORS, style

Interval = tuple[float, float, str]
IDLE_COLOR = "#D9D9D9"
DARK_COLORS = (OKABE_ITO["blue"], OKABE_ITO["vermillion"], OKABE_ITO["black"])  # a label on them is white


def _need_title(title: Any, name: str = "", items: Any = True, what: str = "") -> None:
    """Figures state their finding: a title is required; and ``items`` (the argument ``name``) must hold a ``what``."""
    if not isinstance(title, str) or not title.strip():
        raise ValueError("title must state the figure's finding, e.g. '4 shards: 2.9x faster'")
    if not items:
        raise ValueError(f"{name} must hold at least one {what}")


@dataclass(frozen=True)
class CurveOptions:
    """:func:`plot_curves`' optional marks, given to it as keywords."""

    logx: bool = False  # a base-2 x axis (up to 8 points: each labelled with its value)
    logy: bool = False
    vline: float | None = None  # a dashed vertical reference line at this x, named vline_label in the legend
    vline_label: str = ""
    hline: float | None = None  # a dotted horizontal reference line at this y, named hline_label
    hline_label: str = ""
    markers: bool = True
    spread: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None  # label -> (low, high) band
    dashed: Sequence[str] = ()  # series drawn dashed without markers (a reference such as an ideal line)


def plot_curves(x: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str, title: str,
                ax: Axes | None = None, **options: Any) -> Axes:
    """One line per series against ``x`` (one value per x; NaN leaves a gap); ``options``: :class:`CurveOptions`.

    ``spread[label] = (low, high)`` shades that band around the series (say what it is in the
    label, e.g. '90% interval over 12 seeds'); series named in ``dashed`` are drawn dashed without
    markers (a reference such as an ideal line).
    """
    _need_title(title, "series", series, "curve")
    opts = check.options(CurveOptions, options, "plot_curves")
    spread, dashed = dict(opts.spread or {}), opts.dashed
    unknown = [k for k in [*spread, *dashed] if k not in series]
    if unknown:
        raise ValueError(f"spread/dashed name series that do not exist: {unknown}")
    xs = np.asarray(x, dtype=float)
    with styled_axes(ax, (9, 5.5)) as ax:
        for color, (label, ys) in zip(cycle(RUN_COLORS), series.items()):
            ys = np.asarray(ys, dtype=float)
            if ys.shape != xs.shape:
                raise ValueError(f"series: {label!r} has {ys.size} values for {xs.size} x values")
            ref = label in dashed
            ax.plot(xs, ys, marker="o" if opts.markers and not ref else None, color=color,
                    linestyle="--" if ref else "-", label=label, gid=f"curve:{label}")
            if label in spread:
                lo, hi = (np.asarray(b, dtype=float) for b in spread[label])
                if lo.shape != xs.shape or hi.shape != xs.shape:
                    raise ValueError(f"spread: {label!r} needs (low, high) with {xs.size} values each")
                ax.fill_between(xs, lo, hi, color=color, alpha=0.25, linewidth=0, gid=f"spread:{label}")
        for draw, at, text, linestyle, gid in ((ax.axvline, opts.vline, opts.vline_label, "--", "vline"),
                                               (ax.axhline, opts.hline, opts.hline_label, ":", "hline")):
            if at is not None:
                draw(at, color=OKABE_ITO["black"], linestyle=linestyle, linewidth=1.8, label=text or None, gid=gid)
        if opts.logx:
            ax.set_xscale("log", base=2)
            if len(xs) <= 8:  # few points: label each as a plain number; many would overlap
                ax.set_xticks(xs, [f"{v:g}" for v in xs])
        if opts.logy:
            ax.set_yscale("log")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.legend(loc="best")
    return ax


def plot_bars(values: Mapping[str, float], ylabel: str, title: str, ax: Axes | None = None, fmt: str = "{:.3g}",
              highlight: str | None = None, ylim: tuple[float, float] | None = None) -> Axes:
    """One bar per entry, its value written on it; ``highlight`` draws that bar in the loud colour.

    ``ylim`` zooms the value axis (say so in the title or label: bars no longer start at zero).
    """
    _need_title(title, "values", values, "bar")
    names = list(values)
    heights = np.array([values[k] for k in names], dtype=float)
    colors = [OKABE_ITO["vermillion"] if k == highlight else OKABE_ITO["blue"] for k in names]
    with styled_axes(ax, (max(6.0, 1.6 * len(names) + 2), 5)) as ax:
        bars = ax.bar(range(len(names)), np.nan_to_num(heights), color=colors, gid="bars")
        for b, h in zip(bars, heights):
            ax.annotate("never" if not np.isfinite(h) else fmt.format(h),
                        (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=14)
        ax.set_xticks(range(len(names)), names)
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.set(ylabel=ylabel, title=title)
        ax.grid(axis="x", visible=False)
    return ax


STALENESS_LABELS = {"staleness": "tau: updates applied between a read and its push",
                    "clock_lag": "clock lag: steps the rows read were behind the reader"}


def plot_staleness(traces: Sequence[Trace], title: str, field: str = "staleness", ax: Axes | None = None) -> Axes:
    """Each run's read staleness: the share of its pushes at each tau (or clock lag), its mean dashed."""
    _need_title(title)
    check.one_of("field", field, STALENESS_LABELS)
    if not traces or any(not t.updates for t in traces):
        raise ValueError("traces must be runs with at least one update each")
    values = [np.array([getattr(u, field) for u in t.updates]) for t in traces]
    top = int(max(v.max() for v in values))
    with styled_axes(ax, (9, 5)) as ax:
        for color, t, v in zip(cycle(RUN_COLORS), traces, values):
            share = np.bincount(v.clip(0), minlength=top + 1) / v.size
            ax.step(np.arange(top + 1), share, where="mid", color=color, linewidth=2.2,
                    label=f"{t.label} (mean {v.mean():.1f})", gid=f"staleness:{t.label}")
            ax.axvline(v.mean(), color=color, linestyle="--", linewidth=1.5, gid=f"mean:{t.label}")
        ax.set(xlabel=STALENESS_LABELS[field], ylabel="share of pushes", title=title)
        ax.legend(loc="best")
    return ax


def plot_gantt(rows: Mapping[str, Sequence[Interval]], xlabel: str, title: str, ax: Axes | None = None,
               idle: str = "idle") -> Axes:
    """A Gantt chart: one row per resource, a bar per (start, end, label) interval, labelled inside.

    Intervals whose label equals ``idle`` are drawn grey and hatched (a pipeline's bubble).
    """
    _need_title(title, "rows", rows, "resource")
    names = list(rows)
    labels = sorted({lab for iv in rows.values() for (_, _, lab) in iv if lab != idle})
    color_of = dict(zip(labels, cycle(RUN_COLORS)))
    span = max((end for iv in rows.values() for (_, end, _) in iv), default=1.0) or 1.0
    with styled_axes(ax, (12, 1.2 + 0.8 * len(names))) as ax:
        for y, name in enumerate(names):
            for start, end, lab in rows[name]:
                if end < start:
                    raise ValueError(f"rows: interval ({start}, {end}) of {name!r} ends before it starts")
                is_idle = lab == idle
                ax.barh(y, end - start, left=start, height=0.8, color=IDLE_COLOR if is_idle else color_of[lab],
                        hatch="//" if is_idle else None, edgecolor=OKABE_ITO["black"], linewidth=0.8,
                        gid="idle" if is_idle else f"op:{lab}")
                if not is_idle and len(labels) <= 24 and (end - start) >= 0.04 * span:  # no label on slivers
                    ax.text((start + end) / 2, y, lab, ha="center", va="center", fontsize=14,
                            color="#FFFFFF" if color_of[lab] in DARK_COLORS else "#000000")
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.set(xlabel=xlabel, title=title)
        ax.grid(axis="y", visible=False)
        if any(lab == idle for iv in rows.values() for (_, _, lab) in iv):
            ax.legend(handles=[Patch(facecolor=IDLE_COLOR, hatch="//", edgecolor=OKABE_ITO["black"], label=idle)],
                      loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax


def schedule_rows(grid: np.ndarray, slot: float = 1.0, prefix: str = "stage ",
                  item: str = "") -> dict[str, list[Interval]]:
    """Rows for :func:`plot_gantt` from grid[row, t] = item number or -1 (idle), each slot ``slot`` long."""
    grid = np.asarray(grid)
    if grid.ndim != 2:
        raise ValueError(f"grid must be 2-D (rows x slots), got shape {grid.shape}")
    return {f"{prefix}{r}": [(t * slot, (t + 1) * slot, "idle" if v < 0 else f"{item}{v}") for t, v in enumerate(row)]
            for r, row in enumerate(grid)}


def plot_traces_side_by_side(traces: Sequence[Trace], titles: Sequence[str] | None = None,
                             suptitle: str = "", max_workers: int = 8) -> Figure:
    """Each trace's timeline in its own column (its own time unit), its loss curve below it."""
    traces = _as_list(traces)
    if titles is not None and len(titles) != len(traces):
        raise ValueError(f"titles: {len(titles)} titles for {len(traces)} traces")
    k = len(traces)
    with style():
        fig = Figure(figsize=(7 * k, 9), layout="constrained")
        axes = fig.subplots(2, k, squeeze=False)
        for i, tr in enumerate(traces):
            title = titles[i] if titles is not None else f"{tr.substrate}: {tr.label}"
            plot_timeline(tr, ax=axes[0, i], max_workers=max_workers, legend=(i == k - 1), title=title, arrows=False)
            plot_loss(tr, ax=axes[1, i], title=f"{tr.substrate}: final {tr.metric} {tr.quality[-1].value:.4f}"
                      if tr.quality else tr.substrate)
        if suptitle:
            fig.suptitle(suptitle)
    return fig


def plot_link_load(traces: Sequence[Trace], width: float, title: str, worker: int | None = None,
                   t_max: float | None = None) -> Figure:
    """One panel per trace: bytes/s sent over time (:meth:`Trace.link_load`, bins of ``width`` s, up to ``t_max`` s)
    by ``worker`` on its link, or by all workers together (None: what the servers' in-links carry); a managed
    run's budget (``meta['config']['managed_bandwidth']``, times the workers when summed) dashed."""
    _need_title(title, "traces", traces, "Trace")
    if worker is not None and any(not 0 <= worker < t.n_workers for t in traces):
        raise ValueError(f"worker must be a worker of every trace (or None: all of them), got {worker}")
    with style():
        fig = Figure(figsize=(11, 2.2 + 2.2 * len(traces)), layout="constrained")
        axes = fig.subplots(len(traces), 1, sharex=True, squeeze=False)[:, 0]
        for ax, tr, color in zip(axes, traces, cycle(RUN_COLORS)):
            starts, load = tr.link_load(width)
            shown = starts < (tr.makespan if t_max is None else t_max)
            ys = (load.sum(axis=0) if worker is None else load[worker]) / 1e6
            idle = float(np.mean(ys == 0))  # over the whole run, not only what is shown
            ys = ys[shown]
            ax.fill_between(starts[shown] * 1e3, ys, step="post", color=color, alpha=0.8,
                            linewidth=0, gid=f"load:{tr.label}")
            budget = tr.meta.get("config", {}).get("managed_bandwidth")
            if budget:
                n = tr.n_workers if worker is None else 1
                ax.axhline(n * budget / 1e6, color=OKABE_ITO["black"], linestyle="--", linewidth=1.5,
                           label=f"budget {f'{n} x ' if n > 1 else ''}{budget / 1e6:g} MB/s", gid="budget")
                ax.legend(loc="upper right")
            ax.set_title(f"{tr.label}: nothing sent in {idle:.0%} of the run's {width * 1e3:g} ms bins", fontsize=14)
            ax.set_ylabel("MB/s sent")
        link = "all workers' links" if worker is None else f"worker {worker}'s link"
        axes[-1].set_xlabel(f"simulated time (ms), {link}")
        fig.suptitle(title)
    return fig
