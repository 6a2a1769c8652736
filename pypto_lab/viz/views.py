"""Plots of simulator results, as plain functions that return matplotlib Figures.

Every number drawn comes from a `KernelReport`; nothing here estimates anything of its own.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..analysis.memory_plan import memory_plan
from ..capture.graph import Graph
from ..hw.chip import DTYPE_BYTES, PIPES, get_chip

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
    # a pto RunResult sums pipe time over all cores; its busiest core's is pipe_busy_max_core
    busy = getattr(report, "pipe_busy_max_core", None) or report.pipe_busy
    names = [p for p in PIPES if busy.get(p)]
    frac = [busy[p] / report.cycles for p in names]
    ax.barh(names, frac, color=[PIPE_COLOURS[p] for p in names])
    ax.set_xlim(0, 1)
    ax.set_xlabel("busy fraction of the kernel's cycles")
    ax.invert_yaxis()
    ax.set_title(f"{report.name}: pipe occupancy")
    fig.tight_layout()
    return fig


# ---- helpers --------------------------------------------------------------------------------

def _unwrap(obj):
    """(graph, report, optimized) of an OptimizedModel, a Report or a Graph (missing ones None)."""
    if isinstance(obj, Graph):
        return obj, None, None
    if hasattr(obj, "graph") and hasattr(obj, "report"):
        return obj.graph, obj.report(), obj
    if hasattr(obj, "kernels") and hasattr(obj, "passes"):
        return None, obj, None
    raise TypeError(f"expected an OptimizedModel, a Report or a Graph, got {type(obj).__name__}")


def _report_of(obj):
    _, report, _ = _unwrap(obj)
    if report is None:
        raise TypeError(f"this view needs a Report or an OptimizedModel, got {type(obj).__name__}")
    return report


def _mb(nbytes: float) -> float:
    return nbytes / 1e6


# ---- fusion graph ---------------------------------------------------------------------------

FUSION_PASSES = ("fold_batchnorm", "fuse_conv_bn_relu", "fuse_layernorm", "fuse_attention", "fuse_elementwise")


def declined_fusions(report) -> dict[str, str]:
    """Node name -> why a fusion pass declined to fuse it: the notes the fusion passes wrote about
    that node."""
    out: dict[str, str] = {}
    for step in report.passes:
        if step.name not in FUSION_PASSES:
            continue
        for note in step.notes:
            if note.node:
                out.setdefault(note.node, f"{step.name}: {note.reason}")
    return out


def _in_block(node, block: str | None) -> bool:
    return block is None or node.module == block or node.module.startswith(block + ".")


def graph_layout(graph, block: str | None = None) -> dict:
    """The drawn nodes of ``graph`` (views skipped and looked through), restricted to the modules
    under ``block``: ``{"nodes", "pos" (name -> (x, depth)), "edges", "group" (name -> kernel key)}``.
    Depth is the longest path from the block's inputs; x is the order within a depth, centred."""
    producers = graph.producers()

    def is_view(n) -> bool:
        return n.is_view

    def sources(name: str) -> list[str]:
        n = producers.get(name)
        if n is None:
            return []
        if is_view(n):
            return [s for i in n.inputs for s in sources(i)]
        return [name]

    nodes = [n for n in graph.nodes if not is_view(n) and _in_block(n, block)]
    drawn = {n.name for n in nodes}
    depth: dict[str, int] = {}
    edges: list[tuple[str, str]] = []
    for n in nodes:
        preds = sorted({s for i in n.inputs for s in sources(i) if s in drawn})
        edges += [(p, n.name) for p in preds]
        depth[n.name] = 1 + max((depth[p] for p in preds), default=-1)
    rows: dict[int, list[str]] = {}
    for n in nodes:
        rows.setdefault(depth[n.name], []).append(n.name)
    pos = {}
    for d, names in rows.items():
        for i, name in enumerate(names):
            pos[name] = (i - (len(names) - 1) / 2, d)
    group = {n.name: n.group or n.name for n in nodes}
    return {"nodes": nodes, "pos": pos, "edges": edges, "group": group}


