"""One training step on simulated Ascend cards, as users run it: `simulate_step` and its `TrainReport`.

The step is the captured joint graph (`pypto_lab.train.capture`): its forward and backward nodes
become NPU kernels through the lowering table every front end uses (`pypto_lab.train.plan`), costed
by the chip model and placed on a stream of the software stack; the step around them is composed
by `pypto_lab.train.compose`: pipeline stages and their schedule, recomputation, the data-parallel
gradient collectives, the optimizer, and every rank's memory. The parallelisms are given as users
write them (`pypto_lab.train.parallel`): ``tp``, ``pp`` (``vpp`` virtual chunks per stage), ``cp``,
``dp``, ``ep``, ``micro_batches``, ``zero`` 0-3 or ``distributed_optimizer``, ``recompute`` and
``recompute_layers``; `pypto_lab.train.megatron_args` reads them from a Megatron / MindSpeed argument
list and `pypto_lab.train.deepspeed_config` from a DeepSpeed configuration.

* **Optimizer**: one fused Vector kernel over the rank's share of its stage's parameters (SGD with
  momentum, Adam or AdamW as CANN's ApplyMomentum / ApplyAdamW fused operators do), in fp32 on the
  fp32 master weights under O2, which also writes the half copy back. Under fp16 the gradients are
  checked for overflow (a reduction over all of them) before the update: dynamic loss scaling.
* **Data parallel**: gradients are reduced in buckets of ``bucket_mb`` (DDP's ``bucket_cap_mb``;
  a DDP-wrapped model gives its own), each bucket as soon as the last micro-batch's backward has
  produced its last gradient, on a communication stream that overlaps the rest of the backward
  (HCCL runs on its own stream); what is left after the backward's last kernel is exposed.
* **Memory** per card: parameters (and fp32 master weights), gradients, optimizer state (each as
  ZeRO shards it), the activations the backward reads (found in the joint graph) for as many
  micro-batches as the pipeline keeps in flight, workspace and communication buffers. A step that
  does not fit raises `HBMCapacityError` with the breakdown, the largest batch that fits and the
  cheapest changes of the layout that fit (`pypto_lab.train.fit`).

Collectives are costed by `pypto_lab.hw.collectives` over the server topology of the chip's family
with as many servers as the cards fill (`pypto_lab.train.parallel.cluster`), each group over the
links its ranks really use.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..hw.chip import DEFAULT_CHIP, Chip, get_chip
from ..llm.memory import HBMCapacityError
from ..llm.validation import check_config, is_count
from ..stack import DEFAULT_LLM_TRAIN_STACK, DEFAULT_TRAIN_STACK, Stack, StackConfigError, get_stack
from .capture import (
    StepGraph,
    capture_causal_lm,
    capture_step,
    causal_lm_batch,
    trains_as_causal_lm,
)
from .compose import OPTIMIZERS, Extras, compose, memory_of
from .fit import fitting_changes
from .parallel import Layout, LayoutError, cluster, layout_of
from .plan import StepPlan, lower_node, policy_dtype, tuned
from .policy import policy_of
from .report import BucketComm, StageReport, TrainReport


class TrainConfigError(ValueError):
    """An argument of `simulate_step` outside its rule; the message names the rule, value and fix."""


# ---- capture cache: the same model and batch shapes capture once -----------------------------

_CAPTURES: dict[tuple, tuple[weakref.ref, StepGraph]] = {}


def _signature(example_batch) -> tuple:
    items = example_batch.items() if isinstance(example_batch, dict) else enumerate(example_batch)
    return tuple((k, tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else (k, repr(v)) for k, v in items)


def _captured(model: nn.Module, example_batch, loss_fn, causal: bool, extra: Any = None) -> StepGraph:
    key = (id(model), _signature(example_batch), id(loss_fn), extra)
    hit = _CAPTURES.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    step = capture_causal_lm(model, example_batch) if causal else capture_step(model, example_batch, loss_fn)
    _CAPTURES[key] = (weakref.ref(model), step)
    return step


# ---- the model argument ---------------------------------------------------------------------

_CONFIG_MODELS: dict[tuple[int, int], tuple[Any, nn.Module]] = {}
CAPTURED_LAYERS = 2     # a config whose layers are all alike is captured with this many (`_resolve_model`)
# config keys under which a model's layers differ from one another (dense and MoE layers, sliding windows)
_LAYERS_DIFFER = ("first_k_dense_replace", "mlp_only_layers", "moe_layer_freq", "decoder_sparse_step",
                  "interleave_moe_layer_step", "no_rope_layers", "max_window_layers", "dense_layers")


def uniform_layers(cfg) -> bool:
    """Whether every decoder layer of a transformers config is the same (so its first layers'
    kernels are every layer's)."""
    d = cfg.to_dict()
    types = d.get("layer_types")
    if types and len(set(types)) > 1:
        return False
    for k in _LAYERS_DIFFER:
        v = d.get(k)
        if v in (None, 0, [], False) or (k in ("decoder_sparse_step", "moe_layer_freq", "interleave_moe_layer_step")
                                         and v == 1):
            continue
        if k == "max_window_layers" and not d.get("use_sliding_window"):
            continue
        return False
    return True


def _resolve_model(model):
    """(module, bucket_mb from a DDP wrapper or None, a name, whether it is a config-built causal LM,
    the model's repeated layers when the module holds fewer, else None). A transformers config
    whose layers are all alike is built on the meta device with `CAPTURED_LAYERS` layers: the
    step's composition runs the last one's kernels for the others."""
    from torch.nn.parallel import DistributedDataParallel

    bucket = None
    if isinstance(model, DistributedDataParallel):
        bucket = model.bucket_bytes_cap / 2 ** 20
        model = model.module
    try:
        from transformers import PretrainedConfig
    except ImportError:   # pragma: no cover - transformers is a dependency
        PretrainedConfig = ()
    if PretrainedConfig and isinstance(model, PretrainedConfig):
        import copy

        from transformers import AutoModelForCausalLM

        cfg = model
        layers = getattr(cfg, "num_hidden_layers", None)
        short = isinstance(layers, int) and layers > CAPTURED_LAYERS and uniform_layers(cfg)
        key = (id(cfg), CAPTURED_LAYERS if short else 0)
        hit = _CONFIG_MODELS.get(key)
        if hit is None or hit[0] is not cfg:   # one meta-device model per config object
            built = cfg
            if short:
                built = copy.deepcopy(cfg)
                built.num_hidden_layers = CAPTURED_LAYERS
                if getattr(built, "layer_types", None):
                    built.layer_types = list(built.layer_types)[:CAPTURED_LAYERS]
            with torch.device("meta"):
                hit = _CONFIG_MODELS[key] = (cfg, AutoModelForCausalLM.from_config(built))
        return hit[1], bucket, getattr(cfg, "model_type", "causal-lm"), True, layers if short else None
    return model, bucket, type(model).__name__, False, None

def _check(name: str, value, ok: bool, rule: str, fix: str) -> None:
    if not ok:
        raise TrainConfigError(f"{name} = {value!r}: {rule}. Fix: {fix}")


def _check_model_config(model) -> None:
    """A transformers config (given, or a module's ``.config``) passes the model-description gate
    of `pypto_lab.llm.validation` before a model is built from it or traced."""
    inner = getattr(model, "module", model)   # a DDP wrapper
    cfg = inner if hasattr(inner, "to_dict") and not isinstance(inner, nn.Module) else getattr(inner, "config", None)
    if cfg is not None and hasattr(cfg, "to_dict"):
        try:
            d = cfg.to_dict()
        except Exception:   # noqa: BLE001  (a config-like object that cannot say what it holds: not checked)
            return
        if isinstance(d, dict):
            check_config(d, where=str(d.get("_name_or_path") or d.get("model_type") or type(cfg).__name__))


def _check_batch(example_batch) -> None:
    """Every tensor of the example batch holds at least one sample and no empty dimension: a batch
    of 0 trains nothing, and its report would be a figure of nothing."""
    items = example_batch.items() if isinstance(example_batch, dict) else \
        enumerate(example_batch) if isinstance(example_batch, (tuple, list)) else ()
    for k, v in items:
        if isinstance(v, torch.Tensor) and v.dim() and 0 in v.shape:
            label = f"example_batch[{k!r}]"
            raise TrainConfigError(f"{label} has shape {tuple(v.shape)}: a batch needs at least one sample and no "
                                   "empty dimension (a batch of 0 trains nothing). Fix: a batch of one or more "
                                   f"samples, e.g. shape {tuple(max(1, d) for d in v.shape)}")




def _cp_batch(example_batch, cp: int):
    """One context-parallel rank's share of a causal LM's batch: ``s / cp`` of each sequence."""
    out = {}
    for k, v in example_batch.items():
        if isinstance(v, torch.Tensor) and v.dim() == 2:
            if v.shape[1] % (2 * cp):
                raise TrainConfigError(f"cp = {cp} with a sequence of {v.shape[1]} tokens: context parallelism splits "
                                       f"each sequence into 2 x cp = {2 * cp} equal chunks (two per rank, for an even "
                                       f"causal load). Fix: a sequence length that is a multiple of {2 * cp}")
            v = v[:, : v.shape[1] // cp]
        out[k] = v
    return out


def simulate_step(model, example_batch, loss_fn=None, optimizer: str = "adamw", chip: str | Chip = DEFAULT_CHIP,
                  cards: int | None = None, tp: int = 1, precision: str = "fp16", amp: str | None = None,
                  grad_accum: int = 1, checkpoint: bool = False, bucket_mb: float | None = None,
                  loader=None, flash_attention: bool | None = None,
                  sequence_parallel: bool = False, fuse_vector: bool | None = None,
                  mc2: bool = False, stack: str | Stack | None = None, *, pp: int = 1, dp: int | None = None,
                  cp: int = 1, ep: int = 1, vpp: int | None = None, micro_batches: int | None = None,
                  zero: int | None = None, distributed_optimizer: bool = False, fsdp: bool = False,
                  recompute: str | None = None, recompute_layers: int | None = None,
                  recompute_method: str = "uniform", overlap_grad_reduce: bool = True,
                  overlap_param_gather: bool = False, fp32_grads: bool | None = None,
                  grad_accumulation_fusion: bool | None = None, lora: Any = None) -> TrainReport:
    """Cost one training step of ``model`` on ``example_batch`` (one card's micro-batch).

    ``model``: an ``nn.Module``, a ``DistributedDataParallel`` wrapper (its bucket size is used) or a
    transformers config (a causal LM built on the meta device).
    ``example_batch``: ``(inputs..., target)`` with ``loss_fn``, or a dict whose model output has
    ``.loss``; for a causal LM (a config, or a transformers ``*ForCausalLM`` without ``loss_fn``)
    what its ``forward`` takes: an ``input_ids`` tensor, a tuple ``(input_ids, attention_mask, ...)``
    or a dict, the labels being the inputs when none are given (`causal_lm_batch`), trained on its
    next-token loss (`capture_causal_lm`). For context parallelism it is the whole sequence: each
    of the ``cp`` ranks keeps ``1 / cp`` of it.

    The layout (`pypto_lab.train.parallel`): ``cards`` (default: the simulated world size of
    `pypto_lab.distributed`, else ``tp * pp * cp * dp``); ``tp`` tensor-parallel cards per model
    replica (transformer blocks split Megatron style); ``pp`` pipeline stages (the model's repeated
    blocks split evenly over them, 1F1B; ``vpp`` model chunks per stage for the interleaved
    schedule); ``cp`` context-parallel ranks (ring attention); ``dp`` data-parallel replicas (the
    rest of the cards); ``ep`` expert-parallel ranks; ``micro_batches`` per step and data-parallel
    rank (``grad_accum`` is the same thing, as DDP users call it); ``zero`` the ZeRO stage (0-3;
    ``fsdp=True`` is FSDP's full_shard, ZeRO-3 as torch writes it) or ``distributed_optimizer``
    (Megatron's); ``recompute`` "full" (``checkpoint=True`` is the same) or "selective";
    ``recompute_layers`` layers of each chunk recomputed whole (``recompute_method`` "block": the
    first ones; "uniform": all); ``overlap_grad_reduce`` reduce the gradients' buckets during the
    last backward (DDP, DeepSpeed's ``overlap_comm``, Megatron's ``--overlap-grad-reduce``) or after
    it; ``overlap_param_gather`` the sharded optimizer's weight all-gather under the next forward;
    ``fp32_grads`` accumulate and reduce gradients in fp32 (default: Megatron's rule under the
    MindSpeed stack in bf16); ``grad_accumulation_fusion`` the weight-gradient GEMMs accumulate into
    the gradient buffer themselves (default: not under the MindSpeed stack, whose example scripts
    pass ``--no-gradient-accumulation-fusion``, so Megatron adds each micro-batch's gradients into its
    fp32 ``main_grad`` with a kernel of its own; elsewhere torch's AccumulateGrad adds them from the
    second micro-batch on).

    ``bucket_mb``: gradient bucket size (default: the DDP wrapper's, else DDP's 25 MB). ``loader``:
    a `pypto_lab.data.NPUDataLoader` whose measured feed time is set against the step.
    ``flash_attention``: run each attention as one fused FlashAttention kernel (torch_npu's
    npu_fusion_attention, as MindSpeed trains LLMs) instead of BatchMatMul, softmax, BatchMatMul
    with the scores in GM; None means the stack's ``attention_core`` fusion. ``sequence_parallel``
    (with ``tp > 1``): Megatron-LM's ``--sequence-parallel``. ``fuse_vector``: run each chain of
    Vector kernels as one kernel (`pypto_lab.lowering.fusion`); None means the stack's
    ``elementwise`` fusion. ``mc2`` (with ``tp > 1``): tensor-parallel collectives fused with their
    GEMMs (CANN's MC2, MindSpeed's ``--use-mc2``). ``stack``: the software stack that runs the step
    (`pypto_lab.stack`); None means MindSpeed for a causal LM built from a transformers config and
    torch_npu eager otherwise. ``lora``: train low-rank adapters on a frozen model
    (`pypto_lab.train.lora.LoRA`, or a rank). Returns a `TrainReport`; a step that does not fit in
    one card's HBM raises `HBMCapacityError` naming the cheapest changes that fit.
    """
    args = {k: v for k, v in locals().items() if k != "loader"}
    prep, layout = prepare_step(**args)
    memory, peak = prep.memory(layout)
    if peak > prep.chip.hbm_bytes:
        _raise_capacity(prep, layout, memory, peak)
    report = prep.report(layout)
    if loader is not None:
        report = _with_loader(report, loader)
    return report


def prepare_step(model, example_batch, loss_fn=None, optimizer: str = "adamw", chip: str | Chip = DEFAULT_CHIP,
                 cards: int | None = None, tp: int = 1, precision: str = "fp16", amp: str | None = None,
                 grad_accum: int = 1, checkpoint: bool = False, bucket_mb: float | None = None,
                 flash_attention: bool | None = None,
                 sequence_parallel: bool = False, fuse_vector: bool | None = None,
                 mc2: bool = False, stack: str | Stack | None = None, *, pp: int = 1, dp: int | None = None,
                 cp: int = 1, ep: int = 1, vpp: int | None = None, micro_batches: int | None = None,
                 zero: int | None = None, distributed_optimizer: bool = False, fsdp: bool = False,
                 recompute: str | None = None, recompute_layers: int | None = None,
                 recompute_method: str = "uniform", overlap_grad_reduce: bool = True,
                 overlap_param_gather: bool = False, fp32_grads: bool | None = None,
                 grad_accumulation_fusion: bool | None = None, lora: Any = None) -> tuple[Prepared, Layout]:
    """`simulate_step`'s arguments checked, the step captured and lowered, without a layout's cost:
    (the `Prepared` step, the checked `Layout`). ``prepared.memory(layout)`` and
    ``prepared.report(layout)`` then cost any layout of the same cards, context parallelism and
    micro-batch (`pypto_lab.explore.train_search` costs thousands of layouts from a few of these)."""
    from . import distributed

    _check_model_config(model)
    _check_batch(example_batch)
    module, ddp_bucket, name, causal, model_layers = _resolve_model(model)
    if cards is None and dp is None:
        world = distributed.get_world_size()
        cards = world if world > 1 or (tp * pp * cp) == 1 else None
    _check("cards", cards, cards is None or (isinstance(cards, int) and not isinstance(cards, bool) and cards >= 1),
           "the number of cards is a positive integer", "cards=8")
    _check("grad_accum", grad_accum, is_count(grad_accum) and grad_accum >= 1,
           "micro-batches per optimizer step is a positive integer", "grad_accum=1")
    if micro_batches is None:
        micro_batches = grad_accum
    elif grad_accum != 1 and grad_accum != micro_batches:
        raise TrainConfigError(f"grad_accum = {grad_accum} and micro_batches = {micro_batches}: both count the "
                               "micro-batches of a step. Fix: give one of them")
    _check("tp", tp, isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1
           and (cards is None or cards % tp == 0),
           f"tensor-parallel cards per replica must divide the {cards} cards", f"tp=1 or a divisor of {cards}")
    _check("mc2", mc2, not mc2 or tp > 1, "MC2 fuses tensor-parallel collectives with their matmuls: it needs "
           "tp > 1", "mc2=False, or tp=8 (with cards a multiple of it)")
    _check("optimizer", optimizer, optimizer in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}", "optimizer='adamw'")
    _check("recompute_method", recompute_method, recompute_method in ("uniform", "block"),
           "Megatron's --recompute-method: 'uniform' or 'block'", "recompute_method='block'")
    if checkpoint and recompute not in (None, "full"):
        raise TrainConfigError(f"checkpoint=True with recompute={recompute!r}: checkpointing is full "
                               "recomputation. Fix: one of them")
    if checkpoint:
        recompute = "full"
    if fsdp:
        if zero not in (None, 3):
            raise TrainConfigError(f"fsdp=True with zero={zero}: FSDP's full_shard shards weights, gradients and "
                                   "optimizer state (ZeRO-3). Fix: zero=3 or leave zero out")
        zero = 3
    try:
        layout = layout_of(cards, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batches=micro_batches, zero=zero,
                           distributed_optimizer=distributed_optimizer, recompute=recompute,
                           recompute_layers=recompute_layers, sequence_parallel=sequence_parallel,
                           overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather,
                           fsdp=fsdp)
    except LayoutError as e:
        raise TrainConfigError(str(e)) from None
    cards = layout.cards
    bucket = bucket_mb if bucket_mb is not None else (ddp_bucket if ddp_bucket is not None else 25.0)
    _check("bucket_mb", bucket, isinstance(bucket, (int, float)) and bucket > 0 and math.isfinite(bucket),
           "the gradient bucket size in MB is positive", "bucket_mb=25 (DDP's default)")
    try:
        policy = policy_of(precision, amp)
    except ValueError as e:
        raise TrainConfigError(str(e)) from None
    chip = get_chip(chip)
    try:
        topology = cluster(chip, cards) if cards > 1 else None
    except LayoutError as e:
        raise TrainConfigError(str(e)) from None
    config = getattr(module, "config", None)
    hidden = getattr(config, "hidden_size", None)
    if tp > 1:
        _check("tp", tp, hidden is not None, "tensor parallelism splits transformer blocks: the model needs a "
               "transformers config with hidden_size", "tp=1 for this model, or pass a transformers model/config")
        per_server = topology.cards_per_server if topology is not None else 1
        _check("tp", tp, tp <= per_server, f"tensor-parallel groups stay inside one server ({per_server} cards "
               f"on {topology.name if topology else chip.name}) on HCCS", f"tp<={per_server}")

    try:
        stack = get_stack(stack if stack is not None else (DEFAULT_LLM_TRAIN_STACK if causal else DEFAULT_TRAIN_STACK))
    except StackConfigError as e:
        raise TrainConfigError(str(e)) from None
    lm = causal or (loss_fn is None and trains_as_causal_lm(module))   # trained on its next-token loss
    if lm:
        example_batch = causal_lm_batch(module, example_batch)
    full_tokens = None
    if cp > 1:
        _check("cp", cp, lm, "context parallelism splits a causal LM's sequences over ranks (ring attention)",
               "cp=1 for this model, or a transformers causal LM / config")
        full_tokens = int(example_batch["input_ids"].shape[1])
        example_batch = _cp_batch(example_batch, cp)
    if lora is not None:
        from .lora import LoRAError, lora_applied, lora_of

        try:
            spec = lora_of(lora)
            with lora_applied(module, spec) as summary:
                step = _captured(module, example_batch, loss_fn, lm, extra=spec)
        except LoRAError as e:
            raise TrainConfigError(str(e)) from None
        if not any(n.startswith("LoRA") for n in step.notes):
            step.notes.append(f"LoRA: {summary}")
    else:
        step = _captured(module, example_batch, loss_fn, lm)
    megatron = stack.name == "mindspeed"
    head_dim = getattr(config, "head_dim", None) or (
        hidden // config.num_attention_heads if hidden and getattr(config, "num_attention_heads", None) else None)
    prep = Prepared(
        name=name, step=step, chip=chip, topology=topology, stack=stack, hidden=hidden, policy=policy,
        precision=precision, optimizer=optimizer, bucket_mb=float(bucket), megatron=megatron,
        flash=bool(stack.applies("attention_core") if flash_attention is None else flash_attention), causal=lm,
        fuse_vector=bool(stack.applies("elementwise") if fuse_vector is None else fuse_vector), mc2=bool(mc2),
        vocab=getattr(config, "vocab_size", None), model_layers=model_layers,
        fp32_grads=(megatron and precision == "bf16") if fp32_grads is None else bool(fp32_grads),
        kv_heads=getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None),
        head_dim=head_dim, recompute_method=recompute_method,
        accumulate="none" if grad_accumulation_fusion else ("every" if megatron else "after-first"),
        tokens_per_sample=full_tokens if full_tokens is not None else step.tokens)
    plan = prep.plan_for(layout)
    if ep > 1:
        experts = plan.moe.experts
        _check("ep", ep, experts > 0, "expert parallelism splits a mixture of experts' experts over ranks: the model "
               "has no MoE layer (no grouped matmul over experts in its step)", "ep=1 for this model")
        _check("ep", ep, experts % ep == 0, f"expert parallelism gives every rank the same number of the model's "
               f"{experts} experts: ep must divide {experts}",
               f"ep in {[d for d in range(1, experts + 1) if experts % d == 0 and (layout.dp * layout.cp) % d == 0]}")
    n_layers = prep.layers
    if pp > 1:
        _check("pp", pp, n_layers >= pp * layout.vpp, f"pipeline stages split the model's repeated blocks "
               f"({n_layers} found) into pp x vpp = {pp * layout.vpp} chunks",
               f"pp<={max(1, n_layers // layout.vpp)}" if n_layers else "pp=1 for a model without repeated blocks")
    return prep, layout


@dataclass
class Prepared:
    """A captured step and everything about its run but the layout: `memory` and `report` compose
    it under any layout of the same cards (the plans, one per tensor-parallel split, are kept)."""

    name: str
    step: StepGraph
    chip: Chip
    topology: Any
    stack: Stack
    hidden: int | None
    policy: Any
    precision: str
    optimizer: str
    bucket_mb: float
    megatron: bool
    flash: bool
    causal: bool
    fuse_vector: bool
    mc2: bool
    vocab: int | None
    model_layers: int | None
    fp32_grads: bool
    kv_heads: int | None
    head_dim: int | None
    recompute_method: str
    accumulate: str
    tokens_per_sample: int | None
    strategy: str = "exact"     # the parameter-sized Vector kernels' costing (`Extras.strategy`)
    plans: dict = field(default_factory=dict, repr=False)

    def plan_for(self, lay: Layout) -> StepPlan:
        key = (lay.tp, lay.sequence_parallel, self.mc2 and lay.tp > 1, lay.ep)
        if key not in self.plans:
            self.plans[key] = StepPlan(
                step=self.step, name=self.name, chip=self.chip, tp=lay.tp, hidden=self.hidden,
                topology=self.topology, policy=self.policy, flash=self.flash, causal=self.causal,
                sequence_parallel=lay.sequence_parallel, vocab=self.vocab if lay.tp > 1 else None,
                fuse_vector=self.fuse_vector, mc2=self.mc2 and lay.tp > 1, stack=self.stack,
                strategy=self.strategy, ep=lay.ep)
        return self.plans[key]

    @property
    def layers(self) -> int:
        n = self.model_layers
        if n is not None:
            return n
        plan = next(iter(self.plans.values()), None) or self.plan_for(Layout())   # the same blocks under any tp
        return len(plan.block_order)

    def extras(self, lay: Layout) -> Extras:
        return Extras(model_layers=self.layers, optimizer=self.optimizer, bucket_mb=self.bucket_mb,
                      fp32_grads=self.fp32_grads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                      recompute_method=self.recompute_method, checkpoint=lay.recompute == "full",
                      accumulate=self.accumulate, strategy=self.strategy, per_tensor_optimizer=self.megatron)

    def memory(self, lay: Layout) -> tuple[dict[str, int], int]:
        """The fullest stage's memory parts and total, without costing a kernel."""
        memory, peak, _ = memory_of(self.plan_for(lay), lay, self.extras(lay))
        return memory, peak

    def report(self, lay: Layout) -> TrainReport:
        plan = self.plan_for(lay)
        base = dict(model=self.name, chip=self.chip.name, cards=lay.cards, batch=self.step.batch,
                    precision=self.precision, amp=self.policy.amp, optimizer=self.optimizer, bucket_mb=self.bucket_mb,
                    checkpoint=lay.recompute == "full", tokens_per_sample=self.tokens_per_sample,
                    topology=self.topology.name if self.topology is not None else "",
                    fuse_vector=plan.fuse_vector, mc2=plan.mc2, stack=self.stack.name)
        return compose(plan, lay, self.extras(lay), base)


def _raise_capacity(prep: Prepared, layout: Layout, memory: dict[str, int], peak: int):
    gb = 2 ** 30
    step, chip, topology = prep.step, prep.chip, prep.topology
    static = peak - memory["activations"] - memory["workspace"]
    per_sample = (memory["activations"] + memory["workspace"]) / max(1, step.batch)
    largest = int((chip.hbm_bytes - static) // per_sample) if per_sample > 0 else 0

    def need(lay: Layout) -> int:
        if lay.tp != layout.tp and prep.hidden is None:
            raise ValueError("no hidden size to split")
        return prep.memory(lay)[1]

    fits = fitting_changes(layout, need, chip.hbm_bytes, megatron=prep.megatron, layers=prep.layers,
                           max_tp=topology.cards_per_server if topology is not None else 1)
    where = f" per card ({layout.describe()})" if layout.cards > 1 else " per card"
    advice = "; ".join(f"{label} fits with {b / gb:.1f} GiB per card" for label, b in fits)
    raise HBMCapacityError(
        f"{prep.name} training step at batch {step.batch}{where} needs {peak / gb:.1f} GiB of HBM on {chip.name} "
        f"({chip.hbm_bytes / gb:.0f} GiB): " + ", ".join(f"{k} {v / gb:.1f}" for k, v in memory.items())
        + ". Rule: one card's step must fit its HBM. Fix: "
        + (advice + "; or " if advice else "")
        + (f"batch <= {largest} per card, or more cards" if largest >= 1 else
           f"more cards (no batch fits this layout: the weights, gradients and optimizer state alone need "
           f"{static / gb:.1f} GiB)" if static >= chip.hbm_bytes else
           "more cards (not even one sample fits beside the weights, gradients and optimizer state)"))


def _with_loader(report: TrainReport, loader) -> TrainReport:
    """Set the loader's measured feed time against the step: when feeding ``grad_accum``
    micro-batches takes longer than the step, the NPU waits (the seed's "low NPU utilisation:
    data not ready") and the step is as long as the feed."""
    prof = loader.profile(batches=10)
    feed_ms = prof.feed_ms * report.grad_accum
    report.loader = prof
    advice = prof.advice(report.step_ms / report.grad_accum)
    if feed_ms > report.step_ms:
        report.data_wait_ms = feed_ms - report.step_ms
        report.step_ms = feed_ms
    report.notes.append(advice)
    return report


__all__ = ["BucketComm", "CAPTURED_LAYERS", "HBMCapacityError", "OPTIMIZERS", "Prepared", "StageReport",
           "TrainConfigError", "TrainReport", "lower_node", "policy_dtype", "prepare_step", "simulate_step", "tuned",
           "uniform_layers"]
