"""torch_npu on a laptop: ``pypto-lab run SCRIPT`` runs an unmodified torch_npu script on the simulated
card (`runner`).

* `device` — the ``npu`` device: host tensors that report ``npu:0``; a TorchFunctionMode for the
  script's calls (devices, copies to and from the card, printing) and a TorchDispatchMode that
  records every ATen operator on the card, lowers it through the lowering table (`eager`), costs it
  on the chip and places it on the card's timeline (`card`: host clock, streams, events, HBM).
* `npu_api` — the modules a script imports: ``torch_npu``, ``torch.npu``, transfer_to_npu, torchair;
  `ops` — torch_npu's fused operators (``torch.ops.npu.*``) with their documented numerics;
  `profiler` — ``torch_npu.profiler``; `optim` — ``NpuFusedAdamW``.
* `report` — the end-of-run summary and the profiler's outputs (Chrome trace, kernel_details.csv).
* `standin` — the untimed CPU stand-in the CANN PyPTO model tests use (``scripts/npu_on_cpu.py``).

Nothing here is installed by importing it: ``import torch_npu`` outside a run is whatever it is
without pypto_lab (a real torch_npu, or ModuleNotFoundError).
"""

import importlib

_PUBLIC = {"DEFAULT_CHIP": "device", "DEFAULT_STACK": "device", "SimulatedNpu": "device", "active": "device",
           "main": "runner", "run_script": "runner"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """The public names, imported on first use (``standin`` alone stays light for the pto tests)."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
