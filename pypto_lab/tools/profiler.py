"""A profiler in the shape of torch.profiler for optimised models on the simulated Ascend NPU.

    from pypto_lab.tools import profiler
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU],
                          record_shapes=True, profile_memory=True) as prof:
        optimized(x)
    print(prof.key_averages().table(sort_by="npu_time_total", row_limit=20))
    prof.export_chrome_trace("trace.json")        # Chrome / Perfetto: AI cores, pipes, kernels, CPU
    prof.export_kernel_details("kernel_details.csv")  # the columns of Ascend's kernel_details.csv

Where the numbers come from (nothing is invented):

* NPU times are the simulator's: each kernel of ``optimized.report()`` with its simulated
  ``time_us``, placed at its start in the report's schedule; successive runs follow one another
  (each run's kernels are offset by the latencies of the runs before it).
* CPU time is measured: `OptimizedModel.__call__` measures the wall time of the call and hands
  it to `notify_run`, which records it as one CPU event ``optimized_model.__call__``. It is not
  split over kernels (the CPU computes the numerics; the NPU kernels are simulated). Its "NPU
  total" is the sum of its kernels' simulated times, as torch credits a CPU op with its kernels.
* Input shapes come from the optimised graph; input dtypes are the ones the kernel reads (the
  dtype its kernel's spec reads them in, else the run's precision for floating tensors); formats
  from ``node.input_formats`` (the layout pass), else ND.
* NPU memory of a kernel: the GM its outputs take (outputs read outside the kernel or returned),
  sized as the memory plan sizes them (run precision, 512-byte aligned). CPU memory of a call:
  the bytes of the graph outputs it returns (graph shapes and dtypes), not a measured allocation.
* The trace's instruction events are the simulator's timelines (`KernelReport.instructions`):
  per AI core (on 910B, AIC and AIV cores) and pipe, offset by the kernel's start. A kernel of
  several reports (a Cube kernel plus an int8 quantise) runs them one after another.

Only one profile records at a time: entering a second while one is active raises
`ProfilerError`.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import math
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.memory_plan import ELEMENT_BYTES, FLOAT_DTYPES
from ..compiler.optimize import RUN_HOOKS
from ..files.atomic import write_text_atomic
from ..hw.chip import PIPES

CPU_EVENT_NAME = "optimized_model.__call__"
DEFAULT_MAX_INSTRUCTION_EVENTS = 200_000
SORT_KEYS = ("npu_time_total", "self_npu_time_total", "cpu_time_total", "self_cpu_time_total", "count",
             "npu_memory_usage", "cpu_memory_usage")
KERNEL_DETAILS_COLUMNS = ("Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)", "Wait Time(us)",
                          "Block Num", "Input Shapes", "Input Data Types", "Input Formats")
_ALIGN = 512
_ASCEND_DTYPES = {"fp32": "FLOAT", "fp16": "FLOAT16", "bf16": "BF16", "int8": "INT8", "float32": "FLOAT",
                  "float16": "FLOAT16", "bfloat16": "BF16", "float64": "DOUBLE", "int64": "INT64",
                  "int32": "INT32", "int16": "INT16", "uint8": "UINT8", "bool": "BOOL"}
_CUBE_PIPES = {PIPES.index("CUBE"), PIPES.index("MTE1"), PIPES.index("FIXP")}
_CPU_PID, _KERNELS_PID, _CORE_PID_BASE = 0, 1, 100


class ProfilerError(ValueError):
    """Bad use of the profiler: the message names the rule, the value and a fix."""


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


@dataclass(frozen=True)
class ProfilerEvent:
    """One recorded event: an NPU kernel (simulated) or a CPU call (measured). Times in us on the
    profile's time axis: NPU events from the first run's start, CPU events from the profile's start."""

    name: str                       # NPU op ("Conv2D") or "optimized_model.__call__"
    device: str                     # "NPU" or "CPU"
    kernel: str                     # the kernel's full name ("Conv2D:layer1.0.conv1"), or the model's name
    run: int
    start_us: float
    duration_us: float
    self_cpu_time_us: float = 0.0
    cpu_time_total_us: float = 0.0
    self_npu_time_us: float = 0.0
    npu_time_total_us: float = 0.0
    input_shapes: tuple = ()
    input_dtypes: tuple = ()
    input_formats: tuple = ()
    cpu_memory_bytes: int = 0
    npu_memory_bytes: int = 0
    gm_bytes: float = 0.0
    unit: str = ""
    accelerator_core: str = ""
    block_num: int = 0
    wait_time_us: float = 0.0
    stack: tuple = ()
    simulated: bool = False         # a CPU event whose time is simulated (pypto-lab run's host dispatch), not measured


