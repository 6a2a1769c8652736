#!/usr/bin/env python3
"""Survey: which example scripts of a CANN PyPTO checkout run on pypto_lab's simulated NPU.

    python scripts/survey_pypto_examples.py CHECKOUT [--json PATH] [--markdown PATH]
                                            [--timeout SECONDS] [--jobs N] [--only SUBSTRING]

Every ``examples/**/*.py`` of CHECKOUT (the files git tracks there, else every such file) runs
through ``scripts/run_pypto_example.py`` in its own subprocess, with its folder as the working
directory and a timeout. Each row of the table: the file, its verdict, the comparisons with
torch that passed / were made, the largest |diff| among them and, for a failure, its one-line
reason. Verdicts: ``pass`` (exit 0 and at least one comparison, all passed), ``ran`` (exit 0 but
the example compared nothing), ``fail`` (it raised or a comparison failed), ``timeout``. The
checkout's commit hash and date come from git. ``--json`` / ``--markdown`` are written whole
(atomically); the markdown table is also printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "run_pypto_example.py"
_COUNT = re.compile(r"\[run_pypto_example\] (\d+) comparisons? with torch: (\d+) passed")
_DIFF = re.compile(r"^\s+line\s+\d+\s+\S+\s+max\|diff\|=(\S+)")
_FAILED = re.compile(r"\[run_pypto_example\] FAILED: (.*)")
_FRAME = re.compile(r'^  File "([^"]+)", line (\d+), in \S+\n    (.+)$', re.M)


def checkout_info(checkout: Path) -> dict:
    """Commit hash and date of ``checkout`` (None where it is not a git work tree)."""
    try:
        out = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%H %cI"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        return {"commit": out[0], "date": out[1]}
    except (OSError, subprocess.SubprocessError, IndexError):
        return {"commit": None, "date": None}


def example_files(checkout: Path) -> list[str]:
    """Paths (relative to the checkout) of every examples/**/*.py, sorted."""
    try:
        out = subprocess.run(["git", "-C", str(checkout), "ls-files", "examples/*.py"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        if out:
            return sorted(out)
    except (OSError, subprocess.SubprocessError):
        pass
    return sorted(p.relative_to(checkout).as_posix() for p in (checkout / "examples").rglob("*.py"))


def parse_output(text: str, returncode: int | None) -> dict:
    """The row of one example from its runner output and exit code (None: timed out)."""
    m = _COUNT.search(text)
    total, passed = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    diffs = []
    for line in text.splitlines():
        d = _DIFF.match(line)
        if d:
            try:
                v = float(d.group(1))
            except ValueError:
                continue
            if not math.isnan(v):
                diffs.append(v)
    failed = _FAILED.search(text)
    if returncode is None:
        status, reason = "timeout", "timed out"
    elif returncode == 0:
        status, reason = ("pass" if total else "ran"), ("" if total else "made no comparison with torch")
    else:
        status = "fail"
        if failed:
            reason = failed.group(1).strip()
            frames = _FRAME.findall(text)
            if reason.endswith(":") and frames:  # a bare `assert x`: say where
                path, line, code = frames[-1]
                reason = f"{reason[:-1]} at {os.path.basename(path)}:{line}: {code.strip()}"
        elif total > passed:
            reason = f"{total - passed} of {total} comparisons failed"
        else:
            tail = [ln for ln in text.strip().splitlines() if ln.strip()]
            reason = tail[-1].strip() if tail else f"exit code {returncode}"
    return {"status": status, "passed": passed, "total": total, "max_abs_diff": max(diffs) if diffs else None,
            "reason": reason[:300]}


def run_one(checkout: Path, rel: str, timeout: float, python: str) -> dict:
    path = checkout / rel
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    t0 = time.perf_counter()
    # each example runs in a scratch working directory: a SIM run writes ./output/ there as the real
    # framework does (pto.sim_output), and the checkout is left as it is (the runner puts the
    # example's own folder on sys.path for its imports)
    with tempfile.TemporaryDirectory(prefix="pypto_example_") as cwd:
        env.pop("TILE_FWK_OUTPUT_DIR", None)
        try:
            proc = subprocess.run([python, str(RUNNER), str(path)], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=timeout)
            text, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            text, code = (out.decode(errors="replace") if isinstance(out, bytes) else out), None
    row = {"file": rel, **parse_output(text, code), "seconds": round(time.perf_counter() - t0, 1)}
    return row


def survey(checkout, timeout: float = 300.0, jobs: int = 1, only: str | None = None,
           python: str = sys.executable) -> dict:
    checkout = Path(checkout).resolve()
    files = [f for f in example_files(checkout) if not only or only in f]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rows = list(pool.map(lambda f: run_one(checkout, f, timeout, python), files))
    counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "ran", "fail", "timeout")}
    return {"checkout": str(checkout), **checkout_info(checkout), "files": len(rows), "counts": counts, "rows": rows}


def to_markdown(result: dict) -> str:
    commit = (result.get("commit") or "unknown")[:7]
    date = (result.get("date") or "unknown")[:10]
    c = result["counts"]
    lines = [f"Survey of {result['files']} example files at commit {commit} ({date}): {c['pass']} pass, "
             f"{c['ran']} run without a comparison, {c['fail']} fail, {c['timeout']} time out.", "",
             "| file | verdict | comparisons passed | max \\|diff\\| | reason |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        diff = "–" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g}"
        reason = r["reason"].replace("|", "\\|")
        lines.append(f"| `{r['file']}` | {r['status']} | {r['passed']}/{r['total']} | {diff} | {reason} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="a checkout of the CANN PyPTO repository")
    ap.add_argument("--json", help="write the survey as JSON here")
    ap.add_argument("--markdown", help="write the table as markdown here")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per example (default 300)")
    ap.add_argument("--jobs", type=int, default=1, help="examples run at once (default 1)")
    ap.add_argument("--only", help="only the files whose path contains this")
    args = ap.parse_args(argv)
    if not (Path(args.checkout) / "examples").is_dir():
        print(f"survey: {args.checkout} has no examples/ folder; give a checkout of the PyPTO repository",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from pypto_lab.files.atomic import write_text_atomic

    result = survey(args.checkout, args.timeout, args.jobs, args.only)
    md = to_markdown(result)
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=1) + "\n")
    if args.markdown:
        write_text_atomic(args.markdown, md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
