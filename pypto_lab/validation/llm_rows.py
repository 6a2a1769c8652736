"""The LLM engine against the published Ascend LLM figures (``datasets/llm_published/``).

Three kinds of rows, each run the way it was measured:

* fixed-batch step latencies (torch_npu + torchair READMEs, Atlas 800I A2, prompts padded to 1,024
  tokens, 1,024 output tokens, timed around the model call): `simulate_generation`'s TTFT against
  the prefill step, its TPOT (the mean decode step) against the decode step. Graph-mode rows run on
  the ``torchair-graph`` stack, eager (单算子) rows on ``torch_npu-eager``; the deployment's model
  code decides how the KV cache is kept (`forward.KV_IMPLS`: torchair's ChatGLM3 port concatenates
  its cache and expands it to every head, its Llama and Qwen2 ports write it in place; the Qwen2
  tables were measured before that port passed actual_seq_lengths, so its attention reads the whole
  preallocated cache: `row_kv_impl`);
* serving runs with fixed prompt and output lengths at a request rate (vLLM-Ascend issues): `serve`
  with the same lengths and rate on ``vllm-ascend-aclgraph``;
* square-matmul TFLOPS measured on a 910B2: `simulate_matmul`.

The Atlas 800I A2's chip is the Ascend910B4 preset with the 64 GB of that server's bin (its
topology preset says why). The ``torchair-graph`` stack's ``ifa_overhead_us`` is the one constant
fitted to these rows (`fit_ifa_overhead`, by ``scripts/derive_stack_constants.py``): the models in
`HELD_BACK` are never part of that fit and are reported apart.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Callable, Iterable

from ..hw.chip import get_chip
from ..kernels.cost import cost
from ..kernels.ir import CubeKernel
from ..llm import simulate_generation
from ..llm.forward import MODEL_CODE
from ..llm.serving_validation import DATA, atlas_800i_a2, read_rows  # the one reader of the LLM figures
from ..stack import Launch, Stack, get_stack, run_in_order
from .compare import Comparison, FittedConstant

MODELS = {"Llama-2-7B": "llama-2-7b", "Llama-2-70B": "llama-2-70b", "Llama-3-70B": "llama-3-70b",
          "Qwen2-7B": "qwen2-7b", "Qwen2-72B": "qwen2-72b", "ChatGLM3-6B": "chatglm3-6b",
          "Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-VL-8B-Instruct (text-only prompts)": "qwen3-8b"}
# models whose rows no fit ever sees: they judge whether a fitted constant carries over
HELD_BACK = {"Llama-3-70B": "kept back from the torchair fit: a second 70B model of the same README family",
             "Llama-2-7B": "kept back from the torchair fit: its rows come from three other READMEs "
                           "(reduce-overhead, quantization)"}
GRAPH_STACK, EAGER_STACK = "torchair-graph", "torch_npu-eager"
FIT_SCRIPT = "scripts/derive_stack_constants.py"


def _precision(text: str) -> tuple[str, str | None]:
    t = text.lower()
    if "w8a8" in t:
        return "w8a8", ("int8" if "int8 kv" in t or "c8" in t else None)
    return ("bf16" if "bf16" in t else "fp16"), None


def _num(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def row_stack(row: dict) -> str:
    """The stack a fixed-batch row ran on: torchair's graph mode, or eager single-operator mode."""
    f = row["framework"].lower()
    return EAGER_STACK if ("eager" in f or "单算子" in f) else GRAPH_STACK


def row_kv_impl(row: dict) -> str:
    """How the row's model code keeps its KV cache (`forward.KV_IMPLS`), from the code it ran:
    torchair's ChatGLM3 port concatenates it; its Qwen2 port's tables (README at e45676cf,
    2024-07-08; unchanged since) came before the port passed actual_seq_lengths to
    IncreFlashAttention (81386be4, 2024-07-29), so attention reads the whole preallocated cache;
    its Llama tables (2024-08-21 and -27) were measured with actual_seq_lengths (since 3ada6779,
    2024-07-22)."""
    if "/chatglm/" in row["source_url"]:
        return "concat-expand"
    return "in-place-full" if "/llm/qwen/" in row["source_url"] else "in-place"


def row_code(row: dict) -> str:
    """The torchair port whose model code the row ran (`forward.MODEL_CODE`): its host operations
    are what an eager row's host runs per layer."""
    url = row["source_url"]
    return "torchair-chatglm3" if "/chatglm/" in url else "torchair-qwen2" if "/llm/qwen/" in url else "torchair-llama"


def _stack(name: str, overrides: dict | None) -> Stack:
    s = get_stack(name)
    return s.with_values(name=s.name, **overrides) if overrides else s


