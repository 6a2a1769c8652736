"""A search over training configurations: given a model, the cards and the global batch, every
parallel layout (tp, pp, dp, cp, ep, vpp, ZeRO stage or distributed optimizer, recomputation,
micro-batch size) that fits the card's HBM, ranked by tokens per second, with why the best wins.

`search_layouts(config, cards, global_batch, seq_len, chip=...)` enumerates the layouts
(`candidate_layouts`), runs them on Dask (the sweep's `LocalCluster`, or ``client=`` /
``scheduler=``, as `pypto_lab.explore.sweeps.sweep` does) and returns a `LayoutSearch`: its
``rows`` (pandas with `LayoutSearch.frame`), a `table` and `why` the best wins.

How thousands of layouts are costed in seconds:

* **One capture per (micro-batch size, cp).** The step's kernels depend on the micro-batch and on
  the share of the sequence a context-parallel rank keeps; everything else (tp, pp, vpp, dp, the
  sharding, recomputation, the micro-batches per step) is composition over the same captured
  step (`pypto_lab.train.step.prepare_step`, `Prepared`): each such group is one Dask task.
* **Memory first.** A layout's memory per rank is computed without costing a kernel
  (`Prepared.memory`); only layouts that fit are costed (`Prepared.report`).
* **Least recomputation that fits.** Recomputation only adds work (it reruns forward kernels and
  frees memory), so for each layout the recomputation options are tried from none through
  selective to full and only the first that fits is costed; the others fit too, are never
  faster, and are counted as ``dominated``.
* **Parameter-sized Vector kernels on the grid.** The gradient accumulation and optimizer kernels
  run over each stage's parameter shard, whose size changes with every (tp, pp, dp, sharding); they
  are costed with `pypto_lab.kernels.grid` (exact at a geometric grid of sizes, linear beyond four
  million elements: identical tiles dealt round-robin to the cores), within 0.1 % of the exact
  costs.

The step of each layout is `simulate_step`'s (the same plan, schedule, collectives and memory):
a layout the search ranks can be rerun with `simulate_step(config, batch, **row["args"])` to see
its trace. Expert parallelism: ``ep`` is searched for a model with experts (``num_local_experts``
/ ``num_experts`` in its config) over divisors of the data-parallel ranks; a dense model has ep 1.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

RECOMPUTE_ORDER = (None, "selective", "full")   # least work first


class SearchError(ValueError):
    """The search's arguments break a rule; the message names the rule, the value and a fix."""


# ---- the candidates ----------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _experts(cfg) -> int:
    return int(getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or 0)


def _megatron(stack) -> bool:
    from ..stack import DEFAULT_LLM_TRAIN_STACK, get_stack

    return get_stack(stack if stack is not None else DEFAULT_LLM_TRAIN_STACK).name == "mindspeed"


def _shardings(megatron: bool, wanted) -> list[dict[str, Any]]:
    """The optimizer / gradient / weight sharding options: Megatron's distributed optimizer (its
    ZeRO-1) or not under MindSpeed; ZeRO stages 0-3 otherwise (``wanted``: the stages to try)."""
    if wanted is not None:
        out = []
        for z in wanted:
            if z == "distributed_optimizer":
                out.append({"zero": 0, "distributed_optimizer": True})
            elif z in (0, 1, 2, 3) and not isinstance(z, bool):
                out.append({"zero": z, "distributed_optimizer": False})
            else:
                raise SearchError(f"zero option {z!r}: a ZeRO stage 0-3 or 'distributed_optimizer'. "
                                  "Fix: zero=(0, 1, 3)")
        return out
    if megatron:
        return [{"zero": 0, "distributed_optimizer": False}, {"zero": 0, "distributed_optimizer": True}]
    return [{"zero": z, "distributed_optimizer": False} for z in (0, 1, 2, 3)]


