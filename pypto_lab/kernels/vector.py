"""The Vector coster: a `VectorKernel` (a fused chain of vector operators) or a `TransDataKernel`
(a format conversion, a GM -> UB -> GM copy) on the Vector tile program (`simulate_vector`)."""

from __future__ import annotations

from ..hw.chip import Chip
from ..hw.kernels import VECTOR_OPS, fuse_vector_ops, simulate_vector
from .cost import KernelCost, coster, split_resources
from .ir import TransDataKernel, TransposeKernel, VectorKernel


@coster(VectorKernel)
def cost_vector(spec: VectorKernel, chip: Chip) -> KernelCost:
    op = VECTOR_OPS[spec.ops[0]] if spec.inputs is None else fuse_vector_ops(list(spec.ops), spec.inputs)
    name = None if spec.inputs is None else "+".join(spec.ops)
    r = simulate_vector(op, spec.numel, dtype=spec.dtype, chip=chip, row_len=spec.row_len, name=name,
                        compute_dtype=spec.compute_dtype, l2_reads=spec.l2_reads, l2_writes=spec.l2_writes,
                        by_row=spec.by_row)
    return KernelCost.of([r], split_resources(chip, "AIV"))


@coster(TransDataKernel)
def cost_transdata(spec: TransDataKernel, chip: Chip) -> KernelCost:
    r = simulate_vector(fuse_vector_ops(["copy"], 1), spec.numel, dtype=spec.dtype, chip=chip,
                        name=f"TransData {spec.src_format}->{spec.dst_format}", l2_reads=spec.l2_reads,
                        l2_writes=spec.l2_writes)
    return KernelCost.of([r], split_resources(chip, "AIV"))


@coster(TransposeKernel)
def cost_transpose(spec: TransposeKernel, chip: Chip) -> KernelCost:
    """A TransposeD on ND data: one read and one write of the tensor through UB, as a TransData."""
    r = simulate_vector(fuse_vector_ops(["copy"], 1), spec.numel, dtype=spec.dtype, chip=chip, name="TransposeD",
                        l2_reads=spec.l2_reads, l2_writes=spec.l2_writes)
    return KernelCost.of([r], split_resources(chip, "AIV"))
