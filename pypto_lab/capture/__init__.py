"""Stage 1 of the data path: a PyTorch model becomes the project's `Graph`.

`export.capture` runs `torch.export`; `graph` holds the graph it makes; `catalogue` says which
NPU operator, on which unit, runs each ATen operator; `zoo` builds the models the command line
knows by name. `hf_models` adapts transformers causal LMs (called with ``use_cache=False``),
`shapes_only` exports models whose weights are on the meta device, `dynamic` specialises a
program exported once with dynamic shapes (`export_dynamic`) to each concrete size, and
`torchscript` converts TorchScript models (ScriptModules, torch.jit.save files) for export.
"""

from .export import CaptureError, capture, export_dynamic, from_exported
from .graph import Graph, Node, TensorInfo, Value
from .torchscript import TorchScriptError

__all__ = ["CaptureError", "Graph", "Node", "TensorInfo", "TorchScriptError", "Value", "capture", "export_dynamic",
           "from_exported"]
