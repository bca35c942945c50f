"""Plots and live widgets for traces from every substrate (:mod:`simlib.trace`).

The static plots (:mod:`simlib.viz.plots`) need only matplotlib; the live lecture panel lives in
:mod:`simlib.viz.live` (ipywidgets + ipympl) and is imported on demand.
"""
from simlib.viz.plots import (
    barrier_times,
    compare_figure,
    default_target,
    finding,
    plot_loss,
    plot_speedup,
    plot_timeline,
    save_figure,
    speedup_table,
    speedups,
)
from simlib.viz.style import KIND_COLORS, OKABE_ITO, PROJECTOR_RC, RUN_COLORS, style, time_label

__all__ = [
    "plot_timeline",
    "plot_loss",
    "plot_speedup",
    "compare_figure",
    "finding",
    "default_target",
    "barrier_times",
    "speedup_table",
    "speedups",
    "save_figure",
    "style",
    "time_label",
    "PROJECTOR_RC",
    "OKABE_ITO",
    "RUN_COLORS",
    "KIND_COLORS",
]
