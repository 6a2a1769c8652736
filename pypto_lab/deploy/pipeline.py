"""Asynchronous inference pipelines, as an AscendCL application runs them: `pipeline(model_or_om,
batch, streams)` simulates host pre-processing, the host-to-device copy, the model's execution on
the AI cores and the device-to-host copy of many request batches on N streams joined by events,
and measures throughput, per-request latency and how busy each resource is.

What is modelled, and on what it rests:

* **Requests.** ``requests`` batches of ``batch`` samples go to the streams round-robin (batch r to
  stream r mod N). Closed loop by default (every stream always has its next batch: the maximum
  throughput); with ``rate_per_s`` (samples/s offered) batch r arrives at ``r * batch / rate`` and
  its latency counts from its arrival, so queueing shows.
* **Host pre-processing** of a batch runs on one host thread; each stream has its own (as in the
  multi-stream AscendCL samples, one thread per stream), or ``host_threads`` shared ones. Its cost
  per sample is ``preprocess_ms``, or the measured median time of ``preprocess(sample)`` on this
  machine, or by default the measured time to read, decode and resize one of the shipped images
  (`pypto_lab.data.image_folder`) to the model's input size (zero, with a note, for a model whose
  input is not an image). Each stream owns one pinned input buffer, so pre-processing of its next
  batch waits until the previous batch's H2D copy out of it has finished.
* **Copies** take `pypto_lab.data.link_copy_ms`: bytes over the chip preset's ``host_link_gbps``
  (PCIe, per direction, with its source in the preset), plus a measured host memcpy for pageable
  memory (``pinned=False``; aclrtMallocHost buffers are pinned, the default). The link's bandwidth
  is per direction and full duplex, so one H2D and one D2H copy overlap, but copies in the same
  direction share it: they are modelled as one H2D and one D2H DMA engine serving copies in order
  (two concurrent copies at half bandwidth each would finish the pair at the same time).
  Bandwidth only: no fixed per-copy latency, as in `pypto_lab.data` (no public Ascend figure).
* **Compute** of a batch takes the report's ``latency_us`` for that batch size (the model
  optimised at that batch: `optimize` is re-run per batch and cached). The report's schedule
  already spreads each kernel over all AI cores, so executions of different streams do not run
  concurrently: the AI cores serve one model execution at a time, in order (an upper bound for
  small batches that leave cores idle).
* **Streams and events.** Within a stream, operations run in the order they were launched (the
  next batch's H2D waits for this batch's D2H on the same stream); across streams only the shared
  engines order them. The host thread records an event after the H2D, which is what it waits on
  before refilling its input buffer. ``mode="sync"`` is the blocking program (aclrtMemcpy,
  aclmdlExecute, aclrtMemcpy on one thread): each stage waits for the one before, and the next
  batch's pre-processing waits for the last copy.

Every resource serves at most one operation at a time, so each one's busy time is at most the wall
time (`PipelineResult.utilization`); `PipelineResult.chrome_trace` writes one lane per stream and
one per engine (host threads, H2D DMA, AI cores, D2H DMA).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..files.atomic import write_text_atomic
from ..hw.chip import DEFAULT_CHIP
from ..train.data import host_memcpy_gbps, link_copy_ms

STAGES = ("preprocess", "h2d", "compute", "d2h")
ENGINES = {"h2d": "H2D DMA", "compute": "AI cores", "d2h": "D2H DMA"}
MODES = ("async", "sync")


class PipelineError(ValueError):
    """A pipeline was asked for something it cannot simulate; the message names the rule, the
    value given and the fix."""


# ---- the model: a report per batch size ---------------------------------------------------------

def _is_report(obj) -> bool:
    return hasattr(obj, "latency_us") and hasattr(obj, "batch") and hasattr(obj, "chip")


def _with_batch(inputs: tuple, batch: int) -> tuple:
    """``inputs`` with every tensor's leading dimension made ``batch`` (its first sample repeated)."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim():
            out.append(x[:1].repeat(batch, *([1] * (x.dim() - 1))))
        else:
            out.append(x)
    return tuple(out)


