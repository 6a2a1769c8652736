"""Multi-card topologies as data: the frozen dataclasses a topology preset (TOML) is loaded into.

A topology is a stack of link levels, innermost first: the cards of one HCCS group, the groups of a
server, the servers of a cluster. Each level says how its units are joined (a full mesh of direct
links, or one port per card into a switch), how many units it joins, and the per-link bandwidth,
step latency and efficiency of that link. The last level always joins servers. `collectives.py`
costs HCCL collectives over these levels; nothing else is read.

Every number in a shipped preset is ``key = { value = ..., source = "..." }`` (a test checks it);
identifiers (level name, link, kind) are plain strings. Unknown keys, missing keys and impossible
values raise `TopologyError` naming the file, the key, the value, the rule and a fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tomllib

from .chip import Chip, ChipConfigError, get_chip, list_chips
from .preset_file import PresetFolder, PresetReader

TOPOLOGY_DIR = Path(__file__).with_name("topologies")
LINK_KINDS = ("full_mesh", "switched")


class TopologyError(ValueError):
    """A topology, or a collective asked of it, breaks a rule: the message names the rule, the value
    and a fix."""


@dataclass(frozen=True)
class Level:
    """One link level: ``size`` units of the level below (cards, for the first level) joined by ``link``.

    ``kind`` is ``"full_mesh"`` (every card has a direct link to each peer of its unit, used
    concurrently) or ``"switched"`` (each card has ``links_per_card`` ports into a switch or bus).
    ``link_gbps`` is one link's bandwidth per direction; ``latency_us`` the start-up of one
    algorithm step on this link (alpha); ``efficiency`` the share of ``link_gbps`` a transfer gets.
    """

    name: str
    link: str
    kind: str
    size: int
    links_per_card: int
    link_gbps: float
    latency_us: float
    efficiency: float

    @property
    def effective_gbps(self) -> float:
        """What one link delivers to one transfer, GB/s per direction."""
        return self.link_gbps * self.efficiency

    @property
    def card_gbps(self) -> float:
        """All of one card's links at this level together, GB/s per direction (nominal)."""
        return self.link_gbps * self.links_per_card


@dataclass(frozen=True)
class Topology:
    """Cards of one chip preset, joined by ``levels`` (innermost first; the last one joins servers)."""

    name: str
    chip: str
    levels: tuple[Level, ...]
    launch_us: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    path: str = field(default="", compare=False, repr=False)

    def __str__(self) -> str:
        return self.name

    @property
    def cards_per_server(self) -> int:
        return math.prod(lv.size for lv in self.levels[:-1])

    @property
    def servers(self) -> int:
        return self.levels[-1].size

    @property
    def max_cards(self) -> int:
        return self.cards_per_server * self.servers

    @property
    def intra_server(self) -> Level:
        """The innermost level: the links a card uses to its nearest peers."""
        return self.levels[0]

    @property
    def inter_server(self) -> Level:
        return self.levels[-1]

    def chip_preset(self) -> Chip:
        return get_chip(self.chip)

    def placement(self, cards: int) -> tuple[int, ...]:
        """How many units each level joins for ``cards`` cards placed in order (fill a group, then
        the next): one count per level, 1 where a level is not crossed."""
        if isinstance(cards, bool) or not isinstance(cards, int) or cards < 1:
            raise TopologyError(
                f"cards = {cards!r}: must be a positive integer (the number of NPUs taking part); "
                "fix: pass e.g. cards=8")
        if cards > self.max_cards:
            bigger = [n for n in list_topologies() if n != self.name and n.startswith(self.name)]
            hint = f" such as {', '.join(bigger)}" if bigger else ""
            raise TopologyError(
                f"cards = {cards}: more cards than topology {self.name} has ({self.servers} server(s) x "
                f"{self.cards_per_server} cards = {self.max_cards}); fix: use at most {self.max_cards} cards, "
                f"or a topology with more servers{hint} (copy a preset from {TOPOLOGY_DIR} and raise the "
                "inter-server size)")
        counts, rest, unit = [], cards, 1
        for i, lv in enumerate(self.levels):
            if rest <= lv.size:
                counts.append(rest)
                counts.extend(1 for _ in self.levels[i + 1:])
                return tuple(counts)
            unit *= lv.size
            if rest % lv.size:
                lower, upper = (cards // unit) * unit, (cards // unit + 1) * unit
                raise TopologyError(
                    f"cards = {cards}: spans more than one {lv.name} unit of {unit} cards in {self.name}, so it "
                    f"must fill each one (HCCL's hierarchical algorithms need the same card count in every "
                    f"unit): cards must be a multiple of {unit}; fix: use {lower} or {upper} cards")
            counts.append(lv.size)
            rest //= lv.size
        raise AssertionError("unreachable: cards <= max_cards")

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name, "chip": self.chip, "servers": self.servers,
            "cards_per_server": self.cards_per_server, "launch_us": self.launch_us,
            "levels": [
                {"name": lv.name, "link": lv.link, "kind": lv.kind, "size": lv.size,
                 "links_per_card": lv.links_per_card, "link_gbps": lv.link_gbps,
                 "card_gbps": lv.card_gbps, "latency_us": lv.latency_us, "efficiency": lv.efficiency}
                for lv in self.levels
            ],
        }


