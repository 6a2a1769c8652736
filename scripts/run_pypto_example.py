#!/usr/bin/env python3
"""Run one of CANN PyPTO's own example scripts on pypto_lab's simulated NPU.

    python scripts/run_pypto_example.py PATH [ARGS...]

PATH is an example file of a checkout of the real framework's repository (we do not vendor it:
clone it yourself). The script is read, never written: in memory,

* ``import pypto`` (and ``import pypto as X``, ``from pypto[.sub] import ...``) becomes
  ``import pypto_lab.pto as pypto`` (``pypto_lab.pto[.sub]``);
* ``--run_mode sim`` is passed when the script has that option and ARGS does not set it;
* the golden comparison is turned on: the real examples compare with torch only inside
  ``if run_mode == "npu":`` (or ``... == pypto.RunMode.NPU``, ``"npu" in device``); such blocks that
  compare and touch no NPU-only API run unconditionally, and every ``torch.testing.assert_close``,
  ``numpy.testing.assert_allclose``, ``torch.allclose`` and ``numpy.allclose`` the script makes is
  recorded, so a result the script computes and drops (``torch.allclose(out, golden)``) counts too.

At the end it prints each comparison (line, max |diff|, verdict) and exits 1 if the script
raised or any comparison failed. ``--no-golden`` runs the script as it is (only the import
rewritten); ``--keep-run-mode`` does not add ``--run_mode sim``.

For the model kernels of the real repository (``models/``), whose tests run on an NPU:

    python scripts/run_pypto_example.py --npu-on-cpu --call test_select_experts --set bs=8 \
        PYPTO_SRC/models/glm_v4_5/glm_select_experts.py

* ``--npu-on-cpu`` installs ``scripts/npu_on_cpu.py``: ``torch_npu``, ``torch.npu``, ``device='npu:N'``
  and NPU graphs stood in by the CPU (its docstring says exactly what and why that is honest);
* ``--call EXPR`` loads the file as a module (its ``if __name__ == "__main__":`` block does not run)
  and then evaluates EXPR in it: a bare name (``test_ifa``) is called with no arguments, anything
  else (``'ifa(*build_ifa_config(get_case_config("ifa_b8_s1_1_s2_16k")))'``) is evaluated as is;
* ``--set NAME=VALUE`` (repeatable) replaces, everywhere in the file, the literal value of every
  assignment ``NAME = literal``, dict entry ``"NAME": literal`` and keyword argument
  ``NAME=literal``, to make a test's sizes small enough for a laptop. Each replacement is printed
  with its line; a NAME that matches nothing is an error. The kernel and the golden read the same
  variables, so the comparison stays a comparison of the same computation at another size. Also
  matched: a parameter's default (``def test(t=16)``), ``for NAME in [literals]`` (VALUE is then
  the list) and right-hand sides that are arithmetic of literals and names (``[8192] * b``); VALUE
  may be an expression of the file's names (``--set 'seqused_kv_list=[256] * b'``).

Every pto kernel launch is recorded (kernel, simulated cycles and µs, GM bytes, the roofline,
wall time) and printed at the end; ``--report PATH`` writes the whole run as JSON (the sizes set,
the comparisons, the launches, the format casts, the error), whole or not at all.
``--cost-only`` runs the kernels without computing values (`pypto_lab.pto.config.cost_only`) and
stops the test at its first comparison: for the costs of a test at its own sizes when the numerics
at that size would take too long (the launches before that point are costed with their real
control flow).
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass

TARGET = "pypto_lab.pto"
COMPARE_NAMES = {"assert_close", "assert_allclose", "allclose", "isclose", "equal"}
HOOK = "__pto_assert__"
NPU_ONLY = {"torch_npu", "npu", "get_device_id", "set_device", "synchronize"}


# ---------------------------------------------------------------------------- source rewriting

def _target(module: str) -> str:
    return TARGET + module[len("pypto"):]


class _Rewrite(ast.NodeTransformer):
    def __init__(self, golden: bool):
        self.golden = golden
        self.imports = 0
        self.enabled: list[int] = []

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name == "pypto" or alias.name.startswith("pypto."):
                if alias.asname is None:
                    # `import pypto` and `import pypto.frontend` both bind the name `pypto`
                    alias.name, alias.asname = TARGET, "pypto"
                else:
                    alias.name = _target(alias.name)
                self.imports += 1
        return node

    def visit_ImportFrom(self, node):
        if node.level == 0 and node.module and (node.module == "pypto" or node.module.startswith("pypto.")):
            node.module = _target(node.module)
            self.imports += 1
        return node

    def visit_If(self, node):
        self.generic_visit(node)
        if self.golden and _tests_for_npu(node.test) and _compares(node.body) and not _npu_only(node.body):
            node.test = ast.copy_location(ast.Constant(True), node.test)
            node.body = [_AssertHook().visit(stmt) for stmt in node.body]
            self.enabled.append(node.lineno)
        return node


class _AssertHook(ast.NodeTransformer):
    """`assert max_diff < tol, msg` -> `__pto_assert__(max_diff < tol, line, msg, max_diff)`: recorded."""

    def visit_Assert(self, node):
        t = node.test
        value = t.left if isinstance(t, ast.Compare) and len(t.ops) == 1 else ast.Constant(None)
        call = ast.Call(ast.Name(HOOK, ast.Load()),
                        [t, ast.Constant(node.lineno), node.msg or ast.Constant(None), value], [])
        return ast.copy_location(ast.Expr(call), node)


def _names(tree) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.alias):
            out.add(n.name.split(".")[0])
    return out


def _tests_for_npu(test) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.Constant) and n.value == "npu":
            return True
        if isinstance(n, ast.Attribute) and n.attr == "NPU":
            return True
    return False


def _compares(body) -> bool:
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Assert):
                return True
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in COMPARE_NAMES:
                    return True
    return False


def _npu_only(body) -> bool:
    return any(_names(stmt) & NPU_ONLY for stmt in body)


_LITERAL_NODES = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.BinOp, ast.UnaryOp, ast.Name,
                  ast.Load, ast.operator, ast.unaryop)


def _literal_like(node) -> bool:
    """A literal, or arithmetic of literals and plain names (``[8192] * b``): what a test writes
    for a size; never a bare name, a call, an attribute or a subscript (``b = batch`` and
    ``q.shape[0]`` are not replaced)."""
    return not isinstance(node, ast.Name) and all(isinstance(n, _LITERAL_NODES) for n in ast.walk(node))


class _SetParams(ast.NodeTransformer):
    """``--set NAME=VALUE``: the value of ``NAME = <literal>``, ``{"NAME": <literal>}``,
    ``f(NAME=<literal>)``, a parameter's default ``def f(NAME=<literal>)`` and the list of
    ``for NAME in [<literals>]`` (VALUE then is the list the loop runs over). ``<literal>`` also
    covers arithmetic of literals and names (``[8192] * b``). VALUE is a Python literal or an
    expression of the file's names, inserted as written."""

    def __init__(self, values: dict):
        self.values = values
        self.changes: list[tuple[str, int, object, object]] = []

    def _replace(self, name, node, lineno, any_value=False):
        if not any_value and not _literal_like(node):
            return node
        old = ast.unparse(node)
        try:
            old = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            pass
        new = self.values[name]
        self.changes.append((name, lineno, old, new))
        text = new.text if isinstance(new, _Expr) else repr(new)
        return ast.copy_location(ast.parse(text, mode="eval").body, node)

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id in self.values:
            node.value = self._replace(node.targets[0].id, node.value, node.lineno)
        return node

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        if isinstance(node.target, ast.Name) and node.target.id in self.values and node.value is not None:
            node.value = self._replace(node.target.id, node.value, node.lineno)
        return node

    def visit_For(self, node):
        self.generic_visit(node)
        if (isinstance(node.target, ast.Name) and node.target.id in self.values
                and isinstance(node.iter, (ast.List, ast.Tuple))):
            node.iter = self._replace(node.target.id, node.iter, node.lineno)
        return node

    def visit_Dict(self, node):
        self.generic_visit(node)
        for i, key in enumerate(node.keys):
            if isinstance(key, ast.Constant) and key.value in self.values:
                # a test-case table ({"case_name": (sizes...)}) may build its sizes with a comprehension
                node.values[i] = self._replace(key.value, node.values[i], key.lineno, any_value=True)
        return node

    def visit_keyword(self, node):
        self.generic_visit(node)
        if node.arg in self.values:
            node.value = self._replace(node.arg, node.value, node.value.lineno)
        return node

    def _defaults(self, node):
        args = node.args
        positional = args.posonlyargs + args.args
        for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            if a.arg in self.values:
                i = args.defaults.index(d)
                args.defaults[i] = self._replace(a.arg, d, d.lineno)
        for a, d in zip(args.kwonlyargs, args.kw_defaults):
            if d is not None and a.arg in self.values:
                i = args.kw_defaults.index(d)
                args.kw_defaults[i] = self._replace(a.arg, d, d.lineno)

    def visit_FunctionDef(self, node):
        self._defaults(node)
        self.generic_visit(node)
        return node


