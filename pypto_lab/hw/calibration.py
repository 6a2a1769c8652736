"""Calibration of the chip model against measured micro-benchmarks.

The CSV ``datasets/calibration/ascend_mskpp_microbench.csv`` holds 3,664 rows measured on
Ascend 910B1, 910B3 and 950 (MindStudio mskpp, ``csrc/prof_data/resource910b.cpp``). This module
predicts every row from the constants of a `Chip` -- the very constants the event simulator uses
-- and reports how far the model is from the measurement (`calibrate`, `format_calibration`).
``python -m pypto_lab.hw.fit`` fits those constants to the CSV.

How the model reads a row (worked out from the data; see datasets/calibration/README.md)
--------------------------------------------------------------------------------------

``mmad`` -- ``value`` is operations per cycle, one MAC = 2 operations. One MMAD of m x k x n costs
``cube.startup_cycles + ceil(m/m0) * ceil(k/k0) * ceil(n/n0)`` cycles (one fractal per cycle,
fractal shape of the first input dtype), so ``value = 2*m*k*n / cycles``.

``vector`` -- ``x`` is the element count. Where the source row has ``total_cycles``, its ``value``
is ``x * bytes(first dtype) / total_cycles`` for nearly every row (VADD FP32: 960 elements,
30.03 cycles, value 127.9 = 960*4/30.03; VEXP FP16: 1920 elements, 58.46 cycles, value 65.68 =
1920*2/58.46). So the "operations" per cycle of the source are *bytes of the first operand per
cycle*, not elements: VADD plateaus at 128 for fp16 and fp32 alike (two cycles per 256-byte
repeat), one-source instructions such as VADDS/VRELU at 256 (one cycle per repeat). The model is
``repeats = ceil(x * bytes(first dtype) / repeat_bytes)``, ``cycles = VectorTiming.cycles(repeats)
= max(min_cycles, startup_cycles + repeats * cycles_per_repeat)`` and ``value = x *
bytes(first dtype) / cycles``. ``VECTORDUP_<dtypes>`` rows carry their dtypes in the instruction
name and have an empty ``dtypes`` column: they are read as instruction ``VECTORDUP`` with those
dtypes. Known quirks of the source, left as they are: VCONV FP32_FP16 and INT4_FP16 rows use the
bytes of another operand; seven keys (VMLA, VMADDRELU, VREDUCE, VREDUCEV2, VSHL and VGATHERB on
16-bit types) list ``x`` as 64 + 64 i where their cycles say 128 i; VMULS FP16 lists
``total_cycles`` x 1000. A handful of vector rows are failed measurements (VMUL INT16 at 256..640
elements: 87 to 14,000 cycles for 2..5 repeats, value 0.07..5.9; VMULS FP32 at 896 and 960
elements): a vector row whose value is below a tenth of its key's median is reported as
*excluded*, neither fitted nor counted in the error.

``transfer_bursts`` / ``transfer_repeats`` -- ``value`` is GB/s with GB = 2**30 bytes, converted
with the chip clock: ``value = bytes / cycles * clock_hz / 2**30``. (The evidence: on 910B1 at
1850 MHz the plateaus come out at exactly 256 B/cycle for UB_TO_UB and L1_TO_L0A, 128 for
L1_TO_L0B, 64 for UB_TO_GM and 32 for L1_TO_BT / L1_TO_FB.) ``bytes = x * unit_bytes(table,
path)``:

* ``transfer_bursts`` GM_TO_L1, GM_TO_L0A, GM_TO_L0B, UB_TO_UB: x is MiB (the source's
  ``total_data_GB`` is x/1024);
* every other ``transfer_bursts`` path: x is KiB (x stays below the destination's size: L0C_TO_GM
  up to 126 of L0C's 128 KB, L1_TO_L0A/B up to 60 of 64 KB, L1_TO_BT below BiasTable's 1 KB);
* ``transfer_repeats``: one repeat moves 1 KiB (the repeats curve of L1_TO_L0A/B coincides with
  the bursts curve at equal x).

The model of one measured transfer is ``cycles = harness + max(latency, startup + bytes / rate)``.
``startup``, ``rate`` and ``latency`` are the `DataPath` constants the simulator charges per
instruction (``DataPath.cycles``): ``latency_cycles`` is the completion-latency floor of one
transfer (a GM round trip of ~150-330 cycles), which is why small GM transfers' bandwidth rises
linearly with size and then bends sharply into the plateau. ``harness`` is calibration-only: a
fixed cost of the benchmark harness (the MiB-scale GM rows pay about 180,000 cycles whatever
their size -- no pipe start-up is that long), stored per ``table/path`` in the preset's
``[calibration]`` section (the chip loader ignores it), together with per-key latencies for the
keys whose latency differs from their path's (e.g. ``transfer_repeats`` rows). Both default to
the path's own values (0 harness).

Rows of a path the chip has no `DataPath` for (or an instruction / dtype it has no timing for)
are *not covered*: `microbench` raises `NotCovered`, `calibrate` counts and skips them.
``L0C_TO_GM_TRANS`` (FixPipe with NZ->ND conversion) is predicted with the L0C_TO_GM path, whose
rate it shares in the data; ``GM_TO_L1_TRANS`` (ND->NZ on MTE2, a saw-tooth in the data) is not
modelled.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from .chip import DTYPE_BYTES, Chip, get_chip

CSV_PATH = Path(__file__).resolve().parents[2] / "datasets/calibration/ascend_mskpp_microbench.csv"

KIB = 1024
MIB = 1024 * 1024
GIB = 1024**3

TRANSFER_TABLES = ("transfer_bursts", "transfer_repeats")

# bytes moved per unit of x, per (table, path); anything else in these tables is KiB
_MIB_PATHS = {
    ("transfer_bursts", "GM_TO_L1"),
    ("transfer_bursts", "GM_TO_L0A"),
    ("transfer_bursts", "GM_TO_L0B"),
    ("transfer_bursts", "UB_TO_UB"),
}
# measured variants predicted with another path's constants
PATH_ALIASES = {"L0C_TO_GM_TRANS": "L0C_TO_GM"}
# measured variants the model does not cover, with the reason
UNMODELLED_PATHS = {
    "GM_TO_L1_TRANS": "GM->L1 with ND->NZ conversion is not modelled as a separate path",
}
# a vector row below this fraction of its key's median value is a failed measurement
VECTOR_FAILED_FRACTION = 0.1


class NotCovered(KeyError):
    """The chip model has no constant for this micro-benchmark row (no such path / instruction)."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else ""


