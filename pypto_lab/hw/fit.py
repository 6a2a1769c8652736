"""Fit the chip presets' pipe constants to the measured micro-benchmarks.

    python -m pypto_lab.hw.fit            # refit and rewrite the fitted block of every preset
    python -m pypto_lab.hw.fit --check    # exit 1 if rewriting would change a preset

Only datasets/calibration/ascend_mskpp_microbench.csv is used (numpy only, no scipy). For
Ascend910B1 and Ascend910B3 every constant with rows of its own is fitted from that chip's rows;
910B3 carries 910B1's value where it has none (the source string says so). Ascend910A and
Ascend310P3 have no public measurements: their per-cycle rates, start-ups and vector timings are
carried over from the 910B1 fit, paths 910B1 lacks take [ge] AICoreMemoryRates.

Models (see `pypto_lab.hw.calibration` for how a row is read):

* MMAD: one parameter, ``cube.startup_cycles`` (one fractal per cycle is fixed by the fractals).
* vector, per (instruction, dtypes): ``cycles_per_repeat``, ``startup_cycles``, ``min_cycles``;
  for the mask-writing compares (VCMPV, VCMPVS) also ``partial_block_cycles`` (``block_repeats``
  follows from the dtype: a 1-bit-per-element mask fills a 32-B block every ``bytes(dtype)`` repeats).
* transfers, per path: the DataPath's ``startup_cycles`` and ``bytes_per_cycle``, shared by all
  tables measuring that path, plus per ``table/path`` a ``latency_cycles`` floor and, for the
  MiB-scale GM rows, a ``harness_cycles`` fixed cost (their pipe start-up is not identifiable
  under a ~180,000-cycle harness cost, so it is taken from the same chip's GM_TO_UB fit: same
  pipe, same source memory). The DataPath's own ``latency_cycles`` (which the simulator charges)
  is that of the path's first key no harness cost hides; ``[calibration.latency_cycles]`` keeps
  the other keys' values.

Each key is fitted by Nelder-Mead on the mean absolute relative error; transfers add the mean
relative error of the upper half of x (the plateau) to the objective, since the steady rate is
what makes simulated kernels fast or slow. Constants are rounded to 4 significant digits and the
MAPE in every source string is computed with the rounded values.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict

import numpy as np

from ..files.atomic import write_text_atomic
from .calibration import (
    CSV_PATH,
    PATH_ALIASES,
    UNMODELLED_PATHS,
    dtype_bytes,
    failed_vector_rows,
    load_microbench,
    mmad_fractals,
    row_key,
    transfer_cycles,
    transfer_gbps,
    unit_bytes,
    vector_cycles,
    vector_instr_dtypes,
    vector_repeats,
)
from .chip import PRESET_DIR

BEGIN = "# ---- fitted: begin"
BEGIN_LINE = "# ---- fitted: begin (written by `python -m pypto_lab.hw.fit` from the mskpp CSV; do not edit by hand) ----"
END_LINE = "# ---- fitted: end ----"

REPEAT_BYTES = 256
FIT_CMD = "fit: python -m pypto_lab.hw.fit"
CSV_NAME = "datasets/calibration/ascend_mskpp_microbench.csv"

# ---- the paths each core version needs: name -> (src, dst, pipe, source of the route) -------
_ROUTE = "[ascendc] data paths and pipes"
PATHS_220 = {
    "GM_TO_L1": ("GM", "L1", "MTE2", f"{_ROUTE}: GM -MTE2-> L1"),
    "GM_TO_UB": ("GM", "UB", "MTE2", f"{_ROUTE}: GM -MTE2-> UB"),
    "GM_TO_L0A": ("GM", "L0A", "MTE2", "[ascendc] LoadData GM -> L0A on MTE2; measured in [mskpp]"),
    "GM_TO_L0B": ("GM", "L0B", "MTE2", "[ascendc] LoadData GM -> L0B on MTE2; measured in [mskpp]"),
    "L1_TO_L0A": ("L1", "L0A", "MTE1", f"{_ROUTE}: L1 -MTE1-> L0A"),
    "L1_TO_L0B": ("L1", "L0B", "MTE1", f"{_ROUTE}: L1 -MTE1-> L0B"),
    "L1_TO_BT": ("L1", "BT", "MTE1", "[ascendc] DataCopy L1 -> BiasTable on MTE1 (AIC-C-220); measured in [mskpp]"),
    "L1_TO_FB": ("L1", "FB", "MTE1", "[ascendc] DataCopy L1 -> FixPipe buffer on MTE1 (AIC-C-220); measured in [mskpp]"),
    "L0C_TO_GM": ("L0C", "GM", "FIXP", f"{_ROUTE}: on AIC-C-220 L0C leaves through FixPipe to GM"),
    "L0C_TO_L1": ("L0C", "L1", "FIXP", f"{_ROUTE}: on AIC-C-220 L0C leaves through FixPipe to GM or L1"),
    "UB_TO_GM": ("UB", "GM", "MTE3", f"{_ROUTE}: UB -MTE3-> GM"),
    "UB_TO_UB": ("UB", "UB", "VECTOR", "[ascendc] DataCopy UB -> UB runs on the Vector unit; measured in [mskpp]"),
}
PATHS_100 = {
    "GM_TO_L1": ("GM", "L1", "MTE2", f"{_ROUTE}: GM -MTE2-> L1"),
    "GM_TO_UB": ("GM", "UB", "MTE2", f"{_ROUTE}: GM -MTE2-> UB"),
    "L1_TO_L0A": ("L1", "L0A", "MTE1", f"{_ROUTE}: L1 -MTE1-> L0A"),
    "L1_TO_L0B": ("L1", "L0B", "MTE1", f"{_ROUTE}: L1 -MTE1-> L0B"),
    "L0C_TO_UB": ("L0C", "UB", "VECTOR", f"{_ROUTE}: on AIC-C-100 / AIC-M-200 L0C -> UB goes through the Vector unit"),
    "UB_TO_GM": ("UB", "GM", "MTE3", f"{_ROUTE}: UB -MTE3-> GM"),
    "UB_TO_L1": ("UB", "L1", "MTE3", "[ascendc] UB -> L1 on MTE3 (AIC-C-100 / AIC-M-200, Cube and Vector in one core)"),
    "L1_TO_UB": ("L1", "UB", "MTE1", "[ascendc] L1 -> UB on MTE1 (AIC-C-100 / AIC-M-200, Cube and Vector in one core)"),
}
# rates of paths the 910B1 fit has no counterpart for: [ge] AICoreMemoryRates, B/cycle
GE_RATES = {"L1_TO_UB": 128.0, "L0C_TO_UB": 256.0, "UB_TO_L1": 128.0}
GE_RATE_NAMES = {"L1_TO_UB": "L1->UB", "L0C_TO_UB": "L0C->UB", "UB_TO_L1": "UB->L1"}

FRACTALS_220 = {"fp16": [16, 16, 16], "bf16": [16, 16, 16], "fp32": [16, 8, 16], "int8": [16, 32, 16]}
FRACTALS_100 = {"fp16": [16, 16, 16], "int8": [16, 32, 16]}
FRACTAL_SOURCES = {
    "fp16": "[hotchips] / [ge] DtypeMKN: one 16x16x16 fp16 fractal per cycle (4,096 MACs)",
    "bf16": "[ge] DtypeMKN: bf16 like fp16, 16x16x16 on AIC-C-220",
    "fp32": "[ascendc] fp32 operands: 16x8 fractals (C0 = 8 x 4 B = 32 B), 16x8x16 per cycle on AIC-C-220",
    "int8": "[hotchips] / [ge] DtypeMKN: 16x32x16 int8 fractal per cycle (8,192 MACs)",
}
ACCUMULATOR = {"fp16": "fp32", "bf16": "fp32", "fp32": "fp32", "int8": "int32"}
ACC_SOURCE = "[ascendc] Mmad accumulates fp16/bf16/fp32 inputs in fp32 and int8 inputs in int32 (L0C)"


# ---- small numerics ---------------------------------------------------------------------

def sig(v: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits; tiny values to 0."""
    if abs(v) < 1e-3:
        return 0.0
    return float(f"{v:.{digits}g}")


