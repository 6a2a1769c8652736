"""One eager operator as the kernels the card runs: the capture -> lowering table -> kernel IR -> coster
path every front end takes, for an operator the dispatch mode sees with real tensors.

The operator becomes a one-node `Graph` (its tensors as named values with their shapes and dtypes,
its other arguments as they are), looked up in the lowering table (`pypto_lab.lowering.table`) and
lowered by `lower_all` at the precision of its own tensors (fp16, bf16 or fp32: eager code runs in
the dtypes it holds; norms, softmax and sums keep their statistics in fp32 as CANN's kernels do),
then costed by the coster of each spec's kind. Eager execution differs from a graph in three
places, each kept here rather than in the shared table:

* every operator is its own kernel: the table's bookkeeping rule (an op on a single element runs no
  kernel in a graph) does not apply, a ``loss.item()`` reduction launches like any other;
* ``copy_`` is a TensorMove (in a graph it is the write-back of a mutated input);
* ``_foreach_<op>`` (torch.optim's multi-tensor path) is one kernel of ``<op>`` over every tensor
  of the list, as torch_npu's foreach kernels run.

An operator the table does not know falls back to the host (`HostKernel`), as in every front end.
Costs are memoised per operator signature (target, shapes, dtypes, other arguments).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import torch
from torch.utils._pytree import tree_flatten

from ..capture.catalogue import CPU, NpuOp, aten_name
from ..capture.graph import Graph, Node, TensorInfo, Value
from ..hw.chip import Chip
from ..kernels.cost import KernelCost, cost
from ..kernels.ir import AttentionKernel, Decomposed, HostKernel, KernelSpec, VectorKernel
from ..lowering.lower import lower_all, vector_spec
from ..lowering.precision import Precision
from ..lowering.table import lookup
from ..stack import Stack

_IR_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp32"}
EAGER = {"copy_": NpuOp("TensorMove", "move")}


@dataclass(frozen=True)
class Launch:
    """One kernel an operator launches: its name ("MatMulV2:addmm"), CANN operator, spec and cost."""

    name: str
    op_type: str
    spec: KernelSpec
    cost: KernelCost

    @property
    def host(self) -> bool:
        return isinstance(self.spec, HostKernel)


def op_name(target: str) -> str:
    """"aten.add.Tensor" -> "add", "npu.npu_rms_norm.default" -> "npu_rms_norm", "c10d.allreduce_.default"
    -> "allreduce_": the operator's name in any namespace."""
    parts = target.split(".")
    return parts[1] if len(parts) >= 3 else aten_name(target)


