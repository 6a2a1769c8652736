"""Shared by the kernel examples: the golden comparison and the one-line performance report.

Each example builds torch inputs, runs its PyPTO kernel in SIM mode and then calls
``check(...)`` against a torch reference and ``report(kernel, ...)`` on the kernel's last run.
Tolerances follow the storage dtype: bf16 keeps 8 bits of mantissa, fp16 11, so a kernel that
stores bf16 cannot be held to fp16 tolerances. They are relative to the largest reference value
so that sums over long rows (matmul K, norms) are judged at the scale of their result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# (rtol, atol as a fraction of max |golden|) per output dtype. int8 quantization codes may differ
# by one code: a value whose scaled fp32 lands next to a .5 boundary rounds the other way when
# the norm before it summed in another order (atol = max |code| / 127 = 1 code for full-range rows).
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (3e-2, 3e-2),
    torch.int8: (0.0, 1 / 127),
}


@dataclass
class ExampleResult:
    """What ``main()`` of every example returns (the test suite reads it)."""

    name: str
    passed: bool
    max_abs_diff: float
    cycles: int
    time_us: float
    fraction_of_peak: float
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{self.name}: {verdict}  max|diff|={self.max_abs_diff:.3g}  cycles={self.cycles:,}  "
                f"time={self.time_us:.2f} us  {100 * self.fraction_of_peak:.1f}% of peak")


def check(actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[bool, float]:
    """Golden comparison: (passed, max |actual - golden|), tolerances from the storage dtype."""
    dtype = dtype or actual.dtype
    rtol, atol_frac = TOLERANCES.get(dtype, TOLERANCES[torch.float16])
    a = actual.detach().float().cpu()
    g = golden.detach().float().cpu()
    if a.shape != g.shape:
        raise AssertionError(f"shape {tuple(a.shape)} != golden shape {tuple(g.shape)}")
    diff = (a - g).abs()
    max_diff = float(diff.max()) if diff.numel() else 0.0
    atol = atol_frac * max(1.0, float(g.abs().max()) if g.numel() else 1.0)
    ok = bool(torch.isfinite(a).all()) and bool((diff <= atol + rtol * g.abs()).all())
    return ok, max_diff


def _first_attr(obj, names):
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v() if callable(v) else v
    return None


def run_metrics(kernel) -> tuple[int, float, float]:
    """(cycles, time in us, achieved fraction of the chip's peak) of the kernel's last run."""
    run = getattr(kernel, "last_run", None)
    if run is None:
        raise AssertionError("kernel.last_run is missing: the kernel did not record its run")
    cycles = int(_first_attr(run, ("cycles", "total_cycles")) or 0)
    time_us = float(_first_attr(run, ("time_us",)) or 0.0)
    frac = _first_attr(run, ("fraction_of_peak", "peak_fraction", "achieved_fraction", "utilization"))
    return cycles, time_us, float(frac if frac is not None else float("nan"))


def result(name: str, kernel, actual, golden, dtype=None, **extra) -> ExampleResult:
    ok, max_diff = check(actual, golden, dtype)
    cycles, time_us, frac = run_metrics(kernel)
    r = ExampleResult(name, ok, max_diff, cycles, time_us, frac, extra)
    print(r.line())
    return r
