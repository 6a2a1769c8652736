"""The `Report`: what the simulator says about one optimised model, and the one source of every
figure the views, widgets, notebooks and the command line show.

It holds the chip the model was costed on (the `Chip` object, not its name), every kernel with
its spec and cost, the pass-by-pass waterfall (`PassStep`: latency, kernels and GM bytes after
each pass, with the pass's summary and structured notes), the CPU fallbacks, and the results of
the analyses: the `Schedule` (when each kernel runs) and the `MemoryPlan` (peak GM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..hw.chip import Chip
from ..hw.energy import EnergySummary, energy_of
from ..lowering.costing import CostedKernel
from ..passes.base import Note
from ..stack import Stack
from .memory_plan import MemoryPlan
from .schedule import Schedule


@dataclass
class PassStep:
    """The model after one pass (or the schedule analysis): its latency, kernels and GM bytes, and
    what the pass said."""

    name: str
    latency_us: float
    kernel_count: int
    summary: str
    notes: tuple[Note, ...] = ()
    gm_bytes: float = 0.0

    @property
    def lines(self) -> list[str]:
        """The summary, then every note, as text."""
        return ([self.summary] if self.summary else []) + [str(n) for n in self.notes]


@dataclass
class Report:
    """What the simulator says about one optimised model. Every figure comes from the chip model."""

    model: str
    chip: Chip
    level: int
    precision: str
    batch: int
    kernels: list[CostedKernel]
    passes: list[PassStep]
    fallback_ops: list[str]
    memory: MemoryPlan | None = None
    notes: list[str] = field(default_factory=list)
    schedule: Schedule | None = None

    @property
    def stack(self) -> Stack | None:
        """The software stack the kernels were scheduled under (`pypto_lab.stack`)."""
        return self.schedule.stack if self.schedule else None

    @property
    def latency_us(self) -> float:
        """End of the last kernel of the schedule (one stream: the sum of kernel times)."""
        return self.schedule.latency_us if self.schedule else sum(k.time_us for k in self.kernels)

    @property
    def throughput_per_s(self) -> float:
        return self.batch / (self.latency_us * 1e-6) if self.latency_us else 0.0

    @property
    def gm_bytes(self) -> float:
        return sum(k.gm_bytes for k in self.kernels)

    @property
    def dram_bytes(self) -> float:
        """Bytes that cross DRAM (HBM / LPDDR): each kernel's first touches and write-backs, less what
        L2 kept between operators."""
        return sum(k.cost.hbm_bytes * k.count for k in self.kernels)

    @property
    def peak_memory_bytes(self) -> int:
        """Peak GM use of one run under this level's plan (no buffer reuse before level 2)."""
        return int(self.memory.peak_bytes) if self.memory else 0

    # ---- energy (`pypto_lab.hw.energy`: the constants of the chip preset's [energy] table) ----
    def energy(self) -> EnergySummary:
        """The energy of one run: every kernel's MACs, vector ops and bytes at each memory level (each
        of its ``count`` runs), plus the chip's static power over the latency. Raises `EnergyModelError` for a chip whose
        preset has no [energy] table."""
        return energy_of(self.chip, [r for k in self.kernels for _ in range(int(k.count)) for r in k.reports],
                         self.latency_us)

    @property
    def energy_mj(self) -> float:
        """Energy of one run (the whole batch), in millijoules."""
        return self.energy().energy_mj

    @property
    def avg_power_w(self) -> float:
        """Energy over latency, in watts."""
        return self.energy().avg_power_w

    @property
    def tops_per_w(self) -> float:
        """2 x the Cube's MACs per joule, in TOPS/W (= (2 x MACs / latency) / average power)."""
        return self.energy().tops_per_w

    def utilization(self, unit: str) -> float:
        """Time-weighted Cube or Vector utilisation over the model's kernels."""
        total = sum(k.time_us for k in self.kernels if k.unit != "cpu")
        if not total:
            return 0.0
        attr = "cube_utilization" if unit == "cube" else "vector_utilization"
        return sum(getattr(r, attr) * r.time_us * k.count for k in self.kernels for r in k.reports) / total

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "chip": self.chip.name, "level": self.level, "precision": self.precision,
            "batch": self.batch, "latency_us": self.latency_us, "throughput_per_s": self.throughput_per_s,
            "kernel_count": len(self.kernels), "gm_bytes": self.gm_bytes, "dram_bytes": self.dram_bytes,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_bytes_with_reuse": int(self.memory.peak_bytes_reuse) if self.memory else 0,
            "cube_utilization": self.utilization("cube"), "vector_utilization": self.utilization("vector"),
            "fallback_ops": list(self.fallback_ops), "kernels": [k.to_dict() for k in self.kernels],
            "serial_us": self.schedule.serial_us if self.schedule else sum(k.time_us for k in self.kernels),
            "stack": self.stack.summary() if self.stack else None,
            "passes": [{"name": p.name, "latency_us": p.latency_us, "kernel_count": p.kernel_count,
                        "gm_bytes": p.gm_bytes, "summary": p.summary,
                        "notes": [{"node": n.node, "reason": n.reason} for n in p.notes]} for p in self.passes],
            "notes": list(self.notes),
            **self._energy_fields(),
        }

    def _energy_fields(self) -> dict[str, Any]:
        if self.chip.energy is None:  # a preset without an [energy] table: no energy figures
            return {"energy_mj": None, "avg_power_w": None, "tops_per_w": None, "energy": None}
        e = self.energy()
        return {"energy_mj": e.energy_mj, "avg_power_w": e.avg_power_w, "tops_per_w": e.tops_per_w,
                "energy": e.to_dict()}

    def table(self, top: int = 15) -> str:
        rows = sorted(self.kernels, key=lambda k: -k.time_us)[:top]
        width = max([len(k.name) for k in rows] + [6])
        lines = [f"{self.model} on {self.chip.name}, level {self.level}, {self.precision}, batch {self.batch}"
                 + (f", {self.stack.name}" if self.stack else ""),
                 f"{'kernel':<{width}}  {'unit':<11}  {'time us':>9}  {'GM MB':>8}  fused ops"]
        for k in rows:
            ops = ", ".join(t.split(".")[1] if t.startswith("aten.") else t for t in k.fused_ops)
            lines.append(f"{k.name:<{width}}  {k.unit:<11}  {k.time_us:9.1f}  {k.gm_bytes / 1e6:8.2f}  {ops}")
        if self.schedule:
            lines.append(f"schedule: {self.schedule.summary()}")
        lines.append(f"total: {len(self.kernels)} kernels, {self.latency_us:,.1f} us, "
                     f"{self.throughput_per_s:,.1f} samples/s, GM {self.gm_bytes / 1e6:,.1f} MB, "
                     f"cube {self.utilization('cube'):.0%}, vector {self.utilization('vector'):.0%}, "
                     f"peak memory {self.peak_memory_bytes / 1e6:,.1f} MB")
        if self.chip.energy is not None:
            e = self.energy()
            lines.append(f"energy: {e.energy_mj:,.2f} mJ per run ({e.dynamic_mj:,.2f} dynamic + {e.static_mj:,.2f} "
                         f"static), average power {e.avg_power_w:,.1f} W (TDP {e.tdp_w:g} W), "
                         f"{e.tops_per_w:,.2f} TOPS/W")
        if self.fallback_ops:
            lines.append(f"CPU fallbacks: {', '.join(self.fallback_ops)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


__all__ = ["PassStep", "Report"]
