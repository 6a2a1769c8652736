"""``pypto.jit`` / ``pypto.frontend.jit``: the kernel object. The first call with a new input
signature traces the function into a Tensor Graph and compiles it (Tile Graph -> Block Graph ->
Execute Graph); the compiled kernel is cached per signature (argument shapes and dtypes, non-tensor
arguments, tile shapes and options in force, chip). Every call computes the outputs with the NPU's
numerics and leaves the simulated run in ``kernel.last_run``.
"""

from __future__ import annotations

import functools
import inspect
import time
import warnings
from pathlib import Path

import torch

from ..fileio import write_json_atomic
from ..hw.chip import PIPES, Chip, get_chip
from ..hw.simulator import simulate
from . import config, ops
from .blocks import BlockGraph, build_block_graph, n_core_ids
from .dtypes import RunMode, SymbolicDim, bind_dims, from_torch
from .errors import NoNPUError, OptionError, ShapeError, TraceError, UnwrittenOutputWarning
from .execute import run_graph
from .graph import TensorGraph
from .result import RunResult
from .schedule import ExecuteGraph, build_execute_graph
from .tensor import Tensor, Trace, spec_matches
from .tiling import TileGraph, build_tile_graph

DEFAULT_CHIP = "Ascend910B1"


class CompiledKernel:
    """One compiled signature: the four stages and, once run, the simulated timeline."""

    def __init__(self, name: str, chip: Chip, tensor_graph: TensorGraph, tile_graph: TileGraph,
                 block_graph: BlockGraph, execute_graph: ExecuteGraph, compile_seconds: float):
        self.name, self.chip = name, chip
        self.tensor_graph, self.tile_graph = tensor_graph, tile_graph
        self.block_graph, self.execute_graph = block_graph, execute_graph
        self.compile_seconds = compile_seconds
        self._result: RunResult | None = None

    @property
    def stages(self) -> dict:
        return {"tensor_graph": self.tensor_graph, "tile_graph": self.tile_graph,
                "block_graph": self.block_graph, "execute_graph": self.execute_graph}

    def dump_stages(self, directory) -> list[str]:
        d = Path(directory)
        return [str(write_json_atomic(d / f"{k}.json", v.to_json())) for k, v in self.stages.items()]

    def run_result(self) -> RunResult:
        if self._result is None:
            self._result = self._simulate()
        return self._result

    def _simulate(self) -> RunResult:
        chip = self.chip
        tl = simulate(self.execute_graph.program, self.execute_graph.n_cores)
        cycles = tl.total_cycles
        nodes = self.tensor_graph.nodes
        flops = 0.0
        cube_flops_time_peak = 0.0
        traffic = 0.0
        peak = {"UB": 0, "L1": 0, "L0A": 0, "L0B": 0, "L0C": 0}
        groups = []
        for g in self.tile_graph.groups:
            if g.kind == "cube":
                f = 2.0 * g.batch * g.m * g.n * g.kk
                flops += f
                cube_flops_time_peak += f / (chip.peak_tflops(g.in_dtype) * 1e12)
                for b, v in g.plan.buffer_peak().items():
                    peak[b] = max(peak.get(b, 0), int(v))
                if not chip.split_cores:
                    acc = 4
                    peak["UB"] = max(peak["UB"], 2 * g.cube_tile.m_l0 * g.cube_tile.n_l0 * acc)
                eb = nodes[g.nodes[0]].dtype.bytes
                ib = nodes[nodes[g.nodes[0]].inputs[0]].dtype.bytes
                traffic += g.batch * (g.m * g.kk + g.kk * g.n) * ib + g.batch * g.m * g.n * eb
            elif g.kind == "special":  # the bytes its tasks move (a gather reads the rows it indexes)
                from .special import REGISTRY
                node = nodes[g.nodes[0]]
                spec = REGISTRY[node.op]
                f = spec.flops(node, nodes) if spec.flops else float(torch.Size(node.shape).numel())
                flops += f
                if spec.unit == "cube":
                    cube_flops_time_peak += f / (chip.peak_tflops(nodes[node.inputs[0]].dtype.lab) * 1e12)
                traffic += sum(s[1] * s[2] if s[0] in ("load", "store") else s[2] * s[3] for task in g.steps
                               for s in task if s[0] in ("load", "store") or (
                                   s[0] == "path" and (s[1].startswith("GM_TO") or s[1].endswith("TO_GM"))))
            else:
                peak["UB"] = max(peak["UB"], g.ub_bytes * g.slots)
                for nid in g.nodes:
                    n = nodes[nid]
                    if n.op != "assemble":
                        ref = nodes[n.inputs[0]].shape if n.op in ("amax", "amin", "sum") else n.shape
                        flops += float(torch.Size(ref).numel())
                traffic += sum(torch.Size(nodes[t].shape).numel() * nodes[t].dtype.bytes for t in g.loads)
                traffic += sum(torch.Size(nodes[t].shape).numel() * nodes[t].dtype.bytes for t, _, _ in g.stores)
            groups.append({"group": g.id, "kind": g.kind, "ops": g.label(self.tensor_graph),
                           "tasks": g.n_tasks, "cores": len(self.block_graph.assign[g.id])})
        time_us = chip.cycles_to_us(cycles)
        if cube_flops_time_peak > 0:
            frac, bound = (cube_flops_time_peak / (time_us * 1e-6) if time_us else 0.0), "cube"
        else:
            frac, bound = (traffic / (cycles * chip.hbm_bytes_per_cycle()) if cycles else 0.0), "memory"
        busy = tl.busy
        return RunResult(
            name=self.name, chip=chip.name, cycles=cycles, time_us=time_us,
            pipe_busy={p: float(busy[:, i].sum()) for i, p in enumerate(PIPES)},
            pipe_busy_max_core={p: float(busy[:, i].max()) if busy.size else 0.0 for i, p in enumerate(PIPES)},
            buffer_peak=peak, flops=flops, gm_bytes=traffic, fraction_of_peak=frac, bound=bound,
            cores_used=self.block_graph.cores_used(), groups=groups, timeline=tl, _chip=chip)


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


