"""Plots of traces from every substrate (:mod:`simlib.trace`); draws traces, runs nothing.

The static plots (:mod:`simlib.viz.plots`) and the play/export animation (:mod:`simlib.viz.anim`)
need only matplotlib; the live lecture panel that runs simulations is in :mod:`simlib.app`.
"""
from simlib.viz.lesson_plots import (plot_bars, plot_curves, plot_gantt, plot_link_load, plot_staleness,
                                    plot_traces_side_by_side, schedule_rows)
from simlib.viz.plots import (barrier_times, compare_figure, default_target, finding, plot_loss, plot_speedup,
                              plot_timeline, save_figure, speedup_table, speedups)
from simlib.viz.style import KIND_COLORS, OKABE_ITO, PROJECTOR_RC, RUN_COLORS, style, time_label

__all__ = ["plot_timeline", "plot_loss", "plot_speedup", "compare_figure", "finding", "default_target", "barrier_times",
           "speedup_table", "speedups", "save_figure", "plot_curves", "plot_bars", "plot_staleness", "plot_link_load",
           "plot_gantt", "schedule_rows", "plot_traces_side_by_side", "style", "time_label", "PROJECTOR_RC",
           "OKABE_ITO", "RUN_COLORS", "KIND_COLORS"]