# ---- the CSV ----------------------------------------------------------------------------

def load_microbench(path: str | Path | None = None) -> list[dict]:
    """The calibration CSV as a list of dicts; numeric fields as float (None where empty)."""
    p = Path(path) if path is not None else CSV_PATH
    if not p.exists():
        raise FileNotFoundError(
            f"calibration CSV not found: {p}. It ships in the repository as "
            "datasets/calibration/ascend_mskpp_microbench.csv; run from a checkout of pypto_lab "
            "(pip install -e .) or pass the path of the CSV explicitly."
        )
    rows = []
    with open(p, newline="") as fh:
        for raw in csv.DictReader(fh):
            row: dict[str, Any] = dict(raw)
            for key in ("x", "m", "k", "n", "value", "total_cycles", "total_data_GB", "task_time_us"):
                v = raw.get(key, "")
                row[key] = float(v) if v not in ("", None) else None
            rows.append(row)
    return rows


def row_key(table: str, path_or_instr: str, dtypes: str = "") -> str:
    """``table/path_or_instr/dtypes``, or ``table/path_or_instr`` when dtypes is empty."""
    return f"{table}/{path_or_instr}/{dtypes}" if dtypes else f"{table}/{path_or_instr}"


# ---- pure model formulas (shared with the fit) -------------------------------------------

def dtype_bytes(name: str) -> float:
    """Bytes of a CSV dtype name (``FP16``, ``INT4``, ...)."""
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise NotCovered(f"unknown dtype {name!r}") from None


def vector_instr_dtypes(instr: str, dtypes: str) -> tuple[str, str]:
    """``VECTORDUP_FP16_FP16`` with empty dtypes -> (``VECTORDUP``, ``FP16_FP16``)."""
    if not dtypes and instr.startswith("VECTORDUP_"):
        return "VECTORDUP", instr[len("VECTORDUP_"):]
    return instr, dtypes


def unit_bytes(table: str, path: str) -> int:
    """Bytes per unit of ``x`` for a transfer row (see the module docstring)."""
    if table not in TRANSFER_TABLES:
        raise NotCovered(f"{table!r} is not a transfer table")
    return MIB if (table, path) in _MIB_PATHS else KIB


