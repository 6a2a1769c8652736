"""The HTML report of `pypto-lab tour`: the chips, and the ResNet-50 and BERT-base walkthroughs
(levels 0-3 side by side, pass by pass at level 3, figures) in one self-contained file.

Every number and every figure comes from the simulator (`optimize(...).report()`); figures are
PNGs embedded as base64, so the file can be mailed or attached to a CI run as it is.

    from pypto_lab.tour_report import write_tour_report
    write_tour_report("out/tour.html")                       # the full tour (about a minute)
    write_tour_report("out/small.html", walkthroughs=[Walkthrough("resnet50", batch=1)],
                      chips=["Ascend910B1"])                  # a reduced one
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..compiler.optimize import LEVELS, optimize
from ..files.atomic import write_text_atomic
from ..hw.chip import get_chip, list_chips
from ..models.zoo import load_model
from . import views

DEFAULT_CHIPS = ("Ascend910A", "Ascend910B1")
LEVEL_COLOURS = ("#8c8c8c", "#4c72b0", "#55a868", "#c44e52")
CHIP_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#8172b2")


@dataclass(frozen=True)
class Walkthrough:
    """One model of the tour: a zoo name (``resnet50``, ``bert-base``, ``minilm``), a
    ``package.module:function`` spec, or a callable ``(batch=, seq=) -> (model, example_inputs)``."""

    model: str | Callable
    batch: int = 1
    seq: int | None = None
    title: str = ""

    def label(self) -> str:
        if self.title:
            return self.title
        name = self.model if isinstance(self.model, str) else getattr(self.model, "__name__", "model")
        return f"{name}, batch {self.batch}" + (f", seq {self.seq}" if self.seq else "")

    def load(self):
        if isinstance(self.model, str):
            return load_model(self.model, self.batch, self.seq)
        model, inputs = self.model(batch=self.batch, seq=self.seq)
        return model, inputs if isinstance(inputs, tuple) else (inputs,)


DEFAULT_WALKTHROUGHS = (
    Walkthrough("resnet50", batch=32, title="ResNet-50, batch 32"),
    Walkthrough("bert-base", batch=8, seq=128, title="BERT-base, batch 8, sequence 128"),
)


@dataclass
class WalkthroughResult:
    walkthrough: Walkthrough
    precision: str
    reports: dict[str, list]  # chip -> [Report for level 0, 1, 2, 3]
    seconds: float = 0.0
    optimized: dict[str, Any] = field(default_factory=dict)  # chip -> the level-3 OptimizedModel


@dataclass
class TourReport:
    chips: list[str]
    results: list[WalkthroughResult]
    precision: str
    seconds: float = 0.0
    figures: dict[str, str] = field(default_factory=dict)  # title -> base64 PNG


# ---- running ---------------------------------------------------------------------------------

def run_walkthroughs(walkthroughs: Sequence[Walkthrough] = DEFAULT_WALKTHROUGHS,
                     chips: Sequence[str] = DEFAULT_CHIPS, precision: str = "fp16",
                     progress: Callable[[str], None] | None = None) -> list[WalkthroughResult]:
    """Optimise every walkthrough's model at levels 0-3 on every chip."""
    results = []
    for wt in walkthroughs:
        start = time.perf_counter()
        model, inputs = wt.load()
        reports, last = {}, {}
        for chip in chips:
            oms = [optimize(model, inputs, chip=chip, level=lv, precision=precision) for lv in sorted(LEVELS)]
            reports[chip], last[chip] = [om.report() for om in oms], oms[-1]
            if progress:
                progress(levels_text(wt.label(), chip, precision, reports[chip]))
        results.append(WalkthroughResult(wt, precision, reports, time.perf_counter() - start, last))
    return results


def level_rows(reports: list) -> list[dict[str, Any]]:
    """Levels 0-3 of one model on one chip: the numbers of the comparison table."""
    base = reports[0].latency_us
    return [{"level": r.level, "latency_us": r.latency_us, "kernels": len(r.kernels),
             "gm_mb": r.gm_bytes / 1e6, "peak_memory_mb": r.peak_memory_bytes / 1e6,
             "throughput_per_s": r.throughput_per_s,
             "speedup": base / r.latency_us if r.latency_us else 0.0,
             **_energy(r)} for r in reports]


