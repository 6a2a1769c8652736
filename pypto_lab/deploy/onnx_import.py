"""ONNX in: an ONNX model (read and checked with the ``onnx`` package) becomes a `torch.nn.Module`
that `pypto_lab.optimize` captures with torch.export like any model.

`import_onnx(path_or_proto, input_shapes=None, out_nodes=None)` returns an `ONNXModule` and
its example inputs. The module's ``forward`` walks the ONNX graph in order and calls, for each
node, the torch function of the same meaning (Conv -> ``F.conv2d``, Gemm -> ``F.linear``,
BatchNormalization -> ``F.batch_norm``, ...), so the captured ATen program is what the same
network written in PyTorch gives, and the workbench's passes (Conv+BN folding, fusion, layouts)
apply to it. Float initializers become parameters; integer initializers and everything computed
from shapes (Shape, Gather, Concat, Unsqueeze ... on constants) are evaluated once, with numpy,
as the static values ATC folds.

An ONNX operator this importer does not know becomes a CPU fallback, as an unknown ATen operator
does in `optimize`: one call of the operator ``pypto_onnx::<OpType>`` (registered on first use),
which runs that node with the ``onnx`` package's reference implementation (its output shapes come
from ONNX shape inference). The report lists it among ``fallback_ops`` (e.g.
``pypto_onnx.Softplus.default``) and costs it on the host lane.
"""

from __future__ import annotations

import json
import math
import operator
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

SUPPORTED_OPSET = (7, 23)


class OnnxImportError(ValueError):
    """An ONNX model the importer cannot turn into a torch module; the message says why and what to do."""


# ---- the CPU-fallback operators ----------------------------------------------------------------------

def _run_onnx_node(inputs: list[torch.Tensor], model: str, outputs: str) -> list[torch.Tensor]:
    """Run one ONNX node (``model``: a one-node ONNX model, hex) with onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    proto = onnx.ModelProto.FromString(bytes.fromhex(model))
    feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(proto.graph.input, inputs, strict=True)}
    results = ReferenceEvaluator(proto).run(None, feeds)
    return [torch.from_numpy(np.ascontiguousarray(r)).clone() for r in results]


def _fake_onnx_node(inputs, model, outputs):
    return [torch.empty(o["shape"], dtype=getattr(torch, o["dtype"])) for o in json.loads(outputs)]


_FALLBACKS: dict[str, Any] = {}


def fallback_name(op_type: str, domain: str = "") -> str:
    """The operator name an ONNX op runs as on the CPU lane: ``pypto_onnx::<OpType>``
    (``<domain>__<OpType>`` for another domain, dots as underscores)."""
    name = op_type if domain in ("", "ai.onnx") else f"{domain}__{op_type}"
    return re.sub(r"\W", "_", name)


def fallback_op(name: str) -> Any:
    """``torch.ops.pypto_onnx.<name>.default``, registered on first use: it runs the ONNX node its
    arguments carry with onnx's reference implementation (a CPU fallback in the report, listed as
    ``pypto_onnx.<name>.default``)."""
    if name not in _FALLBACKS:
        if not name.isidentifier():
            raise OnnxImportError(f"{name!r} is not a valid operator name")
        op = torch.library.custom_op(f"pypto_onnx::{name}", mutates_args=())(_run_onnx_node)
        op.register_fake(_fake_onnx_node)
        _FALLBACKS[name] = getattr(torch.ops.pypto_onnx, name).default
    return _FALLBACKS[name]


# ---- helpers ----------------------------------------------------------------------------------------

def _torch_dtype(onnx_type: int) -> torch.dtype:
    np_dtype = helper.tensor_dtype_to_np_dtype(onnx_type)
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        out[a.name] = v
    return out


def _static(v: Any) -> bool:
    return isinstance(v, np.ndarray)


def _tensor(v: Any) -> Any:
    """A static value as a tensor (a constant of the captured program)."""
    if isinstance(v, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(v)).clone()
    return v


def _ints(v: Any, what: str, node: onnx.NodeProto) -> list[int]:
    if v is None:
        return []
    if isinstance(v, torch.Tensor):
        raise OnnxImportError(f"node {node.name or node.op_type} ({node.op_type}): its {what} is computed at run "
                              "time; the simulator needs static shapes: give every input a fixed shape "
                              "(--input_shape) so it can be folded, or simplify the model (onnxsim)")
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _pads2d(pads: list[int], nd: int) -> tuple[list[int], list[int] | None]:
    """ONNX pads [b1, b2, ..., e1, e2, ...] -> torch's symmetric padding, or an explicit F.pad."""
    if not pads:
        return [0] * nd, None
    begin, end = pads[:nd], pads[nd:]
    if begin == end:
        return begin, None
    explicit = []
    for b, e in zip(reversed(begin), reversed(end), strict=True):
        explicit += [b, e]
    return [0] * nd, explicit


