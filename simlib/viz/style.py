"""Projector style: large fonts, high contrast, the Okabe-Ito colour-blind-safe palette, units per substrate.

Every plot in :mod:`simlib.viz` draws inside :func:`style`, so a figure made in a lesson, by the
CLI or by the live panel looks the same on a projector. Example::

    >>> import matplotlib.pyplot as plt
    >>> with style():
    ...     fig, ax = plt.subplots()
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cycler import cycler

from simlib.trace import SPAN_KINDS, Trace

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies.
OKABE_ITO: dict[str, str] = {"blue": "#0072B2", "orange": "#E69F00", "green": "#009E73", "vermillion": "#D55E00",
                             "purple": "#CC79A7", "sky": "#56B4E9", "yellow": "#F0E442", "black": "#000000"}

# Order for runs drawn side by side: the darkest, most distinct hues first (yellow is weak on white).
RUN_COLORS: tuple[str, ...] = tuple(OKABE_ITO[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky",
                                                             "black", "yellow"))

# Each kind of span differs from the others in lightness as well as hue, so the timeline reads in grey print
# and for every common colour-vision deficiency: compute dark blue, pull mid sky blue, push light yellow (a rim
# would darken it: most pushes are slivers beside a dark compute bar, which is what they are read against), wait
# vermilion crossed by white hatching (its lightness is compute's; the hatching tells them apart in grey), a
# failed worker black. Waiting is the cost the lessons are about, so it gets the loudest hue.
KIND_COLORS: dict[str, str] = {"compute": OKABE_ITO["blue"], "send": OKABE_ITO["yellow"], "recv": OKABE_ITO["sky"],
                               "wait": OKABE_ITO["vermillion"], "down": OKABE_ITO["black"]}
assert set(KIND_COLORS) == set(SPAN_KINDS)
# Patch keyword arguments of each kind (bars and legend alike); a hatch is drawn in the edge colour.
KIND_STYLES: dict[str, dict[str, Any]] = {kind: {"facecolor": color, "edgecolor": "none", "linewidth": 0}
                                          for kind, color in KIND_COLORS.items()}
KIND_STYLES["wait"].update(edgecolor="#FFFFFF", hatch="///")

KIND_LABELS: dict[str, str] = {"compute": "compute", "send": "send (push)", "recv": "receive (pull)", "wait": "wait",
                               "down": "down (failed)"}

MIN_FONT_PT = 14

PROJECTOR_RC: dict[str, Any] = {
    "font.size": 16,
    "axes.titlesize": 18,
    "axes.titleweight": "bold",
    "axes.labelsize": 16,
    **dict.fromkeys(("xtick.labelsize", "ytick.labelsize", "legend.fontsize", "legend.title_fontsize"), MIN_FONT_PT),
    "figure.titlesize": 20,
    "figure.titleweight": "bold",
    "axes.prop_cycle": cycler(color=list(RUN_COLORS)),
    # Black on white: text, ticks and frames black; figure, axes and saved files white.
    **dict.fromkeys(("axes.edgecolor", "axes.labelcolor", "xtick.color", "ytick.color", "text.color"), "#000000"),
    **dict.fromkeys(("figure.facecolor", "axes.facecolor", "savefig.facecolor"), "#FFFFFF"),
    "axes.linewidth": 1.5,
    "axes.grid": True,
    "grid.color": "#B0B0B0",
    "grid.alpha": 0.5,
    "lines.linewidth": 3.0,
    "lines.markersize": 9,
    "savefig.bbox": "tight",
    "figure.dpi": 100,
    "savefig.dpi": 120,
}


@contextlib.contextmanager
def style() -> Iterator[None]:
    """Draw everything created inside the block in the projector style (fonts >= 14 pt, Okabe-Ito)."""
    import matplotlib

    with matplotlib.rc_context(PROJECTOR_RC):
        yield


def time_label(trace: Trace) -> str:
    """The time axis label with its unit: simulated seconds for the simulator, wall seconds otherwise."""
    return "time (simulated seconds)" if trace.substrate == "sim" else "time (wall seconds)"


def run_label(trace: Trace) -> str:
    """A run's name for legends and titles: the protocol label the simulator records, else ``trace.label``."""
    return str(trace.label or trace.meta.get("protocol_label") or "run")
