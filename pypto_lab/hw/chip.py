"""Chips as data: the frozen dataclasses a chip preset (TOML) is loaded into, and their loader.

A preset names every constant of the model together with its public source. The simulator
reads nothing but these objects, so a user can copy a preset, change one number and rerun.

Each constant in a preset is written either as a plain value or as
``key = { value = ..., source = "..." }``; the shipped presets use the second form everywhere
(a test checks it). Unknown keys, missing keys and impossible values raise `ChipConfigError`
naming the file, the key and the value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tomllib

from .energy import EnergyTable, read_energy_table
from .preset_file import PresetReader

# The chip every entry point uses when none is given: the Ascend 910B1 (Atlas 800T A2), the newest
# training chip with public figures. One constant, read by optimize, the LLM engine, training, the
# pto language, the widgets and the command line.
DEFAULT_CHIP = "Ascend910B1"

PRESET_DIR = Path(__file__).with_name("presets")

# Pipes of one AI Core, in the order the simulator numbers them.
PIPES = ("MTE1", "MTE2", "MTE3", "FIXP", "CUBE", "VECTOR", "SCALAR")
PIPE_INDEX = {name: i for i, name in enumerate(PIPES)}

BUFFER_NAMES = ("L1", "L0A", "L0B", "L0C", "UB", "BT", "FB")
CORE_VERSIONS = ("AIC-C-100", "AIC-C-220", "AIC-M-200")

DTYPE_BYTES = {
    "fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "int16": 2, "int32": 4, "int4": 0.5,
    "uint8": 1, "uint16": 2, "uint32": 4, "int64": 8, "uint64": 8,
}


class ChipConfigError(ValueError):
    """A chip preset is malformed: unknown key, missing key or impossible value."""


@dataclass(frozen=True)
class Buffer:
    """An on-chip buffer of one AI Core (L1, L0A, L0B, L0C, UB, BT, FB)."""

    name: str
    size_bytes: int
    align_bytes: int


@dataclass(frozen=True)
class DataPath:
    """One way data moves between memory levels, carried by one pipe.

    ``bytes_per_cycle`` is the steady-state rate of one core, ``startup_cycles`` the fixed cost
    every instruction pays before data flows: the pipe is busy ``startup + bytes / rate`` cycles.
    ``latency_cycles`` is the floor of one transfer's round trip (a GM access): its data is ready
    after ``max(latency, startup + bytes / rate)``, while the pipe may already issue the next one.
    """

    name: str
    src: str
    dst: str
    pipe: str
    bytes_per_cycle: float
    startup_cycles: float
    latency_cycles: float = 0.0

    def occupancy(self, nbytes: float, rate_cap: float | None = None) -> float:
        """Cycles the pipe is busy moving ``nbytes`` (at most ``rate_cap`` bytes per cycle)."""
        rate = self.bytes_per_cycle if rate_cap is None else min(self.bytes_per_cycle, rate_cap)
        return self.startup_cycles + nbytes / rate

    def cycles(self, nbytes: float, rate_cap: float | None = None) -> float:
        """Cycles until the data of one isolated transfer is ready."""
        return max(self.latency_cycles, self.occupancy(nbytes, rate_cap))


@dataclass(frozen=True)
class CubeUnit:
    """The Cube: one fractal per cycle; fractal shapes (m0, k0, n0) per input dtype."""

    startup_cycles: float
    fractals: Mapping[str, tuple[int, int, int]]
    accumulator: Mapping[str, str]

    def supports(self, dtype: str) -> bool:
        return dtype in self.fractals

    def macs_per_cycle(self, dtype: str) -> int:
        m0, k0, n0 = self.fractals[dtype]
        return m0 * k0 * n0


@dataclass(frozen=True)
class VectorTiming:
    """Cost of one vector instruction over ``repeats`` repeats of 256 B:
    ``max(min_cycles, startup_cycles + repeats * cycles_per_repeat)``, plus
    ``partial_block_cycles`` when its output ends inside a 32-B block (compare instructions write
    a 1-bit-per-element mask: ``block_repeats`` repeats fill one block; a partial block costs a
    read-modify-write)."""

    cycles_per_repeat: float
    startup_cycles: float
    min_cycles: float
    partial_block_cycles: float = 0.0
    block_repeats: int = 1

    def cycles(self, repeats: float) -> float:
        base = max(self.min_cycles, self.startup_cycles + repeats * self.cycles_per_repeat)
        return base + (self.partial_block_cycles if repeats % self.block_repeats else 0.0)


@dataclass(frozen=True)
class VectorUnit:
    """The Vector unit: 256 B per repeat, a timing per (instruction, dtypes)."""

    repeat_bytes: int
    max_repeats: int
    instructions: Mapping[str, Mapping[str, VectorTiming]]

    def timing(self, instr: str, dtypes: str) -> VectorTiming:
        table = self.instructions.get(instr)
        if table is None:
            known = ", ".join(sorted(self.instructions))
            raise KeyError(f"vector instruction {instr!r} is not in this chip's table; known: {known}")
        if dtypes in table:
            return table[dtypes]
        # fall back to the entry whose first operand dtype matches, then to any entry
        first = dtypes.split("_")[0] if dtypes else ""
        for key, value in table.items():
            if key.split("_")[0] == first:
                return value
        return next(iter(table.values()))


@dataclass(frozen=True)
class Chip:
    """One Ascend chip: cores, clocks, buffers, data paths, Cube and Vector units, memory system."""

    name: str
    core_version: str
    cube_cores: int
    vector_cores: int
    split_cores: bool
    clock_mhz: float
    hbm_gbps: float
    hbm_bytes: int
    l2_bytes: int
    l2_gbps: float
    buffers: Mapping[str, Buffer]
    paths: Mapping[str, DataPath]
    cube: CubeUnit
    vector: VectorUnit
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    path: str = field(default="", compare=False, repr=False)
    host_link_gbps: float = 0.0  # host<->device link, GB/s per direction (0: not given)
    # the share of HBM bandwidth lost when a kernel's DRAM traffic mixes reads and writes in equal
    # amounts (the bus turning between them); scaled by how mixed the traffic is (`hbm_stream_efficiency`)
    hbm_mixed_loss: float = 0.0
    # the [energy] table (`pypto_lab.hw.energy`); None for a preset without one. It changes no
    # timing, so it is not part of the fingerprint that keys timing caches.
    energy: EnergyTable | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return f"Chip({self.name!r}, {self.core_version}, {self.cube_cores} AIC, {self.clock_mhz:g} MHz{where})"

    @property
    def fingerprint(self) -> str:
        """A short hash of every timing constant of the chip (not the `energy` table): two chips with the same name but different
        numbers (a user's edited copy of a preset) have different fingerprints."""
        values = repr(tuple((f.name, getattr(self, f.name)) for f in fields(self) if f.compare))
        return hashlib.sha1(values.encode()).hexdigest()[:12]

    # ---- derived figures -------------------------------------------------------------
    @property
    def clock_hz(self) -> float:
        return self.clock_mhz * 1e6

    def peak_tflops(self, dtype: str = "fp16") -> float:
        """Cube peak in TFLOPS (int8: TOPS): cores x MACs/cycle x 2 x clock."""
        if not self.cube.supports(dtype):
            return 0.0
        return self.cube_cores * self.cube.macs_per_cycle(dtype) * 2 * self.clock_hz / 1e12

    def hbm_bytes_per_cycle(self) -> float:
        return self.hbm_gbps * 1e9 / self.clock_hz

    def hbm_stream_efficiency(self, reads: float, writes: float) -> float:
        """The share of ``hbm_gbps`` a kernel's DRAM traffic reaches when it reads ``reads`` and
        writes ``writes`` bytes: ``1 - hbm_mixed_loss * mix``, where ``mix = 2 min(r, w) / (r + w)``
        is 0 for a stream that only reads or only writes and 1 for equal reads and writes."""
        if self.hbm_mixed_loss <= 0 or reads <= 0 or writes <= 0:
            return 1.0
        return 1.0 - self.hbm_mixed_loss * 2 * min(reads, writes) / (reads + writes)

    def hbm_cycles(self, reads: float, writes: float) -> float:
        """Cycles for ``reads`` and ``writes`` bytes to cross HBM at the rate their mix reaches (a
        kernel's memory roof)."""
        return (reads + writes) / (self.hbm_bytes_per_cycle() * self.hbm_stream_efficiency(reads, writes))

    def l2_bytes_per_cycle(self) -> float:
        return self.l2_gbps * 1e9 / self.clock_hz

    def cycles_to_us(self, cycles: float) -> float:
        return cycles / self.clock_mhz

    def buffer(self, name: str) -> Buffer:
        try:
            return self.buffers[name]
        except KeyError:
            raise KeyError(f"{self.name} has no buffer {name!r}; it has {', '.join(self.buffers)}") from None

    def data_path(self, name: str) -> DataPath:
        try:
            return self.paths[name]
        except KeyError:
            raise KeyError(f"{self.name} has no data path {name!r}; it has {', '.join(self.paths)}") from None

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "core_version": self.core_version,
            "cube_cores": self.cube_cores,
            "vector_cores": self.vector_cores,
            "clock_mhz": self.clock_mhz,
            "peak_fp16_tflops": round(self.peak_tflops("fp16"), 1),
            "peak_int8_tops": round(self.peak_tflops("int8"), 1),
            "hbm_gbps": self.hbm_gbps,
            "l2_mb": self.l2_bytes / 2**20,
            "buffers_kb": {k: b.size_bytes / 1024 for k, b in self.buffers.items()},
        }


