"""`auto_tune`: search the tile shapes of every Cube kernel of an optimised model (the seed
article's ``pypto.tuning.auto_tune``, section 8.3).

For each distinct Cube kernel (chip, batch, M x K x N, dtype, epilogue) the search

1. enumerates the legal tilings ``m[m_l0, m_l1] k[k_l0, k_l1] n[n_l0, n_l1]`` under PyPTO's rules
   (`pypto_lab.hw.tiling.plan_cube`): multiples of the 32-byte alignment (16 elements for fp16,
   bf16 and fp32, 32 for int8), ``l1`` a multiple of ``l0``, the L0A / L0B / L0C tiles and both
   L1 panels within capacity, BiasTable / FixPipe-buffer limits for a FixPipe bias or
   quantisation on 910B. L0 sizes are the multiples of the alignment up to 16 of them, then powers
   of two; L1 sizes are 1-8, 12, 16, 24, 32, ... times the L0 size up to the first that covers
   the dimension. Level "fast" keeps powers of two only;
2. screens every candidate with an analytic cost compiled by numba: per block, the busy cycles
   of each pipe as the tile program issues them (MTE2 panel loads, re-loaded per sub-tile when
   K takes several panels, and HBM write-backs; MTE1 L0 loads; Cube MMADs with their start-up
   and fractal count; the L0C drain through FixPipe or UB and MTE3), overlapped when the buffers
   are double-buffered and summed when they are not, times the waves of blocks over the cores,
   bounded below by the memory system (HBM first touches, L2 re-reads);
3. simulates the best-screened candidates with the event simulator (`simulate_matmul`, through
   the same `cost_kernel` the report uses) and keeps one only when the simulator says it beats
   the kernel's current tiling ("default_us"), so a tuned kernel is never slower.

``tune_config``: ``level`` "fast" (power-of-two space, 4 simulations), "normal" (full space, 16)
or "exhaustive" (full space, up to ``num_trials``); ``num_trials`` caps the simulations per
kernel; ``early_stop`` stops after ``patience`` simulations in a row without improvement
(default 3 / 6 / 24 by level); ``seed`` drives the random part of the verification list (after
the best-screened half, the rest is drawn from the best 2 % of the screened space), so the same
seed gives the same result; ``progress`` (default: when stderr is a terminal) shows a tqdm bar.

Results go to a JSON cache (``cache_path``, default ``~/.cache/pypto_lab/tuning.json``, or the
``PYPTO_LAB_TUNING_CACHE`` environment variable; ``cache_path=False`` turns it off), keyed by
chip, batch, dims, dtype, epilogue and level, written atomically; a later run reuses an entry
without simulating. A file at that path that is not such a cache (another version, a list, not
JSON) is refused with a `TuneError` and left untouched.

`auto_tune` writes the tiles into ``optimized.graph`` (``attrs["tile"]`` of each Cube anchor,
which `pypto_lab.model_cost` honours), recomputes the report and stores it in the
OptimizedModel, so ``optimized.report()`` shows the tuned model; the returned `TuneResult` has
the rows, the new report (``result.report``) and a table.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numba import njit

from .fileio import write_json_atomic
from .hw.chip import DTYPE_BYTES, PIPE_INDEX, Chip, get_chip
from .hw.tiling import CubeTile, _operand_align, cube_fractal, plan_cube

LEVELS = {"fast": (4, 3), "normal": (16, 6), "exhaustive": (None, 24)}  # (simulations, patience)
CONFIG_KEYS = ("level", "num_trials", "early_stop", "seed", "progress", "patience")
CACHE_VERSION = 1


class TuneError(ValueError):
    """Bad arguments to `auto_tune`: the message names the value, the rule and a fix."""


class TuneCacheWarning(UserWarning):
    """`auto_tune` could not write its cache file (the tuning itself is applied)."""


# ---- the space of tilings -------------------------------------------------------------------

def _l0_values(dim: int, al: int, cap: int, pow2_only: bool) -> np.ndarray:
    top = max(al, min(cap, -(-dim // al) * al))
    vals = set()
    v = al
    while v <= top:
        vals.add(v)
        v *= 2
    if not pow2_only:
        vals.update(al * j for j in range(1, 17) if al * j <= top)
    vals.add(top)
    return np.array(sorted(vals), dtype=np.int64)


def _ratios(pow2_only: bool) -> np.ndarray:
    if pow2_only:
        return np.array([1 << i for i in range(16)], dtype=np.int64)
    r = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
    while r[-1] < 1 << 16:
        r += [r[-1] * 3 // 2, r[-1] * 2]
    return np.array(r, dtype=np.int64)


@dataclass(frozen=True)
class Problem:
    """One Cube kernel's numbers for the screening cost."""

    m: int
    k: int
    n: int
    batch: int
    dtype: str
    out_dtype: str
    epilogue: str


