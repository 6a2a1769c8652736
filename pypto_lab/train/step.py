"""One training step on simulated Ascend cards: `simulate_step` and its `TrainReport`.

The step is the captured joint graph (`pypto_lab.train.capture`): its forward and backward nodes
become NPU kernels through the lowering table every front end uses (`pypto_lab.lowering.table`,
under the step's AMP `Policy`), costed by the chip model like inference kernels (Cube kernels
take the fastest tiling of the tile search's level-3 candidates, `pypto_lab.kernels.tile_search`),
run one after another on the AI cores; an op the table does not know runs on the host (its
fallback) and is listed in ``unmapped_ops``. A stack that fuses element-wise work runs chains of
Vector kernels as one (`pypto_lab.lowering.fusion`, the mechanism ``fuse_elementwise`` uses).
Then:

* **Optimizer**: one fused Vector kernel over all parameters (SGD with momentum, Adam or AdamW as
  CANN's ApplyMomentum / ApplyAdamW fused operators do), in fp32 on the fp32 master weights under
  O2, which also writes the half copy back. Under fp16 the gradients are checked for overflow (a
  reduction over all of them) before the update: dynamic loss scaling.
* **Data parallel** (``cards > 1``): gradients are all-reduced in buckets of ``bucket_mb`` (DDP's
  ``bucket_cap_mb``; a DDP-wrapped model gives its own), each bucket as soon as the backward has
  produced its last gradient, on a communication stream that overlaps the rest of the backward
  (HCCL runs on its own stream). What is left after the backward's last kernel is exposed. With
  ``grad_accum`` micro-batches, the inner ones skip the all-reduce (DDP's ``no_sync``).
* **Memory** per card: parameters (and fp32 master weights), gradients, optimizer state, the
  activations the backward reads (found in the joint graph), and the largest gradient in flight.
  ``checkpoint=True`` keeps only each repeated block's input (blocks: the indices of the model's
  ModuleLists / Sequentials) and recomputes the block's forward in the backward: the report gives
  the memory saved and the time paid. A step that does not fit raises `HBMCapacityError` with the
  largest batch that fits.

Collectives are costed by `pypto_lab.hw.collectives` over the server topology of the chip's family
(`hw/topologies/*.toml`; 16 cards of a 910B span two Atlas 800T A2 servers).
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..files.atomic import write_text_atomic
from ..hw.chip import DEFAULT_CHIP, Chip, get_chip
from ..kernels.cost import CostedKernel, KernelCost, cost
from ..kernels.ir import AttentionKernel, CollectiveKernel, CubeKernel, Kernel, KernelSpec, VectorKernel
from ..kernels.tile_search import candidate_tilings, search_tiling
from ..llm.engine import default_topology
from ..llm.memory import HBMCapacityError
from ..llm.validation import check_config, is_count
from ..lowering.fusion import VECTOR_CHAINS, fuse_vector_chains
from ..lowering.lower import flat_reduction
from ..lowering.table import lower_fx_node
from ..stack import DEFAULT_LLM_TRAIN_STACK, DEFAULT_TRAIN_STACK, Stack, StackConfigError, Stream, get_stack
from .capture import (
    JointChains,
    StepGraph,
    block_names,
    capture_causal_lm,
    capture_step,
    causal_lm_batch,
    forward_blocks,
    tensor_of,
    trains_as_causal_lm,
)
from .policy import BYTES, Policy, policy_of
from .qat import fake_quant_kernels

OPTIMIZERS = {
    # name: (fp32 tensors read per parameter, written, the fused update's vector ops, optimizer state)
    "sgd": (3, 2, ("mul", "add", "mul", "add"), 1),                       # p, g, momentum
    "momentum": (3, 2, ("mul", "add", "mul", "add"), 1),
    "adam": (4, 3, ("mul", "add", "mul", "mul", "add", "sqrt", "add", "div", "mul", "sub"), 2),
    "adamw": (4, 3, ("mul", "add", "mul", "mul", "add", "sqrt", "add", "div", "mul", "sub", "mul", "sub"), 2),
}


class TrainConfigError(ValueError):
    """An argument of `simulate_step` outside its rule; the message names the rule, value and fix."""


@dataclass(frozen=True)
class BucketComm:
    """One gradient bucket's all-reduce on the communication stream."""

    index: int
    nbytes: float
    ready_us: float       # when the backward has produced the bucket's last gradient
    start_us: float
    time_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.time_us


