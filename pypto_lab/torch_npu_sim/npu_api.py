"""The modules a torch_npu script imports, as the simulated card provides them: ``torch_npu`` (its fused
operators, formats, ``torch_npu.npu``), ``torch.npu`` (devices, synchronize, streams and events on
the card's timeline, memory from its HBM, amp, seeds), ``torch_npu.contrib.transfer_to_npu``,
``torch_npu.profiler``, ``torch_npu.optim`` and torchair.

Anything of torch_npu or torch.npu not listed here raises ``AttributeError`` naming it and this
stand-in, so an unsupported call is never silently wrong.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import types

import torch
from torch.utils._pytree import tree_map

from . import ops, standin
from .card import EventState, fmt_bytes

_VERSION = torch.__version__.split("+")[0] + "+pypto.lab.sim"


def _ns(name: str, doc: str) -> types.ModuleType:
    m = standin._Missing(name)
    m.__doc__ = doc
    return m


# ---------------------------------------------------------------------------- torch.npu

def build_npu(sim) -> types.ModuleType:
    card = sim.card
    npu = _ns("torch_npu.npu", "torch.npu on the simulated card of pypto-lab run (pypto_lab.torch_npu_sim)")

    def _index(device=None) -> int:
        if device is None:
            return sim.device_index
        if isinstance(device, int):
            i = device
        elif isinstance(device, str):
            i = int(device.split(":")[1]) if ":" in device else sim.device_index
        elif isinstance(device, torch.device):
            i = device.index if device.index is not None else sim.device_index
        else:
            raise TypeError(f"torch.npu: device {device!r} is not a device")
        if i != 0:
            raise RuntimeError(f"Invalid device id {i}: the simulated card of pypto-lab run is one NPU (npu:0); "
                               "multi-card (HCCL) runs are simulated by pypto-lab llm / serve, not by run")
        return i

    class Stream:
        """``torch.npu.Stream``: a stream of the card; work on it runs in order after what it waits for."""

        def __init__(self, device=None, priority=0, **kwargs):
            _index(device)
            self.index = card.new_stream()
            self.priority = priority

        @classmethod
        def _of(cls, index: int):
            s = cls.__new__(cls)
            s.index, s.priority = index, 0
            return s

        @property
        def device(self):
            return torch.device("npu", sim.device_index)

        def wait_event(self, event):
            card.wait_event(event._state, self.index)

        def wait_stream(self, stream):
            s = card.streams[self.index]
            s.free = max(s.free, card.streams[stream.index].free)

        def record_event(self, event=None):
            event = event or Event()
            event.record(self)
            return event

        def synchronize(self):
            card.synchronize_stream(self.index)

        def query(self) -> bool:
            return card.streams[self.index].free <= card.host

        def __eq__(self, other):
            return isinstance(other, Stream) and other.index == self.index

        def __hash__(self):
            return hash(("npu-stream", self.index))

        def __repr__(self):
            return f"<torch_npu.npu.Stream device=npu:{sim.device_index} stream={self.index} (simulated)>"

    class Event:
        """``torch.npu.Event``: records where its stream has got to; ``elapsed_time`` in ms."""

        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            self.enable_timing = enable_timing
            self._state = EventState()

        def record(self, stream=None):
            card.record_event(self._state, stream.index if stream is not None else None)

        def wait(self, stream=None):
            card.wait_event(self._state, stream.index if stream is not None else None)

        def query(self) -> bool:
            return self._state.time is not None and self._state.time <= card.host

        def synchronize(self):
            if self._state.time is not None:
                card._wait(self._state.time)

        def elapsed_time(self, end_event) -> float:
            if not (self.enable_timing and end_event.enable_timing):
                raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
            if self._state.time is None or end_event._state.time is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed time.")
            if end_event._state.time > card.host + 1e-9:
                raise RuntimeError("NPU error: the end event has not completed yet (call end.synchronize() or "
                                   "torch.npu.synchronize() before elapsed_time, as on the card)")
            return (end_event._state.time - self._state.time) / 1000.0

    default = Stream._of(0)

    @contextlib.contextmanager
    def stream(s):
        if s is None:
            yield
            return
        prev = card.current
        card.current = s.index
        try:
            yield
        finally:
            card.current = prev

    def set_stream(s):
        card.current = s.index

    def current_stream(device=None):
        _index(device)
        return default if card.current == 0 else Stream._of(card.current)

    mem = card.memory

    def memory_stats(device=None):
        _index(device)
        return {"allocated_bytes.all.current": mem.allocated, "allocated_bytes.all.peak": mem.peak,
                "reserved_bytes.all.current": mem.reserved, "reserved_bytes.all.peak": mem.peak_reserved,
                "num_alloc_retries": 0, "num_ooms": 0, "allocation.all.allocated": mem.allocations}

    def memory_summary(device=None, abbreviated=False):
        return (f"simulated NPU memory ({sim.chip.name}, {fmt_bytes(mem.capacity)} HBM): allocated "
                f"{fmt_bytes(mem.allocated)}, peak {fmt_bytes(mem.peak)}, reserved {fmt_bytes(mem.reserved)}")

    def get_device_properties(device=None):
        _index(device)
        return types.SimpleNamespace(name=sim.chip.name, total_memory=mem.capacity, cube_core_num=sim.chip.cube_cores,
                                     vector_core_num=sim.chip.vector_cores, L2_cache_size=sim.chip.l2_bytes)

    class _Config(types.SimpleNamespace):
        pass

    values = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: sim.device_index,
        "set_device": lambda device: _index(device) and None, "is_initialized": lambda: True, "init": lambda: None,
        "get_device_name": lambda device=None: (_index(device), sim.chip.name)[1],
        "get_device_properties": get_device_properties, "get_device_capability": lambda device=None: (9, 0),
        "synchronize": lambda device=None: (_index(device), card.synchronize())[1],
        "Stream": Stream, "Event": Event, "stream": stream, "set_stream": set_stream,
        "current_stream": current_stream, "default_stream": lambda device=None: default,
        "device": lambda device=None: contextlib.nullcontext(), "device_of": lambda obj: contextlib.nullcontext(),
        "memory_allocated": lambda device=None: mem.collect(), "max_memory_allocated": lambda device=None: mem.peak,
        "memory_reserved": lambda device=None: mem.reserved, "max_memory_reserved": lambda device=None: mem.peak_reserved,
        "reset_peak_memory_stats": lambda device=None: mem.reset_peak(),
        "reset_max_memory_allocated": lambda device=None: mem.reset_peak(),
        "reset_max_memory_cached": lambda device=None: mem.reset_peak(),
        "mem_get_info": lambda device=None: (mem.capacity - mem.collect(), mem.capacity),
        "memory_stats": memory_stats, "memory_summary": memory_summary, "empty_cache": lambda: None,
        "utilization": lambda device=None: 0,
        # the card's tensors draw from the host generator: seeding the NPU seeds it (torch.manual_seed calls
        # these too, after seeding it)
        "manual_seed": lambda seed: torch.random.default_generator.manual_seed(int(seed)) and None,
        "manual_seed_all": lambda seed: torch.random.default_generator.manual_seed(int(seed)) and None,
        "seed": lambda: None, "seed_all": lambda: None, "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "is_bf16_supported": lambda *a, **k: True, "get_amp_supported_dtype": lambda: [torch.float16, torch.bfloat16],
        "set_compile_mode": lambda jit_compile=False: None, "is_jit_compile_false": lambda: True,
        "config": _Config(allow_internal_format=False), "NPUGraph": standin.NPUGraph, "graph": standin._GraphCapture,
        "_is_in_bad_fork": lambda: False, "amp": build_amp(sim),
    }
    for k, v in values.items():
        setattr(npu, k, v)
    return npu


def dormant_npu() -> types.ModuleType:
    """What ``torch.npu`` is after a run, in the same process: no device. A run names torch's
    PrivateUse1 backend "npu" so that ``torch.device("npu:0")`` parses, and torch allows that once per
    process; from then on torch's own code asks ``torch.npu`` whether the device is there
    (``torch.accelerator``, the optimizers, ``torch.manual_seed``), and the answer is no."""
    m = types.ModuleType("torch.npu")
    m.__doc__ = dormant_npu.__doc__
    m.is_available = lambda: False
    m.device_count = lambda: 0
    m.is_initialized = lambda: False
    m._is_in_bad_fork = lambda: False
    m.is_current_stream_capturing = lambda: False
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
        setattr(m, name, lambda *a, **k: None)
    return m


def build_amp(sim) -> types.ModuleType:
    amp = _ns("torch_npu.npu.amp", "torch.npu.amp on the simulated card: autocast runs as torch's CPU autocast "
                                   "(fp16 by default, as torch_npu's), GradScaler as torch's")

    class autocast(torch.autocast):  # noqa: N801  (torch_npu's name)
        def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
            super().__init__("npu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class GradScaler(torch.amp.GradScaler):
        def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                     enabled=True, **kwargs):
            super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                             growth_interval=growth_interval, enabled=enabled)

    amp.autocast = autocast
    amp.GradScaler = GradScaler
    return amp


def autocast_init(sim):
    """``torch.autocast("npu")`` (and ``"cuda"`` under transfer_to_npu) as torch's CPU autocast, fp16
    by default (torch_npu's default)."""
    original = torch.amp.autocast_mode.autocast.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "npu" or (sim.cuda_is_npu and device_type == "cuda"):
            device_type, dtype = "cpu", dtype or torch.float16
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    return __init__


def tensor_npu(self, device=None, non_blocking=False, memory_format=None):
    """``Tensor.npu()``: a copy on the card (``self`` when it is there already)."""
    index = device if isinstance(device, int) else (torch.device(device).index if device is not None else None)
    kwargs = {"non_blocking": non_blocking}
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    return self.to(f"npu:{index or 0}", **kwargs)


def is_npu(self) -> bool:
    return self.device.type == "npu"


def module_npu(self, device=None):
    """``nn.Module.npu()``: every parameter and buffer to the card."""
    return self._apply(lambda t: t.npu(device))


def optimized_forward(sim):
    """``OptimizedModel.forward`` in a run: pypto_lab's runtime computes the outputs (unrecorded: it is
    the compiled model's own host computation) and the card runs the compiled graph (`graph_launch`)."""
    from ..compiler.optimize import OptimizedModel, being_traced

    original = OptimizedModel.forward

    def forward(self, *args, **kwargs):
        if being_traced(args, kwargs):
            return original(self, *args, **kwargs)
        with sim.quiet():
            out = original(self, *args, **kwargs)
        sim.graph_launch(self.report(), (args, kwargs), out)
        return out
    return forward


def eager_compile(sim):
    """``torch.compile`` in a run returns the model unchanged: its operators run eagerly on the card.
    The graph a compiler would build is not simulated here; a graph-mode stack
    (``--stack torchair-graph``) costs the same operators launched as a graph."""
    def compile(model=None, *args, backend="inductor", **kwargs):
        name = getattr(backend, "__name__", backend) if not isinstance(backend, str) else backend
        note = (f"torch.compile(backend={name!r}) ran its model eagerly on the card; --stack torchair-graph costs "
                "the same operators launched as a graph")
        if note not in sim.notes:
            sim.notes.append(note)
        return model if model is not None else (lambda m: m)
    return compile


def _to_card(obj):
    if isinstance(obj, torch.nn.Module):
        return obj.to("npu")
    return tree_map(lambda t: t.to("npu") if isinstance(t, torch.Tensor) else t, obj)


def torch_load(sim):
    """``torch.load(..., map_location="npu")``: loaded on the host, then copied to the card."""
    original = torch.load

    def load(f, map_location=None, *args, **kwargs):
        if map_location is not None and not callable(map_location) and not isinstance(map_location, dict) \
                and sim.is_npu_device(map_location):
            return _to_card(original(f, *args, map_location="cpu", **kwargs))
        return original(f, *args, map_location=map_location, **kwargs)
    return load


def jit_load(sim):
    original = torch.jit.load

    def load(f, map_location=None, _extra_files=None):
        if map_location is not None and sim.is_npu_device(map_location):
            return original(f, map_location="cpu", _extra_files=_extra_files).to("npu")
        return original(f, map_location=map_location, _extra_files=_extra_files)
    return load


# ---------------------------------------------------------------------------- torch_npu

def _format_cast(t, acl_format, *args, **kwargs):
    """``torch_npu.npu_format_cast``: to FRACTAL_NZ (29) a TransData on the card and an `NzTensor`
    (the values kept logical, `standin.NzTensor`); to ND (2) a plain tensor."""
    fmt = int(acl_format)
    if fmt == standin.NZ:
        if isinstance(t, standin.NzTensor):
            return t
        base = t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
        out = torch.ops.npu.npu_format_cast(base, fmt)
        return torch.Tensor._make_subclass(standin.NzTensor, out)
    if fmt == standin.ND:
        return t.as_subclass(torch.Tensor) if isinstance(t, standin.NzTensor) else t
    raise NotImplementedError(f"npu_format_cast to format {fmt} is not stood in (ND = 2 and FRACTAL_NZ = 29 are)")


def _grouped_matmul(x, weight, *, group_list=None, **kwargs):
    if group_list is not None and not isinstance(group_list, torch.Tensor):
        group_list = torch.tensor(list(group_list), dtype=torch.int64, device="npu")
    return torch.ops.npu.npu_grouped_matmul(list(x), list(weight), group_list=group_list, **kwargs)


def _ints(v):
    return None if v is None else [int(x) for x in (v.tolist() if isinstance(v, torch.Tensor) else v)]


def _fusion_attention(query, key, value, head_num, input_layout, *args, actual_seq_qlen=None, actual_seq_kvlen=None,
                      **kwargs):
    return torch.ops.npu.npu_fusion_attention(query, key, value, head_num, input_layout, *args,
                                              actual_seq_qlen=_ints(actual_seq_qlen),
                                              actual_seq_kvlen=_ints(actual_seq_kvlen), **kwargs)


def _fused_infer(query, key, value, *, actual_seq_lengths=None, actual_seq_lengths_kv=None, **kwargs):
    return torch.ops.npu.npu_fused_infer_attention_score(query, key, value, actual_seq_lengths=_ints(actual_seq_lengths),
                                                         actual_seq_lengths_kv=_ints(actual_seq_lengths_kv), **kwargs)


def _op(name):
    def call(*args, **kwargs):
        return getattr(torch.ops.npu, name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = (getattr(ops, name.removeprefix("npu_"), None).__doc__
                    if getattr(ops, name.removeprefix("npu_"), None) is not None else None)
    return call


def build_modules(sim) -> dict[str, types.ModuleType]:
    """Every module the run serves, by its import name."""
    from . import optim, profiler

    npu = build_npu(sim)
    tn = _ns("torch_npu", "torch_npu on the simulated card of pypto-lab run (pypto_lab.torch_npu_sim): the npu "
                          "device, torch.npu, the fused operators with their documented numerics, costed on the chip")
    tn.__version__ = _VERSION
    tn.__path__ = []
    tn.npu = npu
    for name in ops.SCHEMAS:
        if not name.endswith(("_backward", "_grad")) and name != "npu_format_cast":
            setattr(tn, name, _op(name))
    tn.npu_grouped_matmul = _grouped_matmul
    tn.npu_fusion_attention = _fusion_attention
    tn.npu_fused_infer_attention_score = _fused_infer
    tn.npu_format_cast = _format_cast
    tn.get_npu_format = standin.get_npu_format
    tn.NzTensor = standin.NzTensor
    tn.Format = types.SimpleNamespace(ND=standin.ND, NCHW=0, NHWC=1, NC1HWC0=3, FRACTAL_Z=4, FRACTAL_NZ=standin.NZ)
    contrib = _ns("torch_npu.contrib", "torch_npu.contrib (transfer_to_npu)")
    contrib.__path__ = []
    tn.contrib = contrib
    tn.profiler = profiler.build_module(sim)
    tn.optim = optim.build_module(sim)
    tn.utils = _ns("torch_npu.utils", "torch_npu.utils (not stood in)")
    modules = {"torch_npu": tn, "torch_npu.npu": npu, "torch_npu.npu.amp": npu.amp, "torch_npu.contrib": contrib,
               "torch_npu.profiler": tn.profiler, "torch_npu.optim": tn.optim}
    modules.update(standin._torchair_modules())
    return modules


# ---------------------------------------------------------------------------- transfer_to_npu

_CUDA_NAMES = ("is_available", "device_count", "current_device", "set_device", "synchronize", "Event", "Stream",
               "stream", "set_stream", "current_stream", "default_stream", "device", "memory_allocated",
               "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
               "reset_max_memory_allocated", "empty_cache", "mem_get_info", "memory_stats", "memory_summary",
               "get_device_name", "get_device_properties", "get_device_capability", "manual_seed", "manual_seed_all",
               "seed", "initial_seed", "get_rng_state", "set_rng_state", "is_bf16_supported")


def enable_transfer(sim) -> None:
    """What ``from torch_npu.contrib import transfer_to_npu`` does: ``torch.cuda.*`` is ``torch.npu.*``,
    ``.cuda()`` is ``.npu()``, a "cuda" device (also in ``torch.autocast``) is the NPU. (Its
    NCCL -> HCCL rewrite of ``init_process_group`` is not stood in: a run is one card; use
    ``pypto_lab.distributed.init_process_group(backend="hccl")``.)"""
    if sim.cuda_is_npu:
        return
    sim.cuda_is_npu = True
    npu = torch.npu
    for name in _CUDA_NAMES:
        sim._saved.append(("attr", torch.cuda, (name, getattr(torch.cuda, name, None))))
        setattr(torch.cuda, name, getattr(npu, name))
    sim._saved.append(("attr", torch.nn.Module, ("cuda", torch.nn.Module.__dict__["cuda"])))
    torch.nn.Module.cuda = module_npu
    sim.notes.append("transfer_to_npu: torch.cuda.*, .cuda() and 'cuda' devices mean the simulated NPU")
    print("[pypto-lab run] transfer_to_npu: torch.cuda.* is torch.npu.*, .cuda() is .npu(), 'cuda' devices are "
          "the simulated NPU")


class TransferFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``torch_npu.contrib.transfer_to_npu``: importing it turns CUDA code into NPU code."""

    NAME = "torch_npu.contrib.transfer_to_npu"

    def __init__(self, sim):
        self.sim = sim

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.NAME:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = enable_transfer.__doc__
        enable_transfer(self.sim)


__all__ = ["TransferFinder", "autocast_init", "build_amp", "build_modules", "build_npu", "enable_transfer",
           "jit_load", "module_npu", "torch_load"]