@dataclass(frozen=True)
class Candidate:
    """One layout before its recomputation is chosen."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    mbs: int
    micro_batches: int
    zero: int
    distributed_optimizer: bool


def candidate_layouts(cfg, cards: int, global_batch: int, seq_len: int, per_server: int, megatron: bool, *,
                      tp: Iterable[int] | None = None, pp: Iterable[int] | None = None,
                      cp: Iterable[int] | None = None, ep: Iterable[int] | None = None,
                      vpp: Iterable[int] | None = None, micro_batch_sizes: Iterable[int] = (1, 2, 4),
                      zero: Iterable | None = None, max_cp: int = 8, max_vpp: int = 8) -> list[Candidate]:
    """Every layout of ``cards`` for ``global_batch`` sequences of ``seq_len`` tokens that Megatron
    and the model allow: tp within a server and dividing the attention heads and key/value groups;
    pp dividing the layers; vpp > 1 only with pp > 1, dividing each stage's layers (at most
    ``max_vpp`` chunks per stage), with the micro-batches a multiple of pp; cp a power of two up to ``max_cp`` whose 2 x cp chunks split
    the sequence; the global batch a whole number of micro-batches of every data-parallel rank;
    ep (a model with experts only) dividing dp x cp and the experts. ``tp``, ``pp``, ... given
    restrict the values tried."""
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    experts = _experts(cfg)
    tps = sorted(tp) if tp is not None else [t for t in _divisors(per_server) if heads % t == 0 and kv % t == 0]
    pps = sorted(pp) if pp is not None else [p for p in _divisors(layers) if p <= cards]
    cps = sorted(cp) if cp is not None else [c for c in (1, 2, 4, 8, 16) if c <= max_cp and seq_len % (2 * c) == 0
                                              or c == 1]
    shard = _shardings(megatron, zero)
    out: list[Candidate] = []
    for t in tps:
        for p in pps:
            for c in cps:
                if cards % (t * p * c) or layers % p:
                    continue
                d = cards // (t * p * c)
                eps = sorted(ep) if ep is not None else (
                    [e for e in _divisors(d * c) if experts % e == 0] if experts else [1])
                for mbs in sorted(micro_batch_sizes):
                    if global_batch % (mbs * d):
                        continue
                    m = global_batch // (mbs * d)
                    vpps = sorted(vpp) if vpp is not None else [1] + (
                        [v for v in _divisors(layers // p) if 1 < v <= max_vpp] if p > 1 else [])
                    for v in vpps:
                        if v > 1 and (p == 1 or (layers // p) % v or m % p):
                            continue
                        for e in eps:
                            if (d * c) % e:
                                continue
                            for s in shard:
                                if (s["zero"] or s["distributed_optimizer"]) and d * c == 1:
                                    continue   # nothing to shard over
                                out.append(Candidate(t, p, d, c, e, v, mbs, m, s["zero"], s["distributed_optimizer"]))
    return out


# ---- one group: one capture, many layouts ---------------------------------------------------

@dataclass
class _Group:
    cfg: Any
    chip: str
    cards: int
    seq_len: int
    mbs: int
    cp: int
    recompute: tuple
    options: dict
    candidates: list[Candidate]


def _parts(rep) -> dict[str, float]:
    """The step's time in parts, ms, as the busiest stage spends it: the passes' compute,
    recomputation, tensor / context-parallel communication inside the passes, the pipeline bubble
    (the busiest stage idle within the pipeline's span: warm-up, cool-down and waiting on
    slower stages), exposed data-parallel communication (gradients and the sharded optimizer's
    weight gather), the optimizer, and the rest (stages ending apart)."""
    m = rep.grad_accum
    passes = m * (rep.forward_ms + rep.backward_ms)
    span = rep.schedule.end_us / 1e3 if rep.schedule is not None else passes
    recompute = m * rep.recompute_ms
    tpcp = min(passes - recompute, m * (rep.tp_comm_ms + rep.cp_comm_ms))
    exposed = rep.exposed_comm_ms + rep.param_gather_ms
    other = max(0.0, rep.step_ms - span - exposed - rep.optimizer_ms)
    return {"compute": passes - recompute - tpcp, "recompute": recompute, "tp/cp communication": tpcp,
            "bubble": max(0.0, span - passes), "exposed dp communication": exposed, "optimizer": rep.optimizer_ms,
            "other": other}


def run_group(g: _Group) -> dict[str, Any]:
    """The group's layouts: memory first, then the least recomputation that fits, costed. Returns
    rows and counts (a Dask task; also run in-process)."""
    import torch

    from ..hw.chip import get_chip
    from ..train.parallel import LayoutError, layout_of
    from ..train.step import prepare_step

    t0, c0 = time.perf_counter(), time.process_time()
    chip = get_chip(g.chip)
    ids = torch.zeros(g.mbs, g.seq_len, dtype=torch.long)
    opts = dict(g.options)
    mc2 = bool(opts.pop("mc2", False))
    prep, _ = prepare_step(g.cfg, {"input_ids": ids}, chip=chip, cards=g.cards, cp=g.cp, **opts)
    prep = dataclasses.replace(prep, mc2=mc2, strategy="grid", plans={})
    t_capture = time.perf_counter() - t0
    t_memory = t_report = 0.0
    rows: list[dict[str, Any]] = []
    counts = {"layouts": 0, "fit": 0, "costed": 0, "dominated": 0, "too big": 0}
    def layout(c: Candidate, rc):
        return layout_of(g.cards, tp=c.tp, pp=c.pp, cp=c.cp, ep=c.ep, vpp=c.vpp, micro_batches=c.micro_batches,
                         zero=c.zero, distributed_optimizer=c.distributed_optimizer, recompute=rc,
                         sequence_parallel=c.tp > 1, overlap_grad_reduce=opts.get("overlap_grad_reduce", True),
                         overlap_param_gather=opts.get("overlap_param_gather", False))

    for c in g.candidates:
        fitted = None
        # the most recomputation first: a layout that does not fit with it fits with no less
        most = g.recompute[-1]
        if len(g.recompute) > 1:
            t1 = time.perf_counter()
            try:
                _, peak = prep.memory(layout(c, most))
            except LayoutError:
                peak = math.inf
            t_memory += time.perf_counter() - t1
            if peak > chip.hbm_bytes:
                counts["layouts"] += len(g.recompute)
                counts["too big"] += len(g.recompute)
                continue
        for rc in g.recompute:
            counts["layouts"] += 1
            if fitted is not None:
                counts["dominated"] += 1
                counts["fit"] += 1   # more recomputation frees memory: it fits too
                continue
            try:
                lay = layout(c, rc)
            except LayoutError:
                continue
            t1 = time.perf_counter()
            _, peak = prep.memory(lay)
            t_memory += time.perf_counter() - t1
            if peak > chip.hbm_bytes:
                counts["too big"] += 1
                continue
            fitted = lay
            counts["fit"] += 1
            counts["costed"] += 1
            t1 = time.perf_counter()
            rep = prep.report(lay)
            t_report += time.perf_counter() - t1
            args = {"cards": g.cards, "tp": c.tp, "pp": c.pp, "cp": c.cp, "ep": c.ep, "micro_batches": c.micro_batches,
                    "sequence_parallel": c.tp > 1, "recompute": rc, "mc2": mc2 and c.tp > 1, **opts}
            if c.vpp > 1:
                args["vpp"] = c.vpp
            if c.distributed_optimizer:
                args["distributed_optimizer"] = True
            elif c.zero:
                args["zero"] = c.zero
            rows.append({"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "ep": c.ep, "vpp": c.vpp,
                         "zero": "DO" if c.distributed_optimizer else c.zero, "recompute": rc or "none",
                         "micro_batch": c.mbs, "micro_batches": c.micro_batches,
                         "tokens_per_s": rep.tokens_per_s, "tokens_per_s_per_card": rep.tokens_per_s_per_card,
                         "step_ms": rep.step_ms, "peak_gib": rep.peak_hbm_bytes / 2 ** 30,
                         "memory_gib": {k: v / 2 ** 30 for k, v in rep.memory.items()},
                         "parts_ms": _parts(rep), "args": args})
    return {"rows": rows, "counts": counts, "seconds": time.perf_counter() - t0, "group": (g.mbs, g.cp),
            "cpu_seconds": time.process_time() - c0,
            "phases": {"capture": t_capture, "memory": t_memory, "cost": t_report}}


# ---- the search ------------------------------------------------------------------------------

@dataclass
class LayoutSearch:
    """The fitting layouts, fastest first, and what the search did."""

    model: str
    chip: str
    cards: int
    global_batch: int
    seq_len: int
    rows: list[dict[str, Any]]
    counts: dict[str, int]
    seconds: float
    groups: int
    workers: int
    group_seconds: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0          # the groups' CPU time, summed over the workers
    phases: dict[str, float] = field(default_factory=dict)   # capture / memory / cost, worker wall seconds

    @property
    def best(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    def frame(self):
        """The rows as a pandas DataFrame (one column per layout dimension and figure)."""
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in r.items() if k not in ("args", "memory_gib", "parts_ms")}
                             | {f"{k} ms": v for k, v in r["parts_ms"].items()} for r in self.rows])

    def table(self, top: int = 10) -> str:
        head = (f"{self.model} on {self.cards} x {self.chip}, global batch {self.global_batch} x {self.seq_len} tokens: "
                f"{self.counts['fit']:,} of {self.counts['layouts']:,} layouts fit ({self.counts['costed']:,} costed, "
                f"{self.counts['dominated']:,} with more recomputation than needed not costed), "
                f"{self.seconds:.1f} s on {self.workers} worker(s)")
        lines = [head, f"{'#':>3} {'tp':>3} {'pp':>3} {'vpp':>3} {'dp':>3} {'cp':>3} {'ep':>3} {'zero':>4} "
                       f"{'recompute':>9} {'mbs':>3} {'m':>5} {'tokens/s/card':>13} {'step s':>8} {'HBM GiB':>7} "
                       f"{'bubble':>6} {'exp.comm':>8} {'recomp':>6}"]
        for i, r in enumerate(self.rows[:top], 1):
            p = r["parts_ms"]
            step = r["step_ms"]
            lines.append(f"{i:>3} {r['tp']:>3} {r['pp']:>3} {r['vpp']:>3} {r['dp']:>3} {r['cp']:>3} {r['ep']:>3} "
                         f"{str(r['zero']):>4} {r['recompute']:>9} {r['micro_batch']:>3} {r['micro_batches']:>5} "
                         f"{r['tokens_per_s_per_card']:>13,.1f} {step / 1e3:>8.2f} {r['peak_gib']:>7.1f} "
                         f"{p['bubble'] / step:>6.1%} {p['exposed dp communication'] / step:>8.1%} "
                         f"{p['recompute'] / step:>6.1%}")
        return "\n".join(lines)

    def why(self, against: int = 3) -> str:
        """Why the best layout wins: its step in parts, and against the next ``against`` layouts
        of a different shape, the parts that differ most."""
        if not self.rows:
            return "no layout fits"
        best = self.rows[0]
        shares = ", ".join(f"{k} {v / best['step_ms']:.1%}" for k, v in best["parts_ms"].items() if v > 0)
        out = [f"best: {describe(best)}: {best['tokens_per_s_per_card']:,.1f} tokens/s per card, step "
               f"{best['step_ms'] / 1e3:.2f} s = {shares}; {best['peak_gib']:.1f} GiB per card"]
        seen = {_shape(best)}
        for r in self.rows[1:]:
            if len(seen) > against:
                break
            if _shape(r) in seen:
                continue
            seen.add(_shape(r))
            diffs = sorted(((r["parts_ms"][k] - best["parts_ms"][k], k) for k in best["parts_ms"]), reverse=True)
            reasons = [f"{k} {r['parts_ms'][k] / 1e3:.2f} s vs {best['parts_ms'][k] / 1e3:.2f} s"
                       for d, k in diffs[:2] if d > 0.005 * best["step_ms"]]
            slower = 1 - r["tokens_per_s"] / best["tokens_per_s"]
            out.append(f"vs {describe(r)} ({slower:.1%} slower): " + ("; ".join(reasons) or "within 0.5 % part by part"))
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "chip": self.chip, "cards": self.cards, "global_batch": self.global_batch,
                "seq_len": self.seq_len, "counts": dict(self.counts), "seconds": self.seconds, "groups": self.groups,
                "workers": self.workers, "rows": self.rows}


def _shape(r: dict) -> tuple:
    """What makes two layouts different in kind (the virtual chunks and sharding are refinements)."""
    return (r["tp"], r["pp"], r["cp"], r["micro_batch"])


def describe(r: dict[str, Any]) -> str:
    """``tp=8 pp=4 vpp=5 dp=2 ...`` of a row."""
    parts = [f"tp={r['tp']}", f"pp={r['pp']}"] + ([f"vpp={r['vpp']}"] if r["vpp"] > 1 else []) + \
        [f"dp={r['dp']}"] + ([f"cp={r['cp']}"] if r["cp"] > 1 else []) + ([f"ep={r['ep']}"] if r["ep"] > 1 else [])
    z = r["zero"]
    parts.append("distributed optimizer" if z == "DO" else (f"zero={z}" if z else "no sharding"))
    parts.append(f"recompute {r['recompute']}")
    parts.append(f"micro-batch {r['micro_batch']} x {r['micro_batches']}")
    return " ".join(parts)


def _check_count(name: str, v, fix: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SearchError(f"{name} = {v!r}: a positive whole number. Fix: {fix}")
    return v


def search_layouts(config, cards: int, global_batch: int, seq_len: int | None = None,
                   chip: str = "Ascend910B2", *, tp: Sequence[int] | None = None, pp: Sequence[int] | None = None,
                   cp: Sequence[int] | None = None, ep: Sequence[int] | None = None,
                   vpp: Sequence[int] | None = None, micro_batch_sizes: Sequence[int] = (1, 2, 4),
                   zero: Sequence | None = None, recompute: Sequence[str | None] = RECOMPUTE_ORDER,
                   max_cp: int = 8, max_vpp: int = 8, precision: str = "bf16", stack: str | None = None, mc2: bool = False,
                   options: dict[str, Any] | None = None, client=None, scheduler: str | None = None,
                   n_workers: int | None = None, local: bool = False) -> LayoutSearch:
    """Every fitting layout of ``config`` (a transformers causal-LM config) on ``cards`` cards of
    ``chip`` for ``global_batch`` sequences of ``seq_len`` tokens (default: the config's
    ``max_position_embeddings``), fastest first (see the module docstring).

    ``tp``, ``pp``, ``cp``, ``ep``, ``vpp``, ``micro_batch_sizes``: the values to try (default: all
    the model and cards allow, cp up to ``max_cp``, vpp up to ``max_vpp``); ``zero``: the sharding options (ZeRO stages
    and/or ``"distributed_optimizer"``; default: Megatron's distributed optimizer or not under the
    MindSpeed stack, ZeRO 0-3 otherwise); ``recompute``: the recomputation options, least work
    first. ``precision``, ``stack``, ``mc2`` and ``options`` (other `simulate_step` keywords, e.g.
    ``fuse_vector``, ``overlap_param_gather``) apply to every layout. Runs the groups on Dask
    (``client``, ``scheduler`` or a LocalCluster of ``n_workers`` processes), or in this process
    with ``local=True``."""
    from ..hw.chip import get_chip
    from ..train.parallel import LayoutError, cluster

    t0 = time.perf_counter()
    if not hasattr(config, "num_hidden_layers") or not hasattr(config, "num_attention_heads"):
        raise SearchError(f"config = {type(config).__name__}: the search needs a transformers causal-LM config "
                          "(num_hidden_layers, num_attention_heads). Fix: transformers.LlamaConfig(...) or "
                          "AutoConfig.from_pretrained(...)")
    cards = _check_count("cards", cards, "cards=64")
    global_batch = _check_count("global_batch", global_batch, "global_batch=1024")
    if seq_len is None:
        seq_len = getattr(config, "max_position_embeddings", None)
    seq_len = _check_count("seq_len", seq_len, "seq_len=4096")
    bad = [r for r in recompute if r not in RECOMPUTE_ORDER]
    if bad or not recompute:
        raise SearchError(f"recompute = {tuple(recompute)!r}: options among None, 'selective', 'full'. "
                          "Fix: recompute=(None, 'selective', 'full')")
    order = tuple(r for r in RECOMPUTE_ORDER if r in recompute)
    chip_obj = get_chip(chip)
    try:
        topo = cluster(chip_obj, cards)
    except LayoutError as e:
        raise SearchError(str(e)) from None
    per_server = topo.cards_per_server if topo is not None else 1
    megatron = _megatron(stack)
    cands = candidate_layouts(config, cards, global_batch, seq_len, per_server, megatron, tp=tp, pp=pp, cp=cp, ep=ep,
                              vpp=vpp, micro_batch_sizes=micro_batch_sizes, zero=zero, max_cp=max_cp,
                              max_vpp=max_vpp)
    if not cands:
        raise SearchError(f"no layout of {cards} cards splits a global batch of {global_batch} with micro-batch sizes "
                          f"{tuple(micro_batch_sizes)} and the tp/pp/cp values allowed. Fix: a global batch that is "
                          "a multiple of the cards, or micro_batch_sizes=(1,)")
    opts = {"precision": precision, "stack": stack, "mc2": mc2, **(options or {})}
    groups: dict[tuple[int, int], list[Candidate]] = {}
    for c in cands:
        groups.setdefault((c.mbs, c.cp), []).append(c)
    # one task per rank's tokens (mbs x seq / cp): groups of the same tokens share their GEMMs' tile
    # searches in the worker; the biggest tasks first, so the last to start are the short ones
    tasks: dict[int, list[_Group]] = {}
    for (mbs, c), cs in groups.items():
        tasks.setdefault(mbs * seq_len // c, []).append(_Group(config, chip_obj.name, cards, seq_len, mbs, c, order,
                                                               opts, cs))
    work = [tasks[k] for k in sorted(tasks, key=lambda k: -sum(len(g.candidates) for g in tasks[k]) * k)]
    results, workers = _run(work, client, scheduler, n_workers, local)
    rows = [r for res in results for r in res["rows"]]
    rows.sort(key=lambda r: -r["tokens_per_s"])
    counts = {k: sum(res["counts"][k] for res in results) for k in results[0]["counts"]} if results else {}
    return LayoutSearch(model=getattr(config, "model_type", "causal-lm"), chip=chip_obj.name, cards=cards,
                        global_batch=global_batch, seq_len=seq_len, rows=rows, counts=counts,
                        seconds=time.perf_counter() - t0, groups=len(groups), workers=workers,
                        group_seconds=[res["seconds"] for res in results],
                        cpu_seconds=sum(res["cpu_seconds"] for res in results),
                        phases={k: sum(res["phases"][k] for res in results) for k in ("capture", "memory", "cost")})


def run_groups(groups: list[_Group]) -> list[dict[str, Any]]:
    """`run_group` of each group, in one process (a Dask task)."""
    return [run_group(g) for g in groups]


def _run(work: list[list[_Group]], client, scheduler, n_workers, local: bool) -> tuple[list[dict], int]:
    if local or (client is None and scheduler is None and (n_workers == 1 or len(work) == 1)):
        return [r for gs in work for r in run_groups(gs)], 1
    from distributed import as_completed

    from .sweeps import _open_client

    c, to_close = _open_client(client, scheduler, n_workers, len(work))
    try:
        workers = len(c.scheduler_info().get("workers", {})) or 1
        futures = [c.submit(run_groups, gs, pure=False) for gs in work]
        out = []
        for fut in as_completed(futures):
            try:
                out += fut.result()
            except Exception as exc:
                for other in futures:
                    other.cancel()
                raise SearchError(f"a layout group failed on a worker: {type(exc).__name__}: {exc}") from exc
        return out, workers
    finally:
        for thing in to_close:
            thing.close()


def median_share(search: LayoutSearch, part: str) -> float:
    """The median share of ``part`` in the fitting layouts' steps (for summaries)."""
    return statistics.median(r["parts_ms"][part] / r["step_ms"] for r in search.rows) if search.rows else math.nan


__all__ = ["Candidate", "LayoutSearch", "RECOMPUTE_ORDER", "SearchError", "candidate_layouts", "describe",
           "median_share", "run_group", "run_groups", "search_layouts"]
