"""The kernel IR: what the chip runs, as frozen values the passes produce and the costers obey.

Every kind of kernel the chip runs is a frozen dataclass (a *spec*): a Cube kernel (matmul or
convolution as implicit GEMM, with its dtypes, GM formats, epilogue and tiling; weight-only int8
as WeightQuantBatchMatmul), a Vector kernel (a chain of vector operators over a tensor, with its
storage and compute dtypes), attention (FlashAttention or the unfused three-kernel sequence, with
its block sizes; an LLM's PromptFlashAttention over a prefill chunk and IncreFlashAttention over a
paged KV cache), MoE gating (MoeGatingTopK), a collective (HCCL over a server topology), a
TransData (a format conversion), a Host kernel (a CPU fallback paying the host link), a Custom
kernel (a user operator with a declared cost) and a Decomposed composite (primitives run one after
another). Every front end (`optimize`, the LLM engine, training) builds these same specs, and one
coster per kind costs them.

A spec names no graph node and no module path: identical layers share one spec, so they are
costed once (the costers' memo is keyed by the spec and the chip). Where a spec sits in a model
is the `Kernel` around it: its display name, the graph nodes it computes and their ATen targets.

Specs are written by the passes (`pypto_lab.passes`), starting from `map_ops` (which lowers every
ATen node with `pypto_lab.kernels.lower`) and refined by the fusion, layout, precision and tiling
passes with `dataclasses.replace`; nothing downstream re-derives a decision from op names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..hw.capabilities import NO_EPILOGUE, Epilogue
from ..hw.collectives import KINDS as COLLECTIVE_KINDS
from ..hw.kernels import Im2col
from ..hw.tiling import CubeTile
from ..hw.topology import Topology

GM_DTYPES = ("fp16", "bf16", "fp32", "int8")
VECTOR_DTYPES = ("fp16", "bf16", "fp32")


class KernelSpec:
    """Base of the kernel specs: ``kind`` names the kind; ``unit`` what the kernel runs on ("cube",
    "vector", "move", "cube+vector", "cpu")."""

    kind: ClassVar[str] = ""

    @property
    def unit(self) -> str:
        raise NotImplementedError

    @property
    def dtypes(self) -> tuple[str | None, str | None]:
        """(the dtype its tensors are held in GM, the dtype it computes in); None where not known."""
        return None, None

    @property
    def value_tiling(self) -> bool:
        """Whether its tiling reads run-time values (not only shapes), so a graph must tile it at
        each run (on the host, or on the AICPU with tiling sink)."""
        return False

    @property
    def ifa_overhead(self) -> bool:
        """Whether a stack's per-run IncreFlashAttention overhead (`Stack.ifa_overhead_us`) is
        charged on it: IncreFlashAttention over a preallocated KV cache."""
        return False


def _l2_bytes(kind: str, reads: int, writes: int) -> None:
    for label, v in (("l2_reads", reads), ("l2_writes", writes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{kind} {label} = {v!r}: bytes kept in L2 between operators, an integer >= 0. "
                             "Fix: leave it 0 (the l2_residency pass sets it)")


def _positive(kind: str, **dims: int) -> None:
    for label, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{kind} {label} = {v!r}: must be a positive integer")


@dataclass(frozen=True)
class InputQuant:
    """An fp16 activation quantised to int8 before a Cube kernel reads it: one Vector pass over its
    ``numel`` elements (``row_len`` per row), preceded by a max-reduction when the scale is found
    at run time (``dynamic``)."""

    numel: int
    row_len: int
    dynamic: bool = False


@dataclass(frozen=True)
class CubeKernel(KernelSpec):
    """``batch`` independent ``C[m, n] = A[m, k] @ B[k, n]`` on the Cube (a convolution as implicit
    GEMM: M = N*Ho*Wo, K = C_in*kh*kw, N = C_out; a grouped one with its groups packed as CANN's Conv2D
    does, `pypto_lab.lowering.lower.grouped_conv_gemm`, ``useful_macs`` the MACs it needs)."""

    kind: ClassVar[str] = "cube"
    op: str                          # the CANN operator, e.g. "Conv2D", "MatMulV2", "BatchMatMulV2"
    batch: int
    m: int
    k: int
    n: int
    dtype: str                       # what the Cube multiplies: fp16 / bf16 / fp32 / int8
    out_dtype: str                   # what the kernel writes to GM
    epilogue: Epilogue = NO_EPILOGUE
    tile: CubeTile | None = None     # None: the chip's default tiling
    a_format: str = ""               # GM formats of A and C ("" until the layout pass assigns them)
    c_format: str = ""
    quantize_input: InputQuant | None = None
    im2col: Im2col | None = None     # a convolution's geometry: A is read from its feature map (load3d)
    weight_dtype: str | None = None  # "int8": weight-only quantisation (W8A16), dequantised on the way in
    l2_operands: tuple[str, ...] = ()  # operands an earlier kernel left in L2: "a", "b", "residual" (`l2_residency`)
    l2_writes: int = 0               # bytes of its results that stay in L2 for their readers (never in DRAM)
    useful_macs: int = 0             # a grouped convolution's own MACs, of the batch x m x k x n the Cube runs
                                     # (its groups packed block-diagonally: `lower.grouped_conv_gemm`); 0: all

    def __post_init__(self):
        _positive("Cube kernel", batch=self.batch, m=self.m, k=self.k, n=self.n)
        _l2_bytes("Cube kernel", 0, self.l2_writes)
        if not isinstance(self.l2_operands, tuple) or not set(self.l2_operands) <= {"a", "b", "residual"}:
            raise ValueError(f"Cube kernel l2_operands = {self.l2_operands!r}: a tuple of the operands an earlier "
                             "kernel left in L2, of 'a', 'b', 'residual'. Fix: leave it () (the l2_residency pass sets it)")
        total = self.batch * self.m * self.k * self.n
        if isinstance(self.useful_macs, bool) or not isinstance(self.useful_macs, int) or \
                not 0 <= self.useful_macs <= total:
            raise ValueError(f"Cube kernel useful_macs = {self.useful_macs!r}: the MACs a grouped convolution needs, "
                             f"an integer from 0 (all {total:,} the Cube runs are useful) to {total:,}. Fix: leave it "
                             "0, or give N x Ho x Wo x C_out x C_in/groups x kh x kw")
        if self.dtype not in GM_DTYPES or self.out_dtype not in GM_DTYPES + ("int32",):
            raise ValueError(f"Cube kernel dtype {self.dtype!r} -> {self.out_dtype!r}: the Cube multiplies "
                             f"{', '.join(GM_DTYPES)}")
        if self.weight_dtype is not None and (self.weight_dtype != "int8" or self.dtype not in ("fp16", "bf16")):
            raise ValueError(f"Cube kernel weight_dtype {self.weight_dtype!r} with dtype {self.dtype!r}: weight-only "
                             "quantisation keeps int8 weights for fp16 or bf16 activations (W8A16)")

    @property
    def unit(self) -> str:
        return "cube"

    @property
    def dtypes(self) -> tuple[str, str]:
        return self.dtype, "fp32"  # the Cube accumulates in fp32 (int32 for int8, dequantised in fp32)

    @property
    def is_conv(self) -> bool:
        return self.op == "Conv2D"


@dataclass(frozen=True)
class VectorKernel(KernelSpec):
    """A chain of vector operators (names of `pypto_lab.hw.kernels.VECTOR_OPS`) applied tile by tile
    to ``numel`` elements, rows of ``row_len`` for row-wise operators. ``inputs`` is how many tensors
    stream in from GM (None: the single operator's own inputs, as an unfused kernel reads them).
    A chain of only "copy" is data movement (unit "move")."""

    kind: ClassVar[str] = "vector"
    op: str                          # the CANN operator(s), e.g. "Add+Relu", "LayerNorm"
    ops: tuple[str, ...]
    numel: int
    dtype: str                       # what GM holds
    compute_dtype: str               # what the Vector unit computes in (fp32 kept for softmax / norms)
    inputs: int | None = None
    row_len: int | None = None
    l2_reads: int = 0                # bytes of its inputs an earlier kernel left in L2 (`l2_residency` pass)
    l2_writes: int = 0               # bytes of its result that stay in L2 for their readers
    by_row: bool = False             # ND rows that are not whole 32-byte blocks, no DataCopyPad (`layout` pass)

    def __post_init__(self):
        _positive("Vector kernel", numel=self.numel)
        _l2_bytes("Vector kernel", self.l2_reads, self.l2_writes)
        if not self.ops:
            raise ValueError("a Vector kernel needs at least one operator")
        if self.dtype not in VECTOR_DTYPES + ("int8",) or self.compute_dtype not in VECTOR_DTYPES:
            raise ValueError(f"Vector kernel dtype {self.dtype!r} computed in {self.compute_dtype!r}: GM holds "
                             f"{', '.join(VECTOR_DTYPES)}, the Vector unit computes in {', '.join(VECTOR_DTYPES)}")

    @property
    def unit(self) -> str:
        return "move" if all(o == "copy" for o in self.ops) else "vector"

    @property
    def dtypes(self) -> tuple[str, str]:
        return self.dtype, self.compute_dtype


@dataclass(frozen=True)
class AttentionKernel(KernelSpec):
    """``O = softmax(Q K^T / sqrt(d)) V`` for ``batch_heads`` heads: FlashAttention (one kernel, the
    online softmax on the Vector unit, no s_q x s_k scores in GM) when ``flash``, else the unfused
    BatchMatMul, SoftmaxV2, BatchMatMul with the scores in GM. ``causal`` (the last ``s_q`` of
    ``s_k`` positions, each seeing the keys up to its own): a fused kernel skips the blocks above the
    diagonal, as PromptFlashAttention does for an LLM's prefill; the unfused sequence computes the
    full scores and masks them."""

    kind: ClassVar[str] = "attention"
    batch_heads: int
    s_q: int
    s_k: int
    d: int
    dtype: str
    flash: bool = False
    block_q: int | None = None       # FlashAttention's blocks; None: the chip's default
    block_k: int | None = None
    causal: bool = False             # query i sees keys up to s_k - s_q + i: FlashAttention skips the blocks
                                     # above the diagonal (an LLM's prefill: PromptFlashAttention)
    backward: bool = False           # the fused kernel's gradient (FlashAttentionScoreGrad: the scores recomputed,
                                     # five GEMMs; `pypto_lab.hw.attention_grad`), with ``flash``

    def __post_init__(self):
        _positive("attention", batch_heads=self.batch_heads, s_q=self.s_q, s_k=self.s_k, d=self.d)
        if self.backward and not self.flash:
            raise ValueError("attention backward=True without flash: the fused kernel's gradient "
                             "(FlashAttentionScoreGrad) is a FlashAttention kernel. Fix: flash=True, or cost the "
                             "unfused gradient as its GEMMs and softmax gradient")

    @property
    def unit(self) -> str:
        return "cube+vector"

    @property
    def dtypes(self) -> tuple[str, str]:
        return self.dtype, "fp32"  # scores, the online softmax and the running output in fp32

    @property
    def op(self) -> str:
        if self.backward:
            return "FlashAttentionScoreGrad"
        return "FlashAttentionScore" if self.flash else "UnfusedAttention(BatchMatMul+SoftmaxV2+BatchMatMul)"


@dataclass(frozen=True)
class IncreAttentionKernel(KernelSpec):
    """IncreFlashAttention (PagedAttention), one decode step: for each of ``seqs`` sequences, the
    ``group`` query heads sharing a KV head attend over its ``context`` cached tokens (GQA packs
    them as the rows of one block, so the cache is read once per KV head). ``kv_dtype`` is what the
    cache holds; an int8 cache halves a memory-bound kernel's bytes. ``actual_lengths``: the call
    passes actual_seq_lengths, so the kernel reads only each cache's used part (``context`` is that
    part); without them it reads the whole cache tensor it is given (``context`` is its length).
    ``preallocated``: the cache is a tensor of fixed shape written in place (False: a cache grown by
    concatenation, a new shape every step)."""

    kind: ClassVar[str] = "incre_attention"
    seqs: int
    kv_heads: int
    group: int
    context: int
    d: int
    dtype: str
    kv_dtype: str = "fp16"
    actual_lengths: bool = True      # the call passes actual_seq_lengths (the kernel reads only each cache's used part)
    preallocated: bool = True        # a fixed-shape cache written in place (not concatenated each step)

    def __post_init__(self):
        _positive("IncreFlashAttention", seqs=self.seqs, kv_heads=self.kv_heads, group=self.group,
                  context=self.context, d=self.d)
        if self.kv_dtype not in ("fp16", "bf16", "int8"):
            raise ValueError(f"IncreFlashAttention kv_dtype {self.kv_dtype!r}: the KV cache holds fp16, bf16 or int8")

    @property
    def unit(self) -> str:
        return "cube+vector"

    @property
    def dtypes(self) -> tuple[str, str]:
        return self.kv_dtype, "fp32"

    @property
    def op(self) -> str:
        return "IncreFlashAttention"

    @property
    def value_tiling(self) -> bool:
        return self.actual_lengths

    @property
    def ifa_overhead(self) -> bool:
        return self.preallocated


@dataclass(frozen=True)
class MoeGatingKernel(KernelSpec):
    """MoeGatingTopK over ``tokens`` tokens' scores of ``experts`` experts: the score function
    (``router``: softmax or sigmoid), ``top_k`` rounds of a row max and a mask, the kept weights
    renormalised, on the Vector unit in ``dtype``."""

    kind: ClassVar[str] = "moe_gating"
    tokens: int
    experts: int
    top_k: int
    router: str = "softmax"
    dtype: str = "fp32"

    def __post_init__(self):
        _positive("MoeGatingTopK", tokens=self.tokens, experts=self.experts, top_k=self.top_k)
        if self.router not in ("softmax", "sigmoid"):
            raise ValueError(f"MoeGatingTopK router {self.router!r}: softmax or sigmoid")

    @property
    def unit(self) -> str:
        return "vector"

    @property
    def dtypes(self) -> tuple[str, str]:
        return self.dtype, self.dtype

    @property
    def op(self) -> str:
        return "MoeGatingTopK"


@dataclass(frozen=True)
class CollectiveKernel(KernelSpec):
    """One HCCL collective (``op``: allreduce, allgather, reducescatter, alltoall, broadcast) of
    ``nbytes`` per card over ``cards`` cards of ``topology``, costed by
    `pypto_lab.hw.collectives.collective`; its launch is HCCL's (the topology's), inside its time."""

    kind: ClassVar[str] = "collective"
    op: str
    nbytes: int
    cards: int
    topology: Topology | None

    def __post_init__(self):
        if self.op not in COLLECTIVE_KINDS:
            raise ValueError(f"collective {self.op!r}: one of {', '.join(COLLECTIVE_KINDS)}")
        _positive("collective", cards=self.cards)
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise ValueError(f"collective nbytes = {self.nbytes!r}: an integer number of bytes >= 0")
        if self.cards > 1 and self.topology is None:
            raise ValueError(f"a collective over {self.cards} cards needs a topology (pypto_lab.hw.topology)")

    @property
    def unit(self) -> str:
        return "comm"

    @property
    def name(self) -> str:
        return {"allreduce": "AllReduce", "allgather": "AllGather", "reducescatter": "ReduceScatter",
                "alltoall": "AlltoAll", "broadcast": "Broadcast"}[self.op]


@dataclass(frozen=True)
class TransDataKernel(KernelSpec):
    """A format conversion of ``numel`` elements (a GM -> UB -> GM copy)."""

    kind: ClassVar[str] = "transdata"
    numel: int
    dtype: str
    src_format: str
    dst_format: str
    l2_reads: int = 0                # bytes of its input an earlier kernel left in L2 (`l2_residency` pass)
    l2_writes: int = 0               # bytes of its result that stay in L2 for their readers

    def __post_init__(self):
        _l2_bytes("TransData", self.l2_reads, self.l2_writes)

    @property
    def unit(self) -> str:
        return "move"

    @property
    def dtypes(self) -> tuple[str, str]:
        return self.dtype, self.dtype

    @property
    def op(self) -> str:
        return "TransData"


@dataclass(frozen=True)
class TransposeKernel(TransDataKernel):
    """A TransposeD that runs as its own kernel on an ND tensor of ``numel`` elements (a GM -> UB ->
    GM copy, like a TransData): a Reshape + Transpose pair that GE cannot fuse into a
    ConfusionTransposeD (`passes.layout.unfused_transposes`)."""

    kind: ClassVar[str] = "transpose"

    @property
    def op(self) -> str:
        return "TransposeD"


@dataclass(frozen=True)
class HostKernel(KernelSpec):
    """An operator the lowering table does not know, run on the host: its inputs go device -> host and
    its outputs host -> device over the card's link (the CPU's own compute time is not modelled)."""

    kind: ClassVar[str] = "host"
    op: str                          # the ATen target
    bytes_in: int
    bytes_out: int

    @property
    def unit(self) -> str:
        return "cpu"


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype (a torch dtype name) of a custom operator's tensor argument."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class CustomKernel(KernelSpec):
    """A user operator (`pypto_lab.custom_op`) costed from what it declared: a cost function called
    with its arguments as meta tensors, or its flops / bytes on the Vector unit or as data movement.
    ``args`` are the captured arguments (tensors as `TensorMeta`), ``declared_unit`` the unit it
    was registered on."""

    kind: ClassVar[str] = "custom"
    name: str
    declared_unit: str
    args: tuple[Any, ...]
    out: tuple[TensorMeta, ...]
    dtype: str                       # the dtype GM holds its tensors in
    cost_fn: Callable | None = None
    flops: float | None = None
    nbytes: float | None = None

    @property
    def unit(self) -> str:
        return self.declared_unit

    @property
    def op(self) -> str:
        return self.name


@dataclass(frozen=True)
class Decomposed(KernelSpec):
    """A composite operator run as its primitives, one kernel each (a GM round trip between them)."""

    kind: ClassVar[str] = "decomposed"
    op: str
    parts: tuple[KernelSpec, ...]

    @property
    def unit(self) -> str:
        units = {p.unit for p in self.parts}
        return units.pop() if len(units) == 1 else "vector"

    @property
    def dtypes(self) -> tuple[str | None, str | None]:
        return self.parts[0].dtypes


@dataclass(frozen=True)
class Kernel:
    """One kernel of a model: its spec, where it comes from (``name``, e.g. "Conv2D:layer1.0.conv1"),
    the graph nodes it computes and their ATen targets (views excluded)."""

    name: str
    spec: KernelSpec
    nodes: tuple[str, ...]
    fused_ops: tuple[str, ...]
    anchor: str

    @property
    def unit(self) -> str:
        return self.spec.unit


__all__ = ["AttentionKernel", "CollectiveKernel", "CubeKernel", "CustomKernel", "Decomposed", "HostKernel",
           "IncreAttentionKernel", "InputQuant", "Kernel", "KernelSpec", "MoeGatingKernel",
           "TensorMeta", "TransDataKernel", "TransposeKernel", "VectorKernel"]