@dataclasses.dataclass(frozen=True)
class _Setup:
    model: str
    cards: int
    batch: int
    precision: str
    kv_dtype: str | None
    stack: str
    kv_impl: str
    code: str


def _setup_of(row: dict) -> _Setup:
    prec, kv = _precision(row["precision"])
    return _Setup(row["model"], _num(row["cards"]) or 1, _num(row["batch"]) or 1, prec, kv, row_stack(row),
                  row_kv_impl(row), row_code(row))


def is_fixed_batch(row: dict) -> bool:
    return ("torchair" in row["framework"].lower() and row["model"] in MODELS
            and row["metric"] in ("prefill_step_latency_ms", "decode_step_latency_ms"))


def _describe(s: _Setup) -> str:
    return (f"{s.cards}x910B4 b{s.batch} {s.precision}" + (f"+kv {s.kv_dtype}" if s.kv_dtype else "")
            + " 1024+1024")


def _mechanisms(s: _Setup, stack: Stack, decode: bool) -> tuple[str, ...]:
    out = []
    if s.kv_impl == "concat-expand":
        out.append("KV cache concatenated and expanded to every head each step (modeling_chatglm.py)")
    if decode and s.kv_impl == "in-place-full":
        out.append("IncreFlashAttention reads the whole preallocated cache each step (no actual_seq_lengths)")
    if decode and stack.ifa_overhead_us and s.kv_impl != "concat-expand":
        out.append(f"per-IncreFlashAttention overhead of the graph ({stack.ifa_overhead_us:.0f} us, fitted)")
    if stack.dispatch_us:
        out.append(f"eager dispatch {stack.dispatch_us:g} us per kernel")
    if stack.runs == "eager" and stack.host_op_us:
        code = MODEL_CODE[s.code]
        out.append(f"host runs the model code ({s.code}: {code.ops} operations per layer, {code.kernels} of them "
                   f"kernels) at {stack.host_op_us:g} us per operation, fitted")
    if stack.runs == "graph" and stack.dynamic_shape_dispatch_us and s.kv_impl == "concat-expand":
        out.append(f"dynamic-shape graph scheduled from the host, {stack.dynamic_shape_dispatch_us:g} us per kernel")
    return tuple(out)


def fixed_batch(rows: Iterable[dict], overrides: dict[str, dict] | None = None,
                tick: Callable[[], None] | None = None) -> list[Comparison]:
    """The torchair rows as `Comparison`s; ``overrides`` changes stack values by stack name (the
    fit runs the graph stack with ``ifa_overhead_us=0``)."""
    chip = atlas_800i_a2()
    memo: dict[_Setup, object] = {}
    out = []
    for r in rows:
        if not is_fixed_batch(r):
            continue
        s = _setup_of(r)
        stack = _stack(s.stack, (overrides or {}).get(s.stack))
        if s not in memo:
            memo[s] = simulate_generation(MODELS[s.model], batch=s.batch, prompt_len=1024, output_len=1024, chip=chip,
                                          cards=s.cards, precision=s.precision, kv_dtype=s.kv_dtype, stack=stack,
                                          kv_impl=s.kv_impl, code=s.code)
            if tick:
                tick()
        rep = memo[s]
        decode = r["metric"].startswith("decode")
        regime = ("LLM decode (TPOT)" if decode else "LLM prefill (TTFT)")
        c = Comparison(set="llm", regime=regime, model=s.model, setup=_describe(s), stack=stack.name,
                       metric=r["metric"], unit="ms", published=float(r["value"]), source=r["source_url"],
                       row=f"id {r['id']}", simulated=rep.tpot_ms if decode else rep.ttft_ms,
                       held_back=s.model in HELD_BACK, mechanisms=_mechanisms(s, stack, decode),
                       ifa_runs=sum(k.count for k in rep.decode_kernels if k.spec.ifa_overhead) if decode else 0)
        out.append(c)
    return out


def matmuls(rows: Iterable[dict], loop: int = 100) -> list[Comparison]:
    """The square-matmul micro-figures, as a torch_npu script measures them: ``torch.matmul`` called
    ``loop`` times in a row on the eager stack (the host dispatches each call while the card runs the
    previous one), the flops over the loop's time. A short kernel is host-bound: its figure is the
    dispatch's, not the Cube's."""
    stack = get_stack(EAGER_STACK)
    out = []
    for r in rows:
        m = re.match(r"\(micro\) square matmul (\d+)x\d+", r["model"])
        if not m or r["metric"] != "matmul_tflops":
            continue
        n = int(m.group(1))
        dt = r["precision"]
        k = cost(CubeKernel("MatMulV2", 1, n, n, n, dt, dt), get_chip("Ascend910B2"))
        per_call_us = run_in_order([Launch(k.time_us, loop)], stack).step_us / loop
        host_bound = per_call_us > 1.01 * (k.time_us + stack.launch_us)
        out.append(Comparison(set="llm", regime="matmul micro (TFLOPS)", model=f"matmul {n}^3",
                              setup=f"910B2 {dt}", stack=stack.name, metric="matmul_tflops",
                              unit="TFLOPS", published=float(r["value"]), source=r["source_url"], row=f"id {r['id']}",
                              simulated=k.flops / per_call_us / 1e6,
                              mechanisms=(f"torch.matmul in a loop on {stack.name}"
                                          + (": host-bound (the dispatch outlasts the kernel)" if host_bound else ""),)))
    return out


