"""Design-space sweeps: `optimize` run over models x chip variants x batches x levels on Dask, one
row per design point in a pandas DataFrame (`sweep`); its Pareto fronts (`pareto`, `plot_pareto`).

A variant is a preset with some constants changed (``{"l1_kb": [256, 1024], "hbm_gbps": [...]}``,
`VARIANT_KEYS`): `variant_chip` edits the preset's TOML document and validates it through the
same loader as any preset (`pypto_lab.hw.chip.chip_from_document`), so an impossible value gets
the preset's own error. The points run on ``dask.distributed``: a `LocalCluster` of processes by
default, the cluster of ``client=`` or of ``scheduler="tcp://host:8786"`` otherwise. Workers
build the models themselves (only names, builder functions and preset documents are shipped)
and each point's row is cached on disk, keyed by model, the chip's fingerprint, batch, level,
precision and the versions of pypto_lab and torch, so a rerun computes only new points.

``area_mm2`` is a *relative* silicon-area proxy, not a floor plan: see `area_proxy_mm2`.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hw.chip import PRESET_DIR, Chip, ChipConfigError, chip_from_document, list_chips, read_preset_document

# ---- variant keys -----------------------------------------------------------------------

# key -> (place in the preset document, multiplier to the document's unit, meaning)
VARIANT_KEYS: dict[str, tuple[tuple[str, ...], int, str]] = {
    "l1_kb": (("buffers", "L1", "size_bytes"), 1024, "L1 buffer of each AI Core, KB"),
    "l0a_kb": (("buffers", "L0A", "size_bytes"), 1024, "L0A buffer of each AI Core, KB"),
    "l0b_kb": (("buffers", "L0B", "size_bytes"), 1024, "L0B buffer of each AI Core, KB"),
    "l0c_kb": (("buffers", "L0C", "size_bytes"), 1024, "L0C buffer of each AI Core, KB"),
    "ub_kb": (("buffers", "UB", "size_bytes"), 1024, "Unified Buffer of each vector core, KB"),
    "l2_mb": (("chip", "l2_bytes"), 2**20, "L2 cache, MB"),
    "l2_gbps": (("chip", "l2_gbps"), 1, "L2 bandwidth, GB/s"),
    "hbm_gbps": (("chip", "hbm_gbps"), 1, "HBM bandwidth, GB/s"),
    "hbm_gb": (("chip", "hbm_bytes"), 2**30, "HBM capacity, GB"),
    "hbm_mixed_loss": (("chip", "hbm_mixed_loss"), 1, "share of HBM bandwidth lost to equal reads and writes"),
    "ai_cores": (("chip", "cube_cores"), 1, "AI Cores (AIC), vector cores kept at the preset's AIC:AIV ratio"),
    "cube_cores": (("chip", "cube_cores"), 1, "AI Cores with a Cube (AIC) alone"),
    "vector_cores": (("chip", "vector_cores"), 1, "vector cores (AIV)"),
    "clock_mhz": (("chip", "clock_mhz"), 1, "AI Core clock, MHz"),
}

LEVEL_CHOICES = (0, 1, 2, 3)
PRECISION_CHOICES = ("fp32", "fp16", "bf16", "int8")
CACHE_FORMAT = 2


class SweepError(ValueError):
    """A sweep's arguments break a rule; the message names the rule, the value and a fix."""


def _format_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def variant_name(base: str, values: Mapping[str, Any]) -> str:
    """``"Ascend910B1+l1_kb=1024,hbm_gbps=3200"`` (the base name alone without values)."""
    if not values:
        return base
    return base + "+" + ",".join(f"{k}={_format_value(v)}" for k, v in values.items())


def _check_key(key: str) -> None:
    if key not in VARIANT_KEYS:
        raise SweepError(f"variant key {key!r} is not known: a variant changes one constant of a preset; "
                         f"valid keys: {', '.join(VARIANT_KEYS)}")


