"""The plots every substrate's :class:`~simlib.trace.Trace` is drawn with.

* :func:`plot_timeline` -- a Gantt chart of compute / send / recv / wait / down spans per worker,
  with barriers and message arrows;
* :func:`plot_loss` -- the metric of several runs against time or steps, with a target line;
* :func:`plot_speedup` -- speed-up against the number of workers, with the ideal line;
* :func:`compare_figure` -- timelines of each run plus loss against time and steps, titled with
  the finding (:func:`finding`).

All of them draw in the projector style (:mod:`simlib.viz.style`) and take their units from the
trace: simulated seconds for the simulator, wall seconds for real runs. Example::

    >>> from simlib.trace import Trace
    >>> t = Trace(label="BSP", substrate="sim", n_workers=2)
    >>> t.span(0, "compute", 0.0, 1.0, step=0); t.span(1, "compute", 0.0, 2.0, step=0)
    >>> t.span(0, "wait", 1.0, 2.0, step=0)
    >>> ax = plot_timeline(t)
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import cycle
from typing import Any, Union

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, PathPatch
from matplotlib.path import Path

from simlib._validate import one_of, positive_int
from simlib.trace import SPAN_KINDS, SpanLog, Trace, _columns
from simlib.viz.style import KIND_LABELS, KIND_STYLES, OKABE_ITO, RUN_COLORS, run_label, style, time_label

SpeedupInput = Union[Mapping[str, Mapping[int, float]], Mapping[str, Sequence[Trace]], Sequence[Trace]]

BAR_HEIGHT = 0.8
# Above this many messages the arrows turn into a grey haze that hides the spans, so they are left out.
MAX_ARROWS = 800
MAX_YTICKS = 16


@contextlib.contextmanager
def styled_axes(ax: Axes | None, figsize: tuple[float, float]) -> Iterator[Axes]:
    """In the projector style: ``ax``, or the axes of a new figure (made without pyplot, so nothing is shown by
    accident)."""
    with style():
        yield ax if ax is not None else Figure(figsize=figsize, layout="constrained").add_subplot()


def _as_list(traces: Trace | Iterable[Trace]) -> list[Trace]:
    """Accept one trace or many."""
    if isinstance(traces, Trace):
        return [traces]
    out = list(traces)
    if not out:
        raise ValueError("traces must hold at least one Trace")
    for t in out:
        if not isinstance(t, Trace):
            raise ValueError(f"traces must be Trace objects, got {type(t).__name__}")
    return out


# -- timeline -------------------------------------------------------------------------------


def barrier_times(trace: Trace, n_workers: int | None = None) -> np.ndarray:
    """Barrier instants: ``meta['barriers']`` if recorded, else times when >= n-1 workers leave a wait together.

    The slowest worker of a BSP step never waits, hence n - 1. Ends equal within 1e-9 of the
    makespan count as simultaneous.
    """
    if "barriers" in trace.meta:
        return np.asarray(sorted(float(b) for b in trace.meta["barriers"]), dtype=float)
    n = trace.n_workers if n_workers is None else n_workers
    ends = np.array([s.end for s in trace.spans if s.kind == "wait" and s.worker < n], dtype=float)
    if ends.size == 0 or n < 2:
        return np.empty(0)
    tol = max(trace.makespan, 1e-300) * 1e-9
    keys, counts = np.unique(np.round(ends / tol), return_counts=True)
    return np.sort(keys[counts >= max(2, n - 1)] * tol)


def _span_columns(trace: Trace, n_shown: int, t_end: float) -> dict[str, np.ndarray]:
    """The spans of the shown workers as columns, clipped to ``t_end`` (inf: not clipped)."""
    worker, kind, start, end = _columns(trace.spans, SpanLog)[:4]
    keep = (worker < n_shown) & (start < t_end)
    return {"worker": worker[keep].astype(float), "kind": np.asarray(SPAN_KINDS, dtype=object)[kind[keep]],
            "start": start[keep], "end": np.minimum(end[keep], t_end)}


def _bars_path(start: np.ndarray, end: np.ndarray, y: np.ndarray) -> Path:
    """Rectangles [start, end] x [y - h/2, y + h/2] as one compound path (five vertices per bar)."""
    # NOTE: one compound path per kind replaces a PolyCollection (one Path object per bar); for
    # 16 workers x 100 steps x 3 runs it cuts building the timelines from ~0.25 s to ~0.02 s.
    lo, hi = y - BAR_HEIGHT / 2, y + BAR_HEIGHT / 2
    corners = ((start, lo), (start, hi), (end, hi), (end, lo), (start, lo))
    verts = np.stack([np.stack(p, -1) for p in corners], axis=1).reshape(-1, 2)
    return Path(verts, np.tile(np.array(_BAR_CODES, dtype=Path.code_type), len(start)))


_BAR_CODES = (Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY)


def timeline_artists(ax: Axes, prefix: str = "") -> dict[str, Artist]:
    """The artists :func:`plot_timeline` tagged on ``ax``, by gid (``span:<kind>``, ``messages``, ``barriers``, ...)."""
    return {a.get_gid(): a for a in ax.get_children() if (a.get_gid() or "").startswith(prefix) and a.get_gid()}


# The legend's lines after the span colours, each shown where the timelines have an artist of its gid.
LINE_HANDLES = {"barriers": dict(linestyle="--", linewidth=1.2, label="barrier"),
                "messages": dict(linewidth=0.8, marker=".", label="message")}


def legend_handles(axes: Sequence[Axes], labels: Mapping[str, str] = KIND_LABELS) -> list[Artist]:
    """Legend entries for what timelines drawn by :func:`plot_timeline` on ``axes`` show: each kind of span
    (named by ``labels``), then barriers and messages."""
    gids = {gid for ax in axes for gid in timeline_artists(ax)}
    return [*(Patch(label=labels[k], **KIND_STYLES[k]) for k in SPAN_KINDS if f"span:{k}" in gids),
            *(Line2D([], [], color=OKABE_ITO["black"], **kw) for gid, kw in LINE_HANDLES.items() if gid in gids)]


def _message_segments(topology: str, cols: dict[str, np.ndarray], n_shown: int, server_y: float) -> np.ndarray:
    """Message paths as (n, 2, 2) segments: push worker -> server (or ring neighbour), pull server -> worker."""
    segs = []
    # A ring has no pull: each worker sends to its neighbour.
    for kind in ("send", "recv") if topology != "allreduce" else ("send",):
        mask = cols["kind"] == kind  # none: adds no segment
        w = cols["worker"][mask]
        peer = (w + 1) % n_shown if topology == "allreduce" else np.full_like(w, server_y)
        src, dest = (w, peer) if kind == "send" else (peer, w)
        segs.append(np.stack([np.stack([cols["start"][mask], src], -1), np.stack([cols["end"][mask], dest], -1)], 1))
    return np.concatenate(segs)


def plot_timeline(trace: Trace, ax: Axes | None = None, max_workers: int = 32, t_max: float | None = None,
                  arrows: bool | None = None, barriers: bool = True, legend: bool = True,
                  title: str | None = None) -> Axes:
    """Gantt chart of each worker's spans over [0, t_max]: colour = kind, dashed lines = barriers.

    Shows the first ``max_workers`` workers. Message arrows (push to the server row, pull back,
    or to the ring neighbour for all-reduce) are drawn when ``arrows`` is True, or by default
    when there are at most ``MAX_ARROWS`` messages. Artists carry gids (``span:<kind>``,
    ``barriers``, ``messages``) so tests and animations can find them. Returns the axes.
    """
    positive_int("max_workers", max_workers)
    if t_max is not None and not (isinstance(t_max, (int, float)) and t_max > 0):
        raise ValueError(f"t_max must be a number > 0 or None, got {t_max!r}")
    n_shown = min(trace.n_workers, max_workers)
    with styled_axes(ax, (12, 1.5 + 0.35 * n_shown)) as ax:
        t_end = math.inf if t_max is None else t_max
        cols = _span_columns(trace, n_shown, t_end)
        for kind in SPAN_KINDS:
            mask = cols["kind"] == kind
            if not mask.any():
                continue
            # add_artist clips the bars to the axes, and leaves them out of autoscaling (the limits are set below).
            ax.add_artist(PathPatch(_bars_path(cols["start"][mask], cols["end"][mask], cols["worker"][mask]),
                                    gid=f"span:{kind}", label=KIND_LABELS[kind], **KIND_STYLES[kind]))

        server_y = -1.0 - BAR_HEIGHT / 2
        topology = str(trace.meta.get("config", {}).get("topology", trace.meta.get("topology", "ps")))
        segs = _message_segments(topology, cols, n_shown, server_y)
        draw_arrows = (len(segs) <= MAX_ARROWS) if arrows is None else arrows
        has_server_row = draw_arrows and len(segs) > 0 and server_y in set(segs[:, :, 1].ravel())
        if draw_arrows and len(segs):
            # NOTE: one NaN-separated line instead of a LineCollection (one Path per message): ~10x
            # cheaper to build for 3,000 messages.
            xs, ys = np.concatenate([segs, np.full((len(segs), 1, 2), np.nan)], axis=1).reshape(-1, 2).T
            ax.plot(xs, ys, color=OKABE_ITO["black"], linewidth=0.6, alpha=0.35, gid="messages", scalex=False,
                    scaley=False)
            # A dot at each arrival gives the direction without one FancyArrow per message.
            ax.plot(segs[:, 1, 0], segs[:, 1, 1], linestyle="none", marker=".", markersize=4, alpha=0.6,
                    color=OKABE_ITO["black"], gid="message-heads", scalex=False, scaley=False, zorder=3)

        bt = barrier_times(trace, n_shown) if barriers else np.empty(0)
        bt = bt[bt <= t_end]
        if bt.size:
            ax.vlines(bt, -0.5 - (1.0 if has_server_row else 0.0), n_shown - 0.5,
                      colors=OKABE_ITO["black"], linestyles="--", linewidths=1.2, zorder=4, gid="barriers")

        ax.set_xlim(0.0, t_max if t_max is not None else (trace.makespan or 1.0))
        ax.set_ylim(n_shown - 0.5, -0.5 - (1.2 if has_server_row else 0.0))  # worker 0 on top
        # As many worker labels as fit the axes' height at the tick font size (1.6 lines each).
        height_pt = ax.get_position().height * ax.get_figure().get_figheight() * 72
        fits = max(2, int(height_pt / (1.6 * float(matplotlib.rcParams["ytick.labelsize"]))))
        stride = max(1, math.ceil(n_shown / min(MAX_YTICKS, fits)))
        ticks = list(range(0, n_shown, stride))
        labels = [str(w) for w in ticks]
        if has_server_row:
            ticks, labels = [server_y] + ticks, ["servers" if topology == "ps" else "network"] + labels
        ax.set_yticks(ticks, labels)
        ax.grid(False)
        shown = f" (first {n_shown} of {trace.n_workers})" if n_shown < trace.n_workers else ""
        if title is None:
            title = f"{run_label(trace)}: workers wait {trace.summary()['wait_fraction']:.0%} of the time"
        ax.set(xlabel=time_label(trace), ylabel="worker" + shown, title=title)
        handles = legend_handles([ax]) if legend else []
        if handles:
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax


# -- loss -----------------------------------------------------------------------------------


X_AXES = ("time", "steps", "rounds")  # what loss is drawn against; a round is one step of every worker


def _fmt_at(reached: float, x: str) -> str:
    """When a run reached its target: seconds with three significant figures (x='time'), else the step or round."""
    return f"{reached:.3g} s" if x == "time" else f"{x[:-1]} {reached:.4g}"


def _reached(tr: Trace, target: float, x: str) -> float | None:
    """Time, steps (updates applied) or rounds (steps / workers) until ``tr`` first reaches ``target``."""
    if x == "time":
        return tr.time_to(target)
    steps = tr.steps_to(target)
    return steps / tr.n_workers if steps is not None and x == "rounds" else steps


def metric_name(metric: str) -> str:
    """A trace's metric as words for a reader: 'log_likelihood' -> 'log likelihood'."""
    return metric.replace("_", " ")


