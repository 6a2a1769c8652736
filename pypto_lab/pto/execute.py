"""What the kernel computes: the Tensor Graph interpreted on the CPU with the NPU's numerics.

* Vector arithmetic runs in the declared dtype: every operation's result is rounded to it
  (computed in fp32, then rounded to nearest even: a correctly rounded fp16/bf16 operation).
* Reductions add (or compare) in the declared dtype as the Vector unit's halving tree does:
  pairwise, rounding after every level.
* matmul: `pypto_lab.hw.numerics.matmul` (inputs in their dtype, exact products, fp32
  accumulation, rounded once on the way out of L0C); int8 x int8 accumulates exactly in int32.
* Casts to integers round to nearest even, saturating.
* Composite ops round after each vector step they are made of (sigmoid: -x, exp, + 1, 1 / y;
  expm1: exp, - 1); erf / erfc / log / pow are computed in fp32 and rounded once (the chip's
  polynomial approximations are not modelled bit for bit).
* Comparisons give DT_BOOL; matmul ``bias_tensor`` is added to the fp32 accumulator before the
  result leaves L0C.
"""

from __future__ import annotations

import torch

from ..hw import numerics
from . import ops_math, special
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
        if op in special.REGISTRY:
            env[n.id] = special.REGISTRY[op].run(n, ins, graph)
        elif op == "math":
            env[n.id] = ops_math.compute(n, ins)
        elif op == "alloc":
            env[n.id] = torch.zeros(n.shape, dtype=dt.torch)
        elif op == "view":
            env[n.id] = ins[0][tuple(slice(o, o + s) for o, s in zip(n.attrs["offsets"], n.shape))]
        elif op == "reshape":
            env[n.id] = ins[0].reshape(n.shape)
        elif op == "transpose":
            if "perm" in n.attrs:
                env[n.id] = ins[0].permute(*n.attrs["perm"]).contiguous()
            else:
                env[n.id] = ins[0].transpose(n.attrs["dim0"], n.attrs["dim1"]).contiguous()
        elif op == "full":
            env[n.id] = torch.full(n.shape, n.attrs["value"], dtype=torch.float64).to(dt.torch)
        elif op == "arange":
            # index * step + start, in the output dtype (fp32: two rounded vector ops)
            idx = torch.arange(n.shape[0], dtype=torch.float64 if dt.lab not in _FLOAT else torch.float32)
            if dt.lab in _FLOAT:
                r = _round(_round(idx * n.attrs["step"], dt).float() + n.attrs["start"], dt)
            else:
                r = (idx * n.attrs["step"] + n.attrs["start"]).to(dt.torch)
            env[n.id] = r
        elif op == "expand":
            env[n.id] = ins[0].expand(*n.shape).clone()
        elif op in ("cmp", "cmps"):
            a = ins[0]
            b = ins[1] if op == "cmp" else n.attrs["scalar"]
            fn = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
            env[n.id] = fn[n.attrs["mode"]](a, b)
        elif op == "logical_and":
            env[n.id] = torch.logical_and(ins[0], ins[1])
        elif op == "logical_not":
            env[n.id] = torch.logical_not(ins[0])
        elif op == "where":
            it = iter(ins[1:])
            x = next(it) if "x" not in n.attrs else torch.tensor(n.attrs["x"], dtype=dt.torch)
            y = next(it) if "y" not in n.attrs else torch.tensor(n.attrs["y"], dtype=dt.torch)
            env[n.id] = torch.where(ins[0].to(torch.bool), x.to(dt.torch), y.to(dt.torch))
        elif op == "assemble":
            dst = ins[1]
            sl = tuple(slice(o, o + s) for o, s in zip(n.attrs["offsets"], n.shape))
            dst[sl] = ins[0].to(dst.dtype)
        elif op == "matmul":
            a, b = ins[0], ins[1]
            if n.attrs["a_trans"]:
                a = a.transpose(-1, -2)
            if n.attrs["b_trans"]:
                b = b.transpose(-1, -2)
            ind = graph.nodes[n.inputs[0]].dtype.lab
            bias = ins[2].reshape(-1) if len(ins) > 2 else None  # added to the fp32 accumulator (BiasTable)
            if ind == "int8":
                r = numerics.matmul_int8(a, b, bias=bias)
                env[n.id] = r.to(dt.torch) if dt.lab != "int32" else r
            else:
                out = dt.lab if dt.lab in _FLOAT else None
                env[n.id] = numerics.matmul(a, b, dtype=ind, out_dtype=out, bias=bias).to(dt.torch)
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
    elif op == "maxs":
        r = torch.clamp(a, min=s)
    elif op == "mins":
        r = torch.clamp(a, max=s)
    elif op == "sigmoid":
        # 1 / (1 + exp(-x)) with each vector step rounded to the dtype
        r = _f32(_round(1.0 / _f32(_round(torch.exp(_f32(_round(-a, dt))), dt) + 1.0), dt))
    elif op == "log":
        r = torch.log(a)
    elif op == "expm1":
        r = _f32(_round(torch.exp(a), dt)) - 1.0
    elif op == "erf":
        r = torch.erf(a)
    elif op == "erfc":
        r = torch.erfc(a)
    elif op in ("ceil", "floor", "trunc", "round"):
        r = getattr(torch, op)(a)
    elif op == "pow":
        r = torch.pow(a, x[1])
    elif op == "pows":
        r = torch.pow(a, s)
    else:
        raise NotImplementedError(op)
    return _round(r, dt) if fl else r.to(dt.torch)