# ---- loading --------------------------------------------------------------------------

_CHIP_KEYS = {
    "name": str, "core_version": str, "cube_cores": int, "vector_cores": int,
    "split_cores": bool, "clock_mhz": float, "hbm_gbps": float, "hbm_bytes": int,
    "l2_bytes": int, "l2_gbps": float, "host_link_gbps": float, "hbm_mixed_loss": float,
}
_BUFFER_KEYS = {"size_bytes": int, "align_bytes": int}
_PATH_KEYS = {"src": str, "dst": str, "pipe": str, "bytes_per_cycle": float, "startup_cycles": float,
              "latency_cycles": float}
_CUBE_KEYS = {"startup_cycles": float, "fractals": dict, "accumulator": dict}
_VECTOR_KEYS = {"repeat_bytes": int, "max_repeats": int, "instructions": dict}
_TIMING_KEYS = {"cycles_per_repeat": float, "startup_cycles": float, "min_cycles": float,
                "partial_block_cycles": float, "block_repeats": int}
_TOP_KEYS = {"chip", "buffers", "paths", "cube", "vector", "calibration", "energy"}


def load_chip(path: str | Path) -> Chip:
    """Load and validate a chip preset file."""
    path = Path(path)
    return chip_from_document(read_preset_document(path), str(path), str(path))