class ModelSource:
    """Where reports come from: an `OptimizedModel`, anything whose ``.report()`` returns a
    `Report` (an OM loaded later), or an ``nn.Module`` with example inputs. Reports are cached by
    batch size; a model that can be re-optimised (it carries ``.model`` and ``.graph``, or is an
    ``nn.Module``) gives a report at any batch, anything else only at its own."""

    def __init__(self, model_or_om, example_inputs=None, chip=None, level: int | None = None,
                 precision: str | None = None, input_bytes: int | None = None, output_bytes: int | None = None):
        self.module: torch.nn.Module | None = None
        self.example: tuple | None = None
        self.level, self.precision = level, precision
        self.chip = chip
        self.reports: dict[int, Any] = {}
        self.optimize_s: dict[int, float] = {}
        graph = None
        # an OptimizedModel is itself an nn.Module, but it carries its report: it goes the report way
        if isinstance(model_or_om, torch.nn.Module) and not callable(getattr(model_or_om, "report", None)):
            if example_inputs is None:
                raise PipelineError(
                    f"an nn.Module needs example inputs to be optimised; got {type(model_or_om).__name__} with "
                    "example_inputs=None: pass example_inputs=(x,) with one batch of real inputs, or an "
                    "OptimizedModel from pypto_lab.optimize")
            self.module = model_or_om
            self.example = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
            self.example = tuple(self.example)
            self.chip = chip or DEFAULT_CHIP
            self.level = 3 if level is None else level
            self.precision = precision or "fp16"
        else:
            report_fn = getattr(model_or_om, "report", None)
            if not callable(report_fn):
                raise PipelineError(
                    f"model_or_om must be an OptimizedModel, an object whose .report() returns a Report "
                    f"(e.g. an .om from pypto_lab.load_om) or an nn.Module with example_inputs; got "
                    f"{type(model_or_om).__name__}: pass pypto_lab.optimize(model, (x,), chip=...) or the "
                    f"module and example_inputs=(x,)")
            report = report_fn()
            if not _is_report(report):
                raise PipelineError(
                    f"model_or_om.report() must return a Report (with latency_us, batch and chip); "
                    f"{type(model_or_om).__name__}.report() returned {type(report).__name__}: pass an "
                    f"OptimizedModel or an object wrapping one")
            self.reports[int(report.batch)] = report
            self.chip = report.chip
            self.level, self.precision = getattr(report, "level", level), getattr(report, "precision", precision)
            graph = getattr(model_or_om, "graph", None)
            module = getattr(model_or_om, "model", None)
            if isinstance(module, torch.nn.Module) and graph is not None:
                self.module = module
                self.example = self._example_from_graph(graph, int(report.batch))
        self._graph_bytes = None  # an nn.Module: read from the first optimised graph
        if graph is not None:
            self._graph_bytes = self._io_bytes(graph, int(next(iter(self.reports))))
        self.input_bytes_per_sample = input_bytes
        self.output_bytes_per_sample = output_bytes

    @staticmethod
    def _example_from_graph(graph, batch: int) -> tuple | None:
        """Example inputs of the graph's input shapes (random, or zeros for integer inputs)."""
        inputs = []
        for v in graph.values.values():
            if v.kind != "input":
                continue
            if v.info is None:
                return None
            dtype = getattr(torch, v.info.dtype, torch.float32)
            shape = tuple(v.info.shape)
            inputs.append(torch.randn(shape, dtype=dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype))
        return tuple(inputs) if inputs else None

    @staticmethod
    def _io_bytes(graph, batch: int) -> tuple[float, float, tuple[int, ...] | None]:
        """(input bytes per sample, output bytes per sample, the first input's shape)."""
        ins = [v.info for v in graph.values.values() if v.kind == "input" and v.info is not None]
        outs = []
        for o in graph.outputs:
            try:
                info = graph.info(o)
            except KeyError:
                info = None
            if info is not None:
                outs.append(info)
        shape = tuple(ins[0].shape) if ins else None
        return (sum(i.nbytes for i in ins) / batch, sum(o.nbytes for o in outs) / batch, shape)

    @property
    def default_batch(self) -> int:
        """The batch the model was given at: its report's, or the example inputs' leading size."""
        if self.reports:
            return min(self.reports)
        first = self.example[0] if self.example else None
        return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1

    @property
    def can_rebatch(self) -> bool:
        return self.module is not None and self.example is not None

    def report(self, batch: int):
        if batch in self.reports:
            return self.reports[batch]
        if not self.can_rebatch:
            have = ", ".join(str(b) for b in sorted(self.reports))
            raise PipelineError(
                f"a report at batch {batch} is needed but this object only gives one at batch {have} and "
                f"cannot be re-optimised (it has no .model and .graph); pass batch={have}, or an "
                f"OptimizedModel / an nn.Module with example_inputs so each batch size can be optimised")
        from ..compiler.optimize import optimize

        t0 = time.perf_counter()
        om = optimize(self.module, _with_batch(self.example, batch), chip=self.chip, level=self.level,
                      precision=self.precision)
        self.optimize_s[batch] = time.perf_counter() - t0
        rep = om.report()
        self.reports[batch] = rep
        self.chip = rep.chip
        if self._graph_bytes is None and om.graph is not None:
            self._graph_bytes = self._io_bytes(om.graph, batch)
        return rep

    def io_bytes(self) -> tuple[float, float]:
        """Input and output bytes per sample: as given, else from the optimised graph."""
        gin, gout = (self._graph_bytes[0], self._graph_bytes[1]) if self._graph_bytes else (None, None)
        inb = self.input_bytes_per_sample if self.input_bytes_per_sample is not None else gin
        outb = self.output_bytes_per_sample if self.output_bytes_per_sample is not None else gout
        if inb is None or outb is None:
            raise PipelineError(
                "the copies need the model's input and output sizes, and this object has no graph to read "
                "them from; got input_bytes=None or output_bytes=None: pass input_bytes= and output_bytes= "
                "(bytes per sample)")
        return float(inb), float(outb)

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        return self._graph_bytes[2] if self._graph_bytes else None


