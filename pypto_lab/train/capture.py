"""Capture one training step as one graph: forward, loss and backward (AOT autograd's joint graph).

`capture_step(model, example_batch, loss_fn)` traces ``loss = loss_fn(model(*inputs), target)``
(or ``model(**batch).loss`` for a dict batch, as transformers models return it) with
``torch._functorch.aot_autograd.aot_export_module(..., trace_joint=True)``: one ATen graph whose
forward nodes compute the loss and whose backward nodes (everything downstream of the loss's
``ones_like`` seed) compute a gradient for every parameter. Shapes come from fake tensors, so a
model on the meta device (a transformers config built with no weights) captures too; a mixture of
experts' grouped matmuls are captured as transformers' fallback custom op (`pypto_lab.train.moe`).

`StepGraph` splits the nodes into forward and backward, resolves views to the tensor they alias,
names the activations the backward reads (what the forward must keep alive), and maps every
gradient output to its parameter. The optimizer update is not in the graph: `pypto_lab.train.step`
adds its kernels.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .moe import grouped_mm_fallback

# ATen ops that create no data: their output aliases their first input (or is a tiny constant)
ALIASES = {
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.t.default",
    "aten.alias.default", "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.slice.Tensor", "aten.select.int", "aten.detach.default",
    "aten.as_strided.default", "aten.permute.default", "aten.transpose.int", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten.lift_fresh_copy.default",
}


# the keys under which transformers models take their targets (and then return .loss)
LABEL_KEYS = {"labels", "start_positions", "end_positions", "next_sentence_label"}


class TrainCaptureError(ValueError):
    """A model or batch the training capture cannot trace; the message names the rule and a fix."""


@dataclass
class StepGraph:
    """A captured training step: the joint graph and what each of its nodes is."""

    gm: torch.fx.GraphModule
    params: dict[str, torch.fx.Node]               # parameter name -> its placeholder
    grads: dict[str, torch.fx.Node]                # parameter name -> the node that outputs its gradient
    user_inputs: list[torch.fx.Node]
    forward: list[torch.fx.Node]                   # compute nodes of the forward and the loss, in order
    backward: list[torch.fx.Node]                  # compute nodes of the backward, in order
    base: dict[torch.fx.Node, torch.fx.Node] = field(default_factory=dict)   # view -> the tensor it aliases
    batch: int = 1
    tokens: int | None = None                      # tokens per sample for token-id inputs
    notes: list[str] = field(default_factory=list)
    signature: Any = None                          # AOT autograd's GraphSignature (input and output roles)
    fake_quant: list = field(default_factory=list)  # QAT layers (FakeQuantLayer), costed by the step
    host_syncs: int = 0                            # values the forward reads back to the host (`scalar_reads`)

    def saved(self) -> list[torch.fx.Node]:
        """The forward's tensors the backward reads (after resolving views): what stays alive from
        the forward to the backward. Parameters and the batch itself are not counted."""
        fwd = set(self.forward)
        back = set(self.backward)
        keep: dict[torch.fx.Node, None] = {}
        for node in self.backward:
            for arg in node.all_input_nodes:
                b = self.base.get(arg, arg)
                if b in fwd and b not in back:
                    keep[b] = None
        return list(keep)


def tensor_of(node: torch.fx.Node) -> torch.Tensor | None:
    """The fake tensor a node produces (None for tuples and non-tensors)."""
    v = node.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def nbytes(node: torch.fx.Node) -> int:
    t = tensor_of(node)
    return 0 if t is None else t.numel() * t.element_size()


class _WithLoss(nn.Module):
    """``model`` and its loss as one module whose first output is the loss."""

    def __init__(self, model: nn.Module, loss_fn, n_inputs: int, keys: tuple[str, ...] | None,
                 constants: dict[str, Any] | None = None):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.n_inputs = n_inputs
        self.keys = keys
        self.constants = dict(constants or {})

    def forward(self, *args):
        if self.keys is not None:
            out = self.model(**dict(zip(self.keys, args)), **self.constants)
            loss = out["loss"] if isinstance(out, dict) else out.loss
        else:
            out = self.model(*args[: self.n_inputs])
            if isinstance(out, (tuple, list)):
                out = out[0]
            elif hasattr(out, "logits"):
                out = out.logits
            loss = self.loss_fn(out, args[self.n_inputs])
        return (loss,)


# a dict batch's non-tensor values passed to the model as they are (not traced): flags such as CLIP's
# return_loss=True, and plain numbers
_CONSTANT_TYPES = (bool, int, float, str, type(None))


def _flatten_batch(example_batch, loss_fn) -> tuple[tuple[torch.Tensor, ...], int, tuple[str, ...] | None,
                                                    dict[str, Any]]:
    if isinstance(example_batch, dict):
        tensors = {k: v for k, v in example_batch.items() if isinstance(v, torch.Tensor)}
        constants = {k: v for k, v in example_batch.items() if not isinstance(v, torch.Tensor)}
        bad = [k for k, v in constants.items() if not isinstance(v, _CONSTANT_TYPES)]
        if bad:
            raise TrainCaptureError(f"example_batch[{bad[0]!r}] is {type(example_batch[bad[0]]).__name__}: a dict "
                                    "batch holds tensors, and flags or numbers the model takes as they are. Fix: "
                                    "pass tensors (input_ids, attention_mask, labels) and plain flags")
        keys = tuple(tensors)
        if not keys:
            raise TrainCaptureError("example_batch has no tensor. Fix: pass input_ids (and labels)")
        # a contrastive model (CLIP) computes its loss from the batch itself when asked: return_loss=True
        if not set(keys) & LABEL_KEYS and constants.get("return_loss") is not True:
            raise TrainCaptureError(f"dict batch with keys {list(example_batch)}: the model must return .loss, so "
                                    f"the batch needs its targets ({', '.join(sorted(LABEL_KEYS))}), or "
                                    "return_loss=True for a model whose loss needs none (CLIP's contrastive loss). "
                                    "Fix: add labels (for a causal LM, labels = input_ids)")
        return tuple(tensors.values()), len(keys), keys, constants
    if not isinstance(example_batch, (tuple, list)) or len(example_batch) < 2:
        raise TrainCaptureError(f"example_batch of type {type(example_batch).__name__}: a tuple batch is "
                                "(inputs..., target) with a loss_fn, or a dict whose model output has .loss. Fix: "
                                "pass (images, labels) and loss_fn=torch.nn.functional.cross_entropy")
    if loss_fn is None:
        raise TrainCaptureError("a tuple batch (inputs..., target) needs loss_fn. Fix: pass e.g. "
                                "loss_fn=torch.nn.functional.cross_entropy, or a dict batch with labels")
    if not all(isinstance(t, torch.Tensor) for t in example_batch):
        raise TrainCaptureError("every element of example_batch must be a tensor. Fix: (inputs..., target) tensors")
    return tuple(example_batch), len(example_batch) - 1, None, {}


class _Reads(list):
    """The scalar reads of a trace, and how many times the traced model's forward ran in it (AOT
    autograd runs it more than once: its metadata pass, the joint trace)."""

    runs = 0

    def per_forward(self) -> int:
        return round(len(self) / self.runs) if self.runs else len(self)

    @contextlib.contextmanager
    def counting(self, model: nn.Module):
        def hook(mod, args):
            self.runs += 1
        handle = model.register_forward_pre_hook(hook)
        try:
            yield self
        finally:
            handle.remove()


@contextlib.contextmanager
def scalar_reads():
    """While a step is traced on fake tensors, a value the forward reads back from a tensor
    (``.item()``, ``bool(t)``, ``if (mask == 0).any():``: ATen's ``_local_scalar_dense``) has no data
    to read: it is taken as 1 (True) and counted. transformers' mask builders read whether any token
    is padded (``masking_utils``: ``padding_mask.all()``); an example batch has no padding, so True is
    the value the real read gives. On the NPU every such read is a device-to-host copy that waits for
    the queued kernels (a host sync), and `pypto_lab.train.compose` costs it so. Yields a list whose
    length is the number of reads."""
    from torch._subclasses import fake_impls

    ops = [torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default]
    saved = {op: fake_impls.op_implementations_dict.get(op) for op in ops}
    reads = _Reads()

    def read(fake_mode, func, arg):
        reads.append(str(arg.dtype))
        if arg.dtype == torch.bool:
            return True
        return 1.0 if arg.dtype.is_floating_point else 1

    for op in ops:
        fake_impls.op_implementations_dict[op] = read
    try:
        yield reads
    finally:
        for op, impl in saved.items():
            if impl is None:
                fake_impls.op_implementations_dict.pop(op, None)
            else:
                fake_impls.op_implementations_dict[op] = impl


@dataclass(frozen=True)
class FakeQuantLayer:
    """A QAT layer (`pypto_lab.quantization.prepare_qat`) whose fake quantisation the step costs:
    its input and weight element counts."""

    name: str
    input_numel: int
    weight_numel: int


@contextlib.contextmanager
def _untied(model: nn.Module):
    """Tied parameters (BERT's and GPT-2's input embedding and output projection: one Parameter
    under two names) registered apart for the trace: AOT autograd passes each name as its own
    input and refuses the one the forward never reads ("Found a parameter that did not receive a
    gradient", pytorch#101192). The second name gets a Parameter on the same storage, so the joint
    graph computes both uses' gradients, as the real backward does before summing them. Yields the
    list of (second name, first name); the model is restored afterwards."""
    first: dict[int, str] = {}
    undo: list[tuple[nn.Module, str, nn.Parameter]] = []
    aliases: list[tuple[str, str]] = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in first:
            first[id(p)] = name
            continue
        owner, _, attr = name.rpartition(".")
        mod = model.get_submodule(owner)
        undo.append((mod, attr, p))
        mod._parameters[attr] = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
        aliases.append((name, first[id(p)]))
    try:
        yield aliases
    finally:
        for mod, attr, p in undo:
            mod._parameters[attr] = p


@contextlib.contextmanager
def _frozen_unread(wrapped: nn.Module, args, aliases: list[tuple[str, str]]):
    """With tied parameters registered apart, the forward may read only one of the names (BERT's
    decoder reads ``decoder.bias``, never ``predictions.bias``): a forward-only trace finds the
    names nothing reads, and they are frozen for the joint trace (restored afterwards)."""
    from torch._functorch.aot_autograd import aot_export_module

    frozen: list[nn.Parameter] = []
    if aliases:
        gm, sig = aot_export_module(wrapped, args, trace_joint=False)
        named = dict(wrapped.named_parameters(remove_duplicate=False))
        for node in gm.graph.nodes:
            name = sig.inputs_to_parameters.get(node.name) if node.op == "placeholder" else None
            if name is not None and not node.users and named[name].requires_grad:
                named[name].requires_grad_(False)
                frozen.append(named[name])
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _drop_aliases(step: StepGraph, aliases: list[tuple[str, str]], notes: list[str]) -> StepGraph:
    """One parameter per tied group in the step's parameters and gradients (the weights, their
    gradient buffer and optimizer state exist once); the second use's gradient stays in the graph."""
    for second, kept in aliases:
        step.params.pop(second, None)
        grad = step.grads.pop(second, None)
        if kept not in step.grads and grad is not None:   # only the second name was read
            step.grads[kept] = grad
    if aliases:
        notes.append("tied parameters counted once: " + ", ".join(f"{a} = {b}" for a, b in aliases))
    return step


@contextlib.contextmanager
def _without_fake_quant(model: nn.Module):
    """Swap every fake-quantising `ObservedModule` for its float layer while the step is traced
    (their observers branch on Python state the tracer cannot follow) and record the shapes the
    fake quantisation would see; yields the list it fills."""
    from ..precision.quantization import ObservedModule

    found: list[FakeQuantLayer] = []
    swaps, hooks = [], []
    for parent_name, parent in model.named_modules():
        for child_name, child in list(parent.named_children()):
            if isinstance(child, ObservedModule) and child.fake_quant:
                full = f"{parent_name}.{child_name}" if parent_name else child_name
                swaps.append((parent, child_name, child))
                setattr(parent, child_name, child.layer)

                def hook(mod, args, _out, full=full):
                    found.append(FakeQuantLayer(full, int(args[0].numel()), int(mod.weight.numel())))
                hooks.append(child.layer.register_forward_hook(hook))
    try:
        yield found
    finally:
        for h in hooks:
            h.remove()
        for parent, child_name, child in swaps:
            setattr(parent, child_name, child)


def _fake(args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The batch as fake tensors (shapes and dtypes, no data): given real tensors, AOT autograd
    would run the real forward and backward to learn the shapes (BERT-large at batch 32 x 384
    tokens: minutes and tens of GB); given fake ones it traces in a second. Parameters stay real
    and are read as fake by the same mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if any(a.is_meta for a in args):
        return args
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return tuple(mode.from_tensor(a) for a in args)


class _Where:
    """Which module the trace was inside when it failed: the innermost one entered and not left."""

    def __init__(self, model: nn.Module):
        self.names = {id(m): n for n, m in model.named_modules()}
        self.stack: list[tuple[nn.Module, tuple]] = []

    def describe(self) -> str:
        if not self.stack:
            return ""
        mod, args = self.stack[-1]
        shapes = ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor)) or "no tensors"
        expects = ""
        for attr in ("in_features", "in_channels", "normalized_shape", "num_embeddings", "embed_dim"):
            if hasattr(mod, attr):
                expects = f", which expects {attr} = {getattr(mod, attr)}"
                break
        return (f"; it failed inside module {self.names.get(id(mod)) or type(mod).__name__!r} "
                f"({type(mod).__name__}{expects}), called with inputs of shape {shapes}")


