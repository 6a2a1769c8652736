"""``pypto.jit`` / ``pypto.frontend.jit``: the kernel object. The first call with a new input
signature traces the function into a Tensor Graph and compiles it (Tile Graph -> Block Graph ->
Execute Graph); the compiled kernel is cached per signature (argument shapes and dtypes, non-tensor
arguments, tile shapes and options in force, chip). Every call computes the outputs with the NPU's
numerics and leaves the simulated run in ``kernel.last_run``.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import inspect
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from ..files.atomic import write_json_atomic
from ..hw.chip import DEFAULT_CHIP, PIPES, Chip, get_chip
from ..hw.simulator import simulate
from . import config, extras, formats, loops, ops, sim_output
from .blocks import BlockGraph, build_block_graph, cube_core_ids, n_core_ids, vector_core_ids
from .dtypes import RunMode, SymbolicDim, bind_dims, from_torch
from .errors import NoNPUError, ShapeError, TraceError, UnwrittenOutputWarning
from .execute import run_graph
from .graph import TensorGraph
from .option_table import check_options
from .result import RunResult
from .schedule import ExecuteGraph, build_execute_graph
from .special import REGISTRY as SPECIAL_OPS
from .tensor import Tensor, Trace, spec_matches
from .tiling import TileGraph, build_tile_graph

COMPILE_SECONDS = [0.0]   # seconds spent compiling kernels in this process (pypto_impl.GetCompilerMonitorTotalElapsed)


def lower(graph: TensorGraph, chip: Chip, double_buffer: bool) -> tuple[TileGraph, BlockGraph, ExecuteGraph]:
    """Stages 2-4 of a flat Tensor Graph (no loop nodes)."""
    tg = build_tile_graph(graph, chip, double_buffer)
    bg = build_block_graph(tg, chip)
    return tg, bg, build_execute_graph(tg, bg, chip, n_core_ids(chip))


def _measure(chip: Chip, graph: TensorGraph, tg: TileGraph, bg: BlockGraph, eg: ExecuteGraph) -> dict:
    """Simulate one Execute Graph: cycles, flops, traffic and pipe busy time (additive quantities,
    so a symbolic loop's cost can be extrapolated from them), buffer peaks, the timeline."""
    tl = simulate(eg.program, eg.n_cores)
    nodes = graph.nodes
    flops = cube_time = traffic = 0.0
    peak = {"UB": 0, "L1": 0, "L0A": 0, "L0B": 0, "L0C": 0}
    groups = []
    for g in tg.groups:
        if g.kind == "cube":
            f = 2.0 * g.batch * g.m * g.n * g.kk
            flops += f
            cube_time += f / (chip.peak_tflops(g.in_dtype) * 1e12)
            for b, v in g.plan.buffer_peak().items():
                peak[b] = max(peak.get(b, 0), int(v))
            if not chip.split_cores:
                acc = 4
                peak["UB"] = max(peak["UB"], 2 * g.cube_tile.m_l0 * g.cube_tile.n_l0 * acc)
            eb = nodes[g.nodes[0]].dtype.bytes
            ib = nodes[nodes[g.nodes[0]].inputs[0]].dtype.bytes
            traffic += g.batch * (g.m * g.kk + g.kk * g.n) * ib + g.batch * g.m * g.n * eb
        elif g.kind == "special":  # the bytes its tasks move (a gather reads the rows it indexes)
            node = nodes[g.nodes[0]]
            spec = SPECIAL_OPS[node.op]
            f = spec.flops(node, nodes) if spec.flops else float(torch.Size(node.shape).numel())
            flops += f
            if spec.unit == "cube":
                cube_time += f / (chip.peak_tflops(nodes[node.inputs[0]].dtype.lab) * 1e12)
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
            traffic += sum(2 * torch.Size(nodes[t].shape).numel() * nodes[t].dtype.bytes for t in g.spill)
            traffic += sum(torch.Size(nodes[t].shape).numel() * nodes[t].dtype.bytes for t, _, _ in g.stores)
        groups.append({"group": g.id, "kind": g.kind, "ops": g.label(graph),
                       "tasks": g.n_tasks, "cores": len(bg.assign[g.id])})
    busy = tl.busy
    return {"cycles": float(tl.total_cycles), "flops": flops, "cube_time": cube_time, "traffic": traffic,
            "busy": np.array([float(busy[:, i].sum()) for i in range(len(PIPES))]),
            "busy_max": np.array([float(busy[:, i].max()) if busy.size else 0.0 for i in range(len(PIPES))]),
            "peak": peak, "groups": groups, "timeline": tl}


_ADDITIVE = ("cycles", "flops", "cube_time", "traffic", "busy", "busy_max")


class CompiledKernel:
    """One compiled signature: the four stages and, once run, the simulated timeline.

    With symbolic loops (`loops`) the Tile / Block / Execute Graphs are those of the *base*: the
    Tensor Graph with each loop variant's body copied for two *waves* of iterations (a wave fills
    the cores once), or once per iteration when there are fewer; the cost of a run is extrapolated
    from it with each variant's marginal cost per iteration (base minus one wave, divided by the
    wave) and the iterations the run took (see `loops`)."""

    def __init__(self, name: str, chip: Chip, tensor_graph: TensorGraph, tile_graph: TileGraph,
                 block_graph: BlockGraph, execute_graph: ExecuteGraph, compile_seconds: float,
                 cost_graph: TensorGraph | None = None, copies: dict | None = None, paths: list | None = None,
                 double_buffer: bool = True, wave: dict | None = None):
        self.name, self.chip = name, chip
        self.tensor_graph, self.tile_graph = tensor_graph, tile_graph
        self.block_graph, self.execute_graph = block_graph, execute_graph
        self.compile_seconds = compile_seconds
        self.cost_graph = cost_graph if cost_graph is not None else tensor_graph
        self.copies = copies or {}
        self.wave = wave or {}
        self.paths = paths or []
        self.double_buffer = double_buffer
        self.guards: list = []   # conditions on argument data this trace took (`loops.record_kernel_guard`)
        self._base: dict | None = None
        self._reduced: dict = {}
        self._results: dict = {}

    def guards_hold(self, args: list) -> bool:
        """Whether the branches on argument data this trace took are those ``args`` take."""
        if not self.guards:
            return True
        from .execute import _Run

        env = dict(zip(self.tensor_graph.params, args))
        return bool(loops.guards_hold(self.guards, {}, _Run(self.tensor_graph, env, {}).read))

    @property
    def stages(self) -> dict:
        return {"tensor_graph": self.tensor_graph, "tile_graph": self.tile_graph,
                "block_graph": self.block_graph, "execute_graph": self.execute_graph}

    def dump_stages(self, directory) -> list[str]:
        d = Path(directory)
        return [str(write_json_atomic(d / f"{k}.json", v.to_json())) for k, v in self.stages.items()]

    def run_result(self, counts: dict | None = None) -> RunResult:
        """The simulated run; ``counts`` are the iterations of each (loop, variant) of the run
        (`execute.run_graph`), defaulting to those known while tracing."""
        if counts is None:
            counts = {(n.id, i): var.get("count") or 0 for n in loops.loop_nodes(self.tensor_graph)
                      for i, var in enumerate(n.attrs["variants"])}
        key = tuple(sorted(counts.items()))
        res = self._results.get(key)
        if res is None:
            res = self._results[key] = self._simulate(counts)
        return res

    def _reduced_metrics(self, key) -> dict:
        m = self._reduced.get(key)
        if m is None:
            copies = dict(self.copies)
            copies[key] -= self.wave.get(key, 1)
            graph, _ = loops.expand(self.tensor_graph, copies)
            m = self._reduced[key] = _measure(self.chip, graph, *lower(graph, self.chip, self.double_buffer))
        return m

    def _exact(self, counts: dict) -> dict | None:
        """A run whose loops took no more iterations than the base simulates is simulated as it is
        (each loop's body copied exactly as often as it ran): extrapolating *down* from two waves
        would subtract whole waves of iterations that never happened. Only for top-level symbolic
        loops, whose counts are iterations of one body; a nested loop's count sums over its
        enclosing iterations."""
        if not self.copies or loops.nested(self.tensor_graph):
            return None
        if any(counts.get(k, 0) > c for k, c in self.copies.items()):
            return None
        exact = {k: counts.get(k, 0) for k in self.copies}
        if exact == self.copies:
            return None
        key = tuple(sorted(exact.items()))
        m = self._reduced.get(("exact",) + key)
        if m is None:
            graph, _ = loops.expand(self.tensor_graph, exact)
            m = self._reduced[("exact",) + key] = _measure(self.chip, graph, *lower(graph, self.chip, self.double_buffer))
        return m

    def _simulate(self, counts: dict) -> RunResult:
        chip = self.chip
        if self._base is None:
            self._base = _measure(chip, self.cost_graph, self.tile_graph, self.block_graph, self.execute_graph)
        exact = self._exact(counts)
        base = exact if exact is not None else self._base
        total = {k: (base[k].copy() if isinstance(base[k], np.ndarray) else base[k]) for k in _ADDITIVE}
        enc = loops.enclosing_copies(self.tensor_graph, self.copies)
        loop_info = []
        for n in loops.loop_nodes(self.tensor_graph):
            variants = []
            for v, var in enumerate(n.attrs["variants"]):
                key = (n.id, v)
                sim = enc.get(key, 1) * self.copies.get(key, 0)
                actual = counts.get(key, 0)
                marginal = 0.0
                if exact is not None:
                    sim = actual            # simulated as it ran: nothing to extrapolate
                elif self.copies.get(key, 0) >= 1 and enc.get(key, 1) >= 1:
                    red = self._reduced_metrics(key)
                    per = {k: (base[k] - red[k]) / (enc[key] * self.wave.get(key, 1)) for k in _ADDITIVE}
                    marginal = float(per["cycles"])
                    if actual != sim:
                        for k in _ADDITIVE:
                            total[k] = total[k] + (actual - sim) * per[k]
                variants.append({"variant": v, "iterations": actual, "simulated": sim,
                                 "marginal_over": self.wave.get(key, 1),
                                 "marginal_cycles": marginal,
                                 "guards": [f"{e} {'is' if t else '=='} {x}" for e, x, t, _ in var["guards"]]})
            loop_info.append({"loop": n.attrs["name"], "node": n.id, "idx_name": n.attrs["idx_name"],
                              "iterations": sum(x["iterations"] for x in variants), "variants": variants})
        cycles = max(0.0, float(total["cycles"]))
        time_us = chip.cycles_to_us(cycles)
        if total["cube_time"] > 0:
            frac, bound = (total["cube_time"] / (time_us * 1e-6) if time_us else 0.0), "cube"
        else:
            frac, bound = (total["traffic"] / (cycles * chip.hbm_bytes_per_cycle()) if cycles else 0.0), "memory"
        tl = base["timeline"]
        # the roofline: the Cube's flops at its peak for their dtype, or the GM bytes at HBM bandwidth
        roof_s = builtins.max(float(total["cube_time"]), float(total["traffic"]) / (chip.hbm_gbps * 1e9))
        return RunResult(
            name=self.name, chip=chip.name, cycles=cycles, time_us=time_us,
            pipe_busy={p: max(0.0, float(total["busy"][i])) for i, p in enumerate(PIPES)},
            pipe_busy_max_core={p: max(0.0, float(total["busy_max"][i])) for i, p in enumerate(PIPES)},
            buffer_peak=dict(base["peak"]), flops=float(total["flops"]), gm_bytes=float(total["traffic"]),
            fraction_of_peak=frac, bound=bound, cores_used=self.block_graph.cores_used(), groups=base["groups"],
            timeline=tl, _chip=chip, loops=loop_info, simulated_cycles=base["cycles"], roofline_us=roof_s * 1e6,
            loop_spans=self._loop_spans(tl) if loop_info and exact is None else [])

    def _loop_spans(self, tl) -> list[dict]:
        """Per loop variant: the cycles its simulated copies span in the base timeline."""
        group_of = self.execute_graph.group_of
        if len(tl) != len(group_of):
            return []
        node_group = {}
        for g in self.tile_graph.groups:
            for nid in g.nodes:
                node_group[nid] = g.id
        group_keys: dict[int, set] = {}
        for nid, path in enumerate(self.paths):
            if path and nid in node_group:
                group_keys.setdefault(node_group[nid], set()).update(path)
        gof = np.asarray(group_of)
        start, end = np.asarray(tl.start), np.asarray(tl.end)
        spans = []
        keys = sorted({k for ks in group_keys.values() for k in ks})
        for key in keys:
            gids = [g for g, ks in group_keys.items() if key in ks]
            mask = np.isin(gof, gids)
            if mask.any():
                spans.append({"key": key, "start": float(start[mask].min()), "end": float(end[mask].max())})
        return spans


def _waves(graph: TensorGraph, chip: Chip, double_buffer: bool) -> dict:
    """Per top-level (loop, variant): how many iterations fill the cores once, from the tasks of
    one copy of its body (ceil(cores / tasks), at most loops.MAX_WAVE)."""
    inner = loops.nested(graph)
    keys = [(n.id, v) for n in loops.loop_nodes(graph) for v in range(len(n.attrs["variants"]))]
    one, paths = loops.expand(graph, dict.fromkeys(keys, 1))
    tg = build_tile_graph(one, chip, double_buffer)
    n_vec, n_cube = len(vector_core_ids(chip)), len(cube_core_ids(chip))
    waves = {}
    for g in tg.groups:
        cores = n_cube if g.kind == "cube" else n_vec
        for key in {k for nid in g.nodes for k in paths[nid]}:
            if key in inner:
                continue
            w = builtins.max(1, -(-cores // builtins.max(1, g.n_tasks)))
            waves[key] = builtins.min(loops.MAX_WAVE, builtins.min(waves.get(key, w), w))
    return waves


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
        # read (and checked) at call time, as the real jit does: a caller may change the dict
        self.runtime_options = runtime_options if runtime_options is not None else {}
        self.pass_options = config.check_pass_options(pass_options)
        self.other_options = {k: check_options(k[:-len("_options")], v) if k.endswith("_options") and v else v
                              for k, v in other_options.items()}
        try:  # a module with `from __future__ import annotations` has its annotations as strings
            self.signature = inspect.signature(func, eval_str=True)
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate: keep it as written
            self.signature = inspect.signature(func)
        self._cache: dict = {}
        self.trace_count = 0
        self.last_run: RunResult | None = None
        self.last_compiled: CompiledKernel | None = None

    # ---- options ----
    @property
    def options(self) -> dict:
        """The options this kernel was given, by section (checked; most are recorded only)."""
        out = {"pass_options": dict(self.pass_options),
               "runtime_options": check_options("runtime", self.runtime_options)}
        out.update({k: v for k, v in self.other_options.items() if v})
        return out

    def _chip(self) -> Chip:
        opts = dict(config.STATE.section_options.get("runtime", {}))
        opts.update(check_options("runtime", self.runtime_options))
        if opts.get("run_mode", RunMode.SIM) == RunMode.NPU:
            raise NoNPUError("run_mode = RunMode.NPU: no NPU here: use RunMode.SIM (runtime_options={'run_mode': "
                             "pypto.RunMode.SIM}); pypto_lab runs kernels on its simulated chip")
        return get_chip(opts.get("chip", DEFAULT_CHIP))

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        chip = self._chip()
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        tensors, others, bindings, formats_in = [], [], {}, {}
        for name, value in bound.arguments.items():
            ann = self.signature.parameters[name].annotation
            if isinstance(value, torch.Tensor):
                if not value.is_cpu:   # (a stand-in NPU tensor reports device npu but holds its data on the CPU)
                    raise TraceError(f"argument {name!r} is on {value.device}: pypto_lab runs in SIM mode on the CPU; "
                                     "pass CPU tensors")
                dt = from_torch(value.dtype, f"argument {name!r}")
                fmt = formats.storage_format(value)
                formats.check_argument(name, value, ann, fmt)
                if fmt == formats.NZ:
                    formats.check_nz_shape(name, value.shape, value.element_size())
                    formats_in[name] = fmt
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
               _freeze(st.pass_options), _freeze(self.pass_options), _freeze(bindings), _freeze(formats_in))
        # one signature may hold several traces: one per path its argument data took through
        # branches on that data (`loops.record_kernel_guard`); the first whose guards hold runs
        variants = self._cache.setdefault(key, [])
        args = [v for _, v, _ in tensors]
        compiled = next((c for c in variants if c.guards_hold(args)), None)
        if compiled is None:
            compiled = self._compile(chip, bound, tensors, bindings, formats_in)
            variants.append(compiled)
        self.last_compiled = compiled
        counts: dict = {}
        computed = config.values_computed()
        env = run_graph(compiled.tensor_graph, [v for _, v, _ in tensors], counts, compute=computed)
        self.last_run = compiled.run_result(counts)
        if not computed:
            self.last_run = dataclasses.replace(self.last_run, values_computed=False)
        # as the real SIM launcher does after every launch: the cost model's swimlane under ./output/
        self.last_run.swimlane_path = sim_output.write_swimlane(self.last_run)
        verify = getattr(compiled, "verify_requests", None)
        if verify or extras._GOLDENS["goldens"] is not None:
            opts = dict(config.STATE.section_options.get("verify", {}))
            opts.update(self.other_options.get("verify_options") or {})
            extras.after_call(self.__name__, verify or [], env, [v for _, v, _ in tensors],
                              bool(opts.get("enable_pass_verify", False)) and computed)
        rets = [env[r] for r in compiled.tensor_graph.returns]
        if not rets:
            return None
        return rets[0] if len(rets) == 1 else tuple(rets)

    def _compile(self, chip: Chip, bound, tensors, bindings, formats_in=None) -> CompiledKernel:
        t0 = time.perf_counter()
        st = config.STATE
        saved = (st.vec_tile, st.cube_tile, st.cube_tile_raw, dict(st.pass_options), st.trace, st.semantic_label)
        trace = Trace(self.func.__name__, chip)
        graph = trace.graph
        st.pass_options.update(self.pass_options)
        try:
            st.trace = trace
            with bind_dims(bindings):
                call_args = dict(bound.arguments)
                for name, value, dt in tensors:
                    attrs = {"name": name}
                    if formats_in and name in formats_in:
                        attrs["format"] = formats_in[name]
                    node = graph.add("param", [], value.shape, dt, attrs)
                    trace.data[node.id] = value
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
            st.vec_tile, st.cube_tile, st.cube_tile_raw, st.pass_options, st.trace, st.semantic_label = saved
        if any(n.op == "loop" for n in graph.nodes):
            copies, wave = loops.cost_copies(graph, _waves(graph, chip, double_buffer))
            cost_graph, paths = loops.expand(graph, copies)
        else:
            copies, wave, cost_graph, paths = {}, {}, graph, []
        tg, bg, eg = lower(cost_graph, chip, double_buffer)
        COMPILE_SECONDS[0] += time.perf_counter() - t0
        ck = CompiledKernel(self.func.__name__, chip, graph, tg, bg, eg, time.perf_counter() - t0,
                            cost_graph, copies, paths, double_buffer, wave)
        ck.guards = list(trace.kernel_guards)
        ck.verify_requests = list(getattr(getattr(trace, "verify", None), "requests", []))
        return ck

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
        return {"entries": sum(len(v) for v in self._cache.values()), "traces": self.trace_count}

    def clear_cache(self) -> None:
        self._cache.clear()


def jit(func=None, *, runtime_options=None, pass_options=None, host_options=None, codegen_options=None,
        verify_options=None, debug_options=None, new_ir: bool = True, create_new_logical_tensor: bool = False):
    """``@pypto.jit`` / ``@pypto.jit(runtime_options={...}, pass_options={...})``. Every option is
    checked (option_table); ``new_ir`` and ``create_new_logical_tensor`` (the real frontend's IR
    switches) are recorded."""
    def wrap(f):
        return JitKernel(f, runtime_options, pass_options, host_options=host_options, codegen_options=codegen_options,
                         verify_options=verify_options, debug_options=debug_options, new_ir=new_ir,
                         create_new_logical_tensor=create_new_logical_tensor)
    return wrap(func) if func is not None else wrap
