"""``torch_npu.optim`` on the simulated card: ``NpuFusedAdamW`` and ``NpuFusedAdam``.

torch_npu's fused optimizers combine each parameter group's parameters, gradients and moments into
one contiguous buffer each (``npu_combine_tensors``) and update them with a handful of element-wise
kernels over the whole buffer instead of a handful per parameter
(Ascend/pytorch torch_npu/optim/npu_fused_adamw.py@9e73e708: ``mul_`` for the weight decay,
``mul_``/``add_`` for the first moment, ``mul_``/``addcmul_`` for the second, ``sqrt``, a division
and ``add_`` for the denominator, ``addcdiv_`` for the step). Here the numerics are the same update
per parameter (torch.optim.AdamW's arithmetic, in the parameters' dtype); the card runs what
torch_npu launches: those nine kernels over the group's combined element count, each through the
lowering table like any other operator.
"""

from __future__ import annotations

import math
import types

import torch

# torch_npu's update, kernel by kernel (ATen op, and whether it reads a second buffer)
ADAMW_KERNELS = (("mul_", "Scalar"), ("mul_", "Scalar"), ("add_", "Tensor"), ("mul_", "Scalar"),
                 ("addcmul_", "default"), ("sqrt", "default"), ("div", "Scalar"), ("add_", "Scalar"),
                 ("addcdiv_", "default"))


def _record_combined(sim, numel: int, dtype: torch.dtype, decoupled: bool) -> None:
    flat = torch.empty(numel, dtype=dtype, device="meta")
    kernels = ADAMW_KERNELS if decoupled else ADAMW_KERNELS[1:]
    for name, overload in kernels:
        func = getattr(getattr(torch.ops.aten, name), overload)
        args = (flat, 0.5) if overload == "Scalar" else ((flat,) if name == "sqrt" else
                                                        ((flat, flat) if overload == "Tensor" else (flat, flat, flat)))
        sim.record(func, args, {}, flat)


class NpuFusedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) as torch_npu's fused optimizer runs it (see the module docstring)."""

    decoupled = True
    _sim = None     # the simulated card the run's torch_npu.optim was built for (`build_module`)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        if lr < 0.0 or eps < 0.0 or not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0 or weight_decay < 0.0:
            raise ValueError(f"Invalid hyper-parameter: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        if amsgrad:
            raise NotImplementedError("NpuFusedAdamW(amsgrad=True) is not stood in")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sim = self._sim
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            numel, dtype = 0, None
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                numel += p.numel()
                dtype = dtype or p.dtype
                ctx = sim.quiet() if sim is not None else _nothing()
                with ctx:
                    self._update(p, p.grad, state, lr, beta1, beta2, eps, wd)
            if numel and sim is not None:
                _record_combined(sim, numel, dtype, self.decoupled)
        return loss

    def _update(self, p, grad, state, lr, beta1, beta2, eps, wd):
        state["step"] += 1
        step = state["step"]
        if self.decoupled:
            p.mul_(1 - lr * wd)
        elif wd:
            grad = grad.add(p, alpha=wd)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias1, bias2 = 1 - beta1 ** step, 1 - beta2 ** step
        denom = (exp_avg_sq.sqrt() / math.sqrt(bias2)).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-lr / bias1)


class NpuFusedAdam(NpuFusedAdamW):
    """Adam (L2 weight decay added to the gradient), torch_npu's fused Adam."""

    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def build_module(sim) -> types.ModuleType:
    from . import standin

    m = standin._Missing("torch_npu.optim")
    m.__doc__ = __doc__
    m.NpuFusedAdamW = type("NpuFusedAdamW", (NpuFusedAdamW,), {"_sim": sim, "__doc__": NpuFusedAdamW.__doc__})
    m.NpuFusedAdam = type("NpuFusedAdam", (NpuFusedAdam,), {"_sim": sim, "__doc__": NpuFusedAdam.__doc__})
    return m


__all__ = ["ADAMW_KERNELS", "NpuFusedAdam", "NpuFusedAdamW", "build_module"]