def _draw_graph(ax, graph, block, declined: dict[str, str], title: str) -> dict:
    import matplotlib.colors as mcolors
    from matplotlib.collections import LineCollection
    from matplotlib.patches import FancyBboxPatch

    lay = graph_layout(graph, block)
    pos, nodes = lay["pos"], lay["nodes"]
    members: dict[str, list[str]] = {}
    for name, g in lay["group"].items():
        members.setdefault(g, []).append(name)
    fused = {g: names for g, names in members.items() if len(names) > 1}
    palette = list(mcolors.TABLEAU_COLORS.values())
    colour_of = {g: palette[i % len(palette)] for i, g in enumerate(fused)}
    if lay["edges"]:
        ax.add_collection(LineCollection([(pos[a], pos[b]) for a, b in lay["edges"]], colors="#999999",
                                         linewidths=0.6, zorder=1, label="edges"))
    for g, names in fused.items():
        xs = [pos[n][0] for n in names]
        ys = [pos[n][1] for n in names]
        ax.add_patch(FancyBboxPatch((min(xs) - 0.35, min(ys) - 0.35), max(xs) - min(xs) + 0.7,
                                    max(ys) - min(ys) + 0.7, boxstyle="round,pad=0.05", alpha=0.18,
                                    facecolor=colour_of[g], edgecolor=colour_of[g], zorder=0,
                                    label=f"fused group {g}"))
    colours = [colour_of.get(lay["group"][n.name], "#c8c8c8") for n in nodes]
    if nodes:
        ax.scatter([pos[n.name][0] for n in nodes], [pos[n.name][1] for n in nodes], s=60, c=colours,
                   edgecolors="black", linewidths=0.4, zorder=2, label="nodes")
    small = len(nodes) <= 120
    for n in nodes:
        x, y = pos[n.name]
        if small:
            ax.text(x + 0.12, y, n.op, fontsize=7, va="center", zorder=3)
    shown = {}
    for name, why in declined.items():
        if name in pos:
            x, y = pos[name]
            shown[name] = why
            ax.plot([x], [y], marker="x", color="red", markersize=9, zorder=4, linestyle="none",
                    label="declined fusion")
            ax.annotate(textwrap.shorten(why, 70), (x, y), xytext=(12, -8), textcoords="offset points",
                        fontsize=6.5, color="red", zorder=5)
    ax.invert_yaxis()
    ax.set_xticks([])
    ax.set_ylabel("topological depth")
    if nodes:
        xs = [p[0] for p in pos.values()]
        ax.set_xlim(min(xs) - 1, max(xs) + 3)
        ax.set_ylim(max(p[1] for p in pos.values()) + 1, -1)
    ax.set_title(f"{title}: {len(nodes)} ops, {len(fused)} fused groups"
                 + (f", {len(shown)} declined" if shown else ""), fontsize=9)
    return {"nodes": [n.name for n in nodes], "groups": fused, "declined": shown, "pos": pos}


def repeated_blocks(graph) -> list[str]:
    """The model's repeated blocks, in graph order: module paths that end in a number and have
    numbered siblings (``layer1.0``, ``layer1.1``, ... for ResNet; ``encoder.layer.0``, ... for
    BERT). Only the outermost numbered level counts: ``layer1.0.downsample.0`` is part of
    ``layer1.0``."""
    mods = [n.module for n in graph.nodes if n.module and not n.is_view]
    numbered: dict[str, set[str]] = {}  # parent path -> its numbered children
    for m in mods:
        parts = m.split(".")
        for j, part in enumerate(parts):
            if part.isdigit():
                numbered.setdefault(".".join(parts[:j]), set()).add(part)
    blocks: list[str] = []
    for m in mods:
        parts = m.split(".")
        for j, part in enumerate(parts):
            if part.isdigit() and len(numbered[".".join(parts[:j])]) > 1:
                block = ".".join(parts[:j + 1])
                if block not in blocks:
                    blocks.append(block)
                break
    return blocks


WHOLE_MODEL_OPS = 60  # up to this many drawn ops, the fusion graph shows the whole model by default


def default_block(graph) -> str | None:
    """The block `plot_fusion_graph` zooms to by default: None (the whole model) for a graph of
    at most `WHOLE_MODEL_OPS` drawn ops, else the first repeated block with more than one op
    ("layer1.0" for ResNet-50, "encoder.layer.0" for BERT), else None."""
    drawn = [n for n in graph.nodes if not n.is_view]
    if len(drawn) <= WHOLE_MODEL_OPS:
        return None
    for block in repeated_blocks(graph):
        if sum(_in_block(n, block) for n in drawn) > 1:
            return block
    return None


