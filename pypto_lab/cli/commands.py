"""The `pypto-lab` command: `tour` (the main job of `make demo`), `chips`, `matmul`, `vector`,
`report`, `compare`, `calibrate`, `atc` (ATC's flags: ONNX in, an OM file out), `run` (an
unmodified torch_npu script on the simulated card).

Bad input ends the command with one line on stderr, ``pypto-lab: error: ...`` naming the value,
the rule and a fix, and exit code 2; it is checked before any long computation starts."""

from __future__ import annotations

import argparse
import os
import sys

from ..compiler.optimize import LEVELS, optimize
from ..files.atomic import check_writable, write_json_atomic
from ..hw.calibration import calibrate, format_calibration
from ..hw.chip import DEFAULT_CHIP, PRESET_DIR, ChipConfigError, get_chip, list_chips
from ..hw.kernels import VECTOR_OPS, simulate_matmul, simulate_vector
from ..hw.tiling import TilingError
from ..llm import HBMCapacityError
from ..llm.validation import cli_text
from ..models.zoo import load_model
from ..stack import DEFAULT_STACK, STACK_DIR, get_stack, list_stacks
from ..torch_npu_sim.runner import add_arguments as add_run_arguments
from ..torch_npu_sim.runner import run_from_args
from ..viz.tour_report import write_tour_report
from .llm import add_llm_commands

SWEEP = [(256, 256, 256), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
         (8192, 8192, 8192), (128, 4096, 128), (4096, 64, 4096), (16384, 1024, 1024)]


class CliError(ValueError):
    """Bad command-line input; the message names the option, its value, the rule and a fix."""


# ---- checks of the command line's values, before any work starts ------------------------------------

def _positive(flag: str, value: int | None, example: int = 1) -> None:
    if value is not None and value < 1:
        raise CliError(f"{flag} {value}: must be a positive integer (1 or more); e.g. {flag} {example}")


def _chip(value: str, flag: str = "--chip") -> str:
    """``value`` if it names a chip preset or a readable preset file."""
    try:
        get_chip(value)
    except OSError as exc:  # a folder, an unreadable file
        why = "is a folder" if os.path.isdir(value) else f"cannot be read ({exc.strerror or exc})"
        raise CliError(f"{flag} {value}: {why}; a chip is a preset name ({', '.join(list_chips())}) or the "
                       f"path of a .toml preset file (copy one from {PRESET_DIR} and edit it)") from exc
    return value


def _writable(flag: str, value: str | None, example: str = "out/result.json") -> None:
    """Refuse an output path that cannot be written (a folder, under a file, in a folder that
    cannot be written), before the work that produces it."""
    check_writable(value, flag, example)


def _write_json(flag: str, path: str, obj) -> None:
    try:
        write_json_atomic(path, obj)
    except OSError as exc:
        raise CliError(f"{flag} {path}: cannot write it ({exc.strerror or exc}); give a file path you can "
                       f"write, e.g. {flag} out/result.json") from exc


def _table(headers: list[str], rows: list[list], aligns: str | None = None) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    aligns = aligns or "l" + "r" * (len(headers) - 1)

    def fmt(row):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, aligns))

    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def chip_table() -> str:
    rows = []
    for name in list_chips():
        c = get_chip(name)
        b = c.buffers
        rows.append([
            name, c.core_version, c.cube_cores, c.vector_cores, f"{c.clock_mhz:.0f}",
            f"{c.peak_tflops('fp16'):.1f}", f"{c.peak_tflops('int8'):.1f}", f"{c.hbm_gbps:.0f}",
            f"{c.l2_bytes / 2**20:.0f}",
            f"{b['L1'].size_bytes // 1024}/{b['L0A'].size_bytes // 1024}/{b['L0B'].size_bytes // 1024}/"
            f"{b['L0C'].size_bytes // 1024}/{b['UB'].size_bytes // 1024}",
        ])
    return _table(["chip", "core", "AIC", "vec", "MHz", "fp16 TFLOPS", "int8 TOPS", "HBM GB/s", "L2 MB",
                   "L1/L0A/L0B/L0C/UB KB"], rows, "ll" + "r" * 8)


