"""Plan device memory (GM) for one inference run, with and without buffer reuse.

Tensors, at kernel granularity (`kernels_of` order):

* every graph value of kind input/param/buffer/constant that some node reads (or that is a graph
  output) is resident for the whole run; so is the bias a folded BatchNorm adds to a convolution
  (``node.folded_bn``) that had none. Values nothing reads any more (a folded BN's own
  parameters) are not on the device;
* every tensor a kernel writes to GM (the output of one of its nodes that a node outside the
  kernel reads, or that is a graph output) is allocated when its kernel runs and freed after the
  last kernel that reads it; graph outputs live to the last kernel. A view (unit "free", outside
  any group) aliases its input, so reads through views are reads of the tensor they alias. A node
  on the CPU lane runs between two kernels: its inputs stay live up to the kernel before it and
  its output (uploaded) is live from the kernel after it. In-place ATen ops (``relu_``) get a
  buffer of their own, as in the functional graph (an upper bound).

Sizes: the graph is captured in float32; floating tensors take the element size of the run's
precision (fp32 4 bytes, fp16/bf16 2, int8 1), weights as well; integer and bool tensors keep
their own dtype's size. Every allocation is rounded up to 512 bytes, as Ascend's GM allocator
aligns.

Two plans: without reuse every tensor has its own buffer (peak = all resident bytes + all
activation bytes); with reuse a greedy best-fit offset allocator places each kernel's outputs in
the smallest freed block that fits (coalescing neighbours, growing the arena only when none fits).

Allocators (``allocator=``; `pypto_lab.set_memory_allocator` picks it for `optimize`):

* "naive": no reuse, every tensor its own buffer;
* "unified": one arena for all tensors, greedy best-fit reuse with coalescing (the plan above);
* "caching": a caching allocator as PyTorch's and torch_npu's are built: a request up to 1 MiB
  is rounded up to 512 bytes, a larger one to a multiple of 2 MiB; a freed block is cached and
  reused whole (not split, not merged) by a later request that fits it, best fit first; when no
  cached block fits, a new block is reserved, and reserved memory is never given back. Weights
  are blocks of their own, rounded the same way. Its peak is the reserved total (the 2 MiB
  segments that small blocks are carved from are not modelled).

`memory_plan(graph, precision, reuse | allocator)` is an analysis: its `MemoryPlan` lives in the
`Report`; the graph is not touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..capture.graph import Graph, Node, TensorInfo
from ..lowering.lower import kernels_of
from ..passes.options import ALLOCATORS

ALIGN = 512  # bytes: Ascend's GM allocator aligns every block
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
RESIDENT_KINDS = ("input", "param", "buffer", "constant")


class Buffer(NamedTuple):
    """One GM block: ``[offset, offset + size)`` holds ``name`` from kernel ``first`` to ``last``."""

    name: str
    offset: int
    size: int
    first: int
    last: int


@dataclass
class MemoryPlan:
    """GM for one inference run. ``buffers`` are the chosen plan's blocks, resident ones first
    (``first`` 0, ``last`` the last kernel), offsets absolute; ``live_bytes[i]`` is what is live
    while kernel ``i`` runs (resident + its inputs, outputs and every tensor still to be read)."""

    peak_bytes: int
    peak_bytes_no_reuse: int
    peak_bytes_reuse: int
    resident_bytes: int
    live_bytes: list[int]
    buffers: list[Buffer]
    reuse: bool = True
    precision: str = "fp16"
    weight_bytes: int = 0          # params, buffers, constants (and folded biases) among the resident
    kernel_count: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # memory_pool / allocator as given
    allocator: str = ""            # "naive" | "unified" | "caching"; "" for the reuse flag's plan
    peak_bytes_caching: int = 0

    @property
    def activation_bytes(self) -> int:
        """Every kernel output's own (aligned) buffer: what no reuse allocates on top of the resident."""
        return self.peak_bytes_no_reuse - self.resident_bytes

    @property
    def saving(self) -> float:
        """Fraction of the no-reuse peak that reuse saves."""
        return 1 - self.peak_bytes_reuse / self.peak_bytes_no_reuse if self.peak_bytes_no_reuse else 0.0

    def summary(self) -> str:
        mb = 1e6
        w = f"weights {self.weight_bytes / mb:.1f} MB resident"
        other = self.resident_bytes - self.weight_bytes
        if other:
            w += f" (+ inputs {other / mb:.1f} MB)"
        if self.allocator == "caching":
            return (f"peak GM {self.peak_bytes / mb:.1f} MB reserved by the caching allocator ("
                    f"{self.peak_bytes_reuse / mb:.1f} MB unified best-fit, {self.peak_bytes_no_reuse / mb:.1f} MB "
                    f"without reuse); {w}")
        if self.reuse:
            return (f"peak GM {self.peak_bytes_reuse / mb:.1f} MB with reuse ({self.peak_bytes_no_reuse / mb:.1f} MB "
                    f"without, {-100 * self.saving:.1f} %); {w}")
        return (f"peak GM {self.peak_bytes_no_reuse / mb:.1f} MB without reuse (reuse would give "
                f"{self.peak_bytes_reuse / mb:.1f} MB, {-100 * self.saving:.1f} %); {w}")


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _nbytes(info: TensorInfo | None, elem: int) -> int:
    if info is None:
        return 0
    return info.numel * elem if info.dtype in FLOAT_DTYPES else info.nbytes


