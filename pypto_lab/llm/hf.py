"""Hugging Face causal LMs on the workbench: built from a config, and their prefill and decode
step (with a KV cache) captured once for every length.

* `build_causal_lm(config_or_name_or_path, device="meta")`: the transformers model of a config
  (a `PretrainedConfig`, a dict with ``model_type``, the path of a ``config.json``, or a name of
  `KNOWN_CONFIGS`), by default on the meta device: shapes without weight memory, so a 7B config
  costs on a small machine. `capture` / `optimize` cost such a model; running it raises (no weights).
* `capture_decode_step(model, batch, context)`: a `DecodeStep` wrapper whose inputs are
  ``input_ids [B, 1]``, ``position_ids [B, 1]`` and the past keys and values as tensors, one
  ``(k, v)`` pair per layer of shape ``[B, kv_heads, ctx, head_dim]``; it builds the transformers
  `DynamicCache` inside and returns ``(logits [B, 1, vocab], ((k, v), ...))``: the cache after the
  step, ``ctx + 1`` long, ready to feed back. It is exported once with ``ctx`` a
  `torch.export.Dim`; `capture` / `optimize` of the wrapper at any context specialise that one
  program (`pypto_lab.capture.dynamic`) instead of exporting again.
* `capture_prefill(model, batch, prompt_len)`: likewise a `Prefill` wrapper, ``input_ids [B, S]``
  and ``position_ids [B, S]`` in, ``(logits, ((k, v), ...))`` out, the sequence length dynamic.

`report_model(spec, batch, seq)` is what the command line's ``hf:NAME`` / ``hf:path/config.json``
builds. The inputs carry no attention mask: every sequence of a batch has the same length.

Where torch.export cannot make the length dynamic for a model, the capture says so
(``StepCapture.dynamic`` False, ``StepCapture.note`` the reason) and every length is exported on
its own, memoised per length by `capture`'s cache.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from ..capture import Graph, capture, export_dynamic
from ..capture.export import CaptureError
from ..capture.hf_models import main_output
from .configs import KNOWN_MODELS
from .validation import check_config

# The known models' published configs (their config.json fields; sources in `configs.KNOWN_MODELS`).
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    name: {k: v for k, v in cfg.items() if not k.startswith("_")} for name, cfg in KNOWN_MODELS.items()}


class HFModelError(ValueError):
    """A config or model the Hugging Face helpers cannot use: the message names the rule, the
    value and the fix."""


# ---- configs and models ---------------------------------------------------------------------------

def load_config(config_or_name_or_path) -> Any:
    """A transformers `PretrainedConfig` from a config, a dict (with ``model_type``), a path to a
    ``config.json`` (or to the folder holding it), or a name of `KNOWN_CONFIGS`."""
    from transformers import AutoConfig, PretrainedConfig

    spec = config_or_name_or_path
    if isinstance(spec, PretrainedConfig):
        return spec
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and spec not in KNOWN_CONFIGS):
        path = os.fspath(spec)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            if isinstance(spec, str) and not (os.sep in spec or spec.endswith(".json")):
                raise HFModelError(f"unknown model name {spec!r}: a name must be one of {', '.join(KNOWN_CONFIGS)}; "
                                   "or pass a PretrainedConfig, a dict with model_type, or the path of a config.json")
            raise HFModelError(f"config path {path!r} does not exist (a config.json, or a folder holding one, is "
                               "needed); give the path of an existing config.json, or a dict / PretrainedConfig")
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    elif isinstance(spec, str):
        spec = KNOWN_CONFIGS[spec]
    if not isinstance(spec, dict):
        raise HFModelError(f"cannot make a config of a {type(spec).__name__}; pass a PretrainedConfig, a dict with "
                           f"model_type, the path of a config.json, or one of {', '.join(KNOWN_CONFIGS)}")
    fields = dict(spec)
    kind = fields.pop("model_type", None)
    if not kind:
        raise HFModelError(f"the config has no model_type (keys: {', '.join(sorted(fields)) or 'none'}); transformers "
                           "picks the model class from it: add e.g. \"model_type\": \"llama\"")
    try:
        return AutoConfig.for_model(kind, **fields)
    except ValueError as exc:
        raise HFModelError(f"model_type {kind!r} is not known to transformers ({exc}); use a model type it ships, "
                           "e.g. llama, qwen2, gpt2") from exc


def build_causal_lm(config_or_name_or_path, device: str | torch.device = "meta",
                    dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The transformers causal LM of a config (see `load_config`), in eval mode, its weights on
    ``device``: "meta" (the default) allocates no weight memory (shapes for costing only, nothing
    to run); "cpu" gives random weights that run."""
    from transformers import AutoModelForCausalLM

    config = load_config(config_or_name_or_path)
    check_config(config.to_dict(), where=str(getattr(config, "_name_or_path", "") or config.model_type))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ValueError as exc:
        raise HFModelError(f"transformers has no causal LM for model_type {config.model_type!r} ({exc}); "
                           "build a decoder-only model type (gpt2, llama, qwen2, qwen3, mixtral, ...)") from exc
    return model.eval()


