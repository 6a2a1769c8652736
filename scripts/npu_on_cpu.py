"""A CPU stand-in for the NPU-only torch API, so a test of the real framework's ``models/`` runs in SIM.

Used by ``scripts/run_pypto_example.py --npu-on-cpu``. The model files of CANN PyPTO
(``models/glm_v4_5``, ``models/deepseek_v4``, ...) build their inputs with ``torch_npu`` on an
Ascend device, launch the kernel inside an NPU graph and compare with a torch golden. Here the
kernel runs on pypto_lab's simulated chip, whose inputs and outputs are CPU tensors, so the
stand-in makes the test's NPU calls mean "the CPU", and nothing else:

* ``import torch_npu`` gets a stub module; ``torch.npu`` (and ``torch_npu.npu``) is a namespace
  whose ``set_device`` / ``synchronize`` / ``current_device`` / ``device_count`` do nothing or
  report device 0, whose ``is_available()`` is True (the "NPU" a test asks for is the CPU) and
  whose ``config.allow_internal_format`` is a plain attribute. ``torch_npu.Format`` names ND and
  FRACTAL_NZ.
* ``device='npu'`` / ``'npu:N'`` / ``torch.device('npu', N)`` and, as with torch_npu, a bare integer
  device id (``device=0``, ``.to(0)``) passed to any torch function, ``.to(...)`` and ``.npu()`` mean
  the CPU (a ``TorchFunctionMode`` rewrites the device argument; the data are not touched). As
  torch_npu does, the stand-in names torch's PrivateUse1 backend ``npu``, so ``torch.device('npu:0')``
  parses.
* ``torch.library.impl(lib, name, "NPU")`` (and ``Library.impl(..., "NPU")``) registers the
  implementation for the CPU dispatch key: with torch_npu, the NPU key is where tensors on the NPU
  dispatch, and here the NPU's tensors are CPU tensors, so ``torch.ops.<ns>.<op>(...)`` reaches the
  same Python function the file registered.
  ``torch.rand`` with an integer dtype, which the NPU accepts and CPU torch refuses, gives zeros:
  the model tests use it only for output buffers the kernel overwrites.
* ``torch.topk(..., sorted=False)`` returns its k elements sorted (largest first). torch leaves
  their order unspecified, and CPU torch returns them in another order, but the model goldens
  compare ids position by position with the kernel's ``pypto.topk``, which sorts (MERGE_SORT), and
  pass on the NPU: there the unsorted order is the sorted one. The set of elements is unchanged.
* ``torch.npu.NPUGraph()`` + ``with torch.npu.graph(g): ...`` runs the captured code eagerly, once,
  and the first ``g.replay()`` does nothing. On the NPU, capture records the launches without
  running them and the replay runs them once: a test that captures and replays once sees each
  launch run exactly once either way, on the same input tensors, before it reads the outputs. A
  second ``replay()`` honestly runs again the pypto kernel launches recorded during capture (same
  kernel, same tensors); torch operations inside the captured block are not re-run, and the
  replay says so.
* **Storage formats.** ``torch_npu.npu_format_cast(t, 29)`` returns an `NzTensor`: the same values
  (torch ops see the logical shape, as they do on the NPU), tagged FRACTAL_NZ, whose ``device`` is
  ``npu:0`` as torch_npu's are, so the files' ``get_format(t) == 'NZ'`` checks (``device.type ==
  'npu'`` and ``get_npu_format(t) == 29``) see NZ. ``get_npu_format`` gives 29 for it and 2 (ND)
  for every other tensor; casting back to ND (2) gives a plain tensor. The bytes are kept in
  row-major order on the CPU: the conversion is a permutation of the same values, so the numerics
  are those of the logical tensor; what the conversion costs on the chip (a TransData, GM -> UB ->
  GM of every byte) is simulated on the pto kernels' chip and recorded in `FORMAT_CASTS` (the
  runner prints it). A pto kernel sees the format of its argument (`pypto_lab.pto.formats`) and,
  as the real frontend does, refuses an argument whose format differs from its annotation's.
* ``torch_npu.npu_quantize``, ``npu_quant_matmul``, ``npu_dynamic_quant`` and ``npu_swiglu``,
  which some goldens call, are computed on the CPU from their documented formulas
  (``round(x * scale + offset)`` saturated to int8; ``(x1 @ x2 + bias) * scale`` with an exact
  integer product; per-row symmetric int8 as the GLM files state it in their own
  ``ffn_golden_quan_per_token``: ``scale = 127 / max|x|``, ``y = round(x * scale)``, returned
  scale ``1 / scale``; ``silu(a) * b`` of the two halves of the last dimension). They are
  references written here, not the NPU's operators; they say so when first called.
* **The torch the files are written for.** The framework pins torch 2.8 (with torch_npu 2.8). torch
  2.14 changed the gradient of ``torch.clamp`` at its bounds from 1 to 0 (closed to open interval,
  pytorch/pytorch#195931); the QAT backward goldens clamp and differentiate exactly there. When the
  installed torch has the open interval, ``torch.clamp`` / ``clip`` with number bounds on a tensor
  that records a gradient is computed by `_ClampClosed`: the same values, the 2.8 gradient (1 for
  ``min <= x <= max``). Detected by behaviour at install, so a torch with the closed interval is
  left alone.
* ``torch.npu.empty_cache()`` does nothing (the CPU has no NPU caching allocator).
* ``import torchair``: ``torchair.get_npu_backend(compiler_config=...)`` is a ``torch.compile``
  backend that runs the captured graph as it is (on the NPU, torchair's "reduce-overhead" mode
  captures the graph and replays it: the same operators, run once per call), so a test's custom op
  (``torch.ops.pypto.<op>``, its NPU implementation a pto kernel) runs through dynamo as it would;
  ``torchair.configs.compiler_config.CompilerConfig`` takes any setting and records it.

Anything else of ``torch_npu`` or ``torch.npu`` raises ``AttributeError`` naming the call and
this module, so an unsupported call is never silently wrong.
"""