def _is_view(node: Node) -> bool:
    return node.is_view


class _Tensor:
    __slots__ = ("name", "size", "first", "last")

    def __init__(self, name: str, size: int, first: int, last: int):
        self.name, self.size, self.first, self.last = name, size, first, last


def _best_fit(tensors: list[_Tensor], base: int, n_kernels: int) -> tuple[dict[str, int], int]:
    """Offsets (from ``base``) of the tensors under greedy best-fit reuse, and the arena's top."""
    by_first: dict[int, list[_Tensor]] = {}
    for t in tensors:
        by_first.setdefault(t.first, []).append(t)
    free: list[list[int]] = []      # [offset, size], sorted by offset, coalesced
    live: list[tuple[int, int, int]] = []  # (last, offset, size)
    offsets: dict[str, int] = {}
    top = 0
    for i in range(n_kernels):
        still = []
        for last, off, size in live:
            if last < i:
                _release(free, off, size)
            else:
                still.append((last, off, size))
        live = still
        for t in sorted(by_first.get(i, []), key=lambda t: -t.size):
            fits = [b for b in free if b[1] >= t.size]
            if fits:
                block = min(fits, key=lambda b: (b[1], b[0]))
                off = block[0]
                block[0] += t.size
                block[1] -= t.size
                if not block[1]:
                    free.remove(block)
            elif free and free[-1][0] + free[-1][1] == top:   # grow the last free block
                off = free.pop()[0]
                top = off + t.size
            else:
                off, top = top, top + t.size
            offsets[t.name] = off
            live.append((t.last, off, t.size))
    return {k: base + v for k, v in offsets.items()}, top


def _release(free: list[list[int]], off: int, size: int) -> None:
    """Return ``[off, off + size)`` to the free list, merging it with its neighbours."""
    k = 0
    while k < len(free) and free[k][0] < off:
        k += 1
    free.insert(k, [off, size])
    if k + 1 < len(free) and off + size == free[k + 1][0]:
        free[k][1] += free.pop(k + 1)[1]
    if k > 0 and free[k - 1][0] + free[k - 1][1] == off:
        free[k - 1][1] += free.pop(k)[1]


SMALL_BLOCK = 1 << 20     # caching allocator: requests up to 1 MiB round to 512 bytes ...
LARGE_ROUND = 2 << 20     # ... larger ones to a multiple of 2 MiB