def plot_loss(traces: Trace | Iterable[Trace], x: str = "time", ax: Axes | None = None, target: float | None = None,
              title: str | None = None) -> Axes:
    """The metric of each run against time (``x='time'``), applied updates (``x='steps'``) or rounds of every
    worker (``x='rounds'``, steps / workers: the table's rounds).

    With ``target`` a dashed horizontal line is drawn and each run's first crossing is marked,
    its time (or step) quoted in the legend.
    """
    one_of("x", x, X_AXES)
    runs = _as_list(traces)
    with styled_axes(ax, (9, 5.5)) as ax:
        for color, tr in zip(cycle(RUN_COLORS), runs):
            per = tr.n_workers if x == "rounds" else 1
            xs = [q.time if x == "time" else q.step / per for q in tr.quality]
            ys = [q.value for q in tr.quality]
            reached = None if target is None else _reached(tr, target, x)
            label = run_label(tr) + ("" if target is None else " (not reached)" if reached is None
                                     else f" (at {_fmt_at(reached, x)})")
            if reached is not None:
                ax.plot([reached], [target], marker="o", markersize=11, color=color, markeredgecolor=OKABE_ITO["black"],
                        linestyle="none", zorder=5, gid=f"reached:{run_label(tr)}")
            ax.plot(xs, ys, color=color, label=label, gid=f"loss:{run_label(tr)}")
        if target is not None:
            ax.axhline(target, color=OKABE_ITO["black"], linestyle="--", linewidth=1.8,
                       label=f"target {metric_name(runs[0].metric)} {target:.3g}", gid="target")
        if title is None:
            title = finding(runs, target, x=x) if target is not None else f"{metric_name(runs[0].metric)} against {x}"
        # One unit for a shared time axis; it says so when simulated and real runs are mixed.
        times = {time_label(t) for t in runs}
        x_label = {"time": times.pop() if len(times) == 1 else "time (seconds; simulated and wall)",
                   "steps": "steps (updates applied)", "rounds": "rounds (one step of every worker)"}[x]
        ax.set(xlabel=x_label, ylabel=metric_name(runs[0].metric), title=title)
        ax.legend(loc="upper right")
    return ax


