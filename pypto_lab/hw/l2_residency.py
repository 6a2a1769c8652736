"""The chip's L2 between kernels: which tensors stay in L2 from the kernel that writes them to the
kernels that read them, so that those bytes never cross DRAM.

ATC keeps data in L2 between operators by default: ``--buffer_optimize=l2_optimize`` ("开启l2优化",
the default; ATC parameter reference, hiascend atlasatcparam_16_0050, and
``docs/zh/user_guides/atc_tools/CLI_options/--buffer_optimize.md`` of hicann/ge at ffdcbc9f7496).
MindStudio Advisor's operator-fusion page (hiascend canncommercial 700, atlasadvisor_16_0008,
"L2融合(动态Batch切分)") says what decides it: when an L2-fused operator's data, its inputs and
outputs together, exceed L2, the data are written back to DDR and the operator turns MTE2-bound
(its resnet50 8-batch example runs layers 2.4-5.2 times slower than at 4 batches); it lists
the operators to split so that each layer's data stays within L2. GE's fusion engine runs its L2
fusion (the LX-fusion optimiser, given the operators' axis split maps) whenever buffer_optimize
is not off_optimize (hicann/ge ``Configuration::EnableL2Fusion``); the batch split it makes is
modelled at graph level by `pypto_lab.compiler.batch_split` (fusion ``l2_batch_split``), this
module plans one batch (or one slice of it).

How GE places tensors in L2, in its open source (hicann/ge at ffdcbc9f7496,
``compiler/engines/nn_engine/fusion/graph_optimizer/stream_graph_optimizer/l2_optimizer/``):
on a chip whose L2 is a software-managed buffer (platform ``l2_type=1``),
``L2FusionAllocation::AllocateData`` walks the operators in execution order, keeps the "standing"
tensors that still have readers, frees a tensor when its last reader has run, and gives an
operator's output L2 pages while they fit. The Ascend310P3's platform config says ``l2_type=0``
(``tests/engines/nn_engine/config/data/platform_config/Ascend310P3.ini``, ``l2_size=16777216``):
its L2 is a hardware cache, so what stays is what a cache keeps. The model here is that cache at
tensor granularity:

* L2 holds ``capacity`` bytes; every tensor a kernel reads or writes goes through it and becomes
  the most recently used; when it is full the least recently used tensors leave first. A tensor
  as large as L2 or larger never stays: reading or writing it streams through L2 and flushes it.
* A read of a tensor that is in L2 is served by L2 (when the kernel's costing takes L2-resident
  bytes, ``l2_capable``); any other read comes from DRAM and brings the tensor into L2.
* A written tensor lives in L2 (write-back, write-allocate). It reaches DRAM only when it leaves
  L2 while a kernel still has to read it, when a reader takes it from DRAM (a kernel whose
  costing does not model L2 residency), or when it is a graph output (the host reads it).
* A tensor whose last reader has run is dropped without a write-back: GE's memory reuse gives
  its GM address to a later tensor, whose writes overwrite those lines in L2. (An assumption
  where GE's allocator frees the pages explicitly; it holds while the reused addresses are
  written before the dead lines are evicted.)

`plan_l2(steps, capacity)` runs this over a kernel sequence; the `l2_residency` pass
(`pypto_lab.passes.l2_residency`) maps a graph's kernels to `Step`s and writes the result into
their specs, and the costers read it (`simulate_matmul`'s and `simulate_vector`'s ``l2_reads`` /
``l2_writes``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


class L2PlanError(ValueError):
    """A step or capacity the planner cannot use: the message names the rule, the value and a fix."""


@dataclass(frozen=True)
class Step:
    """One kernel as the L2 sees it: the tensors it reads and writes, (name, bytes) each, and
    whether its costing takes bytes served by L2 (``l2_capable``; a kernel that cannot is costed
    as reading from DRAM, so what it reads must be there)."""

    reads: tuple[tuple[str, int], ...] = ()
    writes: tuple[tuple[str, int], ...] = ()
    l2_capable: bool = True


@dataclass(frozen=True)
class L2Plan:
    """Per step, the bytes of its reads served by L2 (``l2_reads``), the tensors those reads were
    (``hits``) and the bytes of its writes that never reach DRAM (``l2_writes``); the written
    tensors that stayed in L2 for all their readers (``resident``) and those that reached DRAM
    (``spilled``), with their sizes."""

    l2_reads: tuple[int, ...]
    hits: tuple[tuple[str, ...], ...]
    l2_writes: tuple[int, ...]
    resident: dict[str, int]
    spilled: dict[str, int]
    capacity: int

    @property
    def saved_bytes(self) -> int:
        """DRAM bytes L2 kept: reads served by L2 plus write-backs that never happened."""
        return sum(self.l2_reads) + sum(self.l2_writes)


def _check(steps: list[Step], capacity: int) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise L2PlanError(f"L2 capacity = {capacity!r}: the chip's L2 in bytes, an integer >= 0. Fix: pass "
                          "chip.l2_bytes (0 keeps nothing in L2)")
    for i, s in enumerate(steps):
        if not isinstance(s, Step):
            raise L2PlanError(f"step {i} = {s!r}: each step is a pypto_lab.hw.l2_residency.Step. Fix: "
                              "Step(reads=((name, bytes), ...), writes=(...))")
        for name, nbytes in (*s.reads, *s.writes):
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise L2PlanError(f"step {i}: tensor {name!r} has {nbytes!r} bytes; sizes are integers >= 0. "
                                  "Fix: pass the tensor's size in bytes as it is held in GM")


def plan_l2(steps: list[Step], capacity: int, outputs: tuple[str, ...] | frozenset[str] = ()) -> L2Plan:
    """Which tensors of ``steps`` (kernels in execution order) stay in an L2 of ``capacity`` bytes
    (see the module docstring). ``outputs``: tensors the host reads afterwards (they reach DRAM)."""
    steps = list(steps)
    _check(steps, capacity)
    outputs = frozenset(outputs)
    last_read: dict[str, int] = {}
    for i, s in enumerate(steps):
        for name, _ in s.reads:
            last_read[name] = i
    lru: OrderedDict[str, int] = OrderedDict()
    used = 0
    written: dict[str, int] = {}     # tensor -> its size, for tensors some step wrote
    spilled: set[str] = set()
    live: set[str] = set()           # written tensors with readers still to run (or outputs)
    l2_reads = [0] * len(steps)
    hits: list[list[str]] = [[] for _ in steps]
    l2_writes = [0] * len(steps)
    wrote_at: list[list[str]] = [[] for _ in steps]

    def leave(name: str) -> None:
        nonlocal used
        used -= lru.pop(name)
        if name in live:             # dirty and still needed: written back to DRAM
            spilled.add(name)

    def shrink_to(limit: int) -> None:
        while used > limit and lru:
            leave(next(iter(lru)))

    def touch(name: str, nbytes: int) -> None:
        nonlocal used
        if name in lru:
            lru.move_to_end(name)
        elif nbytes >= capacity or nbytes == 0:
            if nbytes:
                shrink_to(0)         # streams through L2 and flushes it
        else:
            lru[name] = nbytes
            used += nbytes

    for i, s in enumerate(steps):
        for name, nbytes in dict(s.reads).items():
            if name in lru and s.l2_capable:
                l2_reads[i] += nbytes
                hits[i].append(name)
            if not s.l2_capable and name in written:
                spilled.add(name)
            touch(name, nbytes)
        for name, nbytes in dict(s.writes).items():
            written[name] = nbytes
            wrote_at[i].append(name)
            if last_read.get(name, -1) > i or name in outputs:
                live.add(name)
            if not s.l2_capable or name in outputs or nbytes >= capacity:
                if name in live:
                    spilled.add(name)
            touch(name, nbytes)
        shrink_to(capacity)
        for name in {*dict(s.reads), *dict(s.writes)}:
            if last_read.get(name, -1) <= i and name not in outputs:
                live.discard(name)
                if name in lru:
                    leave(name)      # dead: its lines are recycled by GE's memory reuse
    for i, names in enumerate(wrote_at):
        l2_writes[i] = sum(written[n] for n in names if n not in spilled and steps[i].l2_capable)
    resident = {n: b for n, b in written.items() if n not in spilled and n in last_read}
    return L2Plan(tuple(l2_reads), tuple(map(tuple, hits)), tuple(l2_writes), resident,
                  {n: written[n] for n in spilled}, capacity)


__all__ = ["L2Plan", "L2PlanError", "Step", "plan_l2"]
