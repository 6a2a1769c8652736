"""The OM artefact: an optimised model written to one file and loaded back without torch.export.

``save_om(optimized, path)`` writes a zip (format "pypto_lab-om", `FORMAT_VERSION`; the layout is
documented in docs/om_format.md):

* ``manifest.json``: the format's name and version, the pypto_lab version and the tool that wrote
  it, the model's name, the chip (its name and every constant, so a loaded model is costed on the
  chip it was compiled for even if the shipped preset changes), level and precision, the inputs
  and outputs (names, shapes, dtypes) and the SHA-256 of every other member;
* ``graph.json``: the optimised `Graph` (every node with its ATen op, inputs, arguments, output
  shapes and dtypes, device format, kernel spec, fused group) and ``program``: the ATen program the
  runtime interprets (`pypto_lab.runtime`), node by node, with its calling convention;
* ``kernels.json``: every kernel with its spec, tiling and cost (the simulator's reports);
* ``schedule.json``: when each kernel runs; ``memory.json``: the memory plan;
* ``report.json``: the rest of the report (pass waterfall, CPU fallbacks, notes, level, batch);
* ``weights.safetensors``: parameters, buffers and constants (safetensors: raw tensors, no code).

Nothing is pickled; `load_om` never calls ``torch.load`` or ``torch.export``. It rebuilds the
program as a `torch.fx` graph and runs it with the same `Runtime` (the same per-node NPU numerics)
that ``optimized(x)`` uses, and rebuilds the `Report` from the JSON (the same figures).
"""

from __future__ import annotations

import hashlib
import io
import json
import operator
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch.utils import _pytree as pytree

from ..analysis.report import Report
from ..capture.graph import Graph
from ..files.atomic import write_bytes_atomic
from ..hw.chip import Chip
from .codec import CodecError, decode, encode

FORMAT = "pypto_lab-om"
FORMAT_VERSION = 1
MEMBERS = ("manifest.json", "graph.json", "kernels.json", "schedule.json", "memory.json", "report.json",
           "weights.safetensors")
_RERUN = "re-run pypto-lab atc (or pypto_lab.deploy.save_om) to write it again"


class OMError(ValueError):
    """An OM file that cannot be written or loaded; the message says why and what to do."""


@dataclass(frozen=True)
class NodeRef:
    """An argument of a program node that is another node's value (by name)."""

    name: str


# ---- writing -------------------------------------------------------------------------------------

