"""The kernels of quantisation-aware training that the joint graph does not show: each QAT layer's
int8 fake quantisation (`pypto_lab.quantization.prepare_qat`), traced with its float layer and
costed here on the Vector unit, forward and backward."""

from __future__ import annotations

from ..kernels.ir import KernelSpec, VectorKernel
from ..lowering.lower import flat_reduction
from .policy import Policy


def fake_quant_kernels(layer, policy: Policy) -> tuple[list[KernelSpec], list[KernelSpec]]:
    """The forward and backward kernels of one QAT layer's int8 fake quantisation
    (`pypto_lab.quantization.fake_quantize`): forward, the observer's running min / max of the
    input (two reductions), then input and weight each clamped to the int8 range (VMAX, VMIN),
    divided by the scale, rounded (a cast to int8 and back) and multiplied back; backward, the
    straight-through estimator passes the gradient where the value was in range (one select)."""
    x, w = layer.input_numel, layer.weight_numel
    fwd: list[KernelSpec] = []
    numel, row = flat_reduction(x)
    fwd.append(VectorKernel(op="ReduceMinMax", ops=("max", "max"), numel=numel, dtype=policy.act_dtype,
                            compute_dtype=policy.act_dtype, inputs=1, row_len=row))
    for n, what in ((x, "input"), (w, "weight")):
        fwd.append(VectorKernel(op=f"FakeQuant({what})", ops=("maximum", "minimum", "mul", "cast", "cast", "mul"),
                                numel=max(1, n), dtype=policy.act_dtype, compute_dtype=policy.act_dtype, inputs=1))
    bwd: list[KernelSpec] = [VectorKernel(op=f"FakeQuantGrad({what})", ops=("sub", "mul"), numel=max(1, n),
                                          dtype=policy.act_dtype, compute_dtype=policy.act_dtype, inputs=2)
                             for n, what in ((x, "input"), (w, "weight"))]
    return fwd, bwd


__all__ = ["fake_quant_kernels"]
