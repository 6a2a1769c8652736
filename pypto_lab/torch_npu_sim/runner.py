"""``pypto-lab run SCRIPT [ARGS...]`` (also ``python -m pypto_lab.run``): an unmodified torch_npu script
on the simulated card.

The script runs as ``python SCRIPT ARGS`` would run it (``__name__ == "__main__"``, ``sys.argv``,
its folder first on ``sys.path``) with the simulated card installed (`device.SimulatedNpu`) for
its whole run and only then: ``import torch_npu`` is the stand-in, ``.npu()`` / ``.to("npu")``
put tensors on the card, ``torch.npu.synchronize()`` and NPU events read the simulated timeline, and
``time.perf_counter()`` / ``time.time()`` read the simulated host clock (``--wall-clock`` keeps the
real one), so the script's own timing code prints what the card would show. At the end it prints
the summary (`report.summary`) and writes the Chrome trace and ``kernel_details.csv`` to
``--output``. The exit code is the script's.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from ..hw.chip import list_chips
from ..stack import list_stacks
from . import report
from .device import DEFAULT_CHIP, DEFAULT_STACK, STOP_CODES, SimulatedNpu

DEFAULT_OUTPUT = "out/run"


def run_script(script: str, argv: list[str] | None = None, chip: str = DEFAULT_CHIP, stack: str = DEFAULT_STACK,
               output: str | None = DEFAULT_OUTPUT, top: int = 15, wall_clock: bool = False,
               print_summary: bool = True) -> tuple[int, SimulatedNpu]:
    """Run ``script`` with ``argv`` on the simulated card; (exit code, the card with its records)."""
    path = os.path.abspath(script)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"pypto-lab run: {script}: no such script")
    sim = SimulatedNpu(chip, stack, wall_clock=wall_clock)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *(argv or [])]
    sys.path.insert(0, os.path.dirname(path))
    code = 0
    sim.install()
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:   # noqa: BLE001  (the script's error is reported as python would, then the summary)
        traceback.print_exc()
        code = 1
    finally:
        sim.uninstall()
        sys.argv, sys.path[:] = saved_argv, saved_path
    outputs = None
    if output:
        outputs = report.write_outputs(sim.card, output, name=os.path.basename(script))
    if print_summary:
        sys.stdout.flush()
        print("\n" + "=" * 100)
        print(report.summary(sim.card, os.path.basename(script), top, sim.lowering.fallbacks, sim.notes, outputs))
    return code, sim


def build_parser(prog: str = "pypto-lab run") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chip", default=DEFAULT_CHIP, help=f"the simulated chip: {', '.join(list_chips())} or a preset "
                                                       f"file (default {DEFAULT_CHIP})")
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"the software stack that launches the kernels: "
                                                         f"{', '.join(list_stacks())} (default {DEFAULT_STACK})")
    p.add_argument("--output", default=DEFAULT_OUTPUT, help=f"where to write {report.TRACE} and {report.KERNEL_DETAILS} "
                                                           f"(default {DEFAULT_OUTPUT}; '' writes nothing)")
    p.add_argument("--top", type=int, default=15, help="kernels to list in the summary, slowest first")
    p.add_argument("--wall-clock", action="store_true",
                   help="leave time.perf_counter() / time.time() on the real clock (default: the simulated one)")
    p.add_argument("script", help="the torch_npu script, run unchanged")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def run_from_args(args) -> int:
    from ..hw.chip import get_chip
    from ..stack import get_stack

    get_chip(args.chip)          # bad names fail here, before the script starts
    get_stack(args.stack)
    if args.top < 0:
        raise ValueError(f"--top {args.top}: must be 0 or more (the kernels to list); e.g. --top 15")
    code, _ = run_script(args.script, args.args, args.chip, args.stack, args.output or None, args.top, args.wall_clock)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser("python -m pypto_lab.run").parse_args(argv)
    try:
        return run_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"pypto-lab: error: {exc}", file=sys.stderr)
        return 2


STOP_CODES.add(run_script.__code__)   # below the script's frames, pypto_lab's own frames are the runner's

__all__ = ["DEFAULT_OUTPUT", "add_arguments", "build_parser", "main", "run_from_args", "run_script"]
