"""Compare two tensors the way a numerics check needs: errors, mismatches, cosine, worst elements.

``compare_tensors(npu_out, reference)`` answers "how far is this result from the reference, and
where": the largest absolute and relative error, the fraction of elements outside
``|a - b| <= atol + rtol * |b|`` (the rule of `torch.allclose`, with ``b`` the reference), the
cosine similarity of the two tensors as vectors, and the indices of the worst elements. Errors
are computed in float64, so comparing fp16 or fp32 results adds no rounding of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np
import torch


class CompareError(ValueError):
    """Bad input to a comparison: the message names the rule, the value and a fix."""


@dataclass
class Comparison:
    """The result of `compare_tensors` (``a`` compared with the reference ``b``)."""

    shape: tuple[int, ...]
    rtol: float
    atol: float
    max_abs_error: float
    max_rel_error: float          # max |a-b| / |b| over elements with b != 0
    mismatch_fraction: float      # elements failing |a-b| <= atol + rtol*|b|
    mismatches: int
    cosine_similarity: float
    worst_indices: list[tuple[int, ...]] = field(default_factory=list)
    worst_values: list[tuple[float, float]] = field(default_factory=list)  # (a, b) at worst_indices
    reference_max_abs: float = 0.0

    @property
    def passed(self) -> bool:
        """Every element within ``atol + rtol * |b|``."""
        return self.mismatches == 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        lines = [f"{verdict}: shape {self.shape}, rtol {self.rtol:g}, atol {self.atol:g}",
                 f"  max abs error {self.max_abs_error:.3e} (reference max |b| {self.reference_max_abs:.3e}), "
                 f"max rel error {self.max_rel_error:.3e}",
                 f"  mismatches {self.mismatches} of {self.numel} ({self.mismatch_fraction:.3%}), "
                 f"cosine similarity {self.cosine_similarity:.6f}"]
        if self.worst_indices and self.max_abs_error > 0:
            worst = ", ".join(f"{list(i)}: {a:.6g} vs {b:.6g}"
                              for i, (a, b) in zip(self.worst_indices, self.worst_values, strict=True))
            lines.append(f"  worst elements (index: a vs b): {worst}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _tolerance(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise CompareError(f"{name} must be a number: got {value!r} ({type(value).__name__}); pass e.g. "
                           f"{name}=1e-3")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise CompareError(f"{name} must be >= 0: got {value!r}; tolerances are magnitudes, pass e.g. {name}=1e-3")
    return value


def _tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
    elif isinstance(x, (np.ndarray, Real, list)):
        t = torch.as_tensor(np.asarray(x))
    else:
        hint = (" (for a model output, pick one tensor, e.g. out.last_hidden_state or out[0])"
                if isinstance(x, (tuple, dict)) or hasattr(x, "keys") else "")
        raise CompareError(f"{name} must be a tensor or an array: got {type(x).__name__}{hint}")
    if t.is_complex():
        raise CompareError(f"{name} holds complex numbers (dtype {t.dtype}); compare real and imaginary parts "
                           "separately (torch.view_as_real)")
    return t.to(torch.float64)


def compare_tensors(a: Any, b: Any, rtol: float = 1e-3, atol: float = 1e-5, verbose: bool = True,
                    top: int = 5) -> Comparison:
    """Compare ``a`` with the reference ``b`` (same shape); print the summary when ``verbose``.

    An element passes when ``|a - b| <= atol + rtol * |b|`` (equal infinities pass, NaN fails);
    ``top`` worst elements (largest ``|a - b|``, NaN first) are listed."""
    rtol = _tolerance(rtol, "rtol")
    atol = _tolerance(atol, "atol")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise CompareError(f"top must be an integer >= 0: got {top!r}; pass e.g. top=5")
    ta, tb = _tensor(a, "a"), _tensor(b, "b")
    if ta.shape != tb.shape:
        raise CompareError(f"shapes differ: a has shape {tuple(ta.shape)}, b has shape {tuple(tb.shape)}; "
                           "compare tensors of the same shape (reshape or index one of them)")
    shape = tuple(ta.shape)
    fa, fb = ta.reshape(-1), tb.reshape(-1)
    same = fa == fb  # covers equal infinities
    diff = torch.where(same, torch.zeros_like(fa), (fa - fb).abs())
    diff = torch.where(torch.isnan(fa) | torch.isnan(fb), torch.full_like(fa, math.nan), diff)
    ok = same | (diff <= atol + rtol * fb.abs())
    mismatches = int((~ok).sum())
    n = fa.numel()
    if n == 0:
        return Comparison(shape, rtol, atol, 0.0, 0.0, 0.0, 0, 1.0, reference_max_abs=0.0)
    max_abs = math.nan if torch.isnan(diff).any() else float(diff.max())
    nonzero = fb != 0
    rel = diff[nonzero] / fb[nonzero].abs()
    max_rel = (math.nan if torch.isnan(rel).any() else float(rel.max())) if rel.numel() else 0.0
    finite = torch.isfinite(fa) & torch.isfinite(fb)
    if not bool(finite.all()):
        cosine = math.nan
    else:
        na, nb = float(fa.norm()), float(fb.norm())
        if na == 0 and nb == 0:
            cosine = 1.0
        elif na == 0 or nb == 0:
            cosine = 0.0
        else:
            cosine = float(torch.dot(fa, fb)) / (na * nb)
    order = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    k = min(top, n)
    idx = torch.topk(order, k).indices.tolist() if k else []
    worst = [tuple(int(v) for v in np.unravel_index(i, shape)) if shape else () for i in idx]
    values = [(float(fa[i]), float(fb[i])) for i in idx]
    ref_max = float(fb[torch.isfinite(fb)].abs().max()) if bool(torch.isfinite(fb).any()) else math.nan
    result = Comparison(shape, rtol, atol, max_abs, max_rel, mismatches / n, mismatches, cosine, worst, values,
                        ref_max)
    if verbose:
        print(result.summary())
    return result


__all__ = ["CompareError", "Comparison", "compare_tensors"]
