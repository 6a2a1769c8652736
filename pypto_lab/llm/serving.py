"""LLM serving simulator: requests arrive, a scheduler batches them step by step as vLLM and MindIE
do, and a `StepModel` says how long each step takes. Reports TTFT, TPOT, end-to-end latency,
throughput, preemptions and KV-cache occupancy.

``simulate_serving(step_model, ...)`` runs one of two schedulers:

* ``"continuous"`` (vLLM v1-style iteration-level batching): every step first gives one token to
  each running sequence that is decoding, then continues the running sequences whose prefill is
  not finished, then admits waiting requests first come first served, while the step's token
  budget (``max_batched_tokens``) and ``max_num_seqs`` allow. A prompt longer than the budget left
  is split across steps (chunked prefill). The KV cache is paged: a sequence holds
  ``ceil(tokens in cache / block_size)`` blocks of a pool of
  ``kv_budget_bytes // (kv_bytes_per_token * block_size)``. When a decode needs a new block and
  none is free, the most recently admitted running sequence is preempted in recompute mode (its
  blocks are freed; it goes back to the head of the waiting queue and later prefills its prompt
  and the tokens it had generated again). If a step would run nothing at all because partial
  prefills hold every block, the most recently admitted sequence is preempted the same way.
* ``"static"`` (request-level batching): a batch of waiting requests is formed (up to
  ``max_num_seqs``, each reserving blocks for its whole prompt + output up front, as a cache
  without paging must), its prompts are prefilled (chunked by ``max_batched_tokens``), then it
  decodes until its longest request ends; only then is the next batch formed.

Time advances by ``step_model.step_ms`` of each step and jumps to the next arrival when nothing is
running. One step = one forward pass: a request's first token comes out of the step that finishes
its prefill, each later token out of one decode step.

How requests reach the server:

* open loop (the default): Poisson arrivals at ``rate`` (or a trace's ``arrival_s``);
* ``concurrency=N``: the benchmark client of ``vllm bench serve --max-concurrency N``
  (`closed_loop.ClosedLoop`): at most ``N`` requests in flight, the next one sent when one is
  answered (``rate`` inf, the default then: a closed loop), or arrivals at a finite ``rate`` held
  back while ``N`` are in flight. A request's TTFT and latency run from when it is sent.

Shared prompt prefixes (``shared_prefix=`` tokens in front of every prompt, or a trace's
``prefix_id``/``prefix_tokens`` columns) and vLLM's automatic prefix caching (``prefix_caching``,
on by default as in vLLM V1; `prefix_cache.PrefixCache`): the continuous scheduler finds a new
request's cached prefix blocks, holds them once for every request that uses them, and prefills
only the rest, a chunk attending over the cached tokens (``step_ms`` is given ``(chunk, cached)``).
The report's ``prefix_cache`` gives the hit rate.

Host time: a step costs what ``step_model.step_ms`` says, called once per engine step, so a stack's
per-step host time (``step_host_us``, e.g. vLLM-Ascend's graph replay) is paid once per step
whatever the batch (`tests/test_serving_step_host.py`), and a graph cut at each attention layer
(``layer_host_us``, vLLM's PIECEWISE mode) makes a step last at least its layers' host time
(`tests/test_stack_layer_host.py`). ``async_scheduling`` (vLLM's ``--async-scheduling``, its
default from v0.14.0): the engine schedules step k+1 as soon as step k is submitted, so a request
that arrives while step k runs is first scheduled into step k+2; an idle engine schedules an
arrival at once (`tests/test_serving_async_scheduling.py`). Not modelled: the client's and the API
server's own time (HTTP, tokenisation, detokenisation, streaming); vLLM V1 runs them in its
front-end process beside the engine's step loop (vllm-project/vllm vllm/v1/engine/async_llm.py,
output_processor.py), so they add to a request's latency, not to a step; the one public figure
found, 10-21 us per prompt token of tokenisation (tenstorrent/tt-inference-server issue #2173, not
an Ascend host), is 2-4 ms for the validation rows' 200-token prompts.
"""

from __future__ import annotations

import csv
import io
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .closed_loop import ClosedLoop
from .lengths import LENGTHS_TOML, sample_lengths
from .prefix_cache import PrefixCache
from .step_model import StepModel
from .validation import ContextLengthError, FieldError, check_count, positions_rule

SCHEDULERS = ("continuous", "static")
MAX_OCCUPANCY_POINTS = 500
# Tests set this to audit the block accounting after every step (`_Sim.audit`); off, it costs nothing.
AUDIT_BLOCKS = False


class ServingConfigError(FieldError):
    """A serving simulation that cannot run as asked; the message names the rule, the value and a fix
    (a `validation.FieldError`: the command line words the fix with its own flags)."""


