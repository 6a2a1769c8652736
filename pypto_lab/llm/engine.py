"""`simulate_generation`: how fast an LLM answers a batch on one or more simulated Ascend cards —
time to first token (the prefill), time per output token (the decode steps, which grow with the
context), throughput, HBM per card, communication, and where decode sits on the roofline — and
`step_model`, the same engine as a `StepModel` for the serving simulator.

Every time comes from the chip model through `forward.forward_kernels`; nothing is fitted per
model. The prefill, one step, is simulated exactly; the decode steps, costed at several contexts,
and the serving steps use the grid strategy (`pypto_lab.kernels.grid`). Decode steps are costed at a few context lengths across the generation (the step is linear
in context once the KV cache dominates, and attention is interpolated between simulated points),
and their mean is the TPOT.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..hw.chip import DEFAULT_CHIP, Chip, get_chip
from ..hw.collectives import get_topology, list_topologies
from ..kernels.cost import CostedKernel
from ..stack import Stack, get_stack
from ..stack.preset import DEFAULT_LLM_STACK
from .configs import LLMConfigError, LLMSpec, spec_of
from .forward import KV_IMPLS, MODEL_CODE, Hardware, check_hardware, forward_kernels, hw_step_time_us
from .memory import (
    DEFAULT_HBM_UTILIZATION,
    HBMCapacityError,
    HBMUse,
    activation_bytes,
    capacity_bytes,
    describe,
    kv_bytes_per_token,
    state_bytes_per_sequence,
    weights_bytes,
)
from .serving import ServeReport, check_serving_arguments, read_trace, simulate_serving
from .validation import check_count, check_positions, check_real, hinted


def default_topology(chip: Chip, cards: int):
    """The server preset for ``cards`` cards of ``chip``'s family (hw/topologies/*.toml): the
    smallest that holds them, preferring one built of this very chip."""
    if cards <= 1:
        return None
    family = chip.name[:10]                      # "Ascend910B", "Ascend910A"
    fits = []
    for name in list_topologies():
        t = get_topology(name)
        if t.chip.startswith(family) and t.max_cards >= cards:
            fits.append((t.max_cards, t.chip != chip.name, name, t))
    if not fits:
        raise LLMConfigError(
            f"cards = {cards} on {chip.name}: no server topology of that chip family holds {cards} cards "
            f"({', '.join(list_topologies())}). Rule: more than one card needs a topology. Fix: pass "
            "topology=<a TOML path> describing your cluster, or fewer cards")
    return min(fits)[3]


def launch_moved(value, stack) -> LLMConfigError:
    """The error for the engine's old ``launch_us`` argument: the launch cost is the stack's now."""
    return LLMConfigError("launch_us", value, "the cost of launching a kernel belongs to the software stack, not to "
                          "the engine's arguments", hint=f"pass stack=pypto_lab.get_stack('{get_stack(stack).name}')"
                          f".with_values(launch_us=...) (or a preset of pypto_lab.list_stacks())")


def hardware(chip: str | Chip, cards: int = 1, tp: int | None = None, ep: int = 1, precision: str = "fp16",
             kv_dtype: str | None = None, topology=None, stack: str | Stack = DEFAULT_LLM_STACK,
             kv_impl: str = "in-place", code: str | None = None) -> Hardware:
    """A `Hardware` from user arguments: ``tp=None`` means tensor parallelism over all cards;
    ``stack`` the software stack running the steps (`pypto_lab.stack`); ``kv_impl`` how the
    deployment's model code keeps the KV cache (`forward.KV_IMPLS`); ``code`` the model code whose
    host operations an eager stack runs (a name of `forward.MODEL_CODE`, None: not charged)."""
    if kv_impl not in KV_IMPLS:
        raise LLMConfigError("kv_impl", kv_impl, "names how the model code keeps the KV cache: "
                             + "; ".join(f"'{k}': {v}" for k, v in KV_IMPLS.items()),
                             [("in-place", "vLLM-Ascend, MindIE, torchair's Llama and Qwen2 ports")])
    if code is not None and code not in MODEL_CODE:
        raise LLMConfigError("code", code, "names a deployment's model code whose host operations are counted",
                             [(c, MODEL_CODE[c].source) for c in MODEL_CODE])
    chip = get_chip(chip)
    stack = get_stack(stack)
    cards = check_count("cards", cards, 1, what="cards")
    tp = cards if tp is None else check_count("tp", tp, 1, what="tensor-parallel cards")
    if cards % tp:
        divs = [d for d in range(1, cards + 1) if cards % d == 0]
        raise hinted(LLMConfigError, f"tp = {tp} with cards = {cards}: tensor parallelism uses a divisor of the card "
                     f"count (the rest replicate as data parallelism). Fix: "
                     + " or ".join(f"{{tp={d}}}" for d in divs))
    ep = check_count("ep", ep, 1, what="expert-parallel cards")
    topo = get_topology(topology) if topology is not None else default_topology(chip, cards)
    kv = kv_dtype or ("bf16" if precision == "bf16" else "fp16")
    return Hardware(chip=chip, cards=cards, tp=tp, ep=ep, topology=topo, precision=precision, kv_dtype=kv,
                    stack=stack, kv_impl=kv_impl, code=MODEL_CODE[code] if code else None)


@dataclass
class LLMReport:
    """What `simulate_generation` found. Times in ms, bytes per card. `to_dict()` for JSON."""

    model: str
    chip: str
    cards: int
    tp: int
    ep: int
    precision: str
    kv_dtype: str
    batch: int
    prompt_len: int
    output_len: int
    ttft_ms: float
    tpot_ms: float
    step_vs_context: list[tuple[int, float]]
    hbm: HBMUse
    kv_bytes_per_token: int
    comm_ms: float
    comm_ms_prefill: float
    comm_ms_per_step: float
    roofline: dict[str, Any]
    prefill_kernels: list[CostedKernel] = field(repr=False)
    decode_kernels: list[CostedKernel] = field(repr=False)
    spec: LLMSpec = field(repr=False, default=None)
    stack: str = ""
    plugged: list[dict[str, Any]] = field(default_factory=list)

    def plugged_table(self) -> str:
        """One line per pto kernel plugged into the engine's steps: the phase (the prefill, or the
        decode steps), layer kind, kernel, simulated µs per call (the prefill at its prompts, decode
        at the middle context), calls per step, what it replaced."""
        def where(p):
            if p["phase"] == "prefill":
                return f"prefill of {p['batch']} x {p['context']} tokens"
            return f"context {p['context']}"
        return "\n".join(f"  {p['phase']:<7} {p['kind']:<17} {p['kernel']:<26} {p['us_per_call']:9.2f} us "
                         f"x{p['calls_per_step']:<3} = {p['ms_per_step']:.3f} ms per step (SIM, {where(p)}; replaces "
                         f"{', '.join(p['replaces'])})" for p in self.plugged)

    @property
    def e2e_ms(self) -> float:
        return self.ttft_ms + self.tpot_ms * max(0, self.output_len - 1)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.batch * 1000.0 / self.tpot_ms if self.tpot_ms else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch * self.output_len * 1000.0 / self.e2e_ms if self.e2e_ms else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "chip": self.chip, "stack": self.stack, "cards": self.cards, "tp": self.tp,
            "ep": self.ep,
            "precision": self.precision, "kv_dtype": self.kv_dtype, "batch": self.batch,
            "prompt_len": self.prompt_len, "output_len": self.output_len,
            "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms,
            "decode_tokens_per_s": self.decode_tokens_per_s, "output_tokens_per_s": self.output_tokens_per_s,
            "step_vs_context": [{"context": c, "step_ms": t} for c, t in self.step_vs_context],
            "weights_bytes": self.hbm.weights_bytes, "kv_cache_bytes": self.hbm.kv_cache_bytes,
            "activation_bytes": self.hbm.activation_bytes, "peak_hbm_bytes": self.hbm.peak_bytes,
            "hbm_capacity_bytes": self.hbm.capacity_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
            "comm_ms": self.comm_ms, "comm_ms_prefill": self.comm_ms_prefill, "comm_ms_per_step": self.comm_ms_per_step,
            "roofline": dict(self.roofline),
            "plugged": [dict(p) for p in self.plugged],
            "prefill_kernels": [k.to_dict() for k in self.prefill_kernels],
            "decode_kernels": [k.to_dict() for k in self.decode_kernels],
        }

    def table(self, top: int = 8) -> str:
        g = 2 ** 30
        lines = [
            f"{self.model} on {self.cards} x {self.chip} (tp {self.tp}, ep {self.ep}), {self.stack}, {self.precision}, "
            f"batch {self.batch}, {self.prompt_len} prompt + {self.output_len} output tokens",
            f"TTFT {self.ttft_ms:,.2f} ms   TPOT {self.tpot_ms:,.3f} ms   decode {self.decode_tokens_per_s:,.0f} tokens/s"
            f"   end to end {self.e2e_ms / 1000:,.2f} s",
            f"HBM per card: weights {self.hbm.weights_bytes / g:.2f} GiB, KV {self.hbm.kv_cache_bytes / g:.2f} GiB, "
            f"activations {self.hbm.activation_bytes / g:.2f} GiB = {self.hbm.peak_bytes / g:.2f} of "
            f"{self.hbm.capacity_bytes / g:.2f} GiB",
            f"decode: {self.roofline['bound']}-bound, {self.roofline['hbm_fraction']:.0%} of HBM bandwidth, "
            f"{self.roofline['intensity']:.1f} flop/byte (ridge {self.roofline['ridge']:.0f})"
            + (f"; communication {self.comm_ms_per_step:.3f} ms per step" if self.cards > 1 else ""),
        ]
        if self.plugged:
            lines += ["pto kernels plugged into the engine's steps:", self.plugged_table()]
        lines.append("slowest kernels of one decode step:")
        for k in sorted(self.decode_kernels, key=lambda k: -k.time_us)[:top]:
            lines.append(f"  {k.name:<26} x{k.count:<3} {k.time_us / 1000:9.3f} ms  {k.cost.bound}")
        return "\n".join(lines)


def _split(batch: int, hw: Hardware) -> int:
    """Sequences per model replica (cards // tp replicas share the batch)."""
    return max(1, math.ceil(batch / (hw.cards // hw.tp)))


def hbm_use(spec: LLMSpec, hw: Hardware, batch: int, tokens_per_seq: int, prefill_tokens: int,
            hbm_utilization: float = DEFAULT_HBM_UTILIZATION) -> HBMUse:
    b = _split(batch, hw)
    kernels = forward_kernels(spec, hw, prefill=[(min(prefill_tokens, tokens_per_seq), 0)] * b, costed=False)
    act = activation_bytes(spec, hw, kernels, b * min(prefill_tokens, tokens_per_seq))
    kv = b * (tokens_per_seq * kv_bytes_per_token(spec, hw) + state_bytes_per_sequence(spec, hw))
    return HBMUse(weights_bytes(spec, hw), kv, act, capacity_bytes(hw, hbm_utilization))


def largest_batch(spec: LLMSpec, hw: Hardware, tokens_per_seq: int, prefill_tokens: int,
                  hbm_utilization: float = DEFAULT_HBM_UTILIZATION) -> int:
    """The largest batch whose weights + KV + activations fit every card (0: not even one)."""
    replicas = hw.cards // hw.tp
    if not hbm_use(spec, hw, replicas, tokens_per_seq, prefill_tokens, hbm_utilization).fits:
        return 0
    lo, hi = replicas, replicas * 2
    while hbm_use(spec, hw, hi, tokens_per_seq, prefill_tokens, hbm_utilization).fits and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if hbm_use(spec, hw, mid, tokens_per_seq, prefill_tokens, hbm_utilization).fits else (lo, mid)
    return lo


def cards_needed(spec: LLMSpec, hw: Hardware, batch: int, tokens_per_seq: int, prefill_tokens: int,
                 hbm_utilization: float) -> int | None:
    """The fewest cards (tensor parallel, up to 64) on which the batch fits, or None."""
    for tp in (2, 4, 8, 16, 32, 64):
        if tp <= hw.tp or spec.heads % tp:
            continue
        try:
            h = dataclasses.replace(hw, cards=tp, tp=tp, ep=1, topology=default_topology(hw.chip, tp))
            check_hardware(spec, h)
        except LLMConfigError:
            continue
        if hbm_use(spec, h, batch, tokens_per_seq, prefill_tokens, hbm_utilization).fits:
            return tp
    return None


def check_fits(spec: LLMSpec, hw: Hardware, batch: int, tokens_per_seq: int, prefill_tokens: int,
               hbm_utilization: float) -> HBMUse:
    use = hbm_use(spec, hw, batch, tokens_per_seq, prefill_tokens, hbm_utilization)
    if use.fits:
        return use
    best = largest_batch(spec, hw, tokens_per_seq, prefill_tokens, hbm_utilization)
    if best:
        fix = (f"the largest batch that fits is {best} ({{batch={best}}}); or more cards / tensor parallelism, a "
               "shorter context, an int8 KV cache ({kv_dtype='int8'}) or int8 weights ({precision='w8a16'})")
    else:
        need = cards_needed(spec, hw, batch, tokens_per_seq, prefill_tokens, hbm_utilization)
        fix = (f"not even batch 1 fits; {need} cards with tensor parallelism would ({{cards={need}}})" if need else
               "no tensor-parallel split up to 64 cards fits it; use int8 weights ({precision='w8a16'}) or a "
               "shorter context")
    raise hinted(HBMCapacityError, f"{spec.name} at batch {batch} x {tokens_per_seq} tokens on {hw.chip.name} "
                 f"(tp {hw.tp}, {hw.precision}): {describe(use)}. Fix: {fix}")


def simulate_generation(model, batch: int = 1, prompt_len: int = 128, output_len: int = 128,
                        chip: str | Chip = DEFAULT_CHIP, cards: int = 1, tp: int | None = None,
                        precision: str = "fp16", *, ep: int = 1, kv_dtype: str | None = None, topology=None,
                        stack: str | Stack = DEFAULT_LLM_STACK, hbm_utilization: float = DEFAULT_HBM_UTILIZATION,
                        context_points: int = 5, launch_us: float | None = None,
                        kv_impl: str = "in-place", kernels: dict | None = None, code: str | None = None) -> LLMReport:
    """Prefill ``batch`` prompts of ``prompt_len`` tokens together, then decode ``output_len``
    tokens for each, on ``cards`` cards of ``chip``. ``model``: a known name, a config.json path, a
    transformers config or causal-LM module, or an `LLMSpec`; ``stack`` the software stack that
    runs the steps (`pypto_lab.stack`, vLLM-Ascend's ACL graph mode by default); ``kv_impl`` how
    the deployment's model code keeps the KV cache (`forward.KV_IMPLS`: "in-place", or
    "concat-expand" for code that concatenates the cache and expands it to every head). ``kernels``:
    pto kernels as the implementation of a layer kind in the decode steps, ``{"attention" |
    "linear_attention" | "moe": kernel}`` (`pypto_lab.llm.plug`: each costed by its SIM run at the
    step's shapes; a kernel declared ``phase="prefill"`` or ``"both"`` also runs the prefill, and so
    the TTFT; the report's ``plugged`` names them with their phase and cost). ``code``: the model
    code whose host operations an eager stack runs (`forward.MODEL_CODE`). Raises `HBMCapacityError`
    when the weights, the KV cache and the activations do not fit a card."""
    if launch_us is not None:
        raise launch_moved(launch_us, stack)
    spec = spec_of(model)
    batch = check_count("batch", batch, 1, what="sequences in the batch")
    prompt_len = check_count("prompt_len", prompt_len, 128, what="prompt tokens per sequence")
    output_len = check_count("output_len", output_len, 128, what="output tokens per sequence")
    hbm_utilization = check_real("hbm_utilization", hbm_utilization, low=0.0, low_open=True, high=1.0, example=0.9,
                                 what="the share of HBM the engine may use")
    context_points = check_count("context_points", context_points, 5, what="decode contexts to cost")
    hw = hardware(chip, cards, tp, ep, precision, kv_dtype, topology, stack, kv_impl, code)
    check_hardware(spec, hw)
    plugged = None
    if kernels:
        from .plug import resolve  # pto is imported only when a kernel is plugged in
        plugged = resolve(spec, hw, kernels)
    check_positions(spec.name, spec.max_positions, prompt_len, output_len)
    total = prompt_len + output_len
    if hw.kv_impl == "in-place-full":      # the cache is allocated for the whole generation
        hw = dataclasses.replace(hw, kv_capacity=total)
    use = check_fits(spec, hw, batch, total, prompt_len, hbm_utilization)
    b = _split(batch, hw)
    prefill = forward_kernels(spec, hw, prefill=[(prompt_len, 0)] * b, strategy="exact",   # one step: simulated
                              plugged=plugged)
    ttft_ms = hw_step_time_us(prefill, hw) / 1000
    steps = max(1, output_len - 1)
    first, last = prompt_len + 1, prompt_len + steps
    n = max(2, min(context_points, steps))
    ctxs = sorted({round(first + (last - first) * i / (n - 1)) for i in range(n)})
    per_ctx = []
    for c in ctxs:
        ks = forward_kernels(spec, hw, decode=[c] * b, plugged=plugged)
        per_ctx.append((c, hw_step_time_us(ks, hw) / 1000, sum(k.time_us for k in ks if k.collective) / 1000))
    # mean over the steps: trapezoids between the costed contexts
    if len(per_ctx) == 1:
        tpot, comm_step = per_ctx[0][1], per_ctx[0][2]
    else:
        span = per_ctx[-1][0] - per_ctx[0][0]
        tpot = sum((b2[0] - a[0]) * (a[1] + b2[1]) / 2 for a, b2 in zip(per_ctx, per_ctx[1:])) / span
        comm_step = sum((b2[0] - a[0]) * (a[2] + b2[2]) / 2 for a, b2 in zip(per_ctx, per_ctx[1:])) / span
    mid = round((first + last) / 2)
    mid_kernels = forward_kernels(spec, hw, decode=[mid] * b, plugged=plugged)
    mid_us = hw_step_time_us(mid_kernels, hw)
    flops = sum(k.cost.flops * k.count for k in mid_kernels if not k.collective)
    gm = sum(k.cost.hbm_bytes * k.count for k in mid_kernels if not k.collective)
    peak = hw.chip.peak_tflops(hw.act_dtype) * 1e12
    bw = hw.chip.hbm_gbps * 1e9
    intensity = flops / gm if gm else 0.0
    ridge = peak / bw
    roofline = {"flops": flops, "hbm_bytes": gm, "intensity": intensity, "ridge": ridge,
                "bound": "memory" if intensity < ridge else "compute",
                "hbm_fraction": gm / (mid_us * 1e-6 * bw) if mid_us else 0.0,
                "cube_fraction": flops / (mid_us * 1e-6 * peak) if mid_us else 0.0, "context": mid}
    comm_prefill = sum(k.time_us for k in prefill if k.collective) / 1000
    return LLMReport(
        model=spec.name, chip=hw.chip.name, cards=hw.cards, tp=hw.tp, ep=hw.ep, precision=hw.precision,
        kv_dtype=hw.kv_dtype, batch=batch, prompt_len=prompt_len, output_len=output_len, ttft_ms=ttft_ms,
        tpot_ms=tpot, step_vs_context=[(c, t) for c, t, _ in per_ctx], hbm=use,
        kv_bytes_per_token=kv_bytes_per_token(spec, hw), comm_ms=comm_prefill + comm_step * steps,
        comm_ms_prefill=comm_prefill, comm_ms_per_step=comm_step, roofline=roofline, prefill_kernels=prefill,
        decode_kernels=mid_kernels, spec=spec, stack=hw.stack.name,
        plugged=_plugged_summary(prefill, "prefill", plugged, prompt_len, b)
        + _plugged_summary(mid_kernels, "decode", plugged, mid, b))


def _plugged_summary(kernels: list[CostedKernel], phase: str, plugged, context: int, batch: int) -> list[dict[str, Any]]:
    """The report's entry per plugged kernel of one step: the prefill (``context`` its prompt
    length), or the middle context's decode step. ``batch``: sequences per card."""
    if not plugged:
        return []
    from .plug import plugged_rows
    out = []
    for k in plugged_rows(kernels):
        kind = k.kernel.anchor
        out.append({"phase": phase, "kind": kind, "kernel": k.name.removeprefix("pto:"), "us_per_call": k.cost.time_us,
                    "calls_per_step": k.count, "ms_per_step": k.cost.time_us * k.count / 1000, "context": context,
                    "batch": batch, "shapes": [list(a.shape) for a in k.spec.args if hasattr(a, "shape")],
                    "replaces": list(k.fused_ops)})
    return out


class ChipStepModel:
    """A `StepModel` (see `step_model.py`) for ``spec`` on ``hw``: one engine step's time from
    `forward_kernels`, memoised on (prefill chunks, decode count, mean context rounded to 16).
    ``plugged``: pto kernels for layer kinds of the decode-only steps, and of the prefill-only
    steps for a kernel of the prefill phase (`plug.resolve`)."""

    def __init__(self, spec: LLMSpec, hw: Hardware, max_batched_tokens: int = 8192,
                 hbm_utilization: float = DEFAULT_HBM_UTILIZATION, plugged=None):
        check_hardware(spec, hw)
        self.spec, self.hw, self.plugged = spec, hw, plugged or None
        self.name = f"{spec.name} on {hw.cards} x {hw.chip.name} ({hw.stack.name})"
        self.max_positions = spec.max_positions      # serving refuses longer requests (validation.check_positions)
        self.kv_bytes_per_token = kv_bytes_per_token(spec, hw)
        act = activation_bytes(spec, hw, forward_kernels(spec, hw, prefill=[(max_batched_tokens, 0)], costed=False),
                               max_batched_tokens)
        self.kv_budget_bytes = int(capacity_bytes(hw, hbm_utilization) - weights_bytes(spec, hw) - act)
        if self.kv_budget_bytes < self.kv_bytes_per_token * 128:
            use = HBMUse(weights_bytes(spec, hw), 0, act, capacity_bytes(hw, hbm_utilization))
            raise HBMCapacityError(f"{self.name}: no room for a KV cache: {describe(use)}. Fix: more cards (tp), "
                                   "int8 weights, or a smaller max_batched_tokens")
        self._memo: dict[tuple, float] = {}

    def step_ms(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        n = len(decode)
        ctx = round(sum(decode) / n / 16) * 16 if n else 0
        key = (tuple(sorted((int(c), int(p) // 16 * 16) for c, p in prefill)), n, ctx)
        t = self._memo.get(key)
        if t is None:
            ks = forward_kernels(self.spec, self.hw, prefill=[(c, p) for c, p in key[0]], decode=[max(1, ctx)] * n,
                                 plugged=self.plugged)
            t = self._memo[key] = hw_step_time_us(ks, self.hw) / 1000
        return t


def step_model(model, chip: str | Chip = DEFAULT_CHIP, cards: int = 1, tp: int | None = None,
               precision: str = "fp16", *, ep: int = 1, kv_dtype: str | None = None, topology=None,
               stack: str | Stack = DEFAULT_LLM_STACK, max_batched_tokens: int = 8192,
               hbm_utilization: float = DEFAULT_HBM_UTILIZATION, launch_us: float | None = None,
               kernels: dict | None = None) -> ChipStepModel:
    """The serving simulator's view of ``model`` on ``cards`` x ``chip`` under ``stack``; ``kernels``
    as for `simulate_generation` (pto kernels in the decode-only steps, and in the prefill-only
    steps for a kernel of the prefill phase)."""
    if launch_us is not None:
        raise launch_moved(launch_us, stack)
    spec = spec_of(model)
    max_batched_tokens = check_count("max_batched_tokens", max_batched_tokens, 8192, what="tokens one step may run")
    hbm_utilization = check_real("hbm_utilization", hbm_utilization, low=0.0, low_open=True, high=1.0, example=0.9,
                                 what="the share of HBM the engine may use")
    hw = hardware(chip, cards, tp, ep, precision, kv_dtype, topology, stack)
    if hw.cards // hw.tp > 1:
        raise hinted(LLMConfigError, f"cards = {cards}, tp = {hw.tp}: serving models one replica. Fix: tp=cards "
                     f"({{tp={hw.cards}}}), or serve each replica on its own")
    plugged = None
    if kernels:
        from .plug import resolve
        plugged = resolve(spec, hw, kernels)
    return ChipStepModel(spec, hw, max_batched_tokens, hbm_utilization, plugged)


__all__ = ["ChipStepModel", "LLMReport", "cards_needed", "check_fits", "default_topology", "hardware", "hbm_use",
           "largest_batch", "serve", "simulate_generation", "step_model"]


def serve(model, chip: str | Chip = DEFAULT_CHIP, requests: int = 1000, rate: float | None = None, seed: int = 0,
          cards: int = 1, scheduler: str = "continuous", max_batched_tokens: int = 8192, block_size: int = 128,
          *, max_num_seqs: int = 256, tp: int | None = None, precision: str = "fp16", ep: int = 1,
          kv_dtype: str | None = None, topology=None, stack: str | Stack = DEFAULT_LLM_STACK, lengths=None,
          hbm_utilization: float = DEFAULT_HBM_UTILIZATION, progress: bool = True,
          launch_us: float | None = None, concurrency: int | None = None, shared_prefix: int = 0,
          prefix_caching: bool = True, kernels: dict | None = None, async_scheduling: bool = False) -> ServeReport:
    """Serve ``requests`` requests arriving at ``rate`` per second (Poisson; lengths from the
    ShareGPT-like distribution or ``lengths``) on ``cards`` x ``chip``: `serving.simulate_serving`
    driven by this engine's step times. ``concurrency``: at most that many requests in flight (a
    closed loop with the default rate); ``shared_prefix``, ``prefix_caching``: a system prompt in
    front of every prompt and vLLM's automatic prefix caching; ``async_scheduling``: vLLM's
    ``--async-scheduling``, a step scheduled while the one before runs (see `simulate_serving`). Returns a
    `serving.ServeReport`. ``kernels``: pto kernels for layer kinds of the decode-only steps (and of
    the prefill-only steps for a kernel of the prefill phase: `pypto_lab.llm.plug`). Every argument, and a trace file, is checked before the model is costed."""
    check_serving_arguments(requests=requests, rate=rate, seed=seed, scheduler=scheduler,
                            max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs, block_size=block_size,
                            concurrency=concurrency, shared_prefix=shared_prefix, prefix_caching=prefix_caching,
                            async_scheduling=async_scheduling)
    trace = read_trace(lengths) if lengths is not None else None
    sm = step_model(model, chip, cards, tp, precision, ep=ep, kv_dtype=kv_dtype, topology=topology,
                    stack=stack, max_batched_tokens=max_batched_tokens, hbm_utilization=hbm_utilization,
                    launch_us=launch_us, kernels=kernels)
    return simulate_serving(sm, requests=requests, rate=rate, seed=seed, scheduler=scheduler,
                            max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs, block_size=block_size,
                            lengths=trace, progress=progress, concurrency=concurrency, shared_prefix=shared_prefix,
                            prefix_caching=prefix_caching, async_scheduling=async_scheduling)
