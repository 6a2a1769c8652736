"""Pass infrastructure: a pass base, a registry by name, a manager with instruments.

A pass is a small, named, pure step ``Graph -> PassResult``: it works on a copy of the graph and
says whether it changed anything, and why it declined where it did (``notes``). Passes name the
passes they require before them; the manager checks the order. Instruments are called before
and after every pass (TVM's PassInstrument): recording a snapshot per pass is one instrument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..capture.graph import Graph


@dataclass
class PassContext:
    """What every pass may read: the chip, the precision and the user's options."""

    chip: Any = None
    precision: str = "fp16"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PassResult:
    graph: Graph
    modified: bool
    notes: list[str] = field(default_factory=list)  # e.g. why a fusion was declined


class Pass:
    """Base of all passes: subclasses set ``name`` (and ``requires``) and implement ``run``."""

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> PassResult:
        return self.run(graph.copy(), ctx or PassContext())

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


REGISTRY: dict[str, type[Pass]] = {}


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make a pass available by its name."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name; set the class attribute name = '...'")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"two passes named {cls.name!r}: {REGISTRY[cls.name].__name__} and {cls.__name__}")
    REGISTRY[cls.name] = cls
    return cls


def get_pass(name: str, **options) -> Pass:
    try:
        return REGISTRY[name](**options)
    except KeyError:
        raise KeyError(f"no pass named {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None


class Instrument:
    """Called around every pass; override what you need."""

    def before(self, p: Pass, graph: Graph, ctx: PassContext) -> None:
        pass

    def after(self, p: Pass, result: PassResult, ctx: PassContext) -> None:
        pass


@dataclass
class Snapshot:
    name: str
    graph: Graph
    modified: bool
    notes: list[str]


class RecordSnapshots(Instrument):
    """Keeps the graph after each pass (and its notes), for reports and the speedup waterfall."""

    def __init__(self):
        self.snapshots: list[Snapshot] = []

    def after(self, p: Pass, result: PassResult, ctx: PassContext) -> None:
        self.snapshots.append(Snapshot(p.name, result.graph.copy(), result.modified, list(result.notes)))


class PassOrderError(ValueError):
    """A pass runs before a pass it requires."""


class PassManager:
    """Runs passes in order, checks their requirements and calls the instruments."""

    def __init__(self, passes: list[Pass | str], instruments: list[Instrument] | None = None):
        self.passes = [get_pass(p) if isinstance(p, str) else p for p in passes]
        self.instruments = list(instruments or [])
        seen: set[str] = set()
        for p in self.passes:
            missing = [r for r in p.requires if r not in seen]
            if missing:
                raise PassOrderError(
                    f"pass {p.name!r} requires {', '.join(repr(m) for m in missing)} to run before it; "
                    f"order given: {', '.join(q.name for q in self.passes)}"
                )
            seen.add(p.name)

    def run(self, graph: Graph, ctx: PassContext | None = None) -> Graph:
        ctx = ctx or PassContext()
        for p in self.passes:
            for inst in self.instruments:
                inst.before(p, graph, ctx)
            result = p.run(graph.copy(), ctx)
            for inst in self.instruments:
                inst.after(p, result, ctx)
            graph = result.graph
        return graph