@dataclass
class TrainReport:
    """What one training step costs on each card, and where the time and memory go."""

    model: str
    chip: str
    cards: int
    batch: int                      # per card, per micro-batch
    grad_accum: int
    precision: str
    amp: str
    optimizer: str
    bucket_mb: float
    checkpoint: bool
    forward_ms: float
    backward_ms: float              # including recomputation under checkpointing
    recompute_ms: float
    optimizer_ms: float
    comm_ms: float                  # all-reduce time on the communication stream
    exposed_comm_ms: float          # the part no compute hides
    step_ms: float
    tokens_per_sample: int | None
    peak_hbm_bytes: int
    hbm_bytes: int
    memory: dict[str, int]
    largest_batch: int
    tp: int = 1
    tp_comm_ms: float = 0.0         # tensor-parallel all-reduces, on the critical path
    topology: str = ""              # the server topology preset the cards sit in ("" for one card)
    fuse_vector: bool = False       # chains of Vector kernels run fused (`pypto_lab.lowering.fusion`)
    mc2: bool = False               # tensor-parallel collectives fused with their GEMMs (MC2)
    data_wait_ms: float = 0.0       # the NPU idle, waiting for the loader
    stack: str = ""                 # the software stack the step ran under (`pypto_lab.stack`)
    host_idle_ms: float = 0.0       # the compute stream idle, waiting for the host's dispatch
    loader: Any = None              # the loader's LoaderProfile, when one was given
    kernels: list[CostedKernel] = field(default_factory=list, repr=False)
    buckets: list[BucketComm] = field(default_factory=list, repr=False)
    unmapped_ops: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def global_batch(self) -> int:
        return self.batch * (self.cards // self.tp) * self.grad_accum

    @property
    def samples_per_s(self) -> float:
        return self.global_batch * 1e3 / self.step_ms

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens_per_sample is None else self.samples_per_s * self.tokens_per_sample

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "chip": self.chip, "cards": self.cards, "batch": self.batch,
            "global_batch": self.global_batch, "grad_accum": self.grad_accum, "precision": self.precision,
            "amp": self.amp, "optimizer": self.optimizer, "bucket_mb": self.bucket_mb, "checkpoint": self.checkpoint,
            "step_ms": self.step_ms, "samples_per_s": self.samples_per_s, "tokens_per_s": self.tokens_per_s,
            "forward_ms": self.forward_ms, "backward_ms": self.backward_ms, "recompute_ms": self.recompute_ms,
            "optimizer_ms": self.optimizer_ms, "comm_ms": self.comm_ms, "exposed_comm_ms": self.exposed_comm_ms,
            "peak_hbm_bytes": self.peak_hbm_bytes, "hbm_bytes": self.hbm_bytes, "memory": dict(self.memory),
            "largest_batch": self.largest_batch, "tp": self.tp, "tp_comm_ms": self.tp_comm_ms,
            "topology": self.topology, "fuse_vector": self.fuse_vector, "mc2": self.mc2,
            "data_wait_ms": self.data_wait_ms, "stack": self.stack, "host_idle_ms": self.host_idle_ms,
            "unmapped_ops": dict(self.unmapped_ops), "notes": list(self.notes),
        }

    def table(self) -> str:
        gb = 2 ** 30
        lines = [f"{self.model} training step on {self.cards} x {self.chip} ({self.stack}), batch {self.batch}/card"
                 f"{f' x {self.grad_accum} accumulated' if self.grad_accum > 1 else ''}, {self.precision} "
                 f"amp {self.amp}, {self.optimizer}",
                 f"  forward       {self.forward_ms:9.2f} ms",
                 f"  backward      {self.backward_ms:9.2f} ms"
                 + (f"  (recompute {self.recompute_ms:.2f} ms)" if self.recompute_ms else ""),
                 f"  optimizer     {self.optimizer_ms:9.2f} ms",
                 f"  all-reduce    {self.comm_ms:9.2f} ms  ({self.exposed_comm_ms:.2f} ms exposed, "
                 f"{len(self.buckets)} buckets of {self.bucket_mb:g} MB)",
                 *([f"  TP all-reduce {self.tp_comm_ms:9.2f} ms  (tp={self.tp}, inside forward and backward)"]
                   if self.tp > 1 else []),
                 *([f"  data wait     {self.data_wait_ms:9.2f} ms  (the NPU waits for the loader)"]
                   if self.data_wait_ms else []),
                 f"  step          {self.step_ms:9.2f} ms  ->  {self.samples_per_s:,.1f} samples/s"
                 + (f", {self.tokens_per_s:,.0f} tokens/s" if self.tokens_per_s else ""),
                 f"  HBM per card  {self.peak_hbm_bytes / gb:9.2f} GiB of {self.hbm_bytes / gb:.1f} GiB "
                 f"(" + ", ".join(f"{k} {v / gb:.2f}" for k, v in self.memory.items()) + ")",
                 f"  largest batch per card that fits: {self.largest_batch}"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def chrome_trace(self, path: str | Path | None = None) -> dict[str, Any]:
        """The step as a Chrome trace (chrome://tracing, Perfetto): the compute stream and the
        communication stream of one card; written whole to ``path`` when given."""
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{self.chip} card 0"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "compute (AI cores)"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "communication (HCCL)"}},
        ]
        for k in self.kernels:
            events.append({"name": k.name, "cat": k.phase, "ph": "X", "pid": 0, "tid": 0, "ts": k.start_us,
                           "dur": k.time_us, "args": {"op": getattr(k.spec, "op", type(k.spec).__name__)}})
        for b in self.buckets:
            events.append({"name": f"allreduce bucket {b.index}", "cat": "comm", "ph": "X", "pid": 0, "tid": 1,
                           "ts": b.start_us, "dur": b.time_us, "args": {"bytes": b.nbytes, "ready_us": b.ready_us}})
        trace = {"traceEvents": events, "displayTimeUnit": "ms",
                 "otherData": {"step_ms": self.step_ms, "exposed_comm_ms": self.exposed_comm_ms}}
        if path is not None:
            write_text_atomic(path, json.dumps(trace))
        return trace


# ---- capture cache: the same model and batch shapes capture once -----------------------------