def transfer_cycles(nbytes, startup, rate, harness=0.0, latency=0.0):
    """Cycles of one measured transfer: ``harness + max(latency, startup + bytes / rate)``."""
    return harness + np.maximum(latency, startup + np.asarray(nbytes, dtype=float) / rate)


def transfer_gbps(nbytes, cycles, clock_hz):
    """GB/s (GB = 2**30 bytes) of ``nbytes`` moved in ``cycles`` at ``clock_hz``."""
    return nbytes / cycles * clock_hz / GIB


def vector_cycles(repeats, cycles_per_repeat, startup, min_cycles, partial_block=0.0, block_repeats=1):
    """`VectorTiming.cycles` on arrays of repeat counts."""
    repeats = np.asarray(repeats, dtype=float)
    base = np.maximum(min_cycles, startup + repeats * cycles_per_repeat)
    return base + partial_block * (np.mod(repeats, block_repeats) != 0)


def vector_repeats(x, elem_bytes, repeat_bytes):
    return np.ceil(np.asarray(x, dtype=float) * elem_bytes / repeat_bytes)


def mmad_fractals(m, k, n, shape):
    m0, k0, n0 = shape
    return math.ceil(m / m0) * math.ceil(k / k0) * math.ceil(n / n0)


# ---- calibration-only constants of a preset ----------------------------------------------

_CAL_CACHE: dict[tuple[str, float], dict] = {}


def calibration_constants(chip: Chip) -> dict[str, dict[str, float]]:
    """The preset's ``[calibration]`` section: ``{"harness_cycles": {key: v}, "latency_cycles": ...}``
    with ``{value, source}`` unwrapped. Empty when the preset has none."""
    path = getattr(chip, "path", "")
    if not path or not os.path.exists(path):
        return {}
    stamp = (path, os.path.getmtime(path))
    if stamp not in _CAL_CACHE:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
        out: dict[str, dict[str, float]] = {}
        for group, table in doc.get("calibration", {}).items():
            if isinstance(table, dict):
                out[group] = {
                    k: float(v["value"] if isinstance(v, dict) else v) for k, v in table.items()
                }
        _CAL_CACHE[stamp] = out
    return _CAL_CACHE[stamp]


# ---- the model's prediction for one row ------------------------------------------------

def microbench(chip: Chip | str, table: str, path_or_instr: str, dtypes: str = "",
               x: float | None = None, m: float | None = None, k: float | None = None,
               n: float | None = None) -> float:
    """The model's prediction for one CSV row, in the CSV's unit: GB/s (2**30 bytes) for the
    transfer tables, operations per cycle for ``mmad`` (one MAC = 2 operations) and ``vector``
    (bytes of the first operand per cycle, see the module docstring).

    Raises `NotCovered` if the chip has no constant for the row's path, instruction or dtype."""
    chip = get_chip(chip)
    if table == "mmad":
        if None in (m, k, n):
            raise ValueError("mmad rows need m, k and n")
        dt = (dtypes.split("_")[0] if dtypes else "fp16").lower()
        if dt not in chip.cube.fractals:
            raise NotCovered(f"{chip.name}: the Cube has no fractal for dtype {dt!r} "
                             f"(it has {', '.join(chip.cube.fractals)})")
        cycles = chip.cube.startup_cycles + mmad_fractals(m, k, n, chip.cube.fractals[dt])
        return 2.0 * m * k * n / cycles

    if table == "vector":
        if x is None:
            raise ValueError("vector rows need x (the element count)")
        instr, dts = vector_instr_dtypes(path_or_instr, dtypes)
        by_dtype = chip.vector.instructions.get(instr)
        if by_dtype is None:
            raise NotCovered(f"{chip.name}: no vector timing for instruction {instr!r}")
        if dts not in by_dtype:
            raise NotCovered(f"{chip.name}: no vector timing for {instr} with dtypes {dts!r} "
                             f"(it has {', '.join(by_dtype)})")
        t = by_dtype[dts]
        eb = dtype_bytes(dts.split("_")[0])
        reps = float(vector_repeats(x, eb, chip.vector.repeat_bytes))
        cycles = float(t.cycles(reps))
        return x * eb / cycles

    if table in TRANSFER_TABLES:
        if x is None:
            raise ValueError("transfer rows need x")
        if path_or_instr in UNMODELLED_PATHS:
            raise NotCovered(f"{chip.name}: {path_or_instr}: {UNMODELLED_PATHS[path_or_instr]}")
        name = PATH_ALIASES.get(path_or_instr, path_or_instr)
        dp = chip.paths.get(name)
        if dp is None:
            raise NotCovered(f"{chip.name} has no data path {name!r}; it has {', '.join(chip.paths)}")
        cal = calibration_constants(chip)
        key = row_key(table, path_or_instr)
        harness = cal.get("harness_cycles", {}).get(key, 0.0)
        latency = cal.get("latency_cycles", {}).get(key, dp.latency_cycles)
        nbytes = x * unit_bytes(table, path_or_instr)
        cycles = float(transfer_cycles(nbytes, dp.startup_cycles, dp.bytes_per_cycle, harness, latency))
        return float(transfer_gbps(nbytes, cycles, chip.clock_hz))

    raise NotCovered(f"unknown micro-benchmark table {table!r}")