def _tname(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _precision(chip: Chip, tensors: list[torch.Tensor]) -> Precision:
    dt = next((_IR_DTYPE[t.dtype] for t in tensors if t.dtype in _IR_DTYPE), "fp32")
    cube = dt if chip.cube.supports(dt) else "fp16"
    return Precision(cube, dt, stats="fp32", name=dt)


def _key(target: str, leaves: list) -> tuple:
    out = [target]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            out.append(("T", tuple(x.shape), x.dtype))
        elif isinstance(x, (int, float, str, bool, type(None))):
            out.append(x)
        else:
            out.append(repr(x))
    return tuple(out)


class EagerLowering:
    """Kernels of eager operators on one chip (memoised). ``stack``: the software stack, whose
    operator-level fusions apply to one operator at a time (``sdpa_flash``: torch_npu runs
    ``scaled_dot_product_attention`` as one FlashAttention kernel)."""

    def __init__(self, chip: Chip, stack: Stack | None = None):
        self.chip = chip
        self.flash = stack is not None and stack.applies("sdpa_flash")
        self.memo: dict[tuple, tuple[Launch, ...]] = {}
        self.fallbacks: dict[str, int] = {}

    def launches(self, func, args: tuple, kwargs: dict, out) -> tuple[Launch, ...]:
        target = str(func)
        leaves, _ = tree_flatten((args, kwargs))
        out_leaves, _ = tree_flatten(out)
        key = _key(target, leaves + ["->"] + out_leaves)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._lower(target, args, kwargs, out_leaves)
        for launch in hit:
            if launch.host:
                name = op_name(target)
                self.fallbacks[name] = self.fallbacks.get(name, 0) + 1
        return hit

    def _lower(self, target: str, args: tuple, kwargs: dict, outs: list) -> tuple[Launch, ...]:
        name = op_name(target)
        values: dict[str, Value] = {}
        tensors: list[torch.Tensor] = []

        def rep(x):
            if isinstance(x, torch.Tensor):
                n = f"t{len(values)}"
                values[n] = Value(n, "input", TensorInfo(tuple(int(d) for d in x.shape), _tname(x)))
                tensors.append(x)
                return n
            if isinstance(x, (list, tuple)):
                return type(x)(rep(v) for v in x)
            if isinstance(x, dict):
                return {k: rep(v) for k, v in x.items()}
            if isinstance(x, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
                return str(x)
            return x

        node_args, node_kwargs = rep(tuple(args)), rep(dict(kwargs))
        out_infos = [TensorInfo(tuple(int(d) for d in t.shape), _tname(t)) for t in outs if isinstance(t, torch.Tensor)]
        node = Node("op", target, list(values), node_args, node_kwargs, out_infos)
        graph = Graph(values, [node], ["op"])
        precision = _precision(self.chip, tensors + [t for t in outs if isinstance(t, torch.Tensor)])
        if name.startswith("_foreach_"):
            specs = self._foreach(name, tensors, precision)
            entry_name = specs[0].op if specs and not isinstance(specs[0], HostKernel) else f"cpu:{name}"
        else:
            entry = EAGER.get(name) or lookup(target) or CPU
            node.npu = entry
            specs = lower_all(graph, node, self.chip, precision)
            if self.flash and entry.unit == "composite":
                specs = [replace(sp, flash=True) if isinstance(sp, AttentionKernel) else sp for sp in specs]
            entry_name = entry.name or f"cpu:{name}"
        launches = []
        for spec in specs:
            op_type = entry_name if len(specs) == 1 or isinstance(spec, AttentionKernel) else getattr(spec, "op", entry_name)
            if isinstance(spec, HostKernel):
                op_type = "HostFallback"
            launches.append(Launch(f"{op_type}:{name}", op_type, spec, _cost(spec, self.chip)))
        return tuple(launches)

    def _foreach(self, name: str, tensors: list[torch.Tensor], precision: Precision) -> list[KernelSpec]:
        base = name[len("_foreach_"):]
        entry = lookup(f"aten.{base}.default") or lookup(f"aten.{base.rstrip('_')}.default")
        numel = sum(int(t.numel()) for t in tensors if t.dim() > 0) or 1
        if entry is None or entry.unit not in ("vector", "move"):
            nbytes = sum(int(t.numel()) * t.element_size() for t in tensors)
            return [HostKernel(f"aten.{name}", nbytes, nbytes)]
        ops = entry.vector_ops or ("copy",)
        row = max((int(t.shape[-1]) for t in tensors if t.dim() > 0), default=1)
        dt = precision.vector
        if any(o in ("sum", "max", "rmsnorm", "layernorm", "softmax") for o in ops):
            return [vector_spec(f"Foreach{entry.name}", ops, numel, dt, "fp32", None, row)]
        return [VectorKernel(f"Foreach{entry.name}", ops, numel, dt, dt)]


def _cost(spec: KernelSpec, chip: Chip) -> KernelCost:
    """The cost of one launch: a `Decomposed` (a fused kernel costed by its stages) is their sum."""
    if isinstance(spec, Decomposed):
        parts = [cost(p, chip) for p in spec.parts]
        first = parts[0]
        return KernelCost(sum(p.cycles for p in parts), sum(p.time_us for p in parts), sum(p.gm_bytes for p in parts),
                          first.tile, tuple(r for p in parts for r in p.reports), first.resources,
                          sum(p.flops for p in parts), max(parts, key=lambda p: p.time_us).bound,
                          sum(p.hbm_bytes for p in parts))
    return cost(spec, chip)


def numel_bytes(t: torch.Tensor) -> int:
    return int(prod(t.shape)) * t.element_size()


__all__ = ["EAGER", "EagerLowering", "Launch", "numel_bytes", "op_name"]
