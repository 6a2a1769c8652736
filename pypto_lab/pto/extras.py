"""The rest of the real API's surface outside the op library (docs/zh/api at 883e7df: config, control
flow and "others"), with what each does here.

* ``set_conv_tile_shapes(l1, l0=None)`` / ``get_conv_tile_shapes()``: the convolution tile shapes in
  force, recorded (``pypto.conv`` tiles from its own sizes); ``TileL1Info`` / ``TileL0Info`` hold
  them as the binding's classes do (keyword fields).
* ``PassConfigKey`` and ``set_pass_config`` / ``get_pass_config`` / ``get_pass_configs`` /
  ``set_pass_default_config`` / ``get_pass_default_config``: per-pass switches (dump a graph, ...)
  of the real compiler's passes, which pypto_lab does not run; kept and read back, so a script that
  sets and reads them behaves as on the real framework.
* ``function(name, *tensors)``: a named function scope inside a kernel being traced (the real one
  opens a function of the program); the operations traced inside carry its name as their semantic
  label. ``frontend.function``: a reusable function called from kernels, traced inline.
* ``pass_verify_print(*values, cond=1)`` / ``pass_verify_save(tensor, fname, cond=1)``: the values
  a kernel computed, printed or saved (``torch.save`` to ``output/pass_verify/<fname>.pt``) after the
  call, when the kernel's verify options have ``enable_pass_verify``; a value computed in a symbolic
  loop shows its last iteration. ``set_verify_golden_data(in_out_tensors, goldens)``: the next
  verified call compares its arguments with the goldens given (max |diff| printed per tensor).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import io
from dataclasses import dataclass, field
from pathlib import Path

from . import config
from .errors import OptionError, TraceError

# ---------------------------------------------------------------------------- conv tile shapes


@dataclass
class TileL1Info:
    tileHin: int = 1          # noqa: N815 - the binding's field names
    tileHout: int = 1         # noqa: N815
    tileWin: int = 1          # noqa: N815
    tileWout: int = 1         # noqa: N815
    tileCinFmap: int = 1      # noqa: N815
    tileCinWeight: int = 1    # noqa: N815
    tileN: int = 1            # noqa: N815
    tileBatch: int = 1        # noqa: N815


@dataclass
class TileL0Info:
    tileH: int = 1            # noqa: N815
    tileW: int = 1            # noqa: N815
    tileK: int = 16           # noqa: N815
    tileN: int = 16           # noqa: N815


_CONV = {"l1": None, "l0": None}


def set_conv_tile_shapes(tile_l1_info, tile_l0_info=None) -> None:
    if not isinstance(tile_l1_info, TileL1Info) or (tile_l0_info is not None and not isinstance(tile_l0_info, TileL0Info)):
        raise OptionError("set_conv_tile_shapes(tile_l1_info, tile_l0_info): pass pypto.TileL1Info(...) and "
                          "optionally pypto.TileL0Info(...). Rule: the conv tile shapes are those two records")
    bad = {k: v for k, v in vars(tile_l1_info).items() if not isinstance(v, int) or v < 1}
    if bad or tile_l1_info.tileBatch != 1:
        raise OptionError(f"set_conv_tile_shapes: TileL1Info {bad or {'tileBatch': tile_l1_info.tileBatch}}. Rule: "
                          "every L1 tile size is an int >= 1 and tileBatch is 1 (the docs' constraints)")
    _CONV["l1"], _CONV["l0"] = tile_l1_info, tile_l0_info


def get_conv_tile_shapes():
    return _CONV["l1"], _CONV["l0"]


# ---------------------------------------------------------------------------- pass configs


class PassConfigKey(enum.Enum):
    KEY_DUMP_GRAPH = 0
    KEY_PRINT_GRAPH = 1
    KEY_HEALTH_CHECK = 2
    KEY_PRE_CHECK = 3
    KEY_POST_CHECK = 4
    KEY_DISABLE_PASS = 5
    KEY_EXPECTED_VALUE_CHECK = 6
    KEY_PRINT_PROGRAM = 7
    KEY_DUMP_PASS_TIME_COST = 8
    KEY_RESUME_PATH = 9


_PASS_CONFIG: dict[tuple[str, str], dict] = {}
_PASS_DEFAULTS: dict = {}


def _key(key):
    if not isinstance(key, PassConfigKey):
        raise OptionError(f"{key!r} is not a pypto.PassConfigKey. Fix: e.g. pypto.PassConfigKey.KEY_DUMP_GRAPH")
    return key


def set_pass_config(strategy: str, identifier: str, key, value: bool) -> None:
    _PASS_CONFIG.setdefault((str(strategy), str(identifier)), {})[_key(key)] = bool(value)


def get_pass_config(strategy: str, identifier: str, key, default_value: bool) -> bool:
    return _PASS_CONFIG.get((str(strategy), str(identifier)), {}).get(_key(key), bool(default_value))


def get_pass_configs(strategy: str, identifier: str) -> dict:
    return dict(_PASS_CONFIG.get((str(strategy), str(identifier)), {}))


def set_pass_default_config(key, value: bool) -> None:
    _PASS_DEFAULTS[_key(key)] = bool(value)


def get_pass_default_config(key, default_value: bool) -> bool:
    return _PASS_DEFAULTS.get(_key(key), bool(default_value))


# ---------------------------------------------------------------------------- function scopes


@contextlib.contextmanager
def function(name: str, *args, **kwargs):
    """``with pypto.function("main", a, b, c):`` inside a kernel being traced: a named scope."""
    if config.STATE.trace is None:
        raise TraceError(f"pypto.function({name!r}) outside a kernel being traced. Rule: pypto_lab builds programs by "
                         "tracing a @pypto.jit function. Fix: put the with-block inside such a kernel")
    saved = config.STATE.semantic_label
    config.STATE.semantic_label = str(name)
    try:
        yield
    finally:
        config.STATE.semantic_label = saved


def frontend_function(func):
    """``@pypto.frontend.function``: a function kernels call; traced inline where it is called."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    wrapper.__pto_function__ = True
    return wrapper