def matmul_sweep(chip: str, shapes=SWEEP, dtype: str = "fp16") -> str:
    """Each shape's simulated matmul with the simulator's default tiling. The tiling itself is not
    printed: on the 910B1 it is exercise 1's answer, which a student should find before seeing it
    (``simulate_matmul(...).tile`` gives it)."""
    rows = []
    for m, k, n in shapes:
        r = simulate_matmul(m, k, n, dtype=dtype, chip=chip)
        rows.append([f"{m}x{k}x{n}", f"{r.cycles:,.0f}", f"{r.time_us:,.1f}", f"{r.tflops:.1f}",
                     f"{100 * r.cube_utilization:.1f}%", r.bound])
    return _table(["shape (MxKxN)", "cycles", "time us", "TFLOPS", "cube util", "bound"], rows, "lrrrrl")


NEXT_STEPS = """
next: the course. `make lab` opens JupyterLab on notebooks/ at 00_quickstart.ipynb (notebooks/README.md
is the guide: eleven notebooks in order, then six exercises in notebooks/exercises/)."""


def cmd_tour(args) -> int:
    for chip in args.chips or []:
        _chip(chip, "--chips")
    if not args.no_html:
        _writable("--html", args.html, "out/tour.html")
    print("pypto_lab tour: the simulated Ascend chips (every figure below comes from the simulator)\n")
    print(chip_table())
    for chip in args.chips or list_chips():
        print(f"\n{chip}: fp16 matmul sweep (peak {get_chip(chip).peak_tflops('fp16'):.1f} TFLOPS)")
        print(matmul_sweep(chip))
    if not args.no_html:
        print("\nthe ResNet-50 and BERT-base walkthroughs, levels 0-3 (pass by pass and figures in the HTML report):")
        tour = write_tour_report(args.html, chips=args.chips or None, progress=lambda text: print(text, flush=True))
        print(f"\nwrote {args.html} ({tour.seconds:,.0f} s)")
    print(NEXT_STEPS)
    return 0


def cmd_chips(args) -> int:
    print(chip_table())
    return 0


def stack_table() -> str:
    """The software-stack presets: how each runs kernels and what launching one costs."""
    rows = []
    for name in list_stacks():
        s = get_stack(name)
        rows.append([name, s.runs, f"{s.dispatch_us:g}", f"{s.launch_us:g}", f"{s.step_host_us:g}",
                     f"{s.layer_host_us:g}", f"{s.ifa_overhead_us:g}", "yes" if s.host_device_overlap else "no",
                     ", ".join(sorted(s.fusions))])
    return _table(["stack", "runs", "dispatch us", "launch us", "step host us", "layer host us", "ifa overhead us",
                   "overlap", "fusions"], rows, "llrrrrrll")


def cmd_stacks(args) -> int:
    print(stack_table())
    print(f"\nEach value's source is in its preset file ({STACK_DIR}); pass --stack to report, llm and serve.")
    return 0


def cmd_matmul(args) -> int:
    _chip(args.chip)
    _writable("--json", args.json)
    r = simulate_matmul(args.m, args.k, args.n, dtype=args.dtype, chip=args.chip,
                        double_buffer=not args.no_double_buffer)
    _print_report(r, args.json)
    return 0


def cmd_vector(args) -> int:
    _chip(args.chip)
    _positive("--row-len", args.row_len, 1024)
    _writable("--json", args.json)
    r = simulate_vector(args.op, args.numel, dtype=args.dtype, chip=args.chip, row_len=args.row_len,
                        double_buffer=not args.no_double_buffer)
    _print_report(r, args.json)
    return 0


def _print_report(r, json_path) -> None:
    print(f"{r.name} on {r.chip} ({r.dtype}), tile {r.tile}, double buffer {r.double_buffer}")
    print(f"  cycles {r.cycles:,.0f}  time {r.time_us:,.2f} us  {r.tflops:.2f} TFLOPS  bound: {r.bound}")
    print(f"  cube utilisation {100 * r.cube_utilization:.1f}%  vector utilisation {100 * r.vector_utilization:.1f}%")
    print("  pipe busy (busiest core): " + ", ".join(f"{k} {v:,.0f}" for k, v in r.pipe_busy.items() if v))
    print("  buffer peak per core: " + ", ".join(f"{k} {v / 1024:.1f} KB" for k, v in r.buffer_peak.items()))
    if json_path:
        _write_json("--json", json_path, r.to_dict())
        print(f"  wrote {json_path}")


def cmd_calibrate(args) -> int:

    chip = get_chip(_chip(args.chip))
    _writable("--json", args.json)
    result = calibrate(chip)
    print(f"calibration of {chip.name} against datasets/calibration/ascend_mskpp_microbench.csv")
    print(format_calibration(result))
    if args.json:
        per_key = {k: v for k, v in result.items() if not k.startswith("_")}
        _write_json("--json", args.json, per_key)
        print(f"wrote {args.json}")
    return 0