def _same_pads(in_shape, kernel, strides, dilations, upper: bool) -> list[int]:
    begin, end = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if upper else big)
        end.append(big if upper else small)
    return begin + end


def _axes(attrs: dict, inputs: list, index: int, node) -> list[int] | None:
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    if len(inputs) > index and inputs[index] is not None:
        return _ints(inputs[index], "axes", node)
    return None


# ---- the operators -----------------------------------------------------------------------------------

def _conv(x, w, b=None, *, node, attrs):
    nd = x.dim() - 2
    kernel = list(attrs.get("kernel_shape", w.shape[2:]))
    strides = list(attrs.get("strides", [1] * nd))
    dilations = list(attrs.get("dilations", [1] * nd))
    auto = attrs.get("auto_pad", "NOTSET")
    pads = list(attrs.get("pads", []))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(list(x.shape[2:]), kernel, strides, dilations, auto == "SAME_UPPER")
    padding, explicit = _pads2d(pads, nd)
    if explicit:
        x = F.pad(x, explicit)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(nd)
    if fn is None:
        raise OnnxImportError(f"node {node.name} (Conv): {nd}-d convolution is not supported")
    return fn(x, w, b, strides, padding, dilations, int(attrs.get("group", 1)))


def _pool(kind):
    def run(x, *, node, attrs):
        nd = x.dim() - 2
        kernel = list(attrs["kernel_shape"])
        strides = list(attrs.get("strides", [1] * nd))
        dilations = list(attrs.get("dilations", [1] * nd))
        auto = attrs.get("auto_pad", "NOTSET")
        pads = list(attrs.get("pads", []))
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            pads = _same_pads(list(x.shape[2:]), kernel, strides, dilations, auto == "SAME_UPPER")
        padding, explicit = _pads2d(pads, nd)
        ceil = bool(attrs.get("ceil_mode", 0))
        if explicit:
            x = F.pad(x, explicit, value=-math.inf if kind == "max" else 0.0)
        if nd != 2:
            raise OnnxImportError(f"node {node.name} ({node.op_type}): only 2-d pooling is supported")
        if kind == "max":
            return F.max_pool2d(x, kernel, strides, padding, dilations, ceil)
        return F.avg_pool2d(x, kernel, strides, padding, ceil, bool(attrs.get("count_include_pad", 0)))
    return run


def _gemm(a, b, c=None, *, node, attrs):
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if attrs.get("transA", 0):
        a = a.t()
    if alpha == 1.0 and beta == 1.0 and (c is None or c.dim() <= 1):
        w = b if attrs.get("transB", 0) else b.t()
        return F.linear(a, w, c)
    b = b.t() if attrs.get("transB", 0) else b
    out = torch.matmul(a, b) * alpha
    return out if c is None else out + c * beta


def _batch_norm(x, scale, bias, mean, var, *, node, attrs):
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, float(attrs.get("epsilon", 1e-5)))


def _flatten(x, *, node, attrs):
    axis = int(attrs.get("axis", 1))
    axis = axis + x.dim() if axis < 0 else axis
    lead = math.prod(x.shape[:axis])
    return x.reshape(lead, -1)


