"""The shape of the package: data flows one way, so its import graph has no cycle, and the chip
model (`pypto_lab/hw`) imports nothing from the compiler built on top of it.

The import graph is read from the source with `ast`: every ``import`` and ``from ... import``
of a pypto_lab module, at module level or inside a function (an import hidden in a function to
dodge a cycle is still a cycle). ``from pkg import name`` is an edge to ``pkg.name`` when that is
a module, else to ``pkg``. Imports under ``if TYPE_CHECKING:`` are not executed and not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pypto_lab"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports_of(name: str) -> set[str]:
    """The pypto_lab modules ``name`` imports, anywhere in its source."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    skip = _type_checking_lines(tree)
    package = name if _is_package(name) else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod not in MODULES:
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in MODULES else mod)
    out.discard(name)
    return out


GRAPH = {name: imports_of(name) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_is_read_from_the_source():
    assert "pypto_lab.kernels.ir" in GRAPH["pypto_lab.capture.graph"]
    assert "pypto_lab.hw.chip" in GRAPH["pypto_lab.compiler.optimize"]
    assert len(MODULES) > 60


def test_there_is_no_import_cycle_inside_pypto_lab():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles (each a set of modules importing each other): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_layers_contract_of_pyproject_holds():
    """lint-imports (import-linter) with the layers contract in pyproject.toml: each stage imports
    only the stages below it, siblings on one layer import neither each other."""
    import subprocess
    import sys

    pytest.importorskip("importlinter")
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                          "lint_imports_command()", "--no-cache"], capture_output=True, text=True, cwd=root)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 kept, 0 broken" in run.stdout


def test_every_package_of_pypto_lab_is_a_layer_of_the_contract():
    """A new folder must be placed in the layers (pyproject.toml), or the contract says nothing of it."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    layers = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {p.strip().split(".")[1] for line in layers for p in line.split("|")}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == named, f"packages not in the layers: {sorted(packages - named)}; " \
                              f"layers that are no package: {sorted(named - packages)}"


def test_the_package_root_holds_only_the_public_api():
    """Every module lives in the folder of its stage; the root has the public API and the seed
    article's import paths (at most three modules)."""
    root_modules = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root_modules) <= 3, root_modules
    assert "__init__.py" in root_modules


def test_nothing_on_the_path_imports_the_course_checkers():
    users = sorted(name for name, deps in GRAPH.items() if not name.startswith("pypto_lab.course")
                   and any(d.startswith("pypto_lab.course") for d in deps))
    assert not users, f"the exercise checkers sit above every stage; imported by {users}"


def test_hardware_only_use_loads_neither_torch_nor_matplotlib():
    """The chip model and the public API's hardware names work without torch: lazy attributes."""
    import subprocess
    import sys

    code = ("import pypto_lab.hw, pypto_lab, sys; pypto_lab.list_chips(); pypto_lab.get_stack(pypto_lab.DEFAULT_STACK); "
            "pypto_lab.simulate_matmul(128, 128, 128); "
            "heavy = [m for m in ('torch', 'matplotlib', 'transformers', 'pandas') if m in sys.modules]; "
            "assert not heavy, heavy")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_seed_articles_import_paths_are_the_stage_modules():
    import importlib

    from pypto_lab._seed_paths import SEED_PATHS

    for alias, real in SEED_PATHS.items():
        assert importlib.import_module(alias) is importlib.import_module(real), alias