# ---- the wrappers torch.export exports --------------------------------------------------------------

def _cache_keyword(model: torch.nn.Module) -> str:
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _layers(cache) -> tuple:
    """The per-layer (keys, values) a transformers cache holds."""
    return tuple((layer.keys, layer.values) for layer in cache.layers)


def _output_cache(out):
    """The cache of a model output: ``cache`` in transformers 5 (``past_key_values`` before)."""
    keys = out.keys() if hasattr(out, "keys") else ()
    return out["cache"] if "cache" in keys else out.past_key_values


class DecodeStep(torch.nn.Module):
    """One decode step of a transformers causal LM with its KV cache as explicit tensors:
    ``forward(input_ids [B, 1], position_ids [B, 1], past)`` with ``past`` one ``(k, v)`` per
    layer, ``[B, kv_heads, ctx, head_dim]``; returns ``(logits, new_past)``, ``new_past`` ctx + 1 long."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, past: tuple):
        from transformers.cache_utils import DynamicCache, DynamicLayer

        cache = DynamicCache(config=self.model.config)
        for i, (k, v) in enumerate(past):
            layer = cache.layers[i] if i < len(cache.layers) else None
            if type(layer) is DynamicLayer:  # hold the past as it is (no concatenation onto an empty tensor)
                layer.keys, layer.values, layer.device, layer.is_initialized = k, v, k.device, True
            else:
                cache.update(k, v, i)
        out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=True,
                         **{_cache_keyword(self.model): cache})
        return main_output(out, type(self.model).__name__), _layers(_output_cache(out))


class Prefill(torch.nn.Module):
    """The prompt of a transformers causal LM: ``forward(input_ids [B, S], position_ids [B, S])``
    returns ``(logits [B, S, vocab], past)``, ``past`` one ``(k, v)`` per layer, S long."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor):
        out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=True)
        return main_output(out, type(self.model).__name__), _layers(_output_cache(out))


# ---- captures ---------------------------------------------------------------------------------------

def kv_layout(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a config's KV cache."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def max_positions(config) -> int:
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048))


@dataclass
class StepCapture:
    """A prefill or decode wrapper (``module``) and how it was exported: ``dynamic`` (one program
    for every length, ``length_range`` inclusive) or not (``note`` says why; each length is
    exported on its own, memoised), ``seconds`` the export's wall time. `inputs(length)` makes
    example inputs; `graph(length)` the captured Graph at that length (`capture` of the wrapper),
    and `optimize(capture.module, capture.inputs(length), ...)` costs and runs it."""

    module: torch.nn.Module
    kind: str                 # "decode" | "prefill"
    batch: int
    length: int               # the context (decode) or prompt length (prefill) exported at
    length_range: tuple[int, int]
    dynamic: bool
    seconds: float
    note: str = ""

    def inputs(self, length: int | None = None, seed: int = 0) -> tuple:
        """Example inputs at ``length`` (default: the exported one): random token ids, positions
        continuing the context, random past keys/values (decode), on the model's device."""
        length = self.length if length is None else length
        lo, hi = self.length_range
        if not (isinstance(length, int) and lo <= length <= hi):
            what = "context" if self.kind == "decode" else "prompt length"
            raise HFModelError(f"{what} {length!r} is outside {lo}..{hi} (the model's max_position_embeddings "
                               f"bounds it); give a {what} in {lo}..{hi}")
        model = self.module.model
        config = model.config
        device = next(model.parameters()).device
        gen = torch.Generator().manual_seed(seed)
        if self.kind == "prefill":
            ids = torch.randint(0, config.vocab_size, (self.batch, length), generator=gen).to(device)
            return ids, torch.arange(length).expand(self.batch, length).to(device)
        layers, kv_heads, head_dim = kv_layout(config)
        dtype = next(model.parameters()).dtype
        ids = torch.randint(0, config.vocab_size, (self.batch, 1), generator=gen).to(device)
        pos = torch.full((self.batch, 1), length, dtype=torch.long, device=device)
        past = tuple(tuple(torch.randn(self.batch, kv_heads, length, head_dim, generator=gen).to(dtype).to(device)
                           for _ in range(2)) for _ in range(layers))
        return ids, pos, past

    def graph(self, length: int | None = None) -> Graph:
        return capture(self.module, self.inputs(length))


