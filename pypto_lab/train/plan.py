"""A training step's joint graph as the kernels one card runs, segment by segment: `StepPlan`.

Every forward and backward node of the captured step is lowered by the one lowering table
(`pypto_lab.lowering.table`, under the step's AMP policy), its attention run as FlashAttention when
the stack or the caller asks for it, its Vector chains fused when the stack fuses
(`pypto_lab.lowering.fusion`), its share split over the tensor-parallel cards Megatron style, and
costed by the chip model (Cube kernels with the tile search's best candidate). The result is a list
of `Unit`\\s per phase, each attributed to a **segment** of the model: the part before the first
repeated block (``PRE``: embeddings, a CNN's stem), each repeated block (a transformer layer,
a ResNet bottleneck; `pypto_lab.train.capture.block_names`), and the part after the last (``post``:
the final norm, the head and the loss). Pipeline stages, recomputation, ZeRO-3's per-layer
gathers and a model built with fewer layers than it has (`pypto_lab.train.compose`) all work on
segments.

Forward nodes belong to the block of the last parameter the forward consumed up to them. The
backward runs the blocks in reverse, each as one contiguous run of nodes, so a backward node
belongs to the segment of the last parameter read, or saved activation read that only its own
block's forward reads, up to it (a block's input, which the previous block made, does not move the
boundary): the gradient GEMMs of a layer's output projection open its backward, its input norm's
gradient closes it.

Memory parts per segment: the activations the backward reads (views resolved; the ``s x s``
attention scores left out under FlashAttention, which never writes them), each block's input (what
full recomputation keeps), and the parameters, split over the tensor-parallel cards where Megatron
splits them (the blocks' weights; the vocabulary-sized embedding and output layer).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..hw.chip import Chip
from ..kernels.cost import KernelCost, cost
from ..kernels.ir import AttentionKernel, CollectiveKernel, CubeKernel, HostKernel, KernelSpec, VectorKernel
from ..kernels.tile_search import candidate_tilings, search_tiling
from ..lowering.fusion import VECTOR_CHAINS, fuse_vector_chains
from ..lowering.table import lower_fx_node
from ..stack import DEFAULT_TRAIN_STACK, Stack, get_stack
from .capture import JointChains, StepGraph, block_names, forward_blocks, tensor_of
from .moe import GROUPED, MoeGraph, grouped_dims, local_experts
from .parallel import group_topology
from .policy import Policy
from .qat import fake_quant_kernels

PRE = -1


@dataclass(frozen=True)
class Unit:
    """One kernel one card runs per micro-batch, and where it sits: its phase ("forward" or
    "backward"), its segment (``PRE``, a block's index in the capture, or the plan's ``post``),
    whether it is a collective (HCCL's launch, no stack launch), the parameters whose gradient it
    completes, and whether it is the attention core (``attention``: ring attention under context
    parallelism, what selective recomputation reruns)."""

    name: str
    phase: str
    spec: KernelSpec
    cost: KernelCost
    seg: int
    collective: bool = False
    grads: tuple[str, ...] = ()
    attention: bool = False
    sync: bool = False          # a host sync: the host waits for the device, then reads a value back
    ep: bool = False            # an expert-parallel all-to-all (dispatch or combine of a MoE layer)

    @property
    def time_us(self) -> float:
        return self.cost.time_us


def tuned(spec: KernelSpec, chip: Chip, strategy: str = "exact") -> KernelCost:
    """A kernel's cost: Cube kernels with the fastest tiling of the tile search's level-3 candidates
    (what ``optimize`` at level 3 runs; CANN's training operators are tuned too); other kernels by
    ``strategy`` ("grid": `pypto_lab.kernels.grid`, fused attention over many heads from fewer)."""
    if isinstance(spec, CubeKernel):
        key = (id(chip), spec)
        if key not in _TUNED:
            _TUNED[key] = search_tiling(spec, chip, candidate_tilings(chip, spec)).best
        return _TUNED[key]
    return cost(spec, chip, strategy)


_TUNED: dict[tuple[int, CubeKernel], KernelCost] = {}


def lower_node(node: torch.fx.Node, chip: Chip, policy: Policy) -> tuple[list[KernelSpec], bool]:
    """The kernel specs one joint-graph node runs as (the lowering table's, under ``policy``), and
    whether the table knows its op (False: the host fallback). A scaled-dot-product attention op
    runs fused (torch_npu's npu_fusion_attention)."""
    specs, known = lower_fx_node(node, chip, policy.precision)
    return [replace(s, flash=True) if isinstance(s, AttentionKernel) and not s.flash else s for s in specs], known


def policy_dtype(specs: list[KernelSpec]) -> str:
    """The Cube dtype of a node's kernels (the attention GEMM's)."""
    return next((sp.dtype for sp in specs if isinstance(sp, CubeKernel)), "fp16")


@dataclass
class StepPlan:
    """One captured step's kernels and memory parts on one card (see the module docstring)."""

    step: StepGraph
    name: str
    chip: Chip
    tp: int
    hidden: int | None
    topology: Any
    policy: Policy
    flash: bool = False
    causal: bool = False                 # the attention is causal (a causal LM): FlashAttention skips masked blocks
    sequence_parallel: bool = False
    vocab: int | None = None
    fuse_vector: bool = False
    mc2: bool = False
    stack: Stack = field(default_factory=lambda: get_stack(DEFAULT_TRAIN_STACK))
    strategy: str = "exact"              # how kernels other than GEMMs are costed (`tuned`)
    ep: int = 1                          # expert-parallel ranks (`pypto_lab.train.moe`)

    def __post_init__(self):
        step = self.step
        self.moe = MoeGraph.of(step)
        self.chains = JointChains(step) if self.fuse_vector else None
        self.blocks = forward_blocks(step)
        self.param_blocks = block_names(list(step.params))
        self.act = {"fp32": 4, "fp16": 2, "bf16": 2}[self.policy.act_dtype]
        self.tokens = step.batch * (step.tokens or 1)
        self.block_params = {n for p, n in step.params.items() if self.param_blocks.get(p)}
        self.backward_in_block: dict[torch.fx.Node, bool] = {}   # `_in_block`'s memo for backward nodes
        # parameters split over the tensor-parallel group: the blocks', and the vocabulary-sized
        # embedding and LM head (Megatron's VocabParallelEmbedding and parallel output layer)
        self.split_params = {p for p, n in step.params.items() if self.param_blocks.get(p) or (
            self.vocab and tensor_of(n) is not None and tensor_of(n).shape[0] == self.vocab)}
        seq = step.tokens
        self.scores: set[torch.fx.Node] = set()
        self.score_like: set[torch.fx.Node] = set()   # the s x s tensors whatever runs the attention
        if seq and seq > 1:
            for n in step.forward + step.backward:
                v = tensor_of(n)
                # (b x heads) s x s matrices, not a (b, s, hidden) state whose hidden size is s
                if (v is not None and v.dim() >= 3 and v.shape[-1] == v.shape[-2] == seq
                        and math.prod(v.shape[:-2]) > step.batch):
                    self.score_like.add(n)
        if self.flash:   # the s x s attention scores FlashAttention never writes to GM
            self.scores = set(self.score_like)
        self._segments()
        self._units: tuple[list[Unit], list[Unit], dict[str, int], tuple[int, int]] | None = None

    # ---- segments ----
    def _segments(self) -> None:
        """``block_order`` (the captured blocks in forward order), ``post``, and each forward node's,
        backward node's and parameter's segment (see the module docstring)."""
        step = self.step
        order: list[str] = []
        for n in step.forward:
            b = self.blocks.get(n)
            if b and b not in order:
                order.append(b)
        self.block_order = order
        index = {b: i for i, b in enumerate(order)}
        self.post = len(order)
        last_block = max((k for k, n in enumerate(step.forward) if self.blocks.get(n)), default=-1)
        fseg: dict[torch.fx.Node, int] = {}
        current = PRE
        for k, n in enumerate(step.forward):
            b = self.blocks.get(n)
            if b:
                current = index[b]
            elif order and k > last_block:
                current = self.post
            fseg[n] = current
        self.fseg = fseg
        pnode = {n: p for p, n in step.params.items()}
        pseg: dict[str, int] = {}
        for p, node in step.params.items():
            b = self.param_blocks.get(p)
            if b in index:
                pseg[p] = index[b]
                continue
            readers = [fseg[u] for u in node.users if u in fseg]
            readers += [fseg[v] for u in node.users for v in u.users if step.base.get(u) is node and v in fseg]
            pseg[p] = min(readers) if readers else (self.post if order else PRE)
        self.pseg = pseg
        # forward tensors read only inside their own block (a block's output, read by the next, is not)
        own: set[torch.fx.Node] = set()
        fwd = set(step.forward)
        for n in step.forward:
            s = fseg[n]
            if 0 <= s < self.post and all(fseg.get(u, s) == s for u in n.users if u in fwd):
                own.add(n)
        bseg: dict[torch.fx.Node, int] = {}
        current = self.post if order else PRE
        for n in step.backward:
            for a in n.all_input_nodes:
                b = step.base.get(a, a)
                if b in pnode:
                    current = pseg[pnode[b]]
                elif b in own and fseg[b] < current:
                    current = fseg[b]
            bseg[n] = current
        self.bseg = bseg

    def seg(self, node: torch.fx.Node, phase: str) -> int:
        return self.fseg.get(node, PRE) if phase == "forward" else self.bseg.get(node, PRE)

    # ---- FlashAttention ----
    def _touches_scores(self, node) -> bool:
        return any(self.step.base.get(a, a) in self.scores for a in node.all_input_nodes)

    def flash_specs(self, node, specs: list[KernelSpec], phase: str) -> list[KernelSpec] | None:
        """The kernels of a node under FlashAttention (None: not part of an attention). Forward:
        the GEMM that makes the scores becomes one fused attention kernel, and everything else on
        the scores (scale, mask, softmax, the GEMM that consumes them) is inside it. Backward: the
        four gradient GEMMs that touch the scores and the softmax gradient are one
        FlashAttentionScoreGrad kernel (it recomputes the scores and runs five GEMMs to the
        forward's two, `pypto_lab.hw.attention_grad`), placed at the GEMM that makes the
        probabilities' gradient (the only backward GEMM with an s x s result). A causal
        LM's attention is causal: the fused kernel computes only the blocks on and below the
        diagonal (npu_fusion_attention's lower-triangular band: ModelLink passes
        ``next_tockens=0``; MindSpeed docs/zh/features/generate-mask.md: the compressed
        lower-triangular mask, ``sparse_mode=2``, "greatly improves performance")."""
        if not self.scores or not (node in self.scores or self._touches_scores(node)):
            return None
        if str(node.target) != "aten.bmm.default":
            return []
        q = tensor_of(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        out = tensor_of(node)
        seq = self.step.tokens
        if phase == "forward":
            if node not in self.scores or q is None:
                return []
            bh, s_q, d = q.shape
            return [AttentionKernel(batch_heads=bh, s_q=s_q, s_k=out.shape[-1], d=d, dtype=policy_dtype(specs),
                                    flash=True, causal=self.causal)]
        cube = [sp for sp in specs if isinstance(sp, CubeKernel)]
        if not cube or node not in self.scores:   # dV, dQ, dK: inside the one gradient kernel
            return []
        bh = cube[0].batch                        # dP = dO V^T, the gradient GEMM that makes an s x s tensor
        d = min(cube[0].m, cube[0].k, cube[0].n, key=lambda v: (v == seq, v))
        return [AttentionKernel(batch_heads=bh, s_q=seq, s_k=seq, d=d, dtype=cube[0].dtype, flash=True,
                                causal=self.causal, backward=True)]

    # ---- tensor parallelism ----
    def sharded(self, node) -> bool:
        """Whether Megatron-style tensor parallelism splits this node's work over the ``tp`` cards:
        every node inside a transformer block except those on the replicated hidden state
        (LayerNorm, residual adds and dropout on tokens x hidden), which sequence parallelism
        splits along the tokens as well (Korthikanti et al. 2022); and the logits, split over the
        vocabulary."""
        if self.tp == 1:
            return False
        out = tensor_of(node)
        if self.vocab and out is not None and out.dim() >= 2 and out.shape[-1] == self.vocab:
            return True   # the vocabulary-parallel LM head and its loss (Megatron's parallel cross-entropy)
        if not self._in_block(node):
            return False
        if self.sequence_parallel:   # the hidden state's own ops split along the sequence too
            return True
        if out is None:
            return True
        return not (out.shape[-1] == self.hidden and out.numel() == self.tokens * self.hidden)

    def _in_block(self, node) -> bool:
        if node in self.blocks:
            return self.blocks[node] is not None
        # backward nodes: in a block when they touch a block's tensors (its parameters or saved
        # values) or a gradient computed from them (SiLU's 1 - sigmoid reads only the recomputed
        # sigmoid); memoised, the backward visits its nodes in order
        memo = self.backward_in_block
        hit = memo.get(node)
        if hit is None:
            hit = memo[node] = any(
                self.blocks.get(b) or b in self.block_params or memo.get(b, False)
                for b in (self.step.base.get(a, a) for a in node.all_input_nodes))
        return hit

    def shard(self, spec: KernelSpec) -> KernelSpec:
        """The part of a kernel one of ``tp`` cards runs: a GEMM's non-token dimension (the heads,
        the intermediate size, or the weight's sharded side), attention's heads, or a vector
        kernel's elements."""
        tp = self.tp
        if isinstance(spec, CubeKernel):
            if spec.batch % tp == 0 and spec.batch > 1:
                return replace(spec, batch=spec.batch // tp)
            dims = {"m": spec.m, "k": spec.k, "n": spec.n}
            cand = [d for d, v in dims.items() if v != self.tokens and v % tp == 0]
            if not cand:
                return spec
            d = max(cand, key=lambda x: dims[x])
            return replace(spec, **{d: dims[d] // tp})
        if isinstance(spec, AttentionKernel):
            return replace(spec, batch_heads=max(1, spec.batch_heads // tp))
        if isinstance(spec, VectorKernel):
            rows = spec.row_len or 1
            numel = max(rows, (spec.numel // tp) // rows * rows)
            return replace(spec, numel=numel)
        return spec

    def tp_spec(self) -> KernelSpec:
        """The tensor-parallel collective of the hidden state, as a kernel spec (for the report)."""
        nbytes = int(self.tokens * self.hidden * self.act)
        return CollectiveKernel("reducescatter" if self.sequence_parallel else "allreduce", nbytes, self.tp,
                                self.topology)

    def tp_allreduce_us(self) -> float:
        """One all-reduce of the hidden state (tokens x hidden) over the tensor-parallel group; with
        sequence parallelism the same bytes move as a reduce-scatter and an all-gather."""
        nbytes = self.tokens * self.hidden * self.act
        if self.sequence_parallel:
            return (self.collective_us("reducescatter", nbytes, self.tp)
                    + self.collective_us("allgather", nbytes // self.tp, self.tp))
        return self.collective_us("allreduce", nbytes, self.tp)

    def collective_us(self, kind: str, nbytes: float, cards: int, topology=None) -> float:
        """One HCCL collective over ``cards`` cards (its `CollectiveKernel`), of ``topology`` (a
        group's, `pypto_lab.train.parallel.group_topology`) or the step's."""
        topo = topology if topology is not None else self.topology
        return cost(CollectiveKernel(kind, int(nbytes), cards, topo if cards > 1 else None), self.chip).time_us

    def tp_collective_us(self, gemm_us: float) -> float:
        """The critical-path time of one tensor-parallel collective next to a GEMM of ``gemm_us``.
        Without MC2 the whole collective. With MC2 (CANN's fused MatmulAllReduce / AllGatherMatmul /
        MatmulReduceScatter, MindSpeed's ``--use-mc2``) the collective and the GEMM beside it run
        as one kernel that computes the GEMM in ``tp`` chunks and communicates each finished
        chunk while the next is computed: the pair takes ``max(c, g) + min(c, g) / tp``, so what the
        collective adds to its GEMM ``g`` is that minus ``g``."""
        c = self.tp_allreduce_us()
        if not self.mc2:
            return c
        g = gemm_us
        return max(c, g) + min(c, g) / self.tp - g

    # ---- the kernels ----
    def units(self) -> tuple[list[Unit], list[Unit], dict[str, int], tuple[int, int]]:
        """(forward units, backward units, ops the table does not know with their counts, (fused
        Vector kernels, the ops they cover)); the tensor-parallel collectives of each block (two
        per phase: after attention and after the MLP, Megatron's) follow the block's kernels."""
        if self._units is None:
            unmapped: dict[str, int] = {}
            fused_count = [0, 0]
            fwd = self._lower(self.step.forward, "forward", unmapped, fused_count)
            bwd = self._lower(self.step.backward, "backward", unmapped, fused_count)
            for layer in self.step.fake_quant:   # QAT's fake quantisation (`pypto_lab.train.qat`)
                f, b = fake_quant_kernels(layer, self.policy)
                fwd += [Unit(f"{s.op}:{layer.name}", "forward", s, tuned(s, self.chip, self.strategy),
                             self.post if self.block_order else PRE) for s in f]
                bwd += [Unit(f"{s.op}:{layer.name}", "backward", s, tuned(s, self.chip, self.strategy), PRE)
                        for s in b]
            if self.tp > 1 and self.block_order:
                fwd, bwd = self._with_tp_collectives(fwd, "forward"), self._with_tp_collectives(bwd, "backward")
            if self.ep > 1 and self.moe.is_moe:
                fwd, bwd = self._with_ep_alltoalls(fwd, "forward"), self._with_ep_alltoalls(bwd, "backward")
            if self.step.host_syncs:   # values the forward reads back (`capture.scalar_reads`), at its start
                spec = HostKernel(op="aten._local_scalar_dense", bytes_in=8, bytes_out=0)
                kc = cost(spec, self.chip)
                fwd = [Unit("host sync: a value read back", "forward", spec, kc, PRE, sync=True)
                       for _ in range(self.step.host_syncs)] + fwd
            self._units = (fwd, bwd, unmapped, (fused_count[0], fused_count[1]))
        return self._units

    def _lower(self, nodes, phase: str, unmapped: dict[str, int], fused_count: list[int]) -> list[Unit]:
        chip, policy = self.chip, self.policy
        items = []
        for node in nodes:
            specs, mapped = lower_node(node, chip, policy)
            if not mapped:
                unmapped[str(node.target)] = unmapped.get(str(node.target), 0) + 1
            if node in self.moe.role:   # a MoE layer's routing op, named for the CANN MoE kernel doing its work
                specs = [replace(sp, op=self.moe.role[node]) if isinstance(sp, VectorKernel) else sp for sp in specs]
            if node in self.moe.grouped and self.ep > 1:
                specs = self.expert_share(node, specs)
            fused = self.flash_specs(node, specs, phase)
            if fused is not None:
                specs = fused
            sharded = bool(specs) and self.sharded(node)
            if sharded:
                specs = [self.shard(s) for s in specs]
            items.append((node, specs, sharded))
        units = (fuse_vector_chains(items, self.chains, VECTOR_CHAINS, self.tp) if self.fuse_vector
                 else [([node], specs) for node, specs, _ in items])
        if self.fuse_vector:
            chains = [u for u in units if len(u[0]) > 1 and u[1]]
            fused_count[0] += len(chains)
            fused_count[1] += sum(len(u[0]) for u in chains)
        grad_of: dict[torch.fx.Node, list[str]] = {}
        for p, g in self.step.grads.items():
            grad_of.setdefault(self.step.base.get(g, g), []).append(p)
        out: list[Unit] = []
        for covered, specs in units:
            seg = self.seg(covered[0], phase)
            label = covered[0].name if len(covered) == 1 else f"{covered[0].name}..{covered[-1].name}"
            grads = tuple(p for n in covered for p in grad_of.get(n, ()))
            attention = any(n in self.score_like or self._touches_scores(n)
                            or any(self.step.base.get(a, a) in self.score_like for a in n.all_input_nodes)
                            for n in covered)
            for i, spec in enumerate(specs):
                out.append(Unit(f"{getattr(spec, 'op', 'attention')}:{label}", phase, spec,
                                tuned(spec, chip, self.strategy), seg,
                                grads=grads if i == len(specs) - 1 else (),
                                attention=attention or isinstance(spec, AttentionKernel)))
            if not specs and grads:   # a gradient no kernel writes (a view): ready with the unit before it
                if out:
                    out[-1] = replace(out[-1], grads=out[-1].grads + grads)
        return out

    # ---- expert parallelism ----
    def expert_share(self, node, specs: list[KernelSpec]) -> list[KernelSpec]:
        """A grouped matmul's kernels on one of ``ep`` expert-parallel cards: the same routed rows
        (balanced routing: the all-to-all brings as many rows as the card sent away), over its
        ``E / ep`` experts (forward; backward: the input gradient, then the weight gradient)."""
        x, w = tensor_of(node.args[0]), tensor_of(node.args[1])
        if x is None or w is None or w.dim() != 3:
            return specs
        rows, (experts, k, n) = int(x.shape[0]), tuple(int(d) for d in w.shape)
        busy, per = grouped_dims(rows, local_experts(experts, self.ep))
        cube = [i for i, sp in enumerate(specs) if isinstance(sp, CubeKernel)]
        out = list(specs)
        if str(node.target) in GROUPED:
            for i in cube:
                out[i] = replace(out[i], batch=busy, m=per)
        elif len(cube) == 2:
            out[cube[0]] = replace(out[cube[0]], batch=busy, m=per, k=n, n=k)
            out[cube[1]] = replace(out[cube[1]], batch=busy, m=k, k=per, n=n)
        return out

    def moe_segments(self) -> list[int]:
        """The segments holding a MoE layer (a forward grouped matmul)."""
        return sorted({self.fseg[n] for n in self.step.forward if str(n.target) in GROUPED and n in self.fseg})

    def ep_alltoall(self, seg: int) -> CollectiveKernel:
        """One all-to-all of MoE segment ``seg``'s routed rows (tokens x top-k rows of the hidden
        size, the input of its first grouped matmul) over the ``ep`` ranks ``tp`` apart."""
        first = next(n for n in self.step.forward if str(n.target) in GROUPED and self.fseg.get(n) == seg)
        x = tensor_of(first.args[0])
        nbytes = int(x.shape[0] * x.shape[-1] * self.act)
        return CollectiveKernel("alltoall", nbytes, self.ep, group_topology(self.topology, self.ep, self.tp))

    def _with_ep_alltoalls(self, units: list[Unit], phase: str) -> list[Unit]:
        """Each MoE segment's two all-to-alls in ``phase``: the routed rows (their gradients in the
        backward) sent to the cards holding their experts before the segment's first grouped
        matmul, and the results sent back after its last; on the stream, so on the critical path."""
        gmm: dict[int, list[int]] = {}
        for i, u in enumerate(units):
            if isinstance(u.spec, CubeKernel) and u.spec.op == "GroupedMatmul" and 0 <= u.seg < self.post:
                gmm.setdefault(u.seg, []).append(i)
        before = {idx[0]: s for s, idx in gmm.items()}
        after = {idx[-1]: s for s, idx in gmm.items()}
        out: list[Unit] = []
        for i, u in enumerate(units):
            if i in before:
                out.append(self._ep_unit(before[i], phase, "dispatch" if phase == "forward" else "combine's gradient"))
            out.append(u)
            if i in after:
                out.append(self._ep_unit(after[i], phase, "combine" if phase == "forward" else "dispatch's gradient"))
        return out

    def _ep_unit(self, seg: int, phase: str, what: str) -> Unit:
        spec = self.ep_alltoall(seg)
        return Unit(f"EP alltoall ({what}) {phase} block {seg}", phase, spec, cost(spec, self.chip), seg,
                    collective=True, ep=True)

    def _with_tp_collectives(self, units: list[Unit], phase: str) -> list[Unit]:
        """Two tensor-parallel collectives per block in ``phase``, placed after the block's last
        kernel, each adding to its GEMM what MC2 cannot hide (`tp_collective_us`; the GEMM is the
        block's in-block Cube time of the phase shared over its two collectives)."""
        spec = self.tp_spec()
        cube: dict[int, float] = {}
        for u in units:
            if 0 <= u.seg < self.post and isinstance(u.spec, CubeKernel):
                cube[u.seg] = cube.get(u.seg, 0.0) + u.time_us
        last: dict[int, int] = {}
        for i, u in enumerate(units):
            if 0 <= u.seg < self.post:
                last[u.seg] = i
        out: list[Unit] = []
        ends = {i: s for s, i in last.items()}
        for i, u in enumerate(units):
            out.append(u)
            if i in ends:
                s = ends[i]
                t = self.tp_collective_us(cube.get(s, 0.0) / 2)
                kc = KernelCost(t * self.chip.clock_mhz, t, 0.0, {}, (), ("link",), bound="link")
                label = "TP allreduce" + (" (MC2, beyond its matmul)" if self.mc2 else "")
                out += [Unit(f"{label} {phase} block {s}.{j}", phase, spec, kc, s, collective=True) for j in range(2)]
        return out

    # ---- memory parts ----
    def act_bytes(self, node) -> int:
        v = tensor_of(node)
        if v is None:
            return 0
        size = v.numel() * (self.act if v.dtype.is_floating_point else v.element_size())
        return size // self.tp if self.sharded(node) else size

    def saved_by_segment(self) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
        """Per segment: the bytes of activations the backward reads (FlashAttention's scores left
        out), of those the s x s attention tensors (what selective recomputation drops), and each
        block's input (what full recomputation keeps)."""
        step = self.step
        saved: dict[int, int] = {}
        scores: dict[int, int] = {}
        for n in step.saved():
            if n in self.scores:
                continue
            s = self.fseg.get(n, PRE)
            b = self.act_bytes(n)
            saved[s] = saved.get(s, 0) + b
            if n in self.score_like:
                scores[s] = scores.get(s, 0) + b
        firsts: dict[int, int] = {}
        pnodes = set(step.params.values())
        for n in step.forward:
            s = self.fseg.get(n, PRE)
            if 0 <= s < self.post and s not in firsts:
                firsts[s] = max((self.act_bytes(a) for a in n.all_input_nodes
                                 if step.base.get(a, a) not in pnodes), default=0)
        return saved, scores, firsts

    @functools.cached_property
    def workspace_bytes(self) -> int:
        """Two of the backward's largest tensors (a gradient being written and the one it reads)."""
        return 2 * max((self.act_bytes(n) for n in self.step.backward if n not in self.scores), default=0)

    @functools.cached_property
    def params_by_segment(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per segment: the parameters one tensor-parallel card holds, and of those the trained ones
        (computed once per plan)."""
        total: dict[int, int] = {}
        trained: dict[int, int] = {}
        for p, n in self.step.params.items():
            t = tensor_of(n)
            k = t.numel() // (self.tp if self.tp > 1 and p in self.split_params else 1)
            if p in self.moe.expert_params:   # one expert-parallel card holds E / ep of the experts
                k //= self.ep
            s = self.pseg[p]
            total[s] = total.get(s, 0) + k
            if p in self.step.grads:
                trained[s] = trained.get(s, 0) + k
        return total, trained

    @functools.cached_property
    def tensors_by_segment(self) -> dict[int, int]:
        """Per segment: how many trained parameter tensors it has (the optimizer's per-tensor kernels;
        computed once per plan)."""
        counts: dict[int, int] = {}
        for p in self.step.grads:
            if p in self.pseg:
                counts[self.pseg[p]] = counts.get(self.pseg[p], 0) + 1
        return counts

    @functools.cached_property
    def experts_by_segment(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per segment: the expert parameters one card holds (their share under ``ep``), and of
        those the trained ones (a subset of `params_by_segment`'s; computed once per plan)."""
        total: dict[int, int] = {}
        trained: dict[int, int] = {}
        for p in self.moe.expert_params:
            t = tensor_of(self.step.params[p])
            k = t.numel() // (self.tp if self.tp > 1 and p in self.split_params else 1) // self.ep
            s = self.pseg[p]
            total[s] = total.get(s, 0) + k
            if p in self.step.grads:
                trained[s] = trained.get(s, 0) + k
        return total, trained


__all__ = ["PRE", "StepPlan", "Unit", "lower_node", "policy_dtype", "tuned"]