# ---- loading --------------------------------------------------------------------------

_TOP_KEYS = {"topology", "levels"}
_TOPOLOGY_KEYS = {"name": str, "chip": str, "launch_us": float}
_LEVEL_KEYS = {"name": str, "link": str, "kind": str, "size": int, "links_per_card": int,
               "link_gbps": float, "latency_us": float, "efficiency": float}
_PLAIN = {"name", "link", "kind"}  # identifiers, not constants: no source needed


def load_topology(path: str | Path) -> Topology:
    """Load and validate a topology preset file."""
    path = Path(path)
    r = PresetReader(str(path), TopologyError, f"see the shipped presets in {TOPOLOGY_DIR}")
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{path}: not valid TOML: {exc}; fix: compare with a shipped preset") from exc
    except UnicodeDecodeError as exc:
        raise TopologyError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): a "
                            f"topology is a UTF-8 TOML file; fix: save it as UTF-8, starting from a copy of a shipped "
                            f"preset in {TOPOLOGY_DIR}") from None
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise r.fail(unknown[0], doc[unknown[0]], "unknown section", "use only [topology] and [[levels]]")
    if "topology" not in doc:
        raise r.fail("topology", None, "missing section", "add a [topology] table with name, chip, launch_us")
    t = r.section("topology", doc["topology"], _TOPOLOGY_KEYS)
    if t["launch_us"] < 0:
        raise r.fail("topology.launch_us", t["launch_us"], "impossible value: must be >= 0", "use 0 or more")
    try:
        get_chip(t["chip"])
    except ChipConfigError:
        raise r.fail("topology.chip", t["chip"], "unknown chip preset",
                     f"use one of {', '.join(list_chips())} (or the path of a chip .toml)") from None

    raw_levels = doc.get("levels")
    if not isinstance(raw_levels, list) or len(raw_levels) < 2:
        raise r.fail("levels", raw_levels, "needs at least two [[levels]]: the links inside a server, "
                     "then the one between servers", "add an intra-server and an inter-server level")
    levels = []
    for i, table in enumerate(raw_levels):
        prefix = f"levels[{i}]"
        lv = r.section(prefix, table, _LEVEL_KEYS)
        if lv["kind"] not in LINK_KINDS:
            raise r.fail(f"{prefix}.kind", lv["kind"], "unknown link kind", f"use one of {', '.join(LINK_KINDS)}")
        for key in ("size", "links_per_card"):
            if lv[key] < 1:
                raise r.fail(f"{prefix}.{key}", lv[key], "impossible value: must be >= 1", "use 1 or more")
        if lv["link_gbps"] <= 0:
            raise r.fail(f"{prefix}.link_gbps", lv["link_gbps"], "impossible value: must be > 0",
                         "give the link's bandwidth per direction in GB/s")
        if lv["latency_us"] < 0:
            raise r.fail(f"{prefix}.latency_us", lv["latency_us"], "impossible value: must be >= 0", "use 0 or more")
        if not 0 < lv["efficiency"] <= 1:
            raise r.fail(f"{prefix}.efficiency", lv["efficiency"], "must be in (0, 1]",
                         "use 1.0 for the nominal bandwidth")
        if lv["kind"] == "full_mesh" and lv["links_per_card"] < lv["size"] - 1:
            raise r.fail(f"{prefix}.links_per_card", lv["links_per_card"],
                         f"a full mesh of {lv['size']} cards needs {lv['size'] - 1} links per card",
                         f"set links_per_card = {lv['size'] - 1} or kind = \"switched\"")
        levels.append(Level(**lv))
    if levels[-1].kind != "switched":
        raise r.fail(f"levels[{len(levels) - 1}].kind", levels[-1].kind,
                     "the last level joins servers and must be \"switched\"",
                     "end with an inter-server level of kind \"switched\" (size 1 for a single server)")
    return Topology(name=t["name"], chip=t["chip"], levels=tuple(levels), launch_us=t["launch_us"],
                    sources=MappingProxyType(r.sources), path=str(path))


_FOLDER = PresetFolder(TOPOLOGY_DIR, lambda path: load_topology(path), TopologyError, "topology")


def list_topologies() -> list[str]:
    """Names of the shipped topology presets."""
    return _FOLDER.names()


def get_topology(name_or_path: str | Path | Topology) -> Topology:
    """A shipped topology by name (``"Atlas800T-A2"``) or any topology file by path."""
    if isinstance(name_or_path, Topology):
        return name_or_path
    return _FOLDER.find(name_or_path)
