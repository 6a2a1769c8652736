"""A tagged JSON encoding of the workbench's typed objects (graph nodes, kernel specs, costs,
schedules, memory plans, chips), for the OM artefact (`pypto_lab.deploy.om`). Never pickle.

Plain JSON values stay as they are. Everything else is an object with one ``"$"`` key naming
what it is:

* ``{"$": "dc", "cls": "pypto_lab.module:Class", "f": {field: value}}``: a dataclass;
* ``{"$": "nt", "cls": ..., "f": [values]}``: a NamedTuple;
* ``{"$": "tuple", "v": [...]}``, ``{"$": "proxy", "v": {...}}`` (a read-only mapping),
  ``{"$": "map", "v": [[key, value], ...]}`` (a dict whose keys are not all strings, or
  whose keys could be mistaken for a tag);
* ``{"$": "set" | "frozenset", "v": [...]}`` (sorted by their JSON text);
* ``{"$": "float", "v": "inf" | "-inf" | "nan"}``; ``{"$": "slice", "v": [start, stop, step]}``;
* ``{"$": "torch", "v": "float32"}`` (a torch dtype), ``{"$": "device", "v": "cpu"}``,
  ``{"$": "memory_format", "v": "contiguous_format"}``, ``{"$": "layout", "v": "strided"}``;
* ``{"$": "chip"}``: the artefact's chip (stored once, in the manifest);
* ``{"$": "timeline", ...}``: a simulator timeline's totals (its per-instruction rows are not
  stored; `Timeline` rows of a loaded report are empty);
* ``{"$": "callable", "v": "qualified name"}``: a function (a user operator's lowering); it
  decodes to None: the costs that used it are stored, it is not run again.

Decoding builds only classes of ``pypto_lab`` modules that are dataclasses or NamedTuples;
any other class name is refused (`CodecError`), so a file cannot make the loader run code.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import torch


class CodecError(ValueError):
    """A value the OM encoding cannot hold, or a stored value it refuses to build."""


_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                   "preserve_format": torch.preserve_format, "channels_last_3d": torch.channels_last_3d}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}


def _cls_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


class Encoder:
    """``encode(obj)`` -> JSON-able data. ``chip``: the artefact's chip, written as a reference."""

    def __init__(self, chip: Any = None):
        self.chip = chip

    def encode(self, obj: Any) -> Any:
        from ..hw.simulator import Timeline

        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, np.integer)):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            f = float(obj)
            return f if math.isfinite(f) else {"$": "float", "v": repr(f)}
        if self.chip is not None and (obj is self.chip or (type(obj) is type(self.chip) and obj == self.chip)):
            return {"$": "chip"}
        if isinstance(obj, torch.dtype):
            return {"$": "torch", "v": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.device):
            return {"$": "device", "v": str(obj)}
        if isinstance(obj, torch.memory_format):
            return {"$": "memory_format", "v": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.layout):
            return {"$": "layout", "v": str(obj).removeprefix("torch.")}
        if isinstance(obj, slice):
            return {"$": "slice", "v": [self.encode(obj.start), self.encode(obj.stop), self.encode(obj.step)]}
        if isinstance(obj, Timeline):
            return {"$": "timeline", "kinds": list(obj.kinds), "total_cycles": float(obj.total_cycles),
                    "busy": np.asarray(obj.busy, dtype=np.float64).tolist()}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: self.encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
            return {"$": "dc", "cls": _cls_name(obj), "f": fields}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return {"$": "nt", "cls": _cls_name(obj), "f": [self.encode(v) for v in obj]}
        if isinstance(obj, tuple):
            return {"$": "tuple", "v": [self.encode(v) for v in obj]}
        if isinstance(obj, list):
            return [self.encode(v) for v in obj]
        if isinstance(obj, (set, frozenset)):
            items = [self.encode(v) for v in obj]
            return {"$": "frozenset" if isinstance(obj, frozenset) else "set",
                    "v": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
        if isinstance(obj, MappingProxyType):
            return {"$": "proxy", "v": self.encode(dict(obj))}
        if isinstance(obj, Mapping):
            if all(isinstance(k, str) for k in obj) and "$" not in obj:
                return {k: self.encode(v) for k, v in obj.items()}
            return {"$": "map", "v": [[self.encode(k), self.encode(v)] for k, v in obj.items()]}
        if isinstance(obj, np.ndarray):
            return [self.encode(v) for v in obj.tolist()]
        if callable(obj):
            return {"$": "callable", "v": getattr(obj, "__qualname__", type(obj).__qualname__)}
        raise CodecError(f"cannot store a {type(obj).__module__}.{type(obj).__qualname__} ({obj!r:.80}) in an OM file")


def _safe_class(name: str) -> type:
    module, _, qual = name.partition(":")
    if not (module == "pypto_lab" or module.startswith("pypto_lab.")) or not qual:
        raise CodecError(f"the file names the class {name!r}: an OM file may only build pypto_lab's own data classes")
    try:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise CodecError(f"the file names the class {name!r}, which this pypto_lab does not have: it was written by "
                         "another version of pypto_lab; re-run pypto-lab atc") from exc
    is_nt = isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")
    if not isinstance(obj, type) or not (dataclasses.is_dataclass(obj) or is_nt):
        raise CodecError(f"the file names {name!r}, which is not a data class: refused")
    return obj


class Decoder:
    """``decode(data)`` -> the objects `Encoder` encoded. ``chip``: what ``{"$": "chip"}`` becomes."""

    def __init__(self, chip: Any = None):
        self.chip = chip

    def decode(self, data: Any) -> Any:
        if data is None or isinstance(data, (bool, int, float, str)):
            return data
        if isinstance(data, list):
            return [self.decode(v) for v in data]
        if not isinstance(data, dict):
            raise CodecError(f"unexpected JSON value {data!r:.80}")
        tag = data.get("$")
        if tag is None:
            return {k: self.decode(v) for k, v in data.items()}
        if tag == "dc":
            cls = _safe_class(data["cls"])
            kwargs = {k: self.decode(v) for k, v in data["f"].items()}
            return cls(**kwargs)
        if tag == "nt":
            return _safe_class(data["cls"])(*[self.decode(v) for v in data["f"]])
        if tag == "tuple":
            return tuple(self.decode(v) for v in data["v"])
        if tag in ("set", "frozenset"):
            items = [_hashable(self.decode(v)) for v in data["v"]]
            return frozenset(items) if tag == "frozenset" else set(items)
        if tag == "proxy":
            return MappingProxyType(self.decode(data["v"]))
        if tag == "map":
            return {_hashable(self.decode(k)): self.decode(v) for k, v in data["v"]}
        if tag == "float":
            return float(data["v"])
        if tag == "slice":
            return slice(*[self.decode(v) for v in data["v"]])
        if tag == "torch":
            dtype = getattr(torch, data["v"], None)
            if not isinstance(dtype, torch.dtype):
                raise CodecError(f"unknown torch dtype {data['v']!r}")
            return dtype
        if tag == "device":
            return torch.device(data["v"])
        if tag == "memory_format":
            return _MEMORY_FORMATS[data["v"]]
        if tag == "layout":
            return _LAYOUTS[data["v"]]
        if tag == "chip":
            if self.chip is None:
                raise CodecError("a chip reference with no chip in the manifest")
            return self.chip
        if tag == "timeline":
            from ..hw.simulator import Timeline

            empty = np.zeros(0)
            return Timeline(empty.astype(np.int32), empty.astype(np.int8), empty.astype(np.int32), empty, empty,
                            empty, data["kinds"], data["total_cycles"], np.asarray(data["busy"], dtype=np.float64))
        if tag == "callable":
            return None
        raise CodecError(f"unknown tag {tag!r} in the file")


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def encode(obj: Any, chip: Any = None) -> Any:
    return Encoder(chip).encode(obj)


def decode(data: Any, chip: Any = None) -> Any:
    return Decoder(chip).decode(data)


__all__ = ["CodecError", "Decoder", "Encoder", "decode", "encode"]