def _is_tensor_annotation(a) -> bool:
    return a is Tensor or isinstance(a, Tensor)


class JitKernel:
    """A kernel decorated with ``@pypto.jit`` or ``@pypto.frontend.jit``."""

    def __init__(self, func, runtime_options=None, pass_options=None, **other_options):
        functools.update_wrapper(self, func)
        self.func = func
        self.runtime_options = runtime_options if runtime_options is not None else {}
        self.pass_options = config.check_pass_options(pass_options)
        self.other_options = other_options
        host = other_options.get("host_options") or {}
        for key in host:
            if key not in config.HOST_OPTIONS:
                raise OptionError(f"host option {key!r} is not known; known: {', '.join(config.HOST_OPTIONS)} "
                                  "(recorded only: in SIM mode every call compiles, simulates and computes)")
        self.signature = inspect.signature(func)
        self._cache: dict = {}
        self.trace_count = 0
        self.last_run: RunResult | None = None
        self.last_compiled: CompiledKernel | None = None

    # ---- options ----
    def _chip(self) -> Chip:
        opts = self.runtime_options
        for key in opts:
            if key not in config.RUNTIME_OPTIONS:
                raise OptionError(f"runtime option {key!r} is not known; known: {', '.join(config.RUNTIME_OPTIONS)}")
        mode = opts.get("run_mode", RunMode.SIM)
        if mode in (RunMode.NPU, "npu", "NPU") or (isinstance(mode, int) and mode == 0):
            raise NoNPUError("run_mode = RunMode.NPU: no NPU here: use RunMode.SIM (runtime_options={'run_mode': "
                             "pypto.RunMode.SIM}); pypto_lab runs kernels on its simulated chip")
        return get_chip(opts.get("chip", DEFAULT_CHIP))

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        chip = self._chip()
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        tensors, others, bindings = [], [], {}
        for name, value in bound.arguments.items():
            ann = self.signature.parameters[name].annotation
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu":
                    raise TraceError(f"argument {name!r} is on {value.device}: pypto_lab runs in SIM mode on the CPU; "
                                     "pass CPU tensors")
                dt = from_torch(value.dtype, f"argument {name!r}")
                if isinstance(ann, Tensor):
                    why = spec_matches(ann, value.shape, dt)
                    if why:
                        raise ShapeError(f"argument {name!r} has {why}. Rule: a kernel argument matches its "
                                         "pypto.Tensor annotation (pypto.DYNAMIC marks a dimension of any size). "
                                         "Fix: pass a matching tensor or change the annotation")
                    if ann.spec_shape:
                        for a, s in zip(ann.spec_shape, value.shape):
                            if isinstance(a, SymbolicDim):
                                if bindings.get(a.name, s) != s:
                                    raise ShapeError(f"dynamic dimension {a.name!r} is {bindings[a.name]} in one "
                                                     f"argument and {s} in {name!r}; they must agree")
                                bindings[a.name] = int(s)
                tensors.append((name, value, dt))
            elif _is_tensor_annotation(ann):
                raise TraceError(f"argument {name!r} is annotated pypto.Tensor but got {type(value).__name__}; "
                                 "pass a torch tensor")
            else:
                others.append((name, value))
        st = config.STATE
        key = (chip.name, tuple((n, tuple(v.shape), dt.name) for n, v, dt in tensors),
               tuple((n, _freeze(v)) for n, v in others), st.vec_tile, st.cube_tile,
               _freeze(st.pass_options), _freeze(self.pass_options), _freeze(bindings))
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._cache[key] = self._compile(chip, bound, tensors, bindings)
        self.last_compiled = compiled
        env = run_graph(compiled.tensor_graph, [v for _, v, _ in tensors])
        self.last_run = compiled.run_result()
        rets = [env[r] for r in compiled.tensor_graph.returns]
        if not rets:
            return None
        return rets[0] if len(rets) == 1 else tuple(rets)

    def _compile(self, chip: Chip, bound, tensors, bindings) -> CompiledKernel:
        t0 = time.perf_counter()
        st = config.STATE
        saved = (st.vec_tile, st.cube_tile, st.cube_tile_raw, dict(st.pass_options), st.trace)
        trace = Trace(self.func.__name__, chip)
        graph = trace.graph
        st.pass_options.update(self.pass_options)
        try:
            st.trace = trace
            with bind_dims(bindings):
                call_args = dict(bound.arguments)
                for name, value, dt in tensors:
                    node = graph.add("param", [], value.shape, dt, {"name": name})
                    graph.params.append(node.id)
                    graph.param_names.append(name)
                    call_args[name] = Tensor._bound(trace, node.id)
                self.trace_count += 1
                ret = self.func(**call_args)
                if ret is not None:
                    for r in (ret if isinstance(ret, (tuple, list)) else (ret,)):
                        if not isinstance(r, Tensor) or not r.is_bound:
                            raise TraceError(f"the kernel returned {r!r}; a kernel returns pypto tensors (or nothing "
                                             "and writes its outputs)")
                        if graph.nodes[r._id].op == "alloc":
                            graph.returns.append(r._id)
                        else:
                            out = ops.tensor(r.shape, r.dtype, "return")
                            ops.assemble(r, [0] * r.ndim, out)
                            graph.returns.append(out._id)
            trace.check_outputs()
            for problem in trace.unwritten_arguments():  # once per compiled signature
                warnings.warn(f"{self.func.__name__}: {problem}", UnwrittenOutputWarning, stacklevel=3)
            double_buffer = bool(st.pass_options.get("double_buffer", True))
        finally:
            st.vec_tile, st.cube_tile, st.cube_tile_raw, st.pass_options, st.trace = saved
        tg = build_tile_graph(graph, chip, double_buffer)
        bg = build_block_graph(tg, chip)
        eg = build_execute_graph(tg, bg, chip, n_core_ids(chip))
        return CompiledKernel(self.func.__name__, chip, graph, tg, bg, eg, time.perf_counter() - t0)

    # ---- inspection ----
    @property
    def stages(self) -> dict:
        if self.last_compiled is None:
            raise TraceError("call the kernel first: its stages exist once it is compiled")
        return self.last_compiled.stages

    def dump_stages(self, directory) -> list[str]:
        """Write tensor_graph.json, tile_graph.json, block_graph.json, execute_graph.json of the last
        compiled signature into ``directory``."""
        if self.last_compiled is None:
            raise TraceError("call the kernel first: its stages exist once it is compiled")
        return self.last_compiled.dump_stages(directory)

    def cache_info(self) -> dict:
        return {"entries": len(self._cache), "traces": self.trace_count}

    def clear_cache(self) -> None:
        self._cache.clear()


def jit(func=None, *, runtime_options=None, pass_options=None, host_options=None, codegen_options=None,
        verify_options=None, debug_options=None):
    """``@pypto.jit`` / ``@pypto.jit(runtime_options={...}, pass_options={...})``."""
    def wrap(f):
        return JitKernel(f, runtime_options, pass_options, host_options=host_options, codegen_options=codegen_options,
                         verify_options=verify_options, debug_options=debug_options)
    return wrap(func) if func is not None else wrap