def nelder_mead(f, x0, step=0.5, iters=800, tol=1e-6):
    """Minimise ``f`` from ``x0`` (a tiny, deterministic Nelder-Mead)."""
    x0 = np.asarray(x0, dtype=float)
    n = len(x0)
    pts = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals, kind="stable")
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if vals[-1] - vals[0] < tol:
            break
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
                vals = [f(p) for p in pts]
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def best_of(f, starts, step=0.5, iters=800):
    best = None
    for s in starts:
        p, v = nelder_mead(f, s, step=step, iters=iters)
        p, v = nelder_mead(f, p, step=step / 4, iters=iters)  # restart: escapes a collapsed simplex
        if best is None or v < best[1]:
            best = (p, v)
    return best[0]


def nonneg(q):
    """Parameter transform: any real -> a value >= 0, relative steps (log scale)."""
    return np.expm1(np.abs(q))


def inv_nonneg(v):
    return math.log1p(max(v, 0.0))


def ape(pred, meas):
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1.0) * 100.0


# ---- fits -------------------------------------------------------------------------------

def fit_mmad(rows):
    """cube.startup_cycles from the MMAD rows (fp16 fractal 16x16x16)."""
    frac = np.array([mmad_fractals(r["m"], r["k"], r["n"], (16, 16, 16)) for r in rows], dtype=float)
    ops = np.array([2.0 * r["m"] * r["k"] * r["n"] for r in rows])
    meas = np.array([r["value"] for r in rows])

    def mape(s):
        return float(np.mean(ape(ops / (s + frac), meas)))

    grid = np.arange(0.0, 200.0, 0.01)
    errs = [mape(s) for s in grid]
    s = sig(float(grid[int(np.argmin(errs))]))
    return s, mape(s)