# -- speed-up -------------------------------------------------------------------------------


def _trace_cost(tr: Trace, target: float | None) -> float:
    """Time to ``target``, or without a target the time per applied update (inverse throughput)."""
    if target is not None:
        t = tr.time_to(target)
        return math.nan if t is None else t
    applied = tr.summary()["updates_applied"]
    return tr.makespan / applied if applied else math.nan


def speedup_table(results: SpeedupInput, target: float | None = None) -> dict[str, dict[int, float]]:
    """Normalise the inputs of :func:`plot_speedup` to {label: {n_workers: time}}."""
    if not isinstance(results, Mapping):  # a list of traces: grouped by protocol label
        grouped: dict[str, list[Trace]] = {}
        for tr in _as_list(results):
            grouped.setdefault(str(tr.meta.get("protocol_label") or tr.label), []).append(tr)
        results = grouped
    return {str(label): ({int(n): float(t) for n, t in runs.items()} if isinstance(runs, Mapping)
                         else {tr.n_workers: _trace_cost(tr, target) for tr in _as_list(runs)})
            for label, runs in results.items()}


def speedups(times: Mapping[int, float]) -> dict[int, float]:
    """S(n) = n0 * T(n0) / T(n) against the smallest measured n0 (n0 = 1 gives the usual T(1) / T(n))."""
    n0 = min(times)
    return {n: n0 * times[n0] / times[n] for n in sorted(times) if times[n] > 0 and math.isfinite(times[n])}


