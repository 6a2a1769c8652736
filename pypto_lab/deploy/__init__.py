"""Deploying a model on the simulated NPU: ONNX in (`onnx_import`), ATC's command (`atc`), the OM
artefact out (`om`: `save_om`, `load_om`); and serving it as an AscendCL application does:
`pipeline` simulates pre-processing, copies and execution of request batches on several streams
(throughput, latency, utilisation, a Chrome trace), `sweep` runs it over batch sizes and stream
counts, and `plot_throughput_latency`, `plot_timeline` and `pipeline_widget` show the results."""

from .om import OMError, OMModel, load_om, save_om
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

__all__ = ["ModelSource", "OMError", "OMModel", "Op", "PipelineError", "PipelineResult", "PipelineWidget",
           "StageCosts", "Sweep", "load_om", "measured_image_preprocess_ms", "pipeline", "pipeline_widget",
           "plot_throughput_latency", "plot_timeline", "save_om", "sweep"]
