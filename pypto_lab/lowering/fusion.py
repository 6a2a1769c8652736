"""Vector fusion: chains of Vector kernels run as one kernel, their intermediates kept in UB.

One mechanism for every front end: the ``fuse_elementwise`` pass runs it over a captured model's
graph, and a training step runs it over each phase of its joint graph when the stack fuses
(`pypto_lab.train.step`; MindSpeed's ``--use-fused-rmsnorm``, ``--use-fused-swiglu``,
``--use-fused-rotary-pos-emb`` call single kernels forward and backward, graph-mode compilers fuse
element-wise chains on their own). In eager torch_npu every ATen op is its own kernel: an
RMSNorm is six (pow, mean, add, rsqrt, mul, mul), each reading its inputs from GM and writing its
result back.

`fuse_vector_chains` walks a graph's nodes in order, with any number of chains open. A node
whose only kernel is a Vector kernel the rule admits joins the first open chain it reads a tensor
of (one the chain produced or reads: a rotary embedding's ``x * cos`` and ``rotate_half(x) * sin``
both read ``x``) and works on the same rows with (one size divides the other: a row reduction
such as RMSNorm's mean, or a per-row scale broadcast back); an admitted node that joins none
starts a new chain. A node that is not admitted (a matmul, attention, a gather) runs before the
open chains it does not read, and they stay open; the chains it reads close first, and so do the
other chains a joining node reads, so every kernel still runs after the kernels it reads. Under a rule that folds constants, a kernel that only makes a constant (``Fill``) is no
kernel: the fused kernel broadcasts the scalar in UB.

What may join is the rule's (`FusionRule`): the inference pass admits element-wise kernels only
(`ELEMENTWISE`; its row-wise neighbours have fusion passes of their own, ``fuse_layernorm`` and
the like), a training step element-wise and row-wise kernels alike (`VECTOR_CHAINS`).

The fused kernel (`chain_kernel`) runs every member's Vector operators on each tile, streams in
every tensor the chain reads from outside it and writes back the last member's result and each
other member's result that something outside the chain still reads (the backward's saved
tensors, the next matmul's input, a graph output), both counted by `lower.stream_count`. Row
reductions inside a chain keep their rows whole in UB, as the fused RMSNorm kernel does.

The graph is seen through `ChainGraph`: what a node reads (views resolved to the tensor they
alias), who reads a tensor, and its size, so one walk serves a `capture.Graph` and an fx joint
graph alike.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..kernels.ir import KernelSpec, VectorKernel
from .lower import stream_count


class ChainGraph(Protocol):
    """The graph as fusion sees it; a node's ``value`` is the tensor it produces."""

    def value(self, node) -> Hashable: ...
    def reads(self, node) -> set[Hashable]: ...          # tensors it reads, views resolved
    def readers(self, value: Hashable) -> Iterable: ...  # the values of the nodes reading a tensor, and an
    #                                                        output marker when the graph returns it
    def numel(self, value: Hashable) -> int: ...


# Vector operators (`pypto_lab.hw.kernels.VECTOR_OPS`) that work element by element
ELEMENTWISE_VECTOR_OPS = frozenset({"add", "sub", "mul", "div", "relu", "exp", "sqrt", "rsqrt", "cast", "gelu",
                                    "add_relu"})
# Vector kernels that move data by index, pool windows or reduce a loss: never a chain member
UNFUSED = frozenset({"GatherV2", "GatherElements", "UnsortedSegmentSum", "MaxPoolWithArgmax",
                     "MaxPoolGradWithArgmax", "NLLLoss", "NLLLossGrad"})
CONSTANTS = frozenset({"Fill"})   # kernels that only make a constant


@dataclass(frozen=True)
class FusionRule:
    """Which Vector kernels may join a chain (``admits``), and whether a constant-making kernel
    (``Fill``) is folded into the chains as a scalar broadcast in UB (``folds_constants``)."""

    name: str
    admits: Callable[[VectorKernel], bool]
    folds_constants: bool = False


def is_elementwise(spec: VectorKernel) -> bool:
    return spec.op not in UNFUSED and all(o in ELEMENTWISE_VECTOR_OPS for o in spec.ops)


def is_vector_chain_member(spec: VectorKernel) -> bool:
    return spec.op not in UNFUSED


ELEMENTWISE = FusionRule("elementwise", is_elementwise)
VECTOR_CHAINS = FusionRule("vector chains", is_vector_chain_member, folds_constants=True)