# Instructions that write a 1-bit-per-element mask to UB: a repeat of 256 B holds 256/eb elements,
# so it writes 32/eb bytes of mask and eb repeats fill one 32-B UB block.
MASK_OUTPUT = ("VCMPV", "VCMPVS")


def fit_vector_key(rows):
    """(cycles_per_repeat, startup_cycles, min_cycles, partial_block_cycles, block_repeats) of one
    (instr, dtypes); the last two only matter for mask-writing instructions (MASK_OUTPUT)."""
    instr, dts = vector_instr_dtypes(rows[0]["path_or_instr"], rows[0]["dtypes"])
    eb = dtype_bytes(dts.split("_")[0])
    x = np.array([r["x"] for r in rows])
    meas = np.array([r["value"] for r in rows])
    reps = vector_repeats(x, eb, REPEAT_BYTES)
    nbytes = x * eb
    block = int(eb) if instr in MASK_OUTPUT else 1

    def pred(cpr, s, mn, pb):
        return nbytes / vector_cycles(reps, cpr, s, mn, pb, block)

    def unpack(q):
        pb = nonneg(q[3]) if block > 1 else 0.0
        return math.exp(q[0]), nonneg(q[1]), nonneg(q[2]), pb

    def obj(q):
        return float(np.mean(ape(pred(*unpack(q)), meas)))

    cyc_meas = nbytes / meas
    full = np.mod(reps, block) == 0
    cpr0 = REPEAT_BYTES / meas[full].max()
    mn0 = float(cyc_meas[full].min())
    starts = [[math.log(cpr0), inv_nonneg(0.0), inv_nonneg(m0), inv_nonneg(p0)]
              for m0 in (mn0, 0.0) for p0 in ((0.0, 5.0) if block > 1 else (0.0,))]
    q = best_of(obj, starts, iters=400)
    cpr, s, mn, pb = (sig(float(v)) for v in unpack(q))
    return (cpr, s, mn, pb, block), float(np.mean(ape(pred(cpr, s, mn, pb), meas)))


class TransferKey:
    """The rows of one ``table/path`` of one chip, as arrays."""

    def __init__(self, table, path, rows, clock_hz):
        self.table, self.path = table, path
        self.key = row_key(table, path)
        self.x = np.array([r["x"] for r in rows])
        self.meas = np.array([r["value"] for r in rows])
        self.nbytes = self.x * unit_bytes(table, path)
        self.clock_hz = clock_hz
        self.plateau = self.x >= 0.5 * self.x.max()
        self.harness_kind = unit_bytes(table, path) >= 2**20 and path.startswith("GM_")

    def pred(self, s, r, h, lat):
        return transfer_gbps(self.nbytes, transfer_cycles(self.nbytes, s, r, h, lat), self.clock_hz)

    def objective(self, s, r, h, lat):
        e = ape(self.pred(s, r, h, lat), self.meas)
        return float(np.mean(e) + np.mean(e[self.plateau]))