def plot_speedup(results: SpeedupInput, ax: Axes | None = None, target: float | None = None) -> Axes:
    """Speed-up against workers per run, S(n) = n0 T(n0) / T(n), with the ideal S(n) = n.

    ``results`` is {label: {n_workers: seconds}}, {label: [traces]} or a list of traces
    (grouped by protocol label). For traces the time is the time to ``target`` when given,
    else the time per applied update.
    """
    table = speedup_table(results, target)
    if not table or not any(table.values()):
        raise ValueError("results must hold at least one run time")
    with styled_axes(ax, (8, 6)) as ax:
        all_n = sorted({n for times in table.values() for n in times})
        ax.plot(all_n, all_n, color=OKABE_ITO["black"], linestyle="--", linewidth=2, label="ideal (S = n)", gid="ideal")
        ends: list[tuple[int, float, str]] = []
        for color, (label, times) in zip(cycle(RUN_COLORS), table.items()):
            s = speedups(times) if times else {}
            ns = sorted(s)
            ax.plot(ns, [s[n] for n in ns], marker="o", color=color, label=label, gid=f"speedup:{label}")
            if ns:
                ends.append((ns[-1], s[ns[-1]], label))
        if all_n[-1] / all_n[0] >= 16:  # all_n is not empty: some run has a time
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
        ax.set(xlabel="workers", ylabel=f"speed-up (x, vs {all_n[0]} worker{'s' if all_n[0] > 1 else ''})")
        if ends:
            n_best, s_best, label_best = max(ends)
            ax.set_title(f"{label_best}: {s_best:.1f}x on {n_best} workers (ideal {n_best}x)")
        ax.legend(loc="upper left")
    return ax