def plot_fusion_graph(optimized_or_graph, before=None, block: str | None = "auto") -> Figure:
    """The model's graph after the passes (and ``before`` them, e.g. the level-0 graph, as a
    second panel on the left): ops at their topological depth, fused kernels coloured and boxed,
    fusions a pass declined marked with a red x and the pass note's reason.

    ``block`` zooms to the ops of one module prefix ("layer1.0": one ResNet bottleneck;
    "encoder.layer.0": one BERT layer). The default, ``"auto"``, is `default_block`: the first
    repeated block of a large model, the whole of a small one; ``None`` draws the whole model.
    ``fig.pypto_data`` holds, per panel, the nodes, fused groups and declines drawn, and
    ``fig.pypto_block`` the block drawn (None: the whole model)."""
    graph, report, _ = _unwrap(optimized_or_graph)
    if graph is None:
        raise TypeError("plot_fusion_graph needs an OptimizedModel or a Graph (a Report has no graph)")
    if block == "auto":
        block = default_block(graph)
    declined = declined_fusions(report) if report is not None else {}
    panels = [(graph, declined, f"after level {report.level}" if report is not None else "after")]
    if before is not None:
        bgraph, breport, _ = _unwrap(before)
        panels.insert(0, (bgraph, {}, f"before (level {breport.level})" if breport is not None else "before"))
    if block is not None and not any(_in_block(n, block) for n in graph.nodes):
        mods = repeated_blocks(graph)[:12] or sorted({n.module.rsplit(".", 1)[0] for n in graph.nodes if n.module})[:12]
        raise ValueError(f"no op of the graph comes from module {block!r}; blocks look like {', '.join(mods)}")
    depth = max(len({d for _, d in graph_layout(g, block)["pos"].values()}) for g, _, _ in panels)
    # constrained layout keeps the suptitle, the panel titles and the axes apart at any height
    fig = Figure(figsize=(6.5 * len(panels), min(max(4.0, 0.32 * depth + 1.8), 60.0)), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    fig.pypto_data = [_draw_graph(ax, g, block, d, t) for ax, (g, d, t) in zip(axes, panels)]
    fig.pypto_block = block
    name = getattr(graph, "model_name", "") or "model"
    where = f"block {block}" if block else "whole model"
    fig.suptitle(f"{name}, {where}: " + ("kernels before and after fusion" if before is not None else "fused kernels"))
    return fig


# ---- tiling -----------------------------------------------------------------------------------

TILING_BUFFERS = ("L1", "L0A", "L0B", "L0C", "UB")


def tiling_occupancy(report_or_error, chip, requested: dict[str, int] | None = None,
                     buffers: tuple[str, ...] = TILING_BUFFERS) -> dict[str, dict]:
    """Per buffer: bytes in use (``KernelReport.buffer_peak``, or for an illegal tiling the bytes
    ``requested`` by the tiling rules), capacity, fraction and whether it overflows."""
    chip = get_chip(chip)
    if isinstance(report_or_error, Exception):
        used = dict(requested or {})
    else:
        used = dict(report_or_error.buffer_peak)
    out = {}
    for buf in buffers:
        if buf not in chip.buffers:
            continue
        cap = chip.buffer(buf).size_bytes
        b = int(used.get(buf, 0))
        out[buf] = {"bytes": b, "capacity": cap, "fraction": b / cap, "over": b > cap}
    return out


def _occupancy_bars(ax, occ: dict, error: str | None) -> list:
    names = list(occ)
    fr = [min(occ[b]["fraction"], 1.25) for b in names]
    bars = ax.barh(names, fr, color=["#c44e52" if occ[b]["over"] else "#4c72b0" for b in names])
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlim(0, 1.3)
    ax.invert_yaxis()
    ax.set_xlabel("fraction of capacity")
    labels = []
    for i, b in enumerate(names):
        labels.append(ax.text(min(fr[i], 1.25) + 0.02, i, f"{occ[b]['bytes'] / 1024:.0f}/{occ[b]['capacity'] / 1024:.0f} KB",
                              va="center", fontsize=7))
    return list(bars) + labels


def plot_tiling(report_or_error, chip, requested: dict[str, int] | None = None, core: int | None = None) -> Figure:
    """Static figure of one tiling: occupancy of L1, L0A, L0B, L0C, UB against their capacity
    (red when over, with the `TilingError`'s text), and for a legal tiling its cycles,
    utilisation and the pipe swimlane of one core. ``requested`` (bytes per buffer, e.g. from
    `pypto_lab.hw.tiling.cube_tile_bytes`) draws the bars of an illegal tiling."""
    chip = get_chip(chip)
    occ = tiling_occupancy(report_or_error, chip, requested)
    fig = Figure(figsize=(11, 3.6))
    gs = fig.add_gridspec(1, 2, width_ratios=(1, 2.6))
    ax_occ = fig.add_subplot(gs[0])
    ax_sw = fig.add_subplot(gs[1])
    error = str(report_or_error) if isinstance(report_or_error, Exception) else None
    _occupancy_bars(ax_occ, occ, error)
    if error:
        ax_occ.set_title("illegal tiling", color="#c44e52", fontsize=9)
        ax_sw.axis("off")
        ax_sw.text(0, 1, "TilingError: " + "\n".join(textwrap.wrap(error, 90)), va="top", fontsize=8,
                   color="#c44e52", transform=ax_sw.transAxes)
    else:
        r = report_or_error
        ax_occ.set_title(f"{r.cycles:,.0f} cycles, cube {r.cube_utilization:.0%}, vector {r.vector_utilization:.0%}",
                         fontsize=9)
        _draw_lanes(ax_sw, r.instructions, _core_sel(r.instructions, core)[1], 0, 0.0)
        ax_sw.set_yticks(range(len(PIPES)), PIPES)
        ax_sw.invert_yaxis()
        ax_sw.set_xlabel("cycles")
        ax_sw.set_title(f"{r.name}, tile {r.tile}", fontsize=8)
    fig.tight_layout()
    return fig


def _core_sel(tl, core, limit: int = 4000):
    if core is None:
        core = int(tl.core[0]) if len(tl) else 0
    return core, np.flatnonzero(tl.core == core)[:limit]


def _draw_lanes(ax, tl, sel, y0: float, offset: float, label: bool = True, scale: float = 1.0) -> int:
    """Bars of the instructions ``sel`` of a timeline on lanes ``y0 + pipe``, shifted by ``offset``
    cycles, x in cycles times ``scale``."""
    drawn = 0
    for lane, name in enumerate(PIPES):
        idx = sel[tl.pipe[sel] == lane]
        if idx.size:
            ax.broken_barh(np.column_stack(((tl.start[idx] + offset) * scale, (tl.end[idx] - tl.start[idx]) * scale)),
                           (y0 + lane - 0.4, 0.8),
                           facecolors=PIPE_COLOURS[name], edgecolor="white", linewidth=0.2,
                           label=name if label else None)
            drawn += idx.size
    return drawn


# ---- memory -----------------------------------------------------------------------------------

def _resident_names(plan) -> set[str]:
    """The plan's resident blocks (weights, inputs): listed first, ``resident_bytes`` in all."""
    names, total = set(), 0
    for b in plan.buffers:
        if total >= plan.resident_bytes:
            break
        names.add(b.name)
        total += b.size
    return names


def _arena_curves(plan, reuse_plan=None):
    """Per kernel: bytes live, the arena's top without reuse (every tensor its own block, never
    freed within a run) and with reuse (the best-fit plan's top so far), from the plans' buffers."""
    n = max(plan.kernel_count, 1)
    live = np.asarray(plan.live_bytes if plan.live_bytes else [plan.resident_bytes] * n, dtype=float)
    resident_names = _resident_names(plan)
    no_reuse = np.full(n, float(plan.resident_bytes))
    for b in plan.buffers:
        if b.name not in resident_names:
            no_reuse[b.first:] += b.size
    reuse = None
    src = reuse_plan if reuse_plan is not None else (plan if plan.reuse else None)
    if src is not None:
        top = np.full(n, float(src.resident_bytes))
        src_resident = _resident_names(src)
        for b in src.buffers:
            if b.name not in src_resident:
                top[b.first:] = np.maximum(top[b.first:], b.offset + b.size)
        reuse = top
    return live, no_reuse, reuse


def plot_memory_occupancy(optimized) -> Figure:
    """GM over the kernel schedule (`MemoryPlan`): bytes live while each kernel runs, the
    allocation without reuse and with the best-fit reuse plan, each plan's peak as a dashed line,
    and the peak of the plan in force (``report.peak_memory_bytes``) marked with a star."""
    graph, report, om = _unwrap(optimized)
    report = _report_of(optimized)
    plan = report.memory
    if plan is None:
        raise ValueError("this report has no memory plan")
    reuse_plan = None
    if not plan.reuse and graph is not None:
        reuse_plan = memory_plan(graph, precision=plan.precision, reuse=True)
    live, no_reuse, reuse = _arena_curves(plan, reuse_plan)
    x = np.arange(len(live))
    fig = Figure(figsize=(9, 3.6))
    ax = fig.add_subplot()
    ax.step(x, _mb(live), where="mid", color="#55a868", label="live tensors")
    ax.step(x, _mb(no_reuse), where="mid", color="#c44e52", label=f"no reuse (peak {_mb(plan.peak_bytes_no_reuse):,.1f} MB)")
    ax.axhline(_mb(plan.peak_bytes_no_reuse), color="#c44e52", linestyle=":", linewidth=0.8)
    peak_reuse = reuse_plan.peak_bytes_reuse if reuse_plan is not None else plan.peak_bytes_reuse
    if reuse is not None:
        ax.step(x, _mb(reuse), where="mid", color="#4c72b0", label=f"with reuse (peak {_mb(peak_reuse):,.1f} MB)")
        ax.axhline(_mb(peak_reuse), color="#4c72b0", linestyle=":", linewidth=0.8)
    peak = report.peak_memory_bytes
    curve = reuse if (plan.reuse and reuse is not None) else no_reuse
    at = int(np.argmax(curve >= peak - 0.5)) if np.any(curve >= peak - 0.5) else int(np.argmax(curve))
    ax.plot([at], [_mb(peak)], marker="*", markersize=14, color="black", linestyle="none",
            label=f"peak of the plan in force: {_mb(peak):,.1f} MB", gid="peak")
    ax.set_xlabel("kernel (schedule order)")
    ax.set_ylabel("GM MB")
    ax.set_ylim(0, _mb(max(plan.peak_bytes_no_reuse, peak)) * 1.1)
    ax.legend(fontsize="small", loc="lower right")
    ax.set_title(f"{report.model} on {report.chip}, level {report.level}: GM occupancy "
                 f"({plan.allocator or ('reuse' if plan.reuse else 'no reuse')})")
    fig.pypto_data = {"peak_bytes": peak, "live": live, "no_reuse": no_reuse, "reuse": reuse, "peak_kernel": at}
    fig.tight_layout()
    return fig


def plot_buffer_occupancy(report) -> Figure:
    """On-chip buffers against capacity. A `KernelReport`: one bar per buffer. A model's
    `Report` (or OptimizedModel): a heat map kernels x buffers of ``buffer_peak / capacity``
    (the largest over the kernel's simulated parts)."""
    if hasattr(report, "buffer_peak"):
        fig = Figure(figsize=(6, 2.8))
        ax = fig.add_subplot()
        occ = tiling_occupancy(report, report.chip)
        _occupancy_bars(ax, occ, None)
        ax.set_title(f"{report.name}: on-chip buffers", fontsize=9)
        fig.pypto_data = occ
        fig.tight_layout()
        return fig
    report = _report_of(report)
    chip = get_chip(report.chip)
    bufs = [b for b in TILING_BUFFERS if b in chip.buffers]
    rows = [k for k in report.kernels if k.reports]
    data = np.zeros((len(rows), len(bufs)))
    for i, k in enumerate(rows):
        for j, b in enumerate(bufs):
            data[i, j] = max(r.buffer_peak.get(b, 0) for r in k.reports) / chip.buffer(b).size_bytes
    fig = Figure(figsize=(6.5, min(max(3.0, 0.16 * len(rows) + 1.2), 30)))
    ax = fig.add_subplot()
    im = ax.imshow(data, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(bufs)), [f"{b}\n{chip.buffer(b).size_bytes // 1024} KB" for b in bufs])
    ax.set_yticks(range(len(rows)), [k.name for k in rows], fontsize=6 if len(rows) > 30 else 8)
    fig.colorbar(im, ax=ax, label="peak / capacity")
    ax.set_title(f"{report.model} on {report.chip}: on-chip buffer occupancy per kernel", fontsize=9)
    fig.pypto_data = {"kernels": [k.name for k in rows], "buffers": bufs, "fraction": data}
    fig.tight_layout()
    return fig