def _meta(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        for d in val.shape:
            if not isinstance(d, int):
                raise OMError(f"a value of the program has a symbolic shape {tuple(val.shape)}: an OM holds a "
                              "static-shape model; optimise it on fixed example inputs")
        return {"shape": list(val.shape), "dtype": str(val.dtype).removeprefix("torch.")}
    if isinstance(val, (tuple, list)):
        return [_meta(v) for v in val]
    if val is None or isinstance(val, (bool, int, float)):
        return {"value": val}
    raise OMError(f"a value of the program is a {type(val).__name__}: an OM holds tensor programs only")


def _target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if getattr(target, "__module__", None) in ("_operator", "operator") and getattr(operator, target.__name__,
                                                                                    None) is target:
        return f"operator.{target.__name__}"
    raise OMError(f"the program calls {target!r}, which an OM cannot name (ATen and registered operators only); "
                  "remove it from the model")


def _program(ep: Any) -> dict[str, Any]:
    """The exported program's graph, signature and calling convention as JSON data."""
    nodes = []
    for n in ep.graph.nodes:
        row: dict[str, Any] = {"name": n.name, "op": n.op}
        if n.op == "call_function":
            row["target"] = _target_name(n.target)
        elif n.op not in ("placeholder", "output"):
            raise OMError(f"the program has a {n.op} node ({n.name}): an OM holds flat ATen programs only")
        if n.op != "placeholder":
            ref = torch.fx.node.map_arg(n.args, lambda a: NodeRef(a.name))
            row["args"] = encode(ref)
            row["kwargs"] = encode(torch.fx.node.map_arg(n.kwargs, lambda a: NodeRef(a.name)))
        if "val" in n.meta and n.op != "output":
            row["meta"] = _meta(n.meta["val"])
        nodes.append(row)
    sig = ep.graph_signature
    inputs = []
    for s in sig.input_specs:
        if s.kind.name not in ("USER_INPUT", "PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            raise OMError(f"the program has an input of kind {s.kind.name}: not supported in an OM")
        arg = {"name": s.arg.name} if hasattr(s.arg, "name") else {}
        if hasattr(s.arg, "value"):
            arg["value"] = encode(s.arg.value)
        inputs.append({"kind": s.kind.name, "arg": arg, "target": s.target})
    outputs = [{"kind": s.kind.name} for s in sig.output_specs]
    return {"nodes": nodes, "input_specs": inputs, "output_specs": outputs,
            "in_spec": pytree.treespec_dumps(ep.call_spec.in_spec),
            "out_spec": pytree.treespec_dumps(ep.call_spec.out_spec)}


def _tensor_specs(program: dict, kind: str, names: list[str] | None) -> list[dict[str, Any]]:
    by_name = {n["name"]: n for n in program["nodes"]}
    if kind == "inputs":
        metas = [(s["arg"].get("name", ""), by_name.get(s["arg"].get("name", ""), {}).get("meta"))
                 for s in program["input_specs"] if s["kind"] == "USER_INPUT"]
    else:
        out = next(n for n in program["nodes"] if n["op"] == "output")
        refs = decode(out["args"])[0]
        refs = refs if isinstance(refs, (list, tuple)) else [refs]
        metas = [(r.name, by_name[r.name].get("meta")) if isinstance(r, NodeRef) and r.name in by_name
                 else (str(r), None) for r, s in zip(refs, program["output_specs"], strict=False)
                 if s["kind"] == "USER_OUTPUT"]
    rows = []
    for i, (name, meta) in enumerate(metas):
        row = {"name": names[i] if names and i < len(names) else name}
        if isinstance(meta, dict) and "shape" in meta:
            row.update(shape=meta["shape"], dtype=meta["dtype"])
        rows.append(row)
    return rows


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=False, allow_nan=False) + "\n").encode("utf-8")


def save_om(optimized: Any, path: str | Path, *, model_name: str | None = None, input_names: list[str] | None = None,
            output_names: list[str] | None = None, created_by: str = "pypto_lab.deploy.save_om",
            source: dict[str, Any] | None = None) -> Path:
    """Write ``optimized`` (a `pypto_lab.optimize` result) to ``path`` as an OM zip, whole or not at
    all. ``input_names`` / ``output_names`` name the model's inputs and outputs (e.g. the ONNX
    graph's); ``source`` is stored in the manifest as given (e.g. the ATC command line)."""
    version = getattr(sys.modules.get("pypto_lab"), "__version__", "unknown")  # (the package imports this module)
    report = optimized.report()
    graph = optimized.graph
    ep = getattr(graph, "exported_program", None)
    if ep is None:
        raise OMError("this optimised model carries no program to run; optimise it with example inputs")
    chip = report.chip
    program = _program(ep)
    state = optimized.runtime._state()  # the live weights, in the program's input order (None: a user input)
    weights = {}
    for s, val in zip(ep.graph_signature.input_specs, state, strict=True):
        if val is not None:
            weights[s.arg.name] = val.detach().to("cpu").contiguous().clone()
    stored = graph.copy()
    stored.exported_program = None
    try:
        members = {
            "graph.json": _json({"graph": encode(stored, chip), "program": program}),
            "kernels.json": _json({"kernels": encode(report.kernels, chip)}),
            "schedule.json": _json({"schedule": encode(report.schedule, chip)}),
            "memory.json": _json({"memory": encode(report.memory, chip)}),
            "report.json": _json({"model": report.model, "level": report.level, "precision": report.precision,
                                  "batch": report.batch, "fallback_ops": list(report.fallback_ops),
                                  "notes": list(report.notes), "passes": encode(report.passes, chip)}),
            "weights.safetensors": st_save(weights, metadata={"format": FORMAT}),
        }
    except CodecError as exc:
        raise OMError(f"cannot write the OM: {exc}") from exc
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "pypto_lab_version": version,
        "created_by": created_by, "model": model_name or report.model,
        "chip": {"name": chip.name, "constants": encode(chip)},
        "level": report.level, "precision": report.precision, "cube_precision": optimized.cube_precision,
        "inputs": _tensor_specs(program, "inputs", input_names),
        "outputs": _tensor_specs(program, "outputs", output_names),
        "kernels": len(report.kernels), "latency_us": report.latency_us,
        "source": source or {},
        "members": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                    for name, data in members.items()},
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", _json(manifest))  # first, so a reader finds it at once
        for name, data in members.items():  # weights stored as they are (floats do not deflate)
            z.writestr(name, data, compress_type=zipfile.ZIP_STORED if name.endswith(".safetensors")
                       else zipfile.ZIP_DEFLATED)
    return write_bytes_atomic(path, buf.getvalue())