def _load_model(args):
    """The model and inputs of ``report`` / ``compare``, their options checked first."""

    _chip(args.chip)
    _positive("--batch", args.batch, 8)
    _positive("--seq", args.seq, 128)
    if ":" in args.model and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a builder in the current folder, found as `python -m` would
    return load_model(args.model, args.batch, args.seq)


def cmd_report(args) -> int:

    if args.top < 0:
        raise CliError(f"--top {args.top}: must be 0 or more (the number of kernels to list); e.g. --top 15")
    _writable("--json", args.json)
    model, inputs = _load_model(args)
    rep = optimize(model, inputs, chip=args.chip, level=args.level, precision=args.precision,
                   stack=args.stack).report()
    print(rep.table(args.top))
    if args.json:
        _write_json("--json", args.json, rep.to_dict())
        print(f"wrote {args.json}")
    return 0


def cmd_compare(args) -> int:

    model, inputs = _load_model(args)
    reports = [optimize(model, inputs, chip=args.chip, level=lv, precision=args.precision, stack=args.stack).report()
               for lv in sorted(LEVELS)]
    base = reports[0].latency_us
    rows = [[f"level {r.level}", f"{r.latency_us:,.1f}", len(r.kernels), f"{r.gm_bytes / 1e6:,.1f}",
             f"{r.peak_memory_bytes / 1e6:,.1f}", f"{base / r.latency_us:.2f}x"] for r in reports]
    print(f"{reports[0].model} on {args.chip}, {args.precision}, batch {reports[0].batch}")
    print(_table(["level", "latency us", "kernels", "GM MB", "peak memory MB", "speedup"], rows))
    last = reports[-1]
    print(f"\npass by pass at level {last.level} (why each step changes the latency):")
    steps, prev = [], None
    for p in last.passes:
        change = "" if prev is None else f"{p.latency_us - prev:+,.1f}"
        why = p.summary
        steps.append([p.name, f"{p.latency_us:,.1f}", change, p.kernel_count, why[:100] + ("..." if len(why) > 100 else "")])
        prev = p.latency_us
    print(_table(["after pass", "latency us", "change", "kernels", "what it did"], steps, aligns="lrrrl"))
    for n in last.notes:
        print(f"note: {n}")
    return 0


