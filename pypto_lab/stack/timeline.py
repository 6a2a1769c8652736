"""The one model of how a stack runs a step's kernels: host dispatch, device launch, overlap.

Every front end costs a step through here (`optimize`'s schedule, an LLM engine step, a training
step), so a stack's constants mean the same thing everywhere.

On one stream, in order: the host spends ``step_host_us`` first, then dispatches each kernel
(``dispatch_us`` each); the device starts a kernel when the one before it has ended and the host
has dispatched it, and spends ``launch_us`` launching it before its own time. With
``host_device_overlap`` the host runs ahead (an asynchronous task queue), so the step is bound by
whichever is slower; without it an eager host waits for each kernel to end before it dispatches
the next (a graph or a sunk model has its kernels on the device already: nothing to wait for). A collective's launch is HCCL's, inside its own time (`pypto_lab.hw.collectives`): the stack
adds no launch to it. A kernel run ``count`` times in a row (a layer's kernel over ``layers``
layers) is placed in closed form: with ``u`` its device time plus launch and ``h`` the dispatch,
the last run ends at ``max(F + c u, H + h + (c - 1) max(h, u) + u)`` (``F`` the device free, ``H``
the host clock), the recurrence of placing them one by one.

On an eager stack the model's own code runs on the host around the kernels: a kernel may carry
``code_ops``, the operations of the code per run that the step's kernel list does not show one by
one (views, reshapes, splits, no-op casts: no kernel; and the code's own small kernels the list
shows fused), each costing the stack's ``host_op_us``, and ``code_dispatches``, how many of them
launch a kernel (each also a ``dispatch_us``). They lengthen that kernel's host time per run
(``h`` above); the device still runs only the listed kernel, so when the host is slower the device
waits: the host-bound regime of an eager decode step. A graph stack runs no Python per operation:
both are ignored there.

A graph cut at each attention layer (vLLM's PIECEWISE cudagraph mode, ``Stack.layer_host_us``):
the kernel that opens a layer's attention is marked ``graph_break``. Kernels in program order (one
run each, `optimize`'s) take ``layer_host_us`` of host before each such kernel, as a dispatch. For
kernels grouped by kind over ``L`` layers (the LLM engine's), the host spends ``layer_host_us`` per
layer (the eager attention and the replay of the next graph piece) while the device runs the layers
already given to it, so the step lasts at least ``L h + u`` plus the kernels outside the layers
(``u`` one layer's device time, the last layer's, after the host is done): a host slower than the
device per layer makes the step host-bound, a faster one changes nothing (`_cut_at_attention`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .preset import Stack


@dataclass(frozen=True)
class Launch:
    """What the stack needs of a kernel: its time on the device per run, how many runs in a row,
    whether it is a collective (launched by HCCL), and whether the stack's per-run IncreFlashAttention
    overhead is charged on it (`Stack.ifa_overhead_us`, `KernelSpec.ifa_overhead`)."""

    device_us: float
    count: int = 1
    collective: bool = False
    ifa_overhead: bool = False
    graph_break: bool = False   # the host runs each layer's attention outside the graph (Stack.layer_host_us)
    code_ops: float = 0.0          # the model code's operations per run charged host_op_us (eager stacks)
    code_dispatches: float = 0.0   # how many of them launch a kernel: each a dispatch_us as well


@dataclass(frozen=True)
class Placed:
    """Where a kernel's runs sit on the step: the first run's start, the last run's end, and the
    stack's launch cost charged to each run."""

    start_us: float
    end_us: float
    launch_us: float


@dataclass(frozen=True)
class StepTimeline:
    """A step on one stream: each kernel's place, the step's length and where it went."""

    placed: tuple[Placed, ...]
    step_us: float
    device_us: float      # the kernels' own time
    launch_us: float      # the stack's device-side launches
    host_us: float        # step host time + every dispatch
    stack: str

    @property
    def idle_us(self) -> float:
        """Device time spent waiting for the host (dispatch, step host time)."""
        return max(0.0, self.step_us - self.device_us - self.launch_us)

    @property
    def host_bound(self) -> bool:
        """The device waits for the host for more than a tenth of the step."""
        return self.idle_us > 0.1 * self.step_us


def host_waits(stack: Stack) -> bool:
    """Whether the host waits for each kernel before it dispatches the next: an eager stack without
    an asynchronous queue. A graph or a sunk model has its kernels on the device already."""
    return stack.runs == "eager" and not stack.host_device_overlap


def code_host_us(stack: Stack, code_ops: float = 0.0, code_dispatches: float = 0.0) -> float:
    """Host time per run of the model code's operations around a kernel (see the module docstring):
    ``code_ops * host_op_us + code_dispatches * dispatch_us`` on an eager stack, 0 on any other."""
    if stack.runs != "eager" or not (code_ops or code_dispatches):
        return 0.0
    return code_ops * stack.host_op_us + code_dispatches * stack.dispatch_us


def launch_cost(stack: Stack, collective: bool, ifa_overhead: bool = False) -> float:
    """The stack's device-side launch of one kernel run (none for a collective: HCCL's is in its
    time), with the stack's per-run overhead of IncreFlashAttention over a preallocated cache."""
    if collective:
        return 0.0
    return stack.launch_us + (stack.ifa_overhead_us if ifa_overhead else 0.0)