# ---- model swimlane ---------------------------------------------------------------------------

def plot_model_swimlane(optimized, start_kernel: int = 0, count: int = 5, cores=(0,),
                        max_instructions: int = 20000) -> Figure:
    """Pipes x time per core for a window of the model's kernels: every kernel's simulated
    timeline, shifted to its start in the schedule (levels 0-2 one after another; level 3 as
    the two streams overlap them). CPU-lane kernels show as a grey span. ``cores`` number the
    chip's cores: on 910B 0..23 are the AIC (Cube) cores and 24.. the AIV (Vector) cores."""
    report = _report_of(optimized)
    chip = get_chip(report.chip)
    sched = report.schedule.kernels if report.schedule else None
    window = list(range(start_kernel, min(start_kernel + count, len(report.kernels))))
    if not window:
        raise ValueError(f"start_kernel {start_kernel} is past the model's {len(report.kernels)} kernels")
    cores = tuple(cores)
    fig = Figure(figsize=(11, 1.6 + 1.9 * len(cores)))
    FigureCanvasAgg(fig)  # the kernel labels are placed by their rendered size
    ax = fig.add_subplot()
    starts = []
    t = 0.0
    for i in window:
        start_us = sched[i].start_us if sched else t
        t = start_us + report.kernels[i].time_us
        starts.append(start_us)
    origin = starts[0]
    budget = max_instructions
    drawn = 0
    spans = []
    for i, start_us in zip(window, starts):
        k = report.kernels[i]
        offset = (start_us - origin) * chip.clock_mhz
        end = offset + k.cycles
        spans.append((k.name, offset, end))
        if not k.reports:
            ax.broken_barh([(offset, max(end - offset, 1e-9))], (-0.5, len(cores) * 8 - 0.5), facecolors="#eeeeee",
                           label="host")
        for r in k.reports:
            tl = r.instructions
            # on 910B a Cube kernel's timeline numbers AIC 0.. then AIV cube_cores..; a Vector
            # kernel's runs on the AIV cores from 0: put it on the same chip-wide numbering
            shift = chip.cube_cores if chip.split_cores and r.unit == "vector" else 0
            for ci, core in enumerate(cores):
                sel = np.flatnonzero(tl.core + shift == core)[:max(budget, 0)]
                n = _draw_lanes(ax, tl, sel, ci * 8, offset, label=False)
                budget -= n
                drawn += n
            offset += r.cycles
        ax.axvline(spans[-1][1], color="black", linewidth=0.5, linestyle=":")
    ticks, labels = [], []
    for ci, core in enumerate(cores):
        if chip.split_cores:
            core_name = f"AIC {core}" if core < chip.cube_cores else f"AIV {core - chip.cube_cores}"
        else:
            core_name = f"AI Core {core}"
        for lane, name in enumerate(PIPES):
            ticks.append(ci * 8 + lane)
            labels.append(f"{core_name} {name}")
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_ylim(len(cores) * 8 - 0.5, -0.55 - LABEL_ROWS * LABEL_ROW_HEIGHT)
    lo, hi = min(0.0, *(s[1] for s in spans)), max(s[2] for s in spans)  # two streams: a kernel may start earlier
    ax.set_xlim(lo - 0.01 * (hi - lo), hi + 0.01 * (hi - lo))
    ax.set_xlabel(f"cycles from {origin:,.1f} us")
    title = f"{report.model} on {report.chip}, level {report.level}: kernels {window[0]}-{window[-1]}"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    placed = _place_kernel_labels(ax, [(i, name, x0) for i, (name, x0, _) in zip(window, spans)])
    hidden = len(spans) - len(placed)
    if hidden:
        ax.set_title(f"{title} ({hidden} labels left out: too short to label)", fontsize=9)
    fig.pypto_data = {"kernels": [s[0] for s in spans], "starts_cycles": [s[1] for s in spans],
                      "ends_cycles": [s[2] for s in spans], "instructions": drawn, "labels": placed}
    return fig