def _serving_mechanisms(run) -> tuple[str, ...]:
    """The host-side mechanisms a serving run charges, named for the report."""
    from ..stack import get_stack
    out = []
    layer_host = get_stack(run.stack).layer_host_us
    if layer_host:
        out.append(f"graph cut at each attention layer (PIECEWISE): {layer_host:g} us of host per layer per step")
    if run.async_scheduling:
        out.append("async scheduling (vLLM >= 0.14): a request arriving during a step joins the step after the next")
    return tuple(out)


def serving_rows(tick: Callable[[], None] | None = None) -> list[Comparison]:
    """Every published serving row run the way it was measured (`pypto_lab.llm.serving_validation`:
    rate or closed loop, the row's lengths, requests, cards and stack), one simulation per distinct
    run; the rows it cannot express come back skipped, with the reason."""
    from ..llm import serving_validation as sv
    rows = read_rows()
    by_id = {int(r["id"]): r for r in rows}
    todo, skipped = sv.plan(rows)
    regimes = {"TTFT": "serving TTFT", "ITL": "serving ITL / TPOT", "throughput": "serving throughput"}
    reports, out = {}, []
    for row, run, assumed in todo:
        if run not in reports:
            reports[run] = sv.simulate(run)
            if tick:
                tick()
        kind, get = sv.METRICS[row["metric"]]
        out.append(Comparison(set="serving", regime=regimes[kind], model=row["model"],
                              setup=f"{run.cards}x{run.chip} {run.load} {run.prompt}+{run.output} x{run.requests}",
                              stack=run.stack, metric=row["metric"], unit=row["unit"], published=float(row["value"]),
                              source=row["source_url"], row=f"id {row['id']}", simulated=float(get(reports[run])),
                              mechanisms=(f"{run.load}, continuous batching",) + _serving_mechanisms(run)
                              + tuple(assumed)))
    for s in skipped:
        row = by_id[s["id"]]
        kind = sv.METRICS.get(row["metric"], ("TTFT",))[0]
        out.append(Comparison(set="serving", regime=regimes.get(kind, "serving TTFT"), model=row["model"],
                              setup=row["batch"], stack=row["framework"], metric=row["metric"], unit=row["unit"],
                              published=float(row["value"]), source=row["source_url"], row=f"id {row['id']}",
                              skipped=s["reason"]))
    return out


# ---- the torchair stack's fitted constant ------------------------------------------------------

def fit_rows(comparisons: Iterable[Comparison]) -> list[Comparison]:
    """The rows `fit_ifa_overhead` fits on: graph-mode decode rows with IncreFlashAttention over a
    preallocated cache, of the models not held back."""
    return [c for c in comparisons if c.stack == GRAPH_STACK and c.regime == "LLM decode (TPOT)"
            and c.ifa_runs and not c.held_back]


def solve_additive(points: list[tuple[float, float, float]]) -> float:
    """The ``t`` >= 0 minimising the squared relative errors of ``base + runs * t / 1000`` against
    ``published`` over ``points`` of (base ms, runs per step, published ms)."""
    num = sum(n / p * (p - b) / p for b, n, p in points)
    den = sum((n / p) ** 2 for b, n, p in points)
    return max(0.0, 1000 * num / den) if den else 0.0


def fit_ifa_overhead(base: list[Comparison]) -> tuple[float, dict[str, float]]:
    """``ifa_overhead_us`` fitted on ``base`` (rows simulated with it at 0), and per model the value
    fitted without that model's rows (leave one model out)."""
    rows = fit_rows(base)
    pts = {c.model: [] for c in rows}
    for c in rows:
        pts[c.model].append((c.simulated, c.ifa_runs, c.published))
    t = solve_additive([p for v in pts.values() for p in v])
    lomo = {m: solve_additive([p for k, v in pts.items() if k != m for p in v]) for m in pts}
    return t, lomo