class _Expr:
    """A ``--set`` value that is an expression of the file's names (``[256] * b``), not a literal."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def parse_set_value(literal: str):
    """The value of ``--set NAME=VALUE``: a Python literal, else an expression (checked to parse),
    else a bare word as a string."""
    try:
        return ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        pass
    try:
        ast.parse(literal, mode="eval")
    except SyntaxError:
        return literal
    return _Expr(literal) if not literal.isidentifier() else literal


def rewrite(source: str, filename: str, golden: bool = True, params: dict | None = None):
    """(code object, rewriter) for the example's source: imports rewritten, comparisons enabled,
    the ``--set`` parameters replaced (``rw.changes``)."""
    tree = ast.parse(source, filename)
    rw = _Rewrite(golden)
    tree = rw.visit(tree)
    rw.changes = []
    if params:
        setter = _SetParams(params)
        tree = setter.visit(tree)
        rw.changes = setter.changes
    tree = ast.fix_missing_locations(tree)
    # dont_inherit: this file's `from __future__ import annotations` must not turn the
    # example's pypto.Tensor annotations into strings
    return compile(tree, filename, "exec", dont_inherit=True), rw


# ---------------------------------------------------------------------------- comparison records

@dataclass
class Comparison:
    line: int
    api: str
    passed: bool
    max_abs_diff: float
    rtol: float | None
    atol: float | None
    note: str = ""


def _max_diff(a, b) -> float:
    import numpy as np
    import torch

    try:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            ta = torch.as_tensor(a).detach().cpu().double()
            tb = torch.as_tensor(b).detach().cpu().double()
            return float((ta - tb).abs().max()) if ta.numel() else 0.0
        d = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
        return float(d.max()) if d.size else 0.0
    except Exception:  # shapes that do not broadcast: the comparison itself will say so
        return float("nan")


class Recorder:
    """Wraps the comparison helpers; records the calls made from the example file."""

    def __init__(self, filename: str, stop: bool = False):
        self.filename = os.path.abspath(filename)
        self.records: list[Comparison] = []
        self._saved = []
        self.stop = stop          # --cost-only: the first comparison ends the run (values were not computed)
        self.stopped_at: int | None = None
        self.depth = 0            # inside a recorded helper: the comparisons it makes itself are its own
        self._finder = None

    def _caller_line(self) -> int | None:
        f = sys._getframe(2)
        while f is not None:
            if os.path.abspath(f.f_code.co_filename) == self.filename:
                return f.f_lineno
            f = f.f_back
        return None

    def _wrap(self, owner, attr, raises: bool):
        original = getattr(owner, attr)
        recorder = self

        def wrapped(actual, desired, *args, **kwargs):
            line = recorder._caller_line()
            if line is None or recorder.depth:
                return original(actual, desired, *args, **kwargs)
            if recorder.stop:
                recorder.stopped_at = line
                raise CostOnlyStop(f"cost-only run: stopped at the first comparison (line {line})")
            rtol = kwargs.get("rtol", args[0] if args else None)
            atol = kwargs.get("atol", args[1] if len(args) > 1 else None)
            diff = _max_diff(actual, desired)
            api = f"{getattr(owner, '__name__', owner)}.{attr}"
            if raises:
                try:
                    res = original(actual, desired, *args, **kwargs)
                except AssertionError as exc:
                    recorder.records.append(Comparison(line, api, False, diff, rtol, atol,
                                                       str(exc).strip().splitlines()[0][:120]))
                    raise
                recorder.records.append(Comparison(line, api, True, diff, rtol, atol))
                return res
            res = original(actual, desired, *args, **kwargs)
            ok = bool(res) if not hasattr(res, "all") else bool(res.all())
            recorder.records.append(Comparison(line, api, ok, diff, rtol, atol,
                                               "" if ok else "result was not checked by the script"))
            return res

        wrapped.__wrapped__ = original
        setattr(owner, attr, wrapped)
        self._saved.append((owner, attr, original))

    def wrap_helper(self, module, name: str):
        """A comparison helper of the model's own folder (``utils/compare.py``'s ``compare``,
        ``np_compare``'s ``detailed_allclose_manual``): a call from the example file is one
        comparison, passed unless it raises AssertionError (or returns False); its first two
        arguments are the tensors compared, its ``atol`` / ``rtol`` the tolerance."""
        import inspect

        original = getattr(module, name)
        if getattr(original, "__pto_recorded__", False):
            return
        recorder = self
        try:
            sig = inspect.signature(original)
        except (TypeError, ValueError):
            sig = None

        def helper(*args, **kwargs):
            line = recorder._caller_line()
            compared = list(args[:2])
            if len(compared) < 2:   # compare(actual=..., expected=...): the first tensors passed by keyword
                compared += [v for v in kwargs.values() if hasattr(v, "shape")][:2 - len(compared)]
            if line is None or recorder.depth or len(compared) < 2:
                return original(*args, **kwargs)
            if recorder.stop:
                recorder.stopped_at = line
                raise CostOnlyStop(f"cost-only run: stopped at the first comparison (line {line})")
            named = {}
            if sig is not None:
                try:
                    named = sig.bind_partial(*args, **kwargs).arguments
                except TypeError:
                    named = {}
            tol = {k: named.get(k) for k in ("rtol", "atol")}
            for key, v in kwargs.items():   # atol_abs= / atol_rel= and the like
                if tol["rtol"] is None and ("rtol" in key or "rel" in key):
                    tol["rtol"] = v
                elif tol["atol"] is None and ("atol" in key or "abs" in key):
                    tol["atol"] = v
            diff = _max_diff(compared[0], compared[1])
            api = f"{module.__name__}.{name}"
            recorder.depth += 1
            try:
                res = original(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a helper may fail its check with any exception
                note = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
                recorder.records.append(Comparison(line, api, False, diff, tol["rtol"], tol["atol"], note))
                raise
            finally:
                recorder.depth -= 1
            ok = res is not False
            recorder.records.append(Comparison(line, api, ok, diff, tol["rtol"], tol["atol"],
                                               "" if ok else "returned False"))
            return res

        helper.__wrapped__ = original
        helper.__pto_recorded__ = True
        setattr(module, name, helper)
        self._saved.append((module, name, original))

    def wrap_namespace(self, namespace: dict):
        """The example file's own comparison helpers (``def topk_idx_compare(...)`` with an assert
        inside): wrapped like the model folder's, in the namespace the test runs in."""
        import re
        import types

        pattern = re.compile(r"compare|allclose")
        holder = types.SimpleNamespace(__name__=os.path.splitext(os.path.basename(self.filename))[0])
        for name, obj in list(namespace.items()):
            code = getattr(obj, "__code__", None)
            if (isinstance(obj, types.FunctionType) and pattern.search(name) and code is not None
                    and os.path.abspath(code.co_filename) == self.filename):
                setattr(holder, name, obj)
                self.wrap_helper(holder, name)
                namespace[name] = getattr(holder, name)

    def install_helpers(self, folder: str):
        """Wrap the comparison helpers of every module imported from ``folder`` (the model's own
        ``utils``), whenever it is imported."""
        import importlib.abc
        import re

        recorder = self
        folder = os.path.abspath(folder)
        pattern = re.compile(r"compare|allclose")

        def patch(module):
            f = getattr(module, "__file__", None)
            if not f or not os.path.abspath(f).startswith(folder + os.sep) or os.path.abspath(f) == recorder.filename:
                return
            for name, obj in list(vars(module).items()):
                if (callable(obj) and pattern.search(name) and getattr(obj, "__module__", None) == module.__name__
                        and not isinstance(obj, type)):
                    recorder.wrap_helper(module, name)

        class Finder(importlib.abc.MetaPathFinder):
            def find_spec(self, fullname, path, target=None):
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is None:
                        continue
                    loader = spec.loader
                    if loader is not None and hasattr(loader, "exec_module") and spec.origin and \
                            os.path.abspath(spec.origin).startswith(folder + os.sep):
                        exec_module = loader.exec_module

                        def exec_and_patch(module, _exec=exec_module):
                            _exec(module)
                            patch(module)
                        loader.exec_module = exec_and_patch
                    return spec
                return None

        self._finder = Finder()
        sys.meta_path.insert(0, self._finder)
        for module in list(sys.modules.values()):
            patch(module)

    def assert_hook(self, ok, line, msg=None, value=None):
        if self.stop:
            self.stopped_at = line
            raise CostOnlyStop(f"cost-only run: stopped at the first comparison (line {line})")
        try:
            diff = float(value) if value is not None else float("nan")
        except (TypeError, ValueError):
            diff = float("nan")
        self.records.append(Comparison(line, "assert", bool(ok), diff, None, None,
                                       "" if ok else str(msg or "assertion failed")))
        if not ok:
            raise AssertionError(msg or f"assertion at line {line} failed")

    def install(self):
        import numpy as np
        import numpy.testing
        import torch
        import torch.testing

        self._wrap(torch.testing, "assert_close", raises=True)
        self._wrap(numpy.testing, "assert_allclose", raises=True)
        self._wrap(torch, "allclose", raises=False)
        self._wrap(np, "allclose", raises=False)

    def uninstall(self):
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()


