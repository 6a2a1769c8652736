"""Stage 1 of the data path: a PyTorch model becomes the project's `Graph`.

`export.capture` runs `torch.export`; `graph` holds the graph it makes; `fx_node` turns one
torch.fx node of any graph (an exported program's, a training step's joint graph's) into a `Node`
with the shapes it reads; `catalogue` is the type of a lowering-table entry (the table itself is
`pypto_lab.lowering.table`). `hf_models` adapts transformers causal LMs
(called with ``use_cache=False``), `shapes_only` exports models whose weights are on the meta
device, `dynamic` specialises a program exported once with dynamic shapes (`export_dynamic`) to
each concrete size, and `torchscript` converts TorchScript models (ScriptModules, torch.jit.save
files) for export.

The package is callable: ``pypto_lab.capture(model, inputs)`` is `export.capture` (the public name
and the stage's folder are one name, so both must work whichever is imported first).
"""

import sys
import types

from .export import CaptureError, capture, export_dynamic, from_exported
from .graph import Graph, Node, TensorInfo, Value
from .torchscript import TorchScriptError


class _CallablePackage(types.ModuleType):
    """``pypto_lab.capture`` as a function: ``pypto_lab.capture(model, example_inputs)``."""

    def __call__(self, model, example_inputs, *args, **kwargs) -> Graph:
        return capture(model, example_inputs, *args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["CaptureError", "Graph", "Node", "TensorInfo", "TorchScriptError", "Value", "capture", "export_dynamic",
           "from_exported"]