def _chip_params(chip: Chip, p: Problem, double_buffer: bool = True) -> np.ndarray:
    """The chip constants the screening cost needs, as one float array."""
    eb = DTYPE_BYTES[p.dtype]
    ob = DTYPE_BYTES[p.out_dtype]
    acc_b = DTYPE_BYTES[chip.cube.accumulator[p.dtype]]
    m0, k0, n0 = cube_fractal(chip, p.dtype)
    gm = chip.data_path("GM_TO_L1")
    la, lb = chip.data_path("L1_TO_L0A"), chip.data_path("L1_TO_L0B")
    split = chip.split_cores
    if split:
        d1 = chip.data_path("L0C_TO_GM")
        d2 = d1
        d2_rate = 1e30
    else:
        d1 = chip.data_path("L0C_TO_UB")
        d2 = chip.data_path("UB_TO_GM")
        d2_rate = d2.bytes_per_cycle
    l2_rate = chip.l2_bytes_per_cycle()
    side = 0.0
    if "BT" in chip.buffers and p.epilogue in ("bias", "bias_relu"):
        side = chip.buffer("BT").size_bytes / 4
    if "FB" in chip.buffers and p.epilogue == "quant":
        side = chip.buffer("FB").size_bytes / 8
    return np.array([
        p.m, p.k, p.n, p.batch, eb, ob, acc_b, m0, k0, n0, chip.cube_cores, chip.cube.startup_cycles,
        gm.bytes_per_cycle, gm.startup_cycles, gm.latency_cycles,
        la.bytes_per_cycle, la.startup_cycles, lb.bytes_per_cycle, lb.startup_cycles,
        d1.bytes_per_cycle, d1.startup_cycles, d1.latency_cycles, PIPE_INDEX[d1.pipe],
        d2_rate, d2.startup_cycles, 0.0 if split else 1.0,
        l2_rate, chip.hbm_bytes_per_cycle(), chip.l2_bytes,
        chip.buffer("L1").size_bytes, chip.buffer("L0A").size_bytes, chip.buffer("L0B").size_bytes,
        chip.buffer("L0C").size_bytes, side, 1.0 if double_buffer else 0.0,
    ], dtype=np.float64)