def cmd_atc(args) -> int:
    from ..deploy.atc import check_args, om_path, run_atc

    check_args(args.model, args.framework, args.output, args.soc_version, args.precision_mode, args.input_shape)
    if args.level not in LEVELS:
        raise CliError(f"--level={args.level}: levels are 0, 1, 2, 3 (ATC's graph compiler is level 2)")
    _writable("--output", str(om_path(args.output)), "model")
    result = run_atc(args.model, args.framework, args.output, args.soc_version, args.input_shape,
                     args.precision_mode, args.out_nodes, args.level, argv=sys.argv[1:])
    rep = result.om.report()
    print(rep.table(args.top))
    ins = ", ".join(f"{i['name']} {tuple(i['shape'])} {i['dtype']}" for i in result.om.inputs)
    print(f"inputs: {ins}; precision {result.precision}")
    print(f"wrote {result.path} (format {result.om.manifest['format']} v{result.om.manifest['format_version']}; "
          f"load it with pypto_lab.load_om)")
    print("ATC run success, welcome to the next use.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pypto-lab", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tour", help="chip summaries, a matmul sweep on every chip, the ResNet-50/BERT walkthroughs "
                                   "and their HTML report")
    t.add_argument("--chips", nargs="*", help="limit to these chips (walkthroughs: Ascend910A and Ascend910B1)")
    t.add_argument("--html", default="out/tour.html", help="where to write the HTML report (default out/tour.html)")
    t.add_argument("--no-html", action="store_true", help="only the console tour: no walkthroughs, no HTML report")
    t.set_defaults(func=cmd_tour)
    sub.add_parser("chips", help="the chip presets").set_defaults(func=cmd_chips)
    sub.add_parser("stacks", help="the software-stack presets (how kernels reach the chip)").set_defaults(
        func=cmd_stacks)
    mm = sub.add_parser("matmul", help="simulate one matmul")
    mm.add_argument("m", type=int)
    mm.add_argument("k", type=int)
    mm.add_argument("n", type=int)
    vc = sub.add_parser("vector", help="simulate one vector kernel")
    vc.add_argument("op", choices=sorted(VECTOR_OPS))
    vc.add_argument("numel", type=int)
    vc.add_argument("--row-len", type=int)
    for q in (mm, vc):
        q.add_argument("--chip", default=DEFAULT_CHIP)
        q.add_argument("--dtype", default="fp16")
        q.add_argument("--no-double-buffer", action="store_true")
        q.add_argument("--json", help="also write the report as JSON")
    mm.set_defaults(func=cmd_matmul)
    vc.set_defaults(func=cmd_vector)
    for cmd, func, helptext in (("report", cmd_report, "optimise a model and print its kernels and totals"),
                                ("compare", cmd_compare, "the optimisation levels side by side")):
        q = sub.add_parser(cmd, help=helptext)
        q.add_argument("model", help="resnet50, bert-base, minilm, hf:NAME or hf:path/config.json (a transformers "
                                     "causal LM on meta), or package.module:function returning (model, inputs)")
        q.add_argument("--chip", default=DEFAULT_CHIP)
        q.add_argument("--batch", type=int, default=None,
                       help="batch size (default 1; a module:function builder: its own default)")
        q.add_argument("--seq", type=int, default=None,
                       help="sequence length (bert-base, minilm: default 128; a builder: if it takes seq)")
        q.add_argument("--precision", default="fp16")
        q.add_argument("--stack", default=DEFAULT_STACK,
                       help=f"the software stack that runs the kernels: {', '.join(list_stacks())} (default {DEFAULT_STACK})")
        if cmd == "report":
            q.add_argument("--level", type=int, default=1)
            q.add_argument("--top", type=int, default=15, help="kernels to list, slowest first")
            q.add_argument("--json", help="also write the report as JSON")
        q.set_defaults(func=func)
    c = sub.add_parser("calibrate", help="compare the model with the measured micro-benchmarks")
    c.add_argument("--chip", required=True)
    c.add_argument("--json", help="write {table/path/dtypes: {rows, mape, max_ape}} to this file")
    c.set_defaults(func=cmd_calibrate)
    a = sub.add_parser("atc", help="ATC's command: compile an ONNX model for a chip into an .om file "
                                   "(--model=model.onnx --framework=5 --output=model --soc_version=Ascend910)")
    a.add_argument("--model", required=True, help="the ONNX model file")
    a.add_argument("--framework", type=int, required=True, help="5: ONNX (ATC's code; the only one supported)")
    a.add_argument("--output", required=True, help="the OM's path without .om (ATC appends it)")
    a.add_argument("--soc_version", required=True, help="the chip: a preset name or ATC's (Ascend910 = Ascend910A)")
    a.add_argument("--input_shape", help='fixed input shapes, "input:1,3,224,224;mask:1,128"')
    a.add_argument("--precision_mode", help="ATC's precision mode (default force_fp16); see docs/om_format.md")
    a.add_argument("--out_nodes", help='the outputs, "node_name:index;..." (default: the graph\'s outputs)')
    a.add_argument("--level", type=int, default=2, help="(workbench, not ATC) the optimisation level, default 2")
    a.add_argument("--top", type=int, default=10, help="(workbench, not ATC) kernels to list, slowest first")
    a.set_defaults(func=cmd_atc)
    r = sub.add_parser("run", help="run an unmodified torch_npu script on the simulated card: .npu(), torch.npu, "
                                   "the fused operators, timed on the chip; a summary, a trace and kernel_details.csv")
    add_run_arguments(r)
    r.set_defaults(func=cmd_run)
    add_llm_commands(sub)
    return p


def cmd_run(args) -> int:
    return run_from_args(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ChipConfigError, TilingError, ValueError, KeyError, OSError, HBMCapacityError) as exc:
        print(f"pypto-lab: error: {_one_line(exc, getattr(args, 'flags', None))}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException, flags: dict[str, str] | None = None) -> str:
    """The error in one line; an argument error's fix in this command's flags (``--batch 1``, not
    ``batch=1``) when the command says which flag each argument is (``flags``)."""
    if isinstance(exc, OSError) and exc.strerror:  # e.g. a file vanished between the check and the write
        where = f" {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}:{where}; check the path and its permissions, or choose another one"
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else cli_text(exc, flags or {})
    return " ".join(str(text).split())


if __name__ == "__main__":
    sys.exit(main())
