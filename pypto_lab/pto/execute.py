"""What the kernel computes: the Tensor Graph interpreted on the CPU with the NPU's numerics.

* Vector arithmetic runs in the declared dtype: every operation's result is rounded to it
  (computed in fp32, then rounded to nearest even: a correctly rounded fp16/bf16 operation).
* Reductions add (or compare) in the declared dtype as the Vector unit's halving tree does:
  pairwise, rounding after every level.
* matmul: `pypto_lab.hw.numerics.matmul` (inputs in their dtype, exact products, fp32
  accumulation, rounded once on the way out of L0C); int8 x int8 accumulates exactly in int32.
* Casts to integers round to nearest even, saturating.
"""

from __future__ import annotations

import torch

from ..hw import numerics
from .graph import TensorGraph

_FLOAT = ("fp16", "bf16", "fp32")


def _round(x: torch.Tensor, dt) -> torch.Tensor:
    return x.to(dt.torch)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _tree(x: torch.Tensor, dim: int, op, dt) -> torch.Tensor:
    """Reduce ``dim`` pairwise, rounding to ``dt`` after each level."""
    x = x.movedim(dim, -1)
    while x.shape[-1] > 1:
        n = x.shape[-1]
        if n % 2:
            x, tail = x[..., :-1], x[..., -1:]
        else:
            tail = None
        h = x.shape[-1] // 2
        y = _round(op(_f32(x[..., :h]), _f32(x[..., h:])), dt)
        x = y if tail is None else torch.cat([y, tail], dim=-1)
    return x.movedim(-1, dim)


def run_graph(graph: TensorGraph, args: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    env: dict[int, torch.Tensor] = {}
    for pid, t in zip(graph.params, args):
        env[pid] = t
    for n in graph.nodes:
        op = n.op
        if op == "param":
            continue
        ins = [env[i] for i in n.inputs]
        dt = n.dtype
        if op == "alloc":
            env[n.id] = torch.zeros(n.shape, dtype=dt.torch)
        elif op == "view":
            env[n.id] = ins[0][tuple(slice(o, o + s) for o, s in zip(n.attrs["offsets"], n.shape))]
        elif op == "reshape":
            env[n.id] = ins[0].reshape(n.shape)
        elif op == "transpose":
            env[n.id] = ins[0].transpose(n.attrs["dim0"], n.attrs["dim1"]).contiguous()
        elif op == "assemble":
            dst = ins[1]
            sl = tuple(slice(o, o + s) for o, s in zip(n.attrs["offsets"], n.shape))
            dst[sl] = ins[0].to(dst.dtype)
        elif op == "matmul":
            a, b = ins
            if n.attrs["a_trans"]:
                a = a.transpose(-1, -2)
            if n.attrs["b_trans"]:
                b = b.transpose(-1, -2)
            ind = graph.nodes[n.inputs[0]].dtype.lab
            if ind == "int8":
                r = numerics.matmul_int8(a, b)
                env[n.id] = r.to(dt.torch) if dt.lab != "int32" else r
            else:
                out = dt.lab if dt.lab in _FLOAT else None
                env[n.id] = numerics.matmul(a, b, dtype=ind, out_dtype=out).to(dt.torch)
        elif op in ("amax", "amin", "sum"):
            x = ins[0]
            d = n.attrs["dim"]
            if op == "sum":
                if dt.lab in _FLOAT:
                    r = _tree(x, d, torch.add, dt)
                else:
                    r = x.sum(dim=d, keepdim=True, dtype=dt.torch)
            else:
                r = x.amax(dim=d, keepdim=True) if op == "amax" else x.amin(dim=d, keepdim=True)
            env[n.id] = r if n.attrs["keepdim"] else r.squeeze(d)
        elif op == "cast":
            x = ins[0]
            if dt.lab in _FLOAT:
                env[n.id] = x.to(dt.torch)
            else:
                info = torch.iinfo(dt.torch)
                env[n.id] = torch.round(_f32(x).double()).clamp(info.min, info.max).to(dt.torch)
        else:
            env[n.id] = _elementwise(op, ins, n.attrs.get("scalar"), dt)
    return env


def _elementwise(op, ins, s, dt) -> torch.Tensor:
    fl = dt.lab in _FLOAT
    x = [_f32(t) for t in ins] if fl else ins
    a = x[0]
    if op == "add":
        r = a + x[1]
    elif op == "sub":
        r = a - x[1]
    elif op == "mul":
        r = a * x[1]
    elif op == "div":
        r = a / x[1] if fl else torch.div(a, x[1], rounding_mode="trunc")
    elif op == "maximum":
        r = torch.maximum(a, x[1])
    elif op == "minimum":
        r = torch.minimum(a, x[1])
    elif op == "adds":
        r = a + s
    elif op == "subs":
        r = a - s
    elif op == "rsubs":
        r = s - a
    elif op == "muls":
        r = a * s
    elif op == "divs":
        r = a / s
    elif op == "rdivs":
        r = s / a
    elif op == "exp":
        r = torch.exp(a)
    elif op == "sqrt":
        r = torch.sqrt(a)
    elif op == "rsqrt":
        r = torch.rsqrt(a)
    elif op == "reciprocal":
        r = 1.0 / a
    elif op == "neg":
        r = -a
    elif op == "abs":
        r = a.abs()
    elif op == "relu":
        r = torch.relu(a)
    else:
        raise NotImplementedError(op)
    return _round(r, dt) if fl else r.to(dt.torch)