def _check_model(model, what: str) -> None:
    from ..capture.hf_models import is_causal_lm

    if not isinstance(model, torch.nn.Module) or not is_causal_lm(model):
        raise HFModelError(f"{what} needs a transformers decoder-only model (GPT2Model, LlamaForCausalLM, ...), got "
                           f"{type(model).__name__}; build one with pypto_lab.llm.hf.build_causal_lm(config)")


def _check_size(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise HFModelError(f"{name} = {value!r}: must be an integer in {lo}..{hi}; e.g. {name}={min(max(lo, 16), hi)}")


def _export(step: StepCapture, dynamic_shapes) -> StepCapture:
    """Export ``step.module`` once with ``dynamic_shapes``; where torch.export cannot, say so and
    leave the per-length capture to `capture` (memoised per length)."""
    example = step.inputs(max(step.length, 2))  # a dynamic size must not be 1 in the example (0/1 specialisation)
    try:
        program = export_dynamic(step.module, example, dynamic_shapes)
    except CaptureError as exc:
        step.dynamic = False
        step.note = (f"torch.export could not make the {step.kind} length dynamic ({exc}); each length is "
                     "captured on its own and memoised")
        return step
    step.dynamic = True
    step.seconds = program.seconds
    return step


def capture_decode_step(model: torch.nn.Module, batch: int = 1, context: int = 128,
                        max_context: int | None = None) -> StepCapture:
    """Export ``model``'s decode step (a `DecodeStep`) once, the context length a
    `torch.export.Dim` in 1..``max_context`` (default: max_position_embeddings - 1)."""
    _check_model(model, "capture_decode_step")
    top = max_positions(model.config) - 1 if max_context is None else max_context
    _check_size("max_context", top, 2, max_positions(model.config) - 1)
    _check_size("batch", batch, 1, 1 << 16)
    _check_size("context", context, 1, top)
    step = StepCapture(DecodeStep(model), "decode", batch, context, (1, top), False, 0.0)
    ctx = torch.export.Dim("context", min=1, max=top)
    layers = kv_layout(model.config)[0]
    return _export(step, {"input_ids": None, "position_ids": None,
                          "past": tuple(({2: ctx}, {2: ctx}) for _ in range(layers))})


def capture_prefill(model: torch.nn.Module, batch: int = 1, prompt_len: int = 128,
                    max_len: int | None = None) -> StepCapture:
    """Export ``model``'s prefill (a `Prefill`) once, the prompt length a `torch.export.Dim` in
    2..``max_len`` (default: max_position_embeddings)."""
    _check_model(model, "capture_prefill")
    top = max_positions(model.config) if max_len is None else max_len
    _check_size("max_len", top, 2, max_positions(model.config))
    _check_size("batch", batch, 1, 1 << 16)
    _check_size("prompt_len", prompt_len, 2, top)
    step = StepCapture(Prefill(model), "prefill", batch, prompt_len, (2, top), False, 0.0)
    seq = torch.export.Dim("prompt", min=2, max=top)
    return _export(step, {"input_ids": {1: seq}, "position_ids": {1: seq}})


def report_model(spec: str, batch: int = 1, seq: int | None = None, device: str = "meta"):
    """``(model, (input_ids,))`` for the command line's ``hf:NAME`` / ``hf:path/config.json``: the
    model built by `build_causal_lm` (on meta: shapes only) and token ids ``[batch, seq]``
    (default seq 128)."""
    model = build_causal_lm(spec, device=device)
    seq = 128 if seq is None else seq
    if seq > max_positions(model.config):
        raise HFModelError(f"seq = {seq} exceeds the model's {max_positions(model.config)} positions; "
                           f"pass --seq {max_positions(model.config)} or less")
    ids = torch.zeros((batch, seq), dtype=torch.long, device=device)
    return model, (ids,)


__all__ = ["KNOWN_CONFIGS", "DecodeStep", "HFModelError", "Prefill", "StepCapture", "build_causal_lm",
           "capture_decode_step", "capture_prefill", "kv_layout", "load_config", "max_positions", "report_model"]
