"""Every option CANN PyPTO's configuration accepts, with its type, its range and what pypto_lab
does with it: the one table behind ``pypto.options``, ``pypto.set_options``, the
``set_*_options`` / ``get_*_options`` functions and the ``*_options`` arguments of ``pypto.jit``.

Source of the list (keys, types, ranges, defaults): the real framework's configuration schema and
defaults, ``framework/src/interface/configs/tile_fwk_config_schema.json`` and
``tile_fwk_config.json``, with the Python setters of ``python/pypto/config.py`` and
``python/pypto/experimental/operation.py``, at commit 883e7df (2026-08-22) of the CANN PyPTO
repository. Keys marked "legacy" are from older commits; still accepted so older scripts run.

A value of the wrong type or out of range raises `OptionError` naming the option, the value, the
expected type and a fix; an unknown name raises `OptionError` with the closest known names.

What each option does here ("recorded" = accepted, validated, stored, readable back with the
getters and ``kernel.options``, but it changes nothing in the simulation):

=============================================  ============================================================
option                                         in pypto_lab
=============================================  ============================================================
pass.double_buffer (pypto_lab's own)           modelled: False gives every on-chip buffer one slot (no
                                               ping-pong), so load, compute and store of successive tiles
                                               serialise; True (default) is double buffering
pass.vec_nbuffer_setting / cube_nbuffer_...    recorded: the real pass merges N isomorphic AIV/AIC
                                               subgraphs into one task; the lab's Block Graph deals tiles
                                               one task each
pass.cube_l1_reuse_setting (+ _by_func/label)  recorded (the L1 reuse merge pass is not modelled)
pass.enable_slice                              recorded: the real slice pass; tiles here are cut by the
                                               Tile Graph regardless
pass.sg_set_scope, sg_set_ooo_scope,           recorded (manual subgraph / out-of-order scopes)
ooo_sched_mode, ooo_sort_mode_aic/aiv
pass.pg_*, mg_*, copyout_resolve_coalescing,   recorded (graph partition / merge tuning)
auto_mix_partition, sg_set_tunevf_mode
runtime.run_mode                               modelled: SIM (1) runs on the simulated chip; NPU (0)
                                               raises NoNPUError
runtime.chip (pypto_lab's own)                 modelled: the chip model a kernel runs on
runtime.device_sched_mode, stitch_function_    recorded (device scheduling / stitching of the real
max_num, max_workspace_kb, valid_shape_        AICPU runtime)
optimize, ready_on_host_tensors, device_sched_
parallelism, launch_sched_aicpu_num,
launch_early_mode, cfgcache_* (legacy)
host.compile_stage, compile_monitor_*,         recorded: in SIM mode every call compiles, simulates and
compile_timeout*, only_codegen (legacy)        computes the outputs
codegen.*                                      recorded (no code is generated)
verify.*                                       recorded (the lab computes every output with torch)
debug.*                                        recorded (``kernel.dump_stages`` and ``last_run`` always
                                               hold the graphs and the trace)
operation.combine_axis                         recorded
=============================================  ============================================================
"""

from __future__ import annotations

import difflib
import enum
import os

from ..hw.chip import Chip
from .errors import OptionError

_I32 = 2147483647


class CompStage(enum.IntEnum):
    """``pypto.CompStage``: where the real compiler stops (host option ``compile_stage``)."""

    ALL_COMPLETE = 0
    TENSOR_GRAPH = 1
    TILE_GRAPH = 2
    EXECUTE_GRAPH = 3
    CODEGEN_INSTRUCTION = 4
    CODEGEN_BINARY = 5


class Spec:
    """One option: its kind ("int", "bool", "str", "setting", "scope", "str_list", "int_list",
    "float_list", "any"), range or choices, default and what pypto_lab does with it."""

    __slots__ = ("kind", "lo", "hi", "choices", "default", "modelled")

    def __init__(self, kind, lo=None, hi=None, choices=None, default=None, modelled=""):
        self.kind, self.lo, self.hi, self.choices = kind, lo, hi, choices
        self.default, self.modelled = default, modelled

    def expected(self) -> str:
        if self.kind == "int":
            return f"int in [{self.lo}, {self.hi}]"
        if self.kind == "str" and self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        return {"bool": "bool (True or False)", "str": "str",
                "setting": "dict {int or 'DEFAULT' or 'func<magic>_<order>' or label: int (or (int, side))}",
                "scope": "int, or a tuple (scope_id: int, allow_parallel_merge: bool, allow_cross_scope_merge: bool)",
                "str_list": "list of str", "int_list": "list of int", "float_list": "list of 2 floats [atol, rtol]",
                "chip": "a chip preset name (e.g. 'Ascend910B1'), a .toml path or a Chip",
                "any": "any value"}.get(self.kind, self.kind)


def _int(lo, hi, default=0, modelled=""):
    return Spec("int", lo, hi, None, default, modelled)