def _energy(report) -> dict[str, float]:
    """Energy, average power and TOPS/W of a report; NaN for a chip preset without an [energy] table."""
    if report.chip.energy is None:
        return {"energy_mj": math.nan, "avg_power_w": math.nan, "tops_per_w": math.nan}
    e = report.energy()
    return {"energy_mj": e.energy_mj, "avg_power_w": e.avg_power_w, "tops_per_w": e.tops_per_w}


def levels_text(label: str, chip: str, precision: str, reports: list) -> str:
    """The comparison table as console text."""
    lines = [f"{label} on {chip}, {precision}",
             f"  {'level':<7}  {'latency us':>10}  {'kernels':>7}  {'GM MB':>8}  {'peak memory MB':>14}  {'speedup':>7}"
             f"  {'energy mJ':>9}  {'avg W':>6}  {'TOPS/W':>6}"]
    for row in level_rows(reports):
        lines.append(f"  level {row['level']}  {row['latency_us']:10,.1f}  {row['kernels']:7d}  {row['gm_mb']:8,.1f}  "
                     f"{row['peak_memory_mb']:14,.1f}  {row['speedup']:6.2f}x  {row['energy_mj']:9,.2f}  "
                     f"{row['avg_power_w']:6,.1f}  {row['tops_per_w']:6.2f}")
    return "\n".join(lines)


