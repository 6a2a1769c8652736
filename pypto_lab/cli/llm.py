"""The command line's LLM and validation commands: ``pypto-lab llm`` (one batch: TTFT, TPOT,
HBM), ``pypto-lab serve`` (a stream of requests under continuous batching; with ``--http PORT``
the OpenAI-compatible serving twin of `pypto_lab.server`) and ``pypto-lab validate`` (whole models against published Ascend throughput)."""

from __future__ import annotations

import argparse
import math
import sys

from ..files.atomic import check_writable, write_json_atomic
from ..hw.chip import DEFAULT_CHIP
from ..llm import known_models, serve, simulate_generation
from ..llm.validation import check_real
from ..stack import DEFAULT_LLM_STACK, get_stack, list_stacks
from ..validation.suite import SETS, validate_sets

# each command's arguments as its flags: errors about an argument give their fix in these
# (``--batch 1``, ``--rate inf``), not in Python (`pypto_lab.llm.validation.cli_text`)
COMMON_FLAGS = {"chip": "--chip", "cards": "--cards", "precision": "--precision", "kv_dtype": "--kv-dtype",
                "launch_us": "--launch-us"}
LLM_FLAGS = {**COMMON_FLAGS, "batch": "--batch", "prompt_len": "--prompt", "output_len": "--output", "tp": "--tp"}
SERVE_FLAGS = {**COMMON_FLAGS, "requests": "--requests", "rate": "--rate", "seed": "--seed",
               "scheduler": "--scheduler", "max_batched_tokens": "--max-batched-tokens", "block_size": "--block-size",
               "lengths": "--lengths", "concurrency": "--concurrency", "shared_prefix": "--shared-prefix",
               "max_num_seqs": "--max-num-seqs"}


def _rate(text: str) -> float:
    v = float(text)
    if math.isnan(v):
        raise argparse.ArgumentTypeError(f"--rate {text}: a number of requests per second, or inf")
    return v


def _model_help() -> str:
    return f"a known name ({', '.join(known_models())}) or a config.json path"


def _stack(args):
    """The --stack preset, with --launch-us in place of its per-kernel launch when given."""
    stack = get_stack(args.stack)
    if args.launch_us is None:
        return stack
    launch = check_real("launch_us", args.launch_us, low=0.0, example=0.0, what="a per-kernel launch cost in us")
    return stack.with_values(launch_us=launch)


def cmd_llm(args) -> int:
    check_writable(args.json, "--json", "out/llm.json")
    rep = simulate_generation(args.model, batch=args.batch, prompt_len=args.prompt, output_len=args.output,
                              chip=args.chip, cards=args.cards, tp=args.tp, precision=args.precision,
                              kv_dtype=args.kv_dtype, stack=_stack(args))
    print(rep.table())
    if args.json:
        write_json_atomic(args.json, rep.to_dict())
        print(f"wrote {args.json}")
    return 0


def cmd_serve(args) -> int:
    if args.http is not None:
        return _serve_http(args)
    check_writable(args.json, "--json", "out/serve.json")
    rep = serve(args.model, chip=args.chip, requests=args.requests, rate=args.rate, seed=args.seed, cards=args.cards,
                scheduler=args.scheduler, max_batched_tokens=args.max_batched_tokens, block_size=args.block_size,
                precision=args.precision, kv_dtype=args.kv_dtype, stack=_stack(args), lengths=args.lengths,
                progress=not args.quiet, max_num_seqs=args.max_num_seqs, concurrency=args.concurrency,
                shared_prefix=args.shared_prefix, prefix_caching=args.prefix_caching)
    print(rep.summary())
    if args.json:
        write_json_atomic(args.json, rep.to_dict())
        print(f"wrote {args.json}")
    return 0


def _serve_http(args) -> int:
    """``serve --http PORT``: the OpenAI-compatible serving twin (`pypto_lab.server`) in the foreground."""
    from ..server.run import is_loopback, serve_http

    if not 0 <= args.http <= 65535:
        raise ValueError(f"--http {args.http}: a TCP port is 0-65535. Fix: e.g. --http 8000")
    if not 0 < args.time_scale < math.inf:
        raise ValueError(f"--time-scale {args.time_scale}: wall seconds per simulated second, a positive number. "
                         "Fix: --time-scale 1 (the card's speed) or 0.1 (ten times faster)")
    if not is_loopback(args.host):
        print(f"pypto-lab: warning: --host {args.host} exposes an API without authentication beyond this machine; "
              "the default, 127.0.0.1, keeps it local", file=sys.stderr)
    print(f"serving {args.model} on {args.cards} x {args.chip} ({args.stack}) at http://{args.host}:{args.http}/v1, "
          f"time scale {args.time_scale} (wall s per simulated s); metrics at /metrics", flush=True)
    serve_http(args.model, args.chip, args.cards, host=args.host, port=args.http, stack=_stack(args),
               precision=args.precision, kv_dtype=args.kv_dtype, time_scale=args.time_scale,
               max_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs,
               block_size=args.block_size, max_waiting=args.max_waiting, seed=args.seed, warmup=args.warmup,
               log_level=args.log_level)
    return 0