@contextlib.contextmanager
def _located(model: nn.Module):
    """While the step is traced: torch's fake-tensor log of a failing op (some twenty lines of
    traceback, on stderr before the error is even raised) is held back, and the module the trace
    was in is tracked, so a batch the model cannot take is reported in one message naming it."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    where = _Where(model)

    def enter(mod, args):
        if id(mod) in where.names:
            where.stack.append((mod, args))

    def leave(mod, args, out):
        if where.stack and where.stack[-1][0] is mod:
            where.stack.pop()

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    hooks = (register_module_forward_pre_hook(enter), register_module_forward_hook(leave))
    try:
        yield where
    finally:
        for h in hooks:
            h.remove()
        log.setLevel(level)


def _shape_error(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, (RuntimeError, ValueError, IndexError)) and any(
        w in text for w in ("shape", "size", "dimension", "dim ", "reduction dim", "mat1 and mat2", "expected input"))


def capture_step(model: nn.Module, example_batch, loss_fn=None) -> StepGraph:
    """The joint forward + loss + backward graph of ``model`` on ``example_batch``."""
    from torch._functorch.aot_autograd import aot_export_module

    if not isinstance(model, nn.Module):
        raise TrainCaptureError(f"model of type {type(model).__name__}: simulate_step takes an nn.Module, a "
                                "DistributedDataParallel wrapper or a transformers config. Fix: pass the module")
    notes = []
    if isinstance(example_batch, dict) and "attention_mask" in example_batch:
        # transformers' mask builder branches on the mask's values (is any token padded?), which no
        # tracer of static graphs follows; the mask adds one element-wise op on the scores
        example_batch = {k: v for k, v in example_batch.items() if k != "attention_mask"}
        notes.append("attention_mask left out of the trace (transformers branches on its values); its add on "
                     "the attention scores is not costed")
    args, n_inputs, keys, constants = _flatten_batch(example_batch, loss_fn)
    if not any(p.requires_grad for p in model.parameters()):
        raise TrainCaptureError("the model has no parameter with requires_grad=True: nothing to train. Fix: "
                                "unfreeze some parameters (p.requires_grad_(True))")
    wrapped = _WithLoss(model, loss_fn, n_inputs, keys, constants)
    was_training = model.training
    model.train()
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    if use_cache:   # a training step keeps no KV cache (transformers would build one on the side)
        config.use_cache = False
    try:
        with _located(model) as where, _without_fake_quant(model) as fake_quant, _untied(wrapped) as aliases:
            fake_args = _fake(args)
            with grouped_mm_fallback(), scalar_reads() as reads, reads.counting(model), \
                    _frozen_unread(wrapped, fake_args, aliases):
                gm, sig = aot_export_module(wrapped, fake_args, trace_joint=True, output_loss_index=0)
    except Exception as e:   # noqa: BLE001  (report what the tracer refused, with the rule)
        meta = any(p.is_meta for p in model.parameters())
        first = str(e).strip().splitlines()[0][:300].rstrip(".") if str(e).strip() else ""
        if where.stack and _shape_error(e):
            shapes = ", ".join(f"{tuple(a.shape)}" for a in args[:n_inputs])
            raise TrainCaptureError(f"the model cannot take this batch: {type(e).__name__}: {first}"
                                    f"{where.describe()}. Rule: example_batch is what model(*inputs) takes, "
                                    f"(inputs..., target); its inputs here have shapes {shapes}. Fix: give inputs "
                                    "of the shape that module expects (or check the order of inputs and "
                                    "target)") from None
        raise TrainCaptureError(f"AOT autograd could not trace the training step: {type(e).__name__}: "
                                f"{first}. Rule: the model, its loss and its backward must "
                                "trace to ATen ops with static shapes. Fix: simplify the model's data-dependent "
                                "control flow, or pass a loss_fn that returns a scalar tensor"
                                + ("; on the meta device torch's nll_loss / mse_loss have no autograd kernel, so "
                                   "write the loss with log_softmax + gather (or build the model on the CPU)"
                                   if meta else "")) from e
    finally:
        model.train(was_training)
        if use_cache:
            config.use_cache = use_cache

    step = _drop_aliases(_step_graph(gm, sig, notes), aliases, notes)
    step.fake_quant = list({f.name: f for f in fake_quant}.values())
    _note_reads(step, reads)
    return step


def _note_reads(step: StepGraph, reads) -> None:
    """Record the forward's scalar reads (`scalar_reads`), per run of the forward."""
    n = reads.per_forward()
    if n:
        step.host_syncs = n
        step.notes.append(f"the forward reads {n} value(s) back from the device (.item(), bool(tensor): "
                          "ATen's _local_scalar_dense), each a host sync that drains the device's queue: costed "
                          "as a device-to-host copy the host waits for; the trace took each value as 1 (True)")