def fit_transfer_path(keys: list[TransferKey], fixed_startup: float | None):
    """Shared (startup, rate) of one path and per-key (harness, latency)."""
    harness = any(k.harness_kind for k in keys)
    if harness and fixed_startup is None:
        raise ValueError(f"{keys[0].path}: a harness-cost fit needs the GM_TO_UB start-up first")
    # initial guesses: rate from the best measured bandwidth, harness from the smallest row
    r0 = max(float(k.meas.max()) * 2**30 / k.clock_hz for k in keys)

    def unpack(q):
        i = 0
        r = math.exp(q[i])
        i += 1
        if harness:
            s = fixed_startup
        else:
            s = float(nonneg(q[i]))
            i += 1
        per = []
        for k in keys:
            h = float(nonneg(q[i])) if k.harness_kind else 0.0
            i += 1 if k.harness_kind else 0
            lat = float(nonneg(q[i]))
            i += 1
            per.append((h, lat))
        return s, r, per

    def obj(q):
        s, r, per = unpack(q)
        return sum(k.objective(s, r, h, lat) for k, (h, lat) in zip(keys, per, strict=True))

    starts = []
    for s0 in ((None,) if harness else (1.0, 30.0)):
        for lat0 in (0.0, 200.0):
            q = [math.log(r0)]
            if s0 is not None:
                q.append(inv_nonneg(s0))
            for k in keys:
                if k.harness_kind:
                    i0 = int(np.argmin(k.x))
                    cyc = k.nbytes[i0] / (k.meas[i0] * 2**30 / k.clock_hz)
                    q.append(inv_nonneg(cyc))
                q.append(inv_nonneg(lat0))
            starts.append(q)
    q = best_of(obj, starts, iters=1000)
    s, r, per = unpack(q)
    s, r = sig(s), sig(r)
    per = [(sig(h), sig(lat)) for h, lat in per]
    stats = []
    for k, (h, lat) in zip(keys, per, strict=True):
        e = ape(k.pred(s, r, h, lat), k.meas)
        stats.append((k, h, lat, float(np.mean(e)), float(np.max(e))))
    return s, r, stats


# ---- the fit of one measured chip --------------------------------------------------------

def rows_of(rows, chip):
    failed = failed_vector_rows(rows)
    return [r for i, r in enumerate(rows) if r["chip"] == chip and i not in failed]


def fit_chip(rows, chip: str, clock_mhz: float) -> dict:
    """Fitted constants of one chip with their sources: {"paths", "cube", "vector", "calibration"}."""
    mine = rows_of(rows, chip)
    clock_hz = clock_mhz * 1e6
    out: dict = {"paths": {}, "cube": None, "vector": {}, "calibration": {}}

    mm = [r for r in mine if r["table"] == "mmad" and r["dtypes"].startswith("FP16")]
    if mm:
        s, e = fit_mmad(mm)
        out["cube"] = (s, f"{FIT_CMD}, {len(mm)} rows of mmad/MMAD/{mm[0]['dtypes']}, MAPE {e:.2f}%")

    vec = defaultdict(list)
    for r in mine:
        if r["table"] == "vector":
            vec[(r["path_or_instr"], r["dtypes"])].append(r)
    for (instr, dts), rs in sorted(vec.items()):
        t, e = fit_vector_key(rs)
        name, d = vector_instr_dtypes(instr, dts)
        src = f"{FIT_CMD}, {len(rs)} rows of {row_key('vector', instr, dts)}, MAPE {e:.2f}%"
        out["vector"].setdefault(name, {})[d] = (t, src)

    by_path = defaultdict(list)
    for r in mine:
        if r["table"] in ("transfer_bursts", "transfer_repeats") and r["path_or_instr"] not in UNMODELLED_PATHS:
            by_path[(r["table"], r["path_or_instr"])].append(r)
    groups = defaultdict(list)
    for (table, path), rs in sorted(by_path.items()):
        groups[PATH_ALIASES.get(path, path)].append(TransferKey(table, path, rs, clock_hz))
    order = sorted(groups, key=lambda p: (p != "GM_TO_UB", p))  # GM_TO_UB first: others borrow its start-up
    gm_startup = None
    gm_latency = None
    for path in order:
        keys = groups[path]
        harness = any(k.harness_kind for k in keys)
        s, r, stats = fit_transfer_path(keys, gm_startup if harness else None)
        what = " + ".join(f"{len(k.x)} rows of {k.key}, MAPE {m:.1f}%" for k, _, _, m, _ in stats)
        rate_src = f"{FIT_CMD}, {what}"
        if harness:
            s_src = (f"not identifiable under the harness cost of the MiB-scale rows: the fitted "
                     f"{chip} GM_TO_UB start-up (same MTE2 pipe, same source memory)")
        else:
            s_src = rate_src
        # the path's completion-latency floor: the one of its first key that no harness cost hides
        # (transfer_bursts before transfer_repeats); under a harness cost, the GM_TO_UB one
        own = [st for st in stats if not st[0].harness_kind]
        if own:
            k0, _, lat0, m0, _ = own[0]
            lat_src = f"{FIT_CMD}, {len(k0.x)} rows of {k0.key}, MAPE {m0:.1f}%"
        else:
            k0, (lat0, lat_src) = None, gm_latency
            lat_src = f"not identifiable under the harness cost of the MiB-scale rows: the {chip} GM_TO_UB fit ({lat_src})"
        out["paths"][path] = {"bytes_per_cycle": (r, rate_src), "startup_cycles": (s, s_src),
                              "latency_cycles": (lat0, lat_src)}
        if path == "GM_TO_UB":
            gm_startup = s
            gm_latency = (lat0, lat_src)
        for k, h, lat, m, _ in stats:
            src = f"{FIT_CMD}, {len(k.x)} rows of {k.key}, MAPE {m:.1f}%"
            if k.harness_kind:
                out["calibration"].setdefault("harness_cycles", {})[k.key] = (h, src)
            if k is not k0:
                out["calibration"].setdefault("latency_cycles", {})[k.key] = (lat, src)
    return out