# ---------------------------------------------------------------------------- pass verify


@dataclass
class _Verify:
    requests: list = field(default_factory=list)   # ("print" | "save", tensor ids, fname, cond)
    goldens: tuple | None = None


def _trace():
    tr = config.STATE.trace
    if tr is None:
        raise TraceError("pass_verify_print / pass_verify_save need a kernel being traced: call them inside @pypto.jit")
    if not hasattr(tr, "verify"):
        tr.verify = _Verify()
    return tr


def pass_verify_print(*values, cond=1) -> None:
    tr = _trace()
    ids = [v._id for v in values if getattr(v, "is_bound", False)]
    texts = [str(v) for v in values if not getattr(v, "is_bound", False)]
    tr.verify.requests.append(("print", ids, " ".join(texts), cond))


def pass_verify_save(tensor, fname, cond=1, **kwargs) -> None:
    tr = _trace()
    if not getattr(tensor, "is_bound", False):
        raise TraceError("pass_verify_save(tensor, fname): tensor is a pypto tensor of the kernel")
    tr.verify.requests.append(("save", [tensor._id], str(fname), cond))


_GOLDENS: dict = {"in_out": None, "goldens": None}


def set_verify_golden_data(in_out_tensors=None, goldens=None) -> None:
    _GOLDENS["in_out"], _GOLDENS["goldens"] = in_out_tensors, goldens


def after_call(kernel_name: str, requests, env: dict, args: list, enabled: bool, out=print) -> list[str]:
    """What a verified call reports (`jit` calls it after the numerics): the printed values, the saved
    files, the comparison with the goldens. Returns the lines it printed."""
    import torch

    from ..files.atomic import write_bytes_atomic

    lines = []
    if not enabled:
        return lines
    for kind, ids, text, cond in requests:
        if not cond:
            continue
        for tid in ids:
            value = env.get(tid)
            if value is None:
                continue
            if kind == "print":
                lines.append(f"[pass_verify] {kernel_name} {text} %{tid}: {value}")
            else:
                buf = io.BytesIO()
                torch.save(value.detach().clone(), buf)
                path = write_bytes_atomic(Path("output") / "pass_verify" / f"{text}.pt", buf.getvalue())
                lines.append(f"[pass_verify] {kernel_name} saved %{tid} to {path}")
    goldens = _GOLDENS["goldens"]
    if goldens is not None:
        for i, (arg, gold) in enumerate(zip(args, goldens)):
            if gold is not None:
                diff = float((arg.double() - torch.as_tensor(gold).double()).abs().max())
                lines.append(f"[pass_verify] {kernel_name} argument {i}: max |diff| against the golden {diff:.3g}")
    for ln in lines:
        out(ln)
    return lines


__all__ = ["TileL1Info", "TileL0Info", "set_conv_tile_shapes", "get_conv_tile_shapes", "PassConfigKey",
           "set_pass_config", "get_pass_config", "get_pass_configs", "set_pass_default_config",
           "get_pass_default_config", "function", "frontend_function", "pass_verify_print", "pass_verify_save",
           "set_verify_golden_data"]
