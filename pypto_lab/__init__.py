"""pypto_lab: see, and measure, how a PyTorch model runs on a (simulated) Huawei Ascend NPU.

The public API. Every name below is loaded on first use, so ``import pypto_lab`` is quick and
the hardware-only names (`list_chips`, `simulate_matmul`, `get_chip`, ...) never import torch.

The package is laid out along the path a workload takes to its cost (docs/architecture.md):
``capture`` → ``lowering`` → ``passes`` → ``kernels`` (the kernel IR and its costers) → ``hw`` (the
chip model), with ``stack`` (how kernels reach the chip), ``analysis``, ``runtime`` and the front
ends (``compiler``, ``llm``, ``train``, ``deploy``, ``pto``) around it. The seed article's import
paths (``pypto_lab.amp``, ``pypto_lab.profiler``, ...) keep working: `_seed_paths`.
"""

from __future__ import annotations

import importlib

from . import _seed_paths

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_PUBLIC: dict[str, tuple[str, str | None]] = {
    # the chip model (no torch)
    "DEFAULT_CHIP": ("pypto_lab.hw.chip", "DEFAULT_CHIP"),
    "ChipConfigError": ("pypto_lab.hw.chip", "ChipConfigError"),
    "get_chip": ("pypto_lab.hw.chip", "get_chip"),
    "list_chips": ("pypto_lab.hw.chip", "list_chips"),
    "KernelReport": ("pypto_lab.hw.kernels", "KernelReport"),
    "simulate_matmul": ("pypto_lab.hw.kernels", "simulate_matmul"),
    "simulate_conv2d": ("pypto_lab.hw.kernels", "simulate_conv2d"),
    "simulate_vector": ("pypto_lab.hw.kernels", "simulate_vector"),
    "simulate_attention": ("pypto_lab.hw.attention", "simulate_attention"),
    "CubeTile": ("pypto_lab.hw.tiling", "CubeTile"),
    "VecTile": ("pypto_lab.hw.tiling", "VecTile"),
    "TilingError": ("pypto_lab.hw.tiling", "TilingError"),
    # software stacks (no torch)
    "DEFAULT_STACK": ("pypto_lab.stack", "DEFAULT_STACK"),
    "StackConfigError": ("pypto_lab.stack", "StackConfigError"),
    "get_stack": ("pypto_lab.stack", "get_stack"),
    "list_stacks": ("pypto_lab.stack", "list_stacks"),
    # capture and optimisation, as the seed article calls them
    "CaptureError": ("pypto_lab.capture", "CaptureError"),
    "Graph": ("pypto_lab.capture", "Graph"),
    "capture": ("pypto_lab.capture", None),  # the package is callable: pypto_lab.capture(model, inputs)
    "optimize": ("pypto_lab.session.optimize", "optimize"),
    "OptimizedModel": ("pypto_lab.compiler.optimize", "OptimizedModel"),
    "OptimizeError": ("pypto_lab.passes.options", "OptimizeError"),
    "get_optimization_options": ("pypto_lab.session.settings", "get_optimization_options"),
    "set_optimization_options": ("pypto_lab.session.settings", "set_optimization_options"),
    "enable_memory_pool": ("pypto_lab.session.memory", "enable_memory_pool"),
    "disable_memory_pool": ("pypto_lab.session.memory", "disable_memory_pool"),
    "get_memory_allocator": ("pypto_lab.session.memory", "get_memory_allocator"),
    "set_memory_allocator": ("pypto_lab.session.memory", "set_memory_allocator"),
    "custom_op": ("pypto_lab.lowering.custom_ops", "custom_op"),
    "CustomOpError": ("pypto_lab.lowering.custom_ops", "CustomOpError"),
    "Comparison": ("pypto_lab.runtime.compare", "Comparison"),
    "CompareError": ("pypto_lab.runtime.compare", "CompareError"),
    "compare_tensors": ("pypto_lab.runtime.compare", "compare_tensors"),
    "OMError": ("pypto_lab.deploy.om", "OMError"),
    "OMModel": ("pypto_lab.deploy.om", "OMModel"),
    "load_om": ("pypto_lab.deploy.om", "load_om"),
    # the seed article's modules (also importable as pypto_lab.amp, ...: see _seed_paths)
    "amp": ("pypto_lab.precision.amp", None),
    "quantization": ("pypto_lab.precision.quantization", None),
    "profiler": ("pypto_lab.tools.profiler", None),
    "tuning": ("pypto_lab.tools.tuning", None),
    "debug": ("pypto_lab.tools.debug", None),
    "nn": ("pypto_lab.models.nn", None),
    "memory": ("pypto_lab.session.memory", None),
    "custom_ops": ("pypto_lab.lowering.custom_ops", None),
    "data": ("pypto_lab.train.data", None),
    "distributed": ("pypto_lab.train.distributed", None),
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str):
    """A public name, or a sub-package (``pypto_lab.llm``), imported when first asked for."""
    target = _PUBLIC.get(name)
    if target is not None:
        module = importlib.import_module(target[0])
        value = module if target[1] is None else getattr(module, target[1])
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


_seed_paths.install()