def chain_kernel(specs: list[VectorKernel], numel: int, reads: list[int], extra_writes: list[int]) -> VectorKernel:
    """The one Vector kernel of a chain of ``specs`` over ``numel`` elements that reads tensors of
    ``reads`` elements from outside it and writes ``extra_writes``-element results beyond its last
    (each counted by `stream_count`)."""
    if len(specs) == 1:
        return specs[0]
    rows = [s.row_len for s in specs if s.row_len]
    half = {s.dtype for s in specs} - {"fp32"}
    return VectorKernel(
        op="+".join(dict.fromkeys(s.op for s in specs)), ops=tuple(o for s in specs for o in s.ops), numel=numel,
        dtype=half.pop() if half else "fp32",
        compute_dtype="fp32" if any(s.compute_dtype == "fp32" for s in specs) else specs[0].compute_dtype,
        inputs=stream_count(reads + extra_writes, numel), row_len=max(rows) if rows else None)


class _Chain:
    def __init__(self, graph: ChainGraph, node, spec: VectorKernel, sharded: bool):
        self.graph = graph
        self.nodes: list = []
        self.values: set = set()    # the tensors the members produce
        self.reads: set = set()     # every tensor a member reads
        self.specs: list[VectorKernel] = []
        self.sharded = sharded
        self.numel = spec.numel
        self.add(node, spec, sharded)

    def feeds(self, node) -> bool:
        """Whether ``node`` reads a tensor this chain produces."""
        return bool(self.graph.reads(node) & self.values)

    def accepts(self, node, spec: VectorKernel) -> bool:
        ins = self.graph.reads(node)
        if not (ins & self.values or ins & self.reads):   # connected: reads the chain's result or its input
            return False
        big, small = max(self.numel, spec.numel), min(self.numel, spec.numel)
        return big % small == 0

    def add(self, node, spec: VectorKernel, sharded: bool = False) -> None:
        self.sharded = self.sharded and sharded   # a chain with an unsplit member counts unsplit sizes
        self.nodes.append(node)
        self.values.add(self.graph.value(node))
        self.reads |= self.graph.reads(node)
        self.specs.append(spec)
        self.numel = max(self.numel, spec.numel)

    def kernel(self, tp: int) -> VectorKernel:
        if len(self.specs) == 1:
            return self.specs[0]
        g = self.graph
        scale = tp if self.sharded else 1
        reads = {v: g.numel(v) // scale for n in self.nodes for v in g.reads(n) if v not in self.values}
        extra = [g.numel(g.value(n)) // scale for n in written_members(self.nodes, g)
                 if n is not self.nodes[-1]]
        return chain_kernel(self.specs, self.numel, list(reads.values()), extra)


def fuse_vector_chains(items: list[tuple[object, list[KernelSpec], bool]], graph: ChainGraph, rule: FusionRule,
                       tp: int = 1) -> list[tuple[list, list[KernelSpec]]]:
    """Group ``(node, kernel specs, sharded)`` items, in the order they run, into kernels: each
    result is (the nodes it covers, their kernel specs), a fused chain giving one Vector kernel.
    ``sharded`` items' specs are one of ``tp`` tensor-parallel cards' share of the graph's sizes."""
    out: list[tuple[list, list[KernelSpec]]] = []
    open_chains: list[_Chain] = []

    def close(chains: list[_Chain]) -> None:
        for c in chains:
            out.append((c.nodes, [c.kernel(tp)]))
            open_chains.remove(c)

    for node, specs, sharded in items:
        spec = specs[0] if len(specs) == 1 and isinstance(specs[0], VectorKernel) else None
        if spec is not None and rule.folds_constants and spec.op in CONSTANTS:
            out.append(([node], []))
            continue
        fed = [c for c in open_chains if c.feeds(node)]
        if spec is None or not rule.admits(spec):
            # a node no chain feeds runs first and the chains stay open (SwiGLU's multiply comes
            # after the up-projection's matmul in the graph's order); the chains it reads close first
            close(fed)
            out.append(([node], specs))
            continue
        target = next((c for c in open_chains if c.accepts(node, spec)), None)
        close([c for c in fed if c is not target])   # other chains it reads run before the one it joins
        if target is not None:
            target.add(node, spec, sharded)
        else:
            open_chains.append(_Chain(graph, node, spec, sharded))
    close(list(open_chains))
    return out


def written_members(nodes: list, graph: ChainGraph) -> list:
    """The members of a fused chain whose result is written to GM (the last, and every one read
    outside the chain)."""
    values = {graph.value(n) for n in nodes}
    return [n for n in nodes if n is nodes[-1] or any(r not in values for r in graph.readers(graph.value(n)))]


__all__ = ["CONSTANTS", "ELEMENTWISE", "ELEMENTWISE_VECTOR_OPS", "UNFUSED", "VECTOR_CHAINS", "ChainGraph",
           "FusionRule", "chain_kernel", "fuse_vector_chains", "is_elementwise", "is_vector_chain_member",
           "written_members"]
