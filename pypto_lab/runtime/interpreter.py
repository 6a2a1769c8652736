"""Run an optimised model: real outputs, computed on the CPU with the NPU's numerics.

``optimized = pypto_lab.optimize(model, example_inputs, chip=..., precision=...)`` then
``optimized(*inputs)`` interprets the program `torch.export` captured (``graph.exported_program``,
node names equal the project Graph's) node by node, and applies to each node the numerics the
optimised graph gives it (the kernel specs the passes wrote, read through each node's kernel):

* Cube operators (conv2d, linear, addmm, mm, matmul, bmm) at fp16/bf16: inputs rounded to the
  storage format, exact products summed in fp32 (`pypto_lab.hw.numerics.matmul` / ``conv2d``),
  the result rounded to fp16/bf16 when it leaves the kernel; at fp32 plain IEEE fp32 (what the
  910B's Cube computes; on 910A, whose Cube lacks fp32, the precision passes lowered the graph to
  fp16 and the runtime follows them). At int8: the activation quantised symmetrically per tensor
  (its own max |x| / 127, i.e. ideal dynamic scales), weights per output channel, exact int32
  accumulation (``matmul_int8`` / ``conv2d_int8``), dequantised in fp32 and stored as fp16. A
  matmul of two activations uses one scale per tensor for both.
* Every tensor in GM is stored in the run's storage dtype (fp16/bf16 under mixed precision and
  int8, fp32 at fp32): activations, weights and biases alike; a Cube bias is added to the fp32
  accumulator. A BatchNorm folded into its convolution (``node.folded_bn``) is folded into
  the weights and bias in fp32 first (offline), which are then stored and run on the Cube.
* Vector operators: inputs and outputs stored in fp16/bf16 and the arithmetic done in that dtype
  (torch's Half/BFloat16 CPU kernels: element-wise results are correctly rounded; reductions such
  as pooling accumulate internally in fp32 before the final rounding), except nodes with
  ``compute_dtype`` fp32 (softmax, norms, reductions), computed in fp32 and rounded on the store.
* Kernels (``node.group``): values that stay inside a fused kernel are not stored, so they are
  not rounded; an epilogue fused after a Cube operator (bias, residual add, ReLU, GELU) works on
  the fp32 accumulator, and the kernel's result is rounded once on its way to GM.
* Decomposed composites (level 0, a `Decomposed` spec): LayerNorm and GELU run as their
  primitives, each result stored (rounded) as the separate kernels would.
* Attention: fused (``AttentionKernel.flash``) with FlashAttention's arithmetic: ``S = Q K^T`` on the Cube
  into fp32, an online softmax over key blocks of ``block_k`` keys (running max, rescaled running
  sums and output, all fp32), ``P`` cast to the input dtype for ``P V`` on the Cube, one division
  and one rounding at the end; ``block_k`` is the one the report costed (``AttentionKernel.block_k``
  or `default_attention_blocks`). Unfused: the scores and probabilities are stored in GM
  (rounded) between the three kernels.
* A custom operator whose NPU implementation is a pto kernel (`pypto_lab.kernels.pto_bridge`):
  the pto kernel runs on the stored inputs (cast to the GM dtype the report costed it in) and
  computes the outputs with its own numerics.
* Anything else (views, CPU fallbacks, other custom operators) runs the ATen op as is; its
  floating outputs are stored in the run's storage dtype.

Values keep the model's dtype (fp32 tensors holding fp16-representable values), so outputs
compare directly with the model's. In-place ATen ops run out of place. The summation order of
the Cube (fractal by fractal) is not modelled, only the format of every rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from ..capture.catalogue import aten_name
from ..capture.graph import FoldedBatchNorm, Graph
from ..hw import numerics
from ..hw.attention import default_attention_blocks
from ..hw.chip import Chip
from ..kernels.ir import AttentionKernel, CubeKernel, Decomposed
from ..kernels.pto_bridge import PtoKernel, run_numerics

_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_STORAGE = {"fp16": "fp16", "bf16": "bf16", "int8": "fp16", "fp32": None}
CUBE_OPS = ("conv2d", "linear", "addmm", "mm", "matmul", "bmm")
ATTENTION_OPS = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu")
BATCH_NORMS = ("batch_norm", "_native_batch_norm_legit_no_training")

Hook = Callable[[str, Any], Any]


class RuntimeInputError(ValueError):
    """Inputs an optimised model cannot run: the message names what was expected, what came, and
    the fix."""


# ---- the per-node plan ----------------------------------------------------------------------------

@dataclass
class NodePlan:
    """What numerics one node of the exported program runs with."""

    name: str
    kind: str                      # cube | attention | vector | decomposed | folded_bn | view | pto | plain
    cube_dtype: str | None = None  # fp16 / bf16 / fp32 / int8 (cube)
    compute: str | None = None     # dtype of the arithmetic (None: fp32)
    store: str | None = None       # dtype the output is stored in (None: fp32, no rounding)
    internal: bool = False         # output read only inside its kernel: not rounded
    internal_inputs: frozenset = frozenset()
    epilogue: bool = False         # member of a Cube kernel's epilogue (computes in fp32)
    folded_bn: FoldedBatchNorm | None = None  # a BatchNorm folded into this convolution
    flash: bool = False            # attention: FlashAttention's online softmax
    block_k: int | None = None     # attention: the key block it runs with (None: the chip's default)
    pto: PtoKernel | None = None   # a custom op whose NPU implementation is a pto kernel


@dataclass
class RunStats:
    """What one run computed, by kind of numerics (for tests and for curiosity)."""

    nodes: dict[str, int] = field(default_factory=dict)
    flash_attention: int = 0
    flash_key_blocks: list[int] = field(default_factory=list)
    unfused_attention: int = 0
    half_fallbacks: list[str] = field(default_factory=list)  # ops without a Half/BFloat16 CPU kernel

    def count(self, kind: str) -> None:
        self.nodes[kind] = self.nodes.get(kind, 0) + 1


def build_plan(graph: Graph, precision: str) -> dict[str, NodePlan]:
    """The numerics of every call_function node of ``graph.exported_program``, read from the specs
    of the kernels the nodes run in.

    ``precision`` is the Cube precision the passes ran with (after CANN's rule on the chip)."""
    ep = graph.exported_program
    by_name = graph.producers()
    users = graph.users()
    outputs = set(graph.outputs)
    default_store = _STORAGE[precision]
    folded = {n.folded_bn.bn: n.name for n in graph.nodes if n.folded_bn is not None}
    plan: dict[str, NodePlan] = {}
    for fx in ep.graph.nodes:
        if fx.op != "call_function":
            continue
        g = by_name.get(fx.name)
        op = aten_name(str(fx.target))
        if g is None:
            if fx.name in folded:
                plan[fx.name] = NodePlan(fx.name, "folded_bn")
            else:  # e.g. the getitem of a folded BN's tuple
                plan[fx.name] = NodePlan(fx.name, "view")
            continue
        unit = g.unit
        group = g.group
        spec = by_name[g.anchor].kernel if (group is not None or g.kernel is not None) else None
        dtype, compute = spec.dtypes if spec is not None else (None, None)
        store = _STORAGE.get(dtype, default_store) if dtype else default_store
        internal = group is not None and fx.name not in outputs and bool(users.get(fx.name)) and all(
            u.group == group for u in users[fx.name])
        internal_inputs = frozenset(i for i in g.inputs if group is not None and i in by_name
                                    and by_name[i].group == group)
        epilogue = group is not None and isinstance(spec, CubeKernel) and unit != "cube"
        aten = str(fx.target).startswith("aten.")
        if unit == "cube" and op in CUBE_OPS and aten:
            plan[fx.name] = NodePlan(fx.name, "cube", cube_dtype=dtype, compute="fp32", store=store,
                                     internal=internal, internal_inputs=internal_inputs,
                                     folded_bn=g.folded_bn)
        elif unit == "composite" and op in ATTENTION_OPS and isinstance(spec, AttentionKernel):
            plan[fx.name] = NodePlan(fx.name, "attention", cube_dtype=dtype, compute="fp32", store=store,
                                     internal=internal, internal_inputs=internal_inputs, flash=spec.flash,
                                     block_k=spec.block_k)
        elif isinstance(spec, PtoKernel):
            plan[fx.name] = NodePlan(fx.name, "pto", store=store, internal=internal, internal_inputs=internal_inputs,
                                     pto=spec)
        elif unit == "free":
            plan[fx.name] = NodePlan(fx.name, "view")
        elif unit in ("vector", "move") and aten:
            kind = "decomposed" if isinstance(spec, Decomposed) and op in ("layer_norm", "gelu") else "vector"
            plan[fx.name] = NodePlan(fx.name, kind, compute="fp32" if epilogue else (compute or store), store=store,
                                     internal=internal, internal_inputs=internal_inputs, epilogue=epilogue)
        else:
            plan[fx.name] = NodePlan(fx.name, "plain", compute=None, store=store, internal=internal,
                                     internal_inputs=internal_inputs)
    return plan


# ---- rounding helpers -----------------------------------------------------------------------------

def _is_float(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def store(x: Any, dtype: str | None) -> Any:
    """``x`` with every floating tensor rounded to ``dtype`` (kept in its own dtype); None: as is."""
    if dtype is None or dtype == "fp32":
        return x
    if isinstance(x, (tuple, list)):
        return type(x)(store(v, dtype) for v in x)
    if not _is_float(x) or x.dtype == _TORCH_DTYPES[dtype]:
        return x
    if x.dtype == torch.float64:
        return numerics.round_to(x, dtype).to(x.dtype)
    return x.to(_TORCH_DTYPES[dtype]).to(x.dtype)


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    return x.to(dtype) if _is_float(x) else x


def _like(out: Any, meta: Any) -> Any:
    """``out`` converted back to the dtype the captured program had for it."""
    if isinstance(out, (tuple, list)):
        metas = meta if isinstance(meta, (tuple, list)) else [None] * len(out)
        return type(out)(_like(o, m) for o, m in zip(out, metas, strict=False))
    if _is_float(out) and isinstance(meta, torch.Tensor) and meta.dtype != out.dtype and meta.is_floating_point():
        return out.to(meta.dtype)
    return out


# ---- Cube operators ---------------------------------------------------------------------------------

def _bn_fold(w: torch.Tensor, b: torch.Tensor | None, gamma, beta, mean, var, eps: float):
    """Conv weights and bias with an inference BatchNorm folded in, in fp32."""
    w32 = w.to(torch.float32)
    inv = torch.rsqrt(var.to(torch.float32) + eps)
    scale = inv * (gamma.to(torch.float32) if gamma is not None else 1.0)
    bias = b.to(torch.float32) if b is not None else torch.zeros(w.shape[0])
    shift = beta.to(torch.float32) if beta is not None else 0.0
    return w32 * scale.reshape(-1, *([1] * (w.dim() - 1))), (bias - mean.to(torch.float32)) * scale + shift


def _conv_args(args: tuple, kwargs: dict) -> tuple:
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    defaults = (None, None, None, 1, 0, 1, 1)
    vals = list(args) + [kwargs.get(n, d) for n, d in zip(names[len(args):], defaults[len(args):], strict=True)]
    return tuple(vals)


def _int8_gemm(a: torch.Tensor, b: torch.Tensor, b_is_weight: bool) -> torch.Tensor:
    """``a @ b`` through the int8 Cube, dequantised to fp32 (not yet stored)."""
    sa = numerics.symmetric_scale(a)
    sb = numerics.per_channel_scale(b, -1) if b_is_weight else numerics.symmetric_scale(b)
    acc = numerics.matmul_int8(numerics.quantize(a, sa), numerics.quantize(b, sb))
    return acc.to(torch.float32) * (sa * sb)


def cube(op: str, args: tuple, kwargs: dict, dtype: str, weight_args: set[int],
         bn: tuple | None = None, stored: str | None = None) -> torch.Tensor:
    """One Cube operator with the Cube's numerics; returns the fp32 accumulator (plus bias), as it
    leaves L0C before any rounding. ``weight_args``: positions of arguments that are weights;
    ``bn``: a BatchNorm (weight, bias, mean, var, eps) folded into a convolution's weights and bias
    in fp32, which are then stored in ``stored`` like every tensor in GM."""
    if op == "conv2d":
        x, w, b, stride, padding, dilation, groups = _conv_args(args, kwargs)
        if bn is not None:
            w, b = _bn_fold(w, b, *bn)
            w, b = store(w, stored), store(b, stored)
        if dtype == "int8":
            sx = numerics.symmetric_scale(x)
            sw = numerics.per_channel_scale(w, 0)
            acc = numerics.conv2d_int8(numerics.quantize(x, sx), numerics.quantize(w, sw), stride=stride,
                                       padding=padding, dilation=dilation, groups=groups)
            out = acc.to(torch.float32) * (sx * sw.reshape(1, -1, 1, 1))
            return out + b.to(torch.float32).reshape(1, -1, 1, 1) if b is not None else out
        if dtype == "fp32":
            with numerics._ieee_fp32():
                return F.conv2d(x.to(torch.float32), w.to(torch.float32),
                                b.to(torch.float32) if b is not None else None, stride, padding, dilation, groups)
        return numerics.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups,
                               dtype=dtype)
    if op == "linear":
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else kwargs.get("bias")
        a, bmat, bias = x, w.t(), b
        b_weight = 1 in weight_args
    elif op == "addmm":
        bias, a, bmat = args[0], args[1], args[2]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        if beta != 1 or alpha != 1:
            return _generic_cube(torch.ops.aten.addmm.default, args, kwargs, dtype)
        b_weight = 2 in weight_args
    else:  # mm, bmm, matmul
        a, bmat, bias = args[0], args[1], None
        b_weight = 1 in weight_args
    if dtype == "int8":
        out = _int8_gemm(a, bmat, b_weight)
        return out + bias.to(torch.float32) if bias is not None else out
    if dtype == "fp32":
        with numerics._ieee_fp32():
            out = torch.matmul(a.to(torch.float32), bmat.to(torch.float32))
        return out + bias.to(torch.float32) if bias is not None else out
    return numerics.matmul(a, bmat, dtype=dtype, bias=bias)


def _generic_cube(target, args, kwargs, dtype: str) -> torch.Tensor:
    args = tuple(numerics.round_to(a, dtype) if _is_float(a) else a for a in args)
    with numerics._ieee_fp32():
        return target(*args, **kwargs)


# ---- attention -----------------------------------------------------------------------------------

def _sdpa_args(op: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    if op == "scaled_dot_product_attention":
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        defaults = (None, None, None, None, 0.0, False, None, False)
    else:  # _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask, scale)
        names = ("query", "key", "value", "dropout_p", "is_causal", "attn_mask", "scale")
        defaults = (None, None, None, 0.0, False, None, None)
    vals = dict(zip(names, defaults, strict=True))
    vals.update(dict(zip(names, args, strict=False)))
    vals.update({k: v for k, v in kwargs.items() if k in vals})
    return vals


def _attention_mask(a: dict[str, Any], shape: tuple[int, ...]) -> torch.Tensor | None:
    """The additive fp32 mask (0 or -inf for boolean masks, causal included), broadcast to ``shape``."""
    mask = a.get("attn_mask")
    add = None
    if mask is not None:
        if mask.dtype == torch.bool:
            add = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
        else:
            add = mask.to(torch.float32)
    if a.get("is_causal"):
        lq, lk = shape[-2], shape[-1]
        causal = torch.zeros(lq, lk).masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(), -math.inf)
        add = causal if add is None else add + causal
    return None if add is None else add.expand(shape)


def _gqa(k: torch.Tensor, q: torch.Tensor, enable: bool) -> torch.Tensor:
    if enable and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        return k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    return k


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: str, block_k: int,
                    mask: torch.Tensor | None = None, scale: float | None = None) -> tuple[torch.Tensor, int]:
    """FlashAttention's arithmetic: for each block of ``block_k`` keys, ``S = Q K^T`` on the Cube
    (``dtype`` inputs, fp32 accumulation), scaled in fp32, the online softmax (running row max
    ``m``, running sum ``l`` and output ``O``, rescaled by ``exp(m_old - m_new)``) in fp32, ``P``
    rounded to ``dtype`` for ``P V`` on the Cube; ``O / l`` at the end. ``mask`` is additive (fp32,
    broadcast to the scores' shape). Returns (output in fp32, number of key blocks)."""
    if isinstance(block_k, bool) or not isinstance(block_k, int) or block_k < 1:
        raise ValueError(f"block_k {block_k!r}: must be an integer >= 1 (keys per block)")
    s_k = k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    kt = k.transpose(-2, -1)
    m = torch.full((*q.shape[:-1], 1), -math.inf)
    l_sum = torch.zeros((*q.shape[:-1], 1))
    o = torch.zeros((*q.shape[:-1], v.shape[-1]))
    blocks = 0
    for j in range(0, s_k, block_k):
        s = _cube_mm(q, kt[..., j:j + block_k], dtype) * scale
        if mask is not None:
            s = s + mask[..., j:j + block_k]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)  # a fully masked row so far
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)
        l_sum = l_sum * alpha + p.sum(dim=-1, keepdim=True)
        o = o * alpha + _cube_mm(numerics.round_to(p, dtype) if dtype != "fp32" else p, v[..., j:j + block_k, :],
                                 dtype)
        m = m_new
        blocks += 1
    return o / l_sum, blocks