def _document_value(key: str, value: Any) -> Any:
    """The value as the preset document holds it (KB -> bytes ...); integral results as int."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SweepError(f"variant {key} = {value!r}: must be a number ({VARIANT_KEYS[key][2]}); "
                         f"fix: write e.g. {key}=[256, 512]")
    scaled = value * VARIANT_KEYS[key][1]
    if isinstance(scaled, float) and scaled.is_integer() and VARIANT_KEYS[key][1] != 1:
        return int(scaled)
    return scaled


@dataclass(frozen=True)
class BaseChip:
    """Where a variant comes from: a shipped preset by name, or a preset document (a user's file)."""

    name: str
    preset: str | None = None        # a shipped preset's name: workers read their own copy
    document: Any = None             # otherwise the TOML document itself, shipped to the workers
    label: str = ""

    def read(self) -> dict[str, Any]:
        """The document, shared: never change it in place (`_derive` copies what it changes)."""
        if self.preset is not None:
            return _preset_document(self.preset)
        return self.document


_DOCS: dict[tuple[str, int], dict[str, Any]] = {}   # parsed shipped presets (parsing is most of a point's cost)


def _preset_document(name: str) -> dict[str, Any]:
    path = PRESET_DIR / f"{name}.toml"
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _DOCS:
        _DOCS[key] = read_preset_document(path)
    return _DOCS[key]


def _with(doc: dict[str, Any], where: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``doc[where[0]]...[where[-1]] = value``: the tables along the way
    copied, the rest shared."""
    out = dict(doc)
    table = out
    for part in where[:-1]:
        inner = table.get(part)
        table[part] = dict(inner) if isinstance(inner, dict) else {}
        table = table[part]
    table[where[-1]] = value
    return out


def resolve_base(chip: str | Path | Chip) -> BaseChip:
    """A chip given to `sweep` as the preset document it is derived from."""
    if isinstance(chip, Chip):
        if not chip.path or not Path(chip.path).is_file():
            raise SweepError(f"chip {chip.name!r} has no preset file (path={chip.path!r}): sweep derives variants "
                             "from preset documents; fix: save it as a .toml preset and pass its path or name")
        base = resolve_base(chip.path)
        if chip_from_document(base.read(), base.label).fingerprint != chip.fingerprint:
            raise SweepError(f"chip {chip.name!r} differs from its preset file {chip.path} (it was changed in "
                             "memory); fix: pass the changes as variants=..., or save them in a preset file")
        return base
    key = str(chip)
    if key in list_chips():
        return BaseChip(key, preset=key, label=str(PRESET_DIR / f"{key}.toml"))
    path = Path(key)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise SweepError(f"chip {key!r}: no such preset file; fix: pass a shipped preset "
                             f"({', '.join(list_chips())}) or the path of a .toml preset")
        doc = read_preset_document(path)
        name = chip_from_document(doc, str(path)).name
        return BaseChip(name, document=doc, label=str(path))
    raise SweepError(f"chip {key!r} is not known; fix: use one of {', '.join(list_chips())}, "
                     "the path of a .toml preset or a Chip loaded from one")


def _derive(base: BaseChip, values: Mapping[str, Any]) -> Chip:
    doc = base.read()
    name = variant_name(base.name, values)
    if "ai_cores" in values and {"cube_cores", "vector_cores"} & set(values):
        raise SweepError("variants ai_cores and cube_cores / vector_cores both given: ai_cores sets both; "
                         "fix: vary ai_cores, or cube_cores and vector_cores, not both")
    for key, value in values.items():
        _check_key(key)
        if key == "ai_cores":
            chip_table = doc.get("chip", {})
            plain = [chip_table.get(k) for k in ("vector_cores", "cube_cores")]
            plain = [v["value"] if isinstance(v, dict) else v for v in plain]
            if all(isinstance(v, int) and v > 0 for v in plain) and isinstance(value, (int, float)):
                doc = _with(doc, ("chip", "vector_cores"),
                            {"value": round(value * plain[0] / plain[1]), "source": f"sweep variant of "
                             f"{base.name}: ai_cores, at the preset's {plain[1]}:{plain[0]} AIC:AIV ratio"})
        doc = _with(doc, VARIANT_KEYS[key][0],
                    {"value": _document_value(key, value), "source": f"sweep variant of {base.name}: {key}"})
    if values:
        doc = _with(doc, ("chip", "name"), {"value": name, "source": f"sweep variant of {base.name}"})
    label = f"{name} (derived from {base.label})" if values else base.label
    return chip_from_document(doc, label, "" if values else base.label)


def variant_chip(chip: str | Path | Chip, **values: Any) -> Chip:
    """The chip ``chip`` with the constants of ``values`` changed (`VARIANT_KEYS`), validated like any
    preset: ``variant_chip("Ascend910B1", l1_kb=1024)`` is ``Ascend910B1+l1_kb=1024``. An impossible
    value raises the preset loader's `ChipConfigError`."""
    for key in values:
        _check_key(key)
    return _derive(resolve_base(chip), values)


# ---- area proxy ----------------------------------------------------------------------

# TSMC's 7 nm high-density SRAM bit cell is 0.027 um^2 (TSMC, IEDM 2016, "A 7nm CMOS platform
# technology featuring 4th generation FinFET transistors with a 0.027um2 high density 6-T SRAM
# cell"); with an assumed 70 % array efficiency one MB (2^23 bits) takes 0.027e-6 * 2^23 / 0.7 mm^2.
SRAM_BITCELL_UM2 = 0.027
SRAM_ARRAY_EFFICIENCY = 0.7  # assumption
SRAM_MM2_PER_MB = SRAM_BITCELL_UM2 * 1e-6 * 8 * 2**20 / SRAM_ARRAY_EFFICIENCY
# Assumptions, not published figures: logic of one 4,096-MAC (fp16 16x16x16) Cube core, of one
# vector core, and the HBM PHY + controller per GB/s. They make the proxy relative: compare points
# computed with the same constants, never with a real die's mm^2.
CUBE_MM2_PER_4096_MACS = 2.5
VECTOR_CORE_MM2 = 0.5
HBM_PHY_MM2_PER_GBPS = 10.0 / 460.0  # ~10 mm^2 for one ~460 GB/s HBM2e stack (assumption)


def area_proxy_mm2(chip: Chip) -> float:
    """A relative silicon-area proxy of ``chip`` in mm^2-like units:

    ``cube_cores x (fp16 MACs/cycle / 4096) x CUBE_MM2_PER_4096_MACS + vector_cores x VECTOR_CORE_MM2
    + SRAM MB x SRAM_MM2_PER_MB + hbm_gbps x HBM_PHY_MM2_PER_GBPS``, where SRAM counts L1, L0A/B/C,
    BT and FB of every AI Core, the UB of every vector core (of every AI Core on chips without
    separate vector cores) and L2. The SRAM density is TSMC's published 7 nm bit cell; the logic
    and PHY constants are assumptions, so the figure ranks design points, it is not a die size.
    The clock does not enter (it costs power, not area)."""
    dtype = "fp16" if chip.cube.supports("fp16") else next(iter(chip.cube.fractals))
    macs = chip.cube.macs_per_cycle(dtype)
    vec_cores = chip.vector_cores if chip.split_cores else 0
    ub_cores = chip.vector_cores if chip.split_cores else chip.cube_cores
    per_aic = sum(b.size_bytes for n, b in chip.buffers.items() if n != "UB")
    ub = chip.buffers["UB"].size_bytes if "UB" in chip.buffers else 0
    sram_mb = (chip.cube_cores * per_aic + ub_cores * ub + chip.l2_bytes) / 2**20
    return (chip.cube_cores * macs / 4096 * CUBE_MM2_PER_4096_MACS + vec_cores * VECTOR_CORE_MM2
            + sram_mb * SRAM_MM2_PER_MB + chip.hbm_gbps * HBM_PHY_MM2_PER_GBPS)


# ---- models ---------------------------------------------------------------------------

def mlp(batch: int = 8):
    """A 1024 -> 4096 -> 1024 GELU MLP on ``batch`` rows: at small batches it streams its 8 M weights
    and is bound by HBM bandwidth."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).eval()
    return model, (torch.randn(batch, 1024),)


def resnet18(batch: int = 1):
    import torch
    import torchvision

    return torchvision.models.resnet18().eval(), (torch.randn(batch, 3, 224, 224),)


def _zoo(name: str) -> Callable:
    def build(batch: int = 1):
        from ..models.zoo import load_model

        return load_model(name, batch=batch)
    build.__name__ = name
    return build


SWEEP_MODELS: dict[str, Callable] = {
    "mlp": mlp, "resnet18": resnet18, "resnet50": _zoo("resnet50"), "bert-base": _zoo("bert-base"),
    "minilm": _zoo("minilm"),
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    builder: Any     # a SWEEP_MODELS name (str) or a callable(batch=...) -> (model, inputs)
    key: str         # what the cache knows it by


def _callable_key(name: str, fn: Callable) -> str:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = ""
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    return f"callable:{name}:{where}:{hashlib.sha1(src.encode()).hexdigest()[:12]}"


def resolve_models(models) -> list[ModelSpec]:
    if isinstance(models, (str, Callable)) and not isinstance(models, Mapping):
        models = [models]
    items = list(models.items()) if isinstance(models, Mapping) else [(None, m) for m in models]
    if not items:
        raise SweepError("models = []: a sweep needs at least one model; fix: e.g. models=['mlp', 'resnet18']")
    specs = []
    for name, m in items:
        if isinstance(m, str):
            if m not in SWEEP_MODELS:
                raise SweepError(f"model {m!r} is not known; fix: use one of {', '.join(SWEEP_MODELS)}, or pass "
                                 "a function batch -> (model, example_inputs)")
            specs.append(ModelSpec(name or m, m, f"zoo:{m}"))
        elif callable(m):
            label = name or getattr(m, "__name__", "")
            if not label or label == "<lambda>":
                raise SweepError(f"model {m!r} has no name to put in the table; fix: pass models={{'name': fn}}")
            specs.append(ModelSpec(label, m, _callable_key(label, m)))
        else:
            raise SweepError(f"model {m!r}: must be a name ({', '.join(SWEEP_MODELS)}) or a function "
                             "batch -> (model, example_inputs)")
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SweepError(f"model name {dup[0]!r} is given twice; fix: name each model once (models={{'a': fn, ...}})")
    return specs


# ---- points ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    model: ModelSpec
    base: BaseChip
    values: tuple[tuple[str, Any], ...]
    batch: int
    level: int
    precision: str
    chip_name: str
    fingerprint: str
    energy_key: str = ""   # the chip's energy constants, if it has any (not in its timing fingerprint)

    def describe(self) -> str:
        return f"{self.model.name} on {self.chip_name}, batch {self.batch}, level {self.level}, {self.precision}"


def _as_list(name: str, value, check) -> list:
    values = list(value) if isinstance(value, (list, tuple, range)) else [value]
    if not values:
        raise SweepError(f"{name} = []: needs at least one value; fix: e.g. {name}=[{check.__doc__}]")
    for v in values:
        check(v)
    return values


def _check_batch(b):
    """1"""
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise SweepError(f"batch {b!r}: must be a positive integer; fix: e.g. batch=[1, 8]")


def _check_level(v):
    """1"""
    if isinstance(v, bool) or v not in LEVEL_CHOICES:
        raise SweepError(f"level {v!r} is not known; fix: use levels from {LEVEL_CHOICES}")


def _check_precision(p):
    """'fp16'"""
    if p not in PRECISION_CHOICES:
        raise SweepError(f"precision {p!r} is not known; fix: use one of {', '.join(PRECISION_CHOICES)}")


def _variant_grid(variants: Mapping[str, Any] | None) -> list[tuple[tuple[str, Any], ...]]:
    if not variants:
        return [()]
    if not isinstance(variants, Mapping):
        raise SweepError(f"variants = {variants!r}: must be a dict key -> list of values; "
                         "fix: e.g. variants={'hbm_gbps': [800, 1600]}")
    lists = []
    for key, vals in variants.items():
        _check_key(key)
        vals = list(vals) if isinstance(vals, (list, tuple, range)) else [vals]
        if not vals:
            raise SweepError(f"variant {key} = []: needs at least one value; fix: e.g. {key}=[...] or leave it out")
        for v in vals:
            _document_value(key, v)
        lists.append([(key, v) for v in vals])
    return [tuple(combo) for combo in itertools.product(*lists)]


def _energy_key(chip: Chip) -> str:
    """A hash of the chip's energy table when its Chip has one (`Chip.fingerprint` covers timing
    constants only), so a changed energy constant is not answered from the cache."""
    energy = getattr(chip, "energy", None)
    return "" if energy is None else hashlib.sha1(repr(energy).encode()).hexdigest()[:12]


def design_points(models, chips, variants=None, batch=1, level=1, precision="fp16") -> list[Point]:
    """Every point of the grid, in table order; every variant chip derived and validated here."""
    specs = resolve_models(models)
    chip_list = [chips] if isinstance(chips, (str, Path, Chip)) else list(chips)
    if not chip_list:
        raise SweepError("chips = []: a sweep needs at least one preset; fix: e.g. chips=['Ascend910B1']")
    bases = [resolve_base(c) for c in chip_list]
    grid = _variant_grid(variants)
    batches = _as_list("batch", batch, _check_batch)
    levels = _as_list("level", level, _check_level)
    precisions = _as_list("precision", precision, _check_precision)
    derived: dict[tuple, Chip] = {}
    for base in bases:
        for values in grid:
            derived[(base.label, values)] = _derive(base, dict(values))
    points = []
    for spec, base, values, b, lv, p in itertools.product(specs, bases, grid, batches, levels, precisions):
        chip = derived[(base.label, values)]
        points.append(Point(spec, base, values, b, lv, p, chip.name, chip.fingerprint, _energy_key(chip)))
    return points


# ---- one point, on a worker -----------------------------------------------------------

_MODELS: OrderedDict = OrderedDict()   # (model key, batch) -> (model, inputs): one worker's built models
_MODELS_KEPT = 4


def _build_model(spec: ModelSpec, batch: int):
    key = (spec.key, batch)
    if key in _MODELS:
        _MODELS.move_to_end(key)
        return _MODELS[key]
    builder = SWEEP_MODELS[spec.builder] if isinstance(spec.builder, str) else spec.builder
    result = builder(batch=batch)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise SweepError(f"model {spec.name}: its builder returned {type(result).__name__}; "
                         "fix: return (model, example_inputs)")
    model, inputs = result
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    _MODELS[key] = (model, inputs)
    while len(_MODELS) > _MODELS_KEPT:
        _MODELS.popitem(last=False)
    return model, inputs


def _bound_shares(report) -> dict[str, float]:
    """Share of kernel time bound by the Cube, the Vector units and GM bandwidth (roofline)."""
    shares = {"cube": 0.0, "vector": 0.0, "memory": 0.0}
    for k in report.kernels:
        if k.unit == "cpu" or not k.reports:
            continue
        memory = sum(r.time_us for r in k.reports if r.bound == "memory")
        total = sum(r.time_us for r in k.reports) or 1.0
        frac = memory / total
        shares["memory"] += k.time_us * frac
        shares["cube" if "cube" in str(k.unit) else "vector"] += k.time_us * (1 - frac)
    total = sum(shares.values())
    return {f"{u}_bound_share": (v / total if total else 0.0) for u, v in shares.items()}


def run_point(point: Point) -> dict[str, Any]:
    """Simulate one design point (on a worker: the model is built here, the chip derived here)."""
    from ..compiler.optimize import optimize

    chip = _derive(point.base, dict(point.values))
    if chip.fingerprint != point.fingerprint:
        raise SweepError(f"{point.describe()}: this worker derives a different chip (fingerprint "
                         f"{chip.fingerprint}, the client's {point.fingerprint}); fix: install the same "
                         "pypto_lab version on the workers as on the client")
    model, inputs = _build_model(point.model, point.batch)
    start = time.perf_counter()
    report = optimize(model, inputs, chip=chip, level=point.level, precision=point.precision).report()
    seconds = time.perf_counter() - start
    shares = _bound_shares(report)
    bound = max(shares, key=shares.get).removesuffix("_bound_share")
    energy = getattr(report, "energy_mj", None)
    return {
        "latency_us": float(report.latency_us), "throughput_per_s": float(report.throughput_per_s),
        "energy_mj": None if energy is None else float(energy),
        "peak_memory_bytes": int(report.peak_memory_bytes), "gm_bytes": float(report.gm_bytes),
        **shares, "bound": bound, "area_mm2": area_proxy_mm2(chip),
        "peak_fp16_tflops": chip.peak_tflops("fp16"), "seconds": seconds,
    }


# ---- cache ----------------------------------------------------------------------------

def default_cache_dir() -> Path:
    """``$PYPTO_LAB_SWEEP_CACHE``, else ``~/.cache/pypto_lab/sweep``."""
    env = os.environ.get("PYPTO_LAB_SWEEP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pypto_lab" / "sweep"


def cache_key(point: Point) -> str:
    from importlib.metadata import version

    import torch

    __version__ = version("pypto_lab")

    key = {"format": CACHE_FORMAT, "pypto_lab": __version__, "torch": torch.__version__,
           "model": point.model.key, "chip": point.chip_name, "fingerprint": point.fingerprint,
           "energy": point.energy_key,
           "batch": point.batch, "level": point.level, "precision": point.precision}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def _read_cache(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None   # missing or unreadable: computed again


# ---- the sweep ------------------------------------------------------------------------

def _worker_env() -> dict[str, str]:
    """Environment of LocalCluster's worker processes: one numba thread each (a worker runs one
    point at a time), the caller's numba cache and verification switches passed on."""
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for name in ("NUMBA_CACHE_DIR", "PYPTO_LAB_VERIFY", "PYTHONPATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _open_client(client, scheduler, n_workers, todo: int):
    """(client, things to close afterwards)."""
    if client is not None and scheduler is not None:
        raise SweepError("both client= and scheduler= given; fix: pass one (a dask Client, or its scheduler address)")
    if client is not None:
        return client, []
    from distributed import Client, LocalCluster

    if scheduler is not None:
        if not isinstance(scheduler, str) or "://" not in scheduler:
            raise SweepError(f"scheduler = {scheduler!r}: must be a scheduler address; "
                             "fix: e.g. scheduler='tcp://host:8786' (what dask-scheduler prints)")
        c = Client(scheduler)
        return c, [c]
    if n_workers is None:
        n_workers = max(1, min(os.cpu_count() or 1, todo))
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise SweepError(f"n_workers = {n_workers!r}: must be a positive integer; fix: e.g. n_workers=2")
    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                           env=_worker_env())
    c = Client(cluster)
    return c, [c, cluster]


