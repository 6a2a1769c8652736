"""Capture: `torch.export` turns a PyTorch model into the project's `Graph`.

`capture(model, example_inputs)` runs `torch.export` (no tracer of our own) and keeps, for every
ATen call, its target, its tensor inputs, its other arguments, the shapes and dtypes of its
outputs, and the module path it came from. Weights and buffers are graph inputs of kind
"param"/"buffer"; the model's own inputs are kind "input". Capturing the same model with inputs
of the same shapes and dtypes again returns the cached graph, unless the model was edited in place
since (see `model_fingerprint`): then it is captured afresh.

A transformers causal LM is exported through `hf_models.adapt` (called with ``use_cache=False``,
its logits kept); a model whose parameters are on the meta device (shapes only, e.g.
`pypto_lab.llm.hf.build_causal_lm`) is exported with fake CPU weights and inputs (`shapes_only`:
the program a CPU model of those shapes gives, with no weight memory); a model exported
once with dynamic shapes (`export_dynamic`) is specialised to each new size instead of exported
again (`dynamic.specialise`); a TorchScript model (a ScriptModule, or the path of a file
``torch.jit.save`` wrote) is converted by `torchscript.exportable` first. Symbolic-size
arithmetic (``sym_size``, Python ``operator`` calls on sizes) is no kernel: such nodes are left
out of the Graph and their values written into the arguments that read them.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from . import dynamic, hf_models, shapes_only, torchscript
from .fx_node import CaptureError, node_of, replace_nodes, tensor_info
from .graph import Graph, Node, Value

_SIZE_OPS = ("aten.sym_size", "aten.sym_numel", "aten.sym_stride", "aten.sym_storage_offset")


def _is_size_arithmetic(n: torch.fx.Node) -> bool:
    """A node of a program exported with dynamic shapes that computes a size (a Python number once
    specialised): ``aten.sym_size`` and Python operators on sizes. Not a kernel."""
    val = n.meta.get("val")
    if isinstance(val, bool) or not isinstance(val, (int, float)):
        return False
    target = n.target
    return str(target).startswith(_SIZE_OPS) or getattr(target, "__module__", None) in ("operator", "_operator", "math")


def from_exported(ep: torch.export.ExportedProgram, model_name: str = "") -> Graph:
    """Turn an ExportedProgram into the project's Graph."""
    kinds = {}
    targets = {}
    for spec in ep.graph_signature.input_specs:
        kind = {"USER_INPUT": "input", "PARAMETER": "param", "BUFFER": "buffer",
                "CONSTANT_TENSOR": "constant"}.get(spec.kind.name, spec.kind.name.lower())
        kinds[spec.arg.name] = kind
        targets[spec.arg.name] = spec.target or ""
    values: dict[str, Value] = {}
    nodes: list[Node] = []
    outputs: list[str] = []
    scalars: dict[str, Any] = {}
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            values[n.name] = Value(n.name, kinds.get(n.name, "input"), tensor_info(n.meta.get("val"), f"input {n.name}"),
                                   targets.get(n.name, ""))
        elif n.op == "call_function" and _is_size_arithmetic(n):
            scalars[n.name] = n.meta["val"]
        elif n.op == "call_function":
            nodes.append(node_of(n, scalars))
        elif n.op == "output":
            names: list[str] = []
            replace_nodes(n.args, names, scalars)
            outputs = names
    return Graph(values, nodes, outputs, model_name)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (fingerprint, {signature: graph})

# torch.export keeps its tracing state in globals (dispatch-mode stack, module hierarchy), so two
# exports at once corrupt each other. One capture at a time; the cache is read and filled under
# the same lock.
_CAPTURE_LOCK = threading.RLock()


def _signature(example_inputs: tuple) -> tuple:
    sig = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            sig.append(("tensor", tuple(x.shape), str(x.dtype)))
        else:
            sig.append(("value", repr(x)))
    return tuple(sig)


# ---- what an in-place edit of the model changes ---------------------------------------------------

# nn.Module's own bookkeeping: parameters, buffers and children are described one by one, and the
# training flags are left out because capture always exports in eval mode.
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "training"})
_DEPTH = 4  # how deep plain attributes (containers, objects such as a config) are followed


