"""A pto kernel as the implementation of one layer kind in the LLM engine's decode or prefill
steps, as ``custom_op(npu_func=...)`` makes one a custom op's NPU implementation for ``optimize``.

``simulate_generation(model, ..., kernels={"attention": ..., "linear_attention": ..., "moe": ...})``:
each value is a `LayerKernel` (the kernel, the layer kind, the phase it implements, and the tensors
the step hands it), or a bare ``@pypto.jit`` kernel that then takes the layer kind's standard
decode arguments (`standard`), or a tuple of these serving different phases (a prefill form and a
decode form of the same layer). A kernel's ``phase`` says which steps it serves: ``"decode"`` (the
default: one token per sequence, the recurrent or incremental form), ``"prefill"`` (whole prompts:
a chunked or prompt-attention form) or ``"both"``. In every decode-only step (prefill-only step)
the layer kind's kernels (`REPLACES`; `PREFILL_REPLACES`) give way to one `PtoKernel` row of each
kernel serving that phase, counted once per layer of that kind, whose cost is the kernel's SIM run
in cost-only mode (`pypto_lab.pto.config.cost_only`: the control flow and the cost of the real run,
no values) at the step's real shapes on the card (heads and widths divided by tensor parallelism;
for a prefill the sequences, their prompt lengths and what came before), memoised per (kernel,
shapes, chip). Steps that mix prefill chunks and decode tokens (the serving simulator's chunked
prefill) keep the engine's own kernels.

The layer kinds and their standard decode arguments (per card; ``B`` sequences, context ``C``
rounded up to the kernel's block):

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

Their standard prefill arguments (``B`` sequences of ``P`` prompt tokens, ``P`` the longest chunk,
after ``past`` tokens already cached; ``T`` the step's tokens):

* ``"attention"``: q ``[B, H, P, d]``, k ``[B, H, past + P, d]``, v ``[B, H, past + P, dv]`` (the
  latents expanded by ``kv_b``, as the engine's prefill does), the output ``[B, H, P, dv]``. It
  replaces PromptFlashAttention.
* ``"linear_attention"``: q, k ``[B * Hv, P, dk]``, v ``[B * Hv, P, dv]``, g and beta ``[B * Hv, P]``,
  the initial state and the final state ``[B * Hv * dk, dv]`` fp32, the output ``[B * Hv, P, dv]``. It
  replaces the chunked gated delta rule (ChunkGatedDeltaRule_intra, ChunkGatedDeltaRule_state).
* ``"moe"``: as in decode, with ``T`` token rows.

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
PREFILL_REPLACES = {
    "attention": ("PromptFlashAttention",),
    "linear_attention": ("ChunkGatedDeltaRule_intra", "ChunkGatedDeltaRule_state"),
    "moe": REPLACES["moe"],
}
PHASES = ("decode", "prefill", "both")


class PluggedKernelError(LLMConfigError):
    """A kernel plugged into the engine does not fit its layer (the message names the rule, the value
    and a fix)."""


@dataclass(frozen=True)
class StepShape:
    """What a plugged kernel sees of one engine step on one card. A decode step (``phase``
    "decode"): ``batch`` sequences of one token each, ``context`` their mean context. A prefill step
    (``phase`` "prefill"): ``chunks`` the (prompt tokens, tokens already cached) of each of the
    ``batch`` sequences, ``context`` the longest chunk's tokens."""

    spec: LLMSpec
    hw: Hardware
    batch: int
    context: int
    phase: str = "decode"
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens the step runs: the chunks' tokens in a prefill, one per sequence in a decode."""
        return sum(c for c, _ in self.chunks) if self.phase == "prefill" else self.batch

    @property
    def past(self) -> int:
        """The most tokens a prefill chunk's sequence had cached before it (0 for a whole prompt)."""
        return max((p for _, p in self.chunks), default=0)

    def describe(self) -> str:
        if self.phase == "prefill":
            lens = sorted({c for c, _ in self.chunks})
            prompt = lens[0] if len(lens) == 1 else f"{lens[0]}-{lens[-1]}"
            return (f"prefill step (batch {self.batch}, prompt {prompt}" + (f", past {self.past}" if self.past else "")
                    + f", tp {self.hw.tp})")
        return f"decode step (batch {self.batch}, context {self.context}, tp {self.hw.tp})"


