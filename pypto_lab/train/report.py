"""What a simulated training step reports: `TrainReport` (time and memory per card, where they go,
the kernels of a micro-batch, the gradient buckets, the pipeline's passes) and its Chrome trace."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files.atomic import write_text_atomic
from ..kernels.cost import CostedKernel
from .parallel import Layout
from .pipeline import Schedule


@dataclass(frozen=True)
class BucketComm:
    """One gradient bucket's collective (all-reduce, or reduce-scatter under a sharded optimizer)
    on the communication stream of a pipeline stage."""

    index: int
    nbytes: float
    ready_us: float       # when the backward has produced the bucket's last gradient
    start_us: float
    time_us: float
    stage: int = 0
    kind: str = "allreduce"

    @property
    def end_us(self) -> float:
        return self.start_us + self.time_us


@dataclass(frozen=True)
class StageReport:
    """One pipeline stage: its model chunks, one micro-batch's forward and backward through them,
    and what one of its ranks holds in HBM."""

    stage: int
    layers: tuple[tuple[int, int], ...]   # per chunk: the model layers [first, last) it runs
    forward_ms: float
    backward_ms: float                    # including recomputation
    recompute_ms: float
    optimizer_ms: float
    memory: dict[str, int]
    end_ms: float                         # when its step ends (last pass, gradients reduced, optimizer)
    bubble_ms: float                      # idle between the step's start and its last backward


@dataclass
class TrainReport:
    """What one training step costs on each card, and where the time and memory go."""

    model: str
    chip: str
    cards: int
    batch: int                      # per card, per micro-batch
    grad_accum: int                 # micro-batches per step (per data-parallel rank)
    precision: str
    amp: str
    optimizer: str
    bucket_mb: float
    checkpoint: bool
    forward_ms: float               # one micro-batch, summed over the busiest stage's chunks
    backward_ms: float              # including recomputation
    recompute_ms: float
    optimizer_ms: float
    comm_ms: float                  # data-parallel gradient collectives on the communication stream
    exposed_comm_ms: float          # the part no compute hides
    step_ms: float
    tokens_per_sample: int | None
    peak_hbm_bytes: int
    hbm_bytes: int
    memory: dict[str, int]
    largest_batch: int
    tp: int = 1
    tp_comm_ms: float = 0.0         # tensor-parallel collectives of one micro-batch, on the critical path
    topology: str = ""              # the server topology the cards sit in ("" for one card)
    fuse_vector: bool = False       # chains of Vector kernels run fused (`pypto_lab.lowering.fusion`)
    mc2: bool = False               # tensor-parallel collectives fused with their GEMMs (MC2)
    data_wait_ms: float = 0.0       # the NPU idle, waiting for the loader
    stack: str = ""                 # the software stack the step ran under (`pypto_lab.stack`)
    host_idle_ms: float = 0.0       # the compute stream idle, waiting for the host's dispatch
    loader: Any = None              # the loader's LoaderProfile, when one was given
    input_ms: float = 0.0           # the batch's host-to-device copy and NPU normalisation on the stream
    image_pipeline: Any = None      # the host's image pipeline (`pypto_lab.train.host_input`), when given
    layout: Layout | None = None    # the parallel layout (`pypto_lab.train.parallel`)
    bubble_ms: float = 0.0          # the pipeline's idle time on its busiest stage
    param_gather_ms: float = 0.0    # the sharded optimizer's all-gather of updated weights, exposed part
    cp_comm_ms: float = 0.0         # context parallelism's ring transfers not hidden by attention
    ep_comm_ms: float = 0.0         # expert parallelism's all-to-alls, per micro-batch
    stages: list[StageReport] = field(default_factory=list, repr=False)
    schedule: Schedule | None = field(default=None, repr=False)
    kernels: list[CostedKernel] = field(default_factory=list, repr=False)
    buckets: list[BucketComm] = field(default_factory=list, repr=False)
    unmapped_ops: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def dp(self) -> int:
        return self.layout.dp if self.layout is not None else self.cards // self.tp

    @property
    def global_batch(self) -> int:
        return self.batch * self.dp * self.grad_accum

    @property
    def samples_per_s(self) -> float:
        return self.global_batch * 1e3 / self.step_ms

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens_per_sample is None else self.samples_per_s * self.tokens_per_sample

    @property
    def tokens_per_s_per_card(self) -> float | None:
        t = self.tokens_per_s
        return None if t is None else t / self.cards

    def to_dict(self) -> dict[str, Any]:
        lay = self.layout
        return {
            "model": self.model, "chip": self.chip, "cards": self.cards, "batch": self.batch,
            "global_batch": self.global_batch, "grad_accum": self.grad_accum, "precision": self.precision,
            "amp": self.amp, "optimizer": self.optimizer, "bucket_mb": self.bucket_mb, "checkpoint": self.checkpoint,
            "step_ms": self.step_ms, "samples_per_s": self.samples_per_s, "tokens_per_s": self.tokens_per_s,
            "forward_ms": self.forward_ms, "backward_ms": self.backward_ms, "recompute_ms": self.recompute_ms,
            "optimizer_ms": self.optimizer_ms, "comm_ms": self.comm_ms, "exposed_comm_ms": self.exposed_comm_ms,
            "peak_hbm_bytes": self.peak_hbm_bytes, "hbm_bytes": self.hbm_bytes, "memory": dict(self.memory),
            "largest_batch": self.largest_batch, "tp": self.tp, "tp_comm_ms": self.tp_comm_ms,
            "topology": self.topology, "fuse_vector": self.fuse_vector, "mc2": self.mc2,
            "data_wait_ms": self.data_wait_ms, "stack": self.stack, "host_idle_ms": self.host_idle_ms,
            "layout": None if lay is None else {k: getattr(lay, k) for k in lay.__dataclass_fields__},
            "bubble_ms": self.bubble_ms, "param_gather_ms": self.param_gather_ms, "cp_comm_ms": self.cp_comm_ms,
            "ep_comm_ms": self.ep_comm_ms,
            "stages": [{"stage": s.stage, "layers": [list(c) for c in s.layers], "forward_ms": s.forward_ms,
                        "backward_ms": s.backward_ms, "recompute_ms": s.recompute_ms, "memory": dict(s.memory),
                        "end_ms": s.end_ms, "bubble_ms": s.bubble_ms} for s in self.stages],
            "unmapped_ops": dict(self.unmapped_ops), "notes": list(self.notes),
        }

    def table(self) -> str:
        gb = 2 ** 30
        lay = self.layout
        head = (f"{self.model} training step on {self.cards} x {self.chip} ({self.stack}), batch {self.batch}/card"
                f"{f' x {self.grad_accum} micro-batches' if self.grad_accum > 1 else ''}, {self.precision} "
                f"amp {self.amp}, {self.optimizer}")
        lines = [head]
        if lay is not None and (lay.pp > 1 or lay.cp > 1 or lay.zero or lay.distributed_optimizer or lay.recompute
                                or lay.ep > 1):
            lines.append(f"  layout        {lay.describe()}")
        lines += [f"  forward       {self.forward_ms:9.2f} ms" + ("  (per micro-batch, busiest stage)"
                                                                   if lay is not None and lay.pp > 1 else ""),
                  f"  backward      {self.backward_ms:9.2f} ms"
                  + (f"  (recompute {self.recompute_ms:.2f} ms)" if self.recompute_ms else ""),
                  f"  optimizer     {self.optimizer_ms:9.2f} ms",
                  f"  gradients     {self.comm_ms:9.2f} ms  ({self.exposed_comm_ms:.2f} ms exposed, "
                  f"{len(self.buckets)} buckets of {self.bucket_mb:g} MB)"]
        if self.tp > 1:
            lines.append(f"  TP collectives{self.tp_comm_ms:9.2f} ms  (tp={self.tp}, per micro-batch, on the critical path)")
        if self.cp_comm_ms:
            lines.append(f"  CP ring       {self.cp_comm_ms:9.2f} ms  (per micro-batch, beyond the attention it overlaps)")
        if self.ep_comm_ms:
            lines.append(f"  EP all-to-all {self.ep_comm_ms:9.2f} ms  (per micro-batch)")
        if self.bubble_ms:
            lines.append(f"  bubble        {self.bubble_ms:9.2f} ms  (pipeline idle on the busiest stage)")
        if self.param_gather_ms:
            lines.append(f"  param gather  {self.param_gather_ms:9.2f} ms  (exposed)")
        if self.input_ms:
            lines.append(f"  input         {self.input_ms:9.2f} ms  (the batch's copy and normalisation on the stream)")
        if self.data_wait_ms:
            lines.append(f"  data wait     {self.data_wait_ms:9.2f} ms  (the NPU waits for the loader)")
        lines += [f"  step          {self.step_ms:9.2f} ms  ->  {self.samples_per_s:,.1f} samples/s"
                  + (f", {self.tokens_per_s:,.0f} tokens/s ({self.tokens_per_s_per_card:,.0f} per card)"
                     if self.tokens_per_s else ""),
                  f"  HBM per card  {self.peak_hbm_bytes / gb:9.2f} GiB of {self.hbm_bytes / gb:.1f} GiB "
                  f"(" + ", ".join(f"{k} {v / gb:.2f}" for k, v in self.memory.items()) + ")",
                  f"  largest batch per card that fits: {self.largest_batch}"]
        if len(self.stages) > 1:
            for s in self.stages:
                layers = ", ".join(f"{a}-{b - 1}" for a, b in s.layers)
                lines.append(f"  stage {s.stage:<3} layers {layers:<14} F {s.forward_ms:8.2f} B {s.backward_ms:8.2f} ms"
                             f"  bubble {s.bubble_ms:8.1f} ms  HBM {sum(s.memory.values()) / gb:6.2f} GiB")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def chrome_trace(self, path: str | Path | None = None) -> dict[str, Any]:
        """The step as a Chrome trace (chrome://tracing, Perfetto): the compute stream and the
        communication stream of one card (one micro-batch's kernels and the step's gradient
        buckets) and, for a pipeline, every stage's forward and backward passes with the bubbles
        between them; written whole to ``path`` when given."""
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{self.chip} card 0"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "compute (AI cores)"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "communication (HCCL)"}},
        ]
        for k in self.kernels:
            events.append({"name": k.name, "cat": k.phase, "ph": "X", "pid": 0, "tid": 0, "ts": k.start_us,
                           "dur": k.time_us, "args": {"op": getattr(k.spec, "op", type(k.spec).__name__)}})
        for b in self.buckets:
            if b.stage:
                continue
            events.append({"name": f"{b.kind} bucket {b.index}", "cat": "comm", "ph": "X", "pid": 0, "tid": 1,
                           "ts": b.start_us, "dur": b.time_us, "args": {"bytes": b.nbytes, "ready_us": b.ready_us}})
        if self.schedule is not None and self.schedule.pp > 1:
            sch = self.schedule
            for s in range(sch.pp):
                pid = 1 + s
                events.append({"name": "process_name", "ph": "M", "pid": pid,
                               "args": {"name": f"pipeline stage {s}"}})
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                               "args": {"name": "forward / backward passes"}})
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 1,
                               "args": {"name": "bubble"}})
                for p in sch.of(s):
                    events.append({"name": f"{p.kind}{p.micro}" + (f".{p.chunk}" if sch.vpp > 1 else ""),
                                   "cat": "forward" if p.kind == "F" else "backward", "ph": "X", "pid": pid,
                                   "tid": 0, "ts": p.start_us, "dur": p.end_us - p.start_us,
                                   "args": {"micro_batch": p.micro, "chunk": p.chunk}})
                for a, b in sch.idle(s):
                    events.append({"name": "bubble", "cat": "bubble", "ph": "X", "pid": pid, "tid": 1, "ts": a,
                                   "dur": b - a})
        trace = {"traceEvents": events, "displayTimeUnit": "ms",
                 "otherData": {"step_ms": self.step_ms, "exposed_comm_ms": self.exposed_comm_ms,
                               "bubble_ms": self.bubble_ms}}
        if path is not None:
            write_text_atomic(path, json.dumps(trace))
        return trace


__all__ = ["BucketComm", "StageReport", "TrainReport"]
