"""A training step's numbers under its precision policy: the loss and every gradient as the NPU
would compute them, by running the captured joint graph (`pypto_lab.train.capture`) on real
tensors with the policy's roundings.

* Cube ops (convolutions, matmuls and their gradient kernels) read their operands in the policy's
  half type and accumulate in fp32 (the Cube's fp16 x fp16 -> fp32 MMAD); their output is rounded
  to what the kernel writes (half under O1/O2).
* Under O2 every other floating-point result is rounded to half when written, except what
  BatchNorm and the loss compute (fp32 statistics, apex's keep_batchnorm_fp32); under O1 they
  stay fp32.
* fp16 scales the loss (the backward starts from ``loss_scale`` instead of 1) and unscales the
  gradients in fp32 at the end: dynamic loss scaling's static part, which keeps small gradients
  above fp16's underflow.

`step_gradients(model, example_batch, loss_fn, precision, amp)` returns ``(loss, {name: grad})``
in fp32; compare them with torch autograd's fp32 gradients to see what mixed precision changes.
"""

from __future__ import annotations

import torch
from torch import nn

from .capture import StepGraph, capture_step
from .policy import Policy, policy_of

CUBE_OPS = {"aten.convolution.default", "aten.convolution_backward.default", "aten.mm.default",
            "aten.addmm.default", "aten.bmm.default"}
FP32_OPS = {"aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm_backward.default",
            "aten._log_softmax.default", "aten._log_softmax_backward_data.default", "aten.nll_loss_forward.default",
            "aten.nll_loss_backward.default", "aten.native_layer_norm.default",
            "aten.native_layer_norm_backward.default"}
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_LOSS_SCALE = 2.0 ** 10


def _round(x, dtype: torch.dtype):
    """Round every floating-point tensor in ``x`` (a tensor or a tuple) to ``dtype`` and back."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype).to(x.dtype) if x.is_floating_point() and dtype != x.dtype else x
    if isinstance(x, (tuple, list)):
        return type(x)(_round(v, dtype) for v in x)
    return x


class _PolicyInterpreter(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, policy: Policy, loss_scale: float):
        super().__init__(gm)
        self.policy = policy
        self.half = TORCH_DTYPES[policy.half]
        self.loss_scale = loss_scale

    def run_node(self, n):
        if n.op != "call_function" or self.policy.amp == "O0":
            return super().run_node(n)
        target = str(n.target)
        if target in CUBE_OPS:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            out = n.target(*_round(args, self.half), **kwargs)
            return _round(out, self.half)
        out = super().run_node(n)
        if target == "aten.ones_like.default":
            return out * self.loss_scale
        if self.policy.amp == "O2" and target not in FP32_OPS:
            return _round(out, self.half)
        return out


def run_step(step: StepGraph, values: dict[str, torch.Tensor], inputs: tuple[torch.Tensor, ...], policy: Policy,
             loss_scale: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run a captured step on real ``values`` (parameter and buffer name -> tensor, names as the
    graph knows them) and ``inputs``; returns the loss and the unscaled fp32 gradients."""
    sig = step.signature
    scale = (DEFAULT_LOSS_SCALE if policy.loss_scaling else 1.0) if loss_scale is None else loss_scale
    args = [values[name] for name in sig.parameters] + [values[name] for name in sig.buffers] + list(inputs)
    outs = _PolicyInterpreter(step.gm, policy, scale).run(*args)
    out_nodes = list(step.gm.graph.output_node().args[0])
    by_node = dict(zip((o.name if isinstance(o, torch.fx.Node) else None for o in out_nodes), outs))
    loss = by_node[sig.user_outputs[0]].float()   # the wrapper's only output is the loss
    grads = {p: by_node[g].float() / scale for g, p in sig.backward_signature.gradients_to_parameters.items()}
    return loss, grads


def step_gradients(model: nn.Module, example_batch, loss_fn=None, precision: str = "fp16",
                   amp: str | None = None, loss_scale: float | None = None):
    """``(loss, {parameter name: gradient})`` of one step of ``model`` with the NPU's numerics under
    ``precision`` / ``amp`` (see the module docstring); names as in ``model.named_parameters()``."""
    policy = policy_of(precision, amp)
    step = capture_step(model, example_batch, loss_fn)
    values = {f"model.{k}": v.detach() for k, v in model.named_parameters()}
    values.update({f"model.{k}": v.detach().clone() for k, v in model.named_buffers()})
    batch = tuple(example_batch.values()) if isinstance(example_batch, dict) else tuple(example_batch)
    loss, grads = run_step(step, values, batch, policy, loss_scale)
    return loss, {k.removeprefix("model."): v for k, v in grads.items()}


__all__ = ["run_step", "step_gradients"]
