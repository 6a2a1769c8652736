"""A pto kernel as the implementation of one layer kind in the LLM engine's decode step, as
``custom_op(npu_func=...)`` makes one a custom op's NPU implementation for ``optimize``.

``simulate_generation(model, ..., kernels={"attention": ..., "linear_attention": ..., "moe": ...})``:
each value is a `LayerKernel` (the kernel, the layer kind, and the tensors the step hands it), or a
bare ``@pypto.jit`` kernel that then takes the layer kind's standard arguments (`standard`). In
every decode-only step the layer kind's kernels (`REPLACES`) give way to one `PtoKernel` row,
counted once per layer of that kind, whose cost is the kernel's SIM run in cost-only mode
(`pypto_lab.pto.config.cost_only`: the control flow and the cost of the real run, no values) at
the step's real shapes on the card (heads and widths divided by tensor parallelism), memoised per
(kernel, shapes, chip). Prefill steps keep the engine's own kernels.

The layer kinds and their standard arguments (per card; ``B`` sequences, context ``C`` rounded up
to the kernel's block):

* ``"attention"`` (MLA models): the absorbed query ``[B, H, rank + rope]``, the latent cache
  ``[B, C, rank + rope]``, for a sparse kernel the indexer's selection ``[B, K]`` int32
  (``K = min(C, index_topk)``), and the output ``[B, H, rank]``. It replaces IncreFlashAttention; a
  dense kernel in a DeepSeek Sparse Attention model also removes the lightning indexer (the model
  runs as dense MLA).
* ``"linear_attention"`` (Qwen3-Next's Gated DeltaNet layers): q, k ``[B * Hv, dk]``, v ``[B * Hv, dv]``,
  the log decay g and beta ``[B * Hv, 1]``, the state and the new state ``[B * Hv * dk, dv]`` fp32,
  the output ``[B * Hv, dv]``. It replaces RecurrentGatedDeltaRule.
* ``"moe"`` (routed experts): tokens ``[B, h]``, the router ``[E, h]``, the correction bias ``[1, E]``
  fp32, the experts' gate and up ``[E * h, 2 I]``, down ``[E * I, h]``, the output ``[B, h]``. It
  replaces the router matmul, MoeGatingTopK, the routing permutes and the grouped matmuls (the
  shared expert stays).

The workbench's own kernels for the three (`pypto_lab.llm.model_kernels`): `sparse_mla_attention`,
`dense_mla_attention`, `gated_delta_rule`, `fused_moe`. A kernel that does not fit its layer
(a parameter count, an annotated shape or dtype the step does not pass, a layer kind the model
lacks) raises `PluggedKernelError` naming the layer kind, the kernel, the rule and a fix.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..kernels.cost import CostedKernel, KernelCost, split_resources
from ..kernels.ir import Kernel, TensorMeta
from ..kernels.pto_bridge import _TORCH, PtoKernel, _on_chip, _report, is_pto_kernel, unit_of
from . import model_kernels as mk
from .configs import LLMConfigError, LLMSpec
from .forward import Hardware, is_dsa, linear_layers

LAYER_KINDS = ("attention", "linear_attention", "moe")
REPLACES = {
    "attention": ("IncreFlashAttention",),
    "dense_attention_dsa": ("IncreFlashAttention", "MatMul_indexer_wq_b", "MatMul_indexer_wk", "LayerNorm_indexer_k",
                            "MatMul_indexer_weights", "RotaryPositionEmbedding_indexer", "ScatterUpdate_indexer_cache",
                            "BatchMatMul_indexer_scores", "ReluWeightedSum_indexer", "TopK_indexer"),
    "linear_attention": ("RecurrentGatedDeltaRule",),
    "moe": ("MatMul_router", "MoeGatingTopK", "MoeInitRouting", "GroupedMatmul_gate_up", "SwiGlu_experts",
            "GroupedMatmul_down", "MoeFinalizeRouting"),
}


class PluggedKernelError(LLMConfigError):
    """A kernel plugged into the engine does not fit its layer (the message names the rule, the value
    and a fix)."""


@dataclass(frozen=True)
class StepShape:
    """What a plugged kernel sees of one decode step on one card."""

    spec: LLMSpec
    hw: Hardware
    batch: int
    context: int


@dataclass(frozen=True)
class LayerKernel:
    """A pto kernel as the implementation of a layer kind. ``kernel``: a ``@pypto.jit`` kernel or a
    callable ``(StepShape) -> kernel`` (built once per shape); ``args``: ``(StepShape) -> (inputs,
    outputs)`` as `TensorMeta` lists (default: the layer kind's standard arguments, `standard`);
    ``sparse``: an attention kernel over the indexer's selection (DeepSeek Sparse Attention) rather
    than the whole cache. A kernel with its own ``args`` may also name the engine kernels it
    replaces (``replaces``; default `REPLACES` of its kind), put plain Python values (a kernel's
    scalar parameters) among its arguments, build its tensors itself (``make_tensor(i, meta, shape)``,
    e.g. a weight tagged FRACTAL_NZ, or sequence lengths the kernel reads; default: uninitialised,
    integers zero), and run inside a
    context (``run_context()``, e.g. the NPU stand-in a real model file's kernel expects)."""

    kind: str
    kernel: Any
    args: Callable[[StepShape], tuple[list, list]] | None = None
    sparse: bool = False
    block: int = mk.BLOCK
    name: str = ""
    replaces: tuple[str, ...] = ()
    make_tensor: Callable[[int, Any, StepShape], Any] | None = None
    run_context: Callable[[], Any] | None = None
    _built: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def build(self, shape: StepShape):
        key = (shape.spec.name, shape.hw.tp, shape.batch, self.rounded(shape.context, shape))
        k = self._built.get(key)
        if k is None:
            k = self.kernel if is_pto_kernel(self.kernel) else self.kernel(shape)
            if not is_pto_kernel(k):
                raise PluggedKernelError(
                    f"kernels[{self.kind!r}]: {self.label} built {type(k).__name__} for {shape}. Rule: a plugged "
                    "kernel is a @pypto.jit kernel, or a callable returning one for the step's shapes. Fix: return "
                    "the jit kernel")
            self._built[key] = k
        return k

    def rounded(self, context: int, shape: StepShape | None = None) -> int:
        """``context`` rounded up to whole blocks (and, for an attention kernel split over cores, to
        whole splits: `model_kernels.split_plan`)."""
        blocks = -(-max(1, int(context)) // self.block)
        if self.kind == "attention" and shape is not None:
            s, per = mk.split_plan(shape.batch, blocks, shape.hw.chip.cube_cores)
            blocks = s * per
        return blocks * self.block

    @property
    def label(self) -> str:
        return self.name or getattr(self.kernel, "__name__", type(self.kernel).__name__)

    def tensors(self, shape: StepShape) -> tuple[list, list]:
        return (self.args or (lambda s: standard(self, s)))(shape)


# ---- the standard arguments of each layer kind -------------------------------------------------------

def _act(hw: Hardware) -> str:
    return "bfloat16" if hw.act_dtype == "bf16" else "float16"


def standard(plug: LayerKernel, s: StepShape) -> tuple[list[TensorMeta], list[TensorMeta]]:
    """(inputs, outputs) the decode step hands a kernel of ``plug.kind`` (see the module's docstring)."""
    spec, hw, b, a = s.spec, s.hw, s.batch, _act(s.hw)
    if plug.kind == "attention":
        heads, r, d = spec.heads // hw.tp, spec.kv_lora_rank, spec.kv_lora_rank + spec.qk_rope_dim
        if plug.sparse:
            c = plug.rounded(s.context)
            k = plug.rounded(min(s.context, int(spec.extra["index_topk"])), s)
            ins = [TensorMeta((b, heads, d), a), TensorMeta((b, max(c, k), d), a), TensorMeta((b, k), "int32")]
        else:
            ins = [TensorMeta((b, heads, d), a), TensorMeta((b, plug.rounded(s.context, s), d), a)]
        return ins, [TensorMeta((b, heads, r), a)]
    if plug.kind == "linear_attention":
        x = spec.extra
        n = b * max(1, x["linear_num_value_heads"] // hw.tp)
        dk, dv = x["linear_key_head_dim"], x["linear_value_head_dim"]
        ins = [TensorMeta((n, dk), a), TensorMeta((n, dk), a), TensorMeta((n, dv), a), TensorMeta((n, 1), a),
               TensorMeta((n, 1), a), TensorMeta((n * dk, dv), "float32")]
        return ins, [TensorMeta((n * dk, dv), "float32"), TensorMeta((n, dv), a)]
    e, h, i = spec.experts, spec.hidden, spec.expert_intermediate // hw.tp
    ins = [TensorMeta((b, h), a), TensorMeta((e, h), a), TensorMeta((1, e), "float32"),
           TensorMeta((e * h, 2 * i), a), TensorMeta((e * i, h), a)]
    return ins, [TensorMeta((b, h), a)]


# ---- the workbench's kernels -------------------------------------------------------------------------

def sparse_mla_attention() -> LayerKernel:
    """DeepSeek-V3.2's sparse attention core (`model_kernels.sparse_mla_decode_kernel`), split over cores
    as flash-decoding does (`model_kernels.split_plan`)."""
    def build(s: StepShape):
        blocks = _blocks(min(s.context, int(s.spec.extra["index_topk"])))
        return mk.sparse_mla_decode_kernel(mk.split_plan(s.batch, blocks, s.hw.chip.cube_cores)[0])
    return LayerKernel("attention", build, sparse=True, name="sparse_mla_decode")


def dense_mla_attention() -> LayerKernel:
    """Dense MLA decode over the whole latent cache (`model_kernels.mla_decode_kernel`)."""
    return LayerKernel("attention", lambda s: mk.mla_decode_kernel(
        mk.split_plan(s.batch, _blocks(s.context), s.hw.chip.cube_cores)[0]), name="mla_decode")


def gated_delta_rule() -> LayerKernel:
    """Qwen3-Next's recurrent gated delta rule step (`model_kernels.gated_delta_rule_decode_kernel`)."""
    return LayerKernel("linear_attention", mk.gated_delta_rule_decode_kernel(), name="gated_delta_rule_decode")


def fused_moe() -> LayerKernel:
    """GLM-4.5's router, top-k and routed experts in one kernel (`model_kernels.fused_moe_decode_kernel`)."""
    def build(s: StepShape):
        scale = float(s.spec.extra.get("routed_scaling_factor") or 1.0)
        return mk.fused_moe_decode_kernel(s.spec.top_k, scale)
    return LayerKernel("moe", build, name="fused_moe_decode")


def _blocks(context: int) -> int:
    return -(-max(1, int(context)) // mk.BLOCK)


# ---- checks ------------------------------------------------------------------------------------------

class Plugged(dict):
    """Layer kind -> `LayerKernel`, as `resolve` checked them; ``apply`` puts them into a decode
    step's kernels (the forward pass calls it without importing this module)."""

    def apply(self, kernels: list[CostedKernel], spec: LLMSpec, hw: Hardware, decode: list[int]) -> list[CostedKernel]:
        return apply(kernels, spec, hw, decode, self)


def resolve(spec: LLMSpec, hw: Hardware, kernels) -> Plugged:
    """``kernels`` checked against the model: known layer kinds the model has, each a `LayerKernel`
    of that kind or a bare pto kernel (then given the kind's standard arguments)."""
    if kernels is None:
        return Plugged()
    if not isinstance(kernels, dict):
        raise PluggedKernelError(f"kernels of type {type(kernels).__name__}: the engine takes a dict of layer kind "
                                 f"({', '.join(LAYER_KINDS)}) -> pto kernel. Fix: kernels={{'attention': "
                                 "pypto_lab.llm.plug.sparse_mla_attention()}")
    out = {}
    for kind, k in kernels.items():
        if kind not in LAYER_KINDS:
            raise PluggedKernelError(f"kernels[{kind!r}]: not a layer kind. Rule: the engine plugs kernels into "
                                     f"{', '.join(LAYER_KINDS)}. Fix: use one of these keys")
        plug = k if isinstance(k, LayerKernel) else LayerKernel(kind, k) if is_pto_kernel(k) or callable(k) else None
        if plug is None:
            raise PluggedKernelError(f"kernels[{kind!r}]: {type(k).__name__} is not a pto kernel. Rule: a plugged "
                                     "kernel is a @pypto.jit kernel, a callable returning one, or a LayerKernel. "
                                     "Fix: decorate the kernel with @pypto.jit")
        if plug.kind != kind:
            raise PluggedKernelError(f"kernels[{kind!r}]: {plug.label} implements {plug.kind!r}. Rule: a kernel is "
                                     f"plugged under its own layer kind. Fix: kernels={{'{plug.kind}': ...}}")
        _check_model(spec, hw, plug)
        out[kind] = plug
    return Plugged(out)


def _check_model(spec: LLMSpec, hw: Hardware, plug: LayerKernel) -> None:
    where = f"kernels[{plug.kind!r}] ({plug.label}) in {spec.name}"
    if plug.kind == "attention" and not spec.is_mla:
        raise PluggedKernelError(f"{where}: the engine plugs attention kernels into multi-head latent attention "
                                 "(DeepSeek-V2/V3/V3.2); this model's attention is grouped-query. Fix: a MLA model, "
                                 "or plug its linear_attention / moe")
    if plug.kind == "attention" and plug.sparse and not is_dsa(spec):
        raise PluggedKernelError(f"{where}: a sparse attention kernel needs the lightning indexer's selection "
                                 "(index_topk in the config: DeepSeek-V3.2). Fix: dense_mla_attention() for this model")
    if plug.kind == "linear_attention" and not linear_layers(spec):
        raise PluggedKernelError(f"{where}: the model has no linear-attention layers (Qwen3-Next's Gated DeltaNet: "
                                 "linear_* and full_attention_interval in its config). Fix: plug it into qwen3-next")
    if plug.kind == "moe":
        if not spec.is_moe:
            raise PluggedKernelError(f"{where}: the model has no MoE layers. Fix: plug it into a MoE model")
        if hw.ep > 1:
            raise PluggedKernelError(f"{where}: ep = {hw.ep}; the plugged MoE kernel holds every expert (its "
                                     "tensor-parallel slice) on the card. Fix: ep=1")
        if plug.args is None and hw.weight_bytes != hw.act_bytes:
            raise PluggedKernelError(f"{where}: precision {hw.precision!r} keeps expert weights in int8, and the "
                                     "kernel reads them in the activation dtype. Fix: precision='fp16' or 'bf16'")


def _check_fit(plug: LayerKernel, kernel, shape: StepShape, ins: list, outs: list) -> None:
    """The kernel's parameters against the tensors the step passes: the count, each annotated dtype and
    each annotated (fixed) dimension."""
    from ..pto.tensor import Tensor
    params = [p for p in kernel.signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    metas = [("input", m) for m in ins] + [("output", m) for m in outs]
    name = getattr(kernel, "__name__", "kernel")
    where = f"kernels[{plug.kind!r}]: {name} in {shape.spec.name}'s decode step (batch {shape.batch}, context " \
            f"{shape.context}, tp {shape.hw.tp})"
    if len(params) != len(metas):
        raise PluggedKernelError(
            f"{where} takes {len(params)} parameters; the step passes {len(ins)} input(s) and {len(outs)} output(s): "
            f"{', '.join(_describe(m) for _, m in metas)}. Rule: a {plug.kind} kernel takes the layer's "
            "standard arguments (pypto_lab.llm.plug's docstring) or those of its LayerKernel(args=...). Fix: change "
            "its parameters, or pass LayerKernel(kind, kernel, args=...)")
    for p, (role, m) in zip(params, metas, strict=True):
        ann = p.annotation
        if not isinstance(ann, Tensor) or not isinstance(m, TensorMeta):
            continue
        if ann.spec_dtype is not None and ann.spec_dtype.torch is not _TORCH[m.dtype]:
            raise PluggedKernelError(
                f"{where}: {role} {p.name!r} is annotated {str(ann.spec_dtype.torch).removeprefix('torch.')}, the "
                f"step passes {m.dtype}. Rule: the kernel runs on the step's tensors. Fix: annotate {p.name!r} "
                f"with the {m.dtype} dtype (or leave the dtype out)")
        if ann.spec_shape is not None:
            ok = len(ann.spec_shape) == len(m.shape) and all(not isinstance(x, int) or x == y
                                                            for x, y in zip(ann.spec_shape, m.shape, strict=False))
            if not ok:
                raise PluggedKernelError(
                    f"{where}: {role} {p.name!r} is annotated with shape {list(ann.spec_shape)}, the step passes "
                    f"{list(m.shape)}. Rule: a plugged kernel runs at the model's real shapes on the card. Fix: "
                    f"annotate {list(m.shape)} or pypto.DYNAMIC dimensions (or pypto.Tensor[...])")


def _hashable(m):
    try:
        hash(m)
        return m
    except TypeError:
        return repr(m)


def _describe(m) -> str:
    return f"{list(m.shape)} {m.dtype}" if isinstance(m, TensorMeta) else repr(m)


# ---- costing -------------------------------------------------------------------------------------------

_RUNS: dict[tuple, tuple[PtoKernel, KernelCost]] = {}


def _tensor(m):
    """A tensor for a cost-only run: values are not read (integer inputs are zeros: valid indices);
    a plain value (a scalar parameter) as it is."""
    if not isinstance(m, TensorMeta):
        return m
    dt = _TORCH[m.dtype]
    return torch.zeros(m.shape, dtype=dt) if not dt.is_floating_point else torch.empty(m.shape, dtype=dt)


def cost_plugged(plug: LayerKernel, shape: StepShape) -> tuple[PtoKernel, KernelCost]:
    """The `PtoKernel` of ``plug`` at ``shape`` and its cost: a SIM cost-only run on the card's chip
    (memoised per kernel, shapes and chip)."""
    from ..pto import config as pto_config
    from ..pto.errors import PtoError
    kernel = plug.build(shape)
    ins, outs = plug.tensors(shape)
    chip = shape.hw.chip
    # a kernel's own tensors may hold the context (sequence lengths it reads): then it is part of the key
    ctx = plug.rounded(shape.context) if plug.make_tensor else None
    key = (id(kernel), tuple(_hashable(m) for m in ins + outs), ctx, chip.name)
    hit = _RUNS.get(key)
    if hit is not None:
        return hit
    _check_fit(plug, kernel, shape, ins, outs)
    gm = shape.hw.act_dtype
    clone = _on_chip(kernel, chip)
    make = plug.make_tensor or (lambda i, m, s: _tensor(m))
    try:
        with plug.run_context() if plug.run_context else contextlib.nullcontext(), pto_config.cost_only(), \
                warnings.catch_warnings():
            args = [make(i, m, shape) for i, m in enumerate(ins + outs)]
            warnings.simplefilter("ignore")
            clone(*args)
    except (PtoError, ValueError, TypeError, IndexError, RuntimeError) as exc:
        raise PluggedKernelError(
            f"kernels[{plug.kind!r}]: {plug.label} failed at {shape.spec.name}'s decode shapes on {chip.name} "
            f"({', '.join(_describe(m) for m in ins + outs)}): {type(exc).__name__}: {exc}. "
            "Fix: make the kernel accept the layer's arguments at these shapes (its LayerKernel's args, or the "
            "standard ones)") from exc
    run = clone.last_run
    outs_t = tuple(m for m in outs if isinstance(m, TensorMeta))
    spec = PtoKernel(plug.label, kernel, tuple(ins) + tuple(m for m in outs if not isinstance(m, TensorMeta)),
                     outs_t, gm, "outputs", (), unit_of(run))
    units = {"vector": ("AIV",), "cube": ("AIC",)}.get(spec.pto_unit, ("AIC", "AIV"))
    c = KernelCost(run.cycles, run.time_us, run.gm_bytes, {}, (_report(spec, chip, run),),
                   split_resources(chip, *units))
    if len(_RUNS) > 512:
        _RUNS.clear()
    _RUNS[key] = (spec, c)
    return spec, c


def layer_count(spec: LLMSpec, kind: str) -> int:
    if kind == "linear_attention":
        return linear_layers(spec)
    if kind == "moe":
        return spec.moe_layers
    return spec.layers - linear_layers(spec)


def apply(kernels: list[CostedKernel], spec: LLMSpec, hw: Hardware, decode: list[int],
          plugged: dict[str, LayerKernel]) -> list[CostedKernel]:
    """The decode step's kernels with each plugged layer kind's kernels replaced by its pto kernel
    (at the position of the first one it replaces)."""
    shape = StepShape(spec, hw, len(decode), int(round(sum(decode) / len(decode))))
    out = list(kernels)
    for kind, plug in plugged.items():
        names = plug.replaces or REPLACES["dense_attention_dsa" if kind == "attention" and is_dsa(spec) and
                                          not plug.sparse else kind]
        pspec, c = cost_plugged(plug, shape)
        at = next((i for i, k in enumerate(out) if k.name in names), len(out))
        gone = tuple(k.name for k in out if k.name in names)
        out = [k for k in out if k.name not in names]
        ins, outs = plug.tensors(shape)
        io = float(sum(math.prod(m.shape) * torch.empty((), dtype=_TORCH[m.dtype]).element_size()
                       for m in ins + outs if isinstance(m, TensorMeta)))
        row = CostedKernel(Kernel(f"pto:{plug.label}", pspec, (), gone, kind), c, layer_count(spec, kind), io)
        out.insert(min(at, len(out)), row)
    return out


def plugged_rows(kernels: list[CostedKernel]) -> list[CostedKernel]:
    return [k for k in kernels if isinstance(k.spec, PtoKernel)]


__all__ = ["LAYER_KINDS", "LayerKernel", "Plugged", "PluggedKernelError", "REPLACES", "StepShape", "apply", "cost_plugged",
           "dense_mla_attention", "fused_moe", "gated_delta_rule", "layer_count", "plugged_rows", "resolve",
           "sparse_mla_attention", "standard"]