def _tensor_digest(t: torch.Tensor) -> tuple:
    """Shape, dtype and a digest of the values of a tensor that is not a parameter or a buffer:
    `torch.export` makes such a tensor a constant of the program, which the runtime reads from the
    program, not from the model, so one replaced by another of the same shape must be recaptured."""
    head = ("tensor", tuple(t.shape), str(t.dtype))
    try:
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    except (RuntimeError, TypeError, ValueError):  # meta, sparse, quantised tensors: shape and dtype only
        return head
    return (*head, hashlib.blake2b(data, digest_size=16).hexdigest())


def _describe(value: Any, seen: dict[int, int], depth: int = 0) -> Any:
    """A comparable description of an attribute value: scalars and strings as they are, containers
    item by item, tensors and arrays by shape, dtype and values, functions and modules by identity."""
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return value
    if isinstance(value, (float, complex)):
        return repr(value)  # NaN equals itself
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout, torch.Size)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return _tensor_digest(value)
    if isinstance(value, np.ndarray):
        return ("array", value.shape, str(value.dtype),
                hashlib.blake2b(np.ascontiguousarray(value).tobytes(), digest_size=16).hexdigest())
    if isinstance(value, torch.nn.Module):  # a module kept outside the module tree
        return ("module", type(value).__qualname__, id(value))
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        return ("callable", getattr(value, "__module__", ""), value.__qualname__, id(value))
    if isinstance(value, functools.partial):
        return ("partial", _describe(value.func, seen, depth + 1), _describe(value.args, seen, depth + 1),
                _describe(value.keywords, seen, depth + 1))
    if depth >= _DEPTH:
        return ("object", type(value).__qualname__, id(value))
    if isinstance(value, tuple):  # immutable: described by value even where the same object is shared
        return ("tuple", *(_describe(v, seen, depth + 1) for v in value))
    if isinstance(value, frozenset):
        return ("frozenset", *sorted(repr(_describe(v, seen, depth + 1)) for v in value))
    if id(value) in seen:  # a mutable value met before (shared, or a cycle)
        return ("same as", seen[id(value)])
    seen[id(value)] = len(seen)
    if isinstance(value, list):
        return ("list", *(_describe(v, seen, depth + 1) for v in value))
    if isinstance(value, set):
        return ("set", *sorted(repr(_describe(v, seen, depth + 1)) for v in value))
    if isinstance(value, dict):
        return ("dict", *((repr(k), _describe(v, seen, depth + 1)) for k, v in value.items()))
    fields = getattr(value, "__dict__", None)
    if isinstance(fields, dict):  # a plain object, e.g. a transformers config
        return ("object", type(value).__qualname__, _describe(fields, seen, depth + 1))
    return ("object", type(value).__qualname__, repr(value)[:200])


def model_fingerprint(model: torch.nn.Module) -> str:
    """A digest of what the captured graph depends on besides the inputs: the module tree and each
    module's type (and its class's ``forward``), its parameters' and buffers' names, shapes and
    dtypes, and its other attributes (flags such as ``negative_slope`` or ``eps``, a swapped
    activation, hooks, tensors that are constants of the program). Parameter and buffer values
    are left out: they do not change the graph, and the runtime reads them from the live model.
    Cheap: one walk over the modules' attributes."""
    seen: dict[int, int] = {}
    parts = []
    for path, module in model.named_modules(remove_duplicate=False):
        cls = type(module)
        params = [(n, None if p is None else (tuple(p.shape), str(p.dtype), str(p.device)))
                  for n, p in module._parameters.items()]
        buffers = [(n, None if b is None else (tuple(b.shape), str(b.dtype), str(b.device)))
                   for n, b in module._buffers.items()]
        attrs = [(k, _describe(v, seen)) for k, v in vars(module).items() if k not in _MODULE_INTERNALS]
        parts.append((path, cls.__module__, cls.__qualname__, _describe(getattr(cls, "forward", None), seen),
                      params, buffers, attrs))
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def _export_fix(exc: Exception, model: torch.nn.Module | None = None) -> str:
    """What to do about a torch.export failure: the data-dependent hint only where it applies,
    the transformers hint for a transformers model."""
    if "data-dependent" in str(exc) or type(exc).__name__ == "GuardOnDataDependentSymNode":
        fix = ("pypto_lab needs a graph with static shapes and no data-dependent Python control flow: replace "
               "such branches with torch.where/torch.cond, or capture a sub-module that exports")
    else:
        fix = ("pypto_lab captures what torch.export can: change what the error names (see the exception this one "
               "comes from), or capture a sub-module that exports")
    if model is not None and hf_models.is_hf_model(model):
        fix += f". For transformers models: {hf_models.HF_FIX}"
    return fix