# ---- assembling the four presets ---------------------------------------------------------

def _carry(value_src, frm: str, why: str = ""):
    v, src = value_src
    return v, f"carried over from the {frm} fit{why} ({src})"


def preset_blocks(rows) -> dict[str, dict]:
    """The fitted block content of every preset: {chip: {"paths", "cube", "vector", "calibration"}}."""
    b1 = fit_chip(rows, "Ascend910B1", _clock("Ascend910B1"))
    b3 = fit_chip(rows, "Ascend910B3", _clock("Ascend910B3"))
    blocks = {}

    def paths_220(own, name, base):
        paths = {}
        for p, (src, dst, pipe, route) in PATHS_220.items():
            if p in own["paths"]:
                consts = own["paths"][p]
            elif base is not None and p in base["paths"]:
                consts = {k: _carry(v, "Ascend910B1", f": {name} has no rows for {p}")
                          for k, v in base["paths"][p].items()}
            elif p == "L0C_TO_L1":
                ref = (own if "L0C_TO_GM" in own["paths"] else base)["paths"]["L0C_TO_GM"]
                who = name if "L0C_TO_GM" in own["paths"] else "Ascend910B1"
                consts = {
                    k: (v[0], f"no measurement of L0C -> L1: assumed equal to the {who} L0C_TO_GM fit "
                              f"(same FixPipe pipe) ({v[1]})")
                    for k, v in ref.items()
                }
            else:
                raise ValueError(f"{name}: no rows and no carry-over for {p}")
            paths[p] = {"src": (src, route), "dst": (dst, route), "pipe": (pipe, route), **consts}
        return paths

    def cube(own_cube, fractals, carried_from=None):
        s, src = own_cube
        if carried_from:
            src = f"carried over from the {carried_from} fit (no public measurement) ({src})"
        return {"startup_cycles": (s, src),
                "fractals": {d: (v, FRACTAL_SOURCES[d]) for d, v in fractals.items()},
                "accumulator": {d: (ACCUMULATOR[d], ACC_SOURCE) for d in fractals}}

    def vector(vec, note=None):
        if note:
            vec = {i: {d: (t, f"{note} ({src})") for d, (t, src) in by.items()} for i, by in vec.items()}
        return {"repeat_bytes": (REPEAT_BYTES, "[ascendc] one repeat = 8 blocks of 32 B = 256 B"),
                "max_repeats": (255, "[ascendc] repeatTimes <= 255"),
                "instructions": vec}

    blocks["Ascend910B1"] = {
        "paths": paths_220(b1, "Ascend910B1", None),
        "cube": cube(b1["cube"], FRACTALS_220),
        "vector": vector(b1["vector"]),
        "calibration": b1["calibration"],
    }
    missing_vec = "carried over from the Ascend910B1 fit: Ascend910B3 has no vector rows"
    blocks["Ascend910B3"] = {
        "paths": paths_220(b3, "Ascend910B3", b1),
        "cube": cube(b3["cube"] or b1["cube"], FRACTALS_220, None if b3["cube"] else "Ascend910B1"),
        "vector": vector(b1["vector"], missing_vec),
        "calibration": b3["calibration"],
    }
    for name in ("Ascend910A", "Ascend310P3"):
        why = f"; a per-cycle rate, {name} has no public measurements"
        paths = {}
        for p, (src, dst, pipe, route) in PATHS_100.items():
            if p in b1["paths"]:
                consts = {k: _carry(v, "Ascend910B1", why) for k, v in b1["paths"][p].items()}
            else:
                s_ref, s_src = b1["paths"]["L1_TO_L0A"]["startup_cycles"]
                consts = {
                    "bytes_per_cycle": (GE_RATES[p], f"[ge] AICoreMemoryRates {GE_RATE_NAMES[p]} "
                                                     f"{GE_RATES[p]:.0f} B/cycle; no measurement"),
                    "startup_cycles": (s_ref, "no measurement: the on-chip start-up of the Ascend910B1 "
                                              f"L1_TO_L0A fit ({s_src})"),
                    "latency_cycles": _carry(b1["paths"]["L1_TO_L0A"]["latency_cycles"], "Ascend910B1",
                                             ": no measurement, the on-chip latency of L1_TO_L0A"),
                }
            paths[p] = {"src": (src, route), "dst": (dst, route), "pipe": (pipe, route), **consts}
        blocks[name] = {
            "paths": paths,
            "cube": cube(b1["cube"], FRACTALS_100, "Ascend910B1"),
            "vector": vector(b1["vector"], f"carried over from the Ascend910B1 fit: {name} has no "
                                           "public vector measurements"),
            "calibration": {},
        }
    return blocks