def _reshape(x, shape, *, node, attrs):
    shape = _ints(shape, "target shape", node)
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _softmax(fn):
    def run(x, *, node, attrs, opset):
        axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
        axis = axis + x.dim() if axis < 0 else axis
        if opset >= 13 or axis == x.dim() - 1:
            return fn(x, axis)
        shape = x.shape
        return fn(x.reshape(math.prod(shape[:axis]), -1), 1).reshape(shape)
    return run


def _reduce(fn_name):
    def run(x, *rest, node, attrs):
        axes = _axes(attrs, [x, *rest], 1, node)
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        if fn_name == "mean":
            return torch.mean(x, dim=axes, keepdim=keep)
        if fn_name == "sum":
            return torch.sum(x, dim=axes, keepdim=keep)
        out = x
        for a in sorted((a % x.dim() for a in axes), reverse=True):
            out = (torch.amax if fn_name == "max" else torch.amin)(out, dim=a, keepdim=keep)
        return out
    return run


def _global_pool(kind):
    def run(x, *, node, attrs):
        if kind == "avg" and x.dim() == 4:
            return F.adaptive_avg_pool2d(x, 1)
        dims = list(range(2, x.dim()))
        return torch.mean(x, dim=dims, keepdim=True) if kind == "avg" else torch.amax(x, dim=dims, keepdim=True)
    return run


def _binary(torch_fn, np_fn):
    """An element-wise binary operator: numpy on two static values; else torch, a static scalar
    kept as a Python number (so ``x * 0.5`` captures as mul.Tensor by a scalar, as PyTorch does)."""
    def run(a, b, *, node, attrs):
        if _static(a) and _static(b):
            return np.asarray(np_fn(a, b))
        a = a.item() if _static(a) and a.ndim == 0 else _tensor(a)
        b = b.item() if _static(b) and b.ndim == 0 else _tensor(b)
        if not isinstance(a, torch.Tensor) and torch_fn not in _SCALAR_OK:
            a = torch.full_like(b, a)
        if not isinstance(b, torch.Tensor) and torch_fn not in _SCALAR_OK:
            b = torch.full_like(a, b)
        return _SCALAR_OK.get(torch_fn, torch_fn)(a, b)
    return run


_SCALAR_OK = {torch.add: operator.add, torch.sub: operator.sub, torch.mul: operator.mul,
              torch.div: operator.truediv, torch.pow: operator.pow}


def _div(a, b):
    return a // b if np.issubdtype(np.asarray(a).dtype, np.integer) else a / b


def _unary(torch_fn):
    def run(x, *, node, attrs):
        return torch_fn(_tensor(x))
    return run


def _clip(x, lo=None, hi=None, *, node, attrs):
    lo = attrs.get("min", lo)
    hi = attrs.get("max", hi)
    lo = float(np.asarray(lo).reshape(())) if lo is not None and not isinstance(lo, torch.Tensor) else lo
    hi = float(np.asarray(hi).reshape(())) if hi is not None and not isinstance(hi, torch.Tensor) else hi
    if lo == 0.0 and hi is None:
        return F.relu(x)
    if lo == 0.0 and hi == 6.0:
        return F.relu6(x)
    return torch.clamp(x, lo, hi)


def _concat(*xs, node, attrs):
    axis = int(attrs["axis"])
    if all(_static(x) for x in xs):
        return np.concatenate(xs, axis=axis)
    return torch.cat([_tensor(x) for x in xs], dim=axis)


def _transpose(x, *, node, attrs):
    perm = attrs.get("perm")
    if perm is None:
        perm = list(reversed(range(x.ndim if _static(x) else x.dim())))
    return np.transpose(x, perm) if _static(x) else x.permute(*perm)


def _unsqueeze(x, *rest, node, attrs):
    axes = _axes(attrs, [x, *rest], 1, node)
    nd = (x.ndim if _static(x) else x.dim()) + len(axes)
    axes = sorted(a % nd for a in axes)
    for a in axes:
        x = np.expand_dims(x, a) if _static(x) else x.unsqueeze(a)
    return x