def on_meta(model: torch.nn.Module) -> bool:
    """Whether the model's weights are on the meta device (shapes only, no values)."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode inside the block; afterwards every submodule has its own training flag
    back (a BatchNorm frozen in eval inside a model that trains stays frozen), not the model's."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in flags:
            module.training = training


def capture(model: torch.nn.Module, example_inputs, name: str | None = None) -> Graph:
    """Capture ``model`` called on ``example_inputs`` (a tensor or a tuple) with `torch.export`.

    The same model with inputs of the same shapes and dtypes is captured once; later calls return
    a copy of the cached graph. A model edited in place since (a swapped activation, a changed flag
    such as ``negative_slope``, a new hook, a resized weight: anything `model_fingerprint` sees) is
    captured again; new weight values need no new capture (the runtime reads the live model).
    A model exported with dynamic shapes (`export_dynamic`) is specialised to the inputs' sizes
    rather than exported again. Threads may call it at once: captures run one at a time
    (torch.export is not thread-safe).
    """
    if torchscript.is_path(model):  # a file torch.jit.save wrote
        model = torchscript.load(model)
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"capture needs a torch.nn.Module, got {type(model).__name__}; wrap a function "
                           "in a Module whose forward calls it")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    with _CAPTURE_LOCK:
        return _capture_cached(model, example_inputs, name)


def _export(model: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """`torch.export` of ``model`` (through `hf_models.adapt` for a transformers causal LM; a meta
    model with fake CPU weights and inputs, `shapes_only`) in eval mode; failures become a
    CaptureError saying what to do."""
    target = hf_models.adapt(model) if hf_models.is_causal_lm(model) else model
    try:
        with eval_mode(model), torch.no_grad():
            if torchscript.is_script_module(model):  # torch.export refuses ScriptModules: convert it first
                target = torchscript.exportable(model, example_inputs)
            if not on_meta(model):
                return torch.export.export(target, example_inputs, dynamic_shapes=dynamic_shapes)
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            inputs = tuple(torch.utils._pytree.tree_map(lambda x: shapes_only.fake_input(x, mode), example_inputs))
            with shapes_only.as_cpu(target, mode):
                return torch.export.export(target, inputs, dynamic_shapes=dynamic_shapes)
    except torchscript.TorchScriptError:
        raise
    except Exception as exc:  # torch raises many kinds: say what failed and what to do
        raise CaptureError(
            f"torch.export could not capture {type(model).__name__}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. {_export_fix(exc, model)}"
        ) from exc


def export_dynamic(model: torch.nn.Module, example_inputs, dynamic_shapes) -> dynamic.DynamicProgram:
    """Export ``model`` once with ``dynamic_shapes`` (as `torch.export.export` takes them) and
    register the program: later `capture(model, inputs)` calls whose inputs fit its ranges are
    specialised from it, not exported again. Returns the program and the export's duration."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    with _CAPTURE_LOCK:
        start = time.perf_counter()
        ep = _export(model, example_inputs, dynamic_shapes)
        program = dynamic.DynamicProgram(ep, model_fingerprint(model), time.perf_counter() - start)
        dynamic.register(model, program)
        return program


def _capture_cached(model: torch.nn.Module, example_inputs: tuple, name: str | None) -> Graph:
    """The cached graph of ``model`` on inputs like ``example_inputs``, captured if needed (hold
    _CAPTURE_LOCK)."""
    sig = _signature(example_inputs)
    fingerprint = model_fingerprint(model)
    cached = _CACHE.get(model)
    if cached is None or cached[0] != fingerprint:  # new, or edited in place: earlier graphs are stale
        cached = _CACHE[model] = (fingerprint, {})
    per_model = cached[1]
    if sig in per_model:
        return per_model[sig].copy()
    program = dynamic.registered(model)
    if program is not None and program.fingerprint == fingerprint and dynamic.fits(program.program, example_inputs):
        ep = dynamic.specialise(program.program, example_inputs)
    else:
        ep = _export(model, example_inputs)
    graph = from_exported(ep, name or type(model).__name__)
    graph.exported_program = ep  # what `pypto_lab.runtime` interprets (copies carry it over)
    per_model[sig] = graph
    return graph.copy()
