"""The Cube coster: a `CubeKernel` on the chip's Cube tile program (`simulate_matmul`), plus the
Vector passes that quantise an fp16 input to int8 first when the spec asks for them.

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
    reports = []
    q = spec.quantize_input
    if q is not None:  # fp16 activations quantised to int8 first: (a max for the scale,) a cast
        if q.dynamic:
            reports.append(simulate_vector("max", q.numel, dtype="fp16", chip=chip, row_len=q.row_len,
                                           name=f"absmax {q.numel} fp16"))
        reports.append(simulate_vector("cast", q.numel, dtype="fp16", chip=chip,
                                       name=f"quantize {q.numel} fp16->int8"))
    mm = simulate_matmul(spec.m, spec.k, spec.n, dtype=spec.dtype, chip=chip, tile=spec.tile,
                         out_dtype=spec.out_dtype, epilogue=spec.epilogue, batch=spec.batch, im2col=spec.im2col)
    reports.insert(0, mm)
    vector_work = spec.epilogue.on_vector or q is not None
    return KernelCost.of(reports, split_resources(chip, "AIC", "AIV") if vector_work else
                         split_resources(chip, "AIC"))