LABEL_ROWS = 3           # rows of kernel labels above the lanes of the model swimlane
LABEL_ROW_HEIGHT = 0.85  # in lanes


def _short_name(name: str, limit: int = 30) -> str:
    """A kernel name of at most ``limit`` characters: its operator and the end of its module path
    (``Conv2D:layer1.0.downsample.0`` -> ``Conv2D:…downsample.0``)."""
    if len(name) <= limit:
        return name
    op, _, path = name.rpartition(":")
    head = f"{op}:…" if op and len(op) < limit // 2 else "…"
    return head + path[-(limit - len(head)):]


def _place_kernel_labels(ax, kernels) -> dict[int, str]:
    """Label each kernel ``(index, name, start)`` at its start line, in the first of `LABEL_ROWS`
    rows above the lanes where it does not touch the label before it: its index and short name,
    else its index alone, else no label. Returns index -> text of the labels placed."""
    renderer = ax.figure.canvas.get_renderer()
    ends = [-np.inf] * LABEL_ROWS  # right edge (pixels) of the last label in each row
    gap = 4.0
    placed = {}
    for index, name, x in sorted(kernels, key=lambda k: k[2]):
        left = ax.transData.transform((x, 0))[0]
        for text in (f"{index} {_short_name(name)}", f"{index}"):
            row = next((r for r in range(LABEL_ROWS) if left >= ends[r] + gap), None)
            if row is None:
                continue
            y = -0.55 - row * LABEL_ROW_HEIGHT
            t = ax.text(x, y, text, fontsize=6.5, va="bottom", ha="left", gid="kernel-label", clip_on=False)
            right = t.get_window_extent(renderer).x1
            if right <= ax.bbox.x1 + 40:  # may run a little past the last cycle, not off the figure
                ends[row] = right
                placed[index] = text
                break
            t.remove()
    return placed


