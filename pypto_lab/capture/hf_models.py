"""Hugging Face causal language models as they come: what `capture` exports in their place.

A transformers decoder-only model (GPT2Model, GPT2LMHeadModel, LlamaForCausalLM, Qwen2/Qwen3,
the Qwen MoE models, Mixtral, ...) returns a `DynamicCache` when called as it comes (its config
says ``use_cache=True``), and `torch.export` refuses a cache object among the outputs. `adapt`
makes a shallow copy of such a model (same submodules and parameters, under the same names, so
the runtime reads the live weights) whose ``forward(input_ids)`` calls the model's own forward
with ``use_cache=False`` and returns its logits (``...ForCausalLM``) or its last hidden state
(a bare ``...Model``). Encoder models (BERT and kin) are left as they are.
"""

from __future__ import annotations

import copy
import inspect
import types

import torch

HF_FIX = ("pypto_lab calls a transformers causal LM as model(input_ids, use_cache=False) and keeps its logits "
          "(or last_hidden_state); to capture a decode step with a KV cache use "
          "pypto_lab.llm.hf.capture_decode_step(model, batch, context); if a layer of the model does not "
          "export, build it with attn_implementation='sdpa' or 'eager', or capture a sub-module")


def is_hf_model(model: torch.nn.Module) -> bool:
    """A transformers `PreTrainedModel` (checked without importing transformers when it is not loaded)."""
    return any(c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
               for c in type(model).__mro__)


def is_causal_lm(model: torch.nn.Module) -> bool:
    """A transformers decoder-only model: its config's model type has a causal-LM head and no
    masked-LM head (GPT-2, Llama, Qwen, Mixtral; not BERT), and its forward takes ``use_cache``."""
    if not is_hf_model(model):
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", "")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return False
    return "use_cache" in inspect.signature(type(model).forward).parameters


def main_output(out, model_name: str) -> torch.Tensor:
    """The logits of a causal LM's output, or the last hidden state of a bare decoder."""
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"{model_name} returned {type(out).__name__} with neither logits nor last_hidden_state; "
                    f"{HF_FIX}")


def adapt(model: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy of ``model`` whose ``forward(input_ids)`` is the model's forward with
    ``use_cache=False``, returning one tensor (logits or last hidden state)."""
    cls = type(model)
    adapter = copy.copy(model)  # shares _parameters, _buffers, _modules: same weights, same names

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return main_output(cls.forward(self, input_ids, use_cache=False), cls.__name__)

    adapter.forward = types.MethodType(forward, adapter)
    return adapter


__all__ = ["HF_FIX", "adapt", "is_causal_lm", "is_hf_model", "main_output"]