# ---- host pre-processing ------------------------------------------------------------------------

_IMAGE_MS: dict[int, float] = {}


def measured_image_preprocess_ms(size: int, samples: int = 12) -> float:
    """Median time (ms, this machine) to read one shipped PNG, decode it, resize it to ``size`` x
    ``size`` and make it a tensor (`pypto_lab.data.image_folder`'s transform); measured once per size."""
    if size not in _IMAGE_MS:
        from ..train.data import image_folder

        ds = image_folder(size)
        ds[0]  # warm-up: imports, file cache
        times = []
        for i in range(min(samples, len(ds))):
            t0 = time.perf_counter()
            ds[(i * 7919) % len(ds)]
            times.append(time.perf_counter() - t0)
        _IMAGE_MS[size] = statistics.median(times) * 1e3
    return _IMAGE_MS[size]


def measure_callable_ms(fn: Callable[[Any], Any], sample: Any, repeats: int = 5) -> float:
    """Median time (ms, this machine) of ``fn(sample)`` after one warm-up call."""
    fn(sample)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(sample)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


# ---- the simulation ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One operation of one request: its stage, stream, the resource that ran it and when (us)."""

    request: int
    stream: int
    stage: str
    resource: str
    start_us: float
    end_us: float

    @property
    def time_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class StageCosts:
    """What one batch costs in each stage (ms) and the bytes it copies."""

    preprocess_ms: float
    h2d_ms: float
    compute_ms: float
    d2h_ms: float
    input_bytes: int
    output_bytes: int

    def ms(self, stage: str) -> float:
        return getattr(self, f"{stage}_ms")


