"""The result of one simulated kernel run (``kernel.last_run``): cycles, time, busy time of every
pipe, peak bytes of every buffer, the achieved fraction of the chip's peak, the timeline, and
its export as a Chrome trace (one process per core, one thread per pipe). A kernel with symbolic
loops (`loops`) also lists each loop's iterations per variant (iteration class), and its trace
gets a "loops" process: one lane per loop, its simulated copies marked with the iteration count
the cost was extrapolated to (the per-core lanes show only the simulated copies)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..files.atomic import write_text_atomic
from ..hw.chip import PIPES, Chip
from ..hw.simulator import Timeline
from .blocks import core_name


@dataclass
class RunResult:
    name: str
    chip: str
    cycles: float
    time_us: float
    pipe_busy: dict[str, float]           # busy cycles per pipe, summed over all cores
    pipe_busy_max_core: dict[str, float]  # busy cycles per pipe on the core where that pipe is busiest
    buffer_peak: dict[str, int]           # bytes in use per buffer, per core (UB, L1, L0A, L0B, L0C)
    flops: float
    gm_bytes: float                       # bytes the kernel must move at least (inputs read + outputs written)
    fraction_of_peak: float
    bound: str                            # "cube" (flops / (time x peak)) or "memory" (bytes / (time x HBM))
    cores_used: int
    groups: list[dict] = field(default_factory=list)
    timeline: Timeline = field(default=None, repr=False)
    _chip: Chip = field(default=None, repr=False)
    loops: list[dict] = field(default_factory=list)      # per symbolic loop: iterations per variant
    simulated_cycles: float = 0.0                         # cycles of the simulated timeline (loops: base copies)
    loop_spans: list[dict] = field(default_factory=list)  # per (loop, variant): its copies' span in the timeline
    swimlane_path: str | None = None                      # the merged_swimlane.json a SIM run writes (`sim_output`)
    roofline_us: float = 0.0                              # max(Cube flops at peak, GM bytes at HBM bandwidth)
    values_computed: bool = True                          # False: a cost-only run (`pto.config.cost_only`)

    @property
    def instructions(self) -> Timeline:
        return self.timeline

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "chip": self.chip, "cycles": self.cycles, "time_us": self.time_us,
                "pipe_busy": dict(self.pipe_busy), "pipe_busy_max_core": dict(self.pipe_busy_max_core),
                "buffer_peak": dict(self.buffer_peak), "flops": self.flops, "gm_bytes": self.gm_bytes,
                "fraction_of_peak": self.fraction_of_peak, "bound": self.bound, "cores_used": self.cores_used,
                "groups": self.groups, "instruction_count": len(self.timeline) if self.timeline is not None else 0,
                "loops": self.loops, "roofline_us": self.roofline_us, "values_computed": self.values_computed}

    def summary(self) -> str:
        what = "of the Cube's peak" if self.bound == "cube" else "of HBM bandwidth"
        s = (f"{self.name} on {self.chip}: {self.cycles:,.0f} cycles = {self.time_us:.2f} us, "
             f"{self.fraction_of_peak:.1%} {what}, {self.cores_used} cores")
        for lp in self.loops:
            sim = sum(v["simulated"] for v in lp["variants"])
            rest = "all simulated" if sim >= lp["iterations"] else f"{sim:,} simulated, the rest extrapolated"
            s += f"; loop {lp['loop']}: {lp['iterations']:,} iterations in {len(lp['variants'])} class(es), {rest}"
        return s

    __str__ = summary

    def chrome_trace(self, max_events: int | None = None) -> dict:
        """The swimlane as a Chrome trace. ``max_events``: keep only the instructions that start
        before the cycle at which that many have started (the trace of a long kernel, millions of
        instructions, is otherwise gigabytes of JSON); ``otherData["truncated"]`` then says how many
        there were and up to which cycle the trace is complete."""
        tl, chip = self.timeline, self._chip
        ev = []
        keep = range(len(tl))
        truncated = None
        if max_events is not None and len(tl) > max_events:
            starts = np.asarray(tl.start)
            cutoff = float(np.partition(starts, max_events - 1)[max_events - 1])
            keep = np.flatnonzero(starts < cutoff).tolist()
            truncated = {"instructions": len(tl), "kept": len(keep), "complete_up_to_cycle": cutoff}
        cores = sorted({int(c) for c in tl.core})
        for c in cores:
            ev.append({"ph": "M", "name": "process_name", "pid": c, "args": {"name": core_name(chip, c)}})
            ev.append({"ph": "M", "name": "process_sort_index", "pid": c, "args": {"sort_index": c}})
            for p, name in enumerate(PIPES):
                ev.append({"ph": "M", "name": "thread_name", "pid": c, "tid": p, "args": {"name": name}})
        mhz = chip.clock_mhz
        for i in keep:
            dur = (tl.end[i] - tl.start[i]) / mhz
            if dur <= 0:
                continue
            ev.append({"ph": "X", "name": tl.kinds[tl.kind[i]], "pid": int(tl.core[i]), "tid": int(tl.pipe[i]),
                       "ts": float(tl.start[i]) / mhz, "dur": float(dur),
                       "args": {"start_cycle": float(tl.start[i]), "end_cycle": float(tl.end[i])}})
        if self.loops:
            pid = (max(cores) + 1) if cores else 0
            ev.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "loops"}})
            ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": -1}})
            spans = {tuple(sp["key"]): sp for sp in self.loop_spans}
            for tid, lp in enumerate(self.loops):
                ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"{lp['loop']} ({lp['iterations']:,} iterations)"}})
                for v in lp["variants"]:
                    sp = spans.get((lp["node"], v["variant"]))
                    if sp is None or sp["end"] <= sp["start"]:
                        continue
                    cond = " and ".join(v["guards"]) or "every iteration"
                    ev.append({"ph": "X", "pid": pid, "tid": tid, "ts": sp["start"] / mhz,
                               "dur": (sp["end"] - sp["start"]) / mhz,
                               "name": f"{lp['idx_name']}: class {v['variant']}, {v['iterations']:,} iterations "
                                       f"({v['simulated']} simulated)",
                               "args": {"iterations": v["iterations"], "simulated": v["simulated"],
                                        "marginal_cycles": v["marginal_cycles"], "when": cond}})
        other = {"kernel": self.name, "chip": self.chip, "cycles": self.cycles,
                 # each group's ops and semantic labels ("exp+sum [softmax]")
                 "groups": [g["ops"] for g in self.groups]}
        if truncated:
            other["truncated"] = truncated
        return {"traceEvents": ev, "displayTimeUnit": "ns", "otherData": other}

    def export_chrome_trace(self, path) -> str:
        """Write the swimlane (chrome://tracing, Perfetto) atomically; returns the path."""
        return str(write_text_atomic(path, json.dumps(self.chrome_trace())))
