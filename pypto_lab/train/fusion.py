"""Vector fusion in a training step: chains of Vector kernels of the joint graph run as one kernel.

In eager torch_npu every ATen op of the step is its own kernel: an RMSNorm is six (pow, mean, add,
rsqrt, mul, mul), each reading its inputs from GM and writing its result back. Training stacks
that care fuse them: MindSpeed's ``--use-fused-rmsnorm``, ``--use-fused-swiglu`` and
``--use-fused-rotary-pos-emb`` call single kernels (``npu_rms_norm``, ``npu_swiglu``,
``npu_rotary_mul``) forward and backward, and graph-mode compilers (CANN GE, MindSpore's graph
kernel fusion) fuse element-wise chains on their own. `fuse_vector_chains` models the mechanism,
not a list of patterns: walking the phase's nodes in order, a node whose only kernel is a Vector
kernel joins the open chain when it reads a tensor the chain produced or reads (a rotary
embedding's ``x * cos`` and ``rotate_half(x) * sin`` both read ``x``) and works on the same rows
(one size divides the other: a row reduction such as RMSNorm's mean, or a per-row scale
broadcast back). Another Vector node starts a new chain. A kernel that only makes a constant
(``Fill``) is no kernel under fusion: the fused kernel broadcasts the scalar in UB. A node that
is not a Vector kernel (a matmul, attention) and does not read the open chain runs before it,
and the chain stays open; one that reads the chain closes it first, so every kernel still runs
after the kernels it reads.

The fused kernel streams in every tensor the chain reads from outside it, keeps the intermediates
in the Unified Buffer, and writes back each member's result that something outside the chain
still reads (the backward's saved tensors, the next matmul's input, a returned gradient): in
element units, ``inputs`` = (elements read + elements written beyond the one output) / the
chain's element count, rounded up. Row reductions inside a chain keep their rows whole in UB,
as the fused RMSNorm kernel does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ..kernels.ir import KernelSpec, VectorKernel
from .capture import tensor_of

# Vector kernels that move data by index or produce it from nothing: not fused into a chain
UNFUSED = frozenset({"Gather", "UnsortedSegmentSum", "MaxPoolWithArgmax", "MaxPoolGradWithArgmax",
                     "NLLLoss", "NLLLossGrad"})
# kernels that only make a constant (``ones_like`` for SiLU's gradient): inside a fused kernel
# the constant is a scalar broadcast in UB, no kernel of its own
CONSTANTS = frozenset({"Fill"})


def consumers_of(nodes: Iterable[torch.fx.Node], base: dict) -> dict[torch.fx.Node, set[torch.fx.Node]]:
    """Every node's readers across the whole graph, through views (a view's readers read its base);
    the graph's output node counts as a reader (a returned gradient, say)."""
    out: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    for n in nodes:
        if base.get(n, n) is not n:   # a view: its readers are counted against the base
            continue
        for a in n.all_input_nodes:
            out.setdefault(base.get(a, a), set()).add(n)
    return out


def _fusible(specs: list[KernelSpec]) -> VectorKernel | None:
    if len(specs) != 1 or not isinstance(specs[0], VectorKernel):
        return None
    spec = specs[0]
    if spec.op in UNFUSED or spec.op.startswith("Unmapped("):
        return None
    return spec


def _numel(node: torch.fx.Node) -> int:
    t = tensor_of(node)
    return 0 if t is None else int(t.numel())


class _Chain:
    def __init__(self, node, spec: VectorKernel, sharded: bool, base: dict):
        self.nodes: list = []
        self.members: set = set()
        self.reads: set = set()     # every tensor a member reads
        self.specs: list[VectorKernel] = []
        self.sharded = sharded
        self.numel = spec.numel
        self.add(node, spec, base, sharded)

    def feeds(self, node, base: dict) -> bool:
        """Whether ``node`` reads a tensor this chain produces."""
        return any(base.get(a, a) in self.members for a in node.all_input_nodes)

    def accepts(self, node, spec: VectorKernel, sharded: bool, base: dict) -> bool:
        ins = {base.get(a, a) for a in node.all_input_nodes}
        if not (ins & self.members or ins & self.reads):   # connected: reads the chain's result or its input
            return False
        big, small = max(self.numel, spec.numel), min(self.numel, spec.numel)
        return big % small == 0

    def add(self, node, spec: VectorKernel, base: dict, sharded: bool = False) -> None:
        self.sharded = self.sharded and sharded   # a chain with an unsplit member counts unsplit sizes
        self.nodes.append(node)
        self.members.add(node)
        self.reads |= {base.get(a, a) for a in node.all_input_nodes}
        self.specs.append(spec)
        self.numel = max(self.numel, spec.numel)

    def kernel(self, consumers: dict, base: dict, tp: int) -> VectorKernel:
        if len(self.specs) == 1:
            return self.specs[0]
        members = self.members
        scale = tp if self.sharded else 1
        read: dict[torch.fx.Node, int] = {}
        for n in self.nodes:
            for a in n.all_input_nodes:
                b = base.get(a, a)
                if b not in members and _numel(b) > 1:
                    read[b] = _numel(b) // scale
        written = [n for n in self.nodes
                   if n is self.nodes[-1] or any(c not in members for c in consumers.get(n, ()))]
        extra = sum(max(1, _numel(n) // scale) for n in written) - max(1, _numel(self.nodes[-1]) // scale)
        inputs = max(1, math.ceil((sum(read.values()) + max(0, extra)) / self.numel))
        rows = [s.row_len for s in self.specs if s.row_len]
        half = {s.dtype for s in self.specs} - {"fp32"}
        return VectorKernel(
            op="+".join(s.op for s in self.specs), ops=tuple(o for s in self.specs for o in s.ops), numel=self.numel,
            dtype=half.pop() if half else "fp32",
            compute_dtype="fp32" if any(s.compute_dtype == "fp32" for s in self.specs) else self.specs[0].compute_dtype,
            inputs=inputs, row_len=max(rows) if rows else None)


def fuse_vector_chains(items: list[tuple[torch.fx.Node, list[KernelSpec], bool]], consumers: dict, base: dict,
                       tp: int = 1) -> list[tuple[list[torch.fx.Node], list[KernelSpec]]]:
    """Group one phase's ``(node, kernel specs, sharded)`` items, in order, into kernels: each
    result is (the nodes it covers, their kernel specs), a fused chain giving one Vector kernel."""
    out: list[tuple[list[torch.fx.Node], list[KernelSpec]]] = []
    chain: _Chain | None = None

    def close() -> None:
        nonlocal chain
        if chain is not None:
            out.append((chain.nodes, [chain.kernel(consumers, base, tp)]))
            chain = None

    for node, specs, sharded in items:
        spec = _fusible(specs)
        if spec is None:
            # a node the chain does not feed runs first and the chain stays open (SwiGLU's multiply
            # comes after the up-projection's matmul in the graph's order); one it feeds closes it
            if chain is not None and chain.feeds(node, base):
                close()
            out.append(([node], specs))
            continue
        if spec.op in CONSTANTS:
            out.append(([node], []))
            continue
        if chain is not None and chain.accepts(node, spec, sharded, base):
            chain.add(node, spec, base, sharded)
            continue
        close()
        chain = _Chain(node, spec, sharded, base)
    close()
    return out
