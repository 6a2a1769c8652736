"""Deploying a model as an AscendCL application does: `pipeline` simulates pre-processing, copies
and execution of request batches on several streams (throughput, latency, utilisation, a Chrome
trace), `sweep` runs it over batch sizes and stream counts, and `plot_throughput_latency`,
`plot_timeline` and `pipeline_widget` show the results."""

from .pipeline import (
    ModelSource,
    Op,
    PipelineError,
    PipelineResult,
    StageCosts,
    Sweep,
    measured_image_preprocess_ms,
    pipeline,
    sweep,
)
from .views import PipelineWidget, pipeline_widget, plot_throughput_latency, plot_timeline

__all__ = ["ModelSource", "Op", "PipelineError", "PipelineResult", "PipelineWidget", "StageCosts", "Sweep",
           "measured_image_preprocess_ms", "pipeline", "pipeline_widget", "plot_throughput_latency",
           "plot_timeline", "sweep"]
