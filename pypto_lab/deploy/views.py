"""Figures and a widget for `pypto_lab.deploy.pipeline`: the run's timeline (one lane per host
thread and engine), the throughput-latency curve of a `Sweep`, and `pipeline_widget` (batch and
stream sliders redrawing both numbers and timeline)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from matplotlib.figure import Figure

from .pipeline import PipelineResult, Sweep, pipeline

STAGE_COLORS = {"preprocess": "#8172b2", "h2d": "#4c72b0", "compute": "#dd8452", "d2h": "#55a868"}


def plot_timeline(result: PipelineResult, max_requests: int = 16) -> Figure:
    """Gantt chart of the first ``max_requests`` batches: one lane per host thread and engine, each
    operation coloured by stage and labelled with its stream."""
    fig = Figure(figsize=(9.6, 3.2))
    ax = fig.add_subplot()
    lanes = result.resources
    ops = [o for o in result.ops if o.request < max_requests]
    t0 = min(o.start_us for o in result.ops)
    span = max(o.end_us for o in ops) - t0
    for o in ops:
        y = len(lanes) - 1 - lanes.index(o.resource)
        width = max(o.time_us, 0.003 * span)  # a copy of a few bytes stays visible
        ax.barh(y, width / 1e3, left=(o.start_us - t0) / 1e3, height=0.7, color=STAGE_COLORS[o.stage],
                edgecolor="white", linewidth=0.3)
        if result.streams > 1 and o.time_us / 1e3 > 0.04 * max((p.end_us - t0) / 1e3 for p in ops):
            ax.text((o.start_us - t0 + o.time_us / 2) / 1e3, y, f"s{o.stream}", ha="center", va="center",
                    fontsize=7, color="white")
    ax.set_yticks(range(len(lanes)), list(reversed(lanes)))
    ax.set_ylim(-0.5, len(lanes) + 0.4)  # room for the legend above the top lane
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{result.model}, batch {result.batch}, {result.streams} stream(s), {result.mode}: "
                 f"{result.throughput_per_s:,.0f} samples/s, latency {result.latency_ms:.2f} ms", fontsize=9)
    handles = [ax.barh(0, 0, color=c, label=s) for s, c in STAGE_COLORS.items()]
    ax.legend(handles=handles, labels=list(STAGE_COLORS), loc="upper right", fontsize=7, ncols=4)
    fig.tight_layout()
    return fig


def plot_throughput_latency(sweep: Sweep) -> Figure:
    """Throughput (samples/s) against mean latency (ms) of every row of a `Sweep`: one line per
    stream count through the batch sizes (labelled), the synchronous program dashed."""
    fig = Figure(figsize=(7.2, 4.2))
    ax = fig.add_subplot()
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in sweep.rows:
        groups.setdefault((r["mode"], r["streams"]), []).append(r)
    for (mode, streams), rows in sorted(groups.items(), key=lambda kv: (kv[0][0] != "sync", kv[0][1])):
        rows = sorted(rows, key=lambda r: r["batch"])
        xs = [r["latency_ms"] for r in rows]
        ys = [r["throughput_per_s"] for r in rows]
        label = "sync, 1 stream" if mode == "sync" else f"async, {streams} stream{'s' if streams > 1 else ''}"
        ax.plot(xs, ys, "o--" if mode == "sync" else "o-", label=label)
        for r, x, y in zip(rows, xs, ys):
            ax.annotate(f"b{r['batch']}", (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("mean latency per batch (ms)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(f"{sweep.model} on {sweep.chip}: throughput against latency", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


class PipelineWidget:
    """Sliders for batch size and stream count and a sync/async toggle; each change re-runs the
    pipeline (a new batch size is optimised once, then cached) and shows throughput, latency and
    the timeline. ``w.batch``, ``w.streams``, ``w.mode`` are the controls, ``w.label`` the numbers
    (``w.text`` as plain text), ``w.image`` the timeline, ``w.result`` the last `PipelineResult`,
    ``w.widget`` the container."""

    def __init__(self, model_or_om, batches: Sequence[int] = (1, 2, 4, 8, 16, 32), max_streams: int = 8,
                 batch: int | None = None, streams: int = 2, **kwargs):
        import ipywidgets as W

        from ..viz.widgets import figure_widget

        self._figure_widget = figure_widget
        first = pipeline(model_or_om, batch or batches[0], streams, **kwargs)
        self.source, self.settings = first.source, first.settings
        self.batch = W.SelectionSlider(options=list(batches), value=first.batch, description="batch")
        self.streams = W.IntSlider(value=streams, min=1, max=max_streams, description="streams")
        self.mode = W.ToggleButtons(options=["async", "sync"], value="async", description="mode")
        self.label = W.HTML()
        self.label.add_class("pypto-pipeline-numbers")
        self.image = W.Image(format="png")
        self.widget = W.VBox([W.HBox([self.batch, self.streams, self.mode]), self.label, self.image])
        self.widget.add_class("pypto-pipeline")
        self.result: PipelineResult = first
        for control in (self.batch, self.streams, self.mode):
            control.observe(self.update, names="value")
        self._show()

    def update(self, *_):
        mode = self.mode.value
        streams = 1 if mode == "sync" else self.streams.value
        self.streams.disabled = mode == "sync"
        from .pipeline import _run

        self.result = _run(self.source, self.batch.value, streams, mode, self.settings)
        self._show()

    def _show(self) -> None:
        r = self.result
        self.text = (f"throughput {r.throughput_per_s:,.1f} samples/s; latency mean {r.latency_ms:.2f} ms, "
                     f"p99 {r.latency_p99_ms:.2f} ms; bottleneck {r.bottleneck} "
                     f"({r.utilization[r.bottleneck]:.0%} busy)")
        self.label.value = f"<b>{html.escape(self.text)}</b>"
        self.figure = plot_timeline(r)
        self.image.value = self._figure_widget(self.figure).value

    def _repr_mimebundle_(self, **kwargs):
        from ..viz.widgets import _static_bundle, figure_png

        return _static_bundle(self.widget, figure_png(self.figure, dpi=100), self.text, **kwargs)


def pipeline_widget(model_or_om, batches: Sequence[int] = (1, 2, 4, 8, 16, 32), max_streams: int = 8,
                    **kwargs) -> PipelineWidget:
    """An ipywidgets view of `pipeline` with batch and stream sliders (see `PipelineWidget`)."""
    return PipelineWidget(model_or_om, batches, max_streams, **kwargs)


__all__ = ["PipelineWidget", "plot_throughput_latency", "plot_timeline", "pipeline_widget"]