def _simulate(costs: StageCosts, streams: int, requests: int, mode: str, host_threads: int,
              arrival_us: list[float]) -> list[Op]:
    """List scheduling of every request's four operations on the shared resources: repeatedly run
    the pending operation that can start earliest (ties: the earlier request). Each resource runs one
    operation at a time and never idles while an operation could use it."""
    dur = {s: costs.ms(s) * 1e3 for s in STAGES}
    free = {"h2d": 0.0, "compute": 0.0, "d2h": 0.0}
    host_free = [0.0] * host_threads
    stream_free = [0.0] * streams          # end of the last device operation launched on the stream
    buffer_free = [0.0] * streams          # the stream's input buffer: free after its last H2D
    thread_free = [0.0] * streams          # sync mode: the stream's host thread is blocked until its D2H
    next_stage = [0] * requests
    done = [0.0] * requests
    ops: list[Op] = []
    # a stream's host thread handles its batches in order: batch r + N is considered once batch r's
    # H2D copy has been placed (async: its input buffer is then known to be free at buffer_free) or
    # its D2H copy (sync: the thread is blocked until then)
    order_ok = [r < streams for r in range(requests)]
    release = "d2h" if mode == "sync" else "h2d"
    remaining = requests * len(STAGES)
    while remaining:
        best = None
        for r in range(requests):
            k = next_stage[r]
            if k >= len(STAGES) or not order_ok[r]:
                continue
            s = r % streams
            stage = STAGES[k]
            if stage == "preprocess":
                ready = max(arrival_us[r], buffer_free[s], thread_free[s])
                h = min(range(host_threads), key=lambda i: host_free[i])
                start = max(ready, host_free[h])
            else:
                if stage == "h2d" and r >= streams and next_stage[r - streams] < len(STAGES):
                    continue  # stream order: the stream's previous batch is not all launched yet
                ready = max(done[r], stream_free[s])
                start = max(ready, free[stage])
            if best is None or (start, r) < (best[0], best[1]):
                best = (start, r, stage, s, h if stage == "preprocess" else None)
        start, r, stage, s, h = best
        end = start + dur[stage]
        if stage == "preprocess":
            host_free[h] = end
            resource = f"host thread {h}"
        else:
            free[stage] = end
            stream_free[s] = end
            resource = ENGINES[stage]
            if stage == "h2d":
                buffer_free[s] = end
            if stage == "d2h" and mode == "sync":
                thread_free[s] = end
            if stage == release and r + streams < requests:
                order_ok[r + streams] = True
        done[r] = end
        next_stage[r] += 1
        remaining -= 1
        ops.append(Op(r, s, stage, resource, start, end))
    return ops


# ---- the result ---------------------------------------------------------------------------------