def sweep(models, chips, variants: Mapping[str, Iterable] | None = None, batch=1, level=1, precision="fp16",
          client=None, scheduler: str | None = None, n_workers: int | None = None, cache: bool = True,
          cache_dir: str | Path | None = None, progress: bool = True):
    """Simulate every point of models x chips x variants x batch x level x precision on Dask and
    return a pandas DataFrame, one row per point in that order.

    ``models``: names of `SWEEP_MODELS`, functions ``batch -> (model, example_inputs)`` or a dict
    name -> function (workers call them; nothing big is shipped). ``chips``: preset names, preset
    paths or Chips loaded from them. ``variants``: key -> values of `VARIANT_KEYS`; every
    combination derives a chip from every preset (`variant_chip`). Columns: model, chip, base_chip,
    one per variant key, batch, level, precision, latency_us, throughput_per_s, energy_mj (None
    until the report gives it), peak_memory_bytes, gm_bytes, the cube/vector/memory-bound shares
    of kernel time and the ``bound`` resource, area_mm2 (`area_proxy_mm2`), peak_fp16_tflops,
    seconds (simulation wall time) and from_cache.

    Runs on ``client`` (a ``distributed.Client``), else on the scheduler at ``scheduler``
    (``"tcp://host:8786"``), else on a LocalCluster of ``n_workers`` processes (default: cores,
    at most the points to compute) started and closed here. Rows are cached in ``cache_dir``
    (default `default_cache_dir`) unless ``cache=False``."""
    import pandas as pd

    points = design_points(models, chips, variants, batch, level, precision)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    rows: list[dict | None] = [None] * len(points)
    keys = [cache_key(p) for p in points]
    if cache:
        for i, k in enumerate(keys):
            hit = _read_cache(folder / f"{k}.json")
            if hit is not None:
                rows[i] = {**hit, "from_cache": True}
    todo = [i for i, r in enumerate(rows) if r is None]
    if todo:
        _compute(points, keys, rows, todo, folder if cache else None, client, scheduler, n_workers, progress)
    variant_cols = list(variants or {})
    table = []
    for p, r in zip(points, rows):
        values = dict(p.values)
        table.append({"model": p.model.name, "chip": p.chip_name, "base_chip": p.base.name,
                      **{k: values.get(k) for k in variant_cols},
                      "batch": p.batch, "level": p.level, "precision": p.precision, **r})
    return pd.DataFrame(table)