@dataclass
class _Run:
    index: int
    model: str
    chip: str
    kernels: list                   # KernelCost, in execution order
    starts: list[float]             # absolute NPU start of each kernel (us)
    ends: list[float]
    npu_offset_us: float
    latency_us: float
    cpu_start_us: float | None
    cpu_time_us: float


# ---- formatting (torch.profiler's units) -----------------------------------------------------

def format_time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def format_memory(nbytes: float) -> str:
    for unit, size in (("Gb", 1024 ** 3), ("Mb", 1024 ** 2), ("Kb", 1024)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} b"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "0.00%"


# ---- key averages --------------------------------------------------------------------------

@dataclass
class KernelAverage:
    """Events of one name (and input shapes, when grouped by them), summed."""

    key: str
    input_shapes: tuple = ()
    count: int = 0
    self_cpu_time_total: float = 0.0
    cpu_time_total: float = 0.0
    self_npu_time_total: float = 0.0
    npu_time_total: float = 0.0
    cpu_memory_usage: int = 0
    npu_memory_usage: int = 0

    @property
    def npu_time(self) -> float:
        return self.npu_time_total / self.count if self.count else 0.0

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count if self.count else 0.0

    def add(self, e: ProfilerEvent) -> None:
        self.count += 1
        self.self_cpu_time_total += e.self_cpu_time_us
        self.cpu_time_total += e.cpu_time_total_us
        self.self_npu_time_total += e.self_npu_time_us
        self.npu_time_total += e.npu_time_total_us
        self.cpu_memory_usage += e.cpu_memory_bytes
        self.npu_memory_usage += e.npu_memory_bytes


