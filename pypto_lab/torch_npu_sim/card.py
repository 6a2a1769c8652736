"""The simulated card of ``pypto-lab run``: a host clock, the card's streams and events, its HBM, and
the record of every kernel and copy placed on them.

Timing follows the software stack (`pypto_lab.stack`) as every other front end does
(`pypto_lab.stack.timeline`): the host spends the stack's ``dispatch_us`` on each kernel it
launches, the device starts a kernel when its stream is free and the host has dispatched it, and
spends the stack's ``launch_us`` before the kernel's own time (the coster's, `pypto_lab.kernels`).
With the stack's asynchronous task queue (``host_device_overlap``: torch_npu's TASK_QUEUE_ENABLE)
the host runs ahead; otherwise it waits for each kernel. A graph-mode stack (``torchair-graph``)
dispatches nothing from the host per kernel, but the kernels are still the script's eager
operators: no graph compiler fuses them here (only the operator-level ``sdpa_flash`` of a stack is
applied, `eager.EagerLowering`), and a step's ``step_host_us`` is not charged (a script has no
steps). Streams run side by side where their kernels hold different cores: a kernel holds the cores its
coster names (``KernelCost.resources``: the 910B's AIC or AIV cores, or whole AI Cores), so a
Cube kernel on one stream and a Vector kernel on another overlap on a split-core chip, two Cube
kernels do not. What makes the host wait for the device is
what makes it wait on a card: ``torch.npu.synchronize()``, ``Stream.synchronize()``,
``Event.synchronize()``, a copy to the host (``.cpu()``, ``.item()``, printing a tensor), a blocking
copy to the card (``.npu()`` without ``non_blocking``: torch_npu copies from pageable memory and
waits for the stream), and an operator the lowering table does not know (run on the host: the card
is drained, the data cross the link both ways, `pypto_lab.kernels.host`).

Copies between host and card cross the chip's host link (``chip.host_link_gbps``), costed as a
`HostKernel` moving the bytes, plus the stack's dispatch. An event records where its stream has got
to when the host enqueues it (``max(stream free, host clock)``), so ``start.elapsed_time(end)`` is
what the card's event timer would read, host gaps included.

Memory is the card's HBM: every tensor the card holds has its storage counted once (rounded up to
512 bytes, torch_npu's smallest block), from the moment it is made until the host's storage is
freed (a weak reference on the storage; ``torch.npu.memory_allocated()`` and an allocation that
would not fit first collect what only reference cycles keep alive). ``memory_allocated`` is the live total, the peak is kept,
and an allocation beyond ``chip.hbm_bytes`` raises ``torch.OutOfMemoryError`` with torch_npu's
message ("NPU out of memory. Tried to allocate ...").
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field

import torch

from ..hw.chip import Chip
from ..kernels.cost import KernelCost, cost
from ..kernels.ir import HostKernel, KernelSpec
from ..stack import Stack
from ..stack.timeline import host_waits, launch_cost

BLOCK = 512                     # torch_npu's caching allocator rounds every block up to 512 bytes
RESERVE_SEGMENT = 2 * 2 ** 20   # what memory_reserved rounds the live total up to


@dataclass
class Record:
    """One kernel or copy on the card's timeline (times in us from the start of the run)."""

    index: int
    kind: str                  # "kernel", "memcpy" (host <-> card), "host" (an operator run on the host)
    op: str                    # the operator the script called: "addmm", "npu_rms_norm", "MemcpyH2D"
    name: str                  # the kernel: "MatMulV2:addmm"
    op_type: str               # the CANN operator: "MatMulV2"
    spec: KernelSpec | None
    cost: KernelCost
    stream: int
    host_start: float
    host_end: float
    start: float
    end: float
    launch_us: float
    shapes: tuple = ()
    dtypes: tuple = ()
    nbytes: int = 0

    @property
    def device_us(self) -> float:
        """The kernel's own time on the device (the coster's), launch excluded."""
        return self.cost.time_us

    @property
    def bound(self) -> str:
        return self.cost.bound or ("link" if self.kind in ("memcpy", "host") else "")


@dataclass
class StreamState:
    index: int
    free: float = 0.0           # when the last work placed on it ends


@dataclass
class EventState:
    time: float | None = None   # None until recorded


