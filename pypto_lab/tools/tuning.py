"""`auto_tune`: search the tile shapes of every Cube kernel of an optimised model (the seed
article's ``pypto.tuning.auto_tune``, section 8.3).

For each distinct Cube kernel (chip, batch, M x K x N, dtype, epilogue) the search

1. enumerates the legal tilings ``m[m_l0, m_l1] k[k_l0, k_l1] n[n_l0, n_l1]`` and scores each
   with the hardware model's screening estimate (`pypto_lab.hw.tile_search.screen_space`, which
   says what the space holds and how the estimate works; level "fast" keeps powers of two only);
2. simulates the best-screened candidates with the event simulator through the tile search every
   caller shares (`pypto_lab.kernels.tile_search.search_tiling`: the Cube coster the report uses)
   and keeps one only when the simulator says it beats the kernel's current tiling
   ("default_us"), so a tuned kernel is never slower.

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

`auto_tune` writes the tiles into ``optimized.graph`` (the ``tile`` of each `CubeKernel` spec,
which the Cube coster obeys), recomputes the report on the chip the model was optimised for and
stores it in the OptimizedModel, so ``optimized.report()`` shows the tuned model; the returned `TuneResult` has
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
from tqdm.auto import tqdm

from ..compiler.optimize import KEEP_LATEST, OptimizedModel, latest_optimized, recost
from ..files.atomic import write_json_atomic
from ..hw.tile_search import Screen, best_screened, screen_space
from ..hw.tiling import CubeTile
from ..kernels.ir import CubeKernel
from ..kernels.tile_search import search_tiling

LEVELS = {"fast": (4, 3), "normal": (16, 6), "exhaustive": (None, 24)}  # (simulations, patience)
CONFIG_KEYS = ("level", "num_trials", "early_stop", "seed", "progress", "patience")
CACHE_VERSION = 1


class TuneError(ValueError):
    """Bad arguments to `auto_tune`: the message names the value, the rule and a fix."""


class TuneCacheWarning(UserWarning):
    """`auto_tune` could not write its cache file (the tuning itself is applied)."""


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
    for key, entry in entries.items():
        problem = _entry_problem(entry)
        if problem:
            raise _cache_problem(path, f"has a damaged entry {key!r} ({problem})")
    return dict(entries)


def _entry_problem(entry: dict) -> str | None:
    """What is wrong with one cache entry (None: nothing): its tiling is applied to kernels and its
    times reported as they are, so each is checked before use."""
    for name in ("default_us", "tuned_us"):
        v = entry.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and v < float("inf")):
            return f"{name} = {v!r}: a time in us, a finite number > 0"
    tile = entry.get("tile")
    if tile is None:
        return None
    fields = ("m_l0", "m_l1", "k_l0", "k_l1", "n_l0", "n_l1")
    if not isinstance(tile, dict) or sorted(tile) != sorted(fields) or \
            not all(isinstance(tile[f], int) and not isinstance(tile[f], bool) and tile[f] > 0 for f in fields):
        return f"tile = {tile!r}: a tiling is {{m_l0, m_l1, k_l0, k_l1, n_l0, n_l1}}, positive integers"
    if any(tile[f] % 16 for f in fields) or any(tile[f"{a}_l1"] % tile[f"{a}_l0"] for a in "mkn"):
        return f"tile = {tile}: not a tiling the Cube accepts (sizes multiples of 16, each l1 a multiple of its l0)"
    return None


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


def _screen_epilogue(spec: CubeKernel) -> str:
    """The screen's name for what constrains a tiling in the epilogue: a FixPipe bias (BiasTable) or
    (de)quantisation (FixPipe buffer)."""
    fix = spec.epilogue.fixpipe
    return "quant" if {"dequant", "quant"} & fix else ("bias" if "bias" in fix else "none")


def auto_tune(optimized, tune_config: dict | None = None, cache_path: str | os.PathLike | None | bool = None):
    """Search the tilings of every Cube kernel of ``optimized`` (an `OptimizedModel`), apply the
    ones the simulator says are faster, recompute its report; returns a `TuneResult`."""
    cfg = _config(tune_config)
    # the seed's auto_tune(model, ...): its latest optimize() (an OptimizedModel is itself a Module)
    if isinstance(optimized, torch.nn.Module) and not isinstance(optimized, OptimizedModel):
        latest = latest_optimized(optimized)
        if latest is None or latest.graph is None:
            raise TuneError(f"auto_tune got the {type(optimized).__name__} itself, and it has not been optimised "
                            "(and run) yet, or its OptimizedModel is gone (only the latest "
                            f"{KEEP_LATEST} optimised models are kept unless you hold the result): call "
                            "om = pypto_lab.optimize(model, inputs) first, then auto_tune(model) or auto_tune(om)")
        optimized = latest
    graph = getattr(optimized, "graph", None)
    report = optimized.report() if graph is not None else None
    if graph is None or report is None:
        raise TuneError(f"auto_tune needs the result of pypto_lab.optimize(model, inputs, ...), got "
                        f"{type(optimized).__name__}; run om = pypto_lab.optimize(...) and pass om")
    chip = report.chip  # the Chip the model was optimised for (a user's own preset stays that preset)
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
    groups: dict[str, list] = {}   # cache key -> the anchor nodes of identical Cube kernels
    for node in graph.nodes:
        spec = node.kernel
        if not isinstance(spec, CubeKernel):
            continue
        extra = ("|q" if spec.quantize_input else "") + (f"|{spec.tile}" if spec.tile is not None else "")
        key = cache_key(f"{chip.name}@{chip.fingerprint}", spec.batch, spec.m, spec.k, spec.n, spec.dtype,
                        spec.epilogue.label(), cfg["level"], extra)
        groups.setdefault(key, []).append(node)

    rows: list[TuneRow] = []
    sims = screened = 0
    bar = None
    if progress:
        bar = tqdm(total=len(groups), desc="auto_tune", unit="kernel")
    try:
        for key, members in groups.items():
            anchor = members[0]
            spec = anchor.kernel
            name = f"{anchor.npu.name}:{anchor.module or anchor.name}"
            hit = cache.get(key)
            if hit is not None:
                tile = CubeTile(**hit["tile"]) if hit.get("tile") else None
                row = TuneRow(name, float(hit["default_us"]), float(hit["tuned_us"]), tile,
                              int(hit.get("candidates", 0)), 0, True, len(members))
            else:
                scr = screen_space(chip, spec.m, spec.k, spec.n, spec.dtype, spec.batch, _screen_epilogue(spec),
                                   spec.out_dtype, full=cfg["level"] != "fast")
                screened += scr.count
                found = search_tiling(spec, chip, (scr.tile(i) for i in _verify_order(scr, budget, cfg["seed"])),
                                      patience if cfg["early_stop"] else None)
                best, default_us, best_us, trials = found.tile, found.default.time_us, found.best.time_us, found.trials
                sims += trials
                row = TuneRow(name, default_us, best_us, best, scr.count, trials, False, len(members))
                cache[key] = {"tile": best.to_dict() if best else None, "default_us": default_us,
                              "tuned_us": best_us, "candidates": scr.count, "trials": trials}
            if row.tile is not None:
                for a in members:
                    a.kernel = replace(a.kernel, tile=row.tile)
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

    tuned = sum(r.count for r in rows if r.tile is not None)
    note = (f"auto_tune ({cfg['level']}): {tuned} Cube kernels retiled, "
            f"{sum(r.count for r in rows) - tuned} keep their tiling")
    new_report = recost(report, graph, "auto_tune", note)
    try:
        optimized._report = new_report
    except AttributeError:  # an OptimizedModel without a settable report: the result still has it
        pass
    return TuneResult(rows, new_report, cfg["level"], time.perf_counter() - t0, sims, screened,
                      str(path) if path is not None else None, [note])




__all__ = ["auto_tune", "TuneResult", "TuneRow", "TuneError", "TuneCacheWarning", "screen_space", "Screen",
           "best_screened", "default_cache_path"]