class KeyAverages(list):
    """`prof.key_averages()`: a list of `KernelAverage` with torch.profiler's ``table``."""

    def __init__(self, items, record_shapes: bool, profile_memory: bool, runs: int, latency_us: float):
        super().__init__(items)
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.runs = runs
        self.latency_us = latency_us

    def table(self, sort_by: str | None = None, row_limit: int = 100, max_name_column_width: int = 55,
              max_shapes_column_width: int = 80) -> str:
        if sort_by is not None and sort_by not in SORT_KEYS:
            raise ProfilerError(f"sort_by={sort_by!r} is not a known key; allowed: {', '.join(SORT_KEYS)} "
                                "(or None for recording order)")
        if isinstance(row_limit, bool) or not isinstance(row_limit, int):
            raise ProfilerError(f"row_limit={row_limit!r} must be an int (rows to print; <= 0 prints all)")
        rows = list(self)
        if sort_by is not None:
            attr = "count" if sort_by == "count" else sort_by
            rows.sort(key=lambda a: getattr(a, attr), reverse=True)
        if row_limit > 0:
            rows = rows[:row_limit]
        self_cpu = sum(a.self_cpu_time_total for a in self)
        self_npu = sum(a.self_npu_time_total for a in self)
        name_w = max(4, min(max_name_column_width, max([len(a.key) for a in rows] + [4])))
        cols: list[tuple[str, int]] = [("Name", name_w)]
        cols += [(h, 12) for h in ("Self CPU %", "Self CPU", "CPU total", "Self NPU", "Self NPU %", "NPU total",
                                   "NPU time avg")]
        if self.profile_memory:
            cols += [("CPU Mem", 12), ("NPU Mem", 12)]
        cols.append(("# of Calls", 12))
        shapes_w = 0
        if self.record_shapes:
            shapes_w = max(12, min(max_shapes_column_width, max([len(_shapes_str(a.input_shapes)) for a in rows] + [12])))
            cols.append(("Input Shapes", shapes_w))
        rule = "  ".join("-" * w for _, w in cols)

        def line(cells: list[str]) -> str:
            out = []
            for (_, w), c in zip(cols, cells):
                if len(c) > w:
                    c = c[:w - 3] + "..."
                out.append(c.rjust(w))
            return "  ".join(out)

        lines = [rule, line([h for h, _ in cols]), rule]
        for a in rows:
            cells = [a.key, _pct(a.self_cpu_time_total, self_cpu), format_time(a.self_cpu_time_total),
                     format_time(a.cpu_time_total), format_time(a.self_npu_time_total),
                     _pct(a.self_npu_time_total, self_npu), format_time(a.npu_time_total), format_time(a.npu_time)]
            if self.profile_memory:
                cells += [format_memory(a.cpu_memory_usage), format_memory(a.npu_memory_usage)]
            cells.append(str(a.count))
            if self.record_shapes:
                cells.append(_shapes_str(a.input_shapes))
            lines.append(line(cells))
        if not self:
            lines.append("(no events: no run was recorded; call the optimized model inside "
                         "`with profiler.profile(...)`)")
        lines.append(rule)
        lines.append(f"Self CPU time total: {format_time(self_cpu)}")
        lines.append(f"Self NPU time total: {format_time(self_npu)}")
        if self.runs:
            lines.append(f"NPU latency ({self.runs} run{'s' if self.runs != 1 else ''}, simulated schedule): "
                         f"{format_time(self.latency_us)}")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.table()


def _shapes_str(shapes: tuple) -> str:
    return str([list(s) for s in shapes]) if shapes else "[]"


# ---- the profile ---------------------------------------------------------------------------

_ACTIVE: list[profile] = []


def _activities(activities) -> frozenset:
    if activities is None:
        return frozenset(ProfilerActivity)
    if isinstance(activities, (str, ProfilerActivity)):
        activities = [activities]
    out = set()
    for a in activities:
        if isinstance(a, ProfilerActivity):
            out.add(a)
        elif isinstance(a, str) and a.upper() in ProfilerActivity.__members__:
            out.add(ProfilerActivity[a.upper()])
        else:
            hint = " (pypto_lab profiles an NPU: use ProfilerActivity.NPU)" if "CUDA" in str(a).upper() else ""
            raise ProfilerError(f"activity {a!r} is not known; allowed: ProfilerActivity.CPU, "
                                f"ProfilerActivity.NPU{hint}")
    if not out:
        raise ProfilerError("activities=[] records nothing; give ProfilerActivity.CPU and/or ProfilerActivity.NPU")
    return frozenset(out)