@njit(cache=True)
def _cdiv(a, b):
    return -(-a // b)


@njit(cache=True)
def _block_pipes(bm, bn, m_l0, n_l0, k_l0, k_l1, prm, out):
    """Busy cycles per pipe of one bm x bn block: out[0] MTE2 bytes read, out[1] MTE2 transfers,
    out[2] MTE1, out[3] CUBE, out[4] drain 1 (FixPipe or L0C->UB), out[5] drain 2 (MTE3),
    out[6] bytes written."""
    K = int(prm[1])
    eb, ob, acc_b = prm[4], prm[5], prm[6]
    m0, k0, n0 = int(prm[7]), int(prm[8]), int(prm[9])
    cube_start = prm[11]
    subs_m = _cdiv(bm, m_l0)
    subs_n = _cdiv(bn, n_l0)
    subs = subs_m * subs_n
    k_steps = _cdiv(K, k_l1)
    loads = subs if k_steps > 1 else 1
    out[0] = loads * (bm + bn) * K * eb
    out[1] = loads * k_steps * 2.0
    # k_l0 steps and fractals along K: full panels, then the last one
    full = K // k_l1
    rem = K - full * k_l1
    steps = full * _cdiv(k_l1, k_l0)
    kfrac = full * ((k_l1 // k_l0) * _cdiv(k_l0, k0) + _cdiv(k_l1 % k_l0, k0))
    if rem > 0:
        steps += _cdiv(rem, k_l0)
        kfrac += (rem // k_l0) * _cdiv(k_l0, k0) + _cdiv(rem % k_l0, k0)
    out[2] = subs * steps * (prm[16] + prm[18]) + bm * subs_n * K * eb / prm[15] + bn * subs_m * K * eb / prm[17]
    mfrac = (bm // m_l0) * _cdiv(m_l0, m0) + _cdiv(bm % m_l0, m0)
    nfrac = (bn // n_l0) * _cdiv(n_l0, n0) + _cdiv(bn % n_l0, n0)
    out[3] = subs * steps * cube_start + mfrac * nfrac * kfrac
    if prm[25] > 0:  # L0C -> UB (acc dtype), then UB -> GM on MTE3
        out[4] = subs * prm[20] + bm * bn * acc_b / prm[19]
        out[5] = subs * prm[24] + bm * bn * ob / prm[23]
    else:
        out[4] = subs * prm[20] + bm * bn * ob / prm[19]
        out[5] = 0.0
    out[6] = bm * bn * ob


@njit(cache=True)
def _tile_cost(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm, buf):
    """Screening estimate (cycles) of one legal tiling."""
    M, K, N, B = int(prm[0]), int(prm[1]), int(prm[2]), int(prm[3])
    eb, ob, acc_b = prm[4], prm[5], prm[6]
    cores = int(prm[10])
    bmc = _cdiv(M, m_l1)
    bnc = _cdiv(N, n_l1)
    nb = B * bmc * bnc
    active = min(nb, cores)
    waves = _cdiv(nb, cores)
    em = M - (bmc - 1) * m_l1
    en = N - (bnc - 1) * n_l1
    tot = np.zeros(7)
    # the four kinds of block: full, last row, last column, corner
    for t in range(4):
        bm = m_l1 if t % 2 == 0 else em
        bn = n_l1 if t < 2 else en
        cnt_m = (bmc - 1) if t % 2 == 0 else 1
        cnt_n = (bnc - 1) if t < 2 else 1
        cnt = cnt_m * cnt_n
        if cnt <= 0:
            continue
        _block_pipes(bm, bn, m_l0, n_l0, k_l0, k_l1, prm, buf)
        for i in range(7):
            tot[i] += cnt * buf[i]
    for i in range(7):
        tot[i] *= B
    share = waves / nb  # the busiest core's part of the work
    gm_rate, gm_su, gm_lat = prm[12], prm[13], prm[14]
    l2_rate, hbm, l2_bytes = prm[26], prm[27], prm[28]
    reads = tot[0]
    first = B * (M * K + K * N) * eb
    wave_rows = min(bmc, _cdiv(2 * active, bnc) + 1)
    wave_cols = min(bnc, 2 * active)
    ws = (wave_rows * m_l1 + wave_cols * n_l1) * K * eb
    hit = min(1.0, l2_bytes / max(ws, 1.0))
    read_cycles = first / hbm + max(0.0, reads - first) * (hit / l2_rate + (1.0 - hit) / hbm)
    hbm_share = hbm / active
    mte2 = max(reads * share / gm_rate, read_cycles) + tot[1] * share * gm_su + tot[6] * share / hbm_share
    mte1 = tot[2] * share
    cube = tot[3] * share
    d1 = tot[4] * share
    d2 = tot[5] * share
    # buffers: slots per level (double buffering when two tiles fit)
    db = prm[34] > 0
    l1_two = db and 2 * (m_l1 + n_l1) * k_l1 * eb <= prm[29]
    l0_two = db and 2 * m_l0 * k_l0 * eb <= prm[30] and 2 * n_l0 * k_l0 * eb <= prm[31]
    c_two = db and 2 * m_l0 * n_l0 * acc_b <= prm[32]
    core = cube
    core = core + mte1 if not l0_two else max(core, mte1)
    core = core + d1 if not c_two else max(core, d1)
    core = max(core, d2)
    core = core + mte2 if not l1_two else max(core, mte2)
    # pipeline fill: the first panel's load and the last sub-tile's drain
    fill = gm_lat + (min(m_l1, M) + min(n_l1, N)) * min(k_l1, K) * eb / gm_rate + prm[21] \
        + min(m_l0, M) * min(n_l0, N) * ob / prm[19]
    return core + fill


@njit(cache=True)
def _legal(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm):
    eb, acc_b = prm[4], prm[6]
    if m_l0 * k_l0 * eb > prm[30] or n_l0 * k_l0 * eb > prm[31] or m_l0 * n_l0 * acc_b > prm[32]:
        return False
    if (m_l1 + n_l1) * k_l1 * eb > prm[29]:
        return False
    if prm[33] > 0 and n_l0 > prm[33]:
        return False
    return True


@njit(cache=True)
def _screen(vm, vk, vn, ratios, prm, dims, count_only, tiles, costs):
    """Walk the space; count legal tilings, or fill ``tiles`` / ``costs`` with them."""
    M, K, N = dims[0], dims[1], dims[2]
    buf = np.zeros(7)
    c = 0
    for a in range(vm.shape[0]):
        m_l0 = vm[a]
        for b in range(vn.shape[0]):
            n_l0 = vn[b]
            if m_l0 * n_l0 * prm[6] > prm[32]:
                continue
            for d in range(vk.shape[0]):
                k_l0 = vk[d]
                if m_l0 * k_l0 * prm[4] > prm[30] or n_l0 * k_l0 * prm[4] > prm[31]:
                    break
                for rm in range(ratios.shape[0]):
                    m_l1 = m_l0 * ratios[rm]
                    if rm > 0 and m_l0 * ratios[rm - 1] >= M:
                        break
                    for rn in range(ratios.shape[0]):
                        n_l1 = n_l0 * ratios[rn]
                        if rn > 0 and n_l0 * ratios[rn - 1] >= N:
                            break
                        for rk in range(ratios.shape[0]):
                            k_l1 = k_l0 * ratios[rk]
                            if rk > 0 and k_l0 * ratios[rk - 1] >= K:
                                break
                            if not _legal(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm):
                                break  # larger k_l1 only needs more L1
                            if not count_only:
                                tiles[c, 0] = m_l0
                                tiles[c, 1] = m_l1
                                tiles[c, 2] = k_l0
                                tiles[c, 3] = k_l1
                                tiles[c, 4] = n_l0
                                tiles[c, 5] = n_l1
                                costs[c] = _tile_cost(m_l0, m_l1, k_l0, k_l1, n_l0, n_l1, prm, buf)
                            c += 1
    return c


@dataclass
class Screen:
    """Every legal tiling of one kernel with its screening estimate (cycles)."""

    tiles: np.ndarray   # int64 [n, 6]: m_l0, m_l1, k_l0, k_l1, n_l0, n_l1
    costs: np.ndarray   # float64 [n]
    seconds: float

    @property
    def count(self) -> int:
        return len(self.costs)

    @property
    def per_second(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")

    def tile(self, i: int) -> CubeTile:
        return CubeTile(*(int(x) for x in self.tiles[i]))


def screen_space(chip: str | Chip, m: int, k: int, n: int, dtype: str = "fp16", batch: int = 1,
                 epilogue: str = "none", out_dtype: str | None = None, full: bool = True) -> Screen:
    """Enumerate and score every legal tiling of an ``m x k x n`` Cube kernel (``full=False``:
    powers of two only). The time covers enumeration and scoring, not numba's first compile."""
    chip = get_chip(chip)
    if out_dtype is None:
        out_dtype = "int32" if dtype == "int8" else dtype
    p = Problem(m, k, n, batch, dtype, out_dtype, epilogue)
    prm = _chip_params(chip, p)
    al = _operand_align(dtype)
    eb = DTYPE_BYTES[dtype]
    vm = _l0_values(m, al, 4096, not full)
    vn = _l0_values(n, al, 4096, not full)
    vk = _l0_values(k, al, int(chip.buffer("L0A").size_bytes // (al * eb)), not full)
    ratios = _ratios(not full)
    dims = np.array([-(-m // al) * al, -(-k // al) * al, -(-n // al) * al], dtype=np.int64)
    t0 = time.perf_counter()
    count = _screen(vm, vk, vn, ratios, prm, dims, True, np.zeros((1, 6), np.int64), np.zeros(1))
    tiles = np.zeros((count, 6), np.int64)
    costs = np.zeros(count)
    _screen(vm, vk, vn, ratios, prm, dims, False, tiles, costs)
    return Screen(tiles, costs, time.perf_counter() - t0)


# ---- the search -----------------------------------------------------------------------------

@dataclass
class TuneRow:
    kernel: str
    default_us: float
    tuned_us: float
    tile: CubeTile | None        # None: the current tiling stays (nothing simulated beat it)
    candidates: int = 0          # legal tilings screened
    trials: int = 0              # simulations
    cached: bool = False
    count: int = 1               # kernels of the model with this signature

    @property
    def gain_pct(self) -> float:
        return 100.0 * (self.default_us - self.tuned_us) / self.default_us if self.default_us else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "default_us": self.default_us, "tuned_us": self.tuned_us,
                "gain_pct": self.gain_pct, "tile": self.tile.to_dict() if self.tile else None,
                "candidates": self.candidates, "trials": self.trials, "cached": self.cached, "count": self.count}


@dataclass
class TuneResult:
    rows: list[TuneRow]
    report: Any = None                # the recomputed `pypto_lab.optimize.Report`
    level: str = "normal"
    seconds: float = 0.0
    simulations: int = 0
    candidates: int = 0
    cache_path: str | None = None
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        width = max([len(r.kernel) for r in self.rows] + [6])
        lines = [f"auto_tune ({self.level}): {len(self.rows)} distinct Cube kernels, {self.candidates:,} tilings "
                 f"screened, {self.simulations} simulated, {self.seconds:.1f} s",
                 f"{'kernel':<{width}}  {'x':>3}  {'default us':>10}  {'tuned us':>9}  {'gain':>6}  tile"]
        for r in self.rows:
            lines.append(f"{r.kernel:<{width}}  {r.count:>3}  {r.default_us:10.1f}  {r.tuned_us:9.1f}  "
                         f"{r.gain_pct:5.1f}%  {r.tile if r.tile else '(kept)'}{'  [cache]' if r.cached else ''}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "seconds": self.seconds, "simulations": self.simulations,
                "candidates": self.candidates, "rows": [r.to_dict() for r in self.rows],
                "latency_us": self.report.latency_us if self.report is not None else None}


def default_cache_path() -> Path:
    env = os.environ.get("PYPTO_LAB_TUNING_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pypto_lab" / "tuning.json"


def _config(tune_config: dict | None) -> dict[str, Any]:
    cfg = {"level": "normal", "num_trials": 1000, "early_stop": True, "seed": 0, "progress": None, "patience": None}
    if tune_config is None:
        tune_config = {}
    if not isinstance(tune_config, dict):
        raise TuneError(f"tune_config = {tune_config!r}: must be a dict, e.g. {{'level': 'fast', 'num_trials': 100}}")
    unknown = sorted(set(tune_config) - set(CONFIG_KEYS))
    if unknown:
        raise TuneError(f"unknown tune_config key(s) {', '.join(map(repr, unknown))}; known: {', '.join(CONFIG_KEYS)}")
    cfg.update(tune_config)
    if cfg["level"] not in LEVELS:
        raise TuneError(f"tune_config level = {cfg['level']!r} is not known; choose one of {', '.join(LEVELS)}")
    for key in ("num_trials", "patience"):
        v = cfg[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise TuneError(f"tune_config {key} = {v!r}: must be a positive integer (simulations per kernel)")
    if isinstance(cfg["seed"], bool) or not isinstance(cfg["seed"], int):
        raise TuneError(f"tune_config seed = {cfg['seed']!r}: must be an integer")
    return cfg


def _cache_problem(path: Path, found: str) -> TuneError:
    return TuneError(
        f"tuning cache {path} {found}, not a pypto_lab tuning cache of version {CACHE_VERSION} "
        f"({{\"version\": {CACHE_VERSION}, \"entries\": {{...}}}}); it is left as it is. Fix: delete it if it is an "
        "old cache, or keep it and tune with another file: auto_tune(..., cache_path='other.json') or "
        "PYPTO_LAB_TUNING_CACHE=other.json (cache_path=False tunes without a cache)")


def _load_cache(path: Path | None) -> dict:
    """The entries of the cache file at ``path`` ({} when there is none yet). A file that is not
    this version's cache raises `TuneError` before anything is tuned, so it is never overwritten."""
    if path is None or not path.exists():
        return {}
    import json
    if path.is_dir():
        raise _cache_problem(path, "is a folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise _cache_problem(path, "is not text") from None
    except ValueError as exc:
        raise _cache_problem(path, f"is not readable JSON ({exc})") from None
    except OSError as exc:
        raise _cache_problem(path, f"cannot be read ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise _cache_problem(path, f"holds a JSON {_json_kind(data)}")
    if "version" not in data:
        keys = ", ".join(map(str, data)) or "none"
        raise _cache_problem(path, f"is a JSON object without a \"version\" key (keys: {keys})")
    if data["version"] != CACHE_VERSION:
        raise _cache_problem(path, f"has version {data['version']!r}")
    entries = data.get("entries", {})
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise _cache_problem(path, "has \"entries\" that are not an object of objects")
    return dict(entries)


def _json_kind(data: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(data), type(data).__name__)


def cache_key(chip: str, batch: int, m: int, k: int, n: int, dtype: str, epilogue: str, level: str,
              extra: str = "") -> str:
    return f"{chip}|b{batch}|{m}x{k}x{n}|{dtype}|{epilogue}{extra}|{level}"


def _verify_order(screen: Screen, budget: int, seed: int) -> list[int]:
    """Indices to simulate: the best-screened half of the budget, then a seeded draw from the
    best 2 % of the space (at least 4 * budget tilings)."""
    order = np.argsort(screen.costs, kind="stable")
    if budget >= len(order):
        return [int(i) for i in order]
    head = max(1, (budget + 1) // 2)
    pool = order[head:max(head + 1, int(len(order) * 0.02), head + 4 * budget)]
    rng = np.random.default_rng(seed)
    rest = rng.choice(len(pool), size=min(budget - head, len(pool)), replace=False) if len(pool) else []
    rest = sorted(int(pool[i]) for i in rest)
    rest.sort(key=lambda i: screen.costs[i])
    return [int(i) for i in order[:head]] + rest


def auto_tune(optimized, tune_config: dict | None = None, cache_path: str | os.PathLike | None | bool = None):
    """Search the tilings of every Cube kernel of ``optimized`` (an `OptimizedModel`), apply the
    ones the simulator says are faster, recompute its report; returns a `TuneResult`."""
    from .kernels.cost import _epilogue, cost_graph, cost_kernel, gemm_of, kernels_of
    from .optimize import PassStep, get_optimization_options, resolve_precision
    from .analysis.schedule import schedule_kernels

    cfg = _config(tune_config)
    if isinstance(optimized, torch.nn.Module):  # the seed's auto_tune(model, ...): its latest optimize()
        from .optimize import LAST_OPTIMIZED

        latest = LAST_OPTIMIZED.get(optimized)
        if latest is None or latest.graph is None:
            raise TuneError(f"auto_tune got the {type(optimized).__name__} itself, and it has not been optimised "
                            "(and run) yet: call om = pypto_lab.optimize(model, inputs) first, then auto_tune(model) "
                            "or auto_tune(om)")
        optimized = latest
    graph = getattr(optimized, "graph", None)
    report = optimized.report() if getattr(optimized, "graph", None) is not None else None
    if graph is None or report is None:
        raise TuneError(f"auto_tune needs the result of pypto_lab.optimize(model, inputs, ...), got "
                        f"{type(optimized).__name__}; run om = pypto_lab.optimize(...) and pass om")
    chip = get_chip(report.chip)
    precision = resolve_precision(chip, report.precision)[0]
    budget, patience = LEVELS[cfg["level"]]
    budget = cfg["num_trials"] if budget is None else min(budget, cfg["num_trials"])
    patience = cfg["patience"] or patience
    if cache_path is False:
        path = None
    else:
        path = Path(cache_path) if cache_path not in (None, True) else default_cache_path()
    cache = _load_cache(path)
    progress = cfg["progress"]
    if progress is None:
        progress = sys.stderr.isatty()

    t0 = time.perf_counter()
    groups: dict[str, list] = {}   # cache key -> [(nodes, anchor)]
    info: dict[str, tuple] = {}
    for nodes in kernels_of(graph):
        cube = [x for x in nodes if x.attrs.get("unit") == "cube"]
        if not cube:
            continue
        anchor = cube[0]
        batch, m, k, n, dtype = gemm_of(graph, anchor, chip, precision)
        epi = _epilogue(nodes, anchor)
        extra = ("|q" if anchor.attrs.get("quantize_input") else "") + (
            "|" + str(anchor.attrs["tile"]) if isinstance(anchor.attrs.get("tile"), CubeTile) else "")
        key = cache_key(chip.name, batch, m, k, n, dtype, epi, cfg["level"], extra)
        groups.setdefault(key, []).append((nodes, anchor))
        info[key] = (batch, m, k, n, dtype, epi)

    rows: list[TuneRow] = []
    sims = screened = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(groups), desc="auto_tune", unit="kernel")
    try:
        for key, members in groups.items():
            nodes, anchor = members[0]
            batch, m, k, n, dtype, epi = info[key]
            name = f"{anchor.attrs.get('npu_op', anchor.op)}:{anchor.module or anchor.name}"
            current = anchor.attrs.get("tile")
            hit = cache.get(key)
            if hit is not None:
                tile = CubeTile(**hit["tile"]) if hit.get("tile") else None
                row = TuneRow(name, float(hit["default_us"]), float(hit["tuned_us"]), tile,
                              int(hit.get("candidates", 0)), 0, True, len(members))
            else:
                default_us = best_us = cost_kernel(graph, nodes, chip, precision).time_us
                best = None
                out_dtype = "fp16" if dtype == "int8" else None
                scr = screen_space(chip, m, k, n, dtype, batch, epi, out_dtype, full=cfg["level"] != "fast")
                screened += scr.count
                trials = stale = 0
                for i in _verify_order(scr, budget, cfg["seed"]):
                    tile = scr.tile(i)
                    if tile == current:
                        continue
                    try:
                        plan_cube(chip, tile, dtype, m, k, n, True, epi)
                    except Exception:
                        continue
                    anchor.attrs["tile"] = tile
                    t = cost_kernel(graph, nodes, chip, precision).time_us
                    trials += 1
                    if t < best_us * (1 - 1e-9):
                        best, best_us, stale = tile, t, 0
                    else:
                        stale += 1
                    if cfg["early_stop"] and stale >= patience:
                        break
                _restore(anchor, current)
                sims += trials
                row = TuneRow(name, default_us, best_us, best, scr.count, trials, False, len(members))
                cache[key] = {"tile": best.to_dict() if best else None, "default_us": default_us,
                              "tuned_us": best_us, "candidates": scr.count, "trials": trials}
            for _, a in members:
                if row.tile is not None:
                    a.attrs["tile"] = row.tile
            rows.append(row)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if path is not None and sims:
        try:
            write_json_atomic(path, {"version": CACHE_VERSION, "entries": cache})
        except OSError as exc:  # the tuning itself stands: say why it is not cached
            warnings.warn(f"auto_tune could not write its cache {path} ({exc.strerror or exc}); the tilings are "
                          "applied but will be searched again next time. Fix: pass a writable file as "
                          "cache_path=... or set PYPTO_LAB_TUNING_CACHE", TuneCacheWarning, stacklevel=2)

    kernels = cost_graph(graph, chip, precision)
    launch = float(get_optimization_options().get("kernel_launch_us", 0.0) or 0.0)
    concurrent = getattr(graph, "schedule", None) is not None
    schedule = schedule_kernels(graph, kernels, concurrent, launch)
    if concurrent:
        graph.schedule = schedule
    tuned = sum(r.count for r in rows if r.tile is not None)
    note = (f"auto_tune ({cfg['level']}): {tuned} Cube kernels retiled, "
            f"{sum(r.count for r in rows) - tuned} keep their tiling")
    step = PassStep("auto_tune", schedule.latency_us, len(kernels), [note], sum(c.gm_bytes for c in kernels))
    new_report = replace(report, kernels=kernels, schedule=schedule, passes=[*report.passes, step],
                         notes=[*report.notes, note])
    try:
        optimized._report = new_report
    except AttributeError:  # an OptimizedModel without a settable report: the result still has it
        pass
    return TuneResult(rows, new_report, cfg["level"], time.perf_counter() - t0, sims, screened,
                      str(path) if path is not None else None, [note])


def _restore(anchor, current) -> None:
    if isinstance(current, CubeTile):
        anchor.attrs["tile"] = current
    else:
        anchor.attrs.pop("tile", None)


def best_screened(chip: str | Chip, m: int, k: int, n: int, dtype: str = "fp16", top: int = 5) -> list[CubeTile]:
    """The ``top`` tilings by the screening estimate (no simulation)."""
    scr = screen_space(chip, m, k, n, dtype)
    return [scr.tile(int(i)) for i in np.argsort(scr.costs, kind="stable")[:top]]


__all__ = ["auto_tune", "TuneResult", "TuneRow", "TuneError", "TuneCacheWarning", "screen_space", "Screen",
           "best_screened", "default_cache_path"]