def with_leave_one_model_out(comparisons: list[Comparison], stack: Stack) -> FittedConstant | None:
    """Set each graph-mode row's leave-one-model-out figure: the constant ``stack.ifa_overhead_us``
    (fitted on every fit row) refitted without the row's model. The constant enters a step
    additively, once per IncreFlashAttention run, so the refit needs no new simulation."""
    t_now = stack.ifa_overhead_us
    rows = [c for c in comparisons if c.ifa_runs and c.stack == stack.name]
    if not t_now or not rows:
        return None
    base = [dataclasses.replace(c, simulated=c.simulated - c.ifa_runs * t_now / 1000) for c in rows]
    _, lomo = fit_ifa_overhead(base)
    for c, b in zip(rows, base):
        if c.model in lomo:
            c.lomo_simulated = b.simulated + c.ifa_runs * lomo[c.model] / 1000
    return FittedConstant(stack.name, "ifa_overhead_us", t_now, FIT_SCRIPT,
                          tuple(f"{c.model} {c.row}" for c in fit_rows(comparisons)))


# ---- the eager stack's fitted constant -----------------------------------------------------------

def eager_fit_rows(rows: Iterable[dict], exclude: str | None = None) -> list[dict]:
    """The published rows `fit_host_op_us` fits on: eager (单算子) decode rows of the models not held
    back (without ``exclude``'s)."""
    return [r for r in rows if is_fixed_batch(r) and row_stack(r) == EAGER_STACK and r["metric"].startswith("decode")
            and r["model"] not in HELD_BACK and r["model"] != exclude]


def _eager_loss(rows: list[dict], host_op_us: float) -> float:
    cs = fixed_batch(rows, overrides={EAGER_STACK: {"host_op_us": host_op_us}})
    return sum(((c.simulated - c.published) / c.published) ** 2 for c in cs)


def fit_host_op_us(rows: Iterable[dict], exclude: str | None = None, hi: float = 200.0, tol: float = 0.05) -> float:
    """``torch_npu-eager``'s ``host_op_us``: the host time per operation of the model code that
    minimises the squared relative errors of the eager decode rows (`eager_fit_rows`, without
    ``exclude``'s model). The step is not additive in it (the device waits only once the host is
    the slower), so each trial re-runs the rows' steps (their kernels' costs are memoised);
    golden-section search on [0, ``hi``] us, the loss having one minimum there."""
    fit = eager_fit_rows(rows, exclude)
    if not fit:
        return 0.0
    g = (5 ** 0.5 - 1) / 2
    a, b = 0.0, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = _eager_loss(fit, c), _eager_loss(fit, d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = _eager_loss(fit, c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = _eager_loss(fit, d)
    return (a + b) / 2


def with_eager_leave_one_model_out(comparisons: list[Comparison], rows: list[dict],
                                   stack: Stack) -> FittedConstant | None:
    """Set each eager fixed-batch row's leave-one-model-out figure: ``stack.host_op_us`` refitted
    without the row's model (`fit_host_op_us`), the row re-run with that value."""
    t_now = stack.host_op_us
    fit = eager_fit_rows(rows)
    if not t_now or not fit:
        return None
    fixed = [r for r in rows if is_fixed_batch(r) and row_stack(r) == EAGER_STACK]
    by_row = {c.row: c for c in comparisons if c.stack == stack.name}
    for model in sorted({r["model"] for r in fit}):
        t = fit_host_op_us(rows, exclude=model)
        for c in fixed_batch([r for r in fixed if r["model"] == model],
                             overrides={EAGER_STACK: {"host_op_us": t}}):
            if c.row in by_row:
                by_row[c.row].lomo_simulated = c.simulated
    return FittedConstant(stack.name, "host_op_us", t_now, FIT_SCRIPT,
                          tuple(f"{r['model']} id {r['id']}" for r in fit))


def llm_set(tick: Callable[[], None] | None = None) -> tuple[list[Comparison], list[FittedConstant]]:
    rows = read_rows()
    out = fixed_batch(rows, tick=tick)
    fitted = [with_leave_one_model_out(out, get_stack(GRAPH_STACK)),
              with_eager_leave_one_model_out(out, rows, get_stack(EAGER_STACK))]
    return out + matmuls(rows), [f for f in fitted if f]


def serving_set(tick: Callable[[], None] | None = None) -> tuple[list[Comparison], list[FittedConstant]]:
    return serving_rows(tick=tick), []


def median_error(rows: list[Comparison]) -> float:
    return statistics.median(abs(c.error) for c in rows)


__all__ = ["DATA", "HELD_BACK", "MODELS", "atlas_800i_a2", "eager_fit_rows", "fit_host_op_us", "fit_ifa_overhead",
           "fit_rows", "fixed_batch", "llm_set", "matmuls", "read_rows", "row_code", "row_kv_impl", "row_stack",
           "serving_rows", "serving_set", "solve_additive", "with_eager_leave_one_model_out",
           "with_leave_one_model_out"]