def _cube_mm(a: torch.Tensor, b: torch.Tensor, dtype: str, out_dtype: str | None = None) -> torch.Tensor:
    if dtype == "fp32":
        with numerics._ieee_fp32():
            return torch.matmul(a.to(torch.float32), b.to(torch.float32))
    out = numerics.matmul(a, b, dtype=dtype)
    return numerics.round_to(out, out_dtype) if out_dtype else out


def unfused_attention(q, k, v, dtype: str, mask=None, scale=None) -> torch.Tensor:
    """The level-0 sequence: ``S = Q K^T`` stored in ``dtype``, scale + softmax in fp32 stored in
    ``dtype``, ``O = P V``; returns O in fp32 (not yet stored)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    stored = None if dtype == "fp32" else dtype
    s = _cube_mm(q, k.transpose(-2, -1), dtype, stored)
    s = s * scale
    if mask is not None:
        s = s + mask
    p = torch.softmax(s, dim=-1)
    p = numerics.round_to(p, stored) if stored else p
    return _cube_mm(p, v, dtype)


# ---- decomposed composites -------------------------------------------------------------------------

def _decomposed(op: str, args: tuple, kwargs: dict, compute: str | None, stored: str | None) -> torch.Tensor:
    """LayerNorm / GELU as their separate primitive kernels: every primitive's result is stored."""
    ct = _TORCH_DTYPES.get(compute or "fp32", torch.float32)

    def step(t: torch.Tensor) -> torch.Tensor:
        t = t.to(torch.float32)
        return numerics.round_to(t, stored) if stored else t

    if op == "gelu":
        x = args[0]
        if kwargs.get("approximate", args[1] if len(args) > 1 else "none") != "none":
            return step(F.gelu(x.to(ct), approximate="tanh"))
        t = step(x.to(ct) * (1 / math.sqrt(2)))          # mul
        t = step(torch.erf(t.to(ct)))                      # erf
        t = step(t.to(ct) + 1)                             # add
        h = step(x.to(ct) * 0.5)                           # mul
        return step(h.to(ct) * t.to(ct))                   # mul
    x, shape = args[0], args[1]
    w = args[2] if len(args) > 2 else kwargs.get("weight")
    b = args[3] if len(args) > 3 else kwargs.get("bias")
    eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
    dims = tuple(range(-len(shape), 0))
    mean = step(x.to(ct).mean(dim=dims, keepdim=True))               # sum
    d = step(x.to(ct) - mean.to(ct))                                  # sub
    sq = step(d.to(ct) * d.to(ct))                                    # mul
    var = step(sq.to(ct).mean(dim=dims, keepdim=True))                # sum
    r = step(torch.rsqrt(var.to(ct) + eps))                           # rsqrt
    y = step(d.to(ct) * r.to(ct))                                     # mul
    if w is not None:
        y = step(y.to(ct) * w.to(ct))                                 # mul
    if b is not None:
        y = step(y.to(ct) + b.to(ct))                                 # add
    return y


