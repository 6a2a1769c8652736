#!/usr/bin/env python3
"""The LLM engine against the published Ascend LLM figures: a thin caller of `pypto-lab validate`.

    python benchmarks/llm_validation.py [--json PATH]

Runs the ``llm`` and ``serving`` sets of `pypto_lab.validation` (fixed-batch prefill and decode
step latencies on their torchair stacks, serving runs at their request rates, matmul
micro-figures) and prints each row, then the median and worst |error| per regime and stack, the
share within ±15 % and ±25 %, the leave-one-model-out error and the held-back rows. The same as
``pypto-lab validate --set llm --set serving``; the rows and what each mechanism does are in
`pypto_lab/validation/llm_rows.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pypto_lab.files.atomic import write_json_atomic  # noqa: E402
from pypto_lab.validation import validate_sets  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows and the per-regime figures here")
    args = ap.parse_args(argv)
    summary = validate_sets(("llm", "serving"), progress=True)
    print(summary.table())
    if args.json:
        write_json_atomic(args.json, summary.to_dict())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