def chip_rows(chips: Sequence[str] | None = None) -> list[list[str]]:
    rows = []
    for name in chips or list_chips():
        c = get_chip(name)
        b = c.buffers
        rows.append([
            name, c.core_version, str(c.cube_cores), str(c.vector_cores), f"{c.clock_mhz:.0f}",
            f"{c.peak_tflops('fp16'):.1f}", f"{c.peak_tflops('int8'):.1f}", f"{c.hbm_gbps:.0f}",
            f"{c.l2_bytes / 2**20:.0f}",
            " / ".join(str(b[k].size_bytes // 1024) for k in ("L1", "L0A", "L0B", "L0C", "UB") if k in b),
        ])
    return rows


CHIP_HEADERS = ["chip", "core", "cube cores", "vector cores", "MHz", "fp16 TFLOPS", "int8 TOPS",
                "HBM GB/s", "L2 MB", "L1 / L0A / L0B / L0C / UB KB"]



# ---- figures ---------------------------------------------------------------------------------

def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def figure_levels(label: str, result: WalkthroughResult) -> Figure:
    """Latency at levels 0-3, one group of bars per chip."""
    chips = list(result.reports)
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    width = 0.8 / max(len(chips), 1)
    for i, chip in enumerate(chips):
        lat = [r.latency_us / 1000 for r in result.reports[chip]]
        xs = [lv + (i - (len(chips) - 1) / 2) * width for lv in range(len(lat))]
        bars = ax.bar(xs, lat, width, label=chip, color=CHIP_COLOURS[i % len(CHIP_COLOURS)])
        ax.bar_label(bars, [f"{lat[0] / v:.2f}x" for v in lat], fontsize="x-small", padding=2)
    ax.set_xticks(range(4), [f"level {lv}" for lv in range(4)])
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{label}: latency per optimisation level (speedup over level 0)")
    ax.legend(fontsize="small")
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def figure_waterfall(label: str, chip: str, report) -> Figure:
    """Latency after each pass of the level-3 pipeline; a bar per pass from the previous latency."""
    passes = report.passes
    fig = Figure(figsize=(8, 3.4))
    ax = fig.add_subplot()
    prev = None
    for i, p in enumerate(passes):
        lat = p.latency_us / 1000
        if prev is None:
            ax.bar(i, lat, color="#8c8c8c")
        else:
            delta = lat - prev
            colour = "#55a868" if delta < 0 else ("#c44e52" if delta > 0 else "#bbbbbb")
            ax.bar(i, delta if delta else max(prev, 1e-9) * 0.004, bottom=prev, color=colour)
        prev = lat
    ax.axhline(report.latency_us / 1000, color="black", linewidth=0.6, linestyle=":")
    ax.set_xticks(range(len(passes)), [p.name for p in passes], rotation=40, ha="right", fontsize="small")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{label} on {chip}: latency after each pass (level 3; green faster, red slower)")
    fig.tight_layout()
    return fig


def figure_roofline(label: str, chip_name: str, report) -> Figure:
    """Every Cube/Vector kernel of the level-3 model on the chip's roofline (fp16 Cube peak, HBM
    and L2 slopes); arithmetic intensity is flops per GM byte the simulator says the kernel moves."""
    chip = get_chip(chip_name)
    fig = Figure(figsize=(6.5, 4))
    ax = fig.add_subplot()
    peak = chip.peak_tflops("fp16")
    pts = {"cube": ([], []), "vector": ([], [])}
    for k in report.kernels:
        flops = sum(r.flops for r in k.reports)
        gm = sum(r.gm_bytes for r in k.reports)
        if not k.reports or flops <= 0 or gm <= 0 or k.time_us <= 0:
            continue
        unit = "cube" if any(r.unit == "cube" for r in k.reports) else "vector"
        pts[unit][0].append(flops / gm)
        pts[unit][1].append(flops / (k.time_us * 1e-6) / 1e12)
    xs_all = [x for xs, _ in pts.values() for x in xs] or [1.0]
    lo, hi = min(min(xs_all) / 2, 0.1), max(max(xs_all) * 2, 10 * peak * 1e12 / (chip.hbm_gbps * 1e9))
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, x * chip.hbm_gbps / 1000) for x in grid], color="black", linewidth=1.2,
            label=f"HBM {chip.hbm_gbps:.0f} GB/s, Cube fp16 {peak:.0f} TFLOPS")
    ax.plot(grid, [min(peak, x * chip.l2_gbps / 1000) for x in grid], color="black", linewidth=0.8,
            linestyle="--", label=f"L2 {chip.l2_gbps:.0f} GB/s")
    for unit, colour in (("cube", "#c44e52"), ("vector", "#dd8452")):
        if pts[unit][0]:
            ax.scatter(*pts[unit], s=14, color=colour, alpha=0.75, label=f"{unit} kernels ({len(pts[unit][0])})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("flops per GM byte")
    ax.set_ylabel("TFLOPS achieved")
    ax.set_title(f"{label} on {chip_name}, level 3: kernels on the roofline", fontsize="medium")
    ax.legend(fontsize="x-small", loc="lower right")
    fig.tight_layout()
    return fig


def _views_figure(name: str, *args, **kwargs) -> Figure | None:
    """A plot from `pypto_lab.views` when it has one of this name (the notebooks' own views)."""
    func = getattr(views, name, None)
    return func(*args, **kwargs) if callable(func) else None


def build_figures(results: list[WalkthroughResult]) -> dict[str, str]:
    figs: dict[str, str] = {}
    for res in results:
        label = res.walkthrough.label()
        figs[f"{label}: levels"] = _png(figure_levels(label, res))
        for chip, reports in res.reports.items():
            last = reports[-1]
            # from level 0, so the waterfall's ratio is the level table's
            fig = (_views_figure("plot_speedup_waterfall", last, level0=reports[0])
                   or figure_waterfall(label, chip, last))
            figs[f"{label} on {chip}: pass by pass"] = _png(fig)
            fig = _views_figure("plot_roofline", last) or figure_roofline(label, chip, last)
            figs[f"{label} on {chip}: roofline"] = _png(fig)
            if chip in res.optimized:
                fig = _views_figure("plot_memory_occupancy", res.optimized[chip])
                if fig is not None:
                    figs[f"{label} on {chip}: GM memory"] = _png(fig)
    return figs


# ---- HTML ------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; }
th { background: #f3f3f3; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0.8em 0; } figcaption { font-size: 0.85em; color: #555; }
img { max-width: 100%; } .note { font-size: 0.85em; color: #555; }
"""


def _table(headers: list[str], rows: list[list[Any]], numeric_from: int = 1, text_cols: tuple[int, ...] = ()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    num = [numeric_from <= i and i not in text_cols and i - len(headers) not in text_cols for i in range(len(headers))]
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if num[i] else ''}>{html.escape(str(c))}</td>"
                         for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(title: str, b64: str) -> str:
    return (f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{html.escape(title)}</figcaption></figure>")


def render_html(tour: TourReport) -> str:
    out = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>pypto_lab tour</title>"
           f"<style>{_CSS}</style></head><body>",
           "<h1>pypto_lab tour: PyTorch models on simulated Ascend NPUs</h1>",
           f"<p class=note>pypto_lab {html.escape(version('pypto_lab'))}; precision {html.escape(tour.precision)}. "
           "Every number and figure below comes from the simulator (no NPU was used); "
           f"the report took {tour.seconds:,.1f} s to compute.</p>",
           "<h2>The chips</h2>", _table(CHIP_HEADERS, chip_rows(), numeric_from=2)]
    for res in tour.results:
        label = res.walkthrough.label()
        out.append(f"<h2>{html.escape(label)}</h2>")
        out.append(_figure(f"{label}: levels", tour.figures[f"{label}: levels"]))
        for chip, reports in res.reports.items():
            out.append(f"<h3>{html.escape(label)} on {html.escape(chip)}, {html.escape(res.precision)}</h3>")
            rows = [[f"level {r['level']}", f"{r['latency_us']:,.1f}", r["kernels"], f"{r['gm_mb']:,.1f}",
                     f"{r['peak_memory_mb']:,.1f}", f"{r['throughput_per_s']:,.1f}", f"{r['speedup']:.2f}x",
                     f"{r['energy_mj']:,.2f}", f"{r['avg_power_w']:,.1f}", f"{r['tops_per_w']:.2f}"]
                    for r in level_rows(reports)]
            out.append(_table(["level", "latency us", "kernels", "GM MB", "peak memory MB", "samples/s",
                               "speedup", "energy mJ", "avg W", "TOPS/W"], rows))
            last = reports[-1]
            steps, prev = [], None
            for p in last.passes:
                change = "" if prev is None else f"{p.latency_us - prev:+,.1f}"
                steps.append([p.name, f"{p.latency_us:,.1f}", change, p.kernel_count,
                              f"{p.gm_bytes / 1e6:,.1f}", p.summary])
                prev = p.latency_us
            out.append(f"<p>Pass by pass at level {last.level} (its pipeline starts from each kernel's default "
                       "tiling, level 0 from the naive 128&times;128 one, so the first row is not level 0's "
                       "latency):</p>")
            out.append(_table(["after pass", "latency us", "change", "kernels", "GM MB", "what it did"], steps,
                              text_cols=(-1,)))
            out.extend(f"<p class=note>note: {html.escape(n)}</p>" for n in last.notes)
            for kind in ("pass by pass", "roofline", "GM memory"):
                title = f"{label} on {chip}: {kind}"
                if title in tour.figures:
                    out.append(_figure(title, tour.figures[title]))
    out.append("</body></html>\n")
    return "\n".join(out)


def write_tour_report(path: str | Path = "out/tour.html",
                      walkthroughs: Sequence[Walkthrough] | None = None,
                      chips: Sequence[str] | None = None, precision: str = "fp16",
                      progress: Callable[[str], None] | None = None) -> TourReport:
    """Run the walkthroughs (default: ResNet-50 batch 32 and BERT-base batch 8 / seq 128) on the
    chips (default: Ascend910A and Ascend910B1), draw the figures and write the HTML report
    atomically to ``path``."""
    start = time.perf_counter()
    walkthroughs = DEFAULT_WALKTHROUGHS if walkthroughs is None else walkthroughs
    # unknown chips fail here, before any model is built
    chips = [get_chip(c).name for c in (DEFAULT_CHIPS if chips is None else chips)]
    results = run_walkthroughs(walkthroughs, chips, precision, progress)
    tour = TourReport(chips=chips, results=results, precision=precision)
    tour.figures = build_figures(results)
    tour.seconds = time.perf_counter() - start
    path = write_text_atomic(path, render_html(tour))
    return tour
