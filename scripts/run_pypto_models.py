#!/usr/bin/env python3
"""Run the real framework's model kernel tests (``models/`` of hicann/pypto) on pypto_lab's simulated NPU,
as the manifest in the repository lists them, and print one row per test.

    python scripts/run_pypto_models.py PYPTO_SRC [--json PATH] [--only TEXT] [--fast] [--left-out]
                                       [--costs] [--jobs N] [--timeout SECONDS] [--manifest PATH]

PYPTO_SRC is a checkout of the framework's repository (not vendored: clone it yourself). The
manifest (`scripts/pypto_models_manifest.toml`) has one ``[[test]]`` per test the lab runs: the
file under ``models/``, the test (a pytest id), the call that runs it (``call``, default the test's
name; parametrised tests pass their parameters) and the ``--set`` size reductions that make it
fit a laptop. Reductions shrink batch, sequence and block counts only; dtypes, head counts, head
dims, quantisation modes, layouts and tile shapes stay as the file has them (``real`` says what the
file's own sizes are). ``[[left_out]]`` lists the tests the lab does not run, each with its reason
and, where it was tried, the failing number.

Each test runs in its own process (``scripts/run_pypto_example.py --npu-on-cpu --call ... --set ...
--report ...``, the file's folder as working directory): its comparisons with its own golden at
its own tolerance are recorded, and every pto kernel launch with its simulated time. The table:
file, test, sizes, comparisons (passed / made), the largest max |diff| against the tolerance of
that comparison, simulated µs at the run size (all launches), wall time, verdict. A test passes
when it ran to the end, made at least one comparison and every comparison passed. Exit 0 only if
every test run passes. ``--json PATH`` writes a list with one object per test (``file``, ``test``,
``passed``, ``comparisons``, ``max_abs_diff`` and the rest of the row), whole or not at all.

``--jobs N`` runs N tests at a time (default 2: the two cores the lab's budget is set for; each
test process is single-threaded). Besides each test's wall time, its CPU seconds (the test
process's own, from its report) are summed: on a shared machine the wall time of a run says how
busy the machine was, the CPU seconds what the run costs.

``--fast``: only the tests the manifest marks ``fast`` (what ``tests/test_pto_models.py`` runs).
``--left-out``: also run the left-out tests that have a ``call`` (to reproduce their numbers).
``--costs``: each test at the file's own sizes (``cost_set`` instead of ``set``: usually none),
with the kernels costed but their values not computed (``--cost-only``: the run stops at the
test's first comparison); the table gives per kernel the simulated µs, the roofline µs and the
GM bytes at the sizes the file itself tests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "run_pypto_example.py"
MANIFEST = ROOT / "scripts" / "pypto_models_manifest.toml"


class ManifestError(ValueError):
    """The manifest breaks one of its rules (named in the message, with the entry and a fix)."""


_TEST_KEYS = {"file", "test", "call", "set", "real", "fast", "cost_set", "cost_call", "note", "timeout"}
_LEFT_KEYS = {"file", "test", "reason", "call", "set"}


def load_manifest(path: Path) -> tuple[list[dict], list[dict]]:
    """(tests, left_out) of the manifest, checked: known keys, a file and a test per entry, each
    test listed once."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    tests, left = data.get("test", []), data.get("left_out", [])
    seen = set()
    for kind, entries, keys in (("test", tests, _TEST_KEYS), ("left_out", left, _LEFT_KEYS)):
        for i, e in enumerate(entries):
            unknown = sorted(set(e) - keys)
            if unknown:
                raise ManifestError(f"{path}: [[{kind}]] #{i + 1} ({e.get('test')}) has unknown keys {unknown}. Rule: "
                                    f"an entry has only {sorted(keys)}. Fix: remove or rename them")
            for need in ("file", "test") + (("reason",) if kind == "left_out" else ()):
                if not e.get(need):
                    raise ManifestError(f"{path}: [[{kind}]] #{i + 1} has no {need!r}. Rule: every entry names its "
                                        f"file, its test{' and why it is left out' if kind == 'left_out' else ''}")
            key = (e["file"], e["test"])
            if key in seen:
                raise ManifestError(f"{path}: {e['file']}::{e['test']} is listed twice. Rule: one entry per test. "
                                    "Fix: keep one")
            seen.add(key)
            for s in e.get("set", []) + e.get("cost_set", []):
                if "=" not in s:
                    raise ManifestError(f"{path}: {e['test']}: set {s!r} is not NAME=VALUE")
    return tests, left