# ---- pass by pass, level by level ---------------------------------------------------------------

def level0_report(optimized, level0=None):
    """The level-0 report of the model behind ``optimized`` (an OptimizedModel or a Report):
    ``level0`` itself when given (a Report or OptimizedModel at level 0 of the same model, chip
    and batch), ``optimized``'s own report when it is at level 0, else the model optimised again
    at level 0 on the inputs it was captured with (same chip and precision)."""
    graph, report, om = _unwrap(optimized)
    report = _report_of(optimized)
    if level0 is not None:
        base = _report_of(level0)
        if base.level != 0:
            raise ValueError(f"level0 must be a level-0 report; this one is level {base.level}")
        for what, a, b in (("model", base.model, report.model), ("chip", base.chip.name, report.chip.name),
                           ("batch", base.batch, report.batch)):
            if a != b:
                raise ValueError(f"level0 is not the same run: its {what} is {a!r}, the report's is {b!r}")
        return base
    if report.level == 0:
        return report
    ep = getattr(graph, "exported_program", None)
    inputs = getattr(ep, "example_inputs", None)
    if om is None or inputs is None or inputs[1]:
        raise ValueError(f"this level-{report.level} report needs its level-0 start: pass "
                         "level0=optimize(model, inputs, chip=..., level=0) (or its report)")
    from ..compiler.optimize import optimize

    return optimize(om.model, tuple(inputs[0]), chip=report.chip, level=0, precision=report.precision).report()


