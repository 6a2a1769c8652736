"""Scheduling analysis: when each kernel runs, on which cores, and what the model's latency is.

On one stream (levels 0-2) kernels run one after another in graph order: the latency is the sum
of kernel times. On two streams (level 3: "aggressive, may change the order of computation", as
the seed article describes its level 3) a kernel starts as soon as the kernels it reads from have
finished and the cores it needs are free. On 910B the Cube (AIC) and Vector (AIV) cores are
separate, so a Vector kernel can run while an independent Cube-only kernel occupies the AIC cores
(a Cube kernel with a Vector epilogue, and fused attention, hold both); on 910A and 310P every
kernel occupies the whole AI Core, so nothing overlaps and only the dependency order matters. A
kernel running on the host (a CPU fallback) holds the host lane.

How the kernels reach the chip is the software stack's (`pypto_lab.stack`): on one stream the
step is `pypto_lab.stack.timeline.run_in_order`'s (host dispatch, device launch, host/device
overlap), so the schedule here and the LLM and training steps use one model; on two streams each
kernel becomes ready when the host has dispatched it (`HostClock`) and pays the stack's launch
before its own time. Fusion's fewer kernels show up in the latency through the launches.

The result is a `Schedule` that lives in the `Report`; the graph is not touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..capture.graph import Graph
from ..kernels.ir import AttentionKernel, IncreAttentionKernel
from ..lowering.costing import CostedKernel
from ..stack import HostClock, Stack, get_stack, run_in_order
from ..stack.timeline import Launch, launch_cost


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
    stack: Stack

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
                + f"; {self.stack.name}: {self.stack.launch_us:g} us launch"
                + (f", {self.stack.dispatch_us:g} us host dispatch" if self.stack.dispatch_us else "") + " per kernel"
                + (f", {self.stack.step_host_us:g} us host per step" if self.stack.step_host_us else ""))

    @property
    def launch_us(self) -> float:
        """The stack's device-side launch of one kernel."""
        return self.stack.launch_us


def kernel_dependencies(graph: Graph, kernels: list[CostedKernel]) -> list[set[int]]:
    """For each kernel, the kernels whose outputs it reads (views looked through)."""
    last_of_node: dict[str, int] = {}
    first_of_node: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for name in k.nodes:
            last_of_node[name] = i  # a decomposed node's primitives: the last one produces its output
            first_of_node.setdefault(name, i)
    deps: list[set[int]] = [set() for _ in kernels]
    for i, k in enumerate(kernels):
        for name in k.nodes:
            if first_of_node[name] < i:  # the next primitive of a decomposed node
                deps[i].add(i - 1)
    owner: dict[str, set[int]] = {}
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


def schedule_kernels(graph: Graph, kernels: list[CostedKernel], concurrent: bool,
                     stack: Stack | str) -> Schedule:
    """Start and end of every kernel under ``stack``: in order on one stream, or as early as
    dependencies, the host's dispatch and free cores allow."""
    stack = get_stack(stack)
    out = []
    # a graph cut at each attention (vLLM's PIECEWISE mode) runs every attention kernel from the host
    brk = [bool(stack.layer_host_us) and isinstance(k.spec, (AttentionKernel, IncreAttentionKernel)) for k in kernels]
    if not concurrent:
        line = run_in_order([Launch(k.time_us, graph_break=b) for k, b in zip(kernels, brk)], stack)
        for k, p in zip(kernels, line.placed):
            out.append(ScheduledKernel(k.name, k.resources, p.start_us, p.end_us))
        return Schedule(tuple(out), concurrent, stack)
    deps = kernel_dependencies(graph, kernels)
    clock = HostClock(stack)
    free: dict[str, float] = {}
    ends: list[float] = []
    for i, k in enumerate(kernels):
        ready = max([clock.dispatch(brk[i])] + [ends[j] for j in deps[i] if j < i])
        start = max([ready] + [free.get(r, 0.0) for r in k.resources])
        end = start + launch_cost(stack, False) + k.time_us
        clock.kernel_ended(end)
        for r in k.resources:
            free[r] = end
        ends.append(end)
        out.append(ScheduledKernel(k.name, k.resources, start, end))
    return Schedule(tuple(out), concurrent, stack)


__all__ = ["Schedule", "ScheduledKernel", "kernel_dependencies", "schedule_kernels"]
