"""The ``npu`` device of ``pypto-lab run``: host tensors that report ``npu:0``, every operator on them
recorded eagerly, costed and laid on the simulated card's timeline (`card.Card`).

Two modes do it, entered for the whole run and only there:

* a ``TorchFunctionMode`` sees each torch call the script makes. A call that names the NPU as its
  device (``device="npu"``, ``"npu:0"``, ``torch.device("npu", 0)``, a bare id as torch_npu accepts;
  under ``transfer_to_npu`` also ``"cuda"``) runs on the host instead and its results are the card's;
  ``.to("npu")`` / ``.npu()`` copy a host tensor to the card (a host-to-card copy on the timeline),
  ``.cpu()`` / ``.to("cpu")`` / ``.item()`` / ``.tolist()`` / printing copy back (the host waits for
  the card); ``.numpy()`` of a card tensor raises as torch_npu does. It reports the device: a tensor
  the card holds says ``npu:0`` (``.device``, ``.is_npu``; ``.is_cpu`` is False) to the script, while
  torch's own code inside a call sees the host tensor it really is. A call mixing card tensors with
  host tensors of more than one element raises torch's "Expected all tensors to be on the same
  device" error, as on the card: a forgotten ``.npu()`` fails here as it would there.
* a ``TorchDispatchMode`` sees every ATen operator (the decomposition of each call, the backward
  pass, TorchScript). An operator on a card tensor runs on the host, its results are counted in the
  card's HBM, and it is lowered to its kernels through the lowering table and costed
  (`eager.EagerLowering`), then placed on the timeline under the software stack.

Which tensors the card holds is a property of their storage (`card.Memory`), so views, ``.data``
and parameters moved by ``model.npu()`` follow their storage. The operators are torch's own, run on
the host: the numerics are the host's (fp16 and bf16 as torch computes them on the CPU), the
time is the chip model's.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..compiler.optimize import OptimizedModel
from ..hw.chip import Chip, get_chip
from ..stack import Stack, get_stack
from . import ops, standin
from .card import Card
from .eager import EagerLowering, numel_bytes, op_name

DEFAULT_CHIP = "Ascend910B1"
DEFAULT_STACK = "torch_npu-eager"
CLOCK_READ_US = 0.1     # host time one read of time.perf_counter() costs the script
_NPU = re.compile(r"^npu(:\d+)?$")
_CUDA = re.compile(r"^cuda(:\d+)?$")
_DEVICE = torch._C.TensorBase.__dict__["device"]
_IS_CPU = torch._C.TensorBase.__dict__["is_cpu"]
_IS_CUDA = torch._C.TensorBase.__dict__["is_cuda"]
_T = torch.Tensor
_A = torch.ops.aten
# ATen ops that may read host tensors on the card: copies, and indexing with host indices
MIX_OK_ATEN = {_A.copy_.default, _A._to_copy.default, _A.index.Tensor, _A.index_put_.default, _A.index_put.default,
               _A._index_put_impl_.default, _A.set_.source_Storage_storage_offset, _A.set_.source_Tensor,
               _A.lift_fresh.default, _A.detach.default, _A.alias.default, _A.empty_like.default}
# calls whose ATen ops are autograd's (the backward pass, DDP's reducer): not checked for mixed devices
_NO_MIX_CHECK = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}

ACTIVE: list = []   # the installed SimulatedNpu (at most one)
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SIM = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CODE_IS_LAB: dict = {}
STOP_CODES: set = set()    # the frames a run starts from (the runner): the walk stops there


def _code_is_lab(code) -> bool:
    hit = _CODE_IS_LAB.get(code)
    if hit is None:
        fn = code.co_filename
        hit = _CODE_IS_LAB[code] = fn.startswith(_PKG) and not fn.startswith(_SIM)
    return hit


def inside_pypto_lab() -> bool:
    """Whether pypto_lab's own code (its compiler, runtime, profiler: not the simulated card) is on the
    stack below the script: then torch calls are that code's host computation, not the script's."""
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code in STOP_CODES:
            return False
        if _code_is_lab(code):
            return True
        f = f.f_back
    return False


def active():
    """The installed simulated card, or None outside ``pypto-lab run``."""
    return ACTIVE[-1] if ACTIVE else None


class SimulatedNpu:
    """The simulated card (see the module docstring): `install` it, run torch_npu code, `uninstall`."""

    def __init__(self, chip: str | Chip = DEFAULT_CHIP, stack: str | Stack = DEFAULT_STACK, wall_clock: bool = False):
        self.chip = chip if isinstance(chip, Chip) else get_chip(chip)
        self.stack = get_stack(stack)
        self.card = Card(self.chip, self.stack)
        self.lowering = EagerLowering(self.chip, self.stack)
        self.wall_clock = wall_clock
        self.depth = 0            # nesting of torch calls inside the function mode
        self.forced = False       # the current call runs on the card
        self.check_mix = False    # the current call is the script's: its ops must not mix card and host tensors
        self.suppress = 0         # > 0: operators run without being recorded (copies, printing)
        self.cuda_is_npu = False  # transfer_to_npu imported
        self.device_index = 0
        self.notes: list[str] = []
        self._saved: list = []
        self._modes: list = []
        self._t0 = self._t_wall = 0.0

    # ------------------------------------------------------------------ what the card holds
    def holds(self, t) -> bool:
        return isinstance(t, torch.Tensor) and self.card.memory.holds(t)

    def adopt(self, out, check: bool = True) -> None:
        """Count every tensor of ``out`` as the card's (their storages, once)."""
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.card.memory.add(t)

    def is_npu_device(self, dev) -> bool:
        if isinstance(dev, str):
            return bool(_NPU.match(dev)) or (self.cuda_is_npu and bool(_CUDA.match(dev)))
        if isinstance(dev, torch.device):
            return dev.type == "npu" or (self.cuda_is_npu and dev.type == "cuda")
        return isinstance(dev, int) and not isinstance(dev, bool)

    @contextlib.contextmanager
    def quiet(self):
        """Operators inside run unrecorded (a copy's own ATen calls, printing)."""
        self.suppress += 1
        try:
            yield
        finally:
            self.suppress -= 1

    @contextlib.contextmanager
    def off(self):
        """Both modes off (tracers and exporters: torch.onnx.export, torch.jit.trace, torch.export trace
        the host tensors underneath, as they would trace the card's)."""
        modes = list(self._modes)
        for m in reversed(modes):
            m.__exit__(None, None, None)
        try:
            yield
        finally:
            for m in modes:
                m.__enter__()

    def without_modes(self, fn):
        def call(*args, **kwargs):
            with self.off():
                return fn(*args, **kwargs)
        call.__wrapped__ = fn
        call.__doc__ = fn.__doc__
        return call

    # ------------------------------------------------------------------ recording
    def record(self, func, args, kwargs, out) -> None:
        name = op_name(str(func))
        shapes = tuple(tuple(t.shape) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        dtypes = tuple(str(t.dtype).removeprefix("torch.") for t in tree_leaves((args, kwargs))
                       if isinstance(t, torch.Tensor))
        for launch in self.lowering.launches(func, args, kwargs, out):
            if launch.host:
                self.card.host_op(name, launch.spec, launch.cost, shapes, dtypes)
            else:
                self.card.launch(name, launch.name, launch.op_type, launch.spec, launch.cost, shapes, dtypes)

    def graph_launch(self, report, inputs, out) -> None:
        """A run of a model `pypto_lab.optimize` compiled: its kernels as its report schedules them (its
        own software stack), launched as one graph after one dispatch; its outputs are the card's when
        its inputs were."""
        from ..tools.profiler import _op_of

        s = self.card.stream()
        host_start = self.card.host
        self.card.host += self.stack.dispatch_us
        base = max(s.free, self.card.host)
        sched = report.schedule
        if sched is not None and len(sched.kernels) == len(report.kernels):
            spans = [(k.start_us, k.end_us) for k in sched.kernels]
        else:
            spans, t = [], 0.0
            for k in report.kernels:
                spans.append((t, t + k.time_us))
                t += k.time_us
        model = report.model or "optimized_model"
        for i, (k, (a, b)) in enumerate(zip(report.kernels, spans)):   # one dispatch: the first kernel's
            self.card._add("kernel", f"optimized:{model}", k.name, _op_of(k.name), k.spec, k.cost, s.index,
                           host_start if i == 0 else self.card.host, self.card.host, base + a, base + b,
                           max(0.0, b - a - k.time_us), (), ())
        s.free = base + max(report.latency_us, max((b for _, b in spans), default=0.0))
        if any(self.holds(t) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)):
            self.adopt(out)

    def h2d(self, t: torch.Tensor, blocking: bool = True) -> None:
        self.card.memcpy("H2D", numel_bytes(t), blocking, (tuple(t.shape),), (str(t.dtype).removeprefix("torch."),))

    def d2h(self, t: torch.Tensor, nbytes: int | None = None) -> None:
        self.card.memcpy("D2H", numel_bytes(t) if nbytes is None else nbytes, True, (tuple(t.shape),),
                         (str(t.dtype).removeprefix("torch."),))

    # ------------------------------------------------------------------ the script's clock
    def clock(self) -> float:
        """Seconds on the simulated host clock (what time.perf_counter() returns in the run)."""
        self.card.tick(CLOCK_READ_US)
        return self._t0 + self.card.host / 1e6

    # ------------------------------------------------------------------ install / uninstall
    def install(self) -> SimulatedNpu:
        if ACTIVE:
            raise RuntimeError("a simulated NPU is already installed in this process")
        from . import npu_api

        ops.register()
        standin._name_backend_npu()
        modules = npu_api.build_modules(self)
        self._saved = []
        for name, module in modules.items():
            self._saved.append(("sysmod", name, sys.modules.get(name)))
            sys.modules[name] = module
        finder = npu_api.TransferFinder(self)
        sys.meta_path.insert(0, finder)
        self._saved.append(("meta_path", finder, None))
        patches = [(torch, "npu", modules["torch_npu.npu"]),
                   (torch.Tensor, "npu", npu_api.tensor_npu), (torch.Tensor, "is_npu", property(npu_api.is_npu)),
                   (torch.nn.Module, "npu", npu_api.module_npu),
                   (torch.amp.autocast_mode.autocast, "__init__", npu_api.autocast_init(self)),
                   (torch, "load", npu_api.torch_load(self)),
                   (torch.jit, "load", npu_api.jit_load(self))]
        patches += standin._library_patches()
        patches += [(OptimizedModel, "forward", npu_api.optimized_forward(self))]
        patches += [(torch, "compile", npu_api.eager_compile(self)),
                    (torch.onnx, "export", self.without_modes(torch.onnx.export)),
                    (torch.jit, "trace", self.without_modes(torch.jit.trace)),
                    (torch.export, "export", self.without_modes(torch.export.export))]
        if not self.wall_clock:
            self._t0, self._t_wall = time.perf_counter(), time.time()
            clock = self.clock

            def wall() -> float:
                return self._t_wall + clock() - self._t0
            patches += [(time, "perf_counter", clock), (time, "time", wall),
                        (time, "perf_counter_ns", lambda: int(clock() * 1e9)), (time, "time_ns", lambda: int(wall() * 1e9))]
        for owner, attr, value in patches:
            self._saved.append(("attr", owner, (attr, owner.__dict__.get(attr, _ABSENT) if isinstance(owner, type)
                                                else getattr(owner, attr, _ABSENT))))
            setattr(owner, attr, value)
        ACTIVE.append(self)
        self._modes = [_FunctionMode(self), _DispatchMode(self)]
        for m in self._modes:
            m.__enter__()
        return self

    def uninstall(self) -> None:
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        self._modes = []
        for what, owner, value in reversed(self._saved):
            if what == "sysmod":
                if value is None:
                    sys.modules.pop(owner, None)
                else:
                    sys.modules[owner] = value
            elif what == "meta_path":
                if owner in sys.meta_path:
                    sys.meta_path.remove(owner)
            else:
                attr, old = value
                if old is _ABSENT:
                    try:
                        delattr(owner, attr)
                    except AttributeError:
                        pass
                else:
                    setattr(owner, attr, old)
        for name in [n for n in sys.modules if n == "torch_npu" or n.startswith(("torch_npu.", "torchair"))]:
            if not any(w == "sysmod" and o == name and v is not None for w, o, v in self._saved):
                sys.modules.pop(name, None)      # submodules imported during the run (transfer_to_npu)
        if not hasattr(torch, "npu"):
            from .npu_api import dormant_npu
            torch.npu = dormant_npu()
        torch.get_device_module.cache_clear()
        self._saved = []
        if self in ACTIVE:
            ACTIVE.remove(self)

    def __enter__(self) -> SimulatedNpu:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()


