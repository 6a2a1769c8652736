"""Stage 1 of the data path: a PyTorch model becomes the project's `Graph`.

`export.capture` runs `torch.export`; `graph` holds the graph it makes; `catalogue` says which
NPU operator, on which unit, runs each ATen operator; `zoo` builds the models the command line
knows by name.
"""

from .export import CaptureError, capture, export_dynamic, from_exported
from .graph import Graph, Node, TensorInfo, Value

__all__ = ["CaptureError", "Graph", "Node", "TensorInfo", "Value", "capture", "export_dynamic", "from_exported"]
