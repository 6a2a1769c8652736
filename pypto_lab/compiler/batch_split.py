"""L2 fusion by batch slices (fusion ``l2_batch_split``): when a batch's activations overflow the
chip's L2, run the whole graph on slices of the batch, one slice after another, so that each
slice's activations stay in L2 between operators.

What the compiler has (hicann/ge at ffdcbc9f7496): with ATC's default ``--buffer_optimize=l2_optimize``
GE's fusion engine turns L2 fusion on whatever the chip's L2 type (``Configuration::EnableL2Fusion``
in ``compiler/engines/nn_engine/utils/common/configuration.cc``: true unless the option is
off_optimize; only the L2 *buffer* allocation, ``IsEnableL2Buffer``, needs a software-managed L2),
and every static graph then goes through the LX-fusion optimiser
(``compiler/engines/nn_engine/fusion/graph_optimizer/lx_fusion_optimizer/lx_fusion_optimizer.cc``,
called from ``optimizer/graph_optimizer/op_compiler/op_compiler_normal.cc``: ``L2FusionPreOptimize``
and ``L2FusionOptimize`` of the closed ``libgraph_tuner.so``), which is given the operators' slice
information (``OP_SLICE_INFO``: the axes each operator can be split along,
``compiler/engines/nn_engine/fusion/ub_pass_slice_info/``). CANN's advisor names the case
"L2融合（动态Batch切分）" (L2 fusion, dynamic batch split: hiascend canncommercial 700
auxiliarydevtool atlasadvisor_16_0008): a layer whose inputs and outputs together exceed L2 is
written back to DDR and turns MTE2-bound (its ResNet-50 int8 example: res2a_branch2c takes 5.2 x
as long at batch 8 as at batch 4), and the cure is to split the operators so each layer's data
stays within L2; the advisor lists the operators where that was not done. How the closed tuner
chooses the split is not published; this model takes the slice (the batch halved, again and
again) with the shortest simulated time for the whole batch, and stops halving when a slice is no
faster than the one before. The published Ascend310P3 ResNet-50 sweep (ModelZoo-PyTorch
Resnet50_mlperf, bs1...64: throughput still rising from batch 8 to 64, and 3,940/s at batch 64 is
above what the layer-by-layer DRAM traffic at 204 GB/s allows) is consistent with it. It leaves out what it cannot
see: weights are read again for every slice (the slice's own costing reads them), slices run one
after another on the device (no overlap between one slice's tail and the next one's head).

Only a graph whose activations spill from L2 at the whole batch (`spills`), whose every input and
output has the batch on its first axis, and whose program
captures at the slice's batch (not one with the batch baked into a reshape), is split (it is captured
in eval mode: inference, no operator mixes samples).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..analysis.report import PassStep, Report
from ..analysis.schedule import Schedule, ScheduledKernel
from ..hw.l2_residency import plan_l2
from ..lowering.lower import kernels_of, storage_dtypes
from ..passes.l2_residency import kernel_steps
from ..stack import Stack

FUSION = "l2_batch_split"


def slices_of(batch: int) -> list[int]:
    """The slice sizes tried for ``batch``: halved while it divides evenly (64: 32, 16, 8, 4, 2, 1)."""
    out = []
    s = batch
    while s % 2 == 0 and s > 1:
        s //= 2
        out.append(s)
    return out


def slice_inputs(example_inputs: Any, batch: int, size: int) -> tuple | None:
    """``example_inputs`` cut to their first ``size`` samples, or None when one of them does not
    have the batch on its first axis (a graph that cannot be split by batch)."""
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    out = []
    for x in inputs:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != batch:
            return None
        out.append(x[:size])
    return tuple(out)


def splittable(graph, batch: int) -> bool:
    """Whether the graph can run in batch slices: every graph output has the batch on its first
    axis (the graph is captured in eval mode, `pypto_lab.capture`: inference, no operator mixes
    samples)."""
    if batch < 2:
        return False
    producers = graph.producers()
    for name in graph.outputs:
        node = producers.get(name)
        info = node.outputs[0] if node is not None and node.outputs else None
        shape = getattr(info, "shape", None)
        if not shape or shape[0] != batch:
            return False
    return True


def spills(graph, chip, precision: str) -> bool:
    """Whether L2 residency at the whole batch leaves activations to DRAM (a tensor written by one
    kernel and read by another that leaves L2 first) in a quantity a split could win back: the case
    the split is for. The graph is the optimised one; the plan is the `l2_residency` pass's
    (`pypto_lab.hw.l2_residency.plan_l2`). Two slices read the weights once more; a split can keep
    out of DRAM at most the spilled activations' write and reads, so where those bytes do not
    exceed the weights' (BERT-base at batch 8: its weights stream through L2 and push out a few
    small activations) no slice can move fewer bytes and none is tried."""
    _, gm_dtype = storage_dtypes(chip, precision)
    steps, outputs = kernel_steps(graph, kernels_of(graph), gm_dtype)
    plan = plan_l2(steps, int(chip.l2_bytes), outputs)
    spilled = {n for n in plan.spilled if n not in outputs}
    if not spilled:
        return False
    return spilled_traffic(steps, spilled) > weight_bytes(graph, steps)


def spilled_traffic(steps, spilled: set[str]) -> int:
    """The DRAM bytes of the ``spilled`` activations: each written once and read by every reader."""
    return sum(b for s in steps for n, b in (*s.reads, *s.writes) if n in spilled)


def weight_bytes(graph, steps) -> int:
    """The bytes of the parameters, buffers and constants the kernels read (what each slice of a
    split reads again), each counted once."""
    weights = {n for n, v in graph.values.items() if v.kind != "input"}
    return sum({n: b for s in steps for n, b in s.reads if n in weights}.values())


def split_report(full: Report, part: Report, slices: int) -> Report:
    """The report of the whole batch run as ``slices`` runs of ``part`` one after another: every
    kernel ``slices`` times, the slice's schedule repeated, a waterfall step for the split."""
    one = part.schedule
    span = one.latency_us
    placed = tuple(ScheduledKernel(k.name, k.resources, k.start_us + i * span, k.end_us + i * span)
                   for i in range(slices) for k in one.kernels)
    schedule = Schedule(placed, one.concurrent, one.stack)
    kernels = [replace(k, count=k.count * slices) for k in part.kernels]
    size = part.batch
    dram = sum(k.cost.hbm_bytes * k.count for k in kernels)
    note = (f"the batch of {full.batch} runs as {slices} slices of {size} (L2 fusion by batch slices, "
            f"{FUSION}): {dram / 1e6:,.1f} MB cross DRAM instead of {full.dram_bytes / 1e6:,.1f} MB, "
            f"{schedule.latency_us:,.1f} us instead of {full.latency_us:,.1f} us")
    l2 = next((p.notes for p in part.passes if p.name == "l2_residency"), ())   # what stays in L2 per slice
    step = PassStep(FUSION, schedule.latency_us, len(kernels), note, l2, sum(k.gm_bytes for k in kernels))
    return replace(full, kernels=kernels, schedule=schedule, passes=[*full.passes, step],
                   notes=[*full.notes, note])


def best_split(full: Report, build, batch: int) -> Report | None:
    """The split report with the shortest time for the whole batch, or None when no slice is faster
    than the whole batch. ``build(size)`` returns the report of one slice of ``size`` samples."""
    best_us, best = full.latency_us, None
    for size in slices_of(batch):
        part = build(size)
        if part is None:
            break
        us = part.latency_us * (batch // size)
        if us >= best_us:
            break
        best_us, best = us, (part, batch // size)
    return split_report(full, *best) if best else None


def without_split(stack: Stack) -> Stack:
    """``stack`` with batch splitting off (what each slice is optimised under)."""
    return replace(stack, fusions=frozenset(stack.fusions) - {FUSION})


__all__ = ["FUSION", "best_split", "slice_inputs", "slices_of", "spilled_traffic", "spills", "split_report",
           "splittable", "weight_bytes", "without_split"]
