"""Scheduling: when each kernel runs, on which cores, and what the model's latency is.

Without this pass (levels 0-2) kernels run one after another on one stream, in graph order: the
latency is the sum of kernel times. With it (level 3: "aggressive, may change the order of
computation", as the seed article describes its level 3) kernels go to two streams, and a kernel
starts as soon as the kernels it reads from have finished and the cores it needs are free. On
910B the Cube (AIC) and Vector (AIV) cores are separate, so a Vector kernel can run while an
independent Cube-only kernel occupies the AIC cores (a Cube kernel with a Vector epilogue, and
fused attention, hold both); on 910A and 310P every kernel occupies the whole AI Core, so
nothing overlaps and only the dependency order matters. A kernel running on the host (a CPU
fallback) holds the host lane.

``kernel_launch_us`` (an optimisation option, default 0) adds a fixed cost to every kernel: no
public figure for Ascend's per-kernel launch cost was found, so it is the user's to set when
studying small, launch-bound batches; fusion's fewer kernels then show up in the latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..capture.graph import Graph
from ..hw.chip import get_chip
from ..kernels.cost import KernelCost, cost_graph
from ..passes.base import Pass, PassContext, PassResult, register


@dataclass(frozen=True)
class ScheduledKernel:
    name: str
    resources: tuple[str, ...]
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Schedule:
    kernels: tuple[ScheduledKernel, ...]
    concurrent: bool
    launch_us: float

    @property
    def latency_us(self) -> float:
        return max((k.end_us for k in self.kernels), default=0.0)

    @property
    def serial_us(self) -> float:
        return sum(k.end_us - k.start_us for k in self.kernels)

    def summary(self) -> str:
        overlap = self.serial_us - self.latency_us
        mode = "two streams, dependencies only" if self.concurrent else "one stream, in order"
        return (f"{len(self.kernels)} kernels, {mode}: {self.latency_us:,.1f} us"
                + (f" ({overlap:,.1f} us of overlap)" if overlap > 1e-6 else "")
                + (f", {self.launch_us:g} us launch each" if self.launch_us else ""))


def _kernel_deps(graph: Graph, costs: list[KernelCost]) -> list[set[int]]:
    """For each kernel, the kernels whose outputs it reads (views looked through)."""
    owner: dict[str, set[int]] = {}
    last_of_node: dict[str, int] = {}
    for i, c in enumerate(costs):
        for name in c.nodes:
            last_of_node[name] = i  # a decomposed node's primitives: the last one produces its output
    deps: list[set[int]] = [set() for _ in costs]
    first_of_node: dict[str, int] = {}
    for i, c in enumerate(costs):
        for name in c.nodes:
            first_of_node.setdefault(name, i)
    for i, c in enumerate(costs):
        for name in c.nodes:
            if first_of_node[name] < i:  # the next primitive of a decomposed node
                deps[i].add(i - 1)
    for node in graph.nodes:
        reads: set[int] = set()
        for inp in node.inputs:
            reads |= owner.get(inp, set())
        if node.name in first_of_node:
            deps[first_of_node[node.name]] |= reads - {first_of_node[node.name]}
            owner[node.name] = {last_of_node[node.name]}
        else:  # a view: its readers depend on what it views
            owner[node.name] = reads
    return deps


def schedule_kernels(graph: Graph, costs: list[KernelCost], concurrent: bool, launch_us: float = 0.0) -> Schedule:
    """Start and end of every kernel: in order on one stream, or as early as dependencies and cores allow."""
    if launch_us < 0:
        raise ValueError(f"kernel_launch_us = {launch_us!r}: must be >= 0 (microseconds per kernel)")
    deps = _kernel_deps(graph, costs)
    free: dict[str, float] = {}
    ends: list[float] = []
    out = []
    prev_end = 0.0
    for i, c in enumerate(costs):
        ready = max((ends[j] for j in deps[i] if j < i), default=0.0)
        if not concurrent:
            ready = max(ready, prev_end)
        start = max([ready] + [free.get(r, 0.0) for r in c.resources])
        end = start + c.time_us + launch_us
        for r in c.resources:
            free[r] = end
        ends.append(end)
        prev_end = end
        out.append(ScheduledKernel(c.name, c.resources, start, end))
    return Schedule(tuple(out), concurrent, launch_us)


@register
class ScheduleKernels(Pass):
    name = "schedule"
    requires = ("map_ops",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        chip = get_chip(ctx.chip or "Ascend910B1")
        launch = float(ctx.options.get("kernel_launch_us", 0.0) or 0.0)
        sched = schedule_kernels(graph, cost_graph(graph, chip, ctx.precision), concurrent=True, launch_us=launch)
        graph.schedule = sched
        return PassResult(graph, modified=True, notes=[sched.summary()])