_CAPTURES: dict[tuple, tuple[weakref.ref, StepGraph]] = {}


def _signature(example_batch) -> tuple:
    items = example_batch.items() if isinstance(example_batch, dict) else enumerate(example_batch)
    return tuple((k, tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else (k, repr(v)) for k, v in items)


def _captured(model: nn.Module, example_batch, loss_fn, causal: bool) -> StepGraph:
    key = (id(model), _signature(example_batch), id(loss_fn))
    hit = _CAPTURES.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    step = capture_causal_lm(model, example_batch) if causal else capture_step(model, example_batch, loss_fn)
    _CAPTURES[key] = (weakref.ref(model), step)
    return step


def _tuned(spec: KernelSpec, chip: Chip) -> KernelCost:
    """A kernel's cost: Cube kernels with the fastest tiling of the tile search's level-3 candidates
    (what ``optimize`` at level 3 runs; CANN's training operators are tuned too)."""
    if isinstance(spec, CubeKernel):
        key = (id(chip), spec)
        if key not in _TUNED:
            _TUNED[key] = search_tiling(spec, chip, candidate_tilings(chip, spec)).best
        return _TUNED[key]
    return cost(spec, chip)


_TUNED: dict[tuple[int, CubeKernel], KernelCost] = {}


def lower_node(node: torch.fx.Node, chip: Chip, policy: Policy) -> tuple[list[KernelSpec], bool]:
    """The kernel specs one joint-graph node runs as (the lowering table's, under ``policy``), and
    whether the table knows its op (False: the host fallback). A scaled-dot-product attention op
    runs fused (torch_npu's npu_fusion_attention)."""
    specs, known = lower_fx_node(node, chip, policy.precision)
    return [replace(s, flash=True) if isinstance(s, AttentionKernel) and not s.flash else s for s in specs], known


# ---- the model argument ---------------------------------------------------------------------

_CONFIG_MODELS: dict[int, tuple[Any, nn.Module]] = {}


def _resolve_model(model):
    """(module, bucket_mb from a DDP wrapper or None, a name, whether it is a config-built causal LM)."""
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
        from transformers import AutoModelForCausalLM

        cfg = model
        hit = _CONFIG_MODELS.get(id(cfg))
        if hit is None or hit[0] is not cfg:   # one meta-device model per config object
            with torch.device("meta"):
                hit = _CONFIG_MODELS[id(cfg)] = (cfg, AutoModelForCausalLM.from_config(cfg))
        return hit[1], bucket, getattr(cfg, "model_type", "causal-lm"), True
    return model, bucket, type(model).__name__, False


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


def simulate_step(model, example_batch, loss_fn=None, optimizer: str = "adamw", chip: str | Chip = DEFAULT_CHIP,
                  cards: int | None = None, tp: int = 1, precision: str = "fp16", amp: str | None = None,
                  grad_accum: int = 1, checkpoint: bool = False, bucket_mb: float | None = None,
                  loader=None, flash_attention: bool | None = None,
                  sequence_parallel: bool = False, fuse_vector: bool | None = None,
                  mc2: bool = False, stack: str | Stack | None = None) -> TrainReport:
    """Cost one training step of ``model`` on ``example_batch`` (one card's micro-batch).

    ``model``: an ``nn.Module``, a ``DistributedDataParallel`` wrapper (its bucket size is used) or a
    transformers config (a causal LM built on the meta device).
    ``example_batch``: ``(inputs..., target)`` with ``loss_fn``, or a dict whose model output has
    ``.loss``; for a causal LM (a config, or a transformers ``*ForCausalLM`` without ``loss_fn``)
    what its ``forward`` takes: an ``input_ids`` tensor, a tuple ``(input_ids, attention_mask, ...)``
    or a dict, the labels being the inputs when none are given (`causal_lm_batch`), trained on its
    next-token loss (`capture_causal_lm`). ``cards``: all cards (default: the simulated world size of `pypto_lab.distributed`,
    else 1); ``tp``: tensor-parallel cards per model replica (transformer blocks split Megatron
    style), the rest data parallel. ``bucket_mb``: gradient bucket size (default: the DDP wrapper's,
    else DDP's 25 MB). ``loader``: a `pypto_lab.data.NPUDataLoader` whose measured feed time is set
    against the step. ``flash_attention``: run each attention as one fused FlashAttention kernel
    (torch_npu's npu_fusion_attention, as MindSpeed trains LLMs) instead of BatchMatMul, softmax,
    BatchMatMul with the scores in GM; None means fused for a causal LM built from a transformers
    config and unfused otherwise (as the traced model runs it). ``sequence_parallel`` (with
    ``tp > 1``): the blocks' LayerNorms, residual adds and dropouts split along the sequence too,
    and each all-reduce becomes a reduce-scatter and an all-gather (Megatron-LM's
    ``--sequence-parallel``). ``fuse_vector``: run each chain of Vector kernels (an RMSNorm's six
    ops, SwiGLU, a rotary embedding, their gradients) as one kernel, as MindSpeed's fused kernels
    and graph-mode compilers do (`pypto_lab.lowering.fusion`); None means fused for a causal LM built
    from a transformers config (MindSpeed's ``--use-fused-rmsnorm --use-fused-swiglu
    --use-fused-rotary-pos-emb``) and one kernel per op otherwise (eager torch_npu). ``mc2`` (with
    ``tp > 1``): each tensor-parallel collective runs fused with the GEMM beside it, chunk by
    chunk (CANN's MC2 operators, MindSpeed's ``--use-mc2``; see `_Plan.tp_collective_us`). ``stack``: the software
    stack that runs the step (`pypto_lab.stack`: its host dispatch and kernel launch, and the
    defaults of ``flash_attention`` and ``fuse_vector``: its ``attention_core`` and ``elementwise``
    fusions); None means MindSpeed for a causal LM built from a transformers config and torch_npu
    eager otherwise. Returns a `TrainReport`; a step that does not fit in one card's HBM raises
    `HBMCapacityError`.
    """
    from . import distributed

    _check_model_config(model)
    _check_batch(example_batch)
    module, ddp_bucket, name, causal = _resolve_model(model)
    if cards is None:
        cards = distributed.get_world_size()
    _check("cards", cards, isinstance(cards, int) and not isinstance(cards, bool) and cards >= 1,
           "the number of cards is a positive integer", "cards=8")
    _check("tp", tp, isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1 and cards % tp == 0,
           f"tensor-parallel cards per replica must divide the {cards} cards", f"tp=1 or a divisor of {cards}")
    _check("grad_accum", grad_accum, is_count(grad_accum) and grad_accum >= 1,
           "micro-batches per optimizer step is a positive integer", "grad_accum=1")
    _check("mc2", mc2, not mc2 or tp > 1, "MC2 fuses tensor-parallel collectives with their matmuls: it needs "
           "tp > 1", "mc2=False, or tp=8 (with cards a multiple of it)")
    _check("optimizer", optimizer, optimizer in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}", "optimizer='adamw'")
    bucket = bucket_mb if bucket_mb is not None else (ddp_bucket if ddp_bucket is not None else 25.0)
    _check("bucket_mb", bucket, isinstance(bucket, (int, float)) and bucket > 0 and math.isfinite(bucket),
           "the gradient bucket size in MB is positive", "bucket_mb=25 (DDP's default)")
    try:
        policy = policy_of(precision, amp)
    except ValueError as e:
        raise TrainConfigError(str(e)) from None
    chip = get_chip(chip)
    topology = default_topology(chip, cards) if cards > 1 else None
    hidden = None
    if tp > 1:
        hidden = getattr(getattr(module, "config", None), "hidden_size", None)
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
    step = _captured(module, example_batch, loss_fn, lm)
    plan = _Plan(step=step, name=name, chip=chip, cards=cards, tp=tp, hidden=hidden, topology=topology,
                 policy=policy, precision=precision, optimizer=optimizer, grad_accum=grad_accum,
                 checkpoint=bool(checkpoint), bucket_mb=float(bucket),
                 flash=bool(stack.applies("attention_core") if flash_attention is None else flash_attention),
                 sequence_parallel=bool(sequence_parallel) and tp > 1,
                 fuse_vector=bool(stack.applies("elementwise") if fuse_vector is None else fuse_vector),
                 mc2=bool(mc2), stack=stack,
                 vocab=getattr(getattr(module, "config", None), "vocab_size", None) if tp > 1 else None)
    memory, peak, largest, ckpt_saved = plan.memory()
    report = plan.run(memory, peak, largest, ckpt_saved)
    if loader is not None:
        report = _with_loader(report, loader)
    return report


def policy_dtype(specs: list[KernelSpec]) -> str:
    """The Cube dtype of a node's kernels (the attention GEMM's)."""
    return next((sp.dtype for sp in specs if isinstance(sp, CubeKernel)), "fp16")


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


@dataclass
class _Plan:
    """One step's arguments, resolved; `memory` and `run` cost it."""

    step: StepGraph
    name: str
    chip: Chip
    cards: int
    tp: int
    hidden: int | None
    topology: Any
    policy: Policy
    precision: str
    optimizer: str
    grad_accum: int
    checkpoint: bool
    bucket_mb: float
    flash: bool = False
    sequence_parallel: bool = False
    vocab: int | None = None
    fuse_vector: bool = False
    mc2: bool = False
    stack: Stack = field(default_factory=lambda: get_stack(DEFAULT_TRAIN_STACK))

    def __post_init__(self):
        self.chains = JointChains(self.step) if self.fuse_vector else None
        self.blocks = forward_blocks(self.step) if (self.checkpoint or self.tp > 1) else {}
        self.param_blocks = block_names(list(self.step.params))
        self.act = {"fp32": 4, "fp16": 2, "bf16": 2}[self.policy.act_dtype]
        self.tokens = self.step.batch * (self.step.tokens or 1)
        self.block_params = {n for p, n in self.step.params.items() if self.param_blocks.get(p)}
        self.backward_in_block: dict[torch.fx.Node, bool] = {}   # `_in_block`'s memo for backward nodes
        # parameters split over the tensor-parallel group: the blocks', and the vocabulary-sized
        # embedding and LM head (Megatron's VocabParallelEmbedding and parallel output layer)
        self.split_params = {p for p, n in self.step.params.items() if self.param_blocks.get(p) or (
            self.vocab and tensor_of(n) is not None and tensor_of(n).shape[0] == self.vocab)}
        seq = self.step.tokens
        self.scores = set()
        if self.flash and seq and seq > 1:   # the s x s attention scores FlashAttention never writes to GM
            for n in self.step.forward + self.step.backward:
                v = tensor_of(n)
                # (b x heads) s x s matrices, not a (b, s, hidden) state whose hidden size is s
                if (v is not None and v.dim() >= 3 and v.shape[-1] == v.shape[-2] == seq
                        and math.prod(v.shape[:-2]) > self.step.batch):
                    self.scores.add(n)

    # ---- FlashAttention ----
    def _touches_scores(self, node) -> bool:
        return any(self.step.base.get(a, a) in self.scores for a in node.all_input_nodes)

    def flash_specs(self, node, specs: list[KernelSpec], phase: str) -> list[KernelSpec] | None:
        """The kernels of a node under FlashAttention (None: not part of an attention). Forward:
        the GEMM that makes the scores becomes one fused attention kernel, and everything else on
        the scores (scale, mask, softmax, the GEMM that consumes them) is inside it. Backward: each
        of the four gradient GEMMs that touch the scores costs 0.625 of the fused forward (2.5
        forwards in all: FlashAttention-2's backward recomputes the scores and runs five GEMMs to
        the forward's two; Dao 2023, Algorithm 2); the softmax gradient is inside them."""
        if not self.scores or not (node in self.scores or self._touches_scores(node)):
            return None
        if str(node.target) != "aten.bmm.default":
            return []
        q = tensor_of(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        out = tensor_of(node)
        seq = self.step.tokens
        if phase == "forward":
            if node not in self.scores or q is None:
                return []
            bh, s_q, d = q.shape
            return [AttentionKernel(batch_heads=bh, s_q=s_q, s_k=out.shape[-1], d=d, dtype=policy_dtype(specs),
                                    flash=True)]
        cube = [sp for sp in specs if isinstance(sp, CubeKernel)]
        if not cube:
            return []
        bh = cube[0].batch
        d = min(cube[0].m, cube[0].k, cube[0].n, key=lambda v: (v == seq, v))
        return [AttentionKernel(batch_heads=max(1, round(bh * 0.625)), s_q=seq, s_k=seq, d=d,
                                dtype=cube[0].dtype, flash=True)]

    # ---- tensor parallelism ----
    def sharded(self, node) -> bool:
        """Whether Megatron-style tensor parallelism splits this node's work over the ``tp`` cards:
        every node inside a transformer block except those on the replicated hidden state
        (LayerNorm, residual adds and dropout on tokens x hidden), which sequence parallelism
        splits along the tokens as well (Korthikanti et al. 2022); and the logits, split over the
        vocabulary."""
        if self.tp == 1:
            return False
        out = tensor_of(node)
        if self.vocab and out is not None and out.dim() >= 2 and out.shape[-1] == self.vocab:
            return True   # the vocabulary-parallel LM head and its loss (Megatron's parallel cross-entropy)
        if not self._in_block(node):
            return False
        if self.sequence_parallel:   # the hidden state's own ops split along the sequence too
            return True
        out = tensor_of(node)
        if out is None:
            return True
        return not (out.shape[-1] == self.hidden and out.numel() == self.tokens * self.hidden)

    def _in_block(self, node) -> bool:
        if node in self.blocks:
            return self.blocks[node] is not None
        # backward nodes: in a block when they touch a block's tensors (its parameters or saved
        # values) or a gradient computed from them (SiLU's 1 - sigmoid reads only the recomputed
        # sigmoid); memoised, the backward visits its nodes in order
        memo = self.backward_in_block
        hit = memo.get(node)
        if hit is None:
            hit = memo[node] = any(
                self.blocks.get(b) or b in self.block_params or memo.get(b, False)
                for b in (self.step.base.get(a, a) for a in node.all_input_nodes))
        return hit

    def shard(self, spec: KernelSpec) -> KernelSpec:
        """The part of a kernel one of ``tp`` cards runs: a GEMM's non-token dimension (the heads,
        the intermediate size, or the weight's sharded side), attention's heads, or a vector
        kernel's elements."""
        tp = self.tp
        if isinstance(spec, CubeKernel):
            if spec.batch % tp == 0 and spec.batch > 1:
                return replace(spec, batch=spec.batch // tp)
            dims = {"m": spec.m, "k": spec.k, "n": spec.n}
            cand = [d for d, v in dims.items() if v != self.tokens and v % tp == 0]
            if not cand:
                return spec
            d = max(cand, key=lambda x: dims[x])
            return replace(spec, **{d: dims[d] // tp})
        if isinstance(spec, AttentionKernel):
            return replace(spec, batch_heads=max(1, spec.batch_heads // tp))
        if isinstance(spec, VectorKernel):
            rows = spec.row_len or 1
            numel = max(rows, (spec.numel // tp) // rows * rows)
            return replace(spec, numel=numel)
        return spec

    def tp_spec(self) -> KernelSpec:
        """The tensor-parallel collective of the hidden state, as a kernel spec (for the report)."""
        nbytes = int(self.tokens * self.hidden * self.act)
        return CollectiveKernel("reducescatter" if self.sequence_parallel else "allreduce", nbytes, self.tp,
                                self.topology)

    def tp_allreduce_us(self) -> float:
        """One all-reduce of the hidden state (tokens x hidden) over the tensor-parallel group; with
        sequence parallelism the same bytes move as a reduce-scatter and an all-gather."""
        nbytes = self.tokens * self.hidden * self.act
        if self.sequence_parallel:
            return (self.collective_us("reducescatter", nbytes, self.tp)
                    + self.collective_us("allgather", nbytes // self.tp, self.tp))
        return self.collective_us("allreduce", nbytes, self.tp)

    def collective_us(self, kind: str, nbytes: int, cards: int) -> float:
        """One HCCL collective over ``cards`` cards of the step's topology (its `CollectiveKernel`)."""
        return cost(CollectiveKernel(kind, int(nbytes), cards, self.topology if cards > 1 else None),
                    self.chip).time_us

    def tp_collective_us(self, block_cube_us: float, n_blocks: int) -> float:
        """The critical-path time of one of a phase's ``2 x n_blocks`` tensor-parallel collectives.
        Without MC2 the whole collective. With MC2 (CANN's fused MatmulAllReduce / AllGatherMatmul /
        MatmulReduceScatter, MindSpeed's ``--use-mc2``) the collective and the GEMM beside it run
        as one kernel that computes the GEMM in ``tp`` chunks and communicates each finished
        chunk while the next is computed: the pair takes ``max(c, g) + min(c, g) / tp``, so what the
        collective adds to its GEMM ``g`` (the blocks' GEMM time of the phase shared evenly over
        its collectives) is that minus ``g``."""
        c = self.tp_allreduce_us()
        if not self.mc2 or n_blocks == 0:
            return c
        g = block_cube_us / (2 * n_blocks)
        return max(c, g) + min(c, g) / self.tp - g

    # ---- memory ----
    def act_bytes(self, node) -> int:
        v = tensor_of(node)
        if v is None:
            return 0
        size = v.numel() * (self.act if v.dtype.is_floating_point else v.element_size())
        return size // self.tp if self.sharded(node) else size

    def memory(self) -> tuple[dict[str, int], int, int, tuple[int, int] | None]:
        """HBM per card: (parts, peak, the largest batch that fits, (activations without and with
        checkpointing) or None). Raises `HBMCapacityError` when the step does not fit."""
        step, policy = self.step, self.policy
        params = {p: tensor_of(n) for p, n in step.params.items()}
        shard = {p: (self.tp if self.tp > 1 and p in self.split_params else 1) for p in params}
        n_params = sum(params[p].numel() // shard[p] for p in params)
        n_train = sum(params[p].numel() // shard[p] for p in step.grads)
        state = OPTIMIZERS[self.optimizer][3]
        memory = {"weights": n_params * BYTES[policy.param_dtype]}
        if policy.master_weights:
            memory["master weights"] = n_train * 4
        memory["gradients"] = n_train * BYTES[policy.param_dtype]
        memory["optimizer state"] = n_train * 4 * state
        saved = [n for n in step.saved() if n not in self.scores]
        saved_bytes = sum(self.act_bytes(n) for n in saved)
        ckpt = None
        if self.checkpoint:
            by_block: dict[str, int] = {}
            for n in saved:
                b = self.blocks.get(n)
                if b:
                    by_block[b] = by_block.get(b, 0) + self.act_bytes(n)
            kept = saved_bytes - sum(by_block.values())
            firsts: dict[str, int] = {}   # each block keeps its input
            pnodes = set(step.params.values())
            for n in step.forward:
                b = self.blocks.get(n)
                if b and b not in firsts:
                    firsts[b] = max((self.act_bytes(a) for a in n.all_input_nodes
                                     if step.base.get(a, a) not in pnodes), default=0)
            memory["activations"] = kept + sum(firsts.values()) + max(by_block.values(), default=0)
            ckpt = (saved_bytes, memory["activations"])
        else:
            memory["activations"] = saved_bytes
        memory["workspace"] = 2 * max((self.act_bytes(n) for n in step.backward if n not in self.scores), default=0)
        peak = sum(memory.values())
        static = peak - memory["activations"] - memory["workspace"]
        per_sample = (memory["activations"] + memory["workspace"]) / max(1, step.batch)
        largest = int((self.chip.hbm_bytes - static) // per_sample) if per_sample > 0 else 0
        if peak > self.chip.hbm_bytes:
            gb = 2 ** 30
            raise HBMCapacityError(
                f"{self.name} training step at batch {step.batch} per card needs {peak / gb:.1f} GiB of HBM on "
                f"{self.chip.name} ({self.chip.hbm_bytes / gb:.0f} GiB): "
                + ", ".join(f"{k} {v / gb:.1f}" for k, v in memory.items())
                + f". Rule: one card's step must fit its HBM. Fix: batch <= {max(largest, 0)} per card, "
                  "checkpoint=True, or more cards")
        return {k: int(v) for k, v in memory.items()}, int(peak), largest, ckpt

    # ---- time ----
    def run(self, memory: dict[str, int], peak: int, largest: int, ckpt) -> TrainReport:
        step, policy, chip = self.step, self.policy, self.chip
        unmapped: dict[str, int] = {}
        notes: list[str] = list(step.notes)
        kernels: list[CostedKernel] = []
        stream = Stream(self.stack)   # the compute stream, kernels launched as the stack launches them

        ready_at: dict[torch.fx.Node, float] = {}
        fused_count = [0, 0]   # fused Vector kernels, and the ops they cover
        block_cube_us: dict[str, float] = {}   # the blocks' GEMM time per phase (what MC2 overlaps)

        def place(name: str, phase: str, spec: KernelSpec, kc: KernelCost | float, collective: bool = False,
                  count: int = 1) -> None:
            if not isinstance(kc, KernelCost):   # a time worked out here (a collective beyond its MC2 matmul)
                kc = KernelCost(kc * chip.clock_mhz, kc, 0.0, {}, (), ("link",), bound="link")
            p = stream.run(kc.time_us, count, collective)
            kernels.append(CostedKernel(Kernel(name, spec, (), (getattr(spec, "op", spec.kind),), name), kc, count,
                                        phase=phase, start_us=p.start_us))

        def run(nodes, phase: str) -> None:
            items = []
            for node in nodes:
                specs, mapped = lower_node(node, chip, policy)
                if not mapped:
                    unmapped[str(node.target)] = unmapped.get(str(node.target), 0) + 1
                fused = self.flash_specs(node, specs, "backward" if phase == "backward" else "forward")
                if fused is not None:
                    specs = fused
                sharded = bool(specs) and self.sharded(node)
                if sharded:
                    specs = [self.shard(s) for s in specs]
                items.append((node, specs, sharded))
            units = (fuse_vector_chains(items, self.chains, VECTOR_CHAINS, self.tp) if self.fuse_vector
                     else [([node], specs) for node, specs, _ in items])
            if self.fuse_vector:
                chains = [u for u in units if len(u[0]) > 1 and u[1]]
                fused_count[0] += len(chains)
                fused_count[1] += sum(len(u[0]) for u in chains)
            for covered, specs in units:
                in_block = self.tp > 1 and len(covered) == 1 and self._in_block(covered[0])
                for spec in specs:
                    kc = _tuned(spec, chip)
                    if in_block and isinstance(spec, CubeKernel):
                        block_cube_us[phase] = block_cube_us.get(phase, 0.0) + kc.time_us
                    label = covered[0].name if len(covered) == 1 else f"{covered[0].name}..{covered[-1].name}"
                    place(f"{getattr(spec, 'op', 'attention')}:{label}", phase, spec, kc)
                for node in covered:
                    ready_at[node] = stream.now_us

        tp_comm_us = 0.0
        run(step.forward, "forward")
        qat = [fake_quant_kernels(layer, policy) for layer in step.fake_quant]
        for layer, (fwd, _) in zip(step.fake_quant, qat):
            for spec in fwd:
                place(f"{spec.op}:{layer.name}", "forward", spec, _tuned(spec, chip))
        n_blocks = len({b for b in self.blocks.values() if b})
        if self.tp > 1:   # two all-reduces of the hidden state per block: after attention and after the MLP
            ar = self.tp_collective_us(block_cube_us.get("forward", 0.0), n_blocks)
            for i in range(2 * n_blocks):
                place(f"TP allreduce {i}" + (" (MC2, beyond its matmul)" if self.mc2 else ""), "forward",
                      self.tp_spec(), ar, collective=True)
            tp_comm_us += 2 * n_blocks * ar
        forward_us = stream.now_us
        recompute_us = 0.0
        if self.checkpoint:
            start = stream.now_us
            run([n for n in step.forward if self.blocks.get(n)], "recompute")
            recompute_us = stream.now_us - start
        back_start = stream.now_us
        run(step.backward, "backward")
        for layer, (_, bwd) in zip(step.fake_quant, qat):
            for spec in bwd:
                place(f"{spec.op}:{layer.name}", "backward", spec, _tuned(spec, chip))
        if step.fake_quant:
            notes.append(f"quantisation-aware training: the int8 fake quantisation of {len(step.fake_quant)} layers "
                         "(observer min/max, clamp, round and rescale of input and weight; the straight-through "
                         "gradient) is costed on the Vector unit")
        if self.tp > 1:   # and two in the backward, for the column-parallel inputs' gradients
            ar = self.tp_collective_us(block_cube_us.get("backward", 0.0), n_blocks)
            if n_blocks:
                place("TP allreduce (backward)" + (" (MC2, beyond its matmul)" if self.mc2 else ""), "backward",
                      self.tp_spec(), ar, collective=True, count=2 * n_blocks)
            tp_comm_us += 2 * n_blocks * ar
        backward_end = stream.now_us
        backward_us = backward_end - back_start + recompute_us
        grad_ready = {p: ready_at.get(step.base.get(g, g), backward_end) for p, g in step.grads.items()}

        # ---- optimizer ----
        params = {p: tensor_of(n) for p, n in step.params.items()}
        shard = {p: (self.tp if self.tp > 1 and p in self.split_params else 1) for p in params}
        n_train = sum(params[p].numel() // shard[p] for p in step.grads)
        reads, writes, ops, _state = OPTIMIZERS[self.optimizer]
        opt_specs: list[tuple[str, KernelSpec]] = []
        if policy.loss_scaling:   # dynamic loss scaling: one overflow check over all gradients
            numel, row = flat_reduction(n_train)
            opt_specs.append(("CheckOverflow", VectorKernel(op="CheckOverflow", ops=("max",), numel=numel,
                                                             dtype=policy.param_dtype, compute_dtype="fp32",
                                                             inputs=1, row_len=row)))
        fused = ops + (("mul",) if policy.loss_scaling else ())   # unscaling folded into the update
        label = f"Apply{self.optimizer.capitalize()}"
        opt_specs.append((label, VectorKernel(op=label, ops=fused, numel=n_train, dtype="fp32", compute_dtype="fp32",
                                              inputs=reads)))
        if writes > 1:   # the update writes its state too: the extra fp32 tensors cross GM once each
            opt_specs.append(("WriteOptimizerState", VectorKernel(op="WriteOptimizerState", ops=("copy",),
                                                                   numel=max(1, n_train * (writes - 1) // 2),
                                                                   dtype="fp32", compute_dtype="fp32", inputs=1)))
        if policy.master_weights:   # O2: the half model weights from the fp32 master copy
            opt_specs.append(("CastMasterToHalf", VectorKernel(op="Cast", ops=("cast",), numel=n_train, dtype="fp32",
                                                                compute_dtype="fp32", inputs=1)))

        # ---- data parallel: buckets all-reduced as the backward produces them ----
        buckets: list[BucketComm] = []
        grad_bytes = BYTES[policy.param_dtype]
        dp = self.cards // self.tp
        if dp > 1:
            order = sorted(step.grads, key=lambda p: grad_ready[p])
            cap = self.bucket_mb * 2 ** 20
            groups: list[list[str]] = [[]]
            size = 0.0
            for p in order:
                b = params[p].numel() // shard[p] * grad_bytes
                if groups[-1] and size + b > cap:
                    groups.append([])
                    size = 0.0
                groups[-1].append(p)
                size += b
            free_at = 0.0
            for i, g in enumerate(groups):
                nb = sum(params[p].numel() // shard[p] for p in g) * grad_bytes
                ready = max(grad_ready[p] for p in g)
                # every data-parallel group all-reduces its shard at once: the traffic of all cards
                c = self.collective_us("allreduce", nb, self.cards)
                start = max(ready, free_at)
                buckets.append(BucketComm(i, nb, ready, start, c))
                free_at = start + c
        comm_us = sum(b.time_us for b in buckets)
        exposed_us = max(0.0, (buckets[-1].end_us if buckets else 0.0) - backward_end)

        stream.wait(backward_end + exposed_us)
        opt_start = stream.now_us
        for lab, spec in opt_specs:
            place(lab, "optimizer", spec, cost(spec, chip))
        opt_us = stream.now_us - opt_start
        micro_us = forward_us + backward_us
        step_us = self.grad_accum * micro_us + exposed_us + opt_us

        if self.fuse_vector:
            notes.append(f"Vector fusion: {fused_count[1]} element-wise and row ops run as {fused_count[0]} fused "
                         "kernels (RMSNorm, SwiGLU, rotary embedding and the like, forward and backward)")
        if self.scores:
            notes.append("attention runs as fused FlashAttention kernels (the s x s scores stay on chip; the "
                         "backward recomputes them)")
        if ckpt is not None:
            notes.append(f"gradient checkpointing of {n_blocks} blocks: activations {ckpt[0] / 2 ** 20:,.0f} -> "
                         f"{ckpt[1] / 2 ** 20:,.0f} MiB for {recompute_us / 1e3:.2f} ms of recomputed forward per "
                         "micro-batch")
        if self.tp > 1:
            notes.append(f"tensor parallelism over {self.tp} cards"
                         f"{' with sequence parallelism' if self.sequence_parallel else ''}: {n_blocks} blocks split "
                         "Megatron style, "
                         f"{4 * n_blocks} all-reduces of the hidden state ({tp_comm_us / 1e3:.2f} ms on the critical "
                         "path" + (", the rest hidden under their matmuls by MC2" if self.mc2 else "") + ")")
        if unmapped:
            notes.append("ops not in the lowering table, run on the host CPU with their inputs and outputs "
                         "copied over PCIe (pypto_lab.lowering.table's fallback): "
                         + ", ".join(f"{k} x{v}" for k, v in sorted(unmapped.items())))
        if buckets:
            notes.append(f"{len(buckets)} gradient buckets all-reduced during the backward over "
                         f"{self.topology.name}; {exposed_us / 1e3:.2f} ms left after it")
        return TrainReport(
            model=self.name, chip=chip.name, cards=self.cards, batch=step.batch, grad_accum=self.grad_accum,
            precision=self.precision, amp=policy.amp, optimizer=self.optimizer, bucket_mb=self.bucket_mb,
            checkpoint=self.checkpoint, forward_ms=forward_us / 1e3, backward_ms=backward_us / 1e3,
            recompute_ms=recompute_us / 1e3, optimizer_ms=opt_us / 1e3, comm_ms=comm_us / 1e3,
            exposed_comm_ms=exposed_us / 1e3, step_ms=step_us / 1e3, tokens_per_sample=step.tokens,
            peak_hbm_bytes=peak, hbm_bytes=int(chip.hbm_bytes), memory=memory, largest_batch=largest,
            tp=self.tp, tp_comm_ms=tp_comm_us / 1e3, topology=self.topology.name if self.topology else "",
            fuse_vector=self.fuse_vector, mc2=self.mc2, stack=self.stack.name,
            host_idle_ms=stream.timeline().idle_us / 1e3 * self.grad_accum,
            kernels=kernels, buckets=buckets, unmapped_ops=unmapped,
            notes=notes)