SETTING = "setting"
# source: framework/src/interface/configs/tile_fwk_config_schema.json (types, ranges) and
# tile_fwk_config.json (defaults) of the CANN PyPTO repository at commit 883e7df (2026-08-22)
OPTIONS: dict[str, dict[str, Spec]] = {
    "pass": {
        "pg_parallel_lower_bound": _int(0, _I32, 20),
        "pg_lower_bound": _int(0, _I32, 512),
        "pg_partition_algorithm": Spec("str", choices=("Iso", "OspSarkar", "OspBsp"), default="Iso"),
        "mg_copyin_upper_bound": _int(0, _I32, 104857600),
        "mg_vec_parallel_lb": _int(1, 48, 48),
        "copyout_resolve_coalescing": _int(0, 1000000, 0),
        "auto_mix_partition": _int(0, 1, 0),
        "sg_set_tunevf_mode": _int(0, 2, 0),
        "enable_slice": Spec("bool", default=False),
        "sg_set_scope": Spec("scope", default=(-1, False, False)),
        "sg_set_ooo_scope": _int(-1, 100000, 0),
        "ooo_sched_mode": Spec("str", choices=("", "GAPMIN", "HLF"), default=""),
        "ooo_sort_mode_aic": Spec("str", default=""),
        "ooo_sort_mode_aiv": Spec("str", default=""),
        "vec_nbuffer_setting": Spec(SETTING, default={}),
        "cube_nbuffer_setting": Spec(SETTING, default={}),
        "cube_l1_reuse_setting": Spec(SETTING, default={}),
        "vec_nbuffer_setting_by_func": Spec(SETTING, default={}),
        "cube_nbuffer_setting_by_func": Spec(SETTING, default={}),
        "cube_l1_reuse_setting_by_func": Spec(SETTING, default={}),
        "vec_nbuffer_setting_by_label": Spec(SETTING, default={}),
        "cube_nbuffer_setting_by_label": Spec(SETTING, default={}),
        "cube_l1_reuse_setting_by_label": Spec(SETTING, default={}),
        # pypto_lab's own
        "double_buffer": Spec("bool", default=True, modelled="False: one slot per buffer (no ping-pong)"),
    },
    "runtime": {
        "run_mode": _int(0, 1, 1, modelled="SIM runs on the chip model; NPU raises NoNPUError"),
        "device_sched_mode": _int(0, 3, 0),
        "stitch_function_max_num": _int(1, 1024, 128),
        "max_workspace_kb": _int(0, _I32, 0),
        "valid_shape_optimize": _int(0, 1, 0),
        "ready_on_host_tensors": Spec("str_list", default=[]),
        "device_sched_parallelism": _int(1, 8, 1),
        "launch_sched_aicpu_num": _int(1, 7, 7),
        "launch_early_mode": _int(0, 2, 0),
        # legacy (older commits of the real framework)
        "cfgcache_device_task_num": _int(0, _I32, 0),
        "cfgcache_root_task_num": _int(0, _I32, 0),
        "cfgcache_leaf_task_num": _int(0, _I32, 0),
        "stitch_cfgcache_size": _int(0, 2 ** 62, 0),
        # pypto_lab's own
        "chip": Spec("chip", default="Ascend910B1", modelled="the chip model the kernel runs on (a preset name, "
                     "a .toml path or a Chip)"),
    },
    "host": {
        "compile_stage": _int(0, 5, 0),
        "compile_monitor_enable": _int(0, 2, 1),
        "compile_timeout": _int(0, _I32, 600),
        "compile_timeout_stage": _int(0, _I32, 0),
        "compile_monitor_print_interval": _int(0, _I32, 60),
        "only_codegen": Spec("bool", default=False),  # legacy
    },
    "codegen": {
        "support_dynamic_aligned": Spec("bool", default=False),
        "soc_version": Spec("str", default=""),
        "enable_pmu_trace": Spec("bool", default=False),
        "vf_options": Spec("str", default=""),
        "vf_compiler": Spec("str", default=""),
    },
    "verify": {
        "enable_pass_verify": Spec("bool", default=False),
        "pass_verify_save_tensor": Spec("bool", default=False),
        "pass_verify_save_tensor_dir": Spec("str", default=""),
        "pass_verify_pass_filter": Spec("str_list", default=[]),
        "pass_verify_error_tol": Spec("float_list", default=[1e-3, 1e-3]),
    },
    "debug": {
        "compile_debug_mode": _int(0, 2, 0),
        "runtime_debug_mode": _int(0, 4, 0),
        "dump_pass_graph": Spec("str_list", default=[]),
    },
    "operation": {
        "combine_axis": Spec("bool", default=True),
    },
}
SECTIONS = tuple(OPTIONS)


def _bad(section, name, value, spec: Spec, why: str = "") -> OptionError:
    return OptionError(
        f"{section} option {name!r} = {value!r} ({type(value).__name__}){': ' + why if why else ''}. Rule: "
        f"{name} takes {spec.expected()}. Fix: e.g. {section}_options={{{name!r}: {_example(spec)!r}}}")


