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
* ``device='npu'`` / ``'npu:N'`` passed to any torch function, ``.to('npu:N')`` and ``.npu()``
  mean the CPU (a ``TorchFunctionMode`` rewrites the device argument; the data are not touched).
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
* ``torch_npu.npu_format_cast(t, fmt)`` returns ``t`` unchanged (row-major, ND) and
  ``get_npu_format`` reports 2 (ND). A cast to FRACTAL_NZ (29) prints that the tensor stays ND: a
  check that requires an NZ tensor fails, and it should, since the kernel here reads ND.
* ``torch_npu.npu_quantize`` and ``torch_npu.npu_quant_matmul``, which some goldens call, are
  computed on the CPU from their documented formulas (``round(x * scale + offset)`` saturated to
  int8; ``(x1 @ x2 + bias) * scale`` with an exact integer product). They are references written
  here, not the NPU's operators; they say so when first called.

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
    return isinstance(dev, str) and bool(_NPU_DEVICE.match(dev))


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

def npu_format_cast(tensor, fmt, *args, **kwargs):
    if fmt == NZ:
        _notice(f"npu_format_cast(tensor{tuple(tensor.shape)}, 29 = FRACTAL_NZ): the CPU stand-in keeps it "
                "ND (row-major); get_npu_format reports ND, so a check that requires NZ fails")
    elif fmt != ND:
        _notice(f"npu_format_cast(tensor, {fmt}): kept ND on the CPU")
    return tensor


def get_npu_format(tensor) -> int:
    return ND


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


# ---------------------------------------------------------------------------- devices

class _NpuMeansCpu(TorchFunctionMode):
    """Rewrites ``device='npu[:N]'`` and ``.to('npu[:N]')`` to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_npu(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if getattr(func, "__name__", "") == "to":
            args = tuple("cpu" if _is_npu(a) else a for a in args)
        if func is torch.rand and kwargs.get("dtype") is not None and not kwargs["dtype"].is_floating_point:
            return torch.zeros(*args, **kwargs)
        if getattr(func, "__name__", "") == "topk" and kwargs.get("sorted") is False:
            kwargs["sorted"] = True  # unspecified order -> the sorted order the NPU gives
        return func(*args, **kwargs)


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
    return ns


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
        stub.Format = types.SimpleNamespace(ND=ND, NCHW=0, FRACTAL_NZ=NZ)
        self._saved = [("module", sys.modules.get("torch_npu")),
                       ("torch.npu", getattr(torch, "npu", None)),
                       ("Tensor.npu", getattr(torch.Tensor, "npu", None))]
        sys.modules["torch_npu"] = stub
        torch.npu = npu
        torch.Tensor.npu = lambda self, *a, **k: self
        self._mode = _NpuMeansCpu()
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
