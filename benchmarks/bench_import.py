#!/usr/bin/env python3
"""What hardware-only use of pypto_lab costs a fresh process: import time and resident memory.

    python benchmarks/bench_import.py [--repeats 5]

Each case runs in its own fresh interpreter (the numba cache warm): ``import pypto_lab`` alone;
``import pypto_lab.hw``; and the issue-26 command ``import pypto_lab.hw, pypto_lab;
pypto_lab.list_chips(); pypto_lab.simulate_matmul(512, 512, 512)``, with torch's absence checked.
It prints the median wall time of the statement and the resident set (VmRSS) and its peak
(VmHWM) at the end, next to the floor numba itself sets (``import numba``, and the first call of a trivial cached
njit function in a fresh interpreter: numba's CPU target initialised).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
exec(compile(sys.argv[1], "<case>", "exec"))
dt = time.perf_counter() - t0
status = open("/proc/self/status").read()
kb = lambda key: int(status.split(key + ":")[1].split()[0])
print(json.dumps({"seconds": dt, "rss_mb": kb("VmRSS") / 1024, "hwm_mb": kb("VmHWM") / 1024,
                  "torch": "torch" in sys.modules, "numba": "numba" in sys.modules,
                  "scipy": "scipy" in sys.modules}))
"""

CASES = {
    "import pypto_lab": "import pypto_lab",
    "import pypto_lab.hw": "import pypto_lab.hw",
    "hw-only use (issue 26)": "import pypto_lab.hw, pypto_lab; pypto_lab.list_chips(); "
                              "pypto_lab.simulate_matmul(512, 512, 512)",
    "floor: import numba": "import numba",
    "floor: numba + one cached njit call": "import sys; sys.path.insert(0, {tmp!r}); import numba_floor; "
                                           "numba_floor.f(3)",
}
FLOOR_MODULE = "import numba\n\n\n@numba.njit(cache=True)\ndef f(n):\n    return n + 1\n"


def run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, code], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_import_")
    (Path(tmp) / "numba_floor.py").write_text(FLOOR_MODULE)
    cases = {name: code.format(tmp=tmp) for name, code in CASES.items()}
    run(cases["hw-only use (issue 26)"])   # warm the numba caches
    run(cases["floor: numba + one cached njit call"])
    print("| case | time (median) | VmRSS | VmHWM | torch | numba | scipy |")
    print("|---|---:|---:|---:|---|---|---|")
    for name, code in cases.items():
        runs = [run(code) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("seconds", "rss_mb", "hwm_mb")}
        last = runs[-1]
        print(f"| {name} | {med['seconds']:.3f} s | {med['rss_mb']:.0f} MB | {med['hwm_mb']:.0f} MB | "
              f"{'loaded' if last['torch'] else 'no'} | {'loaded' if last['numba'] else 'no'} | "
              f"{'loaded' if last['scipy'] else 'no'} |")


if __name__ == "__main__":
    main()