def _squeeze(x, *rest, node, attrs):
    axes = _axes(attrs, [x, *rest], 1, node)
    shape = x.shape
    if axes is None:
        axes = [i for i, s in enumerate(shape) if s == 1]
    axes = sorted((a % len(shape) for a in axes), reverse=True)
    for a in axes:
        x = np.squeeze(x, a) if _static(x) else x.squeeze(a)
    return x


def _shape(x, *, node, attrs):
    shape = list(x.shape)
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.asarray(shape[start:end], dtype=np.int64)


def _gather(data, idx, *, node, attrs):
    axis = int(attrs.get("axis", 0))
    if _static(data) and _static(idx):
        return np.take(data, idx, axis=axis)
    if _static(idx):
        if idx.ndim == 0:
            return data.select(axis, int(idx) % data.shape[axis])
        flat = torch.from_numpy(np.asarray(idx % data.shape[axis], dtype=np.int64).reshape(-1))
        out = torch.index_select(data, axis, flat)
        return out.reshape(*data.shape[:axis], *idx.shape, *data.shape[axis + 1:])
    return torch.index_select(_tensor(data), axis, idx.reshape(-1)).reshape(
        *data.shape[:axis], *idx.shape, *data.shape[axis + 1:])


def _cast(x, *, node, attrs):
    to = int(attrs["to"])
    if _static(x):
        return x.astype(helper.tensor_dtype_to_np_dtype(to))
    return x.to(_torch_dtype(to))


def _slice(x, *rest, node, attrs, opset):
    if opset < 10:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        vals = [_ints(v, "slice bounds", node) if v is not None else None for v in rest] + [None] * 3
        starts, ends, axes, steps = vals[0], vals[1], vals[2], vals[3]
    nd = x.ndim if _static(x) else x.dim()
    axes = list(range(len(starts))) if not axes else [a % nd for a in axes]
    steps = steps or [1] * len(starts)
    index = [slice(None)] * nd
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        size = x.shape[a]
        s = max(-size, min(size, s))
        e = max(-size - 1, min(size, e))
        if st < 0:
            raise OnnxImportError(f"node {node.name} (Slice): negative steps are not supported")
        index[a] = slice(s, e, st)
    return x[tuple(index)]


def _split(x, *rest, node, attrs, opset):
    axis = int(attrs.get("axis", 0))
    sizes = attrs.get("split")
    if sizes is None and rest and rest[0] is not None:
        sizes = _ints(rest[0], "split sizes", node)
    n = len(node.output)
    if sizes is None:
        size = x.shape[axis]
        chunk = -(-size // n)
        sizes = [chunk] * (n - 1) + [size - chunk * (n - 1)]
    return tuple(torch.split(x, list(sizes), dim=axis))


def _layer_norm(x, scale, bias=None, *, node, attrs):
    axis = int(attrs.get("axis", -1))
    axis = axis % x.dim()
    return F.layer_norm(x, list(x.shape[axis:]), scale, bias, float(attrs.get("epsilon", 1e-5)))


def _constant_of_shape(shape, *, node, attrs):
    value = attrs.get("value", np.zeros(1, dtype=np.float32))
    return np.full(_ints(shape, "shape", node), value.reshape(-1)[0], dtype=value.dtype)


def _expand(x, shape, *, node, attrs):
    shape = _ints(shape, "shape", node)
    if _static(x):
        return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape))).copy()
    return x.expand(*torch.broadcast_shapes(tuple(x.shape), tuple(shape)))


def _where(c, a, b, *, node, attrs):
    if _static(c) and _static(a) and _static(b):
        return np.where(c, a, b)
    a, b = _tensor(a), _tensor(b)
    return torch.where(_tensor(c), a, b)


def _range(start, limit, delta, *, node, attrs):
    return np.arange(start.item(), limit.item(), delta.item(), dtype=np.asarray(start).dtype)


def _identity(x, *rest, node, attrs):
    return x