def _clock(chip: str) -> float:
    """The preset's clock (its hand-written [chip] part), read without the fitted block."""
    import tomllib

    text = (PRESET_DIR / f"{chip}.toml").read_text()
    top = text.split(BEGIN)[0]
    return float(tomllib.loads(top)["chip"]["clock_mhz"]["value"])


# ---- TOML writing ------------------------------------------------------------------------

def _str(s: str) -> str:
    return json.dumps(s, ensure_ascii=True)


def _val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        return r if ("." in r or "e" in r or "inf" in r or "nan" in r) else r + ".0"
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    raise TypeError(v)


def _vs(vs) -> str:
    v, src = vs
    return f"{{ value = {_val(v)}, source = {_str(src)} }}"


def render_block(chip: str, block: dict) -> str:
    L = [BEGIN_LINE]
    if block["calibration"]:
        L.append(f"# Fitted to {CSV_NAME} ({chip} rows where it has them); every value names its rows and MAPE.")
    else:
        L.append(f"# {chip} has no public measurements: values carried over from the Ascend910B1 fit or [ge].")
    for p, c in block["paths"].items():
        L.append(f"[paths.{p}]  # route: {c['src'][1]}")
        for key in ("src", "dst", "pipe"):  # identifiers, not constants: plain strings
            L.append(f"{key} = {_val(c[key][0])}")
        for key in ("bytes_per_cycle", "startup_cycles", "latency_cycles"):
            if key in c:
                L.append(f"{key} = {_vs(c[key])}")
    cu = block["cube"]
    L.append("")
    L.append("[cube]")
    L.append(f"startup_cycles = {_vs(cu['startup_cycles'])}")
    L.append("[cube.fractals]")
    for d, vs in cu["fractals"].items():
        L.append(f"{d} = {_vs(vs)}")
    L.append("[cube.accumulator]")
    for d, vs in cu["accumulator"].items():
        L.append(f"{d} = {_vs(vs)}")
    ve = block["vector"]
    L.append("")
    L.append("[vector]")
    L.append(f"repeat_bytes = {_vs(ve['repeat_bytes'])}")
    L.append(f"max_repeats = {_vs(ve['max_repeats'])}")
    L.append("# cycles of one instruction of n repeats: max(min_cycles, startup_cycles + n * cycles_per_repeat),")
    L.append("# n = ceil(elements * bytes(first dtype) / repeat_bytes)")
    for instr in sorted(ve["instructions"]):
        for dts in sorted(ve["instructions"][instr]):
            (cpr, s, mn, pb, block_reps), src = ve["instructions"][instr][dts]
            L.append(f"[vector.instructions.{instr}.{dts}]")
            L.append(f"cycles_per_repeat = {_vs((cpr, src))}")
            L.append(f"startup_cycles = {_vs((s, src))}")
            L.append(f"min_cycles = {_vs((mn, src))}")
            if block_reps > 1:
                why = (f"1 bit of mask per element: {block_reps} repeats of {dts.split('_')[0]} "
                       "fill one 32-B UB block [ascendc]")
                L.append(f"partial_block_cycles = {_vs((pb, src))}")
                L.append(f"block_repeats = {_vs((block_reps, why))}")
    cal = block["calibration"]
    if cal:
        L.append("")
        L.append("# Calibration-only constants of the measurement (the simulator does not read them; see")
        L.append("# pypto_lab/hw/calibration.py): a transfer row is modelled as")
        L.append("# harness_cycles + max(latency_cycles, startup_cycles + bytes / bytes_per_cycle).")
        L.append("[calibration]")
        for group in ("harness_cycles", "latency_cycles"):
            if group in cal:
                L.append(f"[calibration.{group}]")
                for key, vs in sorted(cal[group].items()):
                    L.append(f"{_str(key)} = {_vs(vs)}")
    L.append(END_LINE)
    return "\n".join(L) + "\n"