from __future__ import annotations

import re
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

ND, NZ = 2, 29  # ACL storage formats as torch_npu numbers them
_NPU_DEVICE = re.compile(r"^npu(:\d+)?$")


def _notice(msg: str) -> None:
    print(f"[npu-on-cpu] {msg}")


def _is_npu(dev) -> bool:
    """A device argument that means the NPU: 'npu', 'npu:N', torch.device('npu', N) or, as with
    torch_npu, a bare integer id (not a bool)."""
    if isinstance(dev, str):
        return bool(_NPU_DEVICE.match(dev))
    if isinstance(dev, torch.device):
        return dev.type == "npu"
    return isinstance(dev, int) and not isinstance(dev, bool)


def _name_backend_npu() -> None:
    """torch_npu names torch's PrivateUse1 backend ``npu`` so that ``torch.device('npu:0')`` parses;
    the stand-in does the same (once per process: torch allows one name)."""
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    if not hasattr(torch.Tensor, "is_npu"):   # what dynamo asks of a renamed backend's tensors
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=False,
                                                             for_storage=False)


class _Missing(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{self.__name__}.{name} is not stood in by scripts/npu_on_cpu.py "
                             "(NPU-only API the CPU stand-in does not cover)")


# ---------------------------------------------------------------------------- graphs

class NPUGraph:
    """``torch.npu.NPUGraph()``: the captured block runs eagerly; replays after the first re-launch
    the pypto kernels recorded during capture."""

    def __init__(self, *args, **kwargs):
        self.launches: list = []
        self.replays = 0

    def replay(self):
        self.replays += 1
        if self.replays == 1:
            return  # the captured launches already ran once, eagerly, during capture
        _notice(f"NPUGraph.replay() #{self.replays}: re-running the {len(self.launches)} pypto kernel "
                "launch(es) recorded during capture; torch operations of the captured block are not re-run")
        for kernel, args, kwargs in self.launches:
            kernel(*args, **kwargs)

    def reset(self):
        self.launches.clear()
        self.replays = 0


class _GraphCapture:
    """``with torch.npu.graph(g):`` records the pypto kernel launches while running them."""

    def __init__(self, graph: NPUGraph, *args, **kwargs):
        self.graph = graph
        self._saved = None

    def __enter__(self):
        from pypto_lab.pto.jit import JitKernel

        original = JitKernel.__call__
        graph, depth = self.graph, [0]

        def recording_call(kernel, *args, **kwargs):
            if depth[0] == 0:
                graph.launches.append((kernel, args, kwargs))
            depth[0] += 1
            try:
                return original(kernel, *args, **kwargs)
            finally:
                depth[0] -= 1

        self._saved = (JitKernel, original)
        JitKernel.__call__ = recording_call
        return self.graph

    def __exit__(self, *exc):
        cls, original = self._saved
        cls.__call__ = original
        return False