def prefill_shape(spec: LLMSpec, hw: Hardware, prefill) -> StepShape:
    """The `StepShape` of a prefill-only step of ``prefill`` = [(tokens, past), ...]."""
    chunks = tuple((int(c), int(p)) for c, p in prefill)
    return StepShape(spec, hw, len(chunks), max(c for c, _ in chunks), "prefill", chunks)


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
    context (``run_context()``, e.g. the NPU stand-in a real model file's kernel expects).
    ``phase``: the steps it implements the layer in, "decode" (default), "prefill" (a prompt's
    chunked or prompt-attention form, given the prefill's `StepShape`) or "both"."""

    kind: str
    kernel: Any
    args: Callable[[StepShape], tuple[list, list]] | None = None
    sparse: bool = False
    block: int = mk.BLOCK
    name: str = ""
    replaces: tuple[str, ...] = ()
    make_tensor: Callable[[int, Any, StepShape], Any] | None = None
    run_context: Callable[[], Any] | None = None
    phase: str = "decode"
    _built: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if self.phase not in PHASES:
            raise PluggedKernelError(
                f"kernels[{self.kind!r}] ({self.label}): phase {self.phase!r}. Rule: a plugged kernel implements its "
                f"layer in {', '.join(map(repr, PHASES))} steps. Fix: LayerKernel(..., phase='prefill') for a prompt's "
                "form (e.g. a chunked gated delta rule), 'decode' for the one-token form")

    def serves(self, phase: str) -> bool:
        """Whether the kernel implements its layer in ``phase`` ("decode" or "prefill") steps."""
        return self.phase in (phase, "both")

    def build(self, shape: StepShape):
        key = (shape.spec.name, shape.hw.tp, shape.batch, shape.phase,
               shape.chunks if shape.phase == "prefill" else self.rounded(shape.context, shape))
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
    """(inputs, outputs) the step hands a kernel of ``plug.kind`` (see the module's docstring)."""
    if s.phase == "prefill":
        return standard_prefill(plug, s)
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


def standard_prefill(plug: LayerKernel, s: StepShape) -> tuple[list[TensorMeta], list[TensorMeta]]:
    """(inputs, outputs) a prefill step hands a kernel of ``plug.kind`` (see the module's docstring):
    every sequence padded to the longest chunk ``P``."""
    spec, hw, b, p, a = s.spec, s.hw, s.batch, s.context, _act(s.hw)
    if plug.kind == "attention":
        heads, d, dv, c = spec.heads // hw.tp, spec.head_dim, spec.v_head_dim, s.past + p
        ins = [TensorMeta((b, heads, p, d), a), TensorMeta((b, heads, c, d), a), TensorMeta((b, heads, c, dv), a)]
        return ins, [TensorMeta((b, heads, p, dv), a)]
    if plug.kind == "linear_attention":
        x = spec.extra
        n = b * max(1, x["linear_num_value_heads"] // hw.tp)
        dk, dv = x["linear_key_head_dim"], x["linear_value_head_dim"]
        ins = [TensorMeta((n, p, dk), a), TensorMeta((n, p, dk), a), TensorMeta((n, p, dv), a), TensorMeta((n, p), a),
               TensorMeta((n, p), a), TensorMeta((n * dk, dv), "float32")]
        return ins, [TensorMeta((n * dk, dv), "float32"), TensorMeta((n, p, dv), a)]
    ins, outs = standard(plug, StepShape(spec, hw, s.tokens, s.context))       # MoE: token-wise, T rows
    return ins, outs


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
    """Layer kind -> tuple of `LayerKernel` (at most one per phase), as `resolve` checked them;
    ``apply`` puts them into a step's kernels (the forward pass calls it without importing this
    module)."""

    def apply(self, kernels: list[CostedKernel], spec: LLMSpec, hw: Hardware, decode: list[int],
              prefill=()) -> list[CostedKernel]:
        return apply(kernels, spec, hw, decode, self, prefill)


def resolve(spec: LLMSpec, hw: Hardware, kernels) -> Plugged:
    """``kernels`` checked against the model: known layer kinds the model has, each a `LayerKernel`
    of that kind or a bare pto kernel (then given the kind's standard decode arguments), or a tuple
    of them serving different phases."""
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
        plugs = []
        for one in (k if isinstance(k, (tuple, list)) else (k,)):
            plug = (one if isinstance(one, LayerKernel) else
                    LayerKernel(kind, one) if is_pto_kernel(one) or callable(one) else None)
            if plug is None:
                raise PluggedKernelError(f"kernels[{kind!r}]: {type(one).__name__} is not a pto kernel. Rule: a "
                                         "plugged kernel is a @pypto.jit kernel, a callable returning one, or a "
                                         "LayerKernel. Fix: decorate the kernel with @pypto.jit")
            if plug.kind != kind:
                raise PluggedKernelError(f"kernels[{kind!r}]: {plug.label} implements {plug.kind!r}. Rule: a kernel "
                                         f"is plugged under its own layer kind. Fix: kernels={{'{plug.kind}': ...}}")
            for phase in ("decode", "prefill"):
                other = next((p for p in plugs if p.serves(phase) and plug.serves(phase)), None)
                if other is not None:
                    raise PluggedKernelError(
                        f"kernels[{kind!r}]: {other.label} and {plug.label} both serve the {phase} steps. Rule: one "
                        "kernel per layer kind and phase. Fix: LayerKernel(..., phase='prefill') for the prompt's "
                        "form and phase='decode' for the one-token form")
            _check_model(spec, hw, plug)
            plugs.append(plug)
        out[kind] = tuple(plugs)
    return Plugged(out)


def _check_model(spec: LLMSpec, hw: Hardware, plug: LayerKernel) -> None:
    where = f"kernels[{plug.kind!r}] ({plug.label}) in {spec.name}"
    if plug.kind == "attention" and not spec.is_mla:
        raise PluggedKernelError(f"{where}: the engine plugs attention kernels into multi-head latent attention "
                                 "(DeepSeek-V2/V3/V3.2); this model's attention is grouped-query. Fix: a MLA model, "
                                 "or plug its linear_attention / moe")
    if plug.kind == "attention" and plug.sparse and plug.serves("prefill"):
        raise PluggedKernelError(f"{where}: phase {plug.phase!r}, and a sparse attention kernel reads the lightning "
                                 "indexer's selection, which the engine runs in decode steps only. Fix: "
                                 "phase='decode' (the default)")
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
    where = f"kernels[{plug.kind!r}]: {name} in {shape.spec.name}'s {shape.describe()}"
    if len(params) != len(metas):
        raise PluggedKernelError(
            f"{where} takes {len(params)} parameters; the step passes {len(ins)} input(s) and {len(outs)} output(s): "
            f"{', '.join(_describe(m) for _, m in metas)}. Rule: a {plug.kind} kernel takes the layer's "
            f"standard {shape.phase} arguments (pypto_lab.llm.plug's docstring) or those of its LayerKernel(args=...). Fix: change "
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
    ctx = (shape.chunks if shape.phase == "prefill" else plug.rounded(shape.context)) if plug.make_tensor else None
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
            f"kernels[{plug.kind!r}]: {plug.label} failed at {shape.spec.name}'s {shape.describe()} on {chip.name} "
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
          plugged: dict[str, tuple[LayerKernel, ...]], prefill=()) -> list[CostedKernel]:
    """A decode-only or prefill-only step's kernels with each plugged layer kind's kernels replaced
    by its pto kernel where it serves that phase (at the position of the first one it replaces); a
    step with both prefill chunks and decode tokens keeps the engine's kernels."""
    if decode and not prefill:
        shape = StepShape(spec, hw, len(decode), int(round(sum(decode) / len(decode))))
    elif prefill and not decode:
        shape = prefill_shape(spec, hw, prefill)
    else:
        return list(kernels)
    out = list(kernels)
    for kind, plugs in plugged.items():
        plug = next((p for p in plugs if p.serves(shape.phase)), None)
        if plug is None:
            continue
        if plug.replaces:
            names = plug.replaces
        elif shape.phase == "prefill":
            names = PREFILL_REPLACES[kind]
        else:
            names = REPLACES["dense_attention_dsa" if kind == "attention" and is_dsa(spec) and not plug.sparse
                             else kind]
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


__all__ = ["LAYER_KINDS", "LayerKernel", "PHASES", "PREFILL_REPLACES", "Plugged", "PluggedKernelError", "REPLACES",
           "StepShape", "apply", "cost_plugged", "dense_mla_attention", "fused_moe", "gated_delta_rule", "layer_count",
           "plugged_rows", "prefill_shape", "resolve", "sparse_mla_attention", "standard", "standard_prefill"]
