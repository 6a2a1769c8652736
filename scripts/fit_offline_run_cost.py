"""Would one per-run host cost per stack (``step_host_us``: the head cost of an offline-model
execution, which CANN names but publishes no figure for) bring the published 310P3 rows closer?

Fits, per stack, the one constant ``h`` >= 0 added to every row's simulated latency that
minimises the squared log error of the simulated throughput over that stack's rows, and reports
its leave-one-model-out error: for each model, ``h`` fitted on the other models' rows and that
model's rows judged with it (a constant that is right carries over; one that only absorbs some
rows' misses does not). The presets are not changed by this script.

Run:  pypto-lab validate --set inference --json out/inference.json
      python scripts/fit_offline_run_cost.py out/inference.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics


def errors(rows: list[dict], h: float) -> list[float]:
    """Each row's relative throughput error with ``h`` microseconds added to its latency."""
    return [row["batch"] * 1e6 / (row["latency_us"] + h) / row["published"] - 1 for row in rows]


def fit(rows: list[dict], hi: float = 5000.0) -> float:
    """The h in [0, hi] us minimising the summed squared log error (golden-section search)."""
    def loss(h: float) -> float:
        return sum(math.log1p(e) ** 2 for e in errors(rows, h))
    a, b = 0.0, hi
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(80):
        if loss(c) < loss(d):
            b = d
        else:
            a = c
        c, d = b - g * (b - a), a + g * (b - a)
    return (a + b) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", help="JSON written by pypto-lab validate --set inference --json")
    args = ap.parse_args()
    with open(args.rows, encoding="utf-8") as f:
        rows = [r for r in json.load(f)["rows"] if r["set"] == "inference" and r["simulated"] is not None]
    for r in rows:   # the simulated latency of one call, from the simulated throughput at the row's batch
        r["batch"] = int(re.search(r"\bb(\d+)\b", r["setup"]).group(1))
        r["latency_us"] = r["batch"] * 1e6 / r["simulated"]
    for stack in sorted({r["stack"] for r in rows}):
        mine = [r for r in rows if r["stack"] == stack]
        h = fit(mine)
        before = statistics.median(abs(e) for e in errors(mine, 0.0))
        after = statistics.median(abs(e) for e in errors(mine, h))
        print(f"{stack}: {len(mine)} rows, fitted per-run cost {h:,.1f} us; median |error| {before:.1%} without it, "
              f"{after:.1%} with it")
        lomo = []
        for model in sorted({r["model"] for r in mine}):
            rest = [r for r in mine if r["model"] != model]
            if not rest:
                continue
            h_rest = fit(rest)
            own = [r for r in mine if r["model"] == model]
            errs = errors(own, h_rest)
            lomo.extend(abs(e) for e in errs)
            print(f"  leave out {model:18s} h = {h_rest:8.1f} us  its rows: "
                  + ", ".join(f"{e:+.0%} (was {e0:+.0%})" for e, e0 in zip(errs, errors(own, 0.0))))
        if lomo:
            print(f"  leave-one-model-out median |error| {statistics.median(lomo):.1%} (without any per-run cost: "
                  f"{before:.1%})")


if __name__ == "__main__":
    main()