# ---------------------------------------------------------------------------- torch_npu operators

class NzTensor(torch.Tensor):
    """A tensor torch_npu would hold in FRACTAL_NZ: the logical values (shared with the tensor it was
    cast from), the NZ tag, and ``device`` ``npu:0``. Every torch operation on it sees a plain
    tensor and gives one (ND), as the NPU's operators do; in-place operations keep the tag."""

    npu_format = NZ

    @property
    def device(self):
        return torch.device("npu", 0)

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if isinstance(out, NzTensor) and not getattr(func, "__name__", "").endswith("_"):
            out = out.as_subclass(torch.Tensor)   # .contiguous(), .to(same) return self: an ND view
        return out

    def __repr__(self, *args, **kwargs):
        return f"NzTensor(FRACTAL_NZ, shape={tuple(self.shape)}, dtype={self.dtype})"


FORMAT_CASTS: list[dict] = []   # the TransData each cast to FRACTAL_NZ costs on the simulated chip


def _chip_name() -> str:
    from pypto_lab.pto import config
    from pypto_lab.pto.jit import DEFAULT_CHIP

    return config.STATE.section_options.get("runtime", {}).get("chip", DEFAULT_CHIP)


def _transdata_cost(tensor) -> dict:
    """A TransData ND -> FRACTAL_NZ of ``tensor`` on the chip the pto kernels run on: every byte
    GM -> UB -> GM (`pypto_lab.hw.kernels.simulate_vector` of a copy, as the kernel IR costs a
    TransData), in the tensor's dtype (int8 / fp16 / bf16 / fp32)."""
    from pypto_lab.hw.kernels import fuse_vector_ops, simulate_vector

    lab = {torch.int8: "int8", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
           torch.int32: "int32", torch.int16: "int16"}.get(tensor.dtype)
    numel = int(tensor.numel())
    if lab is None or numel == 0:
        return {"shape": list(tensor.shape), "dtype": str(tensor.dtype), "time_us": None,
                "note": "no Vector copy of this dtype in the chip model"}
    chip = _chip_name()
    r = simulate_vector(fuse_vector_ops(["copy"], 1), numel, dtype=lab, chip=chip,
                        name="TransData ND->FRACTAL_NZ")
    return {"shape": list(tensor.shape), "dtype": lab, "chip": chip, "time_us": float(r.time_us),
            "cycles": float(r.cycles), "gm_bytes": 2 * numel * tensor.element_size()}


def npu_format_cast(tensor, fmt, *args, **kwargs):
    """``torch_npu.npu_format_cast``: to FRACTAL_NZ (29) an `NzTensor` (the conversion costed), to
    ND (2) a plain tensor; other formats are not stood in."""
    fmt = int(fmt)
    if fmt == NZ:
        if isinstance(tensor, NzTensor):
            return tensor
        base = tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor
        cost = _transdata_cost(base)
        FORMAT_CASTS.append(cost)
        if cost.get("time_us") is not None:
            _notice(f"npu_format_cast(tensor{tuple(tensor.shape)} {cost['dtype']}, 29 = FRACTAL_NZ): an NzTensor; "
                    f"the TransData costs {cost['time_us']:.2f} us on {cost['chip']}")
        return torch.Tensor._make_subclass(NzTensor, base)
    if fmt == ND:
        return tensor.as_subclass(torch.Tensor) if isinstance(tensor, NzTensor) else tensor
    raise NotImplementedError(f"npu_on_cpu: npu_format_cast to format {fmt} is not stood in (ND = 2 and "
                              "FRACTAL_NZ = 29 are)")


def get_npu_format(tensor) -> int:
    return NZ if isinstance(tensor, NzTensor) else ND


_said: set[str] = set()


def _reference(name: str) -> None:
    if name not in _said:
        _said.add(name)
        _notice(f"torch_npu.{name}: computed on the CPU from its documented formula (a reference written "
                "in scripts/npu_on_cpu.py, not the NPU operator)")


