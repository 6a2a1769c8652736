"""The energy model: what one inference costs in joules on a chip preset, kernel by kernel, and so
its average power and TOPS/W (`Report.energy_mj`, `avg_power_w`, `tops_per_w`).

Energy of a model = sum over its kernels of

    MACs x pJ per MAC (of the kernel's dtype)
  + vector element-ops x pJ per op (of its dtype)
  + bytes at each memory level x pJ per byte of that level (DRAM: HBM or LPDDR; L2; L1; L0; UB)

plus the static power times the latency. Every constant is in the preset's ``[energy]`` table with
its source: arithmetic and SRAM figures are Horowitz's 45 nm ones (ISSCC 2014), scaled to the
chip's process by one stated factor; DRAM figures are the memory's own; the TDP is the card's
published figure; static power is a stated assumption. Nothing is fitted to a measurement.

What the model counts (`kernel_traffic`), per kernel report of the simulator:

* DRAM bytes: the kernel's first touches (``min_gm_bytes``, less what L2 kept between operators,
  ``l2_kept_bytes``) plus its re-reads that miss L2
  (hit rate ``min(1, L2 size / first-touch bytes)``, as the timing model's `gm_rates` assumes).
* L2 bytes: every byte the cores move to or from GM (``gm_bytes``): GM traffic goes through L2.
* L1 bytes (Cube kernels): the A and B panels written into L1 and read out of it into L0A/L0B,
  from the kernel's shape and tiling (the same counting as the GM bytes in `simulate_matmul`).
* L0 bytes (Cube kernels): the L1 -> L0A/L0B loads, the Cube's operand reads (one A fractal and
  one B fractal per fractal MMAD), and the L0C accumulator read and written once per ``k_l0`` step.
* UB bytes: vector kernels' loads and stores (each byte lands in UB or leaves it once), and each
  vector element-op's two operand reads and one result write; a Cube kernel's epilogue through UB.

It does not count clock tree, control, instruction fetch or the on-chip network, so it is a lower
bound on the card's power; the static term covers some of it by assumption.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .chip import Chip
    from .kernels import KernelReport

LEVELS = ("DRAM", "L2", "L1", "L0", "UB")          # memory levels, outermost first
SRAM_LEVELS = ("L2", "L1", "L0", "UB")             # the on-chip ones (scaled from 45 nm)
OP_DTYPES = ("fp16", "bf16", "fp32", "int8", "int16", "int32")  # = hw.kernels.VECTOR_DTYPES

_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "int16": 2, "int32": 4, "int4": 0.5,
          "uint8": 1, "uint16": 2, "uint32": 4, "int64": 8, "uint64": 8}


class EnergyModelError(ValueError):
    """The energy model cannot answer: the chip has no ``[energy]`` table."""


@dataclass(frozen=True)
class EnergyTable:
    """A chip's energy constants (the preset's ``[energy]`` table).

    ``mac_pj_45nm`` / ``op_pj_45nm`` / ``sram_pj_per_byte_45nm`` are 45 nm figures; multiplied by
    ``node_scale`` they are this chip's. ``dram_pj_per_byte`` is the chip's DRAM (not scaled)."""

    tdp_w: float
    static_w: float
    node_scale: float
    dram_pj_per_byte: float
    mac_pj_45nm: Mapping[str, float]
    op_pj_45nm: Mapping[str, float]
    sram_pj_per_byte_45nm: Mapping[str, float]

    def mac_pj(self, dtype: str) -> float:
        """pJ of one Cube MAC in ``dtype`` on this chip (a dtype without an entry: the dearest one)."""
        return self.mac_pj_45nm.get(dtype, max(self.mac_pj_45nm.values())) * self.node_scale

    def op_pj(self, dtype: str) -> float:
        """pJ of one vector element-op in ``dtype`` (a dtype without an entry: the dearest one)."""
        return self.op_pj_45nm.get(dtype, max(self.op_pj_45nm.values())) * self.node_scale

    def pj_per_byte(self, level: str) -> float:
        """pJ per byte read or written at ``level`` (one of `LEVELS`)."""
        if level == "DRAM":
            return self.dram_pj_per_byte
        return self.sram_pj_per_byte_45nm[level] * self.node_scale


# ---- reading the [energy] table of a preset ---------------------------------------------------

_SCALAR_KEYS = {"tdp_w": float, "static_w": float, "node_scale": float, "dram_pj_per_byte": float,
                "mac_pj_45nm": dict, "op_pj_45nm": dict, "sram_pj_per_byte_45nm": dict}


def read_energy_table(r, table: Any, cube_dtypes) -> EnergyTable:
    """The ``[energy]`` table of a preset, checked (``r`` is the file's `PresetReader`): every
    constant present, a finite number > 0 (static power >= 0 and below the TDP), a pJ per MAC for
    every Cube dtype, a pJ per op for every vector dtype, a pJ per byte for every on-chip level."""
    e = r.section("energy", table, _SCALAR_KEYS)
    fix = "copy the [energy] table of a shipped preset (pypto_lab/hw/presets) and keep each value's source"
    for key in ("tdp_w", "node_scale", "dram_pj_per_byte"):
        _positive(r, f"energy.{key}", e[key], fix)
    _positive(r, "energy.static_w", e["static_w"], fix, allow_zero=True)
    if e["static_w"] >= e["tdp_w"]:
        raise r.fail("energy.static_w", e["static_w"],
                     f"impossible value: static power must be below the card TDP (energy.tdp_w = {e['tdp_w']:g} W)",
                     "use a fraction of the TDP and say where it comes from in its source")
    if e["node_scale"] > 1.0:
        raise r.fail("energy.node_scale", e["node_scale"],
                     "impossible value: the 45 nm -> chip process factor must be in (0, 1] (Ascend chips are "
                     "made in a finer process than 45 nm)", "use e.g. 7/45 for a 7 nm chip")

    def per_key(name: str, required, what: str) -> dict[str, float]:
        out = {}
        for key, raw in e[name].items():
            full = f"energy.{name}.{key}"
            value = r.check_type(full, r.unwrap(full, raw), float)
            _positive(r, full, value, fix)
            out[key] = value
        for key in required:
            if key not in out:
                raise r.fail(f"energy.{name}.{key}", None, f"missing key: {what}", f"add it ({fix})")
        return out

    macs = per_key("mac_pj_45nm", sorted(cube_dtypes), "every Cube dtype needs its energy per MAC")
    ops = per_key("op_pj_45nm", OP_DTYPES, "every vector dtype needs its energy per element-op")
    sram = per_key("sram_pj_per_byte_45nm", SRAM_LEVELS, "every on-chip memory level needs its energy per byte")
    unknown = sorted(set(sram) - set(SRAM_LEVELS))
    if unknown:
        raise r.fail(f"energy.sram_pj_per_byte_45nm.{unknown[0]}", sram[unknown[0]], "unknown level",
                     f"use only {', '.join(SRAM_LEVELS)}")
    return EnergyTable(e["tdp_w"], e["static_w"], e["node_scale"], e["dram_pj_per_byte"],
                       MappingProxyType(macs), MappingProxyType(ops), MappingProxyType(sram))


def _positive(r, key: str, value: float, fix: str, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero) or not math.isfinite(value):
        rule = "an energy or power must be >= 0" if allow_zero else "an energy or power must be > 0"
        raise r.fail(key, value, f"impossible value: {rule}", fix)


# ---- per-kernel counts ----------------------------------------------------------------------

@dataclass(frozen=True)
class KernelTraffic:
    """What one kernel report does, as the energy model counts it."""

    name: str
    dtype: str
    macs: float
    vector_ops: float
    bytes: Mapping[str, float]   # by level (`LEVELS`)


def kernel_traffic(r: KernelReport) -> KernelTraffic:
    """MACs, vector element-ops and bytes at each memory level of one simulated kernel."""
    chip = r.chip
    eb = _BYTES.get(r.dtype, 2)
    shape = r.shape
    levels = dict.fromkeys(LEVELS, 0.0)
    # GM: every core-side byte goes through L2; DRAM sees the first touches and the L2 misses
    first = min(r.min_gm_bytes, r.gm_bytes)
    hit = min(1.0, chip.l2_bytes / first) if first > 0 else 1.0
    levels["L2"] = r.gm_bytes
    levels["DRAM"] = max(0.0, first - getattr(r, "l2_kept_bytes", 0.0)) + (r.gm_bytes - first) * (1.0 - hit)
    macs = ops = 0.0
    if r.unit == "cube":
        frac = chip.cube.fractals.get(r.dtype, (16, 16, 16))
        m0, k0, n0 = frac
        acc_b = _BYTES.get(chip.cube.accumulator.get(r.dtype, "fp32"), 4)
        if {"m", "k", "n"} <= set(shape) and {"m_l0", "n_l0", "k_l0", "m_l1", "n_l1", "k_l1"} <= set(r.tile):
            m, k, n, b = shape["m"], shape["k"], shape["n"], shape.get("batch", 1)
            t = r.tile
            macs = float(b * m * k * n)
            l0_fill = b * k * eb * (m * math.ceil(n / t["n_l0"]) + n * math.ceil(m / t["m_l0"]))
            if math.ceil(k / t["k_l1"]) > 1:  # each L0 sub-tile streams its own panels through L1
                l1_fill = l0_fill
            else:
                l1_fill = b * k * eb * (m * math.ceil(n / t["n_l1"]) + n * math.ceil(m / t["m_l1"]))
            out = b * m * n
            acc_steps = math.ceil(k / t["k_l0"])
            levels["L1"] = l1_fill + l0_fill
            levels["L0"] = l0_fill + macs * eb * (1 / n0 + 1 / m0) + out * acc_b * (2 * acc_steps + 1)
            through_ub = (not chip.split_cores) or (r.epilogue is not None and r.epilogue.on_vector)
            if through_ub:  # L0C -> UB -> GM: the epilogue's one pass over C in UB
                ops = float(out)
                levels["UB"] = 2.0 * out * acc_b
        else:
            # attention (Q K^T and P V per head) or a kernel without a Cube tiling: the Cube's
            # operand reads per fractal, every GM byte through L1 and L0 once; the rest is vector work
            if {"batch_heads", "s_q", "s_k", "d"} <= set(shape):
                macs = 2.0 * shape["batch_heads"] * shape["s_q"] * shape["s_k"] * shape["d"]
            else:
                macs = r.flops / 2.0
            ops = max(0.0, r.flops - 2.0 * macs)
            levels["L1"] = 2.0 * r.gm_bytes
            levels["L0"] = r.gm_bytes + macs * eb * (1 / n0 + 1 / m0) + 2.0 * macs * acc_b / k0
    else:
        ops = float(r.flops)
        levels["UB"] = r.gm_bytes  # each loaded byte is written into UB once, each stored byte read once
    levels["UB"] += 3.0 * ops * eb  # each element-op reads two operands and writes its result in UB
    return KernelTraffic(r.name, r.dtype, macs, ops, MappingProxyType(levels))


@dataclass(frozen=True)
class KernelEnergy:
    """One kernel report's dynamic energy in pJ: compute and each memory level."""

    traffic: KernelTraffic
    mac_pj: float
    op_pj: float
    level_pj: Mapping[str, float]

    @property
    def dynamic_pj(self) -> float:
        return self.mac_pj + self.op_pj + sum(self.level_pj.values())


def kernel_energy(r: KernelReport, table: EnergyTable) -> KernelEnergy:
    t = kernel_traffic(r)
    return KernelEnergy(t, t.macs * table.mac_pj(t.dtype), t.vector_ops * table.op_pj(t.dtype),
                        MappingProxyType({lv: t.bytes[lv] * table.pj_per_byte(lv) for lv in LEVELS}))


@dataclass(frozen=True)
class EnergySummary:
    """The energy of one run of a model: dynamic (by part) plus static over its latency."""

    chip: str
    latency_us: float
    macs: float
    mac_mj: float
    vector_mj: float
    level_mj: Mapping[str, float]
    static_mj: float
    tdp_w: float

    @property
    def dynamic_mj(self) -> float:
        return self.mac_mj + self.vector_mj + sum(self.level_mj.values())

    @property
    def energy_mj(self) -> float:
        return self.dynamic_mj + self.static_mj

    @property
    def avg_power_w(self) -> float:
        """Energy over latency (mJ / us x 1e3 = W)."""
        return self.energy_mj / self.latency_us * 1e3 if self.latency_us > 0 else 0.0

    @property
    def tops_per_w(self) -> float:
        """2 x MACs per joule, in tera-ops per watt (= (2 x MACs / latency) / average power): the
        Cube's work only, counted in the precision it runs (int8 MACs count as int8 ops)."""
        return 2.0 * self.macs / (self.energy_mj * 1e-3) / 1e12 if self.energy_mj > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"energy_mj": self.energy_mj, "avg_power_w": self.avg_power_w, "tops_per_w": self.tops_per_w,
                "dynamic_mj": self.dynamic_mj, "static_mj": self.static_mj, "mac_mj": self.mac_mj,
                "vector_mj": self.vector_mj, "level_mj": dict(self.level_mj), "macs": self.macs,
                "tdp_w": self.tdp_w}


