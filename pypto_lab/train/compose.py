"""A whole training step from its parts: the model's layers split into pipeline chunks, each chunk's
micro-batch placed on a stream of the software stack, the pipeline schedule, the data-parallel
gradient collectives, the optimizer and every rank's memory: `compose` returns the `TrainReport`.

* **Chunks.** The model's ``L`` layers are split evenly over ``pp x vpp`` chunks (Megatron-Core's
  layers per virtual stage); chunk ``g`` runs on stage ``g % pp``; the embedding goes with the first
  chunk and the final norm, head and loss with the last. A model captured with fewer layers than it
  has (`pypto_lab.train.step` captures a transformers config's first two layers when every layer is
  the same) runs its last captured layer's kernels for every layer beyond them: identical layers
  are identical kernels.
* **One micro-batch of a chunk** runs on one `Stream` of the stack (host dispatch, device launch,
  overlap). Full recomputation reruns a layer's forward just before its backward (Megatron's
  ``--recompute-granularity full``; ``recompute_layers`` of each chunk with ``--recompute-method
  block``, all with ``uniform``, as HF's ``gradient_checkpointing_enable`` does); selective
  recomputation reruns the attention core only. Context parallelism runs each layer's attention as
  ring attention (`ring_us`). ZeRO-3 / FSDP all-gather each layer's weights on the communication
  stream, one layer ahead of the compute (FSDP's forward and backward prefetch), and reduce-scatter
  its gradients right after its backward.
* **The pipeline** (`pypto_lab.train.pipeline`): 1F1B, or interleaved 1F1B with ``vpp`` chunks per
  stage; activations and their gradients cross between stages point to point.
* **Gradients** are reduced in buckets on the communication stream as the last micro-batch's
  backward produces them when the framework overlaps them (DDP's buckets; Megatron's
  ``--overlap-grad-reduce``; DeepSpeed's ``overlap_comm``), otherwise after it; an all-reduce, or a
  reduce-scatter under a sharded optimizer (`pypto_lab.train.zero`), over the data- and
  context-parallel group.
* **The optimizer** updates the rank's shard of its stage's parameters: one fused Vector kernel (CANN's
  ApplyAdamW / ApplyMomentum) over the flat buffer (apex's NpuFused optimizers combine the tensors,
  DeepSpeed's optimizers step flat partitions), or one per parameter tensor where the framework
  runs it so (MindSpeed's AdamW, `Extras.per_tensor_optimizer`: each dispatched by the host), with
  the loss-scale overflow check under fp16 and the fp32 master weights cast back to half under O2. A sharded optimizer then all-gathers the updated weights
  (exposed, unless ``overlap_param_gather`` hides them under the next step's first forward).
* **Memory** per rank: its stage's weights, gradients and optimizer state as sharded, the
  activations its pass order keeps alive at once (`pypto_lab.train.pipeline.peak_activations`), two
  of the backward's largest tensors as workspace, and the communication buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..kernels.cost import CostedKernel, cost
from ..kernels.ir import AttentionKernel, Kernel, KernelSpec, VectorKernel
from ..lowering.lower import flat_reduction
from ..stack import Stream
from .parallel import Layout, crossed_level, group_topology, p2p_us
from .pipeline import Schedule, peak_activations, simulate
from .plan import PRE, StepPlan, Unit
from .policy import BYTES
from .report import BucketComm, StageReport, TrainReport
from .zero import StateBytes, dp_collectives, grad_bytes, state_bytes

# the optimizer's kernels that run once per parameter tensor under `Extras.per_tensor_optimizer`
# (Ascend/MindSpeed mindspeed/core/optimizer/adamw.py@028de58c: AdamW.step calls torch._fused_adamw_ for each
# parameter; Megatron's distributed optimizer copies each updated fp32 shard into its bf16 parameter)
PER_TENSOR = ("ApplyAdamw", "ApplyAdam", "ApplySgd", "ApplyMomentum", "WriteOptimizerState", "CastMasterToHalf")
OPTIMIZERS = {
    # name: (fp32 tensors read per parameter, written, the fused update's vector ops, optimizer state)
    "sgd": (3, 2, ("mul", "add", "mul", "add"), 1),                       # p, g, momentum
    "momentum": (3, 2, ("mul", "add", "mul", "add"), 1),
    "adam": (4, 3, ("mul", "add", "mul", "mul", "add", "sqrt", "add", "div", "mul", "sub"), 2),
    "adamw": (4, 3, ("mul", "add", "mul", "mul", "add", "sqrt", "add", "div", "mul", "sub", "mul", "sub"), 2),
}


@dataclass(frozen=True)
class Chunk:
    """Model layers ``[first, last)`` of pipeline stage ``stage``, virtual chunk ``virtual``, and
    whether it also runs the embedding (``pre``) and the head and loss (``post``)."""

    stage: int
    virtual: int
    first: int
    last: int
    pre: bool
    post: bool


def chunks(layers: int, pp: int, vpp: int) -> list[Chunk]:
    """The model's chunks in global order (chunk ``g`` on stage ``g % pp``)."""
    n = pp * vpp
    out = []
    for g in range(n):
        out.append(Chunk(g % pp, g // pp, g * layers // n, (g + 1) * layers // n, g == 0, g == n - 1))
    return out


@dataclass(frozen=True)
class Extras:
    """What composing needs beyond the plan and the layout."""

    model_layers: int                 # the model's repeated blocks (the capture may hold fewer)
    optimizer: str
    bucket_mb: float
    fp32_grads: bool
    kv_heads: int | None = None       # key/value heads and head size (context parallelism's ring)
    head_dim: int | None = None
    recompute_method: str = "uniform"   # Megatron's --recompute-method: "uniform" or "block"
    checkpoint: bool = False
    accumulate: str = "after-first"   # gradients added into an accumulator: "every" micro-batch (Megatron's
    #                                   main_grad without accumulation fusion), "after-first" (torch's .grad), "none"
    per_tensor_optimizer: bool = False  # the update and the copy back run one kernel per parameter tensor (MindSpeed's
    #                                   AdamW: torch._fused_adamw_ per parameter), not one over a flat buffer
    strategy: str = "exact"           # how the parameter-sized Vector kernels (gradient accumulation, optimizer)
    #                                   are costed: "exact", or "grid" (`pypto_lab.kernels.grid`: exact at a grid of
    #                                   sizes, linear beyond 4M elements; the configuration search's choice)


@dataclass
class _Placed:
    unit: Unit
    start: float
    end: float


class _Composer:
    def __init__(self, plan: StepPlan, layout: Layout, extras: Extras):
        self.plan, self.layout, self.x = plan, layout, extras
        self.chip = plan.chip
        fwd, bwd, self.unmapped, self.fused = plan.units()
        self.fu: dict[int, list[Unit]] = {}
        self.bu: dict[int, list[Unit]] = {}
        for u in fwd:
            self.fu.setdefault(u.seg, []).append(u)
        for u in bwd:
            self.bu.setdefault(u.seg, []).append(u)
        self.n_captured = len(plan.block_order)
        self.layers = extras.model_layers if self.n_captured else 0
        self.post = plan.post
        self.topology = plan.topology
        self.params_total, self.params_trained = plan.params_by_segment
        self.saved, self.scores_saved, self.inputs = plan.saved_by_segment()
        self.cp_comm_us = 0.0
        self.notes: list[str] = []

    def cap(self, layer: int) -> int:
        return min(layer, self.n_captured - 1)

    def segments(self, c: Chunk) -> list[int]:
        """The captured segments chunk ``c`` runs, in forward order (a layer beyond the capture
        runs the last captured layer)."""
        segs = [PRE] if c.pre else []
        segs += [self.cap(i) for i in range(c.first, c.last)]
        if c.post and self.n_captured:
            segs.append(self.post)
        return segs

    def recomputed(self, c: Chunk, layer: int) -> bool:
        lay = self.layout
        if lay.recompute != "full":
            return False
        if lay.recompute_layers is None:
            return True
        k = layer - c.first
        if self.x.recompute_method == "block":
            return k < lay.recompute_layers
        return lay.recompute_layers > 0

    # ---- context parallelism ----
    def ring_us(self, attention: list[Unit], phase: str) -> tuple[float, float]:
        """Ring attention over ``cp`` ranks (Liu et al. 2023; Megatron-Core's context parallelism,
        MindSpeed's ``--context-parallel-algo megatron_cp_algo``): each rank keeps ``s / cp`` tokens
        (two chunks of ``s / 2cp``, one from each end, so every rank does the same causal work) and
        passes its keys and values around the ring; at each of ``cp`` steps it computes its
        queries against the block it holds while sending it on, so a step takes the longer of its
        attention (a causal ``s / cp`` block's worth: the captured kernel) and the transfer (keys
        and values forward; in the backward their gradients travel too). Returns (the layer's
        attention time, what the transfers add beyond the attention)."""
        cp = self.layout.cp
        a = sum(u.time_us for u in attention)
        plan = self.plan
        kv = self.x.kv_heads or 1
        d = self.x.head_dim or (plan.hidden or 0)
        heads_here = max(1, kv // self.layout.tp)
        nbytes = 2 * plan.tokens * heads_here * d * plan.act * (2 if phase == "backward" else 1)
        step = p2p_us(self.topology, nbytes, self.layout.tp)
        ring = cp * max(a, step)
        return ring, ring - cp * a

    # ---- one micro-batch of one chunk ----
    def sequence(self, c: Chunk, phase: str) -> list[tuple[int, int, list[Unit]]]:
        """(model layer or PRE / post, captured segment, units) in the order ``phase`` runs them;
        the backward's recomputed forwards come just before their layer's backward."""
        out = []
        if phase == "forward":
            if c.pre:
                out.append((PRE, PRE, self.fu.get(PRE, [])))
            for i in range(c.first, c.last):
                out.append((i, self.cap(i), self.fu.get(self.cap(i), [])))
            if c.post and self.n_captured:
                out.append((self.post, self.post, self.fu.get(self.post, [])))
            return out
        if c.post and self.n_captured:
            out.append((self.post, self.post, self.bu.get(self.post, [])))
        for i in reversed(range(c.first, c.last)):
            s = self.cap(i)
            units = list(self.bu.get(s, []))
            if self.recomputed(c, i):
                units = [replace(u, phase="recompute") for u in self.fu.get(s, [])] + units
            elif self.layout.recompute == "selective" and self.scores_saved.get(s):
                units = [replace(u, phase="recompute") for u in self.fu.get(s, []) if u.attention] + units
            out.append((i, s, units))
        if c.pre:
            out.append((PRE, PRE, self.bu.get(PRE, [])))
        return out

    def run_chunk(self, c: Chunk, phase: str, stream: Stream, keep: bool = False):
        """Place one micro-batch of chunk ``c``'s ``phase`` on ``stream`` after what it holds (a
        micro-batch's backward follows its forward on the same host thread, so a host that fell
        behind the device stays behind): (its length, the recomputation inside it, the (end, bytes)
        of each gradient it completes, the placed units when ``keep``)."""
        lay, plan = self.layout, self.plan
        start_us = stream.now_us
        placed: list[_Placed] = []
        pieces: list[tuple[float, float, bool]] = []   # (end, bytes, whether the gradients are experts')
        recompute_us = 0.0
        gb = grad_bytes(plan.policy, self.x.fp32_grads)
        zero3 = lay.zero >= 3 and lay.dp * lay.cp > 1
        comm_free = max(start_us, getattr(self, "_comm_free", 0.0)) if phase == "backward" else start_us
        group = group_topology(self.topology, lay.dp * lay.cp, lay.tp) if zero3 else None
        seq = self.sequence(c, "forward" if phase == "forward" else "backward")
        gathered: dict[int, float] = {}

        def sharded_us(kind: str, seg: int, per_param: float, trained: bool) -> float:
            """A ZeRO-3 collective of segment ``seg``'s parameters (all, or the trained ones): the dense
            ones over the data-parallel group, the experts' (under expert parallelism) over the expert
            data-parallel group."""
            counts = self.params_trained if trained else self.params_total
            ex = self.plan.experts_by_segment[int(trained)].get(seg, 0) if self.expert_grads else 0
            t = plan.collective_us(kind, (counts.get(seg, 0) - ex) * per_param, lay.dp * lay.cp, group)
            edp = self.expert_layout().dp
            if ex and edp > 1:
                t += plan.collective_us(kind, ex * per_param, edp, group_topology(self.topology, edp, lay.tp * lay.ep))
            return t

        def gather(k: int, not_before: float) -> None:   # layer k's weights, on the communication stream
            nonlocal comm_free
            t = sharded_us("allgather", seq[k][1], BYTES[plan.policy.param_dtype], trained=False)
            comm_free = max(comm_free, not_before) + t
            gathered[k] = comm_free

        if zero3 and seq:
            gather(0, start_us)
        for k, (_layer, s, units) in enumerate(seq):
            if zero3:   # wait for this layer's weights; fetch the next layer's meanwhile (prefetch)
                stream.wait(gathered[k])
                if k + 1 < len(seq):
                    gather(k + 1, stream.now_us)
            att = [u for u in units if u.attention and isinstance(u.spec, AttentionKernel)
                   and u.phase == phase] if lay.cp > 1 else []
            if att:
                ring, extra = self.ring_us(att, phase)
                self.cp_comm_us += extra
            for u in units:
                if att and u in att:
                    if u is att[0]:   # one fused attention kernel per ring step, as MindSpeed's ring attention calls it
                        for i in range(lay.cp):
                            p = stream.run(ring / lay.cp)
                            if keep:
                                placed.append(_Placed(replace(u, name=f"ring attention step {i + 1}/{lay.cp}:{u.name}"),
                                                      p.start_us, p.end_us))
                    continue
                t0 = stream.now_us
                if u.sync:   # the host waits for every queued kernel, then copies the value back
                    stream.host = max(stream.host, stream.free) + plan.stack.dispatch_us + u.time_us
                    p = stream.run(0.0, count=0)
                    if keep:
                        placed.append(_Placed(u, p.start_us, p.end_us))
                    continue
                p = stream.run(u.time_us, 1, u.collective)
                if u.phase == "recompute":
                    recompute_us += stream.now_us - t0
                if keep:
                    placed.append(_Placed(u, p.start_us, p.end_us))
                if u.grads and u.phase != "recompute":
                    experts = self.expert_grads
                    nb = sum(self._grad_numel(g) for g in u.grads if g not in experts) * gb
                    ne = sum(self._grad_numel(g) for g in u.grads if g in experts) * gb
                    pieces += [(p.end_us, b, e) for b, e in ((nb, False), (ne, True)) if b or not e]
            if phase == "backward" and self.x.accumulate != "none" and self.params_trained.get(s, 0):
                # the layer's new gradients added into the accumulated ones (see `accumulate_spec`)
                spec = self.accumulate_spec(self.params_trained[s])
                kc = cost(spec, self.chip, self.x.strategy)
                share = 1.0 if self.x.accumulate == "every" else (lay.micro_batches - 1) / lay.micro_batches
                if share > 0:
                    p = stream.run(kc.time_us * share)
                    if keep:
                        placed.append(_Placed(Unit(f"{spec.op}:segment {s}", "backward", spec, kc.scaled(share), s),
                                              p.start_us, p.end_us))
            if zero3 and phase == "backward":   # this layer's gradients reduce-scattered after its backward
                t = sharded_us("reducescatter", s, gb, trained=True)
                comm_free = max(comm_free, stream.now_us) + t
        end = max(stream.now_us, comm_free if zero3 and phase == "backward" else stream.now_us)
        self._comm_free = comm_free
        if keep and phase == "backward":
            self.host_idle_us = stream.timeline().idle_us
        return end - start_us, recompute_us, pieces, placed

    def accumulate_spec(self, numel: int) -> VectorKernel:
        """The Vector kernel that adds a layer's new gradients (in the weights' dtype, as the weight-gradient
        GEMM writes them) into the accumulated ones: Megatron's ``param.main_grad.add_(param.grad)`` in
        its gradient hook, every micro-batch, when the accumulation is not fused into the GEMM
        (``--no-gradient-accumulation-fusion``, as every MindSpeed / ModelLink example script passes);
        torch autograd's AccumulateGrad (``param.grad += new``) on each micro-batch after the first."""
        dtype = "fp32" if self.x.fp32_grads else self.plan.policy.param_dtype
        return VectorKernel(op="AccumulateGrad", ops=("add",), numel=max(1, int(numel)), dtype=dtype,
                            compute_dtype="fp32", inputs=2)

    def _grad_numel(self, param: str) -> int:
        plan = self.plan
        t = plan.step.params[param].meta["val"]
        n = t.numel() // (plan.tp if plan.tp > 1 and param in plan.split_params else 1)
        return n // plan.ep if param in plan.moe.expert_params else n

    @property
    def expert_grads(self) -> set[str]:
        """The experts' parameters when expert parallelism reduces their gradients over a group of
        their own (the expert data-parallel group); empty otherwise."""
        return self.plan.moe.expert_params if self.layout.ep > 1 else set()

    def expert_layout(self) -> Layout:
        """The layout the experts' weights, gradients and optimizer state are sharded under: data
        parallelism over the expert data-parallel group, ``dp x cp / ep`` ranks (Megatron-Core's
        ``expert_data_parallel_size``, `pypto_lab.train.moe`)."""
        lay = self.layout
        return replace(lay, dp=max(1, lay.dp * lay.cp // lay.ep), cp=1)

    # ---- the step ----
    def compose(self, report_base: dict) -> TrainReport:
        lay, plan, x = self.layout, self.plan, self.x
        pp, vpp, m = lay.pp, lay.vpp, lay.micro_batches
        cs = chunks(self.layers, pp, vpp) if self.n_captured else [Chunk(0, 0, 0, 0, True, True)]
        fwd = [[0.0] * vpp for _ in range(pp)]
        bwd = [[0.0] * vpp for _ in range(pp)]
        rec = [[0.0] * vpp for _ in range(pp)]
        pieces: dict[tuple[int, int], list[tuple[float, float, bool]]] = {}
        kernels: list[CostedKernel] = []
        cp_f = cp_b = 0.0
        # chunks of the same layers (captured segments), ends and recomputation run the same: each such
        # chunk is placed once (a chunk starts on a stream and a communication stream of its own)
        same: dict[tuple, tuple] = {}
        for c in cs:
            keep = c.stage == 0 and c.virtual == 0
            key = (c.pre, c.post, tuple(self.cap(i) for i in range(c.first, c.last)),
                   tuple(self.recomputed(c, i) for i in range(c.first, c.last)))
            pf = pb = []
            if keep or key not in same:
                before = self.cp_comm_us
                stream = Stream(plan.stack)
                self._comm_free = 0.0
                f, _, _, pf = self.run_chunk(c, "forward", stream, keep=keep)
                df = self.cp_comm_us - before
                before = self.cp_comm_us
                b, r, pc, pb = self.run_chunk(c, "backward", stream, keep=keep)
                same[key] = (f, b, r, [(t - f, nb, e) for t, nb, e in pc], df, self.cp_comm_us - before)
            f, b, r, rel, df, db = same[key]
            cp_f += df if c.stage == 0 else 0.0
            cp_b += db if c.stage == 0 else 0.0
            fwd[c.stage][c.virtual], bwd[c.stage][c.virtual], rec[c.stage][c.virtual] = f, b, r
            pieces[(c.stage, c.virtual)] = list(rel)
            if keep:
                for p in pf + pb:
                    u = p.unit
                    kernels.append(CostedKernel(Kernel(u.name, u.spec, (), (getattr(u.spec, "op", u.spec.kind),),
                                                       u.name), u.cost, 1, phase=u.phase if u.phase != "recompute"
                                                else "recompute", start_us=p.start))
        act_bytes = plan.act
        hidden = plan.hidden or 0
        p2p_bytes = plan.tokens * hidden * act_bytes / (lay.tp if lay.sequence_parallel else 1)
        stride_pp = lay.tp * lay.cp * lay.dp
        p2p = p2p_us(self.topology, p2p_bytes, stride_pp) if pp > 1 else 0.0
        sched = simulate(fwd, bwd, m, p2p)

        # ---- gradients, optimizer and weights, stage by stage ----
        dpc = dp_collectives(lay, 0.0)
        group_size = lay.dp * lay.cp
        group = group_topology(self.topology, group_size, lay.tp)
        cap = x.bucket_mb * 2 ** 20
        buckets: list[BucketComm] = []
        stages: list[StageReport] = []
        opt_ms = exposed_ms = comm_ms = gather_ms = 0.0
        step_end = 0.0
        stage_mem: list[dict[str, int]] = []
        kept_kernels_opt: list[CostedKernel] = []
        for s in range(pp):
            last_b = sched.last_backward_end(s)
            ready: list[tuple[float, float, bool]] = []
            last_of: dict[int, Any] = {}   # each chunk's last backward
            for p in sched.of(s):
                if p.kind == "B" and (p.chunk not in last_of or p.end_us > last_of[p.chunk].end_us):
                    last_of[p.chunk] = p
            for v in range(vpp):
                lastp = last_of.get(v)
                if lastp is None:
                    continue
                ready += [(lastp.start_us + t, nb, e) for t, nb, e in pieces.get((s, v), [])]
            ready.sort()
            free = 0.0
            stage_buckets: list[BucketComm] = []
            # the dense gradients over the data- and context-parallel group; under expert parallelism the
            # experts' in buckets of their own (Megatron's DDP keeps separate expert-parallel buffers) over
            # the expert data-parallel group, tp x ep apart
            passes = [(dpc, [(t, nb) for t, nb, e in ready if not e], group_size, group)]
            if lay.ep > 1:
                elay = self.expert_layout()
                edp = elay.dp
                passes.append((dp_collectives(elay, 0.0), [(t, nb) for t, nb, e in ready if e], edp,
                               group_topology(self.topology, edp, lay.tp * lay.ep)))
            for kinds, rd, gsize, gtopo in passes:
                if not (kinds.grad_kind and not kinds.per_layer and rd):
                    continue
                groups: list[list[tuple[float, float]]] = [[]]
                size = 0.0
                for t, nb in rd:
                    if groups[-1] and size + nb > cap:
                        groups.append([])
                        size = 0.0
                    groups[-1].append((t, nb))
                    size += nb
                for g in groups:
                    nb = sum(b for _, b in g)
                    rdy = max(t for t, _ in g) if lay.overlap_grad_reduce else last_b
                    tcomm = plan.collective_us(kinds.grad_kind, nb, gsize, gtopo)
                    start = max(rdy, free)
                    stage_buckets.append(BucketComm(len(stage_buckets), nb, rdy, start, tcomm, s, kinds.grad_kind))
                    free = start + tcomm
            stage_buckets.sort(key=lambda b: b.start_us)
            grads_done = max(last_b, stage_buckets[-1].end_us if stage_buckets else 0.0)
            exposed = grads_done - last_b
            # the optimizer over the stage's trained parameters (its shard)
            trained = self._stage_trained(cs, s)
            experts = self._stage_experts(cs, s)[1]
            n_opt = max(1, int((trained - experts) // lay.shards_optimizer
                               + experts // self.expert_layout().shards_optimizer)) if trained else 0
            runs = self.optimizer_runs(cs, s) if n_opt and x.per_tensor_optimizer else 1
            opt_specs = self.optimizer_specs(max(1, n_opt // runs)) if n_opt else []
            stream = Stream(plan.stack, grads_done)
            for label, spec in opt_specs:
                kc = cost(spec, self.chip, x.strategy)
                count = runs if label in PER_TENSOR else 1
                p = stream.run(kc.time_us, count)
                if s == 0:
                    kept_kernels_opt.append(CostedKernel(Kernel(label, spec, (), (spec.op,), label), kc, count,
                                                         phase="optimizer", start_us=p.start_us))
            opt_us = stream.now_us - grads_done
            gather = 0.0
            if (lay.zero in (1, 2) or lay.distributed_optimizer) and group_size > 1:
                nb = trained * BYTES[plan.policy.param_dtype]
                gather = plan.collective_us("allgather", nb, group_size, group)
                if lay.overlap_param_gather:
                    gather = max(0.0, gather - fwd[s][0])
            end = grads_done + opt_us + gather
            step_end = max(step_end, end)
            mem = self.memory(cs, s, m)
            stage_mem.append(mem)
            stages.append(StageReport(
                stage=s, layers=tuple((c.first, c.last) for c in cs if c.stage == s),
                forward_ms=sum(fwd[s]) / 1e3, backward_ms=sum(bwd[s]) / 1e3, recompute_ms=sum(rec[s]) / 1e3,
                optimizer_ms=opt_us / 1e3, memory=mem, end_ms=end / 1e3, bubble_ms=sched.bubble_us(s) / 1e3))
            buckets += stage_buckets
            if s == 0 or end >= step_end:
                opt_ms, exposed_ms, gather_ms = opt_us / 1e3, exposed / 1e3, gather / 1e3
                comm_ms = sum(b.time_us for b in stage_buckets) / 1e3
        busiest = max(range(pp), key=lambda s: sum(fwd[s]) + sum(bwd[s]))
        worst = max(range(pp), key=lambda s: sum(stage_mem[s].values()))
        memory = stage_mem[worst]
        peak = int(sum(memory.values()))
        per_sample = (memory["activations"] + memory["workspace"]) / max(1, plan.step.batch)
        static = peak - memory["activations"] - memory["workspace"]
        largest = int((self.chip.hbm_bytes - static) // per_sample) if per_sample > 0 else 0
        kernels += [replace(k, start_us=k.start_us) for k in kept_kernels_opt]
        tp_comm = sum(u.time_us for u in self.fu_all() if u.collective and not u.ep) + \
            sum(u.time_us for u in self.bu_all() if u.collective and not u.ep)
        tp_comm_us = tp_comm * self._layers_of(cs, busiest) if self.n_captured else 0.0
        ep_comm = sum(u.time_us for u in self.fu_all() + self.bu_all() if u.ep)
        ep_comm_us = ep_comm * self._layers_of(cs, busiest) if self.n_captured else 0.0
        notes = self.notes_for(cs, sched, rec, busiest, stages)
        return TrainReport(
            **report_base, grad_accum=m, forward_ms=sum(fwd[busiest]) / 1e3, backward_ms=sum(bwd[busiest]) / 1e3,
            recompute_ms=sum(rec[busiest]) / 1e3, optimizer_ms=opt_ms, comm_ms=comm_ms, exposed_comm_ms=exposed_ms,
            step_ms=step_end / 1e3, peak_hbm_bytes=peak, hbm_bytes=int(self.chip.hbm_bytes), memory=memory,
            largest_batch=largest, tp=lay.tp, tp_comm_ms=tp_comm_us / 1e3,
            host_idle_ms=getattr(self, "host_idle_us", 0.0) / 1e3 * m, layout=lay,
            bubble_ms=max(sched.bubble_us(s) for s in range(pp)) / 1e3 if pp > 1 else 0.0,
            param_gather_ms=gather_ms, cp_comm_ms=(cp_f + cp_b) / 1e3, ep_comm_ms=ep_comm_us / 1e3, stages=stages, schedule=sched,
            kernels=kernels, buckets=buckets, unmapped_ops=dict(self.unmapped), notes=notes)

    def fu_all(self) -> list[Unit]:
        return [u for us in self.fu.values() for u in us]

    def bu_all(self) -> list[Unit]:
        return [u for us in self.bu.values() for u in us]

    def _layers_of(self, cs: list[Chunk], stage: int) -> float:
        """How many captured blocks' worth of layers the stage runs (to scale a per-layer sum)."""
        return sum(c.last - c.first for c in cs if c.stage == stage) / max(1, self.n_captured)

    def _stage_trained(self, cs: list[Chunk], s: int) -> int:
        return sum(self.params_trained.get(seg, 0) for c in cs if c.stage == s for seg in self.segments(c))

    def _stage_experts(self, cs: list[Chunk], s: int) -> tuple[int, int]:
        """The stage's expert parameters on one card, and of those the trained ones."""
        total, trained = self.plan.experts_by_segment
        segs = [seg for c in cs if c.stage == s for seg in self.segments(c)]
        return sum(total.get(g, 0) for g in segs), sum(trained.get(g, 0) for g in segs)

    def _stage_params(self, cs: list[Chunk], s: int) -> int:
        return sum(self.params_total.get(seg, 0) for c in cs if c.stage == s for seg in self.segments(c))

    def optimizer_runs(self, cs: list[Chunk], s: int) -> int:
        """The parameter tensors stage ``s``'s rank updates one kernel each (`Extras.per_tensor_optimizer`):
        its stage's trained tensors, of which a sharded optimizer's rank holds a contiguous ``1 / shards``
        of the flat buffer (one more for the tensor cut at its boundary)."""
        counts = self.plan.tensors_by_segment
        n = sum(counts.get(seg, 0) for c in cs if c.stage == s for seg in self.segments(c))
        shards = self.layout.shards_optimizer
        return max(1, -(-n // shards) + (1 if shards > 1 else 0))

    def optimizer_specs(self, n_train: int) -> list[tuple[str, KernelSpec]]:
        """The optimizer's kernels over ``n_train`` parameters (see the module docstring)."""
        policy = self.plan.policy
        reads, writes, ops, _state = OPTIMIZERS[self.x.optimizer]
        out: list[tuple[str, KernelSpec]] = []
        if policy.loss_scaling:   # dynamic loss scaling: one overflow check over all gradients
            numel, row = flat_reduction(n_train)
            out.append(("CheckOverflow", VectorKernel(op="CheckOverflow", ops=("max",), numel=numel,
                                                      dtype=policy.param_dtype, compute_dtype="fp32",
                                                      inputs=1, row_len=row)))
        fused = ops + (("mul",) if policy.loss_scaling else ())   # unscaling folded into the update
        label = f"Apply{self.x.optimizer.capitalize()}"
        out.append((label, VectorKernel(op=label, ops=fused, numel=n_train, dtype="fp32", compute_dtype="fp32",
                                        inputs=reads)))
        if writes > 1:   # the update writes its state too: the extra fp32 tensors cross GM once each
            out.append(("WriteOptimizerState", VectorKernel(op="WriteOptimizerState", ops=("copy",),
                                                            numel=max(1, n_train * (writes - 1) // 2),
                                                            dtype="fp32", compute_dtype="fp32", inputs=1)))
        if policy.master_weights:   # O2: the half model weights from the fp32 master copy
            out.append(("CastMasterToHalf", VectorKernel(op="Cast", ops=("cast",), numel=n_train, dtype="fp32",
                                                         compute_dtype="fp32", inputs=1)))
        return out

    # ---- memory ----
    def chunk_activations(self, c: Chunk) -> tuple[float, float]:
        """One micro-batch's activations that chunk ``c`` keeps until its backward, and how much more
        than that its backward holds at once when it recomputes: the backward runs the layers from
        the last, freeing each as it goes, so recomputing layer ``i`` holds the layers below it as
        kept plus layer ``i`` whole."""
        lay = self.layout
        segs = ([(None, PRE)] if c.pre else []) + [(i, self.cap(i)) for i in range(c.first, c.last)] + \
            ([(None, self.post)] if c.post and self.n_captured else [])
        kept_each: list[float] = []
        whole: list[float | None] = []   # a recomputed layer's activations during its backward
        for layer, s in segs:
            full = self.saved.get(s, 0)
            if layer is not None and self.recomputed(c, layer):
                kept_each.append(self.inputs.get(s, 0))
                whole.append(full)
            elif lay.recompute == "selective" and layer is not None and self.scores_saved.get(s, 0):
                kept_each.append(full - self.scores_saved[s])
                whole.append(full)
            else:
                kept_each.append(full)
                whole.append(None)
        kept = sum(kept_each)
        below = 0.0
        peak = kept
        for k, w in enumerate(kept_each):
            if whole[k] is not None:
                peak = max(peak, below + whole[k])
            below += w
        return kept, peak - kept

    def memory(self, cs: list[Chunk], s: int, m: int) -> dict[str, int]:
        """HBM of one rank of stage ``s`` (see the module docstring)."""
        lay, plan, x = self.layout, self.plan, self.x
        mine = [c for c in cs if c.stage == s]
        e_total, e_trained = self._stage_experts(cs, s)
        dense = state_bytes(self._stage_params(cs, s) - e_total, self._stage_trained(cs, s) - e_trained,
                            plan.policy, lay, OPTIMIZERS[x.optimizer][3], x.fp32_grads)
        # the experts (their E / ep share on this card) sharded over the expert data-parallel group
        ex = state_bytes(e_total, e_trained, plan.policy, self.expert_layout(), OPTIMIZERS[x.optimizer][3],
                         x.fp32_grads)
        state = StateBytes(*(getattr(dense, f) + getattr(ex, f) for f in ("weights", "master", "gradients",
                                                                          "optimizer")))
        out = state.as_dict(plan.policy.master_weights)
        per_chunk = [0.0] * lay.vpp
        back = 0.0
        for c in mine:
            kept, b = self.chunk_activations(c)
            per_chunk[c.virtual] = kept
            back = max(back, b)
        out["activations"] = int(peak_activations(lay.pp, lay.vpp, m, s, per_chunk) + back)
        out["workspace"] = int(plan.workspace_bytes)
        buffers = 0.0
        gb = grad_bytes(plan.policy, x.fp32_grads)
        if lay.zero >= 3 and lay.dp * lay.cp > 1:   # two layers' gathered weights (the one running, the next)
            biggest = max((self.params_total.get(seg, 0) for seg in self.params_total), default=0)
            buffers += 2 * biggest * BYTES[plan.policy.param_dtype]
        elif lay.zero in (1, 2) and lay.dp * lay.cp > 1:   # DeepSpeed's reduce bucket (contiguous gradients)
            buffers += min(x.bucket_mb * 2 ** 20, self._stage_trained(cs, s) * gb)
        if lay.pp > 1:   # activations received from / sent to the neighbouring stages, and their gradients
            buffers += 4 * plan.tokens * (plan.hidden or 0) * plan.act / (lay.tp if lay.sequence_parallel else 1)
        if lay.tp > 1 and lay.sequence_parallel and plan.hidden:   # the all-gathered full-sequence hidden state
            buffers += plan.tokens * plan.hidden * plan.act
        if lay.ep > 1 and plan.moe.is_moe:   # the all-to-all's send and receive buffers of one MoE layer's rows
            buffers += 2 * max(u.nbytes for u in (plan.ep_alltoall(g) for g in plan.moe_segments()))
        if buffers:
            out["communication buffers"] = int(buffers)
        return out

    # ---- notes ----
    def notes_for(self, cs, sched: Schedule, rec, busiest: int, stages: list[StageReport]) -> list[str]:
        lay, plan = self.layout, self.plan
        notes = list(plan.step.notes)
        if self.n_captured and self.layers > self.n_captured:
            notes.append(f"{self.layers} layers costed from the {self.n_captured} captured (identical layers run "
                         "identical kernels: each layer beyond them runs the last captured one's)")
        if plan.step.fake_quant:
            notes.append(f"quantisation-aware training: the int8 fake quantisation of {len(plan.step.fake_quant)} "
                         "layers (observer min/max, clamp, round and rescale of input and weight; the "
                         "straight-through gradient) is costed on the Vector unit")
        if self.fused[0]:
            notes.append(f"Vector fusion: {self.fused[1]} element-wise and row ops run as {self.fused[0]} fused "
                         "kernels (RMSNorm, SwiGLU, rotary embedding and the like, forward and backward)")
        if plan.scores:
            notes.append("attention runs as fused FlashAttention kernels (the s x s scores stay on chip; the "
                         "backward recomputes them)" + ("; causal: only the blocks on and below the diagonal"
                                                        if plan.causal else ""))
        if lay.recompute == "full":
            r = sum(rec[busiest]) / 1e3
            mine = [c for c in cs if c.stage == busiest]
            whole = sum(self.saved.get(s, 0) for c in mine for s in self.segments(c)) / 2 ** 20
            kept = sum(self.chunk_activations(c)[0] + self.chunk_activations(c)[1] for c in mine) / 2 ** 20
            n = sum(1 for c in mine for i in range(c.first, c.last) if self.recomputed(c, i))
            notes.append(f"gradient checkpointing (full recomputation) of {n} layers"
                         f"{'' if lay.recompute_layers is None else f' ({lay.recompute_layers} per chunk)'}: "
                         f"activations {whole:,.0f} -> {kept:,.0f} MiB per micro-batch for {r:.2f} ms of recomputed "
                         "forward per micro-batch (each recomputed layer keeps its input and reruns its forward "
                         "just before its backward)")
        elif lay.recompute == "selective":
            if not any(self.scores_saved.values()):
                notes.append("selective recomputation reruns the attention core, whose s x s tensors "
                             "FlashAttention never keeps: nothing to save, nothing rerun")
            else:
                notes.append("selective recomputation: the attention core's s x s tensors are dropped and rerun in "
                             "the backward")
        if lay.tp > 1 and self.n_captured:
            notes.append(f"tensor parallelism over {lay.tp} cards"
                         f"{' with sequence parallelism' if lay.sequence_parallel else ''}: blocks split Megatron "
                         f"style, 4 collectives of the hidden state per layer and micro-batch"
                         + (" (MC2: each overlapped with its GEMM chunk by chunk)" if plan.mc2 else ""))
        if lay.pp > 1:
            kind = f"interleaved 1F1B ({lay.vpp} chunks per stage)" if lay.vpp > 1 else "1F1B"
            notes.append(f"pipeline of {lay.pp} stages, {kind}, {lay.micro_batches} micro-batches: the busiest "
                         f"stage idles {sched.bubble_fraction:.1%} of the pipeline's span (bubble)")
        if lay.ep > 1 and plan.moe.is_moe:
            edp = self.expert_layout().dp
            held = self._stage_experts(cs, 0)[0]
            notes.append(f"expert parallelism over {lay.ep} ranks: each card holds {plan.moe.experts // lay.ep} of the "
                         f"{plan.moe.experts} experts of each MoE layer ({held / 1e6:,.1f} M expert parameters per card"
                         f"{' of the first stage' if lay.pp > 1 else ''}: their weights, gradients and optimizer state divided by "
                         f"{lay.ep}) and computes the routed rows of its experts, routing assumed balanced; "
                         "2 all-to-alls per MoE layer in the forward (dispatch, combine) and 2 in the backward, on "
                         f"the critical path (not overlapped: MindSpeed's --moe-alltoall-overlap-comm is not modelled); "
                         f"the experts' gradients reduced over the expert data-parallel group of {edp} rank"
                         f"{'s' if edp != 1 else ''} (dp x cp / ep)")
        elif plan.moe.is_moe:
            notes.append(f"mixture of experts: {plan.moe.experts} experts per MoE layer, top-{plan.moe.top_k}; "
                         "routing assumed balanced (the grouped matmuls' rows spread evenly over the experts)")
        if lay.cp > 1:
            notes.append(f"context parallelism over {lay.cp} ranks: each keeps {plan.step.tokens} of the sequence's "
                         "tokens and runs ring attention, passing keys and values around the ring")
        if self.unmapped:
            notes.append("ops not in the lowering table, run on the host CPU with their inputs and outputs "
                         "copied over PCIe (pypto_lab.lowering.table's fallback): "
                         + ", ".join(f"{k} x{v}" for k, v in sorted(self.unmapped.items())))
        if lay.dp * lay.cp > 1:
            lvl = crossed_level(self.topology, lay.tp * (lay.dp * lay.cp - 1)) if lay.dp * lay.cp > 1 else None
            what = {0: "all-reduced", 1: "reduce-scattered", 2: "reduce-scattered",
                    3: "reduce-scattered layer by layer"}[lay.zero] if not lay.distributed_optimizer \
                else "reduce-scattered (distributed optimizer)"
            notes.append(f"gradients {what} in buckets over the {lay.dp * lay.cp} data-parallel ranks of "
                         f"{self.topology.name}" + (f" ({lvl.link})" if lvl is not None else "")
                         + ("" if lay.overlap_grad_reduce else ", after the backward (no overlap)"))
        return notes


def compose(plan: StepPlan, layout: Layout, extras: Extras, report_base: dict) -> TrainReport:
    """The step's `TrainReport` (see the module docstring); ``report_base`` holds the report's
    descriptive fields."""
    return _Composer(plan, layout, extras).compose(report_base)


def memory_of(plan: StepPlan, layout: Layout, extras: Extras) -> tuple[dict[str, int], int, list[dict[str, int]]]:
    """Every stage's memory under ``layout`` without costing a kernel's time: (the fullest stage's
    parts, its total, every stage's parts)."""
    comp = _Composer.__new__(_Composer)
    comp.plan, comp.layout, comp.x, comp.chip = plan, layout, extras, plan.chip
    comp.n_captured = len(plan.block_order)
    comp.layers = extras.model_layers if comp.n_captured else 0
    comp.post = plan.post
    comp.topology = plan.topology
    comp.params_total, comp.params_trained = plan.params_by_segment
    comp.saved, comp.scores_saved, comp.inputs = plan.saved_by_segment()
    cs = chunks(comp.layers, layout.pp, layout.vpp) if comp.n_captured else [Chunk(0, 0, 0, 0, True, True)]
    mems = [comp.memory(cs, s, layout.micro_batches) for s in range(layout.pp)]
    worst = max(mems, key=lambda d: sum(d.values()))
    return worst, int(sum(worst.values())), mems


__all__ = ["OPTIMIZERS", "Chunk", "Extras", "chunks", "compose", "memory_of"]
