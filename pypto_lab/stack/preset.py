"""Software stacks as data: how kernels reach the chip, loaded from a preset file (TOML) like the
chips and the server topologies.

A stack is what runs a workload's kernels: ATC's offline model run by ais_bench, torch_npu eager,
torchair graph mode, ACL graph capture as vLLM-Ascend uses it, MindIE, MindSpeed training. It
decides what a kernel costs beyond its time on the AI cores:

* ``dispatch_us``: host time to dispatch one kernel (eager frameworks: Python, ATen dispatch,
  aclnn's tiling, the task queue; 0 when a whole graph or model is sunk to the device);
* ``launch_us``: device-side time to launch one kernel on the AI cores (the task scheduler, the
  cores' initialisation, the completion report), paid by every stack;
* ``step_host_us``: host time once per step before its first kernel (a graph's replay launch, a
  model execution's head cost);
* ``host_device_overlap``: whether the host runs ahead of the device (an asynchronous task queue)
  or waits for each kernel;
* ``layer_host_us`` (optional, 0 when absent; graph stacks only): host time per attention layer of a
  step spent outside the captured graph, where the graph is cut at each attention layer (vLLM's
  PIECEWISE cudagraph mode: the attention, with its KV-cache write, runs eagerly between graph pieces
  and the next piece is replayed), charged on the host before that layer's attention
  (`timeline.Launch.graph_break`);
* ``ifa_overhead_us`` (optional, 0 when absent): device time per run of IncreFlashAttention over a
  preallocated KV cache beyond the chip model's kernel time (`KernelSpec.ifa_overhead`): a fitted
  constant of torchair's graph mode, whose origin is not identified (its preset says why it is not
  the AICPU tiling it was first taken for);
* ``host_op_us`` (optional, 0 when absent): host time of one operation the model's own code calls
  in an eager stack, whether it launches a kernel or not (a view, a reshape, a split, a no-op cast or
  ``contiguous()``, each a Python call and a pass through the dispatcher): charged per operation of
  the code's table (`pypto_lab.llm.forward.MODEL_CODE`) on top of the kernels' ``dispatch_us``, only
  when the caller says which code runs; a fitted constant of ``torch_npu-eager``;
* ``dynamic_shape_dispatch_us`` (optional, 0 when absent): host time per kernel when a graph stack
  runs a graph whose input shapes change every step (GE schedules a dynamic-shape graph from the
  host, operator by operator: InferShape, tiling, launch), with the host running ahead;
* ``fusions``: which fusions the stack's compiler or operator library applies (`FUSIONS`).

Collectives are launched by HCCL: their launch cost is the topology's (``launch_us`` of
`pypto_lab.hw.topology`), charged once in the collective's own time, never the stack's as well.

Every number of a shipped preset is ``key = { value = ..., source = "..." }`` (a test checks it).
Unknown keys, missing keys and impossible values raise `StackConfigError` naming the file, the
key, the value, the rule and a fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tomllib

from ..hw.preset_file import PresetFolder, PresetReader

STACK_DIR = Path(__file__).with_name("presets")
# the stack each front end assumes when none is given
DEFAULT_STACK = "atc-om"                    # optimize: an ATC-compiled offline model, as ais_bench runs it
DEFAULT_LLM_STACK = "vllm-ascend-aclgraph"  # simulate_generation / serve: vLLM-Ascend's default graph mode
DEFAULT_TRAIN_STACK = "torch_npu-eager"     # simulate_step on an nn.Module: eager torch_npu
DEFAULT_LLM_TRAIN_STACK = "mindspeed"       # simulate_step on a causal LM's config: MindSpeed-LLM

RUNS = ("offline-model", "graph", "eager")
# fusion name: what it does (the passes and front ends that honour it)
FUSIONS: dict[str, str] = {
    "conv_bn_relu": "BatchNorm folded into the convolution; bias, residual and activation in the Cube's epilogue",
    "layernorm": "a LayerNorm or RMSNorm as one kernel (its statistics in UB)",
    "add_layernorm": "the residual add in front of a norm inside its kernel",
    "parallel_matmuls": "matmuls reading the same input as one wider matmul (q, k, v; gate, up)",
    "rope": "a rotary position embedding as one kernel, queries and keys together",
    "swiglu": "silu(gate) * up as one kernel",
    "kv_cache": "a layer's key and value cache writes as one kernel",
    "sdpa_flash": "scaled_dot_product_attention as one FlashAttention kernel (no s x s scores in GM)",
    "attention_core": "attention written as matmul, softmax, matmul replaced by one FlashAttention kernel",
    "elementwise": "chains of element-wise and row-wise Vector operators as one kernel",
    "l2_optimize": "an operator's output stays in the chip's L2 for the operators that read it while it fits "
                   "(ATC --buffer_optimize=l2_optimize)",
    "l2_batch_split": "a batch whose activations overflow L2 runs in batch slices, one after another, each slice's "
                      "activations kept in L2 (ATC's L2 fusion with dynamic batch split; pypto_lab.compiler.batch_split)",
}


class StackConfigError(ValueError):
    """A stack preset or argument breaks a rule: the message names the rule, the value and a fix."""


@dataclass(frozen=True)
class Stack:
    """One software stack (see the module docstring for each field)."""

    name: str
    runs: str
    description: str
    dispatch_us: float
    launch_us: float
    step_host_us: float
    host_device_overlap: bool
    fusions: frozenset[str]
    ifa_overhead_us: float = 0.0
    layer_host_us: float = 0.0
    host_op_us: float = 0.0
    dynamic_shape_dispatch_us: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    path: str = field(default="", compare=False, repr=False)

    def __str__(self) -> str:
        return self.name

    def applies(self, fusion: str) -> bool:
        """Whether this stack applies ``fusion`` (a name of `FUSIONS`)."""
        if fusion not in FUSIONS:
            raise StackConfigError(f"fusion {fusion!r} is not known; fusions: {', '.join(FUSIONS)}")
        return fusion in self.fusions

    def with_values(self, **values: Any) -> Stack:
        """A copy with some values changed (``stack.with_values(launch_us=0.0)``), checked like a preset."""
        unknown = sorted(set(values) - set(_NUMBERS) - {"host_device_overlap", "fusions", "name", "description"})
        if unknown:
            raise StackConfigError(f"with_values: unknown field(s) {unknown}; fields: "
                                   f"{', '.join([*_NUMBERS, 'host_device_overlap', 'fusions'])}")
        for key in _NUMBERS:
            if key in values:
                v = values[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                    raise StackConfigError(f"{key} = {v!r}: a finite number of microseconds >= 0. Fix: e.g. "
                                           f"{key}=2.0")
                values[key] = float(v)
        if "fusions" in values:
            values["fusions"] = _check_fusions(values["fusions"], "with_values")
        if values.get("layer_host_us") and self.runs != "graph":
            raise StackConfigError(f"layer_host_us = {values['layer_host_us']!r}: host time per layer outside a captured "
                                   f"graph needs a graph stack; {self.name!r} runs {self.runs!r}. Fix: layer_host_us=0.0, "
                                   "or start from a graph stack (vllm-ascend-aclgraph)")
        name = values.pop("name", None) or f"{self.name} (changed: {', '.join(sorted(values))})"
        return dataclasses.replace(self, name=name, **values)

    def host_scheduled(self) -> Stack:
        """The stack running a graph whose shapes change every step: a graph stack with a
        ``dynamic_shape_dispatch_us`` dispatches each kernel from the host at that cost (the host
        running ahead of the device); any other stack is returned as it is."""
        if self.runs != "graph" or not self.dynamic_shape_dispatch_us:
            return self
        return dataclasses.replace(self, dispatch_us=self.dynamic_shape_dispatch_us)

    @property
    def fingerprint(self) -> str:
        """A hash of the values that change a figure (memo and cache keys)."""
        doc = {k: getattr(self, k) for k in (*_NUMBERS, "host_device_overlap")
               if k not in _FINGERPRINT_WHEN_SET or getattr(self, k)}
        doc["fusions"] = sorted(self.fusions)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "runs": self.runs, "dispatch_us": self.dispatch_us, "launch_us": self.launch_us,
                "step_host_us": self.step_host_us, "ifa_overhead_us": self.ifa_overhead_us,
                "layer_host_us": self.layer_host_us, "host_op_us": self.host_op_us,
                "dynamic_shape_dispatch_us": self.dynamic_shape_dispatch_us,
                "host_device_overlap": self.host_device_overlap,
                "fusions": sorted(self.fusions)}


_NUMBERS = ("dispatch_us", "launch_us", "step_host_us", "ifa_overhead_us", "layer_host_us", "host_op_us",
            "dynamic_shape_dispatch_us")
_SCHEMA = {"name": str, "runs": str, "description": str, "dispatch_us": float, "launch_us": float,
           "step_host_us": float, "host_device_overlap": bool, "fusions": list, "ifa_overhead_us": float,
           "layer_host_us": float, "host_op_us": float, "dynamic_shape_dispatch_us": float}
_OPTIONAL = ("ifa_overhead_us", "layer_host_us", "host_op_us", "dynamic_shape_dispatch_us")
_FINGERPRINT_WHEN_SET = ("host_op_us", "dynamic_shape_dispatch_us")   # keep older stacks' fingerprints


def _check_fusions(fusions: Any, where: str) -> frozenset[str]:
    if isinstance(fusions, str) or not all(isinstance(f, str) for f in fusions):
        raise StackConfigError(f"{where}: fusions = {fusions!r}: a list of fusion names ({', '.join(FUSIONS)})")
    unknown = sorted(set(fusions) - set(FUSIONS))
    if unknown:
        raise StackConfigError(f"{where}: fusions {unknown} are not known; use names of {', '.join(FUSIONS)}")
    return frozenset(fusions)


def load_stack(path: str | Path) -> Stack:
    """Load and validate a stack preset file."""
    path = Path(path)
    r = PresetReader(str(path), StackConfigError, f"see the shipped presets in {STACK_DIR}")
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise StackConfigError(f"{path}: not a valid TOML stack preset: {exc}; fix: compare with a shipped "
                               f"preset in {STACK_DIR}") from exc
    unknown = sorted(set(doc) - {"stack"})
    if unknown:
        raise r.fail(unknown[0], doc[unknown[0]], "unknown section", "use only [stack]")
    if "stack" not in doc:
        raise r.fail("stack", None, "missing section", "add a [stack] table")
    s = r.section("stack", doc["stack"], _SCHEMA, optional=_OPTIONAL)
    for key in _OPTIONAL:
        s.setdefault(key, 0.0)
    if s["runs"] not in RUNS:
        raise r.fail("stack.runs", s["runs"], "unknown way of running kernels", f"use one of {', '.join(RUNS)}")
    for key in _NUMBERS:
        r.positive(f"stack.{key}", s[key], allow_zero=True)
    if s["runs"] != "eager" and s["dispatch_us"]:
        raise r.fail("stack.dispatch_us", s["dispatch_us"], f"a stack that runs a {s['runs']} dispatches no kernel "
                     "from the host one by one", "set dispatch_us = 0, or runs = \"eager\"")
    if s["runs"] != "graph" and s["layer_host_us"]:
        raise r.fail("stack.layer_host_us", s["layer_host_us"], f"host time per layer outside a captured graph needs "
                     f"a graph to cut; a stack that runs {s['runs']!r} has none (an eager stack pays dispatch_us per "
                     "kernel instead)", "set layer_host_us = 0, or runs = \"graph\"")
    fusions = _check_fusions(s["fusions"], f"{path}: key 'stack.fusions'")
    return Stack(name=s["name"], runs=s["runs"], description=s["description"], dispatch_us=s["dispatch_us"],
                 launch_us=s["launch_us"], step_host_us=s["step_host_us"],
                 host_device_overlap=s["host_device_overlap"], fusions=fusions,
                 ifa_overhead_us=s["ifa_overhead_us"], layer_host_us=s["layer_host_us"], host_op_us=s["host_op_us"],
                 dynamic_shape_dispatch_us=s["dynamic_shape_dispatch_us"], sources=MappingProxyType(r.sources),
                 path=str(path))


_FOLDER = PresetFolder(STACK_DIR, lambda path: load_stack(path), StackConfigError, "stack")


def list_stacks() -> list[str]:
    """Names of the shipped stack presets."""
    return _FOLDER.names()


def get_stack(name_or_path: str | Path | Stack) -> Stack:
    """A shipped stack by name (``"torch_npu-eager"``), any stack file by path, or a `Stack` itself."""
    if isinstance(name_or_path, Stack):
        return name_or_path
    if not isinstance(name_or_path, (str, Path)):
        raise StackConfigError(f"stack = {name_or_path!r}: a preset name ({', '.join(list_stacks())}), the path of "
                               "a stack .toml, or a Stack")
    return _FOLDER.find(name_or_path)


__all__ = ["DEFAULT_LLM_STACK", "DEFAULT_LLM_TRAIN_STACK", "DEFAULT_STACK", "DEFAULT_TRAIN_STACK", "FUSIONS", "RUNS",
           "STACK_DIR", "Stack", "StackConfigError", "get_stack", "list_stacks", "load_stack"]
