#!/usr/bin/env python3
"""Training steps against published Ascend training throughput: a thin caller of `pypto-lab validate`.

    python benchmarks/train_validation.py [--only resnet50,bert-base] [--json PATH]

Runs the ``training`` set of `pypto_lab.validation` (`pypto_lab/validation/training_rows.py`: each
row of ``datasets/published_training/published_training.csv`` that the workbench can set up, in
the row's configuration, compared per card; rows it cannot set up listed with the reason; the
README's held-back rows reported apart). ``--only`` keeps some model keys (faster).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pypto_lab.files.atomic import write_json_atomic  # noqa: E402
from pypto_lab.validation.compare import Summary  # noqa: E402
from pypto_lab.validation.training_rows import training_set  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model keys to run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    only = {k for k in args.only.split(",") if k} or None
    rows, fitted = training_set(only=only)
    summary = Summary(rows, fitted)
    print(summary.table())
    if args.json:
        write_json_atomic(args.json, summary.to_dict())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
