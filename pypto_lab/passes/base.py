"""Pass infrastructure: the pass base, a registry by name, a manager with instruments.

A pass is a frozen dataclass (as in xDSL): its fields are its typed options, ``name`` and
``requires`` are class attributes, and ``apply(graph, ctx)`` rewrites a copy of the graph and
returns a `PassResult`: whether it changed anything, a one-line summary and structured `Note`s
(which node, why) where it declined or had something to say. Passes are values, so a level is a
tuple of configured pass instances. The manager checks that every pass runs after the passes it
requires and calls instruments before and after each pass (TVM's PassInstrument): recording a
snapshot is one, the graph verifier (`Verify`, torch.fx's run_checks_after_each_pass, PyPTO's
PostCheck) another; it runs after every pass when ``PYPTO_LAB_VERIFY=1`` (the test suite sets it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from ..capture.catalogue import aten_name
from ..capture.graph import Graph, Node
from ..hw.chip import DEFAULT_CHIP, Chip, get_chip
from ..stack import DEFAULT_STACK, FUSIONS, Stack, get_stack
from .options import OptimizationOptions
from .verify import verify


@dataclass(frozen=True)
class Note:
    """Something a pass says about one node (``node``; "" for the graph as a whole): why it declined
    a fusion, what it converted. ``where`` describes the node for people ("conv2d layer1.0.conv3
    (conv2d_3)"). Views read these fields; nobody parses the text."""

    pass_name: str
    node: str
    reason: str
    where: str = ""

    def __str__(self) -> str:
        who = self.where or self.node
        return f"{who}: {self.reason}" if who else self.reason


def describe(node: Node) -> str:
    """"conv2d layer1.0.conv3 (conv2d_3)": the op, where it comes from and its node name."""
    op = aten_name(node.target)
    return f"{op} {node.module} ({node.name})" if node.module else f"{op} {node.name}"


@dataclass(frozen=True)
class PassContext:
    """What every pass may read: the chip (resolved once, by `optimize`), the Cube precision of the
    run (after CANN's rule on that chip), the options in force when the run started, and the
    software stack (`pypto_lab.stack`), which says which fusions run."""

    chip: Chip
    precision: str = "fp16"
    options: OptimizationOptions = field(default_factory=OptimizationOptions)
    stack: Stack = field(default_factory=lambda: get_stack(DEFAULT_STACK))

    def __post_init__(self):
        if not isinstance(self.chip, Chip):
            raise TypeError(f"PassContext.chip must be a Chip, got {self.chip!r}: resolve it once with "
                            "pypto_lab.get_chip(name_or_path)")
        if not isinstance(self.stack, Stack):
            raise TypeError(f"PassContext.stack must be a Stack, got {self.stack!r}: resolve it once with "
                            "pypto_lab.get_stack(name_or_path)")

    def applies(self, fusion: str) -> bool:
        """Whether the run's software stack applies ``fusion`` (`pypto_lab.stack.FUSIONS`)."""
        return self.stack.applies(fusion)


def default_context() -> PassContext:
    return PassContext(get_chip(DEFAULT_CHIP))


@dataclass
class PassResult:
    graph: Graph
    modified: bool
    summary: str = ""
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class Pass:
    """Base of all passes: subclasses set ``name`` (and ``requires``) and implement ``apply``."""

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()
    fusion: ClassVar[str] = ""        # a fusion pass: the fusion (`pypto_lab.stack.FUSIONS`) it makes

    def apply(self, graph: Graph, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> PassResult:
        """Run on a copy of ``graph`` (the input graph is never changed)."""
        return self.apply(graph.copy(), ctx or default_context())

    def note(self, node: Node | str, reason: str) -> Note:
        """A note about ``node`` (a Node: named and described; a name; or "" for the graph)."""
        if isinstance(node, Node):
            return Note(self.name, node.name, reason, describe(node))
        return Note(self.name, node, reason)


REGISTRY: dict[str, type[Pass]] = {}


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make a pass available by its name."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name; set the class attribute name: ClassVar[str] = '...'")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"two passes named {cls.name!r}: {REGISTRY[cls.name].__name__} and {cls.__name__}")
    REGISTRY[cls.name] = cls
    return cls


def get_pass(name: str, **options) -> Pass:
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise KeyError(f"no pass named {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None
    return cls(**options)


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
    summary: str
    notes: tuple[Note, ...]


class RecordSnapshots(Instrument):
    """Keeps the graph after each pass (and what it said), for reports and the speedup waterfall.
    Passes never edit their input graph, so the snapshot is the result itself."""

    def __init__(self):
        self.snapshots: list[Snapshot] = []

    def after(self, p: Pass, result: PassResult, ctx: PassContext) -> None:
        self.snapshots.append(Snapshot(p.name, result.graph, result.modified, result.summary, result.notes))


class Verify(Instrument):
    """Checks the graph after every pass (`pypto_lab.passes.verify.verify`)."""

    def after(self, p: Pass, result: PassResult, ctx: PassContext) -> None:
        verify(result.graph, after=p.name)


def verify_enabled() -> bool:
    return os.environ.get("PYPTO_LAB_VERIFY", "") not in ("", "0")


class PassOrderError(ValueError):
    """A pass runs before a pass it requires."""


class PassManager:
    """Runs passes in order, checks their requirements and calls the instruments (plus `Verify`
    when ``PYPTO_LAB_VERIFY=1``). A fusion pass whose fusion the run's stack does not apply is
    not run; it leaves the graph as it was, with a summary that says why."""

    def __init__(self, passes: list[Pass | str] | tuple, instruments: list[Instrument] | None = None):
        self.passes = [get_pass(p) if isinstance(p, str) else p for p in passes]
        self.instruments = list(instruments or [])
        if verify_enabled() and not any(isinstance(i, Verify) for i in self.instruments):
            self.instruments.append(Verify())
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
        ctx = ctx or default_context()
        for p in self.passes:
            for inst in self.instruments:
                inst.before(p, graph, ctx)
            if p.fusion and not ctx.applies(p.fusion):
                result = PassResult(graph, False, f"not run: the {ctx.stack.name} stack does not apply this fusion "
                                                  f"({FUSIONS[p.fusion]})")
            else:
                result = p.apply(graph.copy(), ctx)
            for inst in self.instruments:
                inst.after(p, result, ctx)
            graph = result.graph
        return graph