def _step_graph(gm, sig, notes: list[str]) -> StepGraph:
    """Split an AOT-exported joint graph into forward and backward, views and saved tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in gm.graph.nodes}
    params = {sig.inputs_to_parameters[n.name]: n for n in placeholders if n.name in sig.inputs_to_parameters}
    user_inputs = [by_name[n] for n in sig.user_inputs]
    grads = {p: by_name[g] for g, p in sig.backward_signature.gradients_to_parameters.items()}

    # the forward is what the loss depends on; everything else the joint graph computes serves the
    # backward (the gradient seed's descendants, and values such as sigmoid(x) that only a
    # gradient formula reads)
    loss = by_name[sig.user_outputs[0]]
    forward_set: set[torch.fx.Node] = set()
    todo = [loss]
    while todo:
        node = todo.pop()
        if node not in forward_set:
            forward_set.add(node)
            todo.extend(node.all_input_nodes)
    backward_set = {n for n in gm.graph.nodes if n.op == "call_function" and n not in forward_set}
    base: dict[torch.fx.Node, torch.fx.Node] = {}
    forward, backward = [], []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if str(node.target) in ALIASES and node.args and isinstance(node.args[0], torch.fx.Node):
            src = node.args[0]
            base[node] = base.get(src, src)
            continue
        (backward if node in backward_set else forward).append(node)

    first = tensor_of(user_inputs[0]) if user_inputs else None
    batch = int(first.shape[0]) if first is not None and first.dim() else 1
    tokens = int(first.shape[1]) if (first is not None and first.dim() == 2
                                      and not first.dtype.is_floating_point) else None
    return StepGraph(gm=gm, params=params, grads=grads, user_inputs=user_inputs, forward=forward,
                     backward=backward, base=base, batch=batch, tokens=tokens, notes=notes, signature=sig)


class _CausalLMLoss(nn.Module):
    """A causal LM's next-token loss from its logits: the log-softmax in fp32 and the label of
    each next position (what transformers' ForCausalLMLoss computes), with an explicit additive
    causal mask (so the mask builders have nothing to inspect)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, mask, labels):
        logits = self.model(input_ids=input_ids, attention_mask=mask).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        return (-logp.gather(-1, labels[:, 1:, None]).mean(),)