def npu_quantize(input, scales, zero_points, dtype, axis=1, div_mode=True):
    """``round(x / scales + zero_points)`` (``div_mode``) or ``round(x * scales + zero_points)``,
    saturated to the output type; scales broadcast along ``axis``."""
    _reference("npu_quantize")
    out_dtype = {torch.qint8: torch.int8, torch.int8: torch.int8, torch.quint8: torch.uint8,
                 torch.uint8: torch.uint8}.get(dtype)
    if out_dtype is None:
        raise NotImplementedError(f"npu_on_cpu: npu_quantize to {dtype} is not stood in (int8 / uint8 only)")
    x = input.float()
    shape = [1] * x.dim()
    shape[axis] = -1
    s = scales.float().reshape(shape)
    y = x / s if div_mode else x * s
    if zero_points is not None:
        y = y + zero_points.float().reshape(shape)
    info = torch.iinfo(out_dtype)
    return torch.round(y).clamp(info.min, info.max).to(out_dtype)


def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None, **kwargs):
    """``(x1 @ x2 + bias) * scale [* pertoken_scale]`` with an exact integer product."""
    _reference("npu_quant_matmul")
    if offset is not None or kwargs:
        raise NotImplementedError("npu_on_cpu: npu_quant_matmul with offset or "
                                  f"{sorted(kwargs)} is not stood in")
    if scale.dtype == torch.int64:
        raise NotImplementedError("npu_on_cpu: npu_quant_matmul with a packed int64 scale is not stood in")
    acc = torch.matmul(x1.to(torch.float64), x2.to(torch.float64))  # exact: |sum| < 2**53
    if bias is not None:
        acc = acc + bias.to(torch.float64)
    y = acc.float() * scale.float()
    if pertoken_scale is not None:
        y = y * pertoken_scale.float().unsqueeze(-1)
    return y.to(output_dtype or torch.int8)


def npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, **kwargs):
    """Per-row symmetric int8, as the GLM files state their reference (``ffn_golden_quan_per_token``):
    ``scale = 127 / max|x|`` per row (fp32), ``y = round(x * scale)`` (half to even) saturated to
    int8; returns ``(y, 1 / scale)`` with the scale of shape ``x.shape[:-1]``."""
    _reference("npu_dynamic_quant")
    if smooth_scales is not None or group_index is not None or kwargs or dst_type not in (None, torch.int8):
        raise NotImplementedError("npu_on_cpu: npu_dynamic_quant with smooth_scales, group_index, another "
                                  "dst_type or further options is not stood in")
    x = input.float()
    scale = 127.0 / x.abs().amax(dim=-1, keepdim=True)
    y = torch.round(x * scale).clamp(-128, 127).to(torch.int8)
    return y, (1.0 / scale).squeeze(-1)


