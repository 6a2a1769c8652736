"""What ``pypto-lab run`` reports: the summary table printed at the end of a run, and the profiler's
outputs (a Chrome / Perfetto trace and Ascend's ``kernel_details.csv``) written by the project's
profiler (`pypto_lab.tools.profiler`) from the card's records.

The records become the profiler's events: for every kernel or copy, a CPU event (the host's
dispatch of it, ``aten::<op>`` on the host timeline: simulated, the stack's dispatch time) and an
NPU event (the kernel on the card after its launch, with its accelerator core, block count and the
wait since the previous kernel of its stream); one profiler run spans the script. The trace also
carries each kernel's instruction timeline per AI core and pipe, as the profiler's does for an
optimised model.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from ..kernels.cost import CostedKernel
from ..kernels.ir import Kernel
from ..tools import profiler as P
from .card import Card, Record, fmt_bytes

TRACE = "trace_view.json"             # Ascend's names for the two files (ASCEND_PROFILER_OUTPUT/)
KERNEL_DETAILS = "kernel_details.csv"
MAX_INSTRUCTION_EVENTS = 20_000


def _ms(us: float) -> str:
    return f"{us / 1000:,.3f} ms" if us >= 1000 else f"{us:,.1f} us"


def costed(r: Record) -> CostedKernel:
    return CostedKernel(Kernel(r.name, r.spec, (), (r.op,), r.name), r.cost)


def _ascend_dtype(d: str) -> str:
    return P._ASCEND_DTYPES.get(d, d.upper())


def build_profile(card: Card, records: list[Record], record_shapes: bool = True, profile_memory: bool = False,
                  activities=None, with_stack: bool = False, name: str = "script",
                  max_instruction_events: int = MAX_INSTRUCTION_EVENTS) -> P.profile:
    """A `pypto_lab.tools.profiler.profile` holding ``records`` as one run (see the module docstring)."""
    prof = P.profile(activities=activities, record_shapes=record_shapes, profile_memory=profile_memory,
                     with_stack=with_stack, max_instruction_events=max_instruction_events)
    prof.time_axes = {"source": "pypto-lab run: the simulated card (NPU events: the chip model's kernel times; CPU "
                                "events: the software stack's dispatch time)",
                      "npu_time_axis": "simulated, from the start of the script",
                      "cpu_time_axis": "simulated host clock, from the start of the script"}
    acts = prof.activities
    split = card.chip.split_cores
    kernels, starts, ends = [], [], []
    last_end: dict[int, float] = defaultdict(float)
    for r in records:
        k = costed(r)
        shapes = r.shapes if record_shapes else ()
        dtypes = tuple(_ascend_dtype(d) for d in r.dtypes) if record_shapes else ()
        if P.ProfilerActivity.CPU in acts:
            host = max(0.0, r.host_end - r.host_start) if r.kind != "host" else r.end - r.start
            prof._events.append(P.ProfilerEvent(
                f"aten::{r.op}" if r.kind != "memcpy" else f"npu::{r.op}", "CPU", r.name, 0, r.host_start, host,
                self_cpu_time_us=host, cpu_time_total_us=host,
                npu_time_total_us=r.device_us if P.ProfilerActivity.NPU in acts else 0.0,
                input_shapes=shapes, input_dtypes=dtypes, unit="cpu", accelerator_core="CPU", simulated=True))
        if P.ProfilerActivity.NPU in acts:
            body = r.start + r.launch_us
            core = "MEMCPY" if r.kind == "memcpy" else P._accelerator_core(k, split)
            blocks = max((rep.cores_used for rep in r.cost.reports), default=0)
            prof._events.append(P.ProfilerEvent(
                r.op_type, "NPU", r.name, 0, body, r.device_us, self_npu_time_us=r.device_us,
                npu_time_total_us=r.device_us, input_shapes=shapes, input_dtypes=dtypes,
                input_formats=tuple("ND" for _ in shapes), gm_bytes=r.cost.gm_bytes, unit=k.unit,
                accelerator_core=core, block_num=blocks, wait_time_us=max(0.0, r.start - last_end[r.stream]),
                npu_memory_bytes=0))
            last_end[r.stream] = r.end
            kernels.append(k)
            starts.append(body)
            ends.append(r.end)
    span = max([r.end for r in records] + [0.0]) - min([r.host_start for r in records] + [0.0])
    prof._runs.append(P._Run(0, name, card.chip, kernels, starts, ends, 0.0, span, 0.0,
                             sum(max(0.0, r.host_end - r.host_start) for r in records)))
    return prof


def write_outputs(card: Card, out_dir: str | os.PathLike, name: str = "script") -> dict[str, Path]:
    """``trace_view.json`` and ``kernel_details.csv`` of the whole run in ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prof = build_profile(card, card.records, name=name)
    return {"trace": prof.export_chrome_trace(out / TRACE), "kernel_details": prof.export_kernel_details(out / KERNEL_DETAILS)}