# ---- the interpreter ----------------------------------------------------------------------------------

def _out_of_place(target: Any) -> Any:
    """The functional variant of an in-place ATen overload (``relu_`` -> ``relu``), else ``target``."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return target
    name = schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return target
    packet = getattr(torch.ops.aten, name[:-1], None)
    overload = getattr(packet, target._overloadname, None) if packet is not None else None
    return overload or target


class _Interpreter(torch.fx.Interpreter):
    """Runs the exported program; ``npu`` applies the plan's numerics, else plain torch.

    ``source`` (a dict of node name -> value) makes every node read its inputs from that run (the
    reference), so each node's own error shows alone."""

    def __init__(self, runtime: Runtime, npu: bool, hook: Hook | None = None, record: dict | None = None,
                 source: dict | None = None, stats: RunStats | None = None):
        super().__init__(runtime.ep.graph_module, garbage_collect_values=record is None and source is None)
        self.rt = runtime
        self.npu = npu
        self.hook = hook
        self.record = record
        self.source = source
        self.stats = stats if stats is not None else RunStats()

    def run(self, *args, **kwargs) -> Any:
        """The program on ``args``; a run still going after two seconds (a large model's numerics on
        the CPU) shows a progress bar over its nodes."""
        from ..files.progress import progress

        what = "NPU numerics" if self.npu else "reference"
        self._bar = progress(total=len(self.module.graph.nodes), delay=2.0, unit="node", leave=False,
                             desc=f"{what} on the CPU")
        try:
            return super().run(*args, **kwargs)
        finally:
            self._bar.close()

    def run_node(self, n: torch.fx.Node) -> Any:
        bar = getattr(self, "_bar", None)
        if bar is not None:
            bar.update(1)
        if n.op != "call_function":
            out = super().run_node(n)
        else:
            out = self._call(n)
        if n.op == "call_function":
            if self.hook is not None and self.npu:
                new = self.hook(n.name, out)
                out = out if new is None else new
            if self.record is not None:
                self.record[n.name] = out
        return out

    def _load(self, n: torch.fx.Node, plan: NodePlan | None):
        env = self.source if self.source is not None else None

        def get(a: torch.fx.Node) -> Any:
            val = env[a.name] if env is not None and a.name in env else self.env[a]
            if plan is not None and plan.store and a.name not in plan.internal_inputs and plan.kind != "view":
                val = store(val, plan.store)
            return val

        args = torch.fx.node.map_arg(n.args, get)
        kwargs = torch.fx.node.map_arg(n.kwargs, get)
        return args, kwargs

    def _call(self, n: torch.fx.Node) -> Any:
        target = _out_of_place(n.target)
        if not self.npu:
            args, kwargs = self._load(n, None)
            return target(*args, **kwargs)
        plan = self.rt.plan.get(n.name) or NodePlan(n.name, "plain")
        self.stats.count(plan.kind)
        if plan.kind == "folded_bn":  # the convolution before it already computed conv + BN
            args, _ = self._load(n, None)
            x = args[0]
            if aten_name(str(n.target)) == "batch_norm":
                return x
            return (x, x.new_empty(0), x.new_empty(0))
        args, kwargs = self._load(n, plan)
        meta = n.meta.get("val")
        op = aten_name(str(n.target))
        if plan.kind == "view":
            return target(*args, **kwargs)
        if plan.kind == "cube":
            bn = self._bn_params(plan.folded_bn) if plan.folded_bn is not None else None
            out = cube(op, args, kwargs, plan.cube_dtype, self.rt.weight_args(n), bn, plan.store)
        elif plan.kind == "attention":
            out = self._attention(n, op, args, kwargs, plan)
        elif plan.kind == "decomposed":
            out = _decomposed(op, args, kwargs, plan.compute, plan.store)
        elif plan.kind == "vector":
            out = self._vector(n, target, args, kwargs, plan)
        elif plan.kind == "pto":
            out = run_numerics(plan.pto, self.rt.chip, (*args, *kwargs.values()))
        else:
            out = target(*args, **kwargs)
        out = _like(out, meta)
        return out if plan.internal else store(out, plan.store)

    def _vector(self, n, target, args, kwargs, plan: NodePlan) -> Any:
        ct = _TORCH_DTYPES.get(plan.compute or "fp32", torch.float32)
        if ct == torch.float32:
            return target(*_cast(args, torch.float32), **kwargs) if any(
                _is_float(a) and a.dtype != torch.float32 for a in args) else target(*args, **kwargs)
        try:
            return target(*_cast(tuple(args), ct), **_cast_kwargs(kwargs, ct))
        except (RuntimeError, NotImplementedError):  # no Half/BFloat16 CPU kernel: fp32, stored rounded
            self.stats.half_fallbacks.append(str(n.target))
            return target(*args, **kwargs)

    def _bn_params(self, folded: FoldedBatchNorm) -> tuple:
        bn = self.rt.fx_nodes[folded.bn]
        a = list(bn.args) + [None] * 8
        env = self.source if self.source is not None else {}

        def val(x):
            if isinstance(x, torch.fx.Node):
                return env[x.name] if x.name in env else self.env[x]
            return x

        eps = float(folded.eps)
        return val(a[1]), val(a[2]), val(a[3]), val(a[4]), eps

    def _attention(self, n, op: str, args, kwargs, plan: NodePlan) -> Any:
        a = _sdpa_args(op, args, kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        if a.get("dropout_p"):
            return _out_of_place(n.target)(*args, **kwargs)  # training-mode dropout: as torch does it
        k = _gqa(k, q, bool(a.get("enable_gqa")))
        v = _gqa(v, q, bool(a.get("enable_gqa")))
        shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
        mask = _attention_mask(a, shape)
        dtype = plan.cube_dtype if plan.cube_dtype in ("fp16", "bf16", "fp32") else "fp16"
        if plan.flash:
            block_k = plan.block_k or default_attention_blocks(
                self.rt.chip, q.shape[-2], k.shape[-2], q.shape[-1], dtype)[1]
            out, nblocks = flash_attention(q, k, v, dtype, int(block_k), mask, a.get("scale"))
            self.stats.flash_attention += 1
            self.stats.flash_key_blocks.append(nblocks)
        else:
            out = unfused_attention(q, k, v, dtype, mask, a.get("scale"))
            self.stats.unfused_attention += 1
        if op == "_scaled_dot_product_flash_attention_for_cpu":
            return out, torch.zeros(out.shape[:-1])
        return out


def _cast_kwargs(kwargs: dict, dtype: torch.dtype) -> dict:
    return {k: _cast(v, dtype) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


# ---- the runtime ------------------------------------------------------------------------------------

class Runtime:
    """The exported program of an optimised model and the numerics plan of its nodes."""

    def __init__(self, model: torch.nn.Module, graph: Graph, chip: Chip, precision: str):
        ep = getattr(graph, "exported_program", None)
        if ep is None:
            raise RuntimeInputError(
                "this optimised graph carries no torch.export program (graph.exported_program), so it "
                "cannot run: build it with pypto_lab.optimize(model, example_inputs, ...)")
        meta = next((name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta), None)
        if meta is not None:
            raise RuntimeInputError(
                f"numerics need weight values, and {type(model).__name__}'s {meta} is on the meta device (shapes "
                "only, e.g. pypto_lab.llm.hf.build_causal_lm(..., device='meta')): its report needs no weights "
                "(optimized.report()), but running it does; build it with device='cpu', or give it weights "
                "(model.to_empty(device='cpu') then model.load_state_dict(...))")
        self.model = model
        self.graph = graph
        self.ep = ep
        self.chip = chip
        self.precision = precision
        self.plan = build_plan(graph, precision)
        self.fx_nodes = {n.name: n for n in ep.graph.nodes}
        self._weights = self._weight_names()
        self.last_stats: RunStats | None = None

    # -- inputs and weights --
    def _weight_names(self) -> set[str]:
        sig = self.ep.graph_signature
        return {s.arg.name for s in sig.input_specs if s.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")}

    def weight_args(self, n: torch.fx.Node) -> set[int]:
        """Positions of ``n``'s arguments that are weights (parameters seen through views)."""
        out = set()
        for i, a in enumerate(n.args):
            cur = a
            for _ in range(16):
                if not isinstance(cur, torch.fx.Node):
                    break
                if cur.op == "placeholder":
                    if cur.name in self._weights:
                        out.add(i)
                    break
                plan = self.plan.get(cur.name)
                if plan is None or plan.kind != "view" or not cur.args:
                    break
                cur = cur.args[0]
        return out

    def _state(self) -> list[Any]:
        """Parameters, buffers and constants in the program's order, from the live model."""
        live = dict(self.model.named_parameters(remove_duplicate=False))
        live.update(dict(self.model.named_buffers(remove_duplicate=False)))
        vals = []
        for s in self.ep.graph_signature.input_specs:
            kind = s.kind.name
            if kind in ("PARAMETER", "BUFFER"):
                t = live.get(s.target)
                vals.append((t if t is not None else self.ep.state_dict[s.target]).detach())
            elif kind == "CONSTANT_TENSOR":
                vals.append(self.ep.constants[s.target])
            elif kind == "USER_INPUT":
                vals.append(None)
            else:
                raise RuntimeInputError(f"input kind {kind} of the exported program is not supported by the "
                                        "runtime; remove it from the model or report it")
        return vals

    def flat_inputs(self, args: tuple, kwargs: dict) -> list[Any]:
        """The program's flat inputs for a call ``model(*args, **kwargs)``, checked against the
        example inputs' structure, shapes and dtypes."""
        flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        expected = self.ep.call_spec.in_spec
        if spec != expected:
            raise RuntimeInputError(
                f"inputs have another structure than the example inputs: expected {expected}, got {spec}; pass "
                "the inputs as for the example (same positions and keywords), or call pypto_lab.optimize "
                "again with the new example inputs")
        user = [s for s in self.ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        if len(user) != len(flat):
            raise RuntimeInputError(f"expected {len(user)} inputs, got {len(flat)}; call pypto_lab.optimize "
                                    "again with the new example inputs")
        for i, (s, x) in enumerate(zip(user, flat, strict=True)):
            meta = self.fx_nodes[s.arg.name].meta.get("val") if hasattr(s.arg, "name") else None
            if isinstance(meta, torch.Tensor):
                if not isinstance(x, torch.Tensor):
                    raise RuntimeInputError(
                        f"input {i} ({s.arg.name}): expected a tensor of shape {tuple(meta.shape)} "
                        f"{str(meta.dtype).removeprefix('torch.')}, got {type(x).__name__}; pass a tensor")
                if tuple(x.shape) != tuple(meta.shape) or x.dtype != meta.dtype:
                    raise RuntimeInputError(
                        f"input {i} ({s.arg.name}): expected shape {tuple(meta.shape)} "
                        f"{str(meta.dtype).removeprefix('torch.')}, got shape {tuple(x.shape)} "
                        f"{str(x.dtype).removeprefix('torch.')}; the optimised graph is specialised to the example "
                        "inputs' shapes and dtypes: call pypto_lab.optimize(model, new_example_inputs, ...) again")
            elif hasattr(s.arg, "value") and s.arg.value != x:
                raise RuntimeInputError(
                    f"input {i}: expected the constant {s.arg.value!r} the model was captured with, got {x!r}; "
                    "call pypto_lab.optimize again with the new example inputs")
        return flat

    def _program_inputs(self, args: tuple, kwargs: dict) -> list[Any]:
        user = iter(x.detach() if isinstance(x, torch.Tensor) else x for x in self.flat_inputs(args, kwargs))
        return [next(user) if v is None else v for v in self._state()]

    def _outputs(self, flat_out: Any) -> Any:
        specs = self.ep.graph_signature.output_specs
        flat_out = list(flat_out) if isinstance(flat_out, (tuple, list)) else [flat_out]
        user = [o for s, o in zip(specs, flat_out, strict=True) if s.kind.name == "USER_OUTPUT"]
        return pytree.tree_unflatten(user, self.ep.call_spec.out_spec)

    # -- runs --
    def run(self, args: tuple, kwargs: dict | None = None, hook: Hook | None = None,
            record: dict | None = None) -> Any:
        """The optimised model's outputs on ``args``, with the NPU's numerics (of the graph's kernel
        specs as they are now: a spec changed after optimize, e.g. by auto_tune, is honoured)."""
        inputs = self._program_inputs(args, kwargs or {})
        self.plan = build_plan(self.graph, self.precision)
        stats = RunStats()
        with torch.no_grad():
            out = _Interpreter(self, True, hook=hook, record=record, stats=stats).run(*inputs)
        self.last_stats = stats
        return self._outputs(out)

    def reference(self, args: tuple, kwargs: dict | None = None, record: dict | None = None) -> Any:
        """The same program in plain torch (the model's own dtypes, fp32): the reference."""
        inputs = self._program_inputs(args, kwargs or {})
        with torch.no_grad():
            out = _Interpreter(self, False, record=record).run(*inputs)
        return self._outputs(out)

    def local(self, args: tuple, reference: dict, kwargs: dict | None = None, hook: Hook | None = None) -> dict:
        """Every node with the NPU's numerics on the reference run's inputs: each node's own error."""
        inputs = self._program_inputs(args, kwargs or {})
        self.plan = build_plan(self.graph, self.precision)
        record: dict = {}
        with torch.no_grad():
            _Interpreter(self, True, hook=hook, record=record, source=reference).run(*inputs)
        return record


__all__ = ["Runtime", "RuntimeInputError", "RunStats", "build_plan", "flash_attention", "unfused_attention",
           "store", "cube"]