def _call(e: dict, costs: bool = False) -> str:
    if costs and e.get("cost_call"):
        return e["cost_call"]
    return e.get("call") or e["test"].split("[", 1)[0]


def run_entry(src: Path, e: dict, costs: bool = False, timeout: float = 900.0) -> dict:
    """Run one manifest entry in its own process; the row of the table."""
    path = src / "models" / e["file"]
    sets = e.get("cost_set", []) if costs else e.get("set", [])
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, str(RUNNER), "--npu-on-cpu", "--call", _call(e, costs), "--report", str(report)]
        if costs:
            cmd.append("--cost-only")
        for s in sets:
            cmd += ["--set", s]
        cmd.append(str(path))
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("MPLBACKEND", "Agg")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=path.parent, env=env, capture_output=True, text=True,
                               timeout=e.get("timeout", timeout))
            out, code = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            code = None
        wall = time.perf_counter() - t0
        rep = json.loads(report.read_text()) if report.exists() else None
    return _row(e, rep, out, code, wall, costs, sets)


def _tol(c: dict) -> str:
    if c.get("rtol") is None and c.get("atol") is None:
        return "own bound" if c.get("api") == "assert" else "default"
    return f"atol {c.get('atol')}, rtol {c.get('rtol')}"


def _row(e, rep, out, code, wall, costs, sets) -> dict:
    row = {"file": e["file"], "test": e["test"], "call": _call(e, costs), "set": list(sets),
           "real": e.get("real", ""), "wall_s": round(wall, 2), "comparisons": 0, "comparisons_passed": 0,
           "max_abs_diff": None, "tolerance": None, "sim_us": None, "roofline_us": None, "kernels": [], "cpu_s": None,
           "passed": False, "verdict": "", "error": None}
    if code is None:
        row["verdict"] = "timeout"
        row["error"] = f"no result within {e.get('timeout', 'the')} s"
        return row
    if rep is None:
        tail = [ln for ln in out.strip().splitlines() if ln.strip()][-3:]
        row["verdict"] = "error"
        row["error"] = " | ".join(tail)[-300:] or f"exit {code}"
        return row
    comps = rep["comparisons"]
    row["cpu_s"] = rep.get("cpu_s")
    row["comparisons"] = len(comps)
    row["comparisons_passed"] = sum(1 for c in comps if c["passed"])
    finite = [c for c in comps if c["max_abs_diff"] is not None and not math.isnan(c["max_abs_diff"])]
    worst = max(finite, key=lambda c: c["max_abs_diff"], default=None)
    failed = [c for c in comps if not c["passed"]]
    shown = failed[0] if failed else worst
    if shown is not None:
        row["max_abs_diff"] = shown["max_abs_diff"]
        row["tolerance"] = _tol(shown)
    launches = rep["launches"]
    if launches:
        row["sim_us"] = sum(r["time_us"] for r in launches)
        row["roofline_us"] = sum(r["roofline_us"] for r in launches)
    row["kernels"] = rep["kernels"]
    row["format_casts"] = rep.get("format_casts", [])
    row["error"] = rep["error"]
    if costs:
        row["passed"] = rep["exit"] == 0 and bool(launches)
        row["verdict"] = "costed" if row["passed"] else "error"
    else:
        row["passed"] = rep["exit"] == 0 and rep["error"] is None and bool(comps) and not failed
        row["verdict"] = "pass" if row["passed"] else ("FAIL" if failed else "error" if rep["error"] else
                                                       "no comparison")
    if failed and not row["error"]:
        row["error"] = f"line {failed[0]['line']}: {failed[0]['note']}"
    return row


