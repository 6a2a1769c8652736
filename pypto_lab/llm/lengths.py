"""ShareGPT-like prompt and output lengths for the serving simulator: a lognormal per dimension,
fitted at load time to the published statistics of ``datasets/serving/sharegpt_lengths.toml``.

The fit: lengths are ``clip(round(X), lo, hi)`` with ``X ~ LogNormal(mu, sigma)``. With a published
median, ``mu = ln(median)`` and ``sigma`` is solved so that the mean of the clipped distribution
equals the published mean; without one, ``sigma`` comes from the file's ``[shape]`` section (marked
there as an assumption) and ``mu`` is solved for the mean. Both solves are bisections on the
closed-form mean of a clipped lognormal. Prompt and output are drawn independently (no published
correlation is used).

``python -m pypto_lab.llm.lengths --fit`` prints the fitted parameters and what 200,000 samples give.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import tomllib

from ..files.paths import DATASETS_DIR

LENGTHS_TOML = DATASETS_DIR / "serving" / "sharegpt_lengths.toml"


@dataclass(frozen=True)
class LogNormalFit:
    """One dimension's fitted distribution and the statistics it was fitted to."""

    mu: float
    sigma: float
    lo: int
    hi: int
    target_mean: float
    target_median: float | None

    @property
    def median(self) -> float:
        return min(max(math.exp(self.mu), self.lo), self.hi)

    def clipped_mean(self) -> float:
        return _clipped_mean(self.mu, self.sigma, self.lo, self.hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(self.mu, self.sigma, size=n)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _clipped_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X ~ LogNormal(mu, sigma), in closed form."""
    a, b = math.log(lo), math.log(hi)
    below = _phi((a - mu) / sigma)
    above = 1.0 - _phi((b - mu) / sigma)
    inside = math.exp(mu + sigma * sigma / 2) * (_phi((b - mu - sigma * sigma) / sigma) - _phi((a - mu - sigma * sigma) / sigma))
    return lo * below + inside + hi * above


def _bisect(f, lo: float, hi: float, iters: int = 200) -> float:
    """Root of an increasing ``f`` on [lo, hi]."""
    if f(lo) > 0 or f(hi) < 0:
        raise ValueError("no root in the bracket")
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def fit_dimension(mean: float, lo: int, hi: int, *, median: float | None = None, sigma: float | None = None) -> LogNormalFit:
    """Lognormal matched to ``mean`` (of the clipped lengths) and to ``median`` if given, else
    with the given ``sigma``."""
    if not lo < mean < hi:
        raise ValueError(f"published mean {mean} must lie inside the clip range ({lo}, {hi})")
    if median is not None:
        if not lo <= median < mean:
            raise ValueError(f"a lognormal needs lo <= median < mean; got median {median}, mean {mean}")
        mu = math.log(median)
        s = _bisect(lambda s: _clipped_mean(mu, s, lo, hi) - mean, 1e-6, 10.0)
        return LogNormalFit(mu, s, lo, hi, mean, median)
    if sigma is None or sigma <= 0:
        raise ValueError("without a median the fit needs a positive sigma ([shape] sigma in the TOML)")
    mu = _bisect(lambda m: _clipped_mean(m, sigma, lo, hi) - mean, math.log(lo) - 20.0, math.log(hi) + 20.0)
    return LogNormalFit(mu, sigma, lo, hi, mean, None)


@lru_cache(maxsize=4)
def fit(path: str | None = None) -> dict[str, LogNormalFit]:
    """``{"prompt": fit, "output": fit}`` from the published statistics in ``path`` (default: the
    shipped ShareGPT-like file)."""
    with open(path or LENGTHS_TOML, "rb") as fh:
        doc = tomllib.load(fh)
    lo, hi = int(doc["clip"]["min"]), int(doc["clip"]["max"])
    sigma = doc.get("shape", {}).get("sigma")
    return {
        dim: fit_dimension(float(doc[dim]["mean"]), lo, hi, median=doc[dim].get("median"), sigma=sigma)
        for dim in ("prompt", "output")
    }


def sample_lengths(n: int, rng: np.random.Generator, path: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (prompt, output) lengths, as two int64 arrays, drawn from ``rng``."""
    fits = fit(path)
    prompt = fits["prompt"].sample(rng, n)
    output = fits["output"].sample(rng, n)
    return prompt, output


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="print the fitted parameters and a sample check")
    ap.add_argument("--toml", default=None, help="published statistics (default: the shipped file)")
    ap.add_argument("--samples", type=int, default=200_000)
    args = ap.parse_args(argv)
    fits = fit(args.toml)
    rng = np.random.default_rng(0)
    print(f"statistics: {args.toml or LENGTHS_TOML}")
    print("| dimension | target mean | target median | mu | sigma | fitted median | sample mean | sample median | sample p90 | sample p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dim, f in fits.items():
        s = f.sample(rng, args.samples)
        med = "-" if f.target_median is None else f"{f.target_median:g}"
        print(f"| {dim} | {f.target_mean:g} | {med} | {f.mu:.4f} | {f.sigma:.4f} | {f.median:.1f} | {s.mean():.1f} | "
              f"{np.median(s):.0f} | {np.percentile(s, 90):.0f} | {np.percentile(s, 99):.0f} |")


if __name__ == "__main__":
    main()
