"""The parallel layout of a training run, as Megatron, MindSpeed and DeepSpeed users write it, and
the cards each of its groups spans.

`Layout` holds the degrees (``tp`` tensor, ``pp`` pipeline, ``vpp`` virtual pipeline chunks per
stage, ``cp`` context, ``dp`` data, ``ep`` expert), the micro-batches of a step, the sharding of
the optimizer (``zero`` 0-3, or Megatron's ``distributed_optimizer``, which shards what ZeRO-1
shards), the recomputation (``recompute`` "full" or "selective", ``recompute_layers``) and the
overlaps the framework switches on. `layout_of` checks every argument against its rule and names
the value and a fix.

Ranks are laid out as Megatron-Core orders them by default (``tp-cp-ep-dp-pp``,
`megatron/core/parallel_state.py`, ``order``): tensor-parallel ranks are neighbours, then context,
then data, and the pipeline stages are farthest apart. `group_topology` turns a group of ``size``
ranks ``stride`` apart into the levels it crosses of the cluster's topology (an HCCS mesh inside a
server, RoCE between servers), so its collectives are costed by `pypto_lab.hw.collectives` over
the links they really use: a data-parallel group of four ranks eight apart spans four servers and
never touches HCCS. `cluster` is the server preset of the chip's family with as many servers as the
run needs (a 64-card run is eight Atlas 800T A2 servers on RoCE).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..hw.chip import Chip
from ..hw.topology import Level, Topology, get_topology, list_topologies

RECOMPUTE = (None, "full", "selective")


class LayoutError(ValueError):
    """A parallel layout argument outside its rule; the message names the rule, the value and a fix."""


@dataclass(frozen=True)
class Layout:
    """The parallel degrees and options of one training run (see the module docstring)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    micro_batches: int = 1
    zero: int = 0
    distributed_optimizer: bool = False
    recompute: str | None = None
    recompute_layers: int | None = None     # layers per pipeline chunk recomputed ("full"); None: all
    sequence_parallel: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    fsdp: bool = False                      # FSDP's full_shard (ZeRO-3 as torch writes it)

    @property
    def cards(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def shards_optimizer(self) -> int:
        """Over how many ranks the optimizer state and fp32 master weights are split."""
        return self.dp * self.cp if (self.zero >= 1 or self.distributed_optimizer) else 1

    @property
    def shards_gradients(self) -> int:
        return self.dp * self.cp if self.zero >= 2 else 1

    @property
    def shards_weights(self) -> int:
        return self.dp * self.cp if self.zero >= 3 else 1

    def describe(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}"] + ([f"vpp={self.vpp}"] if self.vpp > 1 else []) + \
            ([f"cp={self.cp}"] if self.cp > 1 else []) + [f"dp={self.dp}"] + \
            ([f"ep={self.ep}"] if self.ep > 1 else []) + [f"micro-batches={self.micro_batches}"]
        if self.distributed_optimizer:
            parts.append("distributed optimizer")
        elif self.zero:
            parts.append(f"{'FSDP full_shard' if self.fsdp else 'ZeRO'}-{self.zero}" if not self.fsdp
                         else "FSDP full_shard")
        if self.recompute:
            parts.append(f"recompute {self.recompute}"
                         + (f" ({self.recompute_layers} layers/chunk)" if self.recompute_layers is not None else ""))
        return ", ".join(parts)


def _count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LayoutError(f"{name} = {value!r}: a whole number >= {minimum}. Fix: {name}={minimum}")
    return value


def layout_of(cards: int | None, tp: int = 1, pp: int = 1, dp: int | None = None, cp: int = 1, ep: int = 1,
              vpp: int | None = None, micro_batches: int = 1, zero: int | None = None,
              distributed_optimizer: bool = False, recompute: str | None = None,
              recompute_layers: int | None = None, sequence_parallel: bool = False,
              overlap_grad_reduce: bool = True, overlap_param_gather: bool = False,
              fsdp: bool = False) -> Layout:
    """A checked `Layout`: ``cards`` and ``dp`` may each be left out (``cards = tp * pp * cp * dp``)."""
    tp, pp, cp, ep = (_count(n, v) for n, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)))
    vpp = 1 if vpp is None else _count("vpp", vpp)
    micro_batches = _count("micro_batches", micro_batches)
    model = tp * pp * cp
    if dp is None:
        if cards is None:
            dp = 1
        else:
            cards = _count("cards", cards)
            if cards % model:
                raise LayoutError(f"cards = {cards} with tp={tp} x pp={pp} x cp={cp} = {model}: the cards must be a "
                                  f"multiple of tp x pp x cp (the rest is data parallel). Fix: cards="
                                  f"{max(model, cards // model * model)} or smaller tp/pp/cp")
            dp = cards // model
    dp = _count("dp", dp)
    if cards is not None and cards != model * dp:
        raise LayoutError(f"cards = {cards} but tp={tp} x pp={pp} x cp={cp} x dp={dp} = {model * dp}. Rule: the "
                          "cards are tp x pp x cp x dp. Fix: leave one of cards or dp out")
    if zero is None:
        zero = 0
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise LayoutError(f"zero = {zero!r}: a ZeRO stage 0, 1, 2 or 3 (DeepSpeed's zero_optimization.stage). "
                          "Fix: zero=1 to shard the optimizer state")
    if distributed_optimizer and zero:
        raise LayoutError(f"distributed_optimizer=True with zero={zero}: Megatron's distributed optimizer is its "
                          "own ZeRO-1 (optimizer state and master weights sharded over data parallel); give one "
                          "of them. Fix: zero=0 with distributed_optimizer=True, or distributed_optimizer=False")
    if recompute not in RECOMPUTE:
        raise LayoutError(f"recompute = {recompute!r}: one of None, 'full' (each layer keeps its input and "
                          "reruns its forward in the backward) or 'selective' (only the attention core is "
                          "recomputed). Fix: recompute='full'")
    if recompute_layers is not None:
        _count("recompute_layers", recompute_layers, 0)
        if recompute != "full":
            raise LayoutError(f"recompute_layers = {recompute_layers} with recompute={recompute!r}: the number of "
                              "layers recomputed whole applies to full recomputation (Megatron's "
                              "--recompute-method block --recompute-num-layers). Fix: recompute='full'")
    if vpp > 1 and pp == 1:
        raise LayoutError(f"vpp = {vpp} with pp = 1: virtual pipeline chunks interleave the stages of a pipeline. "
                          "Fix: vpp=1, or pp >= 2")
    if vpp > 1 and micro_batches % pp:
        raise LayoutError(f"micro_batches = {micro_batches} with pp={pp}, vpp={vpp}: Megatron's interleaved "
                          "schedule needs the micro-batches to be a multiple of the pipeline stages. Fix: "
                          f"micro_batches={max(pp, micro_batches // pp * pp)}")
    if ep > 1 and (dp * cp) % ep:
        raise LayoutError(f"ep = {ep} with dp x cp = {dp * cp}: expert-parallel ranks are carved out of the data "
                          f"(and context) parallel ranks, so ep divides dp x cp (Megatron-Core's expert data-parallel "
                          f"group is dp x cp / ep ranks). Fix: ep in "
                          f"{[d for d in range(1, dp * cp + 1) if (dp * cp) % d == 0]}, or more cards")
    if sequence_parallel and tp == 1:
        sequence_parallel = False
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batches=micro_batches, zero=zero,
                  distributed_optimizer=bool(distributed_optimizer), recompute=recompute,
                  recompute_layers=recompute_layers, sequence_parallel=bool(sequence_parallel),
                  overlap_grad_reduce=bool(overlap_grad_reduce), overlap_param_gather=bool(overlap_param_gather),
                  fsdp=bool(fsdp))


