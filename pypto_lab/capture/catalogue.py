"""The type of a lowering-table entry (`NpuOp`: which NPU operator, on which unit, runs an ATen
operator, and how its kernel is sized) and the ATen name helper every stage shares.

The table itself, from ATen operators (forward and backward) to entries, is
`pypto_lab.lowering.table`; `map_ops` writes each node's entry into ``node.npu``. Units: "cube"
(matrix work on the Cube), "vector" (element-wise, reductions, norms on the Vector unit), "move"
(data movement such as TransData, concat, slicing copies), "free" (views and bookkeeping: no
kernel, only metadata), "composite" (attention: lowered whole, decomposed or fused by passes) and
"cpu" (not in the table: the host fallback, paying the host<->device copies). The NPU operator
names follow CANN's operator types (Conv2D, MatMulV2, BatchMatMul, Add, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class NpuOp:
    """One entry of the lowering table.

    ``vector_ops`` name the Vector operators (`pypto_lab.hw.kernels.VECTOR_OPS`) a Vector kernel of
    this op runs on every tile; ``rows`` how a row-wise one finds its rows ("" or "last": the input's last
    dimension, "reduced": the elements reduced into each output element, "output": the output's
    last dimension); ``sized_by_input``: the
    kernel's work is its (larger) input, as for reductions and pooling; ``fp32``: it computes in
    the precision's statistics dtype (fp32 under AMP and mixed precision: softmax, norms, sums);
    ``reads``: how many output-sized tensors it streams in from GM, when that is not what its tensor
    arguments say (a scatter-add reads and rewrites the rows it adds into); ``lower``: a rule of its
    own, ``lower(graph, node, chip, precision) -> spec or [specs]`` (backward ops that become
    several CANN kernels, user operators)."""

    name: str
    unit: str
    vector_ops: tuple[str, ...] = ()
    lower: Callable | None = None
    rows: str = ""
    sized_by_input: bool = False
    fp32: bool = False
    reads: int | None = None

    def __post_init__(self):
        if isinstance(self.vector_ops, str):   # one operator by name, as entries were written before
            object.__setattr__(self, "vector_ops", (self.vector_ops,) if self.vector_ops else ())

    @property
    def vector_op(self) -> str:
        """The first (for most entries the only) Vector operator, "" for none."""
        return self.vector_ops[0] if self.vector_ops else ""


CPU = NpuOp("", "cpu")  # the entry of an operator the table does not know: the host fallback

# user operators registered with `pypto_lab.custom_op` are captured as "pypto_lab_user.<name>.default"
CUSTOM_NAMESPACE = "pypto_lab_user"
# operator namespaces whose targets read "<namespace>.<op>.<overload>" (npu: torch_npu's fused operators)
NAMESPACES = ("aten.", "pypto_lab.", "transformers.", "npu.")


def aten_name(target: str) -> str:
    """"aten.conv2d.default" -> "conv2d"; "pypto_lab.linear_int8.default" -> "linear_int8";
    "transformers.grouped_mm_fallback.default" -> "grouped_mm_fallback"; torch_npu's fused operators,
    "npu.npu_rms_norm.default" -> "npu_rms_norm"; "<built-in function getitem>" -> "getitem"."""
    if target.startswith(NAMESPACES):
        return target.split(".")[1]
    if "getitem" in target:
        return "getitem"
    return target.rsplit(".", 1)[-1].strip("<>").split()[-1]


def overload_name(target: str) -> str:
    """"aten.add.Scalar" -> "add.Scalar": the op and its overload, for table entries that depend on
    the overload ("" when the target has none)."""
    parts = target.split(".")
    return f"{parts[1]}.{parts[2]}" if len(parts) >= 3 and parts[0] + "." in NAMESPACES else ""


__all__ = ["CPU", "CUSTOM_NAMESPACE", "NAMESPACES", "NpuOp", "aten_name", "overload_name"]