@dataclass(frozen=True)
class RequestRecord:
    """One request: when it arrived, what it asked for and when it was served (seconds from t=0;
    latencies in ms). ``id`` is its place in arrival order (a trace's rows are sorted by
    ``arrival_s``). ``tpot_ms`` is ``(e2e - ttft) / (output_tokens - 1)``, NaN for one token;
    ``generated_tokens`` is what the simulation produced (equal to ``output_tokens`` once served)."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float
    finish_s: float
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    preemptions: int
    generated_tokens: int


@dataclass
class ServeReport:
    """What a serving simulation measured. ``to_dict()`` gives it as plain Python values."""

    scheduler: str
    step_model: str
    parameters: dict[str, Any]
    requests: int
    ttft_ms_p50: float
    ttft_ms_p90: float
    ttft_ms_p99: float
    tpot_ms_p50: float
    tpot_ms_p90: float
    tpot_ms_p99: float
    e2e_ms_p50: float
    e2e_ms_p99: float
    output_tokens_per_s: float
    requests_per_s: float
    duration_s: float
    preemptions: int
    steps: int
    mean_batch_size: float
    kv_blocks: int
    kv_occupancy: list[tuple[float, float]]
    records: list[RequestRecord] = field(repr=False)
    prefix_cache: dict[str, Any] | None = None   # hit rate and counts; None when no request shares a prefix

    def _mean(self, name: str) -> float:
        x = np.array([getattr(r, name) for r in self.records], dtype=np.float64)
        x = x[~np.isnan(x)]
        return float(x.mean()) if x.size else math.nan

    @property
    def ttft_ms_mean(self) -> float:
        """Mean TTFT over the requests (what ``vllm bench serve`` prints as Mean TTFT)."""
        return self._mean("ttft_ms")

    @property
    def tpot_ms_mean(self) -> float:
        """Mean over the requests of their TPOT (vLLM's Mean TPOT; requests of one token left out)."""
        return self._mean("tpot_ms")

    @property
    def e2e_ms_mean(self) -> float:
        return self._mean("e2e_ms")

    def to_dict(self, include_records: bool = False) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "records"}
        if self.prefix_cache is None:
            del d["prefix_cache"]
        d["kv_occupancy"] = [list(p) for p in self.kv_occupancy]
        if include_records:
            d["records"] = [asdict(r) for r in self.records]
        return d

    def summary(self) -> str:
        p = self.parameters
        loop = f", at most {p['concurrency']} in flight" if p.get("concurrency") else ""
        lines = [
            f"{self.requests} requests on {self.step_model}, {self.scheduler} batching "
            f"(rate {p['rate']} req/s{loop}, max_batched_tokens {p['max_batched_tokens']}, "
            f"max_num_seqs {p['max_num_seqs']}, {self.kv_blocks} KV blocks of {p['block_size']})",
            f"  TTFT ms  p50 {self.ttft_ms_p50:10.1f}  p90 {self.ttft_ms_p90:10.1f}  p99 {self.ttft_ms_p99:10.1f}",
            f"  TPOT ms  p50 {self.tpot_ms_p50:10.2f}  p90 {self.tpot_ms_p90:10.2f}  p99 {self.tpot_ms_p99:10.2f}",
            f"  E2E  ms  p50 {self.e2e_ms_p50:10.1f}  p99 {self.e2e_ms_p99:10.1f}",
            f"  {self.output_tokens_per_s:,.0f} output tokens/s, {self.requests_per_s:.2f} requests/s over "
            f"{self.duration_s:.1f} s; {self.steps} steps, mean batch {self.mean_batch_size:.1f}, "
            f"{self.preemptions} preemptions",
        ]
        pc = self.prefix_cache
        if pc is not None:
            lines.append(f"  prefix cache {'on' if pc['enabled'] else 'off'}: {pc['hit_rate']:.1%} of "
                         f"{pc['query_tokens']:,} prompt tokens found cached, {pc['evictions']} blocks evicted")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class Trace:
    """A user's requests: prompt and output tokens, arrival times (or None: Poisson at ``rate``),
    where each row came from (``"line 7"`` of a CSV, ``"row 3"`` of a list) and a description.
    ``prefix_id`` (a label per request, ``""`` for none) and ``prefix_tokens`` (how many of its
    prompt's first tokens it shares with the other requests of that label), or None for both."""

    prompt: np.ndarray
    output: np.ndarray
    arrival: np.ndarray | None
    rows: tuple[str, ...]
    desc: str
    prefix_id: tuple[str, ...] | None = None
    prefix_tokens: np.ndarray | None = None


DEFAULT_RATE = 10.0   # requests per second of an open loop when no rate is given


def check_serving_arguments(*, requests: Any = 1000, rate: Any = None, seed: Any = 0, scheduler: Any = "continuous",
                            max_batched_tokens: Any = 8192, max_num_seqs: Any = 256, block_size: Any = 128,
                            concurrency: Any = None, shared_prefix: Any = 0, prefix_caching: Any = True,
                            async_scheduling: Any = False) -> dict:
    """The serving arguments, checked (`ServingConfigError` naming the argument, its value, the rule
    and a fix) and normalised; `simulate_serving` and `pypto_lab.llm.serve` call it first. ``rate``
    None is 10 requests per second, or inf (a closed loop) with ``concurrency``."""
    if scheduler not in SCHEDULERS:
        raise ServingConfigError("scheduler", scheduler, f"must be one of {', '.join(SCHEDULERS)}",
                                 [(s, "") for s in SCHEDULERS])
    out = dict(scheduler=scheduler)
    for name, value, example, what in (
            ("requests", requests, 1000, "requests to serve"), ("block_size", block_size, 128, "tokens per KV block"),
            ("max_batched_tokens", max_batched_tokens, 8192, "tokens one step may run"),
            ("max_num_seqs", max_num_seqs, 256, "sequences one step may run")):
        out[name] = check_count(name, value, example, cls=ServingConfigError, what=what)
    out["seed"] = check_count("seed", seed, 0, minimum=0, cls=ServingConfigError, what="the random seed")
    out["concurrency"] = None if concurrency is None else check_count(
        "concurrency", concurrency, 16, cls=ServingConfigError,
        what="the requests in flight (None: arrivals at `rate` whatever is in flight)")
    out["shared_prefix"] = check_count("shared_prefix", shared_prefix, 0, minimum=0, cls=ServingConfigError,
                                       what="the tokens of a prompt prefix in front of every request")
    if not isinstance(prefix_caching, (bool, np.bool_)):
        raise ServingConfigError("prefix_caching", prefix_caching, "must be True (vLLM's automatic prefix caching, "
                                 "its V1 default) or False", [(True, ""), (False, "")])
    out["prefix_caching"] = bool(prefix_caching)
    if not isinstance(async_scheduling, (bool, np.bool_)):
        raise ServingConfigError("async_scheduling", async_scheduling, "must be True (vLLM's --async-scheduling, its "
                                 "default from v0.14.0) or False (the engine schedules a step when the one before "
                                 "ends)", [(False, ""), (True, "")])
    out["async_scheduling"] = bool(async_scheduling)
    if scheduler == "static" and out["async_scheduling"]:
        raise ServingConfigError("async_scheduling", True, "scheduling a step ahead is vLLM's continuous batching; "
                                 "static batching forms a batch only when the last one has ended",
                                 [(False, "")], hint="or {scheduler='continuous'}")
    if scheduler == "static" and out["shared_prefix"] and out["prefix_caching"]:
        raise ServingConfigError("prefix_caching", True, "prefix caching shares the paged KV blocks of continuous "
                                 "batching; static batching reserves each request's cache whole",
                                 [(False, "serve the shared prefix uncached")], hint="or {scheduler='continuous'}")
    if rate is None:
        rate = math.inf if out["concurrency"] else DEFAULT_RATE
    ok = isinstance(rate, (int, float, np.floating, np.integer)) and not isinstance(rate, bool)
    r = float(rate) if ok else math.nan
    if not r > 0:
        raise ServingConfigError("rate", rate, "requests per second must be a number > 0",
                                 [(10.0, ""), (math.inf, "every request at t=0")])
    out["rate"] = r
    return out