# -- comparison -----------------------------------------------------------------------------


def _round_toward(x: float, up: bool, digits: int = 3) -> float:
    """Round to ``digits`` significant figures, up or down, so a reachable target stays reachable."""
    if x == 0 or not math.isfinite(x):
        return x
    scale = 10 ** (math.floor(math.log10(abs(x))) - digits + 1)
    return (math.ceil(x / scale) if up else math.floor(x / scale)) * scale


def default_target(traces: Trace | Iterable[Trace], margin: float = 0.05) -> float:
    """A target every run reaches: the worst run's best value, loosened by ``margin`` of the range."""
    runs = _as_list(traces)
    with_q = [t for t in runs if t.quality]
    if not with_q:
        raise ValueError("traces have no quality points to choose a target from")
    lower = runs[0].lower_is_better
    best, worst = (min, max) if lower else (max, min)
    worst_best = worst(best(q.value for q in t.quality) for t in with_q)
    start = worst(t.quality[0].value for t in with_q)
    return _round_toward(worst_best + margin * (start - worst_best), up=lower)


def _fmt_ratio(r: float) -> str:
    """1.37 -> '1.4x', 1.04 -> '1.04x' (two decimals only where one would read as 1.0x)."""
    return f"{r:.2f}x" if r < 1.095 else f"{r:.1f}x"


def _is_reference(tr: Trace) -> bool:
    """BSP is the baseline the lessons compare against."""
    proto = str(tr.meta.get("config", {}).get("protocol", "")).lower()
    return proto == "bsp" or run_label(tr).upper().startswith("BSP")