class OutOfMemory(torch.OutOfMemoryError):
    """torch_npu's out-of-memory error (a ``torch.OutOfMemoryError``, itself a ``RuntimeError``)."""


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"


def storage_key(t) -> int | None:
    """The identity of a tensor's storage (views share it), None for a tensor without one."""
    try:
        return t.untyped_storage()._cdata
    except Exception:   # noqa: BLE001  (sparse, nested, meta, functional wrappers: no host storage)
        return None


@dataclass
class Memory:
    """The card's HBM: live storages and their rounded sizes."""

    capacity: int
    live: dict[int, int] = field(default_factory=dict)
    allocated: int = 0
    peak: int = 0
    allocations: int = 0

    def holds(self, t) -> bool:
        key = storage_key(t)
        return key is not None and key in self.live

    def check(self, nbytes: int) -> None:
        """Raise torch_npu's out-of-memory error if ``nbytes`` more do not fit (after collecting the
        tensors only a reference cycle kept alive, as torch_npu frees its cached blocks and retries)."""
        need = -(-int(nbytes) // BLOCK) * BLOCK
        if self.allocated + need > self.capacity:
            self.collect()
        if self.allocated + need > self.capacity:
            free = max(0, self.capacity - self.allocated)
            raise OutOfMemory(
                f"NPU out of memory. Tried to allocate {fmt_bytes(need)} (NPU 0; {fmt_bytes(self.capacity)} total "
                f"capacity; {fmt_bytes(self.allocated)} already allocated; {fmt_bytes(free)} free; "
                f"{fmt_bytes(self.reserved)} reserved in total by PyTorch) [simulated card: pypto-lab run]")

    def add(self, t) -> bool:
        """Count ``t``'s storage as held by the card (once); False if it already was or has none."""
        try:
            storage = t.untyped_storage()
        except Exception:   # noqa: BLE001
            return False
        key = storage._cdata
        if key in self.live:
            return False
        nbytes = -(-int(storage.nbytes()) // BLOCK) * BLOCK
        self.check(nbytes)
        self.live[key] = nbytes
        self.allocated += nbytes
        self.allocations += 1
        self.peak = max(self.peak, self.allocated)
        weakref.finalize(storage, self._free, key)
        return True

    def _free(self, key: int) -> None:
        n = self.live.pop(key, None)
        if n is not None:
            self.allocated -= n

    def collect(self) -> int:
        """The live total once tensors held only by reference cycles are freed (Python frees those at
        its garbage collector's pace, the card's allocator at once)."""
        gc.collect()
        return self.allocated

    @property
    def reserved(self) -> int:
        return -(-self.allocated // RESERVE_SEGMENT) * RESERVE_SEGMENT

    @property
    def peak_reserved(self) -> int:
        return -(-self.peak // RESERVE_SEGMENT) * RESERVE_SEGMENT

    def reset_peak(self) -> None:
        self.peak = self.allocated


class Card:
    """The timeline of one simulated card under a software stack (see the module docstring)."""

    def __init__(self, chip: Chip, stack: Stack):
        self.chip = chip
        self.stack = stack
        self.host = 0.0
        self.streams: list[StreamState] = [StreamState(0)]
        self.current = 0
        self.records: list[Record] = []
        self.memory = Memory(int(chip.hbm_bytes))
        self.busy: dict[str, float] = {}   # when each kind of core ("AIC", "AIV", "AI Core") is free again
        self.sync_waits = 0.0   # host time spent waiting for the device
        self.syncs = 0

    # ---- streams
    def new_stream(self) -> int:
        self.streams.append(StreamState(len(self.streams), self.host))
        return len(self.streams) - 1

    def stream(self, index: int | None = None) -> StreamState:
        return self.streams[self.current if index is None else index]

    @property
    def device_free(self) -> float:
        return max(s.free for s in self.streams)

    def _wait(self, until: float) -> None:
        if until > self.host:
            self.sync_waits += until - self.host
            self.host = until
        self.syncs += 1

    # ---- placing work
    def launch(self, op: str, name: str, op_type: str, spec: KernelSpec, c: KernelCost, shapes=(), dtypes=()) -> Record:
        """One kernel dispatched by the host and run on the current stream."""
        s = self.stream()
        host_start = self.host
        self.host += self.stack.dispatch_us
        launch = launch_cost(self.stack, False, bool(getattr(spec, "ifa_overhead", False)))
        cores = c.resources or ("AI Core",)
        start = max([s.free, self.host] + [self.busy.get(r, 0.0) for r in cores])
        end = start + launch + c.time_us
        s.free = end
        for r in cores:
            self.busy[r] = end
        if host_waits(self.stack):
            self.host = end
        return self._add("kernel", op, name, op_type, spec, c, s.index, host_start, self.host, start, end, launch,
                         shapes, dtypes)

    def host_op(self, op: str, spec: HostKernel, c: KernelCost, shapes=(), dtypes=()) -> Record:
        """An operator the card cannot run: the host waits for the card, the data cross the link to
        the host and back (the coster's time); both sides are busy for it."""
        s = self.stream()
        host_start = self.host
        self._wait(self.device_free)
        start = self.host + self.stack.dispatch_us
        end = start + c.time_us
        self.host = end
        s.free = end
        return self._add("host", op, f"cpu:{op}", "HostFallback", spec, c, s.index, host_start, end, start, end, 0.0,
                         shapes, dtypes)

    def memcpy(self, direction: str, nbytes: int, blocking: bool, shapes=(), dtypes=()) -> Record:
        """A copy of ``nbytes`` between host and card ("H2D" or "D2H") on the current stream; a
        blocking one makes the host wait for the stream and the copy."""
        s = self.stream()
        spec = HostKernel(f"Memcpy{direction}", int(nbytes) if direction == "D2H" else 0,
                          int(nbytes) if direction == "H2D" else 0)
        c = cost(spec, self.chip)
        host_start = self.host
        self.host += self.stack.dispatch_us
        start = max(s.free, self.host)
        end = start + c.time_us
        s.free = end
        if blocking:
            self._wait(end)
        name = f"Memcpy{direction}"
        return self._add("memcpy", name, name, name, spec, c, s.index, host_start, self.host, start, end, 0.0,
                         shapes, dtypes, nbytes)

    def _add(self, kind, op, name, op_type, spec, c, stream, host_start, host_end, start, end, launch, shapes, dtypes,
             nbytes=0) -> Record:
        r = Record(len(self.records), kind, op, name, op_type, spec, c, stream, host_start, host_end, start, end, launch,
                   tuple(shapes), tuple(dtypes), int(nbytes))
        self.records.append(r)
        return r

    # ---- synchronisation
    def synchronize(self) -> None:
        """``torch.npu.synchronize()``: the host waits for every stream."""
        self._wait(self.device_free)

    def synchronize_stream(self, index: int) -> None:
        self._wait(self.streams[index].free)

    def record_event(self, ev: EventState, stream: int | None = None) -> None:
        s = self.stream(stream)
        ev.time = max(s.free, self.host)

    def wait_event(self, ev: EventState, stream: int | None = None) -> None:
        if ev.time is not None:
            s = self.stream(stream)
            s.free = max(s.free, ev.time)

    def tick(self, us: float) -> None:
        """Host time the script itself spends (a read of the clock)."""
        self.host += us

    # ---- totals
    def totals(self) -> dict:
        kernels = [r for r in self.records if r.kind == "kernel"]
        end = max([self.host, self.device_free] + [r.end for r in self.records])
        busy = _union([(r.start, r.end) for r in self.records])
        return {
            "wall_us": end,
            "host_us": self.host,
            "dispatch_us": sum(r.host_end - r.host_start for r in kernels if r.host_end >= r.host_start),
            "device_busy_us": busy,
            "kernel_us": sum(r.device_us for r in kernels),
            "launch_us": sum(r.launch_us for r in kernels),
            "memcpy_us": sum(r.end - r.start for r in self.records if r.kind == "memcpy"),
            "host_fallback_us": sum(r.end - r.start for r in self.records if r.kind == "host"),
            "device_idle_us": max(0.0, end - busy),
            "sync_wait_us": self.sync_waits,
            "kernels": len(kernels),
            "peak_hbm_bytes": self.memory.peak,
            "hbm_bytes": self.memory.capacity,
        }


def _union(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


__all__ = ["BLOCK", "Card", "EventState", "Memory", "OutOfMemory", "Record", "StreamState", "fmt_bytes", "storage_key"]