def _compute(points, keys, rows, todo, folder, client, scheduler, n_workers, progress) -> None:
    from distributed import as_completed

    from ..files.atomic import write_json_atomic

    c, to_close = _open_client(client, scheduler, n_workers, len(todo))
    try:
        futures = {c.submit(run_point, points[i], key=f"pypto-sweep-{keys[i]}", pure=False): i for i in todo}
        bar = None
        if progress:
            from ..files.progress import progress as progress_bar

            bar = progress_bar(total=len(todo), desc="design points", unit="pt")
        try:
            for fut in as_completed(futures):
                i = futures[fut]
                try:
                    row = fut.result()
                except Exception as exc:
                    for other in futures:
                        other.cancel()
                    raise SweepError(f"design point {points[i].describe()} failed on a worker: "
                                     f"{type(exc).__name__}: {exc}") from exc
                if folder is not None:
                    write_json_atomic(folder / f"{keys[i]}.json", row)
                rows[i] = {**row, "from_cache": False}
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
    finally:
        for thing in to_close:
            thing.close()


# ---- Pareto fronts ------------------------------------------------------------------------

def pareto(df, x: str, y: str, by: str | None = None, maximize: Iterable[str] = ()):
    """The rows of ``df`` no other row beats on both ``x`` and ``y`` (lower is better unless the
    column is in ``maximize``), sorted by ``x``; per group of ``by`` when given. Rows with a missing
    ``x`` or ``y`` are left out; of identical points the first is kept."""
    maximize = set(maximize)
    for col in (x, y, *([by] if by else []), *maximize):
        if col not in df.columns:
            raise SweepError(f"column {col!r} is not in the table; fix: use one of {', '.join(map(str, df.columns))}")
    if by is not None:
        import pandas as pd

        parts = [pareto(g, x, y, maximize=maximize) for _, g in df.groupby(by, sort=False)]
        return pd.concat(parts) if parts else df.iloc[0:0]
    data = df.dropna(subset=[x, y])
    sx = -data[x] if x in maximize else data[x]
    sy = -data[y] if y in maximize else data[y]
    order = sorted(range(len(data)), key=lambda i: (sx.iloc[i], sy.iloc[i]))
    keep = []
    best = float("inf")
    for i in order:
        if sy.iloc[i] < best:
            keep.append(i)
            best = sy.iloc[i]
    return data.iloc[keep]


def plot_pareto(df, x: str = "area_mm2", y: str = "latency_us", by: str = "model", ax=None,
                maximize: Iterable[str] = (), logy: bool = False):
    """Every point of ``df`` (faint) and, per ``by`` group, its Pareto front (line), on ``ax``."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for col in (x, y, by):
        if col not in df.columns:
            raise SweepError(f"column {col!r} is not in the table; fix: use one of {', '.join(map(str, df.columns))}")
    for name, group in df.groupby(by, sort=False):
        dots = ax.scatter(group[x], group[y], s=14, alpha=0.35)
        front = pareto(group, x, y, maximize=maximize)
        ax.plot(front[x], front[y], "o-", color=dots.get_facecolor()[0][:3], label=f"{name} (front)")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if logy:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    return ax


__all__ = ["CUBE_MM2_PER_4096_MACS", "HBM_PHY_MM2_PER_GBPS", "SRAM_MM2_PER_MB", "SWEEP_MODELS", "VARIANT_KEYS", "mlp",
           "resnet18",
           "ChipConfigError", "SweepError", "area_proxy_mm2", "cache_key", "default_cache_dir", "design_points",
           "pareto", "plot_pareto", "run_point", "sweep", "variant_chip", "variant_name"]