def kernel_rows(card: Card) -> list[dict]:
    """Kernels and copies grouped by (CANN operator, script operator), slowest first."""
    groups: dict[tuple[str, str], dict] = {}
    for r in card.records:
        g = groups.setdefault((r.op_type, r.op), {"op_type": r.op_type, "op": r.op, "kind": r.kind, "calls": 0,
                                                  "device_us": 0.0, "launch_us": 0.0, "bounds": defaultdict(float),
                                                  "unit": getattr(r.spec, "unit", "")})
        g["calls"] += 1
        g["device_us"] += r.end - r.start - r.launch_us if r.kind != "kernel" else r.device_us
        g["launch_us"] += r.launch_us
        g["bounds"][r.bound or "-"] += r.device_us
    rows = []
    for g in groups.values():
        g["bound"] = max(g["bounds"].items(), key=lambda kv: kv[1])[0]
        del g["bounds"]
        rows.append(g)
    return sorted(rows, key=lambda g: -g["device_us"])


def summary(card: Card, script: str, top: int = 15, fallbacks: dict[str, int] | None = None,
            notes: list[str] | None = None, outputs: dict[str, Path] | None = None) -> str:
    """The table ``pypto-lab run`` prints at the end (see the module docstring)."""
    t = card.totals()
    wall = t["wall_us"]
    lines = [f"pypto-lab run: {script} on the simulated {card.chip.name}, stack {card.stack.name} "
             "(every time below is simulated)"]
    lines.append(f"  end to end        {_ms(wall)}")
    lines.append(f"  host              {_ms(t['host_us'])}: dispatch {_ms(t['dispatch_us'])} for {t['kernels']} kernels "
                 f"({card.stack.dispatch_us:g} us each), waiting for the card {_ms(t['sync_wait_us'])}")
    lines.append(f"  device busy       {_ms(t['device_busy_us'])}: kernels {_ms(t['kernel_us'])}, launch "
                 f"{_ms(t['launch_us'])} ({card.stack.launch_us:g} us each), copies {_ms(t['memcpy_us'])}, host "
                 f"fallbacks {_ms(t['host_fallback_us'])}")
    idle = t["device_idle_us"]
    lines.append(f"  device idle       {_ms(idle)} ({100 * idle / wall:.0f} % of the run)" if wall else
                 "  device idle       -")
    if wall and idle > 0.5 * wall and t["kernels"]:
        lines.append("  -> host-bound: the card waits for the host's dispatch most of the time (eager torch_npu: "
                     "fewer, larger ops, fused operators or a graph mode stack would help; try --stack torchair-graph)")
    copies = [r for r in card.records if r.kind == "memcpy"]
    h2d = [r for r in copies if r.op == "MemcpyH2D"]
    d2h = [r for r in copies if r.op == "MemcpyD2H"]
    lines.append(f"  HBM               peak {fmt_bytes(card.memory.peak)} of {fmt_bytes(card.memory.capacity)}; "
                 f"{len(h2d)} copies to the card ({fmt_bytes(sum(r.nbytes for r in h2d))}), {len(d2h)} to the host "
                 f"({fmt_bytes(sum(r.nbytes for r in d2h))}); {card.syncs} host waits")
    rows = kernel_rows(card)
    device_total = sum(r["device_us"] for r in rows) or 1.0
    if rows:
        lines.append("")
        lines.append(f"top kernels by device time ({min(top, len(rows))} of {len(rows)}):")
        table = [["CANN operator", "from", "calls", "total", "avg", "% device", "bound", "unit"]]
        for r in rows[:top]:
            table.append([r["op_type"], r["op"], str(r["calls"]), _ms(r["device_us"]), _ms(r["device_us"] / r["calls"]),
                          f"{100 * r['device_us'] / device_total:.1f}", r["bound"], r["unit"]])
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for j, row in enumerate(table):
            lines.append("  " + "  ".join(c.ljust(w) if i < 2 or i >= 6 else c.rjust(w)
                                          for i, (c, w) in enumerate(zip(row, widths))))
            if j == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
    if fallbacks:
        lines.append("")
        lines.append("ran on the host (not in the lowering table; add an entry in pypto_lab/lowering/table.py): "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(fallbacks.items(), key=lambda kv: -kv[1])))
    for n in notes or []:
        lines.append(f"note: {n}")
    if outputs:
        lines.append("")
        lines.append("wrote " + ", ".join(str(p) for p in outputs.values()))
    return "\n".join(lines)


__all__ = ["KERNEL_DETAILS", "TRACE", "build_profile", "costed", "kernel_rows", "summary", "write_outputs"]