def trains_as_causal_lm(model: nn.Module) -> bool:
    """A transformers causal language model (``*ForCausalLM``, ``*LMHeadModel``): its forward takes
    ``input_ids`` and, given ``labels``, returns the next-token loss."""
    name = type(model).__name__
    return getattr(model, "config", None) is not None and (name.endswith("ForCausalLM") or name.endswith("LMHeadModel"))


def causal_lm_batch(model: nn.Module, example_batch) -> dict[str, torch.Tensor]:
    """A causal LM's batch as its ``forward`` takes it, as a dict with labels: an ``input_ids``
    tensor, a tuple bound to ``forward``'s parameters in order (``(input_ids, attention_mask)``),
    or a dict. Without ``labels`` the labels are the inputs (transformers shifts them by one
    position inside the model: ``labels=input_ids`` is the next-token loss)."""
    rule = ("a causal LM's training batch is what its forward takes: a (batch, sequence) tensor of token ids, a "
            "tuple (input_ids, attention_mask, ...) or a dict with 'input_ids' (and optionally 'labels')")
    if isinstance(example_batch, torch.Tensor):
        batch = {"input_ids": example_batch}
    elif isinstance(example_batch, (tuple, list)):
        names = [p.name for p in inspect.signature(model.forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not example_batch or len(example_batch) > len(names):
            raise TrainCaptureError(f"example_batch is a tuple of {len(example_batch)} values; {type(model).__name__}"
                                    f".forward takes {len(names)} positionally ({', '.join(names[:4])}, ...). Rule: "
                                    f"{rule}. Fix: pass input_ids alone, or (input_ids, attention_mask)")
        batch = dict(zip(names, example_batch))
    elif isinstance(example_batch, dict):
        batch = dict(example_batch)
    else:
        raise TrainCaptureError(f"example_batch of type {type(example_batch).__name__}. Rule: {rule}. Fix: "
                                "torch.randint(0, vocab_size, (batch, seq))")
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point:
        what = (f"a {tuple(ids.shape)} {ids.dtype} tensor" if isinstance(ids, torch.Tensor)
                else ("missing" if ids is None else type(ids).__name__))
        raise TrainCaptureError(f"input_ids is {what}. Rule: {rule}; the token ids are an integer (batch, sequence) "
                                "tensor. Fix: torch.randint(0, vocab_size, (batch, seq))")
    batch.setdefault("labels", ids)
    return batch


def capture_causal_lm(model: nn.Module, example_batch) -> StepGraph:
    """The training step of a transformers causal LM (typically built on the meta device from a
    config): ``example_batch`` is a dict with ``input_ids`` (and ``labels``, default the inputs)."""
    from torch._functorch.aot_autograd import aot_export_module

    if not isinstance(example_batch, dict) or not isinstance(example_batch.get("input_ids"), torch.Tensor):
        raise TrainCaptureError("a causal LM built from a config takes a dict batch with 'input_ids' (a "
                                "batch x sequence tensor of token ids). Fix: {'input_ids': ids, 'labels': ids}")
    ids = example_batch["input_ids"]
    labels = example_batch.get("labels", ids)
    if ids.dim() != 2 or ids.dtype.is_floating_point or labels.shape != ids.shape:
        raise TrainCaptureError(f"input_ids of shape {tuple(ids.shape)} and dtype {ids.dtype}, labels "
                                f"{tuple(labels.shape)}: token ids are an integer batch x sequence tensor and the "
                                "labels have its shape. Fix: torch.randint(0, vocab, (batch, seq))")
    device = next(model.parameters()).device
    b, s = ids.shape
    mask = torch.full((s, s), float("-inf")).triu(1)[None, None].expand(b, 1, s, s).contiguous()
    args = tuple(t.to(device) for t in (ids, mask, labels))
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    if use_cache:
        config.use_cache = False
    model.train()
    try:
        loss_module = _CausalLMLoss(model)
        with _untied(loss_module) as aliases:
            with grouped_mm_fallback(), scalar_reads() as reads, reads.counting(model), \
                    _frozen_unread(loss_module, args, aliases):
                gm, sig = aot_export_module(loss_module, args, trace_joint=True, output_loss_index=0)
    except Exception as e:   # noqa: BLE001
        raise TrainCaptureError(f"AOT autograd could not trace the causal LM's training step: {type(e).__name__}: "
                                f"{str(e).splitlines()[0][:300]}. Fix: check the config builds with "
                                "AutoModelForCausalLM.from_config") from e
    finally:
        if use_cache:
            config.use_cache = use_cache
    notes: list[str] = []
    step = _drop_aliases(_step_graph(gm, sig, notes), aliases, notes)
    _note_reads(step, reads)
    return step


class JointChains:
    """A step's joint graph as the Vector fusion mechanism sees it
    (`pypto_lab.lowering.fusion.ChainGraph`): a tensor is the node that makes it, a view is the
    tensor it aliases (`StepGraph.base`), and the graph's output node reads what the step returns
    (the gradients)."""

    def __init__(self, step: StepGraph):
        self.base = step.base
        self.consumers: dict[torch.fx.Node, set[torch.fx.Node]] = {}
        for n in step.gm.graph.nodes:
            if self.base.get(n, n) is not n:   # a view: its readers are counted against the base
                continue
            for a in n.all_input_nodes:
                self.consumers.setdefault(self.base.get(a, a), set()).add(n)

    def value(self, node: torch.fx.Node) -> torch.fx.Node:
        return node

    def reads(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        return {self.base.get(a, a) for a in node.all_input_nodes}

    def readers(self, value: torch.fx.Node) -> set[torch.fx.Node]:
        return self.consumers.get(value, set())

    def numel(self, value: torch.fx.Node) -> int:
        t = tensor_of(value)
        return 0 if t is None else int(t.numel())


def block_names(params: list[str]) -> dict[str, str | None]:
    """Each parameter's repeated block, the unit gradient checkpointing recomputes: a child ``C.i``
    of a container ``C`` (a ModuleList or Sequential: its children are numbered) that has at
    least two children holding two or more layers each (ResNet's ``layer3.0``..``layer3.5``,
    BERT's ``encoder.layer.0``..``11``); the outermost such container wins. The stem, the head and
    containers of single layers (ResNet's ``downsample``) belong to no block."""
    modules = {p.rsplit(".", 1)[0] for p in params if "." in p}
    kids: dict[str, dict[str, set[str]]] = {}   # container -> child index -> modules below it
    for mod in modules:
        parts = mod.split(".")
        for i, part in enumerate(parts):
            if part.isdigit() and i > 0:
                kids.setdefault(".".join(parts[:i]), {}).setdefault(part, set()).add(mod)
    qualified = {c for c, ch in kids.items() if sum(len(m) >= 2 for m in ch.values()) >= 2}
    out: dict[str, str | None] = {}
    for p in params:
        parts = p.split(".")
        out[p] = next((".".join(parts[: i + 1]) for i in range(1, len(parts))
                       if parts[i].isdigit() and ".".join(parts[:i]) in qualified), None)
    return out


def forward_blocks(step: StepGraph) -> dict[torch.fx.Node, str | None]:
    """Each forward node's block: the block of the last parameter the forward consumed up to it
    (the forward runs the blocks in order)."""
    blocks = block_names(list(step.params))
    owner = {node: blocks[name] for name, node in step.params.items()}
    out: dict[torch.fx.Node, str | None] = {}
    current: str | None = None
    for node in step.forward:
        blocks = [owner[b] for b in (step.base.get(a, a) for a in node.all_input_nodes) if b in owner]
        if blocks:
            current = blocks[-1]
        out[node] = current
    return out


def meta_value(node: torch.fx.Node, i: int) -> Any:
    """Argument ``i`` of a node (its fake tensor when it is a node)."""
    a = node.args[i] if i < len(node.args) else None
    return tensor_of(a) if isinstance(a, torch.fx.Node) else a