def energy_of(chip: Chip, reports, latency_us: float) -> EnergySummary:
    """The energy of kernel reports run in ``latency_us`` on ``chip``."""
    table = chip.energy
    if table is None:
        raise EnergyModelError(
            f"{chip.name}: the energy model needs the preset's [energy] table (rule: every energy constant comes "
            f"from the chip preset with its source), and {chip.path or 'this chip'} has none; fix: copy the "
            "[energy] table of a shipped preset (pypto_lab/hw/presets) into it")
    macs = mac_pj = op_pj = 0.0
    levels = dict.fromkeys(LEVELS, 0.0)
    for r in reports:
        e = kernel_energy(r, table)
        macs += e.traffic.macs
        mac_pj += e.mac_pj
        op_pj += e.op_pj
        for lv, pj in e.level_pj.items():
            levels[lv] += pj
    return EnergySummary(chip.name, latency_us, macs, mac_pj * 1e-9, op_pj * 1e-9,
                         MappingProxyType({lv: pj * 1e-9 for lv, pj in levels.items()}),
                         table.static_w * latency_us * 1e-3, table.tdp_w)


__all__ = ["EnergyModelError", "EnergySummary", "EnergyTable", "KernelEnergy", "KernelTraffic", "LEVELS",
           "energy_of", "kernel_energy", "kernel_traffic", "read_energy_table"]