# ---- where the groups sit -------------------------------------------------------------------

def cluster(chip: Chip, cards: int) -> Topology | None:
    """The server preset of ``chip``'s family (``hw/topologies``; one built of this very chip
    preferred, then a training server such as the Atlas 800T) with as many servers as ``cards`` fill: a copy whose last level (the servers on
    RoCE) has that size. None for one card."""
    if cards <= 1:
        return None
    family = chip.name[:10]
    presets = [get_topology(n) for n in list_topologies()]
    mine = [t for t in presets if t.chip.startswith(family)]
    if not mine:
        raise LayoutError(f"cards = {cards} on {chip.name}: no server topology of that chip family "
                          f"({', '.join(list_topologies())}). Fix: one card, or a chip of a family with a preset")
    # one server preset, of this very chip if there is one, a training server before an inference one
    base = min(mine, key=lambda t: (t.servers, t.chip != chip.name, "800I" in t.name, t.name))
    per = base.cards_per_server
    if cards <= per:
        servers = 1
    else:
        if cards % per:
            raise LayoutError(f"cards = {cards}: more than one {base.name} server of {per} cards, so the cards fill "
                              f"whole servers. Fix: cards={cards // per * per} or {(cards // per + 1) * per}")
        servers = cards // per
    if servers == base.servers:
        return base
    last = dataclasses.replace(base.levels[-1], size=servers)
    return dataclasses.replace(base, name=f"{servers} x {base.name.split('-x')[0]}" if servers > 1 else base.name,
                               levels=(*base.levels[:-1], last))


