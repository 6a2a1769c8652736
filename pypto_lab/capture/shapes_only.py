"""Models whose weights are on the meta device (shapes, no memory), exported as a CPU model would be.

`torch.export` of a meta model as it is traces with meta tensors, and some operators lay out
their outputs differently on meta than on the CPU (scaled_dot_product_attention's math path on
meta returns a [B, H, L, D]-contiguous output where the CPU's flash kernel returns the transposed
layout, so a transformers model on meta gains a ``contiguous`` copy per layer). `cpu_fakes` gives
every meta parameter and buffer a fake tensor on the CPU (a `FakeTensor` over the meta tensor: no
memory either), and `fake_input` does the same for an input, so the program is the one a CPU model
of those shapes gives. The program's state dict then holds fake tensors: it is for costing only,
and the runtime refuses a meta model before reading it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module

CPU = torch.device("cpu")


def fake_input(x, mode: FakeTensorMode, device: torch.device = CPU):
    """``x`` as a fake tensor of ``mode`` on ``device``: a meta or fake tensor keeps its shape and
    strides (no memory), a real one is converted; anything else is returned as it is."""
    if not isinstance(x, torch.Tensor):
        return x
    if isinstance(x, FakeTensor) or x.is_meta:
        elem = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return FakeTensor(mode, elem, device)
    return mode.from_tensor(x, static_shapes=True)


def cpu_fakes(model: torch.nn.Module, mode: FakeTensorMode) -> dict[str, torch.Tensor]:
    """Every meta parameter and buffer of ``model``, by name, as a fake CPU tensor of ``mode``."""
    state: dict[str, torch.Tensor] = {}
    made: dict[int, torch.Tensor] = {}  # a tied weight (one tensor under two names) stays one tensor
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.is_meta:
            if id(p) not in made:
                made[id(p)] = torch.nn.Parameter(fake_input(p, mode), requires_grad=False)
            state[name] = made[id(p)]
    for name, b in model.named_buffers(remove_duplicate=False):
        if b.is_meta:
            if id(b) not in made:
                made[id(b)] = fake_input(b, mode)
            state[name] = made[id(b)]
    return state


@contextmanager
def as_cpu(model: torch.nn.Module, mode: FakeTensorMode) -> Iterator[None]:
    """Inside the block, ``model``'s meta weights are fake CPU tensors of ``mode`` (put back after)."""
    with _reparametrize_module(model, cpu_fakes(model, mode)):
        yield


__all__ = ["as_cpu", "cpu_fakes", "fake_input"]