def _percentile(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class PipelineResult:
    """One simulated run: ``requests`` batches of ``batch`` samples on ``streams`` streams.

    ``throughput_per_s`` is samples per second over the run (first operation to last copy),
    ``latency_ms`` each batch's time from arrival (closed loop: the start of its pre-processing)
    to the end of its D2H copy, ``utilization[resource]`` its busy time over the wall time."""

    model: str
    chip: str
    batch: int
    streams: int
    mode: str
    requests: int
    host_threads: int
    costs: StageCosts
    ops: list[Op]
    arrival_us: list[float]
    rate_per_s: float | None = None
    notes: list[str] = field(default_factory=list)
    source: ModelSource | None = field(default=None, repr=False)
    settings: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def wall_us(self) -> float:
        return max(o.end_us for o in self.ops) - min(o.start_us for o in self.ops)

    @property
    def wall_ms(self) -> float:
        return self.wall_us / 1e3

    @property
    def samples(self) -> int:
        return self.batch * self.requests

    @property
    def throughput_per_s(self) -> float:
        return self.samples / (self.wall_us * 1e-6) if self.wall_us else 0.0

    @property
    def latencies_ms(self) -> list[float]:
        end = [0.0] * self.requests
        for o in self.ops:
            if o.stage == "d2h":
                end[o.request] = o.end_us
        if self.rate_per_s is None:  # closed loop: from the start of the batch's pre-processing
            begin = {o.request: o.start_us for o in self.ops if o.stage == "preprocess"}
            return [(end[r] - begin[r]) / 1e3 for r in range(self.requests)]
        return [(end[r] - self.arrival_us[r]) / 1e3 for r in range(self.requests)]

    @property
    def latency_ms(self) -> float:
        return statistics.fmean(self.latencies_ms)

    @property
    def latency_p50_ms(self) -> float:
        return _percentile(self.latencies_ms, 50)

    @property
    def latency_p99_ms(self) -> float:
        return _percentile(self.latencies_ms, 99)

    @property
    def resources(self) -> list[str]:
        hosts = [f"host thread {i}" for i in range(self.host_threads)]
        return [*hosts, *ENGINES.values()]

    def busy_us(self, resource: str) -> float:
        return sum(o.time_us for o in self.ops if o.resource == resource)

    @property
    def utilization(self) -> dict[str, float]:
        """Busy time over wall time of each host thread and engine."""
        wall = self.wall_us
        return {r: (self.busy_us(r) / wall if wall else 0.0) for r in self.resources}

    @property
    def bottleneck(self) -> str:
        util = self.utilization
        return max(util, key=util.get)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "chip": self.chip, "batch": self.batch, "streams": self.streams,
                "mode": self.mode, "requests": self.requests, "host_threads": self.host_threads,
                "rate_per_s": self.rate_per_s, "throughput_per_s": self.throughput_per_s,
                "latency_ms": self.latency_ms, "latency_p50_ms": self.latency_p50_ms,
                "latency_p99_ms": self.latency_p99_ms, "wall_ms": self.wall_ms,
                "preprocess_ms": self.costs.preprocess_ms, "h2d_ms": self.costs.h2d_ms,
                "compute_ms": self.costs.compute_ms, "d2h_ms": self.costs.d2h_ms,
                "input_bytes": self.costs.input_bytes, "output_bytes": self.costs.output_bytes,
                "utilization": self.utilization, "bottleneck": self.bottleneck, "notes": list(self.notes)}

    def summary(self) -> str:
        c = self.costs
        lines = [f"{self.model} on {self.chip}: batch {self.batch}, {self.streams} stream(s), {self.mode}, "
                 f"{self.requests} batches" + (f", offered {self.rate_per_s:,.0f} samples/s" if self.rate_per_s else ""),
                 f"  per batch: pre-process {c.preprocess_ms:.3f} ms, H2D {c.h2d_ms:.3f} ms "
                 f"({c.input_bytes / 1e6:.2f} MB), compute {c.compute_ms:.3f} ms, D2H {c.d2h_ms:.3f} ms "
                 f"({c.output_bytes / 1e6:.3f} MB)",
                 f"  throughput {self.throughput_per_s:,.1f} samples/s; latency mean {self.latency_ms:.2f} ms, "
                 f"p50 {self.latency_p50_ms:.2f} ms, p99 {self.latency_p99_ms:.2f} ms",
                 "  busy: " + ", ".join(f"{r} {u:.0%}" for r, u in self.utilization.items())
                 + f" (bottleneck: {self.bottleneck})"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.summary())

    def chrome_trace(self, path: str | Path | None = None) -> dict[str, Any]:
        """The run as a Chrome trace (chrome://tracing, Perfetto): process 0 has one lane per stream
        (its host pre-processing, copies and execution), process 1 one lane per host thread and
        engine. Written whole to ``path`` when given (`pypto_lab.files.write_text_atomic`)."""
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "streams"}},
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"{self.chip} engines"}},
        ]
        for s in range(self.streams):
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stream {s}"}})
        lanes = {r: i for i, r in enumerate(self.resources)}
        for r, i in lanes.items():
            events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": r}})
        for o in self.ops:
            args = {"request": o.request, "stream": o.stream, "resource": o.resource}
            name = f"{o.stage} #{o.request}"
            events.append({"name": name, "cat": o.stage, "ph": "X", "pid": 0, "tid": o.stream, "ts": o.start_us,
                           "dur": o.time_us, "args": args})
            events.append({"name": name, "cat": o.stage, "ph": "X", "pid": 1, "tid": lanes[o.resource],
                           "ts": o.start_us, "dur": o.time_us, "args": args})
        trace = {"traceEvents": events, "displayTimeUnit": "ms",
                 "otherData": {k: v for k, v in self.to_dict().items() if k != "utilization"}}
        if path is not None:
            write_text_atomic(path, json.dumps(trace))
        return trace

    def sweep(self, batches: Sequence[int] | None = None, streams: Sequence[int] | None = None,
              sync: bool = True) -> Sweep:
        """The same pipeline at every batch size and stream count (reports cached by batch)."""
        return _sweep(self.source, batches or [self.batch], streams or [self.streams], sync, self.settings)


