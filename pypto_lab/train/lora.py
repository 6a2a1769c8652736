"""LoRA fine-tuning: a frozen model with low-rank adapters trained beside chosen linear layers (Hu et
al., "LoRA", 2021; PEFT's ``LoraConfig(r, lora_alpha, target_modules, lora_dropout)``).

`lora_applied(model, lora)` swaps each targeted ``nn.Linear`` for a `LoRALinear` that computes
``base(x) + B(A(dropout(x))) * alpha / r`` (A: ``in -> r``, B: ``r -> out``), freezes every other
parameter, and puts the model back as it was when the step has been captured. The joint graph then
holds what a LoRA step runs: the frozen weights' forward and their input gradients (the adapters
below them need them) but no weight gradient for them, the adapters' small matmuls forward and
backward; gradients, fp32 master weights and optimizer state exist for the adapters only
(`pypto_lab.train.zero.state_bytes`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from torch import nn


class LoRAError(ValueError):
    """A LoRA setting outside its rule; the message names the value and a fix."""


@dataclass(frozen=True)
class LoRA:
    """Which linear layers get adapters (``targets``: module-name endings, PEFT's ``target_modules``;
    empty: every linear layer but the output head), of rank ``r``, scaled by ``alpha / r``."""

    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    dropout: float = 0.0


def lora_of(value) -> LoRA:
    """A `LoRA` from what `simulate_step` takes: a `LoRA`, a rank, or a dict of its fields."""
    if isinstance(value, LoRA):
        spec = value
    elif isinstance(value, int) and not isinstance(value, bool):
        spec = LoRA(r=value)
    elif isinstance(value, dict):
        try:
            spec = LoRA(**{k: tuple(v) if k == "targets" else v for k, v in value.items()})
        except TypeError as e:
            raise LoRAError(f"lora = {value!r}: {e}. Fix: lora=dict(r=8, alpha=16, targets=('q_proj', 'v_proj'))") \
                from None
    else:
        raise LoRAError(f"lora = {value!r}: a rank (lora=8), a dict of LoRA's fields or a pypto_lab.train.lora.LoRA. "
                        "Fix: lora=8")
    if isinstance(spec.r, bool) or not isinstance(spec.r, int) or spec.r < 1:
        raise LoRAError(f"lora rank r = {spec.r!r}: a whole number >= 1. Fix: r=8")
    return spec


class LoRALinear(nn.Module):
    """A frozen linear layer and its trained low-rank adapter."""

    def __init__(self, base: nn.Linear, spec: LoRA):
        super().__init__()
        self.base = base
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_A = nn.Linear(base.in_features, spec.r, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(spec.r, base.out_features, bias=False, device=device, dtype=dtype)
        self.scale = spec.alpha / spec.r
        self.drop = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(self.drop(x))) * self.scale


def _targets(model: nn.Module, spec: LoRA) -> list[tuple[nn.Module, str, nn.Linear]]:
    head = {id(m) for n, m in model.named_modules() if n.endswith(("lm_head", "output_layer", "classifier"))}
    found = []
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            full = f"{parent_name}.{name}" if parent_name else name
            if not isinstance(child, nn.Linear) or id(child) in head:
                continue
            if not spec.targets or any(full == t or full.endswith("." + t) for t in spec.targets):
                found.append((parent, name, child))
    return found


@contextlib.contextmanager
def lora_applied(model: nn.Module, value):
    """``model`` with adapters on its targeted linear layers and everything else frozen, while the
    ``with`` block runs (see the module docstring); yields a one-line summary."""
    spec = lora_of(value)
    found = _targets(model, spec)
    if not found:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise LoRAError(f"lora targets {spec.targets!r} match no linear layer of {type(model).__name__} (its linear "
                        f"layers end in: {', '.join(names[:12])}). Fix: targets=('{names[0] if names else 'q_proj'}',)")
    grads = {p: p.requires_grad for p in model.parameters()}
    swapped = []
    try:
        for p in grads:
            p.requires_grad_(False)
        for parent, name, child in found:
            adapter = LoRALinear(child, spec)
            setattr(parent, name, adapter)
            swapped.append((parent, name, child))
        frozen = sum(p.numel() for p in grads)
        adapters = [getattr(parent, name) for parent, name, _ in swapped]
        trained = sum(m.lora_A.weight.numel() + m.lora_B.weight.numel() for m in adapters)
        yield (f"rank {spec.r} adapters on {len(found)} linear layers ({', '.join(sorted(set(spec.targets))) or 'all'}): "
               f"{trained:,} trained parameters beside {frozen:,} frozen")
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
        for p, g in grads.items():
            p.requires_grad_(g)


__all__ = ["LoRA", "LoRAError", "LoRALinear", "lora_applied", "lora_of"]