def caching_block(size: int) -> int:
    """The block the caching allocator hands out for a request of ``size`` bytes."""
    return _align(size) if size <= SMALL_BLOCK else -(-size // LARGE_ROUND) * LARGE_ROUND


def _caching_peak(tensors: list[_Tensor], resident_sizes: list[int], n_kernels: int) -> int:
    """Reserved bytes at the end of a run under the caching allocator (it never shrinks)."""
    reserved = sum(caching_block(s) for s in resident_sizes)
    by_first: dict[int, list[_Tensor]] = {}
    for t in tensors:
        by_first.setdefault(t.first, []).append(t)
    cached: list[int] = []                  # free block sizes
    live: list[tuple[int, int]] = []        # (last kernel, block size)
    for i in range(n_kernels):
        cached.extend(size for last, size in live if last < i)
        live = [(last, size) for last, size in live if last >= i]
        for t in sorted(by_first.get(i, []), key=lambda t: -t.size):
            need = caching_block(t.size)
            fits = [b for b in cached if b >= need]
            if fits:
                block = min(fits)
                cached.remove(block)
            else:
                block = need
                reserved += block
            live.append((t.last, block))
    return reserved


def memory_plan(graph: Graph, precision: str = "fp16", reuse: bool = True,
                options: dict[str, Any] | None = None, allocator: str | None = None) -> MemoryPlan:
    """Plan GM for one run of a mapped (possibly fused) graph; see the module docstring.
    ``allocator`` (one of `ALLOCATORS`) overrides ``reuse``: "naive" is no reuse."""
    if allocator is not None and allocator not in ALLOCATORS:
        raise ValueError(f"allocator {allocator!r} is not known; choose one of {', '.join(ALLOCATORS)}")
    if allocator is not None:
        reuse = allocator != "naive"
    if precision not in ELEMENT_BYTES:
        raise ValueError(f"precision {precision!r} is not known; choose one of {', '.join(ELEMENT_BYTES)}")
    unmapped = [n.name for n in graph.nodes if n.npu is None]
    if unmapped:
        raise ValueError(f"{len(unmapped)} nodes have no unit (e.g. {unmapped[0]}): run map_ops before "
                         "planning memory")
    elem = ELEMENT_BYTES[precision]
    kernels = kernels_of(graph)
    n = len(kernels)
    last_k = max(n - 1, 0)
    producers = graph.producers()

    def root(name: str) -> str:
        """The tensor a name stands for: views resolved to what they alias."""
        while name in producers and _is_view(producers[name]) and producers[name].inputs:
            name = producers[name].inputs[0]
        return name

    kernel_of: dict[str, int] = {}
    for i, kernel in enumerate(kernels):
        for name in kernel.nodes:
            kernel_of[name] = i
    # position of every node in kernel time: CPU-lane nodes sit between the kernels around them
    before: dict[str, int] = {}   # node -> number of kernels started before it
    started = 0
    seen: set[int] = set()
    for node in graph.nodes:
        k = kernel_of.get(node.name)
        if k is not None and k not in seen:
            seen.add(k)
            started = max(started, k + 1)
        before[node.name] = started

    # readers: for every tensor (root name), the kernel indices that read it, from outside its kernel
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    cpu = [node for node in graph.nodes if node.unit == "cpu"]
    for node in cpu:
        first[node.name] = min(before[node.name], last_k)
    read_values: set[str] = set()
    for node in graph.nodes:
        if _is_view(node):
            continue
        k = kernel_of.get(node.name)
        if k is None and node.unit != "cpu":
            continue
        use = k if k is not None else max(before[node.name] - 1, 0)
        for name in dict.fromkeys(node.inputs):
            r = root(name)
            if r in graph.values:
                read_values.add(r)
                continue
            if k is not None and kernel_of.get(r) == k:
                continue      # stays inside the kernel (UB / L0C)
            last[r] = max(last.get(r, -1), use)
    for o in graph.outputs:
        r = root(o)
        if r in graph.values:
            read_values.add(r)
        else:
            last[r] = last_k

    tensors: list[_Tensor] = []
    for r, end in last.items():
        if r not in producers:
            continue
        node = producers[r]
        start = kernel_of.get(r, first.get(r))
        if start is None:
            continue
        size = _align(sum(_nbytes(info, elem) for info in node.outputs))
        if size:
            tensors.append(_Tensor(r, size, start, max(end, start)))
    tensors.sort(key=lambda t: (t.first, t.name))

    resident: list[tuple[str, int, bool]] = []   # (name, size, is a weight)
    for name, v in graph.values.items():
        if v.kind in RESIDENT_KINDS and name in read_values:
            resident.append((name, _align(_nbytes(v.info, elem)), v.kind != "input"))
    for node in graph.nodes:
        if node.folded_bn is not None and not (len(node.args) > 2 and node.args[2] is not None):
            channels = node.outputs[0].shape[1] if node.outputs and len(node.outputs[0].shape) > 1 else 0
            resident.append((f"{node.name}.folded_bias", _align(channels * elem), True))
    resident = [r for r in resident if r[1]]
    resident_bytes = sum(s for _, s, _ in resident)
    weight_bytes = sum(s for _, s, w in resident if w)

    live = [resident_bytes] * n
    for t in tensors:
        for i in range(t.first, t.last + 1):
            live[i] += t.size
    no_reuse = resident_bytes + sum(t.size for t in tensors)
    reuse_offsets, top = _best_fit(tensors, resident_bytes, n)

    buffers: list[Buffer] = []
    off = 0
    for name, size, _ in resident:
        buffers.append(Buffer(name, off, size, 0, last_k))
        off += size
    for t in tensors:
        buffers.append(Buffer(t.name, reuse_offsets[t.name] if reuse else off, t.size, t.first, t.last))
        off += t.size
    peak_reuse = resident_bytes + top
    peak_caching = _caching_peak(tensors, [s for _, s, _ in resident], n)
    peak = peak_caching if allocator == "caching" else peak_reuse if reuse else no_reuse
    return MemoryPlan(
        peak_bytes=peak, peak_bytes_no_reuse=no_reuse, peak_bytes_reuse=peak_reuse,
        resident_bytes=resident_bytes, live_bytes=live, buffers=buffers, reuse=reuse, precision=precision,
        weight_bytes=weight_bytes, kernel_count=n, options=dict(options or {}), allocator=allocator or "",
        peak_bytes_caching=peak_caching,
    )