def _dropout(x, *rest, node, attrs):
    return x if len(node.output) < 2 or not node.output[1] else (x, torch.ones_like(x, dtype=torch.bool))


def _gelu(x, *, node, attrs):
    return F.gelu(x, approximate=attrs.get("approximate", "none"))


OPS: dict[str, Any] = {
    "Conv": _conv, "BatchNormalization": _batch_norm, "Gemm": _gemm, "MatMul": lambda a, b, *, node, attrs:
        torch.matmul(_tensor(a), _tensor(b)),
    "MaxPool": _pool("max"), "AveragePool": _pool("avg"), "GlobalAveragePool": _global_pool("avg"),
    "GlobalMaxPool": _global_pool("max"), "Flatten": _flatten, "Reshape": _reshape, "Transpose": _transpose,
    "Softmax": _softmax(torch.softmax), "LogSoftmax": _softmax(torch.log_softmax),
    "ReduceMean": _reduce("mean"), "ReduceSum": _reduce("sum"), "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"),
    "Relu": _unary(F.relu), "Sigmoid": _unary(torch.sigmoid), "Tanh": _unary(torch.tanh), "Exp": _unary(torch.exp),
    "Log": _unary(torch.log), "Sqrt": _unary(torch.sqrt), "Neg": _unary(torch.neg), "Abs": _unary(torch.abs),
    "Erf": _unary(torch.erf), "Reciprocal": _unary(torch.reciprocal), "Gelu": _gelu,
    "LeakyRelu": lambda x, *, node, attrs: F.leaky_relu(x, float(attrs.get("alpha", 0.01))),
    "HardSigmoid": lambda x, *, node, attrs: torch.clamp(x * float(attrs.get("alpha", 0.2))
                                                         + float(attrs.get("beta", 0.5)), 0.0, 1.0),
    "HardSwish": _unary(F.hardswish), "Clip": _clip,
    "Add": _binary(torch.add, np.add), "Sub": _binary(torch.sub, np.subtract), "Mul": _binary(torch.mul, np.multiply),
    "Div": _binary(torch.div, _div), "Pow": _binary(torch.pow, np.power),
    "Max": _binary(torch.maximum, np.maximum), "Min": _binary(torch.minimum, np.minimum),
    "Equal": _binary(torch.eq, np.equal), "Concat": _concat, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Shape": _shape, "Gather": _gather, "Cast": _cast, "Slice": _slice, "Split": _split,
    "LayerNormalization": _layer_norm, "ConstantOfShape": _constant_of_shape, "Expand": _expand, "Where": _where,
    "Range": _range, "Identity": _identity, "Dropout": _dropout,
}
_OPSET_ARG = {"Softmax", "LogSoftmax", "Slice", "Split"}


# ---- the module ----------------------------------------------------------------------------------