# ---- checks -------------------------------------------------------------------------------------

def _check_int(name: str, value, minimum: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PipelineError(f"{name} must be an integer >= {minimum}; got {value!r}: {fix}")
    return value


def _check_ms(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise PipelineError(f"{name} must be a finite time >= 0 in ms; got {value!r}: pass e.g. {name}=0.5")
    return float(value)


# ---- the entry points ---------------------------------------------------------------------------

def _costs(source: ModelSource, batch: int, settings: dict[str, Any], notes: list[str]) -> tuple[StageCosts, Any]:
    report = source.report(batch)
    chip = report.chip
    if getattr(chip, "host_link_gbps", 0) <= 0:
        raise PipelineError(
            f"the chip's host_link_gbps must be > 0 to model the copies; {chip.name} has "
            f"{getattr(chip, 'host_link_gbps', None)!r}: add host_link_gbps = {{ value = ..., source = '...' }} to "
            f"its preset's [chip] section, or pick a chip that has it (e.g. Ascend910B1)")
    in_b, out_b = source.io_bytes()
    input_bytes, output_bytes = round(in_b * batch), round(out_b * batch)
    pinned = settings["pinned"]
    if settings["preprocess_ms"] is not None:
        pre = settings["preprocess_ms"]
        notes.append(f"pre-processing: {pre:.3f} ms per sample as given")
    elif settings["preprocess"] is not None:
        if settings.get("measured_ms") is None:  # timed once per pipeline / sweep
            settings["measured_ms"] = measure_callable_ms(settings["preprocess"], settings["sample"])
        pre = settings["measured_ms"]
        notes.append(f"pre-processing: {pre:.3f} ms per sample, the median of preprocess(sample) on this machine")
    else:
        shape = source.input_shape
        if shape is not None and len(shape) == 4 and shape[1] == 3 and shape[2] == shape[3] and 1 <= shape[2] <= 224:
            pre = measured_image_preprocess_ms(shape[2])
            notes.append(f"pre-processing: {pre:.3f} ms per sample, measured on this machine: read, decode and "
                         f"resize one shipped PNG to {shape[2]}x{shape[3]} (pypto_lab.data.image_folder); pass "
                         f"preprocess_ms= or preprocess= for your own")
        else:
            pre = 0.0
            notes.append(f"pre-processing: none modelled (input {shape} is not a square 3-channel image of at most "
                         f"224 pixels); pass preprocess_ms= or preprocess= to add it")
    memcpy = "" if pinned else f", pageable: + host memcpy at {host_memcpy_gbps():.1f} GB/s measured"
    notes.append(f"copies: {chip.name} host link {chip.host_link_gbps} GB/s per direction{memcpy}; one DMA "
                 f"engine per direction; executions share the AI cores one at a time")
    costs = StageCosts(pre * batch, link_copy_ms(chip, input_bytes, pinned), report.latency_us / 1e3,
                       link_copy_ms(chip, output_bytes, pinned), input_bytes, output_bytes)
    return costs, report


def _run(source: ModelSource, batch: int, streams: int, mode: str, settings: dict[str, Any]) -> PipelineResult:
    _check_int("batch", batch, 1, "pass batch=1 or more (samples per request)")
    _check_int("streams", streams, 1, "pass streams=1 (one stream) or more")
    if mode not in MODES:
        raise PipelineError(f"mode must be one of {', '.join(MODES)}; got {mode!r}: pass mode='async' (streams "
                            f"overlap) or mode='sync' (each stage waits)")
    if mode == "sync" and streams != 1:
        raise PipelineError(f"mode='sync' runs one stream (each stage blocks the host thread); got streams={streams}: "
                            f"pass streams=1 with mode='sync', or mode='async' for {streams} streams")
    requests = settings["requests"] if settings["requests"] is not None else max(32, 8 * streams)
    _check_int("requests", requests, 1, "pass requests=32 or more (batches to simulate)")
    host_threads = settings["host_threads"] if settings["host_threads"] is not None else streams
    _check_int("host_threads", host_threads, 1, "pass host_threads=1 or more, or None (one per stream)")
    if mode == "sync":
        host_threads = 1
    notes: list[str] = []
    costs, report = _costs(source, batch, settings, notes)
    rate = settings["rate_per_s"]
    if rate is None:
        arrival = [0.0] * requests
    else:
        arrival = [r * batch / rate * 1e6 for r in range(requests)]
    ops = _simulate(costs, streams, requests, mode, host_threads, arrival)
    if source.optimize_s.get(batch):
        notes.append(f"optimised at batch {batch} for this run in {source.optimize_s[batch]:.1f} s (cached)")
    return PipelineResult(getattr(report, "model", "model"), report.chip.name, batch, streams, mode, requests, host_threads, costs, ops,
                          arrival, rate, notes, source, settings)


def _settings(preprocess, preprocess_ms, sample, pinned, requests, host_threads, rate_per_s) -> dict[str, Any]:
    if preprocess is not None and not callable(preprocess):
        raise PipelineError(f"preprocess must be a callable taking one sample; got {type(preprocess).__name__}: "
                            f"pass e.g. preprocess=my_transform and sample=<one raw sample>")
    if preprocess is not None and preprocess_ms is not None:
        raise PipelineError("give preprocess (a callable to time) or preprocess_ms (a time), not both; got both: "
                            "drop one")
    if preprocess_ms is not None:
        preprocess_ms = _check_ms("preprocess_ms", preprocess_ms)
    if rate_per_s is not None and (isinstance(rate_per_s, bool) or not isinstance(rate_per_s, (int, float))
                                   or not rate_per_s > 0 or rate_per_s == float("inf")):
        raise PipelineError(f"rate_per_s must be a finite rate > 0 (samples offered per second); got {rate_per_s!r}: "
                            f"pass e.g. rate_per_s=1000, or None for a closed loop")
    return {"preprocess": preprocess, "preprocess_ms": preprocess_ms, "sample": sample, "pinned": bool(pinned),
            "requests": requests, "host_threads": host_threads, "rate_per_s": rate_per_s}


def pipeline(model_or_om, batch: int | None = None, streams: int = 2, *, mode: str = "async", example_inputs=None,
             chip=None, level: int | None = None, precision: str | None = None,
             preprocess: Callable[[Any], Any] | None = None, preprocess_ms: float | None = None, sample: Any = None,
             pinned: bool = True, requests: int | None = None, host_threads: int | None = None,
             rate_per_s: float | None = None, input_bytes: int | None = None,
             output_bytes: int | None = None) -> PipelineResult:
    """Simulate ``requests`` batches of ``batch`` samples through pre-processing, H2D copy, compute
    and D2H copy on ``streams`` streams (see the module notes for the model and its sources).

    ``model_or_om``: an `OptimizedModel`, any object whose ``.report()`` returns a `Report` (an OM
    loaded later), or an ``nn.Module`` with ``example_inputs`` (optimised with ``chip``, ``level``
    and ``precision``; defaults Ascend910B1, 3, fp16). A batch size other than the model's is
    optimised again (cached); ``batch=None`` takes the model's own. ``mode="sync"`` is the blocking one-stream program. Pre-processing:
    ``preprocess_ms`` per sample, or ``preprocess(sample)`` timed here, or by default the measured
    decode and resize of a shipped image. ``requests`` defaults to max(32, 8 x streams); ``rate_per_s``
    (samples/s) makes the load open-loop; ``input_bytes`` / ``output_bytes`` (per sample) override
    the sizes read from the graph."""
    source = model_or_om if isinstance(model_or_om, ModelSource) else ModelSource(
        model_or_om, example_inputs, chip, level, precision, input_bytes, output_bytes)
    settings = _settings(preprocess, preprocess_ms, sample, pinned, requests, host_threads, rate_per_s)
    return _run(source, source.default_batch if batch is None else batch, streams, mode, settings)


# ---- sweeps -------------------------------------------------------------------------------------

SWEEP_COLUMNS = ("batch", "streams", "mode", "throughput_per_s", "latency_ms", "latency_p50_ms", "latency_p99_ms",
                 "preprocess_ms", "h2d_ms", "compute_ms", "d2h_ms", "bottleneck")


@dataclass
class Sweep:
    """Rows of a sweep (one dict per batch size x stream count, plus a sync row per batch size);
    ``results`` the `PipelineResult` of each row; `pypto_lab.deploy.plot_throughput_latency` draws it."""

    model: str
    chip: str
    rows: list[dict[str, Any]]
    results: list[PipelineResult] = field(repr=False, default_factory=list)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, batch: int, streams: int, mode: str = "async") -> dict[str, Any]:
        for r in self.rows:
            if (r["batch"], r["streams"], r["mode"]) == (batch, streams, mode):
                return r
        raise KeyError(f"no row batch={batch}, streams={streams}, mode={mode!r} in this sweep")

    def table(self) -> str:
        head = (f"{'batch':>5} {'streams':>7} {'mode':<5} {'samples/s':>10} {'lat mean ms':>11} {'p50 ms':>8} "
                f"{'p99 ms':>8} {'pre ms':>7} {'H2D ms':>7} {'compute ms':>10} {'D2H ms':>7}  bottleneck")
        lines = [f"{self.model} on {self.chip}", head]
        for r in self.rows:
            lines.append(f"{r['batch']:>5} {r['streams']:>7} {r['mode']:<5} {r['throughput_per_s']:>10,.1f} "
                         f"{r['latency_ms']:>11.2f} {r['latency_p50_ms']:>8.2f} {r['latency_p99_ms']:>8.2f} "
                         f"{r['preprocess_ms']:>7.2f} {r['h2d_ms']:>7.3f} {r['compute_ms']:>10.3f} "
                         f"{r['d2h_ms']:>7.4f}  {r['bottleneck']}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())


def _sweep(source: ModelSource, batches, streams, sync: bool, settings: dict[str, Any]) -> Sweep:
    batches, streams = list(batches), list(streams)
    if not batches or not streams:
        raise PipelineError(f"a sweep needs at least one batch size and one stream count; got batches={batches!r}, "
                            f"streams={streams!r}: pass e.g. batches=[1, 8, 32], streams=[1, 2, 4]")
    rows, results = [], []
    for b in batches:
        runs = [("sync", 1)] if sync else []
        runs += [("async", s) for s in streams]
        for mode, s in runs:
            res = _run(source, b, s, mode, settings)
            d = res.to_dict()
            rows.append({k: d[k] for k in SWEEP_COLUMNS})
            results.append(res)
    return Sweep(results[0].model, results[0].chip, rows, results)


def sweep(model_or_om, batches: Sequence[int] = (1, 8, 32), streams: Sequence[int] = (1, 2, 4), *,
          sync: bool = True, example_inputs=None, chip=None, level: int | None = None, precision: str | None = None,
          preprocess: Callable[[Any], Any] | None = None, preprocess_ms: float | None = None, sample: Any = None,
          pinned: bool = True, requests: int | None = None, host_threads: int | None = None,
          rate_per_s: float | None = None, input_bytes: int | None = None,
          output_bytes: int | None = None) -> Sweep:
    """`pipeline` at every batch size in ``batches`` and stream count in ``streams`` (async), plus
    the synchronous one-stream program at each batch size when ``sync``; one row each."""
    source = model_or_om if isinstance(model_or_om, ModelSource) else ModelSource(
        model_or_om, example_inputs, chip, level, precision, input_bytes, output_bytes)
    settings = _settings(preprocess, preprocess_ms, sample, pinned, requests, host_threads, rate_per_s)
    return _sweep(source, batches, streams, sync, settings)


__all__ = ["ENGINES", "MODES", "STAGES", "ModelSource", "Op", "PipelineError", "PipelineResult", "StageCosts",
           "Sweep", "measured_image_preprocess_ms", "pipeline", "sweep"]