def finding(traces: Trace | Iterable[Trace], target: float | None = None, x: str = "time") -> str:
    """One sentence computed from the runs, e.g. 'SSP(3) reaches loss 0.45 1.4x sooner than BSP'.

    Compares the first run to reach ``target`` (default :func:`default_target`) with BSP (or
    with the runner-up when BSP is first), by time, steps or rounds.
    """
    one_of("x", x, X_AXES)
    runs = _as_list(traces)
    if target is None:
        target = default_target(runs)
    cost = {run_label(t): _reached(t, target, x) for t in runs}
    reached = {k: v for k, v in cost.items() if v is not None}
    goal = f"{metric_name(runs[0].metric)} {target:.3g}"
    if not reached:
        return f"No run reaches {goal}"
    winner = min(reached, key=lambda k: reached[k])
    ref = next((run_label(t) for t in runs if _is_reference(t)), run_label(runs[0]))
    sooner = "sooner" if x == "time" else f"fewer {x}"
    if len(runs) == 1:
        return f"{winner} reaches {goal} at {_fmt_at(reached[winner], x)}"
    # Runs within 0.5% of the first are a tie: "1.00x sooner" would overstate a difference of noise.
    tied = [k for k in reached if reached[k] <= reached[winner] * 1.005]
    if len(tied) > 1 and (ref in tied or len(tied) == len(runs)):
        names = ", ".join(tied[:-1]) + f" and {tied[-1]}"
        return f"{names} reach {goal} {'at the same time' if x == 'time' else f'in the same number of {x}'}"
    if winner == ref:
        others = {k: v for k, v in reached.items() if k != ref}
        if not others:
            return f"{ref} reaches {goal}; no other run does"
        second = min(others, key=lambda k: others[k])
        ratio = others[second] / reached[ref] if reached[ref] > 0 else math.inf
        return f"{ref} reaches {goal} first, {_fmt_ratio(ratio)} {sooner} than {second}"
    if ref not in reached:
        return f"{winner} reaches {goal} at {_fmt_at(reached[winner], x)}; {ref} never does"
    ratio = reached[ref] / reached[winner] if reached[winner] > 0 else math.inf
    return f"{winner} reaches {goal} {_fmt_ratio(ratio)} {sooner} than {ref}"


def compare_figure(traces: Trace | Iterable[Trace], target: float | None = None, max_workers: int = 16,
                   figsize: tuple[float, float] | None = None) -> Figure:
    """The comparison figure: each run's timeline (shared time axis) beside loss against time and rounds.

    The title is :func:`finding`, computed from the runs, so the figure states its result.
    """
    runs = _as_list(traces)
    if target is None and any(t.quality for t in runs):
        target = default_target(runs)
    k = len(runs)
    with style():
        fig = Figure(figsize=figsize or (20, max(8.0, 3.6 * k)), layout="constrained")
        gs = fig.add_gridspec(2 * k, 2, width_ratios=[3, 2])
        t_end = max(t.makespan for t in runs) or 1.0
        first = None
        for i, tr in enumerate(runs):
            ax = fig.add_subplot(gs[2 * i : 2 * i + 2, 0], sharex=first)
            first = first or ax
            plot_timeline(tr, ax=ax, max_workers=max_workers, legend=(i == 0))
            ax.set_xlim(0.0, t_end)
            if i < k - 1:
                ax.set_xlabel("")
        if target is not None:
            ax_t = fig.add_subplot(gs[0:k, 1])
            ax_s = fig.add_subplot(gs[k : 2 * k, 1])
            plot_loss(runs, x="time", ax=ax_t, target=target, title=f"{metric_name(runs[0].metric)} against time")
            plot_loss(runs, x="rounds", ax=ax_s, target=target, title=finding(runs, target, x="rounds"))
            fig.suptitle(finding(runs, target))
        else:
            fig.suptitle("Timelines of " + ", ".join(run_label(t) for t in runs))
    return fig


def save_figure(fig: Figure, path: str, **kwargs: Any) -> str:
    """Write ``fig`` (PNG, SVG, PDF by extension) in the projector style's resolution; returns the path."""
    with style():
        fig.savefig(path, **kwargs)
    return path