def _safe(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "w"
    if base[0].isdigit():
        base = "w_" + base
    out, i = base, 1
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    taken.add(out)
    return out


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    t = value_info.type.tensor_type
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def parse_input_shape(text: str | None) -> dict[str, list[int]]:
    """ATC's ``--input_shape``: ``"name:1,3,224,224;name2:1,128"`` -> {name: dims}."""
    shapes: dict[str, list[int]] = {}
    if not text:
        return shapes
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise OnnxImportError(f"--input_shape {text!r}: {part!r} is not NAME:d1,d2,...; e.g. "
                                  "--input_shape=\"input:1,3,224,224\" (several inputs separated by ';')")
        try:
            values = [int(d) for d in dims.split(",") if d.strip()] if dims.strip() else []
        except ValueError as exc:
            raise OnnxImportError(f"--input_shape {text!r}: {dims!r} is not a list of integers; e.g. "
                                  "--input_shape=\"input:1,3,224,224\"") from exc
        if any(v < 1 for v in values):
            raise OnnxImportError(f"--input_shape {text!r}: {name} has a dimension below 1 ({dims}); the "
                                  "simulator needs a fixed, positive shape for every dimension")
        shapes[name] = values
    return shapes


class ONNXModule(torch.nn.Module):
    """An ONNX graph as a torch module (see the module's doc). ``input_names`` / ``output_names``:
    the ONNX graph's; ``input_shapes``: the fixed shapes; ``fallback_ops``: the ONNX operators run
    as CPU fallbacks."""

    def __init__(self, model: onnx.ModelProto, input_shapes: dict[str, list[int]] | None = None,
                 out_nodes: list[str] | None = None):
        super().__init__()
        graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        init_names = {i.name for i in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in init_names]
        self._input_types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
        given = dict(input_shapes or {})
        unknown = sorted(set(given) - set(self.input_names))
        if unknown:
            raise OnnxImportError(f"--input_shape names {', '.join(unknown)}, which the model has no input called; "
                                  f"its inputs are {', '.join(self.input_names)}")
        self.input_shapes: dict[str, list[int]] = {}
        self.changed_dims: list[str] = []   # fixed dimensions of the model that --input_shape changed
        for i in graph.input:
            if i.name in init_names:
                continue
            dims = _dims(i)
            if i.name in given:
                if len(given[i.name]) != len(dims):
                    raise OnnxImportError(f"--input_shape gives {i.name} {len(given[i.name])} dimensions, the model "
                                          f"{len(dims)} ({dims})")
                changed = [f"{i.name}[{k}]: {d} -> {g}" for k, (d, g) in enumerate(zip(dims, given[i.name],
                                                                                        strict=True))
                           if isinstance(d, int) and d > 0 and d != g]
                self.changed_dims += changed
                dims = given[i.name]
            bad = [d for d in dims if not isinstance(d, int) or d < 1]
            if bad:
                raise OnnxImportError(f"input {i.name} has dynamic dimensions {dims}: the simulator needs fixed "
                                      f"shapes; give them with --input_shape=\"{i.name}:"
                                      + ",".join("1" if not isinstance(d, int) or d < 1 else str(d) for d in dims)
                                      + "\"")
            self.input_shapes[i.name] = [int(d) for d in dims]
        self.output_names = self._outputs(graph, out_nodes)
        taken: set[str] = set()
        self._weights: dict[str, str] = {}   # ONNX name -> attribute name
        self._static: dict[str, np.ndarray] = {}
        for init in graph.initializer:
            arr = numpy_helper.to_array(init)
            if np.issubdtype(arr.dtype, np.floating) and arr.ndim > 0:
                attr = _safe(init.name, taken)
                self.register_parameter(attr, torch.nn.Parameter(torch.from_numpy(arr.copy()), requires_grad=False))
                self._weights[init.name] = attr
            else:
                self._static[init.name] = arr
        self.nodes = self._needed(list(graph.node), self.output_names)
        self.fallback_ops: list[str] = []
        self._fallback: dict[int, tuple[str, str]] = {}
        for idx, node in enumerate(self.nodes):
            if node.op_type == "Constant":
                value = self._constant(node)
                if np.issubdtype(value.dtype, np.floating) and value.ndim > 0:
                    attr = _safe("const_" + node.output[0], taken)
                    self.register_buffer(attr, torch.from_numpy(value.copy()))
                    self._weights[node.output[0]] = attr
                else:
                    self._static[node.output[0]] = value
            elif node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
                self.fallback_ops.append(node.op_type if node.domain in ("", "ai.onnx")
                                         else f"{node.domain}::{node.op_type}")
                self._fallback[idx] = ("", "")
        if self._fallback:
            self._plan_fallbacks(model)

    @staticmethod
    def _constant(node: onnx.NodeProto) -> np.ndarray:
        attrs = _attrs(node)
        for key, dtype in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                           ("value_int", np.int64), ("value_ints", np.int64)):
            if key in attrs:
                return np.asarray(attrs[key], dtype=dtype)
        raise OnnxImportError(f"Constant node {node.name}: attribute {', '.join(attrs)} is not supported")

    @staticmethod
    def _needed(nodes: list, outputs: list[str]) -> list:
        """The nodes the outputs depend on (--out_nodes cuts the graph there, as ATC does)."""
        wanted = set(outputs)
        keep = []
        for node in reversed(nodes):
            if wanted.intersection(node.output):
                keep.append(node)
                wanted.update(i for i in node.input if i)
        return keep[::-1]

    def _outputs(self, graph, out_nodes: list[str] | None) -> list[str]:
        if not out_nodes:
            return [o.name for o in graph.output]
        by_node = {n.name: list(n.output) for n in graph.node}
        tensors = {o for n in graph.node for o in n.output}
        names = []
        for spec in out_nodes:
            node, sep, index = spec.rpartition(":")
            if sep and node in by_node and index.isdigit() and int(index) < len(by_node[node]):
                names.append(by_node[node][int(index)])
            elif spec in tensors:
                names.append(spec)
            elif spec in by_node:
                names.append(by_node[spec][0])
            else:
                raise OnnxImportError(f"--out_nodes {spec!r}: the model has no node or tensor of that name; give "
                                      "NODE_NAME:INDEX (e.g. --out_nodes=\"/fc/Gemm:0\") separated by ';'")
        return names

    def _plan_fallbacks(self, model: onnx.ModelProto) -> None:
        """Output shapes of the nodes run as CPU fallbacks (ONNX shape inference on the fixed input
        shapes), and a one-node model for each."""
        fixed = onnx.ModelProto()
        fixed.CopyFrom(model)
        for i in fixed.graph.input:
            if i.name in self.input_shapes:
                dims = i.type.tensor_type.shape.dim
                del dims[:]
                for d in self.input_shapes[i.name]:
                    dims.add().dim_value = d
        try:
            inferred = onnx.shape_inference.infer_shapes(fixed, strict_mode=False, data_prop=True)
        except Exception as exc:  # noqa: BLE001  (onnx raises several kinds)
            raise OnnxImportError(f"ONNX shape inference failed ({exc}); the operators {', '.join(self.fallback_ops)} "
                                  "would run as CPU fallbacks and need it") from exc
        infos = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
        for init in model.graph.initializer:
            infos.setdefault(init.name, helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        for idx in self._fallback:
            node = self.nodes[idx]
            ins, outs = [], []
            for name in node.input:
                info = infos.get(name)
                if not name or info is None:
                    raise OnnxImportError(self._unknown_msg(node, f"the type of its input {name!r} is unknown"))
                ins.append(info)
            for name in node.output:
                info = infos.get(name)
                dims = _dims(info) if info is not None else ["?"]
                if info is None or any(not isinstance(d, int) or d < 1 for d in dims):
                    raise OnnxImportError(self._unknown_msg(node, f"ONNX shape inference gives its output {name!r} "
                                                                  f"no fixed shape ({dims})"))
                dtype = str(_torch_dtype(info.type.tensor_type.elem_type)).removeprefix("torch.")
                outs.append({"shape": dims, "dtype": dtype, "info": info})
            one = helper.make_model(helper.make_graph([node], f"fallback_{node.op_type}", ins,
                                                      [o.pop("info") for o in outs]),
                                    opset_imports=list(model.opset_import), ir_version=model.ir_version)
            self._check_runnable(node, one)
            self._fallback[idx] = (one.SerializeToString().hex(), json.dumps(outs))

    def _check_runnable(self, node: onnx.NodeProto, one: onnx.ModelProto) -> None:
        """A CPU fallback runs on onnx's reference evaluator: an operator it has no implementation
        of (a custom domain's, or one onnx does not ship) is refused now, at import (``atc``) time,
        not when the compiled model first runs."""
        from onnx.reference import ReferenceEvaluator

        try:
            ReferenceEvaluator(one)
        except Exception as exc:  # noqa: BLE001  (NotImplementedError for an unknown op, others for bad attributes)
            where = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
            raise OnnxImportError(
                f"ONNX operator {where} (node {node.name or node.output[0]}) cannot run: the importer does not convert "
                f"it, and onnx's reference evaluator, which runs unconverted operators as CPU fallbacks, has no "
                f"implementation of it ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}). Fix: export the "
                "model with standard ONNX operators (a custom domain's op, e.g. a vendor's fused kernel, has no "
                "meaning outside its runtime), or compile the PyTorch model with pypto_lab.optimize and give the "
                "op an implementation there (pypto_lab.custom_op)") from None

    def _unknown_msg(self, node, why: str) -> str:
        known = ", ".join(sorted(OPS))
        return (f"ONNX operator {node.op_type} (node {node.name or node.output[0]}) is not one the importer "
                f"converts, and it cannot run as a CPU fallback: {why}. Operators converted: {known}")

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        out = []
        for name in self.input_names:
            dtype = _torch_dtype(self._input_types[name])
            shape = self.input_shapes[name]
            if dtype.is_floating_point:
                out.append(torch.randn(shape, generator=gen).to(dtype))
            else:
                out.append(torch.zeros(shape, dtype=dtype))
        return tuple(out)

    def forward(self, *inputs: torch.Tensor):
        env: dict[str, Any] = dict(self._static)
        for name, attr in self._weights.items():
            env[name] = getattr(self, attr)
        for name, x in zip(self.input_names, inputs, strict=True):
            env[name] = x
        for idx, node in enumerate(self.nodes):
            if node.op_type == "Constant":
                continue
            args = [env[i] if i else None for i in node.input]
            while args and args[-1] is None:
                args.pop()
            if idx in self._fallback:
                model, outs = self._fallback[idx]
                results = fallback_op(fallback_name(node.op_type, node.domain))([_tensor(a) for a in args], model,
                                                                               outs)
            else:
                fn = OPS[node.op_type]
                kwargs: dict[str, Any] = {"node": node, "attrs": _attrs(node)}
                if node.op_type in _OPSET_ARG:
                    kwargs["opset"] = self.opset
                results = fn(*args, **kwargs)
            results = results if isinstance(results, (tuple, list)) else (results,)
            for name, val in zip(node.output, results, strict=False):
                if name:
                    env[name] = val
        outs = tuple(_tensor(env[name]) for name in self.output_names)
        return outs[0] if len(outs) == 1 else outs


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Read and check an ONNX file; clear errors for a missing, foreign or invalid one."""
    path = Path(path)
    if not path.is_file():
        raise OnnxImportError(f"--model {path}: no such file; give the path of an .onnx file")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError and others)
        raise OnnxImportError(f"--model {path}: not an ONNX model ({type(exc).__name__}: {exc}); --framework=5 "
                              "reads ONNX files (torch.onnx.export writes them)") from exc
    if not model.graph.node:
        raise OnnxImportError(f"--model {path}: an ONNX file with no nodes (or not an ONNX model at all)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise OnnxImportError(f"--model {path}: the ONNX checker rejects it: {str(exc).splitlines()[0]}") from exc
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and not SUPPORTED_OPSET[0] <= opset <= SUPPORTED_OPSET[1]:
        raise OnnxImportError(f"--model {path}: opset {opset}; supported opsets are {SUPPORTED_OPSET[0]} to "
                              f"{SUPPORTED_OPSET[1]} (re-export with opset_version=17, say)")
    return model


def import_onnx(model: str | Path | onnx.ModelProto, input_shapes: dict[str, list[int]] | None = None,
                out_nodes: list[str] | None = None, name: str | None = None) -> tuple[ONNXModule, tuple]:
    """``(module, example_inputs)`` for an ONNX file or ModelProto (see the module's doc)."""
    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        name = name or path.stem
        model = load_onnx(path)
    name = name or model.graph.name or "onnx_model"
    cls_name = re.sub(r"\W", "_", name) or "onnx_model"
    cls = type(cls_name if cls_name.isidentifier() else "onnx_" + cls_name, (ONNXModule,), {})
    module = cls(model, input_shapes, out_nodes).eval()
    return module, module.example_inputs()


__all__ = ["OPS", "ONNXModule", "OnnxImportError", "fallback_name", "fallback_op", "import_onnx", "load_onnx",
           "parse_input_shape"]