class profile:
    """Record the runs of optimised models (see the module docstring). Use as a context manager,
    or call ``start()`` / ``stop()``."""

    def __init__(self, activities=None, record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, max_instruction_events: int = DEFAULT_MAX_INSTRUCTION_EVENTS):
        self.activities = _activities(activities)
        for name, val in (("record_shapes", record_shapes), ("profile_memory", profile_memory),
                          ("with_stack", with_stack)):
            if not isinstance(val, bool):
                raise ProfilerError(f"{name}={val!r} must be True or False")
        if isinstance(max_instruction_events, bool) or not isinstance(max_instruction_events, int) \
                or max_instruction_events < 0:
            raise ProfilerError(f"max_instruction_events={max_instruction_events!r} must be an int >= 0 "
                                f"(instruction events in the Chrome trace; default {DEFAULT_MAX_INSTRUCTION_EVENTS})")
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.max_instruction_events = max_instruction_events
        self._events: list[ProfilerEvent] = []
        self._runs: list[_Run] = []
        self._t0: float | None = None
        self._npu_clock = 0.0          # where the next run's kernels start (us)
        self._last_npu_end = 0.0
        self._static: dict[int, tuple] = {}   # id(report) -> (report, per-kernel static info)

    # -- lifetime
    def start(self) -> profile:
        if _ACTIVE:
            raise ProfilerError("a profile is already recording: profiles do not nest; exit the outer "
                                "`with profiler.profile(...)` first, or record everything in one profile")
        if self._t0 is None:
            self._t0 = time.perf_counter()
        _ACTIVE.append(self)
        return self

    def stop(self) -> None:
        if _ACTIVE and _ACTIVE[-1] is self:
            _ACTIVE.pop()

    def __enter__(self) -> profile:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- raw access
    def events(self) -> list[ProfilerEvent]:
        """Every recorded event, in recording order (per run: its CPU call, then its kernels)."""
        return list(self._events)

    @property
    def runs(self) -> int:
        return len(self._runs)

    def key_averages(self, group_by_input_shape: bool = False) -> KeyAverages:
        if group_by_input_shape and not self.record_shapes:
            raise ProfilerError("group_by_input_shape=True needs the shapes: profile(..., record_shapes=True)")
        groups: dict[tuple, KernelAverage] = {}
        for e in self._events:
            key = (e.name, e.input_shapes) if group_by_input_shape else (e.name,)
            avg = groups.get(key)
            if avg is None:
                avg = groups[key] = KernelAverage(e.name, e.input_shapes if group_by_input_shape else ())
            avg.add(e)
        if not group_by_input_shape and self.record_shapes:  # the shapes column shows the first call's
            first: dict[str, tuple] = {}
            for e in self._events:
                first.setdefault(e.name, e.input_shapes)
            for (name,), avg in groups.items():
                avg.input_shapes = first[name]
        return KeyAverages(groups.values(), self.record_shapes, self.profile_memory, len(self._runs),
                           sum(r.latency_us for r in self._runs))

    # -- recording
    def _record(self, om, inputs, cpu_time_us: float) -> None:
        report = om.report()
        static = self._static_of(om, report)
        now = time.perf_counter()
        index = len(self._runs)
        cpu_start = None
        if ProfilerActivity.CPU in self.activities:
            cpu_start = max(0.0, (now - self._t0) * 1e6 - cpu_time_us)
            shapes = tuple(tuple(int(d) for d in t.shape) for t in _tensors(inputs)) if self.record_shapes else ()
            dtypes = tuple(str(t.dtype).replace("torch.", "") for t in _tensors(inputs)) if self.record_shapes else ()
            stack = _stack() if self.with_stack else ()
            self._events.append(ProfilerEvent(
                CPU_EVENT_NAME, "CPU", report.model or type(om.model).__name__, index, cpu_start, cpu_time_us,
                self_cpu_time_us=cpu_time_us, cpu_time_total_us=cpu_time_us,
                npu_time_total_us=sum(k.time_us for k in report.kernels) if ProfilerActivity.NPU in self.activities
                else 0.0,
                input_shapes=shapes, input_dtypes=dtypes,
                cpu_memory_bytes=static[1] if self.profile_memory else 0, unit="cpu", accelerator_core="CPU",
                stack=stack))
        offset = self._npu_clock
        sched = report.schedule
        if sched is not None and len(sched.kernels) == len(report.kernels) \
                and all(s.name == k.name for s, k in zip(sched.kernels, report.kernels)):
            rel = [(s.start_us, s.end_us) for s in sched.kernels]
        else:  # no schedule: one after another
            rel, t = [], 0.0
            for k in report.kernels:
                rel.append((t, t + k.time_us))
                t += k.time_us
        starts = [offset + s for s, _ in rel]
        ends = [offset + e for _, e in rel]
        latency = report.latency_us
        if ProfilerActivity.NPU in self.activities:
            for k, info, s, e in zip(report.kernels, static[0], starts, ends):
                wait = max(0.0, s - self._last_npu_end)
                self._last_npu_end = max(self._last_npu_end, e)
                self._events.append(ProfilerEvent(
                    info["op"], "NPU", k.name, index, s, k.time_us,
                    self_npu_time_us=k.time_us, npu_time_total_us=k.time_us,
                    input_shapes=info["shapes"] if self.record_shapes else (),
                    input_dtypes=info["dtypes"] if self.record_shapes else (),
                    input_formats=info["formats"] if self.record_shapes else (),
                    npu_memory_bytes=info["memory"] if self.profile_memory else 0, gm_bytes=k.gm_bytes,
                    unit=k.unit, accelerator_core=info["core"], block_num=info["blocks"], wait_time_us=wait))
        self._runs.append(_Run(index, report.model, report.chip, list(report.kernels), starts, ends, offset,
                               latency, cpu_start, cpu_time_us))
        self._npu_clock = offset + latency

    def _static_of(self, om, report) -> tuple:
        hit = self._static.get(id(report))
        if hit is not None and hit[0] is report:
            return hit[1]
        info = _static_info(om, report)
        self._static[id(report)] = (report, info)
        return info

    # -- exports
    def export_chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write a Chrome / Perfetto trace (JSON object format, times in us); see the module docstring."""
        target = _check_path(path, "export_chrome_trace", "trace.json")
        trace = self._chrome_trace()
        return _write(target, json.dumps(trace, separators=(",", ":")))

    def export_kernel_details(self, path: str | os.PathLike) -> Path:
        """Write the NPU kernels as Ascend's kernel_details.csv does (one row per kernel per run)."""
        target = _check_path(path, "export_kernel_details", "kernel_details.csv")
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(KERNEL_DETAILS_COLUMNS)
        for e in self._events:
            if e.device != "NPU":
                continue
            w.writerow([e.kernel, e.name, e.accelerator_core, f"{e.start_us:.3f}", f"{e.duration_us:.3f}",
                        f"{e.wait_time_us:.3f}", e.block_num,
                        ";".join(",".join(str(d) for d in s) for s in e.input_shapes),
                        ";".join(e.input_dtypes), ";".join(e.input_formats)])
        return _write(target, buf.getvalue())

    def _chrome_trace(self) -> dict:
        ev: list[dict] = []

        def meta(kind: str, pid: int, tid: int, value) -> None:
            key = "name" if kind.endswith("_name") else "sort_index"
            ev.append({"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {key: value}})

        if ProfilerActivity.CPU in self.activities:
            meta("process_name", _CPU_PID, 0, "CPU")
            meta("process_sort_index", _CPU_PID, 0, 0)
            meta("thread_name", _CPU_PID, 1, "python")
            for e in self._events:
                if e.device == "CPU":
                    args: dict[str, Any] = {"model": e.kernel, "run": e.run, "measured": not e.simulated}
                    if e.input_shapes:
                        args["Input Shapes"] = [list(s) for s in e.input_shapes]
                    if e.stack:
                        args["stack"] = list(e.stack)
                    ev.append({"name": e.name, "cat": "cpu_op", "ph": "X", "pid": _CPU_PID, "tid": 1,
                               "ts": _us(e.start_us), "dur": _us(e.duration_us), "args": args})
        npu = ProfilerActivity.NPU in self.activities
        total_instr = shown = 0
        kernels_shown = kernels_cut = 0
        if npu:
            meta("process_name", _KERNELS_PID, 0, "NPU kernels")
            meta("process_sort_index", _KERNELS_PID, 0, 1)
            lanes: list[float] = []       # end of the last kernel of each lane (overlapping kernels)
            by_run: dict[int, list[ProfilerEvent]] = {}
            for e in self._events:
                if e.device == "NPU":
                    by_run.setdefault(e.run, []).append(e)
            chips = {c: i for i, c in enumerate(dict.fromkeys(id(r.chip) for r in self._runs))}
            named_cores: set[int] = set()
            budget = self.max_instruction_events
            for run in self._runs:
                chip = run.chip
                base = _CORE_PID_BASE + 1000 * chips[id(run.chip)]
                for k, e, start, end in zip(run.kernels, by_run.get(run.index, []), run.starts, run.ends):
                    lane = next((i for i, t in enumerate(lanes) if t <= start + 1e-9), len(lanes))
                    if lane == len(lanes):
                        lanes.append(0.0)
                        meta("thread_name", _KERNELS_PID, lane + 1, "kernels" if lane == 0 else f"kernels {lane + 1}")
                    lanes[lane] = end
                    ev.append({"name": k.name, "cat": "kernel", "ph": "X", "pid": _KERNELS_PID, "tid": lane + 1,
                               "ts": _us(start), "dur": _us(end - start),
                               "args": {"op": e.name, "run": run.index, "unit": k.unit,
                                        "accelerator_core": e.accelerator_core, "time_us": k.time_us,
                                        "gm_bytes": k.gm_bytes, "block_num": e.block_num,
                                        "fused_ops": list(k.fused_ops)}})
                    t = start
                    complete = True
                    for rep in k.reports:
                        tl = rep.instructions
                        n = len(tl)
                        total_instr += n
                        take = min(n, budget)
                        if take < n:
                            complete = False
                        if take:
                            shown += take
                            budget -= take
                            _instruction_events(ev, tl, take, chip, base, t, k.name, run.index, named_cores, meta,
                                                len(chips) > 1)
                        t += rep.time_us
                    if k.reports:
                        kernels_shown += complete
                        kernels_cut += not complete
        axes = getattr(self, "time_axes", None) or {
            "source": "pypto_lab simulator (NPU events) and measured wall time (CPU events)",
            "npu_time_axis": "simulated; run i starts where run i-1's schedule ends, from 0",
            "cpu_time_axis": "measured wall clock from the profile's start"}
        other = {"pypto_lab": {
            **axes,
            "runs": len(self._runs),
            "instruction_events": shown, "instructions_total": total_instr,
            "max_instruction_events": self.max_instruction_events,
            "truncated": shown < total_instr,
        }}
        if shown < total_instr:
            other["pypto_lab"]["note"] = (
                f"instruction events truncated: {shown:,} of {total_instr:,} shown ({kernels_shown} kernel "
                f"timelines complete, {kernels_cut} cut or left out); raise profile(max_instruction_events=...) "
                "to see more")
        return {"traceEvents": ev, "displayTimeUnit": "ns", "otherData": other}


def _us(x: float) -> float:
    return round(float(x), 4)


def _core_name(chip, g: int) -> str:
    if chip.split_cores:
        return f"AIC {g}" if g < chip.cube_cores else f"AIV {g - chip.cube_cores}"
    return f"AI Core {g}" if g < chip.cube_cores else f"Vector Core {g - chip.cube_cores}"


def _instruction_events(ev: list, tl, take: int, chip, base: int, t0: float, kernel: str, run: int,
                        named: set, meta, multi: bool) -> None:
    """Complete events for the first ``take`` instructions of a timeline, on their core and pipe."""
    pipes = tl.pipe[:take]
    cube_layout = bool(len(tl)) and any(int(p) in _CUBE_PIPES for p in set(tl.pipe.tolist()))
    cores = tl.core[:take].astype("int64")
    if chip.split_cores and not cube_layout:   # a vector kernel's core c is AIV c
        cores = cores + chip.cube_cores
    scale = 1.0 / chip.clock_mhz
    ts = (t0 + tl.start[:take] * scale).round(4).tolist()
    dur = ((tl.end[:take] - tl.start[:take]) * scale).round(4).tolist()
    kinds = tl.kinds
    kind = tl.kind[:take].tolist()
    pipes_l = pipes.tolist()
    cores_l = cores.tolist()
    for g in set(cores_l):
        pid = base + g
        if pid not in named:
            named.add(pid)
            meta("process_name", pid, 0, f"{_core_name(chip, g)} ({chip.name})" if multi else _core_name(chip, g))
            meta("process_sort_index", pid, 0, 2 + pid)
            for i, p in enumerate(PIPES):
                meta("thread_name", pid, i + 1, p)
                meta("thread_sort_index", pid, i + 1, i)
    args = {"kernel": kernel, "run": run}
    for c, p, k, s, d in zip(cores_l, pipes_l, kind, ts, dur):
        ev.append({"name": kinds[k], "cat": PIPES[p], "ph": "X", "pid": base + c, "tid": p + 1, "ts": s, "dur": d,
                   "args": args})


# ---- per-kernel static information ------------------------------------------------------------

def _static_info(om, report) -> tuple[list[dict], int]:
    """Per kernel: op type, accelerator core, blocks, input shapes / dtypes / formats, output GM bytes;
    and the bytes of the graph outputs (what a call returns)."""
    graph = om.graph
    info_of: dict[str, Any] = {name: v.info for name, v in graph.values.items()}
    nodes = {}
    for n in graph.nodes:
        nodes[n.name] = n
        info_of[n.name] = n.outputs[0] if n.outputs else None
    readers: dict[str, set[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, set()).add(n.name)
    outputs = set(graph.outputs)
    precision = report.memory.precision if report.memory is not None else report.precision
    elem = ELEMENT_BYTES.get(precision, 4)
    split = report.chip.split_cores
    out = []
    for k in report.kernels:
        inside = set(k.nodes)
        knodes = [nodes[x] for x in k.nodes if x in nodes]
        shapes, dtypes, formats, seen = [], [], [], set()
        for n in knodes:
            fmts = n.input_formats
            for i in n.inputs:
                if i in inside or i in seen:
                    continue
                seen.add(i)
                ti = info_of.get(i)
                shapes.append(tuple(ti.shape) if ti is not None else ())
                dtypes.append(_dtype_name(ti, k.spec.dtypes[0] or precision))
                formats.append(str(fmts.get(i, "ND")))
        memory = 0
        for n in knodes:
            if n.is_view:
                continue
            if n.name in outputs or (readers.get(n.name, set()) - inside):
                for o in n.outputs:
                    nbytes = o.numel * elem if o.dtype in FLOAT_DTYPES else o.nbytes
                    memory += -(-nbytes // _ALIGN) * _ALIGN
        out.append({"op": _op_of(k.name), "core": _accelerator_core(k, split),
                    "blocks": max((r.cores_used for r in k.reports), default=0),
                    "shapes": tuple(shapes), "dtypes": tuple(dtypes), "formats": tuple(formats), "memory": memory})
    returned = sum(ti.nbytes for ti in (info_of.get(o) for o in graph.outputs) if ti is not None)
    return out, returned


def _op_of(kernel_name: str) -> str:
    parts = kernel_name.split(":")
    if parts[0] == "cpu" and len(parts) > 1:   # a CPU fallback: "cpu:<aten op>:<module>"
        return f"cpu:{parts[1]}"
    return parts[0]


def _accelerator_core(k, split: bool) -> str:
    """Ascend's names: AI_CORE (910A/310P every kernel; 910B Cube only), AI_VECTOR_CORE (910B Vector
    only), MIX_AIC (910B Cube with Vector epilogue, fused attention). A CPU fallback runs on the host
    in this model (over PCIe), so it is HOST_CPU rather than the device's AI_CPU."""
    if k.unit == "cpu":
        return "HOST_CPU"
    if not split:
        return "AI_CORE"
    res = set(k.resources)
    if res == {"AIV"}:
        return "AI_VECTOR_CORE"
    return "MIX_AIC" if "AIV" in res else "AI_CORE"


def _dtype_name(ti, dtype: str) -> str:
    if ti is None:
        return "UNDEFINED"
    if ti.dtype in FLOAT_DTYPES:
        return _ASCEND_DTYPES.get(dtype, dtype.upper())
    return _ASCEND_DTYPES.get(ti.dtype, ti.dtype.upper())


def _tensors(inputs) -> list:
    import torch
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, (tuple, list)):
        return [t for x in inputs for t in _tensors(x)]
    if isinstance(inputs, dict):
        return [t for x in inputs.values() for t in _tensors(x)]
    return []


def _stack() -> tuple:
    here = os.path.dirname(os.path.abspath(__file__))
    frames = [f for f in traceback.extract_stack()[:-1] if not os.path.abspath(f.filename).startswith(here)]
    return tuple(f"{f.filename}({f.lineno}): {f.name}" for f in frames[-16:])


# ---- files ---------------------------------------------------------------------------------

def _check_path(path, what: str, example: str) -> Path:
    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise ProfilerError(f"{what}: path {path!r} must be a file path such as 'out/{example}'")
    p = Path(path)
    if p.is_dir():
        raise ProfilerError(f"{what}: {str(p)!r} is a directory; give a file path inside it, e.g. "
                            f"{str(p / example)!r}")
    if not p.parent.is_dir():
        raise ProfilerError(f"{what}: directory {str(p.parent)!r} does not exist; create it first "
                            f"(os.makedirs({str(p.parent)!r})) or write to an existing directory")
    return p


def _write(path: Path, text: str) -> Path:
    try:
        return write_text_atomic(path, text)
    except OSError as exc:
        raise ProfilerError(f"cannot write {str(path)!r}: {exc.strerror or exc}; choose a writable path "
                            "(nothing was written)") from exc


# ---- the hook OptimizedModel.__call__ calls ----------------------------------------------

def notify_run(optimized_model, inputs, cpu_time_us: float) -> None:
    """Record one run of ``optimized_model`` on ``inputs`` that took ``cpu_time_us`` (measured) on the
    CPU, if a profile is recording; otherwise do nothing."""
    if not _ACTIVE:
        return
    prof = _ACTIVE[-1]
    if isinstance(cpu_time_us, bool) or not isinstance(cpu_time_us, (int, float)) \
            or not math.isfinite(cpu_time_us) or cpu_time_us < 0:
        raise ProfilerError(f"notify_run: cpu_time_us={cpu_time_us!r} must be a finite number of "
                            "microseconds >= 0 (the measured wall time of the call)")
    if not callable(getattr(optimized_model, "report", None)) or getattr(optimized_model, "graph", None) is None:
        raise ProfilerError(f"notify_run: optimized_model must be an OptimizedModel (with .report() and .graph), "
                            f"got {type(optimized_model).__name__}; pass what pypto_lab.optimize(...) returns")
    prof._record(optimized_model, inputs, float(cpu_time_us))


if notify_run not in RUN_HOOKS:   # every OptimizedModel call reports to the profiler (once per process)
    RUN_HOOKS.append(notify_run)


__all__ = ["AdvancedProfiler", "ProfilerActivity", "ProfilerError", "ProfilerEvent", "KernelAverage", "KeyAverages", "profile",
           "notify_run", "format_time", "format_memory", "SORT_KEYS", "KERNEL_DETAILS_COLUMNS"]


# The seed article's name for a profile with stacks and memory (section 9.3):
#   profiler = AdvancedProfiler(activities=[...], record_shapes=True, profile_memory=True, with_stack=True)
#   with profiler: model(x)
#   profiler.export_chrome_trace("trace.json")
AdvancedProfiler = profile