# ---------------------------------------------------------------------------- kernel launches

class CostOnlyStop(Exception):
    """Raised at the first comparison of a ``--cost-only`` run: the values are not computed."""


class Launches:
    """Records every top-level call of a pto kernel: its simulated run and its wall time."""

    def __init__(self):
        self.records: list[dict] = []
        self._saved = None

    def install(self):
        from pypto_lab.pto.jit import JitKernel

        original = JitKernel.__call__
        records, depth = self.records, [0]

        def recorded(kernel, *args, **kwargs):
            if depth[0]:
                return original(kernel, *args, **kwargs)
            depth[0] += 1
            traces = kernel.trace_count
            t0 = time.perf_counter()
            try:
                return original(kernel, *args, **kwargs)
            finally:
                depth[0] -= 1
                wall = time.perf_counter() - t0
                run = kernel.last_run
                if run is not None and kernel.trace_count >= traces:
                    comp = kernel.last_compiled
                    records.append({
                        "kernel": kernel.__name__, "chip": run.chip, "cycles": run.cycles, "time_us": run.time_us,
                        "gm_bytes": run.gm_bytes, "flops": run.flops, "roofline_us": run.roofline_us,
                        "bound": run.bound, "fraction_of_peak": run.fraction_of_peak, "cores": run.cores_used,
                        "values_computed": run.values_computed, "wall_s": wall,
                        "compiled": kernel.trace_count > traces,
                        "compile_s": comp.compile_seconds if comp is not None and kernel.trace_count > traces else 0.0,
                        "loops": [{"loop": lp["loop"], "iterations": lp["iterations"]} for lp in run.loops]})

        self._saved = (JitKernel, original)
        JitKernel.__call__ = recorded
        return self

    def uninstall(self):
        if self._saved is not None:
            cls, original = self._saved
            cls.__call__ = original
            self._saved = None

    def summary(self) -> list[dict]:
        """Per kernel: launches, simulated and roofline µs summed over them, wall time."""
        out: dict[str, dict] = {}
        for r in self.records:
            k = out.setdefault(r["kernel"], {"kernel": r["kernel"], "launches": 0, "time_us": 0.0,
                                             "roofline_us": 0.0, "gm_bytes": 0.0, "wall_s": 0.0})
            k["launches"] += 1
            for f in ("time_us", "roofline_us", "gm_bytes", "wall_s"):
                k[f] += r[f]
        return list(out.values())