class Stream:
    """One stream of a step under a stack, filled in program order: `run` places the next kernel
    (``count`` runs in a row) and returns where it sits; `timeline` sums the step up."""

    def __init__(self, stack: Stack, start_us: float = 0.0):
        self.stack = stack
        self.start = start_us
        self.host = start_us + stack.step_host_us   # when the host dispatches the next kernel
        self.free = start_us                        # when the device has finished the last one
        self.placed: list[Placed] = []
        self.device = self.launched = 0.0
        self.dispatches = 0
        self.code_host = 0.0                        # host time of the model code's own operations
        self.breaks = 0                             # attention layers run from the host (layer_host_us)

    @property
    def now_us(self) -> float:
        """When the last kernel placed so far ends."""
        return self.free

    def run(self, device_us: float, count: int = 1, collective: bool = False, ifa_overhead: bool = False,
            graph_break: bool = False, code_ops: float = 0.0, code_dispatches: float = 0.0) -> Placed:
        """Place ``count`` runs of a kernel taking ``device_us`` each on the device (``ifa_overhead``:
        the stack's per-run IncreFlashAttention overhead is charged on it; ``graph_break``: it opens a
        layer's attention, which a graph cut at the attention runs from the host,
        ``Stack.layer_host_us`` before each run; ``code_ops``, ``code_dispatches``: the model code's
        host operations per run, `code_host_us`)."""
        c = int(count)
        if c <= 0:
            p = Placed(self.free, self.free, 0.0)
            self.placed.append(p)
            return p
        extra = code_host_us(self.stack, code_ops, code_dispatches)
        stack, h = self.stack, self.stack.dispatch_us + extra
        if graph_break and stack.layer_host_us:
            h += stack.layer_host_us
            self.breaks += c
        launch = launch_cost(stack, collective, ifa_overhead)
        u = device_us + launch
        if not host_waits(stack):
            first = max(self.free, self.host + h)
            end = max(self.free + c * u, self.host + h + (c - 1) * max(h, u) + u)
            self.host += c * h
        else:  # the host dispatches a run, waits for it, dispatches the next
            first = max(self.free, self.host) + h
            end = max(self.free, self.host) + c * (h + u)
            self.host = end
        p = Placed(first, end, launch)
        self.placed.append(p)
        self.free = end
        self.device += c * device_us
        self.launched += c * launch
        self.dispatches += c
        self.code_host += c * extra
        return p

    def wait(self, until_us: float) -> None:
        """The stream waits for an event of another stream (a collective it depends on)."""
        self.free = max(self.free, until_us)
        self.host = max(self.host, until_us) if host_waits(self.stack) else self.host

    def timeline(self) -> StepTimeline:
        return StepTimeline(tuple(self.placed), self.free - self.start, self.device, self.launched,
                            self.stack.step_host_us + self.dispatches * self.stack.dispatch_us + self.code_host
                            + self.breaks * self.stack.layer_host_us, self.stack.name)


def run_in_order(kernels: Sequence[Launch], stack: Stack, start_us: float = 0.0) -> StepTimeline:
    """Place ``kernels`` one after another on one stream under ``stack`` (see the module docstring)."""
    # kernels in program order (one run each) take the host's time per layer where it falls; a
    # layer's kernels grouped by kind (``count`` runs in a row, the LLM engine's) in closed form
    grouped = next((k.count for k in kernels if k.graph_break and k.count > 1), 0) if stack.layer_host_us else 0
    stream = Stream(stack, start_us)
    for k in kernels:
        stream.run(k.device_us, k.count, k.collective, k.ifa_overhead, k.graph_break and not grouped, k.code_ops,
                   k.code_dispatches)
    tl = stream.timeline()
    return _cut_at_attention(tl, kernels, grouped, stack) if grouped else tl


def _cut_at_attention(tl: StepTimeline, kernels: Sequence[Launch], layers: int, stack: Stack) -> StepTimeline:
    """A graph cut at each of ``layers`` attention layers: the host spends ``layer_host_us`` per layer
    (the eager attention, the next piece's replay) while the device runs the layers it was given: the
    step lasts at least the host's ``layers * h``, then the last layer on the device (``u``: every
    kernel run once per layer, with its launch) and the kernels outside the layers (embedding, LM
    head, sampling); the step is the longer of that and the kernels' own timeline."""
    h = stack.layer_host_us
    per_layer = sum((k.device_us + launch_cost(stack, k.collective, k.ifa_overhead)) * k.count
                    for k in kernels if k.count == layers) / layers
    rest = sum((k.device_us + launch_cost(stack, k.collective, k.ifa_overhead)) * k.count
               for k in kernels if k.count != layers)
    host_bound = stack.step_host_us + layers * h + per_layer + rest
    return StepTimeline(tl.placed, max(tl.step_us, host_bound), tl.device_us, tl.launch_us,
                        tl.host_us + layers * h, tl.stack)


class HostClock:
    """The host side of a step, for schedules that place kernels on several streams: when each
    kernel, in program order, has been dispatched."""

    def __init__(self, stack: Stack, start_us: float = 0.0):
        self.stack = stack
        self.t = start_us + stack.step_host_us

    def dispatch(self, graph_break: bool = False) -> float:
        """Dispatch the next kernel (``graph_break``: it opens a layer's attention, run from the host
        outside a graph cut there, `Stack.layer_host_us`); the time from which the device may start it."""
        self.t += self.stack.dispatch_us + (self.stack.layer_host_us if graph_break else 0.0)
        return self.t

    def kernel_ended(self, end_us: float) -> None:
        """A host that does not run ahead waits for each kernel to end before the next dispatch."""
        if host_waits(self.stack):
            self.t = max(self.t, end_us)


__all__ = ["HostClock", "Launch", "Placed", "StepTimeline", "Stream", "code_host_us", "launch_cost", "run_in_order"]