# ---- comparing the model with the measurements ------------------------------------------

def failed_vector_rows(rows: list[dict]) -> set[int]:
    """Indices (into ``rows``) of vector rows that are failed measurements (see docstring)."""
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if r["table"] == "vector":
            by_key[(r["chip"], r["path_or_instr"], r["dtypes"])].append(i)
    out = set()
    for idx in by_key.values():
        vals = sorted(rows[i]["value"] for i in idx)
        median = vals[len(vals) // 2]
        out.update(i for i in idx if rows[i]["value"] < VECTOR_FAILED_FRACTION * median)
    return out


def calibrate(chip: Chip | str, rows: list[dict] | None = None) -> dict:
    """Compare the model with every CSV row of ``chip`` (matched by name) that it covers.

    Returns ``{key: {"rows": n, "mape": pct, "max_ape": pct}}`` with key
    ``table/path_or_instr/dtypes`` (``table/path`` for transfers), APE = |pred - meas| / meas *
    100, plus ``"_totals": {"covered", "not_covered", "excluded", "not_covered_keys"}``."""
    chip = get_chip(chip)
    rows = load_microbench() if rows is None else rows
    failed = failed_vector_rows(rows)
    errs: dict[str, list[float]] = defaultdict(list)
    not_covered: dict[str, int] = defaultdict(int)
    excluded = 0
    for i, r in enumerate(rows):
        if r["chip"] != chip.name:
            continue
        key = row_key(r["table"], r["path_or_instr"], r["dtypes"])
        if i in failed:
            excluded += 1
            continue
        try:
            pred = microbench(chip, r["table"], r["path_or_instr"], r["dtypes"],
                              x=r["x"], m=r["m"], k=r["k"], n=r["n"])
        except NotCovered:
            not_covered[key] += 1
            continue
        errs[key].append(abs(pred - r["value"]) / r["value"] * 100.0)
    result: dict[str, Any] = {
        key: {"rows": len(e), "mape": sum(e) / len(e), "max_ape": max(e)} for key, e in sorted(errs.items())
    }
    result["_totals"] = {
        "chip": chip.name,
        "covered": sum(len(e) for e in errs.values()),
        "not_covered": sum(not_covered.values()),
        "excluded": excluded,
        "not_covered_keys": dict(sorted(not_covered.items())),
    }
    return result


def format_calibration(result: dict) -> str:
    """A readable table of a `calibrate` result, sorted by key, with a totals line."""
    keys = sorted(k for k in result if not k.startswith("_"))
    width = max([len(k) for k in keys] + [len("key")])
    lines = [f"{'key':<{width}}  {'rows':>5}  {'MAPE %':>7}  {'max APE %':>9}"]
    lines.append("-" * len(lines[0]))
    for k in keys:
        e = result[k]
        lines.append(f"{k:<{width}}  {e['rows']:>5}  {e['mape']:>7.2f}  {e['max_ape']:>9.2f}")
    tot = result.get("_totals", {})
    if keys:
        n = sum(result[k]["rows"] for k in keys)
        pooled = sum(result[k]["mape"] * result[k]["rows"] for k in keys) / n
        lines.append("-" * len(lines[0]))
        lines.append(f"{'all covered rows':<{width}}  {n:>5}  {pooled:>7.2f}  "
                     f"{max(result[k]['max_ape'] for k in keys):>9.2f}")
    lines.append(
        f"rows covered: {tot.get('covered', 0)}, not covered: {tot.get('not_covered', 0)}, "
        f"excluded as failed measurements: {tot.get('excluded', 0)}"
    )
    for k, c in tot.get("not_covered_keys", {}).items():
        lines.append(f"  not covered: {k} ({c} rows)")
    return "\n".join(lines)