def cmd_validate(args) -> int:
    check_writable(args.json, "--json", "out/validate.json")
    sets = "all" if args.set is None else args.set
    if args.chip is not None or args.level != 3:       # --chip / --level: the inference rows only
        from ..files.progress import progress as progress_bar
        from ..validation.compare import Summary
        from ..validation.inference_rows import check_inference_arguments, inference_set

        if args.set not in (None, "inference"):
            raise ValueError(f"--chip and --level choose the inference rows' chip and optimisation level; --set "
                             f"{args.set} has neither. Fix: --set inference, or drop --chip / --level")
        check_inference_arguments(args.chip, args.level)
        with progress_bar(desc="validate", unit="row", disable=args.quiet) as bar:
            rows, fitted = inference_set(chip=args.chip, level=args.level, tick=lambda: bar.update(1))
        summary = Summary(rows, fitted)
    else:
        summary = validate_sets(sets, stack=args.stack, progress=not args.quiet)
    print(summary.table())
    if args.json:
        write_json_atomic(args.json, summary.to_dict())
        print(f"wrote {args.json}")
    return 0


def add_llm_commands(sub) -> None:
    """Register ``llm`` and ``serve`` on the main parser's subcommands."""
    g = sub.add_parser("llm", help="prefill and decode of one batch of an LLM: TTFT, TPOT, throughput, HBM per card")
    g.add_argument("model", help=_model_help())
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--prompt", type=int, default=1024, help="prompt tokens per sequence (default 1024)")
    g.add_argument("--output", type=int, default=256, help="output tokens per sequence (default 256)")
    s = sub.add_parser("serve", help="serve a Poisson stream of requests (or a closed loop) with continuous batching")
    s.add_argument("model", help=_model_help())
    s.add_argument("--rate", type=_rate, default=None,
                   help="requests per second (inf: all at once; default 10, or inf with --concurrency)")
    s.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="at most N requests in flight, the next sent when one is answered (vllm bench serve "
                        "--max-concurrency; a closed loop unless --rate is given)")
    s.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS",
                   help="a system prompt of TOKENS tokens in front of every prompt (default 0)")
    s.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM's automatic prefix caching: shared prefix blocks computed and held once (default on)")
    s.add_argument("--requests", type=int, default=1000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--scheduler", choices=["continuous", "static"], default="continuous")
    s.add_argument("--max-batched-tokens", type=int, default=8192)
    s.add_argument("--block-size", type=int, default=128)
    s.add_argument("--lengths", help="a CSV trace with columns prompt_tokens,output_tokens[,arrival_s]")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    h = s.add_argument_group("the serving twin (an OpenAI-compatible server on the simulated card)")
    h.add_argument("--http", type=int, metavar="PORT", help="serve the OpenAI API on this port instead of simulating "
                   "a request stream offline")
    h.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    h.add_argument("--time-scale", type=float, default=1.0,
                   help="wall seconds per simulated second (default 1: the card's speed; 0.1: ten times faster)")
    s.add_argument("--max-num-seqs", type=int, default=256, help="sequences one step may run (default 256)")
    h.add_argument("--max-waiting", type=int, default=1024,
                   help="requests waiting for admission before new ones get 429 (default 1024)")
    h.add_argument("--warmup", type=int, default=0, help="serve this many requests offline first, so typical steps "
                   "are costed before a client waits on them (default 0)")
    h.add_argument("--log-level", default="info", help="uvicorn's and the per-request logs' level (default info)")
    for q in (g, s):
        q.add_argument("--chip", default=DEFAULT_CHIP)
        q.add_argument("--cards", type=int, default=1)
        q.add_argument("--precision", default="fp16", help="fp16, bf16, w8a16 or w8a8")
        q.add_argument("--kv-dtype", default=None, help="fp16, bf16 or int8 (default: the precision's)")
        q.add_argument("--stack", default=DEFAULT_LLM_STACK,
                       help=f"the software stack running the steps: {', '.join(list_stacks())} (default {DEFAULT_LLM_STACK})")
        q.add_argument("--launch-us", type=float, default=None,
                       help="the device-side launch cost of each kernel, in place of the stack's (microseconds)")
        q.add_argument("--json", help="also write the report as JSON")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: all cards)")
    g.set_defaults(func=cmd_llm, flags=LLM_FLAGS)
    s.set_defaults(func=cmd_serve, flags=SERVE_FLAGS)
    v = sub.add_parser("validate", help="every published Ascend figure in datasets/ against the simulator, per regime "
                       "and stack")
    v.add_argument("--set", choices=(*SETS, "all"), default=None,
                   help="which published rows: inference (datasets/published), llm and serving "
                        "(datasets/llm_published), training (datasets/published_training), or all (the default)")
    v.add_argument("--stack", default=None, help="only the rows measured on this software stack (pypto-lab stacks)")
    v.add_argument("--chip", default=None, help="inference rows: only this chip's rows (default: every row)")
    v.add_argument("--level", type=int, default=3, help="inference rows: optimisation level (default 3)")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.add_argument("--json", help="also write the rows and errors as JSON")
    v.set_defaults(func=cmd_validate, flags={"chip": "--chip", "level": "--level", "stack": "--stack"})