def npu_swiglu(input, dim=-1):
    """``silu(a) * b`` of the two halves ``a, b`` of ``dim``, computed in fp32 and returned in the
    input's dtype."""
    _reference("npu_swiglu")
    a, b = input.float().chunk(2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(input.dtype)


# ---------------------------------------------------------------------------- devices

class _ClampClosed(torch.autograd.Function):
    """``torch.clamp(x, min, max)`` with number bounds and torch 2.8's gradient: 1 where
    ``min <= x <= max`` (bounds included), else 0."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.save_for_backward(x)
        ctx.bounds = (lo, hi)
        return torch.clamp(x, lo, hi)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        lo, hi = ctx.bounds
        keep = torch.ones_like(x, dtype=torch.bool)
        if lo is not None:
            keep &= x >= lo
        if hi is not None:
            keep &= x <= hi
        return torch.where(keep, grad, torch.zeros_like(grad)), None, None


def _clamp_gradient_is_open() -> bool:
    """True when this torch gives ``clamp`` a zero gradient at its bounds (torch >= 2.14)."""
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    torch.clamp(x, 0.0, 1.0).sum().backward()
    return bool((x.grad == 0).all())


_CLAMPS = {torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip}


def _closed_clamp(func, args, kwargs):
    """The 2.8-gradient clamp for a call that needs it, else None."""
    if func not in _CLAMPS or not args or not torch.is_grad_enabled():
        return None
    x, rest = args[0], list(args[1:])
    lo = kwargs.get("min", rest[0] if rest else None)
    hi = kwargs.get("max", rest[1] if len(rest) > 1 else None)
    if not (isinstance(x, torch.Tensor) and x.requires_grad) or isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        return None
    return _ClampClosed.apply(x, lo, hi)


class _NpuMeansCpu(TorchFunctionMode):
    """Rewrites ``device='npu[:N]'`` / an integer id and ``.to('npu[:N]')`` / ``.to(N)`` to the CPU."""

    def __init__(self, closed_clamp: bool = False):
        super().__init__()
        self.closed_clamp = closed_clamp

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if self.closed_clamp:
            out = _closed_clamp(func, args, kwargs)
            if out is not None:
                return out
        if _is_npu(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if getattr(func, "__name__", "") == "to":
            args = args[:1] + tuple("cpu" if _is_npu(a) else a for a in args[1:])
        if func is torch.rand and kwargs.get("dtype") is not None and not kwargs["dtype"].is_floating_point:
            return torch.zeros(*args, **kwargs)
        if getattr(func, "__name__", "") == "topk" and kwargs.get("sorted") is False:
            kwargs["sorted"] = True  # unspecified order -> the sorted order the NPU gives
        impl = _npu_impl(func)
        if impl is not None:
            # a custom op whose NPU implementation a file registered (torch.ops.pypto.<op>): called as
            # the NPU dispatch key would, with this mode on for the torch calls it makes itself
            # (torch.empty(..., device=x.device) of an NPU tensor)
            with self:
                return impl(*args, **kwargs)
        return func(*args, **kwargs)


def _npu_impl(func):
    if not isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return None
    name = getattr(func, "_qualified_op_name", None) or getattr(getattr(func, "_schema", None), "name", None)
    return NPU_IMPLS.get(name) if name else None


def _npu_namespace() -> types.ModuleType:
    ns = _Missing("torch.npu")
    ns.set_device = lambda *a, **k: None
    ns.synchronize = lambda *a, **k: None
    ns.current_device = lambda: 0
    ns.is_available = lambda: True
    ns.device_count = lambda: 1
    ns.NPUGraph = NPUGraph
    ns.graph = _GraphCapture
    ns.config = types.SimpleNamespace(allow_internal_format=False)
    ns.empty_cache = lambda: None
    # what torch asks of the device module of a renamed PrivateUse1 backend (torch.manual_seed seeds
    # every device's generator): the stand-in's tensors draw from the CPU generator, already seeded
    ns._is_in_bad_fork = lambda: False
    ns.manual_seed_all = lambda seed: None
    ns.manual_seed = lambda seed: None
    return ns


_NPU_KEYS = ("NPU", "PrivateUse1")
NPU_IMPLS: dict = {}   # "ns::op" -> the Python function a file registered for the NPU key


def _cpu_key(key):
    return "CPU" if key in _NPU_KEYS else key


def _library_patches() -> list:
    """(owner, attribute, replacement): ``torch.library.impl`` and ``Library.impl`` with the NPU
    dispatch key mapped to CPU."""
    impl, lib_impl = torch.library.impl, torch.library.Library.impl

    def impl_npu(qualname, types_=None, func=None, *args, **kwargs):
        if isinstance(types_, str):
            types_ = _cpu_key(types_)
        elif isinstance(types_, (list, tuple)):
            types_ = type(types_)(_cpu_key(t) for t in types_)
        if "dispatch_key" in kwargs:
            kwargs["dispatch_key"] = _cpu_key(kwargs["dispatch_key"])
        if func is None and not args:
            return impl(qualname, types_, **kwargs)
        return impl(qualname, types_, func, *args, **kwargs)

    def lib_impl_npu(self, op_name, fn, dispatch_key="", *args, **kwargs):
        if dispatch_key in _NPU_KEYS and callable(fn):
            name = op_name if isinstance(op_name, str) else getattr(op_name, "__name__", str(op_name))
            NPU_IMPLS[f"{self.ns}::{name.split('::')[-1].split('.')[0]}"] = fn
        return lib_impl(self, op_name, fn, _cpu_key(dispatch_key), *args, **kwargs)

    # the renamed PrivateUse1 backend ("npu") has no device behind it: torch.accelerator must not
    # report one (dynamo would ask it for streams); the "NPU" of the stand-in is the CPU
    return [(torch.library, "impl", impl_npu), (torch.library.Library, "impl", lib_impl_npu),
            (torch.accelerator, "is_available", lambda: False), (torch, "compile", _compile_patch())]


class CompilerConfig:
    """``torchair.configs.compiler_config.CompilerConfig``: settings are recorded, not used."""

    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)


def get_npu_backend(compiler_config=None, *args, **kwargs):
    """A ``torch.compile`` backend running the captured FX graph as it is (once per call);
    ``torch.compile(model, backend=<this>)`` returns the model itself while the stand-in is
    installed (`_compile`): the graph torchair would capture and replay runs the same operators,
    once per call, and dynamo's fake-tensor tracing of the stand-in's NPU tensors is avoided."""
    def backend(gm, example_inputs):
        return gm.forward
    backend.__pto_torchair__ = True
    return backend


def _compile_patch():
    original = torch.compile

    def compile(model=None, *args, backend="inductor", **kwargs):
        if getattr(backend, "__pto_torchair__", False):
            return model if model is not None else (lambda m: m)
        if model is None:
            return original(*args, backend=backend, **kwargs)
        return original(model, *args, backend=backend, **kwargs)
    return compile


def _torchair_modules() -> dict:
    tng = types.ModuleType("torchair")
    tng.__doc__ = "CPU stand-in for torchair (scripts/npu_on_cpu.py)"
    tng.get_npu_backend = get_npu_backend
    configs = types.ModuleType("torchair.configs")
    cc = types.ModuleType("torchair.configs.compiler_config")
    cc.CompilerConfig = CompilerConfig
    configs.compiler_config = cc
    tng.configs = configs
    tng.CompilerConfig = CompilerConfig
    return {"torchair": tng, "torchair.configs": configs, "torchair.configs.compiler_config": cc}


class NpuOnCpu:
    """Installs the stand-in (``install()``) and takes it away again (``uninstall()``)."""

    def __init__(self):
        self._mode = None
        self._saved: list = []

    def install(self):
        npu = _npu_namespace()
        stub = _Missing("torch_npu")
        stub.__doc__ = "CPU stand-in for torch_npu (scripts/npu_on_cpu.py)"
        stub.npu = npu
        stub.npu_format_cast = npu_format_cast
        stub.get_npu_format = get_npu_format
        stub.npu_quantize = npu_quantize
        stub.npu_quant_matmul = npu_quant_matmul
        stub.npu_dynamic_quant = npu_dynamic_quant
        stub.npu_swiglu = npu_swiglu
        stub.NzTensor = NzTensor
        _name_backend_npu()
        stub.Format = types.SimpleNamespace(ND=ND, NCHW=0, FRACTAL_NZ=NZ)
        self._saved = [("module", sys.modules.get("torch_npu")),
                       ("torch.npu", getattr(torch, "npu", None)),
                       ("Tensor.npu", getattr(torch.Tensor, "npu", None))]
        sys.modules["torch_npu"] = stub
        for name, module in {**_torchair_modules(), "torch.npu": npu, "torch_npu.npu": npu}.items():
            self._saved.append(("sysmod", (name, sys.modules.get(name))))
            sys.modules[name] = module
        for owner, attr, fn in _library_patches():
            self._saved.append(("attr", (owner, attr, getattr(owner, attr))))
            setattr(owner, attr, fn)
        torch.npu = npu
        torch.Tensor.npu = lambda self, *a, **k: self
        self._mode = _NpuMeansCpu(closed_clamp=_clamp_gradient_is_open())
        self._mode.__enter__()
        return self

    def uninstall(self):
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for what, value in self._saved:
            if what == "module":
                if value is None:
                    sys.modules.pop("torch_npu", None)
                else:
                    sys.modules["torch_npu"] = value
            elif what == "attr":
                setattr(*value)
            elif what == "sysmod":
                if value[1] is None:
                    sys.modules.pop(value[0], None)
                else:
                    sys.modules[value[0]] = value[1]
            elif what == "torch.npu":
                if value is None:
                    delattr(torch, "npu")
                else:
                    torch.npu = value
            elif value is None:
                delattr(torch.Tensor, "npu")
            else:
                torch.Tensor.npu = value
        self._saved = []