# ---------------------------------------------------------------------------- running

def _explain(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] in ("torch_npu", "acl"):
        return (f"needs {exc.name}: this example runs on a real NPU only"
                + (" (try --npu-on-cpu)" if exc.name.split(".")[0] == "torch_npu" else ""))
    if isinstance(exc, AttributeError) and "npu_on_cpu" in str(exc):
        return f"uses NPU-only API the CPU stand-in does not cover: {exc}"
    if isinstance(exc, AttributeError) and "pypto_lab.pto" in str(exc):
        return f"pypto_lab.pto lacks a name the example uses: {exc}"
    if isinstance(exc, AttributeError) and "'torch' has no attribute 'npu'" in str(exc):
        return "calls torch.npu (needs torch_npu and an NPU) outside the run_mode == 'npu' branches"
    if isinstance(exc, NotImplementedError):
        return f"pypto_lab.pto does not implement it: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _load_npu_on_cpu():
    """scripts/npu_on_cpu.py, loaded from beside this file (sys.path is left as it is)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "npu_on_cpu", os.path.join(os.path.dirname(os.path.abspath(__file__)), "npu_on_cpu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _call_expr(call: str) -> str:
    return f"{call}()" if call.isidentifier() else call


def _report_dict(path, call, argv, rw, recorder, launches, error, stand_in_mod, wall, cost_only) -> dict:
    casts = list(getattr(stand_in_mod, "FORMAT_CASTS", []) or [])
    return {
        "file": path, "call": call, "argv": argv, "cost_only": cost_only, "wall_s": wall,
        "sets": [{"name": n, "line": ln, "old": repr(o), "new": repr(v)} for n, ln, o, v in rw.changes],
        "comparisons": [r.__dict__ for r in recorder.records],
        "stopped_at": recorder.stopped_at,
        "launches": launches.records, "kernels": launches.summary(), "format_casts": casts,
        "error": None if error is None else (_explain(error) if isinstance(error, BaseException) else str(error)),
    }


def run(path: str, args: list[str], golden: bool = True, add_run_mode: bool = True,
        npu_on_cpu: bool = False, call: str | None = None, params: dict | None = None,
        report: str | None = None, cost_only: bool = False) -> int:
    t_start = time.perf_counter()
    path = os.path.abspath(path)
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    code, rw = rewrite(source, path, golden, params)
    if rw.imports == 0:
        print(f"[run_pypto_example] note: {path} does not import pypto")
    for name, line, old, new in rw.changes:
        print(f"[run_pypto_example] --set {name}: line {line}: {old!r} -> {new!r}")
    unmatched = sorted(set(params or {}) - {c[0] for c in rw.changes})
    if unmatched:
        print(f"[run_pypto_example] --set {', '.join(unmatched)}: no literal assignment, dict entry, keyword, "
              "default or for-loop list of that name in the file")
        return 2
    if call is not None:
        call_code = compile(_call_expr(call), f"<--call {call}>", "eval")
    argv = list(args)
    if add_run_mode and "--run_mode" in source and not any(a.startswith(("--run_mode", "--run-mode", "-m"))
                                                          for a in argv):
        argv += ["--run_mode", "sim"]
    if golden and rw.enabled:
        print(f"[run_pypto_example] golden comparison turned on in the blocks at lines {rw.enabled}")

    import pypto_lab.pto as pto  # (fails early and clearly if the package is missing)
    from pypto_lab.pto import config as pto_config

    # the modules the example imports from its own folder (a model's *_impl.py) import pypto too: the
    # same swap for them, by name, so `import pypto` anywhere in the program is pypto_lab.pto
    sys.modules.setdefault("pypto", pto)
    for sub in [m for m in list(sys.modules) if m.startswith(TARGET + ".")]:
        sys.modules.setdefault("pypto" + sub[len(TARGET):], sys.modules[sub])

    recorder = Recorder(path, stop=cost_only)
    launches = Launches().install()
    stand_in = stand_in_mod = None
    if npu_on_cpu:
        stand_in_mod = _load_npu_on_cpu()
        stand_in = stand_in_mod.NpuOnCpu().install()
        print("[run_pypto_example] --npu-on-cpu: torch_npu, torch.npu, device='npu:N' and NPU graphs stand in "
              "on the CPU (scripts/npu_on_cpu.py)")
    if golden or cost_only:
        recorder.install()
        recorder.install_helpers(os.path.dirname(path))
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    error = None
    namespace = {"__name__": "__main__" if call is None else "__pto_model__", "__file__": path,
                 "__builtins__": __builtins__, HOOK: recorder.assert_hook}
    scope = pto_config.cost_only(cost_only)
    scope.__enter__()
    try:
        exec(code, namespace)
        if call is not None:
            if golden or cost_only:
                recorder.wrap_namespace(namespace)
            print(f"[run_pypto_example] --call {_call_expr(call)}")
            eval(call_code, namespace)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            error = exc
    except CostOnlyStop as exc:
        print(f"[run_pypto_example] {exc}")
    except BaseException as exc:  # noqa: BLE001 - report whatever the example raised
        traceback.print_exc()
        error = exc
    finally:
        scope.__exit__(None, None, None)
        recorder.uninstall()
        launches.uninstall()
        if stand_in is not None:
            stand_in.uninstall()
        sys.argv, sys.path[:] = saved_argv, saved_path

    failed = [r for r in recorder.records if not r.passed]
    print(f"\n[run_pypto_example] {os.path.basename(path)} {' '.join(argv)}"
          + (f" --call {call}" if call is not None else ""))
    if golden and not cost_only:
        n = len(recorder.records)
        print(f"[run_pypto_example] {n} comparison{'s' if n != 1 else ''} with torch: "
              f"{n - len(failed)} passed, {len(failed)} FAILED" if failed else
              f"[run_pypto_example] {n} comparison{'s' if n != 1 else ''} with torch: {n} passed")
        for r in recorder.records:
            tol = (f"rtol={r.rtol} atol={r.atol}" if r.rtol is not None or r.atol is not None
                   else "the example's own bound" if r.api == "assert" else "default tol")
            print(f"    line {r.line:5d}  {r.api:32s} max|diff|={r.max_abs_diff:.3g}  {tol}  "
                  f"{'ok' if r.passed else 'FAILED ' + r.note}")
        if not recorder.records and error is None:
            print("[run_pypto_example] warning: the example made no golden comparison")
    kinds = launches.summary()
    if kinds:
        what = "costed only (values not computed)" if cost_only else "simulated"
        print(f"[run_pypto_example] {len(launches.records)} pto kernel launch(es), {what}:")
        for k in kinds:
            print(f"    {k['kernel']:40s} x{k['launches']:<3d} {k['time_us']:12.2f} us  roofline {k['roofline_us']:10.2f} us"
                  f"  GM {k['gm_bytes'] / 1e6:10.3f} MB  wall {k['wall_s']:7.2f} s")
    for c in getattr(stand_in_mod, "FORMAT_CASTS", []) or []:
        if c.get("time_us") is not None:
            print(f"    torch_npu.npu_format_cast -> FRACTAL_NZ {c['shape']} {c['dtype']}: TransData "
                  f"{c['time_us']:.2f} us on {c['chip']}")
    code_out = 1 if error is not None or failed else 0
    if cost_only and error is None and not launches.records:
        print("[run_pypto_example] FAILED: --cost-only, but no pto kernel was launched before the first comparison")
        code_out = 1
    if error is not None:
        print(f"[run_pypto_example] FAILED: {_explain(error) if isinstance(error, BaseException) else error}")
    if report:
        from pypto_lab.files.atomic import write_text_atomic

        data = _report_dict(path, call, argv, rw, recorder, launches, error, stand_in_mod,
                            time.perf_counter() - t_start, cost_only)
        data["exit"] = code_out
        data["cpu_s"] = round(time.process_time(), 2)   # this process's CPU time (all its threads)
        write_text_atomic(report, json.dumps(data, indent=1, default=str))
    return code_out


FLAGS = ("--no-golden", "--keep-run-mode", "--npu-on-cpu", "--cost-only", "--help")
VALUED = ("--call", "--set", "--report")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    golden, add_run_mode, npu_on_cpu, call, params, report, cost_only = True, True, False, None, {}, None, False
    while argv and (argv[0] in FLAGS or argv[0].split("=", 1)[0] in VALUED):
        flag = argv.pop(0)
        if flag == "--help":
            print(__doc__)
            return 0
        if flag.split("=", 1)[0] in VALUED:
            name, _, value = flag.partition("=")
            if not value:
                if not argv:
                    print(f"{name} needs a value")
                    return 2
                value = argv.pop(0)
            if name == "--call":
                call = value
                continue
            if name == "--report":
                report = value
                continue
            key, eq, literal = value.partition("=")
            if not eq or not key.isidentifier():
                print(f"--set expects NAME=VALUE, got {value!r}")
                return 2
            params[key] = parse_set_value(literal)
            continue
        golden = golden and flag != "--no-golden"
        add_run_mode = add_run_mode and flag != "--keep-run-mode"
        npu_on_cpu = npu_on_cpu or flag == "--npu-on-cpu"
        cost_only = cost_only or flag == "--cost-only"
    if not argv:
        print(__doc__)
        return 2
    return run(argv[0], argv[1:], golden=golden, add_run_mode=add_run_mode, npu_on_cpu=npu_on_cpu,
               call=call, params=params, report=report, cost_only=cost_only)


if __name__ == "__main__":
    sys.exit(main())