def read_preset_document(path: str | Path) -> dict[str, Any]:
    """A preset file's TOML document, unvalidated (`chip_from_document` validates it)."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ChipConfigError(f"{path}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ChipConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
                              f"a preset is a UTF-8 TOML file. Fix: save it as UTF-8, starting from a copy of a "
                              f"shipped preset in {PRESET_DIR}") from None


def chip_from_document(doc: dict[str, Any], label: str, path: str = "") -> Chip:
    """Validate a preset's TOML document (as `load_chip` reads it) and build its `Chip`. ``label``
    names the document in error messages (a file, or a derived chip such as a sweep's variant)."""
    r = PresetReader(label, ChipConfigError, f"see the shipped presets in {PRESET_DIR}")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        k = sorted(unknown)[0]
        raise r.fail(k, doc[k], f"unknown section; allowed: {', '.join(sorted(_TOP_KEYS))}")
    for sec in ("chip", "buffers", "paths", "cube", "vector"):
        if sec not in doc:
            raise r.fail(sec, None, "missing section")

    c = r.section("chip", doc["chip"], _CHIP_KEYS, optional={"host_link_gbps", "hbm_mixed_loss"})
    if c["core_version"] not in CORE_VERSIONS:
        raise r.fail("chip.core_version", c["core_version"], f"must be one of {', '.join(CORE_VERSIONS)}")
    for key in ("cube_cores", "clock_mhz", "hbm_gbps", "hbm_bytes", "l2_bytes", "l2_gbps"):
        r.positive(f"chip.{key}", c[key])
    r.positive("chip.vector_cores", c["vector_cores"], allow_zero=True)
    r.positive("chip.host_link_gbps", c.get("host_link_gbps", 0.0), allow_zero=True)
    r.positive("chip.hbm_mixed_loss", c.get("hbm_mixed_loss", 0.0), allow_zero=True)
    if c.get("hbm_mixed_loss", 0.0) >= 1:
        raise r.fail("chip.hbm_mixed_loss", c["hbm_mixed_loss"],
                     "impossible value: a share of the HBM bandwidth, below 1 (0: reads and writes mix at no cost)")

    buffers = {}
    for name, table in doc["buffers"].items():
        if name not in BUFFER_NAMES:
            raise r.fail(f"buffers.{name}", table, f"unknown buffer; allowed: {', '.join(BUFFER_NAMES)}")
        b = r.section(f"buffers.{name}", table, _BUFFER_KEYS)
        r.positive(f"buffers.{name}.size_bytes", b["size_bytes"])
        r.positive(f"buffers.{name}.align_bytes", b["align_bytes"])
        buffers[name] = Buffer(name, b["size_bytes"], b["align_bytes"])
    for name in ("L1", "L0A", "L0B", "L0C", "UB"):
        if name not in buffers:
            raise r.fail(f"buffers.{name}", None, "missing buffer; every AI Core has L1, L0A, L0B, L0C, UB")

    paths = {}
    for name, table in doc["paths"].items():
        p = r.section(f"paths.{name}", table, _PATH_KEYS, optional={"latency_cycles"})
        if p["pipe"] not in PIPES:
            raise r.fail(f"paths.{name}.pipe", p["pipe"], f"unknown pipe; allowed: {', '.join(PIPES)}")
        r.positive(f"paths.{name}.bytes_per_cycle", p["bytes_per_cycle"])
        r.positive(f"paths.{name}.startup_cycles", p["startup_cycles"], allow_zero=True)
        r.positive(f"paths.{name}.latency_cycles", p.get("latency_cycles", 0.0), allow_zero=True)
        paths[name] = DataPath(name=name, **p)

    cu = r.section("cube", doc["cube"], _CUBE_KEYS)
    r.positive("cube.startup_cycles", cu["startup_cycles"], allow_zero=True)
    fractals = {}
    for dt, shape in cu["fractals"].items():
        shape = r.unwrap(f"cube.fractals.{dt}", shape)
        if dt not in DTYPE_BYTES:
            raise r.fail(f"cube.fractals.{dt}", shape, f"unknown dtype; allowed: {', '.join(DTYPE_BYTES)}")
        if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(v, int) and v > 0 for v in shape)):
            raise r.fail(f"cube.fractals.{dt}", shape, "impossible value: must be [m0, k0, n0] of positive integers")
        fractals[dt] = tuple(shape)
    if not fractals:
        raise r.fail("cube.fractals", {}, "missing value: the Cube needs at least one dtype")
    acc = {dt: str(r.unwrap(f"cube.accumulator.{dt}", v)) for dt, v in cu["accumulator"].items()}
    for dt in fractals:
        if dt not in acc:
            raise r.fail(f"cube.accumulator.{dt}", None, "missing key: every Cube dtype needs an accumulator dtype")

    ve = r.section("vector", doc["vector"], _VECTOR_KEYS)
    r.positive("vector.repeat_bytes", ve["repeat_bytes"])
    r.positive("vector.max_repeats", ve["max_repeats"])
    instructions = {}
    for instr, by_dtype in ve["instructions"].items():
        if not isinstance(by_dtype, dict):
            raise r.fail(f"vector.instructions.{instr}", by_dtype, "must be a table of dtypes")
        table = {}
        for dts, t in by_dtype.items():
            key = f"vector.instructions.{instr}.{dts}"
            tv = r.section(key, t, _TIMING_KEYS, optional={"partial_block_cycles", "block_repeats"})
            r.positive(f"{key}.cycles_per_repeat", tv["cycles_per_repeat"])
            r.positive(f"{key}.startup_cycles", tv["startup_cycles"], allow_zero=True)
            r.positive(f"{key}.min_cycles", tv["min_cycles"], allow_zero=True)
            r.positive(f"{key}.partial_block_cycles", tv.get("partial_block_cycles", 0.0), allow_zero=True)
            r.positive(f"{key}.block_repeats", tv.get("block_repeats", 1))
            table[dts] = VectorTiming(**tv)
        instructions[instr] = MappingProxyType(table)

    energy = read_energy_table(r, doc["energy"], fractals) if "energy" in doc else None

    return Chip(
        **c,
        buffers=MappingProxyType(buffers),
        paths=MappingProxyType(paths),
        cube=CubeUnit(cu["startup_cycles"], MappingProxyType(fractals), MappingProxyType(acc)),
        vector=VectorUnit(ve["repeat_bytes"], ve["max_repeats"], MappingProxyType(instructions)),
        sources=MappingProxyType(r.sources),
        path=path,
        energy=energy,
    )


def list_chips() -> list[str]:
    """Names of the shipped chip presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


_CACHE: dict[str, Chip] = {}


def get_chip(name_or_path: str | Path | Chip) -> Chip:
    """A shipped preset by name (``"Ascend910B1"``) or any preset file by path."""
    if isinstance(name_or_path, Chip):
        return name_or_path
    key = str(name_or_path)
    if key in _CACHE:
        return _CACHE[key]
    candidate = Path(key)
    if key in list_chips():
        chip = _CACHE[key] = load_chip(PRESET_DIR / f"{key}.toml")
    elif candidate.suffix == ".toml" or candidate.exists():
        if not candidate.exists():
            raise ChipConfigError(f"{key}: no such preset file")
        chip = load_chip(candidate)  # user files are read afresh every time: they may change
    else:
        raise ChipConfigError(
            f"unknown chip {key!r}; known chips: {', '.join(list_chips())} (or pass the path of a .toml preset)"
        )
    return chip
