"""The Cube coster: a `CubeKernel` on the chip's Cube tile program (`simulate_matmul`), plus the
Vector passes that quantise an fp16 input to int8 first when the spec asks for them.

Weight-only int8 (``weight_dtype="int8"``, WeightQuantBatchMatmul, W8A16): int8 weights cross HBM
and are dequantised on the way into the Cube, which then runs at its fp16 rate; the kernel takes
the longer of the int8 kernel (the bytes) and the flops at the Cube's fp16 peak (the compute).

The coster obeys the spec and the chip's capability table: the epilogue runs where the spec's
`Epilogue` says (FixPipe or the Vector unit), and a GM format the Cube cannot read on this core
version (a matmul operand in ND on 910A, whose Cube reads FRACTAL_NZ) is an error, not a guess.
"""

from __future__ import annotations

from ..hw.capabilities import ND, capabilities
from ..hw.chip import Chip
from ..hw.kernels import simulate_matmul, simulate_vector
from .cost import KernelCost, coster, split_resources
from .ir import CubeKernel


class KernelSpecError(ValueError):
    """A kernel spec asks for something the chip cannot do: the message names the rule and the fix."""


def check_formats(spec: CubeKernel, chip: Chip) -> None:
    """A Cube kernel's GM formats must be ones its kernels read on this core version."""
    caps = capabilities(chip)
    allowed = caps.conv_formats if spec.is_conv else caps.matmul_formats
    for label, fmt in (("A", spec.a_format), ("C", spec.c_format)):
        if fmt and fmt not in allowed and not (fmt == ND and not spec.is_conv and caps.nd2nz_on_load):
            kind = "convolution" if spec.is_conv else "matmul"
            raise KernelSpecError(
                f"{spec.op} on {chip.name} ({chip.core_version}): {label} in {fmt}, but its {kind} kernels read and "
                f"write {', '.join(sorted(allowed))}; run the layout pass (level 2) or leave the format unassigned")


@coster(CubeKernel)
def cost_cube(spec: CubeKernel, chip: Chip) -> KernelCost:
    check_formats(spec, chip)
    if spec.weight_dtype is not None:
        return weight_only_int8(spec, KernelCost.of([_int8_weights_matmul(spec, chip)], split_resources(chip, "AIC")),
                                chip)
    reports = []
    q = spec.quantize_input
    if q is not None:  # fp16 activations quantised to int8 first: (a max for the scale,) a cast
        if q.dynamic:
            reports.append(simulate_vector("max", q.numel, dtype="fp16", chip=chip, row_len=q.row_len,
                                           name=f"absmax {q.numel} fp16"))
        reports.append(simulate_vector("cast", q.numel, dtype="fp16", chip=chip,
                                       name=f"quantize {q.numel} fp16->int8"))
    mm = simulate_matmul(spec.m, spec.k, spec.n, dtype=spec.dtype, chip=chip, tile=spec.tile,
                         out_dtype=spec.out_dtype, epilogue=spec.epilogue, batch=spec.batch, im2col=spec.im2col,
                         l2_operands=spec.l2_operands, l2_writes=spec.l2_writes,
                         useful_macs=spec.useful_macs or None)
    reports.insert(0, mm)
    vector_work = spec.epilogue.on_vector or q is not None
    return KernelCost.of(reports, split_resources(chip, "AIC", "AIV") if vector_work else
                         split_resources(chip, "AIC"))


def _int8_weights_matmul(spec: CubeKernel, chip: Chip):
    """The int8 kernel whose bytes a W8A16 matmul moves."""
    return simulate_matmul(spec.m, spec.k, spec.n, dtype="int8", chip=chip, tile=spec.tile, batch=spec.batch)


def weight_only_int8(spec: CubeKernel, bytes_bound: KernelCost, chip: Chip) -> KernelCost:
    """A W8A16 matmul: ``bytes_bound`` (the int8 kernel's cost) or, when longer, its flops at the
    Cube's fp16 peak."""
    compute_us = 2.0 * spec.m * spec.k * spec.n * spec.batch / (chip.peak_tflops("fp16") * 1e6)
    if compute_us <= bytes_bound.time_us:
        return bytes_bound
    return KernelCost(compute_us * chip.clock_mhz, compute_us, bytes_bound.gm_bytes, bytes_bound.tile,
                      bytes_bound.reports, bytes_bound.resources, bytes_bound.flops, "compute", bytes_bound.hbm_bytes)
