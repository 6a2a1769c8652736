"""HBM per card for an LLM: weights, KV cache and activations against the chip's capacity, the
largest batch that fits, and the cards a model needs.

Weights are the architecture's parameters at the precision's bytes, divided over the tensor-
parallel cards (embeddings and LM head too, as vocabulary-parallel layers are) and, for MoE
experts, over the expert-parallel cards. The KV cache holds, per token, a key and a value of
``head_dim`` for each KV head a card keeps in each layer. Activations are the largest working set
of one forward pass: the residual stream plus the biggest kernel's inputs and outputs (`forward`).
Gated DeltaNet layers keep a fixed-size state per sequence instead (`state_bytes_per_sequence`,
counted with the KV cache). Only ``hbm_utilization`` of the HBM is the engine's (vLLM's
``gpu_memory_utilization``, default 0.9): the rest is the runtime's and the collectives' workspace.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.cost import CostedKernel
from .configs import LLMSpec, kv_heads_per_card
from .forward import KV_DTYPES, Hardware, linear_layers

DEFAULT_HBM_UTILIZATION = 0.9   # vLLM's documented default gpu_memory_utilization (EngineArgs)


class HBMCapacityError(MemoryError):
    """The model, or the batch, does not fit in HBM; the message gives the numbers and what fits."""


@dataclass(frozen=True)
class HBMUse:
    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    capacity_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


def weights_bytes(spec: LLMSpec, hw: Hardware) -> int:
    """Weight bytes per card."""
    total = spec.weight_params()
    if spec.is_moe:
        experts = spec.moe_layers * spec.experts * spec.expert_params
        dense = total - experts
        return int((dense / hw.tp + experts / hw.cards) * hw.weight_bytes)
    return int(total / hw.tp * hw.weight_bytes)


def kv_bytes_per_token(spec: LLMSpec, hw: Hardware) -> int:
    """KV-cache bytes one token takes on a card: a key and a value per KV head per layer of full
    attention (Gated DeltaNet layers keep a fixed-size state instead); MLA: the compressed latent
    and the RoPE key, the same on every card, plus DeepSeek-V3.2's indexer key."""
    if spec.is_mla:   # one latent of kv_lora_rank plus the shared RoPE key per token and layer
        per = spec.kv_lora_rank + spec.qk_rope_dim + int(spec.extra.get("index_head_dim", 0) or 0)
        return spec.layers * per * KV_DTYPES[hw.kv_dtype]
    layers = spec.layers - linear_layers(spec)
    return 2 * layers * kv_heads_per_card(spec, hw.tp) * spec.head_dim * KV_DTYPES[hw.kv_dtype]


def state_bytes_per_sequence(spec: LLMSpec, hw: Hardware) -> int:
    """The fixed-size state a sequence keeps on a card in place of a KV cache in Gated DeltaNet
    layers (Qwen3-Next): per layer and value head the recurrent state [dk, dv] in fp32, and the
    last ``linear_conv_kernel_dim - 1`` inputs of the causal convolution; 0 for other models."""
    lin = linear_layers(spec)
    if not lin:
        return 0
    x = spec.extra
    kh, vh = max(1, x["linear_num_key_heads"] // hw.tp), max(1, x["linear_num_value_heads"] // hw.tp)
    dk, dv = x["linear_key_head_dim"], x["linear_value_head_dim"]
    conv = (2 * kh * dk + vh * dv) * (x.get("linear_conv_kernel_dim", 4) - 1) * hw.act_bytes
    return lin * (vh * dk * dv * 4 + conv)


def activation_bytes(spec: LLMSpec, hw: Hardware, kernels: list[CostedKernel], tokens: int) -> int:
    """The largest working set of a forward pass of ``tokens`` tokens: the residual stream (two
    copies: the layer's input and its running sum) plus the biggest kernel's inputs and outputs."""
    biggest = max((k.io_bytes for k in kernels), default=0.0)
    return int(2 * tokens * spec.hidden * hw.act_bytes + biggest)


def capacity_bytes(hw: Hardware, hbm_utilization: float = DEFAULT_HBM_UTILIZATION) -> int:
    return int(hw.chip.hbm_bytes * hbm_utilization)


def describe(use: HBMUse) -> str:
    g = 2 ** 30
    return (f"weights {use.weights_bytes / g:.2f} GiB + KV cache {use.kv_cache_bytes / g:.2f} GiB + activations "
            f"{use.activation_bytes / g:.2f} GiB = {use.peak_bytes / g:.2f} GiB against {use.capacity_bytes / g:.2f} "
            "GiB usable per card")


__all__ = ["DEFAULT_HBM_UTILIZATION", "HBMCapacityError", "HBMUse", "activation_bytes", "capacity_bytes", "describe",
           "kv_bytes_per_token", "state_bytes_per_sequence", "weights_bytes"]
