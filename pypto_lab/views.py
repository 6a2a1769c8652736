"""Plots of simulator results, as plain functions that return matplotlib Figures.

Every number drawn comes from a `KernelReport`; nothing here estimates anything of its own.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .hw.chip import PIPES

PIPE_COLOURS = {
    "MTE2": "#4c72b0", "MTE1": "#55a868", "CUBE": "#c44e52", "FIXP": "#8172b2",
    "VECTOR": "#dd8452", "MTE3": "#937860", "SCALAR": "#8c8c8c",
}


def plot_swimlane(report, core: int | None = None, max_instructions: int = 4000) -> Figure:
    """Pipes x time of one core (default: the first core that has work): a bar per instruction."""
    tl = report.instructions
    if core is None:
        core = int(tl.core[0]) if len(tl) else 0
    sel = np.flatnonzero(tl.core == core)[:max_instructions]
    fig = Figure(figsize=(10, 3.2))
    ax = fig.add_subplot()
    writeback = tl.kinds.index("HBM write-back") if "HBM write-back" in tl.kinds else -1
    for lane, name in enumerate(PIPES):
        on_lane = sel[tl.pipe[sel] == lane]
        for wb in (False, True):
            idx = on_lane[(tl.kind[on_lane] == writeback) == wb]
            if idx.size:
                ax.broken_barh(list(zip(tl.start[idx], tl.end[idx] - tl.start[idx])), (lane - 0.4, 0.8),
                               facecolors="white" if wb else PIPE_COLOURS[name],
                               edgecolor=PIPE_COLOURS[name] if wb else "white", hatch="////" if wb else None,
                               linewidth=0.3, label="HBM write-back (holds the read port)" if wb else name)
    if writeback >= 0 and np.any(tl.kind[sel] == writeback):
        ax.legend(handles=[h for h in ax.collections if h.get_label().startswith("HBM")], loc="lower right",
                  fontsize="small")
    ax.set_yticks(range(len(PIPES)), PIPES)
    ax.invert_yaxis()
    ax.set_xlabel("cycles")
    title = f"{report.name} on {report.chip}, core {core}: {report.cycles:,.0f} cycles"
    if len(sel) == max_instructions:
        title += f" (first {max_instructions} instructions)"
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_pipe_busy(report) -> Figure:
    """Busy fraction of each pipe on the busiest core."""
    fig = Figure(figsize=(6, 2.8))
    ax = fig.add_subplot()
    names = [p for p in PIPES if report.pipe_busy.get(p)]
    frac = [report.pipe_busy[p] / report.cycles for p in names]
    ax.barh(names, frac, color=[PIPE_COLOURS[p] for p in names])
    ax.set_xlim(0, 1)
    ax.set_xlabel("busy fraction of the kernel's cycles")
    ax.invert_yaxis()
    ax.set_title(f"{report.name}: pipe occupancy")
    fig.tight_layout()
    return fig
