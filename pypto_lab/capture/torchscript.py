"""TorchScript input: a ScriptModule (``torch.jit.script`` / ``torch.jit.trace``) or a file
``torch.jit.save`` wrote, turned into a module `torch.export` can capture.

`torch.export` refuses ScriptModules. torch ships a converter from TorchScript to an
ExportedProgram, ``torch._export.converter.TS2EPConverter(script_module, args).convert()``
(torch >= 2.4; a private module, hence one place that calls it): it reads the TorchScript graph,
not Python, so it needs no source code. `exportable` converts the ScriptModule on the example
inputs (in eval mode, as `capture` exports), unlifts the program into a GraphModule whose
parameters and buffers carry the ScriptModule's own names (``conv1.weight``, ``layer1.0.bn1.
running_mean``: the runtime reads the live ScriptModule's weights by those names), and rewrites
``aten.convolution`` (what ``torch.jit.trace`` records for a convolution) to ``aten.conv2d`` /
``conv1d`` / ``conv3d`` (what `torch.export` records for the eager model), so a traced model gets
the same kernels as its eager model. `capture` then exports that GraphModule as it exports any
model. What is lost: the module hierarchy (the converter keeps none), so kernels of a TorchScript
model name no module path.
"""

from __future__ import annotations

import os
import warnings
import weakref
from pathlib import Path

import torch

CONVERTER = "torch._export.converter.TS2EPConverter"
# ScriptModule -> the GraphModule last converted from it: what exporting its OptimizedModel traces
_CONVERTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TorchScriptError(ValueError):
    """A TorchScript model or file pypto_lab cannot use; the message names the rule, the value and
    the fix."""


def is_script_module(model) -> bool:
    """Whether ``model`` is a TorchScript module (scripted, traced, or loaded with torch.jit.load)."""
    return isinstance(model, torch.jit.ScriptModule)


def is_path(model) -> bool:
    """Whether ``model`` names a file (a ``str`` or ``os.PathLike``) rather than being a model."""
    return isinstance(model, (str, os.PathLike))


def load(path: str | os.PathLike) -> torch.jit.ScriptModule:
    """The ScriptModule ``torch.jit.save`` wrote to ``path``, on the CPU (``torch.jit.load``)."""
    p = Path(path)
    if not p.is_file():
        what = "a folder" if p.is_dir() else "no such file"
        raise TorchScriptError(
            f"a model given as a path must be a TorchScript file (torch.jit.save); got {str(path)!r}: {what}. "
            "Fix: pass the path torch.jit.save wrote, or pass the nn.Module itself")
    try:
        return torch.jit.load(str(p), map_location="cpu")
    except Exception as exc:  # torch raises RuntimeError/ValueError for archives it cannot read
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TorchScriptError(
            f"a model given as a path must be a TorchScript file (torch.jit.save); {str(path)!r} is not one "
            f"(torch.jit.load: {first}). Fix: for a file torch.save wrote (a state_dict or a pickled model), build "
            "the model, load it with torch.load and pass the nn.Module; or save it with "
            "torch.jit.save(torch.jit.script(model), path)") from exc


def _converter():
    try:
        from torch._export.converter import TS2EPConverter
    except ImportError as exc:
        raise TorchScriptError(
            f"optimising a TorchScript model needs {CONVERTER}, which torch {torch.__version__} does not have. "
            "Fix: pass the eager nn.Module the ScriptModule was made from, or use torch >= 2.4") from exc
    return TS2EPConverter


def _drop_input_guards(gm: torch.fx.GraphModule) -> None:
    """Remove the unlifted module's input-shape guard (``_guards_fn``): it checks the converter's
    symbolic size ranges (e.g. batch >= 2 after a batch-2 example), which `capture` replaces by
    concrete shapes, and it does not run under ``torch.jit.trace`` (``dynamo=False`` ONNX export)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()


def _conv_as_export_records(gm: torch.fx.GraphModule) -> int:
    """Rewrite non-transposed ``aten.convolution`` nodes to ``aten.conv1d/2d/3d`` (same arguments
    minus ``transposed`` and ``output_padding``); returns how many were rewritten."""
    by_rank = {3: torch.ops.aten.conv1d.default, 4: torch.ops.aten.conv2d.default, 5: torch.ops.aten.conv3d.default}
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.convolution.default:
            continue
        x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = node.args
        val = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
        rank = val.dim() if isinstance(val, torch.Tensor) else None
        if transposed or rank not in by_rank or any(p != 0 for p in output_padding):
            continue
        node.target = by_rank[rank]
        node.args = (x, weight, bias, stride, padding, dilation, groups)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def exportable(script: torch.jit.ScriptModule, example_inputs: tuple, kwargs: dict | None = None) -> torch.nn.Module:
    """A GraphModule computing what ``script`` computes on inputs like ``example_inputs``, with the
    ScriptModule's parameter and buffer names, that `torch.export` can export (see the module
    docstring). Call it in the mode the capture wants (eval): TorchScript reads ``training`` then."""
    converter = _converter()
    name = getattr(script, "original_name", type(script).__name__)
    try:
        with warnings.catch_warnings():  # one note per unused BatchNorm counter (num_batches_tracked)
            warnings.filterwarnings("ignore", message="Manually populate .* never used by the ExportedProgram")
            program = converter(script, tuple(example_inputs), kwargs or None).convert()
        gm = program.module()
    except Exception as exc:  # the converter raises many kinds: say which step failed and what to do
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TorchScriptError(
            f"a TorchScript model is optimised through {CONVERTER}, and it could not convert {name} called on the "
            f"example inputs: {type(exc).__name__}: {first}. Fix: pass the eager nn.Module the ScriptModule was "
            "made from, or torch.jit.trace the model instead of scripting it (a traced module has no Python "
            "control flow), or optimise a sub-module that converts") from exc
    branching = sorted({str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes
                        if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)})
    if branching:
        raise TorchScriptError(
            f"pypto_lab simulates a graph without data-dependent control flow, and {name}'s TorchScript graph "
            f"branches or loops on tensor values (converted to torch.{', torch.'.join(branching)}). Fix: "
            "torch.jit.trace the model on the example inputs (a trace records the branch those inputs take), "
            "or pass the eager nn.Module with the branch written as torch.where")
    _drop_input_guards(gm)
    _conv_as_export_records(gm)
    _CONVERTED[script] = gm
    return gm


def converted(script: torch.jit.ScriptModule) -> torch.nn.Module | None:
    """The GraphModule `exportable` last made from ``script`` (None if it was never converted):
    exporters (torch.onnx.export, torch.export, torch.jit.trace) trace it in the ScriptModule's
    place, since they cannot trace a ScriptModule called from Python. The converter keeps sizes
    symbolic, so it serves any batch size."""
    return _CONVERTED.get(script)


__all__ = ["CONVERTER", "TorchScriptError", "converted", "exportable", "is_path", "is_script_module", "load"]