_ABSENT = object()


# ---------------------------------------------------------------------------- the modes

def _tensors(args, kwargs) -> list[torch.Tensor]:
    return [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


def _parse_to(sim: SimulatedNpu, args: tuple, kwargs: dict):
    """(device: "npu" | "cpu" | None | "other", dtype, non_blocking, copy, memory_format) of a
    ``Tensor.to`` call's arguments (after self)."""
    dev = kwargs.get("device")
    dtype = kwargs.get("dtype")
    non_blocking = bool(kwargs.get("non_blocking", False))
    copy = bool(kwargs.get("copy", False))
    memory_format = kwargs.get("memory_format")
    rest = list(args)
    if rest and isinstance(rest[0], torch.Tensor):
        other = rest.pop(0)
        return ("npu" if sim.holds(other) else "cpu"), other.dtype, bool(rest and rest[0]) or non_blocking, copy, \
            memory_format
    if rest and (isinstance(rest[0], (str, torch.device)) or (isinstance(rest[0], int) and not isinstance(rest[0], bool))):
        dev = rest.pop(0)
    if rest and isinstance(rest[0], torch.dtype):
        dtype = rest.pop(0)
    if rest:
        non_blocking = bool(rest.pop(0))
    if rest:
        copy = bool(rest.pop(0))
    if dev is None:
        where = None
    elif sim.is_npu_device(dev):
        where = "npu"
    elif torch.device(dev).type == "cpu":
        where = "cpu"
    else:
        where = "other"
    return where, dtype, non_blocking, copy, memory_format


class _FunctionMode(TorchFunctionMode):
    def __init__(self, sim: SimulatedNpu):
        super().__init__()
        self.sim = sim
        self.reporting = 0     # > 0: the mode re-entered to print a card tensor

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        sim = self.sim
        owner = getattr(func, "__self__", None)
        if not self.reporting and inside_pypto_lab():
            with sim.quiet():
                return func(*args, **kwargs)
        if owner is _DEVICE:
            t = args[0]
            return torch.device("npu", sim.device_index) if sim.holds(t) else func(*args, **kwargs)
        if owner is _IS_CPU:
            return False if sim.holds(args[0]) else func(*args, **kwargs)
        if owner is _IS_CUDA:
            return (sim.cuda_is_npu and sim.holds(args[0])) or func(*args, **kwargs)
        if self.reporting:
            return func(*args, **kwargs)
        special = _SPECIAL.get(func)
        if special is not None and args and isinstance(args[0], torch.Tensor):
            done, out = special(self, func, args, kwargs)
            if done:
                return out
        return self.general(func, args, kwargs)

    def general(self, func, args, kwargs):
        """A torch call: on the card when it names the NPU or reads a card tensor (see the module
        docstring)."""
        sim = self.sim
        target_npu = False
        dev = kwargs.get("device")
        if dev is not None and sim.is_npu_device(dev):
            kwargs["device"] = "cpu"
            target_npu = True
        tensors = _tensors(args, kwargs)
        on_npu = target_npu or any(sim.holds(t) for t in tensors)
        prev, prev_check = sim.forced, sim.check_mix
        sim.forced = on_npu or prev
        # the script's own call (not autograd's backward, not torch's internals) must not mix devices
        sim.check_mix = sim.depth == 0 and func not in _NO_MIX_CHECK
        sim.depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            sim.depth -= 1
            sim.forced, sim.check_mix = prev, prev_check
        if on_npu and not sim.suppress:
            if target_npu:
                out = _no_host_alias(sim, out, tensors)
            sim.adopt(out)
        return out


def _fname(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)


def _no_host_alias(sim: SimulatedNpu, out, inputs: list[torch.Tensor]):
    """``torch.as_tensor(host_tensor, device="npu")`` ran as the host tensor itself: the card gets a copy."""
    host_keys = {t.untyped_storage()._cdata for t in inputs if not sim.holds(t)}
    if isinstance(out, torch.Tensor) and not sim.holds(out) and out.untyped_storage()._cdata in host_keys:
        with sim.quiet():
            copy = out.clone()
        sim.card.memory.add(copy)
        sim.h2d(copy)
        return copy
    return out


# ---- special calls: (mode, func, args, kwargs) -> (handled, result)

def _call(mode: _FunctionMode, func, args, kwargs, quiet: bool = True):
    sim = mode.sim
    sim.depth += 1
    try:
        if quiet:
            with sim.quiet():
                return func(*args, **kwargs)
        return func(*args, **kwargs)
    finally:
        sim.depth -= 1


def _to(mode, func, args, kwargs):
    sim = mode.sim
    t = args[0]
    where, dtype, non_blocking, copy, memory_format = _parse_to(sim, args[1:], kwargs)
    src = sim.holds(t)
    if where == "other" or where is None or (where == "npu") == src:
        kw = {k: v for k, v in (("dtype", dtype), ("copy", copy), ("memory_format", memory_format),
                                ("non_blocking", non_blocking)) if v is not None}
        if where == "other":
            return False, None       # e.g. .to("cuda") without transfer_to_npu: torch's own error
        return True, mode.general(_T.to, (t,), kw)
    kw = {k: v for k, v in (("dtype", dtype), ("memory_format", memory_format)) if v is not None}
    if where == "npu":                     # host -> card
        sim.card.memory.check(t.numel() * (dtype.itemsize if dtype is not None else t.element_size()))
        out = _call(mode, _T.to, (t, "cpu"), dict(kw, copy=True))
        sim.card.memory.add(out)
        sim.h2d(t, blocking=not non_blocking)
        return True, out
    sim.d2h(t)                             # card -> host
    return True, _call(mode, _T.to, (t, "cpu"), dict(kw, copy=True))


def _cpu(mode, func, args, kwargs):
    sim = mode.sim
    t = args[0]
    if not sim.holds(t):
        return False, None
    sim.d2h(t)
    return True, _call(mode, _T.to, (t, "cpu"), {"copy": True, **({"memory_format": kwargs["memory_format"]}
                                                                   if "memory_format" in kwargs else {})})


def _cuda(mode, func, args, kwargs):
    if not mode.sim.cuda_is_npu:
        return False, None
    t = args[0]
    dev = args[1] if len(args) > 1 else kwargs.get("device")
    return _to(mode, _T.to, (t, f"npu:{dev}" if isinstance(dev, int) else "npu"),
               {"non_blocking": kwargs.get("non_blocking", False)})


def _numpy(mode, func, args, kwargs):
    sim = mode.sim
    if sim.holds(args[0]):
        raise TypeError(f"can't convert npu:{sim.device_index} device type tensor to numpy. Use Tensor.cpu() to "
                        "copy the tensor to host memory first.")
    return False, None


def _to_host_value(mode, func, args, kwargs):
    """``.tolist()`` and friends: a copy to the host the host waits for, then the host's answer."""
    sim = mode.sim
    if not sim.holds(args[0]):
        return False, None
    sim.d2h(args[0])
    return True, _call(mode, func, args, kwargs)


def _print(mode, func, args, kwargs):
    """Printing a card tensor copies it to the host (what torch prints at most) and shows npu:0."""
    sim = mode.sim
    t = args[0]
    if not sim.holds(t):
        return False, None
    sim.d2h(t, min(numel_bytes(t), 1000 * t.element_size()))
    mode.reporting += 1
    try:
        with sim.quiet(), mode:      # torch's printing code, with the mode on to see npu:0 (not re-dispatched)
            return True, torch._tensor_str._str(t, tensor_contents=kwargs.get("tensor_contents"))
    finally:
        mode.reporting -= 1


def _copy_(mode, func, args, kwargs):
    sim = mode.sim
    dst, src = args[0], args[1]
    if not isinstance(src, torch.Tensor) or sim.holds(dst) == sim.holds(src) or src.dim() == 0:
        return False, None
    if sim.holds(dst):
        sim.h2d(src, blocking=not kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
    else:
        sim.d2h(src)
    return True, _call(mode, func, args, kwargs)


def _noop(mode, func, args, kwargs):
    return (True, None) if mode.sim.holds(args[0]) else (False, None)


def _pin(mode, func, args, kwargs):
    return True, args[0]


def _not_pinned(mode, func, args, kwargs):
    return True, False


_SPECIAL = {_T.to: _to, _T.cpu: _cpu, _T.cuda: _cuda, _T.numpy: _numpy, _T.__array__: _numpy,
            _T.tolist: _to_host_value, _T.__repr__: _print,
            _T.copy_: _copy_, _T.record_stream: _noop, _T.pin_memory: _pin, _T.is_pinned: _not_pinned}


class _DispatchMode(TorchDispatchMode):
    def __init__(self, sim: SimulatedNpu):
        super().__init__()
        self.sim = sim

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        sim = self.sim
        if sim.suppress:
            return func(*args, **kwargs)
        on_npu = sim.forced or any(sim.holds(t) for t in _tensors(args, kwargs))
        if not on_npu or inside_pypto_lab():
            return func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:     # .item(), bool(t), int(t): a copy the host waits for
            sim.d2h(args[0])
            return func(*args, **kwargs)
        if sim.check_mix and func not in MIX_OK_ATEN:
            host = [t for t in _tensors(args, kwargs) if t.dim() > 0 and not sim.holds(t)]
            if host:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"npu:{sim.device_index} and cpu! (aten::{str(func).split('.')[1]} on the simulated "
                                   "card: move the host tensor with .npu() or .to('npu'))")
        out = func(*args, **kwargs)
        sim.adopt(out)
        sim.record(func, args, kwargs, out)
        return out


__all__ = ["ACTIVE", "DEFAULT_CHIP", "DEFAULT_STACK", "SimulatedNpu", "active"]