def _trace_error(where: str, rule: str, fix: str) -> ServingConfigError:
    return ServingConfigError(f"{where}: {rule}. Fix: {fix}")


def _csv_rows(path: Path) -> tuple[list[tuple], list[str], list[tuple[str, str]] | None]:
    """The rows of a CSV trace (as strings), their line numbers and, when the file has the columns
    ``prefix_id,prefix_tokens``, each row's pair of them; one `ServingConfigError` for a file that
    is not UTF-8 text, not CSV, lacks the columns or has a row of another width."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise _trace_error(str(path), f"cannot be read ({e.strerror or e})", "check the path and its permissions") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        raise _trace_error(str(path), f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}"
                           + ("; it looks like UTF-16" if utf16 else "") + "): a trace is a UTF-8 CSV file",
                           "save it as UTF-8 CSV with the columns prompt_tokens,output_tokens[,arrival_s]") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise _trace_error(f"{path}, line {line}", "holds a NUL byte: a trace is a text CSV file, not binary",
                           "save it as UTF-8 CSV with the columns prompt_tokens,output_tokens[,arrival_s]")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        cols = [c.strip() for c in (header or [])]
        if "prompt_tokens" not in cols or "output_tokens" not in cols:
            raise ServingConfigError(f"a trace CSV needs the columns prompt_tokens,output_tokens[,arrival_s]; "
                                     f"{path} has {cols[:8]}{' ...' if len(cols) > 8 else ''}. Fix: rename its columns.")
        want = [cols.index("prompt_tokens"), cols.index("output_tokens")]
        if "arrival_s" in cols:
            want.append(cols.index("arrival_s"))
        has = [c in cols for c in ("prefix_id", "prefix_tokens")]
        if any(has) and not all(has):
            raise ServingConfigError(f"{path}: a shared prefix needs both columns prefix_id and prefix_tokens; the "
                                     f"header has only {'prefix_id' if has[0] else 'prefix_tokens'}. Fix: add the "
                                     "other column, or drop this one.")
        pcols = (cols.index("prefix_id"), cols.index("prefix_tokens")) if all(has) else None
        rows, where, prefixes = [], [], []
        for fields_ in reader:
            if not fields_ or all(not f.strip() for f in fields_):
                continue   # a blank line
            if len(fields_) != len(cols):
                raise _trace_error(f"{path}, line {reader.line_num}", f"has {len(fields_)} field"
                                   f"{'s' if len(fields_) != 1 else ''} ({','.join(fields_)[:60]!r}), the header "
                                   f"{len(cols)} ({','.join(cols)})", f"give every row {len(cols)} comma-separated "
                                   "values (a file cut short loses its last row: drop it)")
            rows.append(tuple(fields_[i] for i in want))
            where.append(f"{path}, line {reader.line_num}")
            if pcols:
                prefixes.append((fields_[pcols[0]].strip(), fields_[pcols[1]].strip()))
    except csv.Error as e:
        raise _trace_error(f"{path}, line {reader.line_num}", f"not readable as CSV ({e})",
                           "save it as UTF-8 CSV with the columns prompt_tokens,output_tokens[,arrival_s]") from None
    return rows, where, (prefixes if pcols else None)


def _whole(v: Any) -> float | None:
    """A token count as a float if ``v`` is a finite whole number (a number or its text), else None."""
    if isinstance(v, bool):
        return None
    try:
        f = float(v.strip()) if isinstance(v, str) else float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) and f == int(f) else None


def read_trace(lengths: str | Path | Sequence[Sequence[float]] | Trace) -> Trace:
    """A user's trace (a CSV path or a list of rows), checked whole before anything runs: one
    `ServingConfigError` naming the file and line (or the row), the value, the rule and a fix."""
    if isinstance(lengths, Trace):
        return lengths
    if isinstance(lengths, (str, Path)):
        path = Path(lengths)
        if not path.is_file():
            raise ServingConfigError(f"lengths must be a CSV file or a list of (prompt, output) pairs; "
                                     f"no file at {str(path)!r}. Fix: pass an existing path.")
        rows, where, prefixes = _csv_rows(path)
        desc = f"trace {path}"
    else:
        try:
            rows = [tuple(r) for r in lengths]
        except TypeError:
            raise ServingConfigError(f"lengths must be a CSV path or a list of (prompt, output[, arrival_s]) rows "
                                     f"(got {type(lengths).__name__}). Fix: e.g. lengths=[(512, 128), (64, 32)]") from None
        where = [f"trace row {k}" for k in range(len(rows))]
        desc = "trace (list)"
        prefixes = None
    if not rows:
        raise ServingConfigError(f"{desc}: the trace has no requests (got 0 rows). Fix: give at least one (prompt, "
                                 "output) row.")
    width = {len(r) for r in rows}
    if not width <= {2, 3} or len(width) != 1:
        raise ServingConfigError(f"every trace row must be (prompt, output) or (prompt, output, arrival_s); "
                                 f"got rows of lengths {sorted(width)}. Fix: make the rows alike.")
    prompt, output, arrival = [], [], []
    for w, r in zip(where, rows):
        p, o = _whole(r[0]), _whole(r[1])
        if p is None or o is None:
            raise ServingConfigError(f"{w}: prompt and output must be token counts, whole numbers "
                                     f"(got {r[0]!r}, {r[1]!r}). Fix: write whole numbers, or drop that row.")
        if p < 1 or o < 1:
            raise ServingConfigError(f"{w}: prompt and output must be whole numbers >= 1 token "
                                     f"(got prompt {r[0]!r}, output {r[1]!r}). Fix: drop or correct that row.")
        prompt.append(int(p))
        output.append(int(o))
        if len(r) == 3:
            try:
                a = float(r[2]) if not isinstance(r[2], bool) else math.nan
            except (TypeError, ValueError):
                a = math.nan
            if not (math.isfinite(a) and a >= 0):
                raise ServingConfigError(f"{w}: arrival_s must be a finite time >= 0 s (got {r[2]!r}). "
                                         f"Fix: correct it, or leave the column out to draw Poisson arrivals at `rate`.")
            arrival.append(a)
    arr = np.array(arrival, dtype=np.float64) if arrival else None
    pid, ptok = _prefix_columns(prefixes, prompt, where) if prefixes is not None else (None, None)
    return Trace(np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64), arr, tuple(where), desc,
                 pid, ptok)


def _prefix_columns(prefixes: list[tuple[str, str]], prompt: list[int], where: list[str]):
    """A CSV trace's ``prefix_id,prefix_tokens`` columns, checked: an empty id shares nothing (its
    tokens empty or 0); otherwise 0 <= prefix_tokens <= prompt_tokens."""
    ids, tokens = [], []
    for (pid, ptok), p, w in zip(prefixes, prompt, where):
        t = _whole(ptok) if ptok else 0.0
        if t is None or t < 0:
            raise ServingConfigError(f"{w}: prefix_tokens must be a whole number of tokens >= 0 (got {ptok!r}). "
                                     "Fix: the number of the prompt's first tokens its prefix_id shares.")
        if t > p:
            raise ServingConfigError(f"{w}: prefix_tokens {int(t)} is more than the prompt's {p} tokens: the shared "
                                     "prefix is part of the prompt. Fix: prefix_tokens <= prompt_tokens.")
        if not pid and t:
            raise ServingConfigError(f"{w}: prefix_tokens {int(t)} without a prefix_id: the tokens are shared with "
                                     "the requests of the same id. Fix: give the row a prefix_id, or prefix_tokens 0.")
        ids.append(pid)
        tokens.append(int(t))
    return tuple(ids), np.array(tokens, dtype=np.int64)


def _redraw_beyond(prompt: np.ndarray, outlen: np.ndarray, max_pos: int, rng: np.random.Generator,
                   model: str) -> int:
    """Draw again, in place, the sampled requests longer than the model's positions (the lengths
    become the distribution truncated at ``max_pos``); returns how many draws were replaced."""
    redrawn = 0
    for _ in range(1000):
        long = np.flatnonzero(prompt + outlen > max_pos)
        if not long.size:
            return redrawn
        redrawn += int(long.size)
        prompt[long], outlen[long] = sample_lengths(int(long.size), rng)
    raise ContextLengthError("max_positions", max_pos, positions_rule(model, max_pos) + ", and the ShareGPT-like "
                             "lengths almost never fit in that", hint="pass your own trace (lengths=...)")


def _poisson_arrivals(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    if math.isinf(rate):
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


# ---------------------------------------------------------------------------------------------
# the simulation


class _Sim:
    """The state of one run: per-request arrays indexed by request id (ids in arrival order)."""

    def __init__(self, step_model, arrival, prompt, outlen, block_size, pool, progress, scheduler,
                 client: ClosedLoop | None = None, cache: PrefixCache | None = None, async_scheduling: bool = False):
        self.m = step_model
        self.async_scheduling = async_scheduling
        self.last_start = math.nan   # when the step that just ended started (NaN: the engine was idle)
        self.client = client  # None: requests arrive at ``arrival``; else sent by the client (``arrival`` filled then)
        self.cache = cache    # the shared prefixes' blocks (continuous batching), or None
        self.arrival, self.prompt, self.outlen = arrival, prompt, outlen
        n = len(prompt)
        self.n = n
        self.bs = block_size
        self.pool = pool
        self.free = pool
        # per request; continuous batching keeps its running sequences' state apart (run_continuous)
        self.computed = np.zeros(n, np.int64)  # prompt tokens prefilled (static batching)
        self.out = np.zeros(n, np.int64)  # tokens generated so far
        self.blocks = np.zeros(n, np.int64)  # KV blocks held (static batching)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.preempt = np.zeros(n, np.int64)
        self.t = 0.0
        self.nxt = 0  # next request to arrive
        self.waiting: deque[int] = deque()
        self.done = 0
        self.steps = 0
        self.batch_sum = 0
        self.occ_t: list[float] = []
        self.occ_used: list[int] = []
        self.bar = tqdm(total=n, disable=not progress, unit="req", desc=f"serving ({scheduler})", leave=False)

    def visible(self) -> float:
        """Until when arrivals reach the next step's scheduler: now, or with async scheduling, while
        steps run back to back, the start of the step that just ended (vLLM's engine core schedules
        step k+1 as soon as step k is submitted, so a request arriving while step k runs waits for
        step k+2)."""
        if self.async_scheduling and not math.isnan(self.last_start):
            return self.last_start
        return self.t

    def arrive(self, until: float | None = None) -> None:
        arrival, n = self.arrival, self.n
        t = self.t if until is None else until
        if self.client is not None:
            client = self.client
            while self.nxt < n and client.due(self.nxt) <= t:
                arrival[self.nxt] = client.send(self.nxt)
                self.waiting.append(self.nxt)
                self.nxt += 1
            return
        while self.nxt < n and arrival[self.nxt] <= t:
            self.waiting.append(self.nxt)
            self.nxt += 1

    def due(self) -> float:
        """When the next request not yet arrived reaches the server (its arrival, or its send time)."""
        if self.client is not None:
            return self.client.due(self.nxt)
        return float(self.arrival[self.nxt])

    def step(self, prefill: list[tuple[int, int]], decode: list[int]) -> None:
        dt = self.m.step_ms(prefill, decode)
        if not (dt > 0 and math.isfinite(dt)):
            raise ValueError(f"{getattr(self.m, 'name', self.m)!r}.step_ms must return a finite time > 0 ms "
                             f"(got {dt!r} for {len(prefill)} prefill chunks and {len(decode)} decodes). "
                             f"Fix: the step model.")
        self.occ_t.append(self.t)
        self.occ_used.append(self.pool - self.free)
        self.last_start = self.t
        self.t += dt / 1000.0
        self.steps += 1
        self.batch_sum += len(prefill) + len(decode)

    def audit_static(self) -> None:
        """Static batching: the blocks reserved and the free ones make up the pool, and every
        request reserves at least what its cache holds."""
        held = int(self.blocks.sum())
        if not (0 <= self.free <= self.pool and held + self.free == self.pool):
            raise AssertionError(f"KV blocks: {held} held + {self.free} free != pool {self.pool}")
        cached = np.where(self.out > 0, self.prompt + self.out - 1, self.computed)
        live = np.isnan(self.finish)
        if np.any(live & (self.blocks * self.bs < cached)):
            raise AssertionError("a request's cache outgrew the blocks reserved for it")

    def finished(self, ids: np.ndarray) -> None:
        if ids.size:
            self.finish[ids] = self.t
            self.done += int(ids.size)
            self.bar.update(int(ids.size))
            if self.client is not None:
                self.client.finished(self.t, int(ids.size))

    # --- continuous batching ------------------------------------------------------------------

    def audit_running(self, c: np.ndarray, b: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Continuous batching: the running sequences' blocks and the free ones make up the pool,
        and each running sequence holds exactly ceil(tokens in its cache / block_size) blocks
        (a shared prefix block counted once in the pool, however many hold it)."""
        held = int(b.sum())
        pc = self.cache
        if pc is not None:
            shared = int(pc.held[ids].sum())
            pc.audit(shared)
            held += pc.in_use() - shared
            if pc.evictable > self.free:
                raise AssertionError(f"{pc.evictable} cached blocks counted free, but only {self.free} are free")
        if not (0 <= self.free <= self.pool and held + self.free == self.pool):
            raise AssertionError(f"KV blocks: {held} held + {self.free} free != pool {self.pool}")
        if not np.array_equal(b, -(-c // self.bs)):
            raise AssertionError("a sequence holds more or fewer blocks than its cached tokens need")

    def run_continuous(self, max_tokens: int, max_seqs: int) -> None:
        """Offline: arrivals come from the arrays, time jumps to the next arrival when nothing runs,
        and `_Continuous.iterate` runs one engine step at a time until every request is served."""
        batcher = _Continuous(self, max_tokens, max_seqs)
        n_req = self.n
        while self.done < n_req:
            cut = self.visible()
            if self.nxt < n_req and self.due() <= cut:
                self.arrive(cut)
            if batcher.ids.size == 0 and not self.waiting:
                self.t = max(self.t, self.due())
                self.last_start = math.nan   # idle: the next arrival is scheduled at once
                continue
            batcher.iterate()

    # --- static batching ----------------------------------------------------------------------

    def run_static(self, max_tokens: int, max_seqs: int) -> None:
        prompt, outlen, computed, out, first, bs = self.prompt, self.outlen, self.computed, self.out, self.first, self.bs
        reserve = -(-(prompt + outlen) // bs)
        while self.done < self.n:
            self.arrive()
            if not self.waiting:
                self.t = max(self.t, self.due())
                continue
            batch: list[int] = []
            while self.waiting and len(batch) < max_seqs and reserve[self.waiting[0]] <= self.free:
                i = self.waiting.popleft()
                batch.append(i)
                self.blocks[i] = reserve[i]
                self.free -= int(reserve[i])
            pending = deque(batch)
            while pending:  # prefill, chunked by the token budget
                budget, ids, pre = max_tokens, [], []
                while pending and budget > 0:
                    i = pending[0]
                    c = int(computed[i])
                    n = min(int(prompt[i]) - c, budget)
                    ids.append(i)
                    pre.append((n, c))
                    budget -= n
                    if c + n == prompt[i]:
                        pending.popleft()
                self.step(pre, [])
                p = np.array(ids, np.int64)
                computed[p] += np.array([n for n, _ in pre], np.int64)
                p = p[computed[p] == prompt[p]]
                out[p] = 1
                first[p] = self.t
                self.finished(p[outlen[p] == 1])
                if AUDIT_BLOCKS:
                    self.audit_static()
            b = np.array(batch, np.int64)
            b = b[out[b] < outlen[b]]
            while b.size:  # decode until the longest request of the batch ends
                self.step([], (prompt[b] + out[b] - 1).tolist())
                out[b] += 1
                if AUDIT_BLOCKS:
                    self.audit_static()
                self.finished(b[out[b] == outlen[b]])
                b = b[out[b] < outlen[b]]
            computed[batch] = 0  # the batch's cache is freed
            self.blocks[batch] = 0
            self.free = self.pool


class _Continuous:
    """Continuous batching's running sequences, advanced one engine step at a time by `iterate`.

    The running sequences live in arrays of their own, in admission order, so a step of decodes is
    a few vector operations; the per-request arrays of the `_Sim` are written when a sequence
    leaves the running set (finished or preempted). ``on_step``, when set (the online server,
    `OnlineScheduler`), is called after each step with the ids that got a token and the ids that
    finished; ``cancel`` takes a request out (its blocks go back to the pool)."""

    def __init__(self, sim: _Sim, max_tokens: int, max_seqs: int):
        i64 = np.int64
        self.sim, self.max_tokens, self.max_seqs = sim, max_tokens, max_seqs
        self.ids = np.empty(0, i64)  # request id
        self.c = np.empty(0, i64)  # tokens in its KV cache
        self.gen = np.empty(0, i64)  # tokens generated so far
        self.p = np.empty(0, i64)  # prompt tokens
        self.L = np.empty(0, i64)  # output tokens asked for
        self.b = np.empty(0, i64)  # KV blocks held
        self.is_dec = np.empty(0, bool)  # decoding: its cache holds all its tokens but the last
        self.n_dec = 0  # how many are
        self.preemptions = 0
        self.on_step = None

    def cancel(self, i: int) -> bool:
        """Take request ``i`` out of the running set or the waiting queue; True if it was in one."""
        sim = self.sim
        pos = np.flatnonzero(self.ids == i)
        if pos.size:
            v = int(pos[0])
            sim.free += int(self.b[v]) + (sim.cache.release(i) if sim.cache is not None else 0)
            sim.out[i] = self.gen[v]
            keep = np.ones(self.ids.size, bool)
            keep[v] = False
            if self.is_dec[v]:
                self.n_dec -= 1
            self.ids, self.c, self.gen, self.p, self.L, self.b, self.is_dec = (
                a[keep] for a in (self.ids, self.c, self.gen, self.p, self.L, self.b, self.is_dec))
            return True
        try:
            sim.waiting.remove(i)
        except ValueError:
            return False
        return True

    def iterate(self) -> None:
        """One pass of the scheduler at ``sim.t``: pick the step's work, run it (time advances by its
        ``step_ms``), hand out its tokens and retire what finished. The caller has admitted the
        arrivals up to ``sim.t`` and made sure something is running or waiting."""
        sim = self.sim
        prompt, outlen, out, first, preempt, bs = sim.prompt, sim.outlen, sim.out, sim.first, sim.preempt, sim.bs
        max_tokens, max_seqs = self.max_tokens, self.max_seqs
        i64 = np.int64
        ids, c, gen, p, L, b, is_dec, n_dec = self.ids, self.c, self.gen, self.p, self.L, self.b, self.is_dec, self.n_dec
        pc = sim.cache

        def leave(v: int) -> None:  # preempt running position v (recompute mode); the caller truncates
            i = int(ids[v])
            sim.free += int(b[v]) + (pc.release(i) if pc is not None else 0)
            preempt[i] += 1
            out[i] = gen[v]
            self.preemptions += 1

        try:
            budget = max_tokens
            # 1. one token for every running sequence that is decoding
            all_dec = n_dec == ids.size
            if all_dec:  # the usual case: a prefix slice, no copies
                dsel = slice(0, min(ids.size, budget))
                nd = dsel.stop
            else:
                dsel = np.flatnonzero(is_dec)[:budget]
                nd = dsel.size
            if nd:
                need = c[dsel] % bs == 0  # the paged invariant: a full last block needs a new one
                total = int(np.count_nonzero(need))
                if total <= sim.free:
                    b[dsel] += need
                    sim.free -= total
                else:  # short of blocks: in running order, preempting from the tail
                    positions = np.arange(nd) if isinstance(dsel, slice) else dsel
                    j = ids.size
                    kept: list[int] = []
                    gone: list[int] = []
                    for q in positions.tolist():
                        if q >= j:
                            break
                        nq = 1 if c[q] % bs == 0 else 0
                        while nq > sim.free and j > q:
                            j -= 1
                            leave(j)
                            gone.append(int(ids[j]))
                        if q >= j:
                            break
                        b[q] += nq
                        sim.free -= nq
                        kept.append(q)
                    for i in gone:  # the last one preempted (earliest admitted) ends at the head
                        sim.waiting.appendleft(i)
                    ids, c, gen, p, L, b, is_dec = ids[:j], c[:j], gen[:j], p[:j], L[:j], b[:j], is_dec[:j]
                    dsel = np.array(kept, i64)
                    nd = dsel.size
                    n_dec = int(np.count_nonzero(is_dec))
                    all_dec = n_dec == ids.size
                budget -= nd
                if pc is not None:
                    pc.settle(sim.free)
            pre_pos: list[int] = []
            pre: list[tuple[int, int]] = []
            # 2. running sequences whose prefill (or recompute) is not finished
            if budget > 0 and not all_dec:
                for q in np.flatnonzero(~is_dec).tolist():
                    if budget <= 0:
                        break
                    cq = int(c[q])
                    n = min(int(p[q] + gen[q]) - cq, budget, (int(b[q]) + sim.free) * bs - cq)
                    if n <= 0:
                        continue
                    nb = -(-(cq + n) // bs) - int(b[q])
                    b[q] += nb
                    sim.free -= nb
                    budget -= n
                    pre_pos.append(q)
                    pre.append((n, cq))
                    if pc is not None:
                        pc.computing(int(ids[q]), cq + n)
                        pc.settle(sim.free)
            # 3. waiting requests, first come first served (a preempted one starts over)
            new: list[tuple[int, int, int]] = []
            while sim.waiting and budget > 0 and ids.size + len(new) < max_seqs:
                i = sim.waiting[0]
                tokens = int(prompt[i] + out[i])
                hit, woken = pc.lookup(i, tokens) if pc is not None else (0, 0)  # cached prefix blocks
                cached = hit * bs
                n = min(tokens - cached, budget)
                nb = -(-(cached + n) // bs)  # blocks it holds: the hit ones and the new ones
                if nb - hit + woken > sim.free:
                    break
                sim.waiting.popleft()
                sim.free -= nb - hit + woken
                budget -= n
                pre_pos.append(ids.size + len(new))
                pre.append((n, cached))
                new.append((i, nb, cached))
                if pc is not None:
                    pc.admit(i, tokens, hit)
                    pc.computing(i, cached + n)
                    pc.settle(sim.free)
            if new:
                na = np.array(new, i64)
                nid = na[:, 0]
                ids = np.concatenate([ids, nid])
                c = np.concatenate([c, na[:, 2]])
                gen = np.concatenate([gen, out[nid]])
                p = np.concatenate([p, prompt[nid]])
                L = np.concatenate([L, outlen[nid]])
                b = np.concatenate([b, na[:, 1]])
                is_dec = np.concatenate([is_dec, np.zeros(len(new), bool)])
            if not pre and nd == 0:
                if ids.size == 0:
                    raise RuntimeError("serving simulation stuck with nothing to schedule (a bug)")
                v = ids.size - 1  # partial prefills hold every block: free the latest one
                leave(v)
                sim.waiting.appendleft(int(ids[v]))
                ids, c, gen, p, L, b, is_dec = ids[:v], c[:v], gen[:v], p[:v], L[:v], b[:v], is_dec[:v]
                n_dec = int(np.count_nonzero(is_dec))
                return
            sim.step(pre, c[dsel].tolist() if nd else [])
            if nd:
                c[dsel] += 1
                gen[dsel] += 1
            comp = None
            if pre:
                pp = np.array(pre_pos, i64)
                c[pp] += np.array([n for n, _ in pre], i64)
                comp = pp[c[pp] == p[pp] + gen[pp]]
                if comp.size:  # a prefill finished: its next token comes out of this step
                    gen[comp] += 1
                    is_dec[comp] = True
                    n_dec += comp.size
                    cid = ids[comp]
                    first[cid[np.isnan(first[cid])]] = sim.t
            if self.on_step is not None:
                got = ids[dsel] if nd else ids[:0]
                if comp is not None and comp.size:
                    got = np.concatenate([got, ids[comp]])
            done = gen == L
            fid = ids[:0]
            if np.count_nonzero(done):
                fid = ids[done]
                sim.free += int(b[done].sum())
                if pc is not None:
                    sim.free += sum(pc.release(int(i)) for i in fid.tolist())
                out[fid] = gen[done]
                sim.finished(fid)
                n_dec -= fid.size  # a sequence ends on a token out of a decode or a finished prefill
                keep = ~done
                ids, c, gen, p, L, b, is_dec = ids[keep], c[keep], gen[keep], p[keep], L[keep], b[keep], is_dec[keep]
            if AUDIT_BLOCKS:
                sim.audit_running(c, b, ids)
                # decoding implies all tokens but the last cached (the converse fails only for the
                # last token of a recompute, which is still a prefill chunk)
                if np.any(is_dec & ~((gen > 0) & (p + gen - c == 1))) or n_dec != np.count_nonzero(is_dec):
                    raise AssertionError("a sequence is flagged decoding with tokens left to prefill")
            if self.on_step is not None:
                self.on_step(got, fid)
        finally:
            self.ids, self.c, self.gen, self.p, self.L, self.b, self.is_dec = ids, c, gen, p, L, b, is_dec
            self.n_dec = n_dec


# ---------------------------------------------------------------------------------------------
# the public call


def _percentiles(x: np.ndarray, qs: Sequence[float]) -> list[float]:
    x = x[~np.isnan(x)]
    if x.size == 0:
        return [math.nan for _ in qs]
    return [float(v) for v in np.percentile(x, qs)]


def _kv_pool(step_model: StepModel, block_size: int) -> tuple[int, int, int]:
    """(KV bytes per token, KV budget bytes, blocks in the pool) of ``step_model``, checked."""
    if not isinstance(step_model, StepModel):
        raise ServingConfigError(f"step_model must follow pypto_lab.llm.step_model.StepModel (name, kv_bytes_per_token, "
                                 f"kv_budget_bytes, step_ms); got {type(step_model).__name__}. Fix: build one with the "
                                 f"cost engine, or use pypto_lab.llm.linear_step.LinearStepModel.")
    kv_tok = int(step_model.kv_bytes_per_token)
    budget_bytes = int(step_model.kv_budget_bytes)
    if kv_tok <= 0:
        raise ServingConfigError(f"kv_bytes_per_token must be > 0 (got {kv_tok} from {step_model.name!r}). Fix: the step model.")
    pool = budget_bytes // (kv_tok * block_size)
    if pool < 1:
        raise ServingConfigError(
            f"the KV pool must hold at least one block: kv_budget_bytes // (kv_bytes_per_token * block_size) = "
            f"{budget_bytes:,} // ({kv_tok:,} * {block_size}) = {pool}. Fix: a smaller block_size, more cards or a chip "
            f"with more HBM (a larger kv_budget_bytes).")
    return kv_tok, budget_bytes, pool


def simulate_serving(
    step_model: StepModel,
    requests: int = 1000,
    rate: float | None = None,
    seed: int = 0,
    scheduler: str = "continuous",
    max_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    block_size: int = 128,
    lengths: str | Path | Sequence[Sequence[float]] | None = None,
    progress: bool = True,
    *,
    concurrency: int | None = None,
    shared_prefix: int = 0,
    prefix_caching: bool = True,
    async_scheduling: bool = False,
) -> ServeReport:
    """Serve ``requests`` requests on ``step_model`` and report latencies and throughput.

    * ``rate``: Poisson arrivals, requests per second (``float("inf")``: all at t=0); None: 10, or
      inf with ``concurrency``.
    * ``concurrency``: at most this many requests in flight, the next sent when one is answered
      (``vllm bench serve --max-concurrency``; with rate inf a closed loop); TTFT runs from the send.
    * ``lengths``: None draws (prompt, output) token counts from the ShareGPT-like distribution
      (``datasets/serving/``, `pypto_lab.llm.lengths`); or a user's trace, a list of
      ``(prompt, output)`` or ``(prompt, output, arrival_s)`` rows, or the path of a CSV with
      columns ``prompt_tokens,output_tokens[,arrival_s]``. A trace's first ``requests`` rows are
      served (all of them if it has fewer); its ``arrival_s`` (sorted) replaces the Poisson draw.
    * ``seed``: of the numpy Generator that draws lengths and arrivals; the same seed, the same run.
    * ``scheduler``: ``"continuous"`` or ``"static"`` (see the module's docstring).
    * ``max_batched_tokens``, ``max_num_seqs``: the step's token budget and sequence cap.
    * ``block_size``: tokens per KV block.
    * ``shared_prefix``: a system prompt of this many tokens in front of every request's prompt (as
      ``vllm bench serve --random-prefix-len``); a CSV trace may instead give each row a
      ``prefix_id`` and its ``prefix_tokens`` (part of its ``prompt_tokens``).
    * ``prefix_caching``: vLLM's automatic prefix caching (its V1 default): full blocks of a shared
      prefix are computed once, held once and found by later requests (continuous batching only).
    * ``async_scheduling``: vLLM's ``--async-scheduling`` (on by default from vLLM v0.14.0): the
      engine schedules the next step while the current one runs, so a request arriving during a
      step joins the step after the next (continuous batching only).
    * ``progress``: a tqdm bar over completed requests.
    """
    args = check_serving_arguments(requests=requests, rate=rate, seed=seed, scheduler=scheduler,
                                   max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs,
                                   block_size=block_size, concurrency=concurrency, shared_prefix=shared_prefix,
                                   prefix_caching=prefix_caching, async_scheduling=async_scheduling)
    requests, rate, block_size = args["requests"], args["rate"], args["block_size"]
    max_batched_tokens, max_num_seqs = args["max_batched_tokens"], args["max_num_seqs"]
    concurrency, shared_prefix, prefix_caching = args["concurrency"], args["shared_prefix"], args["prefix_caching"]
    trace = read_trace(lengths) if lengths is not None else None
    if trace is not None and trace.prefix_id is not None:
        if shared_prefix:
            raise ServingConfigError("shared_prefix", shared_prefix, f"{trace.desc} gives each request its prefix "
                                     "(columns prefix_id, prefix_tokens); a shared prefix is given one way",
                                     [(0, "the trace's prefixes")], hint="or drop the trace's prefix columns")
        if scheduler == "static" and prefix_caching:
            raise ServingConfigError("prefix_caching", True, "prefix caching shares the paged KV blocks of continuous "
                                     "batching; static batching reserves each request's cache whole",
                                     [(False, "serve the shared prefixes uncached")],
                                     hint="or {scheduler='continuous'}")
    kv_tok, budget_bytes, pool = _kv_pool(step_model, block_size)
    max_pos = getattr(step_model, "max_positions", None)
    model = getattr(getattr(step_model, "spec", None), "name", None) or str(step_model.name)

    rng = np.random.default_rng(args["seed"])
    if max_pos and shared_prefix and shared_prefix + 2 > max_pos:
        raise ContextLengthError("shared_prefix", shared_prefix, positions_rule(model, int(max_pos)) + ", and a "
                                 "request is its shared prefix, at least one token of its own and one output token",
                                 [(int(max_pos) - 2, "")])
    prefix_id = prefix_tokens = None
    if trace is None:
        prompt, outlen = sample_lengths(requests, rng)
        source = f"ShareGPT-like ({LENGTHS_TOML.relative_to(LENGTHS_TOML.parents[2])})"
        if max_pos:
            redrawn = _redraw_beyond(prompt, outlen, int(max_pos) - shared_prefix, rng, model)
            if redrawn:
                source += (f"; {redrawn} draws longer than {model}'s {int(max_pos):,} positions drawn again "
                           "(vLLM's serving benchmark drops such requests)")
        arrival = _poisson_arrivals(rng, requests, rate)
        rows = tuple(f"request {i}" for i in range(requests))
    else:
        prompt, outlen, source = trace.prompt[:requests], trace.output[:requests], trace.desc
        rows = trace.rows[:requests]
        if trace.prefix_id is not None:
            prefix_id, prefix_tokens = np.array(trace.prefix_id[:requests], dtype=object), trace.prefix_tokens[:requests]
        if trace.arrival is None:
            arrival = _poisson_arrivals(rng, len(prompt), rate)
        else:
            arrival = trace.arrival[:requests]
            order = np.argsort(arrival, kind="stable")
            prompt, outlen, arrival = prompt[order], outlen[order], arrival[order]
            rows = tuple(rows[int(k)] for k in order)
            if prefix_id is not None:
                prefix_id, prefix_tokens = prefix_id[order], prefix_tokens[order]
    n = len(prompt)
    group = None
    if shared_prefix:
        prompt = prompt + shared_prefix
        source += f"; a shared prefix of {shared_prefix} tokens in front of every prompt"
        group, prefix_tokens = np.zeros(n, np.int64), np.full(n, shared_prefix, np.int64)
    elif prefix_id is not None:
        labels: dict[str, int] = {}
        group = np.array([labels.setdefault(k, len(labels)) if k else -1 for k in prefix_id], dtype=np.int64)
        if not np.any(group >= 0):
            group = None

    if max_pos:
        bad = np.flatnonzero(prompt + outlen > max_pos)
        if bad.size:
            i = int(bad[0])
            raise ContextLengthError(
                "prompt + output", int(prompt[i] + outlen[i]), positions_rule(model, int(max_pos)),
                hint=(f"drop or shorten the {bad.size} of {n} requests longer than {int(max_pos):,} tokens (prompt "
                      "and output together), or serve a model with more positions"),
                where=f"request {i} ({rows[i]}: prompt {prompt[i]}, output {outlen[i]})")
    need = -(-(prompt + outlen) // block_size)
    bad = np.flatnonzero(need > pool)
    if bad.size:
        i = int(bad[0])
        longest = min(pool * block_size, int(max_pos)) if max_pos else pool * block_size
        raise ServingConfigError(
            f"request {i} can never fit the KV cache ({rows[i]}): prompt {prompt[i]} + output {outlen[i]} = "
            f"{prompt[i] + outlen[i]} tokens need {need[i]} blocks of {block_size}, but the whole pool is {pool} blocks "
            f"(kv_budget_bytes {budget_bytes:,} // (kv_bytes_per_token {kv_tok:,} * block_size {block_size})); "
            f"{bad.size} of {n} requests are that long. Fix: shorten them (at most {longest} tokens), "
            f"or serve on more cards or a chip with more HBM.")

    client = None
    if concurrency is not None:
        client = ClosedLoop(arrival, concurrency)
        arrival = arrival.copy()   # filled with the send times as the run goes
    cache = None
    if group is not None and scheduler == "continuous":
        cache = PrefixCache(group, prefix_tokens, block_size, enabled=prefix_caching)
    sim = _Sim(step_model, arrival, prompt, outlen, block_size, pool, progress, scheduler, client, cache,
               args["async_scheduling"])
    try:
        if scheduler == "continuous":
            sim.run_continuous(max_batched_tokens, max_num_seqs)
        else:
            sim.run_static(max_batched_tokens, max_num_seqs)
    finally:
        sim.bar.close()

    ttft = (sim.first - arrival) * 1e3
    e2e = (sim.finish - arrival) * 1e3
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outlen > 1, (e2e - ttft) / (outlen - 1), np.nan)
    duration = float(sim.finish.max() - arrival.min())
    occ_t = np.array(sim.occ_t)
    occ = np.array(sim.occ_used, dtype=np.float64) / pool
    if occ_t.size > MAX_OCCUPANCY_POINTS:
        keep = np.unique(np.linspace(0, occ_t.size - 1, MAX_OCCUPANCY_POINTS).round().astype(np.int64))
        occ_t, occ = occ_t[keep], occ[keep]
    records = [
        RequestRecord(i, float(arrival[i]), int(prompt[i]), int(outlen[i]), float(sim.first[i]), float(sim.finish[i]),
                      float(ttft[i]), float(tpot[i]), float(e2e[i]), int(sim.preempt[i]), int(sim.out[i]))
        for i in range(n)
    ]
    t50, t90, t99 = _percentiles(ttft, (50, 90, 99))
    p50, p90, p99 = _percentiles(tpot, (50, 90, 99))
    e50, e99 = _percentiles(e2e, (50, 99))
    parameters = dict(scheduler=scheduler, requests=n, rate=rate, seed=args["seed"], max_batched_tokens=max_batched_tokens,
                      max_num_seqs=max_num_seqs, block_size=block_size, kv_blocks=pool, kv_bytes_per_token=kv_tok,
                      kv_budget_bytes=budget_bytes, lengths=source)
    if concurrency is not None:   # the new options appear only when used: a run without them reports as before
        parameters["concurrency"] = concurrency
    if args["async_scheduling"]:
        parameters["async_scheduling"] = True
    prefix_stats = None
    if group is not None:
        parameters["shared_prefix"] = shared_prefix
        parameters["prefix_caching"] = prefix_caching and cache is not None
        prefix_stats = cache.stats() if cache is not None else {
            "enabled": False, "hit_rate": 0.0, "hit_tokens": 0, "query_tokens": int(prompt[group >= 0].sum()),
            "groups": int(group.max()) + 1, "peak_cached_blocks": 0, "evictions": 0}
    return ServeReport(
        scheduler=scheduler,
        step_model=str(step_model.name),
        parameters=parameters,
        requests=n,
        ttft_ms_p50=t50, ttft_ms_p90=t90, ttft_ms_p99=t99,
        tpot_ms_p50=p50, tpot_ms_p90=p90, tpot_ms_p99=p99,
        e2e_ms_p50=e50, e2e_ms_p99=e99,
        output_tokens_per_s=float(outlen.sum()) / duration,
        requests_per_s=n / duration,
        duration_s=duration,
        preemptions=int(sim.preempt.sum()),
        steps=sim.steps,
        mean_batch_size=sim.batch_sum / max(sim.steps, 1),
        kv_blocks=pool,
        kv_occupancy=[(float(a), float(b)) for a, b in zip(occ_t, occ)],
        records=records,
        prefix_cache=prefix_stats,
    )