def _fmt(v, spec=".3g") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict], costs: bool = False) -> str:
    if costs:
        lines = ["| file | test | kernel | launches | simulated µs | roofline µs | sim / roofline | GM MB | wall s |",
                 "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if not r["kernels"]:
                lines.append(f"| {r['file']} | {r['test']} | {r['verdict']}: {r['error'] or ''} | | | | | | "
                             f"{r['wall_s']:.0f} |")
            for k in r["kernels"]:
                ratio = k["time_us"] / k["roofline_us"] if k["roofline_us"] else float("nan")
                lines.append(f"| {r['file']} | {r['test']} | {k['kernel']} | {k['launches']} | {k['time_us']:,.1f} | "
                             f"{k['roofline_us']:,.1f} | {ratio:.2f} | {k['gm_bytes'] / 1e6:,.1f} | {r['wall_s']:.0f} |")
        return "\n".join(lines)
    lines = ["| file | test | sizes | comparisons | max abs diff (tolerance) | simulated µs | wall s | CPU s | verdict |",
             "|---|---|---|---:|---|---:|---:|---:|---|"]
    for r in rows:
        sizes = ", ".join(r["set"]) or "as in the file"
        diff = "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g} ({r['tolerance']})"
        verdict = r["verdict"] + ("" if r["passed"] or not r["error"] else f": {r['error'][:160]}")
        lines.append(f"| {r['file']} | {r['test']} | {sizes} | {r['comparisons_passed']}/{r['comparisons']} | {diff} "
                     f"| {_fmt(r['sim_us'], ',.1f')} | {r['wall_s']:.1f} | {_fmt(r['cpu_s'], '.1f')} | {verdict} |")
    return "\n".join(lines)


def file_table(rows: list[dict], left: list[dict]) -> str:
    """One row per test file: tests run, passing, left out; the CPU seconds of its tests."""
    files = sorted({r["file"] for r in rows} | {e["file"] for e in left})
    lines = ["| file | tests run | pass | left out | CPU s |", "|---|---:|---:|---:|---:|"]
    for f in files:
        mine = [r for r in rows if r["file"] == f]
        lines.append(f"| {f} | {len(mine)} | {sum(r['passed'] for r in mine)} | "
                     f"{sum(e['file'] == f for e in left)} | {sum(r['cpu_s'] or 0.0 for r in mine):.0f} |")
    return "\n".join(lines)


def summary(rows: list[dict], left: list[dict]) -> str:
    files = sorted({r["file"] for r in rows} | {e["file"] for e in left})
    passing = sorted({r["file"] for r in rows if r["passed"]})
    n_pass = sum(r["passed"] for r in rows)
    return (f"{n_pass} of {len(rows)} tests run pass; {len(passing)} of {len(files)} files have at least one test "
            f"passing its own golden; {len(left)} tests left out (reasons below)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="checkout of hicann/pypto")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", default=None, help="run the tests whose file or test contains this text")
    ap.add_argument("--fast", action="store_true", help="only the tests marked fast")
    ap.add_argument("--left-out", action="store_true", help="also run the left-out tests that have a call")
    ap.add_argument("--costs", action="store_true", help="cost every test at the file's own sizes (values not computed)")
    ap.add_argument("--jobs", type=int, default=2, help="tests run at a time (default 2)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per test (default 900)")
    ap.add_argument("--manifest", type=Path, default=MANIFEST)
    args = ap.parse_args(argv)
    if not (args.src / "models").is_dir():
        print(f"{args.src}: no models/ folder. Rule: PYPTO_SRC is a checkout of hicann/pypto (git clone it). "
              "Fix: pass the checkout's root")
        return 2
    try:
        tests, left = load_manifest(args.manifest)
    except (ManifestError, tomllib.TOMLDecodeError) as exc:
        print(f"manifest: {exc}")
        return 2
    todo = [e for e in tests if not args.fast or e.get("fast")]
    if args.left_out:
        todo += [e for e in left if e.get("call")]
    if args.only:
        todo = [e for e in todo if args.only in e["file"] or args.only in e["test"]]
    if args.jobs < 1:
        print(f"--jobs {args.jobs}: Rule: at least one test runs at a time. Fix: --jobs 1 (or 2 on two cores)")
        return 2
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_entry, args.src, e, args.costs, args.timeout) for e in todo]
        for fut in concurrent.futures.as_completed(futures):
            row = fut.result()
            print(f"[run_pypto_models] {row['file']}::{row['test']}: {row['verdict']} ({row['wall_s']:.1f} s wall, "
                  f"{_fmt(row['cpu_s'], '.1f')} s CPU)", flush=True)
    rows = [f.result() for f in futures]   # in manifest order
    print()
    print(table(rows, costs=args.costs))
    print()
    if not args.costs:
        print(file_table(rows, [] if args.only or args.fast else left))
        print()
        print(summary(rows, [] if args.only or args.fast else left))
        if left and not args.only and not args.fast:
            print("\nLeft out:")
            for e in left:
                print(f"* {e['file']}::{e['test']}: {e['reason']}")
    cpu = sum(r["cpu_s"] or 0.0 for r in rows)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s with {args.jobs} test(s) at a time; CPU time of the tests "
          f"{cpu:.0f} s")
    if args.json:
        sys.path.insert(0, str(ROOT))
        from pypto_lab.files.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(rows, indent=1, default=str))
    return 0 if rows and all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
