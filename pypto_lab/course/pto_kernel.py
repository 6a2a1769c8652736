"""Checker of exercise 06, a fast Vector kernel in `pypto_lab.pto`: ``out = relu(x + y)``.

The student's kernel is run on fixed inputs, checked against torch (fp16 tolerance) and timed
against a cycle target derived from HBM bandwidth: the bytes the kernel must move (x and y read,
out written, once) at the chip's HBM rate, divided by the share of that rate asked for. A slow
kernel is explained from its own compiled stages and run: its vec tile and UB use, the tasks
each Vector core runs, the busiest pipe, idle cores.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from ..hw.chip import get_chip
from ..hw.tiling import ceil_div
from ..pto.errors import PtoError
from ..pto.jit import JitKernel
from .verdict import Attempt, Verdict, bound_line, busy_fractions, busy_line, kb


@dataclass(frozen=True)
class FastAddRelu:
    """Exercise 06: a pto kernel computing ``out = relu(x + y)`` over fp16 tensors of
    ``rows x cols`` on ``chip``, correct, in at most ``target_cycles`` cycles."""

    chip: str = "Ascend910B1"
    rows: int = 4096
    cols: int = 1024
    share: float = 0.85   # the share of HBM bandwidth the target asks for
    rtol: float = 1e-2
    atol: float = 1e-2

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        return (torch.randn(self.rows, self.cols, dtype=torch.float16),
                torch.randn(self.rows, self.cols, dtype=torch.float16))

    @property
    def min_bytes(self) -> int:
        """x and y read once, out written once."""
        return 3 * self.rows * self.cols * 2

    @property
    def target_cycles(self) -> int:
        """The cycles of moving ``min_bytes`` at ``share`` of the HBM bandwidth that two reads to one
        write reach (`pypto_lab.hw.chip.Chip.hbm_stream_efficiency`)."""
        chip = get_chip(self.chip)
        rate = chip.hbm_bytes_per_cycle() * chip.hbm_stream_efficiency(2 * self.min_bytes / 3, self.min_bytes / 3)
        return math.ceil(self.min_bytes / rate / self.share)

    def check(self, kernel) -> Verdict:
        """``kernel``: a ``@pypto.jit`` function ``(x, y, out)`` that writes ``relu(x + y)`` into ``out``."""
        chip = get_chip(self.chip)
        a = Attempt("fast add + relu")
        if not isinstance(kernel, JitKernel):
            return a.fail("not a kernel", f"got {type(kernel).__name__}: decorate the function with "
                          "@pypto.jit(runtime_options={'run_mode': pypto.RunMode.SIM, 'chip': ...})")
        x, y = self.inputs()
        out = torch.full_like(x, float("nan"))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kernel(x, y, out)
        except NotImplementedError as err:
            return a.not_attempted(err, f"{kernel.__name__}")
        except PtoError as err:
            return a.fail("the kernel breaks a rule", f"{type(err).__name__}", [str(err)])
        except Exception as err:
            return a.broken(err, f"{kernel.__name__}(x, y, out)")
        run = kernel.last_run
        a.report = run
        a.say(f"{kernel.__name__} on {run.chip}: x, y, out of {self.rows} x {self.cols} fp16")
        if run.chip != chip.name:
            return a.fail("wrong chip", f"the kernel ran on {run.chip}; the exercise is timed on {chip.name}: "
                          f"pass runtime_options={{'run_mode': pypto.RunMode.SIM, 'chip': '{chip.name}'}}")
        golden = torch.relu(x.float() + y.float())
        got = out.float()
        unwritten = int(torch.isnan(got).sum())
        if unwritten:
            first = tuple(int(i) for i in torch.nonzero(torch.isnan(got))[0])
            return a.fail("correctness", f"{unwritten:,} of {got.numel():,} elements of out were never written, "
                          f"the first at {list(first)}: write the whole output (out[:] = ...)")
        diff = (got - golden).abs()
        bad = diff > self.atol * max(1.0, float(golden.abs().max())) + self.rtol * golden.abs()
        if bool(bad.any()):
            i = tuple(int(v) for v in torch.nonzero(bad)[0])
            return a.fail("correctness", f"{int(bad.sum()):,} elements differ from torch.relu(x + y), max |diff| = "
                          f"{float(diff.max()):.3g}; the first at {list(i)}: {float(got[i]):.4g} instead of "
                          f"{float(golden[i]):.4g}")
        busy = busy_fractions(run.pipe_busy_max_core, run.cycles)
        goal = self.target_cycles
        ub = chip.buffer("UB").size_bytes
        groups = [_group_summary(g, chip) for g in kernel.stages["tile_graph"].to_json()["groups"]]
        a.facts.update(cycles=run.cycles, target_cycles=goal, bound=max(busy, key=busy.get) if busy else "",
                       ub_peak=run.buffer_peak.get("UB", 0), groups=groups)
        for g in groups:
            a.say(f"  group {g['id']} ({g['ops']}): vec tile {g['vec_tile']}, {g['tasks']:,} tasks on "
                  f"{min(g['tasks'], g['cores'])} of {g['cores']} cores ({g['per_core']:,} per core), UB "
                  f"{g['ub_slots']} x {kb(g['ub_bytes'])} of {kb(ub)}")
        a.say(f"  correct (max |diff| {float(diff.max()):.3g}); {run.cycles:,.0f} cycles, target {goal:,} or fewer "
              f"({self.share:.0%} of the HBM bandwidth a stream of two reads to one write reaches, for the "
              f"{self.min_bytes / 1e6:.1f} MB it must move); now {run.fraction_of_peak:.0%} of the nominal HBM rate")
        a.say(f"  busy fraction per pipe (each on its busiest core): {busy_line(busy)}")
        if run.cycles <= goal:
            return a.ok(f"correct and {run.cycles:,.0f} <= {goal:,} cycles")
        why = [bound_line(busy)]
        for g in groups:
            tasks, cores, per_core = g["tasks"], g["cores"], g["per_core"]
            if g["ub_slots"] < 2:
                why.append(f"group {g['id']} has one UB slot: two of {kb(g['ub_bytes'])} do not fit {kb(ub)}, so "
                           f"loads, compute and stores take turns")
            if tasks < cores:
                why.append(f"group {g['id']} has {tasks} tasks for {cores} cores: {cores - tasks} cores idle")
            elif tasks % cores and tasks < 4 * cores:
                why.append(f"group {g['id']}'s {tasks} tasks make {ceil_div(tasks, cores)} waves on {cores} cores; "
                           f"the last keeps only {tasks % cores} busy")
            if per_core > 1:
                why.append(f"each core runs {per_core:,} tasks moving {kb(g['tile_bytes'])} per operand: every load, "
                           f"store and instruction pays a fixed start-up, {per_core:,} times over, and the kernel "
                           f"reaches {run.fraction_of_peak:.0%} of HBM bandwidth; a larger vec tile makes fewer, "
                           f"longer transfers")
        return a.fail("too slow", f"{run.cycles:,.0f} cycles > the target {goal:,}", why)


def _group_summary(g: dict, chip) -> dict:
    """What a message needs of one Tile Graph group: its tile, tasks per core and UB use."""
    cores = chip.vector_cores if g["kind"] == "vector" else chip.cube_cores
    tile = g.get("vec_tile") or []
    return {"id": g["id"], "ops": "+".join(g["ops"]), "vec_tile": tile, "tasks": g["tasks"], "cores": cores,
            "per_core": ceil_div(g["tasks"], min(g["tasks"], cores)), "ub_slots": g.get("ub_slots", 1),
            "ub_bytes": g.get("ub_bytes_per_task", 0),
            # one operand's tile in fp16 (the exercise's tensors), clipped to the tensor
            "tile_bytes": 2 * math.prod(min(t, d) for t, d in zip(tile, g["space"]))}


__all__ = ["FastAddRelu"]