def _example(spec: Spec):
    if spec.kind == "int":
        return spec.default if spec.default is not None else spec.lo
    if spec.kind == "str" and spec.choices:
        return spec.choices[0]
    return {"bool": True, "str": "", "chip": "Ascend910B1", "setting": {-1: 2}, "scope": (1, False, False), "str_list": [],
            "int_list": [], "float_list": [1e-3, 1e-3]}.get(spec.kind)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, enum.IntEnum)


def check_value(section: str, name: str, value):
    """``value`` normalised (enums to their int value), or OptionError."""
    spec = lookup(section, name)
    kind = spec.kind
    if isinstance(value, enum.Enum) and not isinstance(value, bool):
        value = value.value
    if section == "runtime" and name == "run_mode" and isinstance(value, str) and value.lower() in ("npu", "sim"):
        value = 0 if value.lower() == "npu" else 1  # the spelling of the examples' --run_mode flag
    if kind == "int":
        if not _is_int(value):
            raise _bad(section, name, value, spec, "not an int")
        if not spec.lo <= int(value) <= spec.hi:
            raise _bad(section, name, value, spec, "out of range")
        return int(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise _bad(section, name, value, spec, "not a bool")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _bad(section, name, value, spec, "not a str")
        if spec.choices and value not in spec.choices:
            raise _bad(section, name, value, spec, "not one of the choices")
        return value
    if kind == "chip":  # a lab option: a preset name, a path or a Chip, resolved by jit with get_chip
        if not isinstance(value, (str, os.PathLike, Chip)):
            raise _bad(section, name, value, spec, "not a chip name, path or Chip")
        return value
    if kind == "setting":
        if not isinstance(value, dict):
            raise _bad(section, name, value, spec, "not a dict")
        kinds = set()
        for k, v in value.items():
            if not (_is_int(k) or isinstance(k, str)):
                raise _bad(section, name, value, spec, f"key {k!r} is neither an int nor a str")
            kinds.add("int" if _is_int(k) else "str")
            ok = _is_int(v) or (name.startswith("cube_l1_reuse") and isinstance(v, (tuple, list)) and len(v) == 2
                                and _is_int(v[0]) and v[1] in ("auto", "left", "right"))
            if not ok:
                raise _bad(section, name, value, spec, f"value {v!r} of key {k!r} is not an int")
        return dict(value)
    if kind == "scope":
        if _is_int(value) and -1 <= value <= _I32:
            return (int(value), False, False)
        if (isinstance(value, (tuple, list)) and len(value) == 3 and _is_int(value[0])
                and isinstance(value[1], bool) and isinstance(value[2], bool)):
            return tuple(value)
        raise _bad(section, name, value, spec)
    if kind in ("str_list", "int_list", "float_list"):
        item = {"str_list": str, "int_list": int, "float_list": (int, float)}[kind]
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, item) and not isinstance(x, bool)
                                                            for x in value):
            raise _bad(section, name, value, spec)
        if kind == "float_list" and len(value) != 2:
            raise _bad(section, name, value, spec, "give two numbers")
        return list(value)
    return value


def lookup(section: str, name: str) -> Spec:
    """The Spec of ``section.name``, or OptionError with the closest known names."""
    if section not in OPTIONS:
        raise OptionError(f"option section {section!r} does not exist. Rule: the sections are "
                          f"{', '.join(SECTIONS)}. Fix: use e.g. pass_options={{...}}")
    known = OPTIONS[section]
    if name not in known:
        close = difflib.get_close_matches(str(name), list(known), n=3, cutoff=0.5)
        others = [s for s in SECTIONS if s != section and name in OPTIONS[s]]
        hint = (f"{name!r} is a {others[0]} option: pass it in {others[0]}_options. " if others else
                f"Did you mean {' or '.join(repr(c) for c in close)}? " if close else "")
        raise OptionError(f"{section} option {name!r} is not known. {hint}Rule: the known {section} options are "
                          f"{', '.join(known)} (the real framework's at 883e7df; 'double_buffer' and 'chip' are "
                          "pypto_lab's own). Fix: correct the name or drop it")
    return known[name]


def check_options(section: str, opts: dict | None) -> dict:
    """A copy of ``opts`` with every key known and every value checked."""
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise OptionError(f"{section}_options = {opts!r} is not a dict. Rule: options are given as "
                          f"{{name: value}}. Fix: e.g. {section}_options={{...}}")
    return {k: check_value(section, k, v) for k, v in opts.items()}


def table_markdown() -> str:
    """The option table as markdown (section, option, type, default, in pypto_lab)."""
    rows = ["| option | type | default | in pypto_lab |", "|---|---|---|---|"]
    for sec, specs in OPTIONS.items():
        for name, s in specs.items():
            rows.append(f"| `{sec}.{name}` | {s.expected()} | `{s.default!r}` | "
                        f"{'modelled: ' + s.modelled if s.modelled else 'recorded'} |")
    return "\n".join(rows)