# ---- loading -------------------------------------------------------------------------------------

_OPERATORS = ("getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pow")


def _resolve_target(name: str) -> Any:
    if name.startswith("operator."):
        fn = name.removeprefix("operator.")
        if fn not in _OPERATORS:
            raise OMError(f"the program calls {name}: not one of the Python operators an OM may call "
                          f"({', '.join(_OPERATORS)})")
        return getattr(operator, fn)
    parts = name.split(".")
    if len(parts) != 3:
        raise OMError(f"the program calls {name!r}, which is not an operator name (namespace.op.overload)")
    ns, op, overload = parts
    if ns == "pypto_onnx" and overload == "default":  # an ONNX operator run as a CPU fallback
        from .onnx_import import fallback_op

        return fallback_op(op)
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError) as exc:
        raise OMError(f"the program calls the operator {name}, which is not registered in this process (a custom "
                      "operator: import the module that defines it before load_om)") from exc


def _spec(kind: str, **attrs: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(kind=types.SimpleNamespace(name=kind), **attrs)


class StoredProgram:
    """What `pypto_lab.runtime.Runtime` reads of a `torch.export.ExportedProgram`, rebuilt from
    ``graph.json``'s program and the weights (no torch.export involved)."""

    def __init__(self, data: dict[str, Any], weights: dict[str, torch.Tensor]):
        g = torch.fx.Graph()
        env: dict[str, torch.fx.Node] = {}

        def arg(v: Any) -> Any:
            if isinstance(v, NodeRef):
                return env[v.name]
            if isinstance(v, (list, tuple)):
                return type(v)(arg(x) for x in v)
            if isinstance(v, dict):
                return {k: arg(x) for k, x in v.items()}
            return v

        for row in data["nodes"]:
            op = row["op"]
            if op == "placeholder":
                node = g.placeholder(row["name"])
            elif op == "call_function":
                node = g.call_function(_resolve_target(row["target"]), arg(decode(row["args"])),
                                       arg(decode(row["kwargs"])))
            elif op == "output":
                node = g.output(arg(decode(row["args"]))[0])
            else:
                raise OMError(f"program node {row.get('name')} has op {op!r}: not a flat ATen program")
            if op != "output":
                node.name = row["name"]
                if node.name != row["name"]:
                    raise OMError(f"program node name {row['name']!r} could not be kept (found {node.name!r})")
            if "meta" in row:
                node.meta["val"] = _fake(row["meta"])
            env[row.get("name", "output")] = node
        self.graph = g
        self.graph_module = torch.fx.GraphModule(torch.nn.Module(), g)
        inputs = []
        self.state_dict: dict[str, torch.Tensor] = {}
        self.constants: dict[str, torch.Tensor] = {}
        for s in data["input_specs"]:
            a = s["arg"]
            arg_ns = types.SimpleNamespace(**{k: decode(v) if k == "value" else v for k, v in a.items()})
            inputs.append(_spec(s["kind"], arg=arg_ns, target=s["target"]))
            if s["kind"] != "USER_INPUT":
                if a["name"] not in weights:
                    raise OMError(f"weights.safetensors has no tensor {a['name']!r} ({s['target']}): the file is "
                                  f"damaged; {_RERUN}")
                (self.constants if s["kind"] == "CONSTANT_TENSOR" else self.state_dict)[s["target"]] = weights[a["name"]]
        self.graph_signature = types.SimpleNamespace(
            input_specs=inputs, output_specs=[_spec(s["kind"]) for s in data["output_specs"]])
        self.call_spec = types.SimpleNamespace(in_spec=pytree.treespec_loads(data["in_spec"]),
                                               out_spec=pytree.treespec_loads(data["out_spec"]))


def _fake(meta: Any) -> Any:
    """The shape and dtype of a program value, as a meta tensor (what the runtime checks against)."""
    if isinstance(meta, list):
        return [_fake(m) for m in meta]
    if "shape" in meta:
        return torch.empty(meta["shape"], dtype=getattr(torch, meta["dtype"]), device="meta")
    return meta.get("value")


class OMModel:
    """A model loaded from an OM file: ``om(*inputs)`` runs it with the NPU's numerics (the same
    per-node numerics as ``pypto_lab.optimize(...)(*inputs)``); ``om.report()`` is the compiled
    model's report; ``om.manifest`` what the manifest says; ``om.inputs`` / ``om.outputs`` the
    tensors it takes and returns."""

    def __init__(self, path: Path, manifest: dict[str, Any], chip: Chip, graph: Graph, report: Report,
                 cube_precision: str):
        self.path = path
        self.manifest = manifest
        self.chip = chip
        self.graph = graph
        self._report = report
        self.cube_precision = cube_precision
        self._runtime = None

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return list(self.manifest["inputs"])

    @property
    def outputs(self) -> list[dict[str, Any]]:
        return list(self.manifest["outputs"])

    def report(self) -> Report:
        return self._report

    @property
    def runtime(self):
        from ..runtime.interpreter import Runtime

        if self._runtime is None:
            self._runtime = Runtime(torch.nn.Module(), self.graph, self.chip, self.cube_precision)
        return self._runtime

    def __call__(self, *inputs: Any) -> Any:
        from ..runtime.interpreter import RuntimeInputError

        try:
            return self.runtime.run(tuple(inputs), {})
        except RuntimeInputError as exc:
            raise RuntimeInputError(self._recompile_hint(str(exc), inputs)) from None

    def _recompile_hint(self, message: str, inputs: tuple) -> str:
        """The runtime's message with an OM's fix: an OM is compiled for its input shapes (ATC's
        --input_shape), so the fix is another atc run, not `optimize`."""
        head = message.split("; the optimised graph is specialised", 1)[0].split("; call pypto_lab.optimize", 1)[0]
        names = [i["name"] for i in self.inputs]
        shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs]
        if len(shapes) == len(names) and all(shapes):
            flag = ";".join(f"{n}:{','.join(map(str, s))}" for n, s in zip(names, shapes))
        else:
            flag = ";".join(f"{i['name']}:{','.join(map(str, i.get('shape', ())))}" for i in self.inputs)
        src = self.manifest.get("source") or {}
        model = src.get("model") or "model.onnx"
        soc = src.get("soc_version") or self.chip.name
        return (f"{head}; {self.path.name} was compiled for the input shapes "
                + ", ".join(f"{i['name']} {tuple(i.get('shape', ()))}" for i in self.inputs)
                + f" (an OM is fixed to its shapes, as ATC's are). Fix: compile one for these shapes: pypto-lab atc "
                f"--model={model} --framework=5 --output={self.path.with_suffix('')} --soc_version={soc} "
                f"--input_shape=\"{flag}\"")

    def __repr__(self) -> str:
        ins = ", ".join(f"{i['name']}{tuple(i.get('shape', ()))}" for i in self.inputs)
        return (f"OMModel({self.manifest['model']!r} on {self.chip.name}, level {self._report.level}, "
                f"{self._report.precision}, inputs {ins}, {len(self._report.kernels)} kernels, "
                f"{self._report.latency_us:,.1f} us)")