def splice(text: str, block: str, file: str) -> str:
    lines = text.splitlines(keepends=True)
    try:
        b = next(i for i, ln in enumerate(lines) if ln.startswith(BEGIN))
        e = next(i for i, ln in enumerate(lines) if ln.strip() == END_LINE and i > b)
    except StopIteration:
        raise SystemExit(f"{file}: fitted-block markers not found ('{BEGIN} ...' / '{END_LINE}')") from None
    return "".join(lines[:b]) + block + "".join(lines[e + 1:])


# --check tolerates last-digit drift of the optimiser across platforms (libm / SIMD differences)
CHECK_RTOL = 0.01
_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def material_difference(old: str, new: str) -> str:
    """Why two preset texts differ beyond the --check tolerance, or "" if they do not:
    the same keys and strings (numbers inside strings masked), numbers within CHECK_RTOL."""
    import tomllib

    try:
        a, b = tomllib.loads(old), tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        return f"not valid TOML: {exc}"

    def walk(x, y, where):
        if isinstance(x, dict) and isinstance(y, dict):
            if set(x) != set(y):
                return f"{where}: keys differ ({sorted(set(x) ^ set(y))})"
            for k in x:
                why = walk(x[k], y[k], f"{where}.{k}" if where else k)
                if why:
                    return why
            return ""
        if isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return f"{where}: lengths differ"
            return next((w for w in (walk(p, q, where) for p, q in zip(x, y, strict=True)) if w), "")
        if isinstance(x, str) and isinstance(y, str):
            return "" if _NUM.sub("#", x) == _NUM.sub("#", y) else f"{where}: {x!r} != {y!r}"
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            ok = abs(x - y) <= CHECK_RTOL * max(abs(x), abs(y)) + 1e-3
            return "" if ok else f"{where}: {x} != {y}"
        return "" if x == y else f"{where}: {x!r} != {y!r}"

    return walk(a, b, "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pypto_lab.hw.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if rewriting would change a preset")
    ap.add_argument("--csv", default=None, help=f"the calibration CSV (default {CSV_PATH})")
    args = ap.parse_args(argv)
    rows = load_microbench(args.csv)
    blocks = preset_blocks(rows)
    changed, drift = [], []
    for chip, block in blocks.items():
        path = PRESET_DIR / f"{chip}.toml"
        old = path.read_text()
        new = splice(old, render_block(chip, block), str(path))
        if new != old:
            if args.check:
                problem = material_difference(old, new)
                (changed if problem else drift).append(f"{path}: {problem or 'last-digit drift'}")
            else:
                changed.append(str(path))
                write_text_atomic(path, new)
    if args.check:
        if changed:
            print("presets out of sync with the fit:\n  " + "\n  ".join(changed)
                  + "\nrun: python -m pypto_lab.hw.fit", file=sys.stderr)
            return 1
        note = f" (within tolerance: {'; '.join(drift)})" if drift else ""
        print(f"presets are in sync with the fit{note}")
        return 0
    print(("rewrote " + ", ".join(changed)) if changed else "presets unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