def group_topology(topology: Topology | None, size: int, stride: int) -> Topology | None:
    """The levels of ``topology`` a group of ``size`` ranks, ``stride`` ranks apart (rank ``i *
    stride``), crosses, as a topology of its own whose cards are exactly the group's: the costers
    of `pypto_lab.hw.collectives` then cost the group's collectives over the links it uses. None
    for a group of one."""
    if size <= 1 or topology is None:
        return None
    ranks = [i * stride for i in range(size)]
    sizes, unit = [], 1
    for lv in topology.levels:
        above = unit * lv.size
        # members sharing a unit of this level, counted in units of the level below
        per_unit: dict[int, set[int]] = {}
        for r in ranks:
            per_unit.setdefault(r // above, set()).add(r // unit)
        sizes.append(max(len(v) for v in per_unit.values()))
        unit = above
    # the last level joins as many servers as the group spans
    sizes[-1] = len({r // (unit // topology.levels[-1].size) for r in ranks})
    if math.prod(sizes) != size:    # an uneven spread: treat it as the same count on every unit
        sizes[-1] = max(1, size // math.prod(sizes[:-1]))
    levels = tuple(dataclasses.replace(lv, size=s) for lv, s in zip(topology.levels, sizes))
    return dataclasses.replace(topology, name=f"{topology.name} [{size} ranks, stride {stride}]", levels=levels)


def p2p_us(topology: Topology | None, nbytes: float, stride: int) -> float:
    """One point-to-point send of ``nbytes`` between ranks ``stride`` apart (a pipeline stage's
    activations to the next stage, a ring step of context parallelism): one step of the innermost
    level the two ranks do not share (its latency plus the bytes over one link of it, at the
    level's efficiency), plus the topology's launch of a communication op. 0 on one card."""
    if topology is None or stride <= 0:
        return 0.0
    unit, crossed = 1, topology.levels[-1]
    for lv in topology.levels:
        unit *= lv.size
        if stride < unit:
            crossed = lv
            break
    return topology.launch_us + crossed.latency_us + nbytes / (crossed.effective_gbps * 1e3)


def crossed_level(topology: Topology | None, stride: int) -> Level | None:
    """The level two ranks ``stride`` apart talk over (None on one card)."""
    if topology is None:
        return None
    unit = 1
    for lv in topology.levels:
        unit *= lv.size
        if stride < unit:
            return lv
    return topology.levels[-1]


__all__ = ["RECOMPUTE", "Layout", "LayoutError", "cluster", "crossed_level", "group_topology", "layout_of", "p2p_us"]