def _read_json(z: zipfile.ZipFile, name: str, where: str) -> Any:
    try:
        return json.loads(z.read(name))
    except KeyError as exc:
        raise OMError(f"{where}: has no {name}: the file is truncated or damaged; {_RERUN}") from exc
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise OMError(f"{where}: truncated or damaged zip ({exc}); {_RERUN}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise OMError(f"{where}: {name} is not valid JSON ({exc}): the file is damaged; {_RERUN}") from exc


def _foreign(path: Path) -> str | None:
    """What a file that is not a zip looks like, if recognisable."""
    with open(path, "rb") as fh:
        head = fh.read(64).lstrip()
    if head.startswith((b"{", b"[")):
        return "a JSON file, not an OM zip"
    if head.startswith(b"\x08") or path.suffix == ".onnx":
        return "looks like an ONNX model, not an OM (compile it first: pypto-lab atc --model=... --framework=5 ...)"
    return None


def load_om(path: str | Path) -> OMModel:
    """The model in the OM file ``path`` (written by `save_om` / ``pypto-lab atc``), ready to run."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise OMError(f"{where}: no such file; give the .om file pypto-lab atc wrote (--output=NAME writes NAME.om)")
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        what = _foreign(path)
        if what:
            raise OMError(f"{where}: {what}; load_om reads the OM files pypto-lab atc writes") from exc
        raise OMError(f"{where}: truncated or not a zip file ({exc}): an OM is a zip archive written whole by "
                      f"pypto-lab atc; {_RERUN}") from exc
    with z:
        names = set(z.namelist())
        if "manifest.json" not in names:
            raise OMError(f"{where}: a zip without manifest.json: not a pypto_lab OM file (foreign archive); "
                          "load_om reads the OM files pypto-lab atc writes")
        manifest = _read_json(z, "manifest.json", where)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            fmt = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
            raise OMError(f"{where}: its manifest says format {fmt!r}, not {FORMAT!r}: a foreign file, not a pypto_lab "
                          "OM; load_om reads the OM files pypto-lab atc writes")
        version = manifest.get("format_version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise OMError(f"{where}: format_version {version!r} is not a positive integer: the manifest is damaged; "
                          f"{_RERUN}")
        if version > FORMAT_VERSION:
            raise OMError(f"{where}: written by a newer pypto_lab (format {version} > {FORMAT_VERSION}, pypto_lab "
                          f"{manifest.get('pypto_lab_version', '?')}): upgrade pypto_lab to load it")
        try:
            data = {}
            for name in MEMBERS[1:]:
                if name not in names:
                    raise OMError(f"{where}: has no {name}: the file is truncated or damaged; {_RERUN}")
                data[name] = z.read(name)
        except (zipfile.BadZipFile, EOFError, OSError) as exc:  # a CRC mismatch, a cut-off member
            raise OMError(f"{where}: truncated or damaged zip ({exc}); {_RERUN}") from exc
    for name, info in manifest.get("members", {}).items():
        if name in data and hashlib.sha256(data[name]).hexdigest() != info.get("sha256"):
            raise OMError(f"{where}: {name} does not match the checksum in the manifest: the file was altered or "
                          f"damaged; {_RERUN}")
    try:
        chip = decode(manifest["chip"]["constants"])
        if not isinstance(chip, Chip):
            raise CodecError("the manifest's chip is not a Chip")
        graph_data = json.loads(data["graph.json"])
        graph = decode(graph_data["graph"], chip)
        rep = json.loads(data["report.json"])
        report = Report(rep["model"], chip, rep["level"], rep["precision"], rep["batch"],
                        decode(json.loads(data["kernels.json"])["kernels"], chip), decode(rep["passes"], chip),
                        list(rep["fallback_ops"]), decode(json.loads(data["memory.json"])["memory"], chip),
                        list(rep["notes"]), decode(json.loads(data["schedule.json"])["schedule"], chip))
        weights = st_load(data["weights.safetensors"])
        graph.exported_program = StoredProgram(graph_data["program"], weights)
    except (CodecError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, OMError):
            raise
        raise OMError(f"{where}: cannot read it ({type(exc).__name__}: {exc}); {_RERUN}") from exc
    return OMModel(path, manifest, chip, graph, report, manifest.get("cube_precision") or rep["precision"])


__all__ = ["FORMAT", "FORMAT_VERSION", "OMError", "OMModel", "load_om", "save_om"]