def plot_speedup_waterfall(report, level0=None) -> Figure:
    """Latency from level 0 to the report's level, pass by pass. The first bar is the level-0
    latency (`level0_report`: ``level0`` when given, else worked out), each later bar the change
    one pass of the report's level made (green faster, red slower, grey unchanged). ``map_ops``'s
    bar is the step from level 0 to the graph after ``map_ops`` alone: no composite decomposed
    yet, and default tilings where level 0 has naive ones. The title's ratio is level-0 latency /
    the report's latency: the speedup the level tables print. A level-0 report shows its own
    passes from ``map_ops`` on."""
    base = level0_report(report, level0)
    report = _report_of(report)
    steps = report.passes
    if not steps:
        raise ValueError("this report has no pass-by-pass record")
    start = [] if report.level == 0 else [("level 0", base.latency_us)]
    names = [n for n, _ in start] + [p.name for p in steps]
    lat = [v for _, v in start] + [p.latency_us for p in steps]
    bottoms, heights, colours = [], [], []
    for i, v in enumerate(lat):
        if i == 0:
            bottoms.append(0.0)
            heights.append(v)
            colours.append("#8c8c8c" if start else "#4c72b0")
            continue
        prev = lat[i - 1]
        bottoms.append(min(prev, v))
        heights.append(max(abs(v - prev), lat[0] * 2e-3))
        colours.append("#55a868" if v < prev - 1e-9 else "#c44e52" if v > prev + 1e-9 else "#b0b0b0")
    fig = Figure(figsize=(max(6, 0.7 * len(names) + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    ax.bar(range(len(names)), heights, bottom=bottoms, color=colours, edgecolor="black", linewidth=0.4)
    for i, v in enumerate(lat):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("latency us")
    ax.set_ylim(0, max(lat) * 1.08)
    head = f"{report.model} on {report.chip}"
    if start:
        speedup = base.latency_us / report.latency_us if report.latency_us else float("nan")
        ax.set_title(f"{head}: level 0 -> level {report.level}, {base.latency_us:,.1f} -> {report.latency_us:,.1f} us "
                     f"(x{speedup:.2f})", fontsize=9)
        ax.set_xlabel(f"level 0, then the passes of level {report.level}", fontsize=8)
    else:
        ax.set_title(f"{head}: level 0 pass by pass, {lat[0]:,.1f} -> {lat[-1]:,.1f} us", fontsize=9)
    fig.pypto_data = {"passes": names, "latency_us": lat, "level0_us": base.latency_us}
    return fig


def plot_level_comparison(reports) -> Figure:
    """Latency, kernel count and GM traffic of one model at several levels (reports, or
    OptimizedModels, e.g. levels 0..3)."""
    reports = [_report_of(r) for r in (reports.values() if isinstance(reports, dict) else reports)]
    if not reports:
        raise ValueError("no reports to compare")
    fig = Figure(figsize=(9, 3.4))
    ax_l, ax_k, ax_g = fig.subplots(1, 3)
    labels = [f"L{r.level}" + ("" if r.precision == reports[0].precision else f" {r.precision}") for r in reports]
    lat = [r.latency_us for r in reports]
    ax_l.bar(labels, lat, color="#4c72b0")
    for i, v in enumerate(lat):
        ax_l.text(i, v, f"x{lat[0] / v:.2f}" if v else "", ha="center", va="bottom", fontsize=7)
    ax_l.set_title("latency us", fontsize=9)
    ax_k.bar(labels, [len(r.kernels) for r in reports], color="#dd8452")
    ax_k.set_title("kernels", fontsize=9)
    ax_g.bar(labels, [_mb(r.gm_bytes) for r in reports], color="#55a868")
    ax_g.set_title("GM traffic MB", fontsize=9)
    fig.suptitle(f"{reports[0].model} on {reports[0].chip}, batch {reports[0].batch}", fontsize=10)
    fig.pypto_data = {"labels": labels, "latency_us": lat}
    fig.tight_layout()
    return fig


# ---- roofline -----------------------------------------------------------------------------------

def vector_peak_tflops(chip, dtype: str = "fp16") -> float:
    """The Vector units' element-wise ceiling from chip constants: every vector core issuing one
    VADD repeat of ``repeat_bytes`` at the preset's cycles per repeat."""
    chip = get_chip(chip)
    eb = DTYPE_BYTES[dtype]
    timing = chip.vector.timing("VADD", dtype.upper())
    per_cycle = chip.vector.repeat_bytes / eb / timing.cycles_per_repeat
    return chip.vector_cores * per_cycle * chip.clock_hz / 1e12


def plot_roofline(report) -> Figure:
    """Every kernel of a model (each simulated part of it: `KernelReport`) on the chip's roofline:
    x = flops per GM byte, y = achieved TFLOPS (flops / simulated time). Ceilings from the chip's
    constants: the Cube peak per dtype, the Vector peak, and the HBM and L2 bandwidth slopes.
    Kernels with no flops (copies, TransData) have no point; their count is in the title."""
    if hasattr(report, "buffer_peak"):
        reps, name, chip_name = [report], report.name, report.chip
    else:
        report = _report_of(report)
        reps = [r for k in report.kernels for r in k.reports]
        name, chip_name = f"{report.model}, level {report.level}", report.chip
    chip = get_chip(chip_name)
    pts = [r for r in reps if r.flops > 0 and r.gm_bytes > 0 and r.time_us > 0]
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = np.array([r.flops / r.gm_bytes for r in pts]) if pts else np.array([1.0])
    lo, hi = min(xs.min() / 4, 0.05), max(xs.max() * 4, 2000)
    grid = np.geomspace(lo, hi, 200)
    hbm = chip.hbm_gbps * 1e9 / 1e12
    l2 = chip.l2_gbps * 1e9 / 1e12
    ceilings = {}
    cube_dtypes = sorted({r.dtype for r in pts if r.unit == "cube"}) or ["fp16"]
    for dt in cube_dtypes:
        peak = chip.peak_tflops(dt)
        if peak:
            ceilings[f"Cube {dt}"] = peak
            ax.plot(grid, np.minimum(peak, grid * hbm), color="#c44e52", linewidth=1.2,
                    label=f"Cube {dt} {peak:,.0f} TFLOPS")
    vdts = sorted({r.dtype for r in pts if r.unit == "vector" and r.dtype in ("fp16", "bf16", "fp32")})
    vdt = "fp16" if not vdts or "fp16" in vdts else vdts[0]
    vpeak = vector_peak_tflops(chip, vdt)
    ceilings[f"Vector {vdt}"] = vpeak
    ax.plot(grid, np.minimum(vpeak, grid * hbm), color="#dd8452", linewidth=1.2, label=f"Vector {vdt} {vpeak:,.1f} TFLOPS")
    ax.plot(grid, grid * hbm, color="#4c72b0", linestyle="--", linewidth=1, label=f"HBM {chip.hbm_gbps:,.0f} GB/s")
    ax.plot(grid, np.minimum(grid * l2, max(ceilings.values())), color="#8172b2", linestyle=":", linewidth=1,
            label=f"L2 {chip.l2_gbps:,.0f} GB/s")
    for unit, colour, marker in (("cube", "#c44e52", "o"), ("vector", "#dd8452", "s")):
        sel = [r for r in pts if r.unit == unit]
        if sel:
            ax.scatter([r.flops / r.gm_bytes for r in sel], [r.tflops for r in sel], c=colour, marker=marker,
                       edgecolors="black", linewidths=0.4, s=28, zorder=3, label=f"{unit} kernels ({len(sel)})",
                       gid=f"points-{unit}")
    top = max(ceilings.values())
    ax.set_ylim(min([r.tflops for r in pts] + [vpeak]) / 5, top * 2)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity: flops per GM byte")
    ax.set_ylabel("achieved TFLOPS")
    skipped = len(reps) - len(pts)
    ax.set_title(f"{name} on {chip.name}: roofline" + (f" ({skipped} kernels without flops not shown)" if skipped else ""),
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.pypto_data = {"ceilings_tflops": ceilings, "hbm_tb_s": hbm, "l2_tb_s": l2,
                      "points": [(r.name, r.flops / r.gm_bytes, r.tflops) for r in pts]}
    fig.tight_layout()
    return fig
