"""Checker of exercise 04, fuse a block and predict its GM traffic.

The block is conv3x3 -> BatchNorm -> + x -> ReLU (a ResNet basic block's second half). The
student predicts the GM bytes of the whole block at level 0 (every op its own kernel) and at
level 1 (BatchNorm folded, the add and the ReLU in the convolution's epilogue); the checker
compares with `optimize(...).report()` and explains every kernel's bytes: which tensors it
reads, which it writes, and what the fused kernel's epilogue adds to the bare convolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

from ..analysis.report import Report
from ..compiler.optimize import optimize
from ..hw.chip import DTYPE_BYTES, get_chip
from ..hw.kernels import simulate_conv2d
from ..hw.tiling import CubeTile
from ..kernels.ir import CubeKernel, VectorKernel
from ..lowering.costing import CostedKernel
from .verdict import Attempt, Verdict, call_answer


class ResidualBlock(nn.Module):
    """y = relu(bn(conv3x3(x)) + x): the second half of a ResNet basic block."""

    def __init__(self, channels: int = 64):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)


@lru_cache(maxsize=8)
def _optimized(chip: str, channels: int, size: int, batch: int, precision: str, level: int):
    torch.manual_seed(0)
    model = ResidualBlock(channels).eval()
    x = torch.randn(batch, channels, size, size)
    return optimize(model, x, chip=chip, level=level, precision=precision)


def _number(value, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TypeError(f"{label} = {value!r}: write a number of bytes, e.g. CONV[0] + 2 * ACT")
    return float(value)


@dataclass(frozen=True)
class FusedTraffic:
    """Exercise 04: predict the GM bytes of `ResidualBlock` at levels 0 and 1 within ``tolerance``."""

    chip: str = "Ascend910A"
    channels: int = 64
    size: int = 56
    batch: int = 1
    precision: str = "fp16"
    tolerance: float = 0.02
    levels: tuple[int, ...] = (0, 1)

    def optimized(self, level: int):
        return _optimized(get_chip(self.chip).name, self.channels, self.size, self.batch, self.precision, level)

    def report(self, level: int) -> Report:
        return self.optimized(level).report()

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation (batch x channels x size x size) in GM, in the dtype the
        convolution writes there."""
        gm = self.conv_kernel(self.levels[0]).spec.out_dtype
        return self.batch * self.channels * self.size * self.size * DTYPE_BYTES[gm]

    def conv_kernel(self, level: int) -> CostedKernel:
        return next(k for k in self.report(level).kernels if isinstance(k.spec, CubeKernel))

    def conv_alone(self, level: int) -> float:
        """GM bytes of the convolution without any epilogue, at the tiling it runs with at ``level``."""
        k = self.conv_kernel(level)
        rep = simulate_conv2d(self.batch, self.channels, self.size, self.size, self.channels, kernel=3, padding=1,
                              dtype=k.spec.dtype, chip=self.report(level).chip, tile=CubeTile(**k.tile))
        return rep.gm_bytes

    # ---- the explanation of one level, kernel by kernel ----
    def _tensor_bytes(self, om, name: str, spec) -> int:
        info = om.graph.info(name)
        return info.numel * DTYPE_BYTES[spec.dtype] if info is not None else 0

    def kernel_lines(self, level: int) -> list[str]:
        om = self.optimized(level)
        act = self.activation_bytes
        graph = om.graph
        activations = {v.name for v in graph.values.values() if v.kind == "input"} | {n.name for n in graph.nodes}
        lines = []
        for k in om.report().kernels:
            ops = "+".join(t.split(".")[1] if t.startswith("aten.") else t for t in k.fused_ops)
            head = f"{k.name} ({ops}): {k.gm_bytes:,.0f} B = {k.gm_bytes / act:.2f} activations"
            if isinstance(k.spec, CubeKernel):
                bare = self.conv_alone(level)
                ep = k.spec.epilogue
                extra = k.gm_bytes - bare
                parts = [f"the convolution itself {bare:,.0f} B (im2col input, weights, output: given)"]
                known = 0.0
                if ep.residual:
                    parts.append(f"+ the residual x read once in the epilogue ({act:,} B)")
                    known += act
                if ep.on_vector and get_chip(self.chip).split_cores:
                    parts.append(f"+ C read back and written again by the Vector core ({2 * act:,} B): on "
                                 f"{get_chip(self.chip).name} the Cube and Vector units are separate cores, so "
                                 f"{'+'.join(ep.vector_stages)} cannot happen on the way out of L0C")
                    known += 2 * act
                elif ep.stages:
                    parts.append(f"{'+'.join(ep.stages)} applied on the way out of L0C: their intermediates never "
                                 "reach GM")
                if abs(extra - known) > 0.5:
                    parts.append(f"+ {extra - known:,.0f} B the simulator counts beyond these")
                lines.append(head)
                lines.extend(f"    {p}" for p in parts)
            elif isinstance(k.spec, VectorKernel):
                inside = set(k.nodes)
                reads = [i for n in k.nodes for i in graph.node(n).inputs if i in activations and i not in inside]
                reads = list(dict.fromkeys(reads))
                out = k.nodes[-1]
                counted = sum(self._tensor_bytes(om, i, k.spec) for i in reads) + self._tensor_bytes(om, out, k.spec)
                lines.append(head)
                lines.append(f"    reads {', '.join(reads)} ({len(reads)} x {act:,} B), writes {out} ({act:,} B)"
                             + ("" if abs(counted - k.gm_bytes) < 0.5 else f"; the simulator counts {k.gm_bytes:,.0f} B"))
            else:
                lines.append(head)
        return lines

    def check(self, answer) -> Verdict:
        """``answer``: ``{"level0": bytes, "level1": bytes}`` or a function returning it."""
        a = Attempt("fuse and predict")
        try:
            got = call_answer(answer)
            if not isinstance(got, dict):
                raise TypeError(f"{got!r} is not a prediction: return {{'level0': bytes, 'level1': bytes}}")
            guess = {lvl: _number(got.get(f"level{lvl}"), f"level{lvl}") for lvl in self.levels}
        except NotImplementedError as err:
            return a.not_attempted(err, "prediction()")
        except Exception as err:
            return a.broken(err, "prediction()")
        act = self.activation_bytes
        a.say(f"ResidualBlock on {get_chip(self.chip).name}, input {self.batch}x{self.channels}x{self.size}x{self.size} "
              f"{self.precision}; one activation is {act:,} B")
        wrong = []
        for lvl in self.levels:
            rep = self.report(lvl)
            true = rep.gm_bytes
            off = guess[lvl] - true
            a.facts[f"level{lvl}"] = true
            close = abs(off) <= self.tolerance * true
            a.say(f"level {lvl}: {len(rep.kernels)} kernel(s), {true:,.0f} B; you predicted {guess[lvl]:,.0f} B "
                  f"({'within' if close else 'outside'} {self.tolerance:.0%}"
                  + ("" if close else f": {abs(off):,.0f} B {'too many' if off > 0 else 'too few'} = "
                                      f"{abs(off) / act:.2f} activations") + ")")
            if not close:
                wrong.append(lvl)
        a.report = self.report(self.levels[-1])
        saved = self.report(self.levels[0]).gm_bytes - self.report(self.levels[-1]).gm_bytes
        a.facts["saved"] = saved
        if wrong:
            why = []
            for lvl in wrong:
                why.append(f"level {lvl}, kernel by kernel:")
                why.extend(f"  {line}" for line in self.kernel_lines(lvl))
            return a.fail("prediction", f"level {' and '.join(map(str, wrong))} off by more than {self.tolerance:.0%}",
                          why)
        why = []
        for lvl in self.levels:
            why.append(f"level {lvl}, kernel by kernel:")
            why.extend(f"  {line}" for line in self.kernel_lines(lvl))
        why.append(f"fusion saves {saved:,.0f} B = {saved / act:.2f} activations of GM traffic")
        return a.ok("both predictions within the tolerance", why)


__all__ = ["FusedTraffic", "ResidualBlock"]
