"""Compile-time configuration of the PyPTO API: the tile shapes in force
(``set_vec_tile_shapes`` / ``set_cube_tile_shapes`` and their getters), the option scopes
(``pypto.options(...)`` as a context manager or decorator, ``set_options``, ``set_pass_options``,
``set_runtime_options``, ``set_host_options``, ``set_codegen_options``, ``set_verify_options``,
``set_debug_options``, ``set_operation_options`` and their getters; every option and what the lab
does with it: `option_table`) and the semantic label (``set_semantic_label``).

Tile shapes set inside a kernel apply to the operations traced after them; tile shapes set
outside a kernel are the defaults a kernel starts with.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading

from ..hw.tiling import CubeTile
from .errors import SemanticLabelError, TileShapeError
from .option_table import OPTIONS, SECTIONS, check_options

# the option names (their types, ranges and what pypto_lab does with each: option_table.py)
REAL_PASS_OPTIONS = tuple(k for k in OPTIONS["pass"] if k != "double_buffer")
LAB_PASS_OPTIONS = ("double_buffer",)  # pypto_lab: False gives every buffer one slot (no ping-pong)
RUNTIME_OPTIONS = tuple(OPTIONS["runtime"])
HOST_OPTIONS = tuple(OPTIONS["host"])
_FUNC_HASH_ORDER = re.compile(r"^func\d+_\d+$")


class _State(threading.local):
    def __init__(self):
        self.vec_tile: tuple[int, ...] | None = None
        self.cube_tile: CubeTile | None = None
        self.cube_tile_raw = None
        self.enable_split_k = False
        self.matrix_size: list[int] | None = None
        self.pass_options: dict = {}
        # runtime / host / codegen / verify / debug / operation options set by set_*_options,
        # set_options or an options scope (pass options live in pass_options)
        self.section_options: dict[str, dict] = {}
        self.semantic_label: str | None = None
        self.trace = None  # the TraceContext being recorded, if any


STATE = _State()

_COST_ONLY = [False]


def values_computed() -> bool:
    """False in a cost-only scope (`cost_only`) or when the environment sets PYPTO_LAB_COST_ONLY=1:
    kernels are traced, compiled and costed with their real control flow, but compute no tensor."""
    return not (_COST_ONLY[0] or os.environ.get("PYPTO_LAB_COST_ONLY") == "1")


@contextlib.contextmanager
def cost_only(enabled: bool = True):
    """``with pypto_lab.pto.config.cost_only():`` kernels called inside are costed, not computed
    (`execute`): for sizes whose numerics are too slow. ``kernel.last_run.values_computed`` says which."""
    saved = _COST_ONLY[0]
    _COST_ONLY[0] = enabled
    try:
        yield
    finally:
        _COST_ONLY[0] = saved


def _check_positive(name: str, values) -> tuple[int, ...]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
            raise TileShapeError(f"{name}: dimension {i} = {v!r} is not an integer; every tile size is a "
                                 "positive integer, e.g. 32")
        v = int(v)
        if v <= 0:
            raise TileShapeError(f"{name}: dimension {i} = {v}: every tile size must be > 0 (rule of "
                                 "set_vec_tile_shapes / set_cube_tile_shapes); use e.g. 1 or 16")
        out.append(v)
    return tuple(out)


def set_vec_tile_shapes(*dims: int) -> None:
    """Tile shape of the vector operations traced from now on: one size per tensor dimension (1-4)."""
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    if not 1 <= len(dims) <= 4:
        raise TileShapeError(f"set_vec_tile_shapes{dims}: {len(dims)} sizes given; the rule is 1 to 4 sizes, one "
                             "per dimension of the tensors the following operations compute")
    STATE.vec_tile = _check_positive("set_vec_tile_shapes", dims)


def get_vec_tile_shapes() -> list[int]:
    return list(STATE.vec_tile) if STATE.vec_tile else []


def set_cube_tile_shapes(m, k, n, enable_split_k: bool = False) -> None:
    """Tile shapes of the matmuls traced from now on: ``[m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1]``.

    A single value per dimension means l0 = l1; ``k`` may also be ``[k_l0, k_l1, k_b]`` as in the
    real API (the third value is accepted and ignored)."""
    def pair(name, v):
        if isinstance(v, int):
            v = [v, v]
        v = list(v)
        if len(v) == 1:
            v = v * 2
        if len(v) not in (2, 3):
            raise TileShapeError(f"set_cube_tile_shapes: {name} = {v!r}; give [{name}_l0, {name}_l1]")
        return _check_positive(f"set_cube_tile_shapes {name}", v[:2])
    mm, kk, nn = pair("m", m), pair("k", k), pair("n", n)
    STATE.cube_tile = CubeTile(mm[0], mm[1], kk[0], kk[1], nn[0], nn[1])
    STATE.cube_tile_raw = ([*mm], [*kk], [*nn])
    STATE.enable_split_k = bool(enable_split_k)


def get_cube_tile_shapes():
    """As the real API: ``([m_l0, m_l1], [k_l0, k_l1], [n_l0, n_l1], enable_split_k)`` (a tuple
    of three lists and a bool; split-K is recorded, not modelled), or None before any is set."""
    t = STATE.cube_tile
    if t is None:
        return None
    return ([t.m_l0, t.m_l1], [t.k_l0, t.k_l1], [t.n_l0, t.n_l1], STATE.enable_split_k)


def set_matrix_size(size) -> None:
    """``pypto.set_matrix_size([m, k, n])``: the real framework's hint of the matmul sizes to come;
    recorded (``get_matrix_size()``), the Tile Graph here reads the sizes from the matmul itself."""
    vals = list(size)
    if not 1 <= len(vals) <= 3:
        raise TileShapeError(f"set_matrix_size({vals!r}): give [m, k, n]")
    STATE.matrix_size = [int(v) for v in vals]


def get_matrix_size():
    return None if STATE.matrix_size is None else list(STATE.matrix_size)


def check_pass_options(opts: dict | None) -> dict:
    return check_options("pass", opts)


def set_pass_options(**opts) -> None:
    """``pypto.set_pass_options(enable_slice=True, vec_nbuffer_setting={-1: 2}, ...)``: every
    pass option of the real framework (checked by type and range; see option_table)."""
    STATE.pass_options.update(check_pass_options(opts))


def get_pass_options() -> dict:
    return dict(STATE.pass_options)


def _setter(section: str):
    def set_section_options(**opts) -> None:
        STATE.section_options.setdefault(section, {}).update(check_options(section, opts))

    def get_section_options() -> dict:
        return dict(STATE.section_options.get(section, {}))

    set_section_options.__name__ = f"set_{section}_options"
    get_section_options.__name__ = f"get_{section}_options"
    set_section_options.__doc__ = (f"``pypto.set_{section}_options(name=value, ...)``: {section} options for the "
                                   "kernels traced from now on (checked by type and range; see option_table).")
    get_section_options.__doc__ = f"The {section} options set so far (``pypto.get_{section}_options()``)."
    return set_section_options, get_section_options


set_runtime_options, get_runtime_options = _setter("runtime")
set_host_options, get_host_options = _setter("host")
set_codegen_options, get_codegen_options = _setter("codegen")
set_verify_options, get_verify_options = _setter("verify")
set_debug_options, get_debug_options = _setter("debug")
set_operation_options, get_operation_options = _setter("operation")


def set_options(codegen_options=None, host_options=None, pass_options=None, runtime_options=None,
                verify_options=None, debug_options=None, operation_options=None, vec_tile_shapes=None,
                cube_tile_shapes=None, conv_tile_shapes=None, matrix_size=None) -> None:
    """``pypto.set_options(pass_options={...}, vec_tile_shapes=[...], ...)``: set several kinds of
    options at once, from now on (as the real one, it starts a new scope)."""
    given = {"codegen": codegen_options, "host": host_options, "pass": pass_options, "runtime": runtime_options,
             "verify": verify_options, "debug": debug_options, "operation": operation_options}
    checked = {sec: check_options(sec, v) for sec, v in given.items() if v is not None}
    for sec, v in checked.items():
        if sec == "pass":
            STATE.pass_options.update(v)
        else:
            STATE.section_options.setdefault(sec, {}).update(v)
    if vec_tile_shapes is not None:
        set_vec_tile_shapes(*vec_tile_shapes)
    if cube_tile_shapes is not None:
        set_cube_tile_shapes(*cube_tile_shapes[:3], *(cube_tile_shapes[3:4]))
    if matrix_size is not None:
        set_matrix_size(matrix_size)


def get_options() -> dict:
    """Every option in force, keyed as the real framework's scope does ("pass.enable_slice", ...)."""
    out = {f"pass.{k}": v for k, v in STATE.pass_options.items()}
    for sec in SECTIONS:
        out.update({f"{sec}.{k}": v for k, v in STATE.section_options.get(sec, {}).items()})
    if STATE.vec_tile:
        out["vec_tile_shapes"] = list(STATE.vec_tile)
    if STATE.cube_tile is not None:
        out["cube_tile_shapes"] = get_cube_tile_shapes()
    if STATE.matrix_size is not None:
        out["matrix_size"] = list(STATE.matrix_size)
    return out


def set_semantic_label(label: str) -> None:
    """``pypto.set_semantic_label("attn_softmax")``: the operations traced after it carry this label
    (in the Tensor Graph JSON as ``attrs.semantic_label``, in the Tile Graph's and ``last_run``'s
    group names); the real framework also keys pass options ``*_by_label`` on it."""
    if not isinstance(label, str):
        raise SemanticLabelError(f"set_semantic_label({label!r}): the label is a {type(label).__name__}. Rule: a "
                                 "semantic label is a str. Fix: pass a name such as 'attn_softmax'")
    if _FUNC_HASH_ORDER.match(label):
        raise SemanticLabelError(f"set_semantic_label({label!r}): the label has the form 'func<magic>_<order>', "
                                 "which the real framework reserves for function-granularity pass settings "
                                 "(vec_nbuffer_setting={'func123_0': 2}). Fix: choose another name, e.g. "
                                 f"'{label}_label'")
    STATE.semantic_label = label or None


def get_semantic_label() -> str | None:
    return STATE.semantic_label


def reset_options() -> None:
    STATE.vec_tile = None
    STATE.cube_tile = None
    STATE.cube_tile_raw = None
    STATE.enable_split_k = False
    STATE.matrix_size = None
    STATE.pass_options = {}
    STATE.section_options = {}
    STATE.semantic_label = None


class options:
    """``pypto.options(name, codegen_options=, host_options=, pass_options=, runtime_options=,
    verify_options=, operation_options=, debug_options=, vec_tile_shapes=, cube_tile_shapes=,
    conv_tile_shapes=, matrix_size=)``: a scope of options, as a context manager
    (``with pypto.options(...):``) or a decorator. Every option is checked when the scope is
    made (option_table); on exit the previous tile shapes and options come back."""

    def __init__(self, name: str | None = "", codegen_options=None, host_options=None, pass_options=None,
                 runtime_options=None, verify_options=None, operation_options=None, debug_options=None,
                 vec_tile_shapes=None, cube_tile_shapes=None, conv_tile_shapes=None, matrix_size=None):
        self.name = name
        self.pass_options = check_pass_options(pass_options)
        given = {"codegen": codegen_options, "host": host_options, "runtime": runtime_options,
                 "verify": verify_options, "debug": debug_options, "operation": operation_options}
        self.section_options = {sec: check_options(sec, v) for sec, v in given.items() if v}
        self.vec_tile_shapes = vec_tile_shapes
        self.cube_tile_shapes = cube_tile_shapes
        self.conv_tile_shapes = conv_tile_shapes  # recorded: pypto_lab has no convolution tiling
        self.matrix_size = matrix_size
        self._saved: list = []

    @property
    def others(self) -> dict:
        """The non-pass option sections of this scope ({"runtime_options": {...}, ...})."""
        return {f"{sec}_options": v for sec, v in self.section_options.items()}

    def __enter__(self):
        self._saved.append((STATE.vec_tile, STATE.cube_tile, STATE.cube_tile_raw, STATE.enable_split_k,
                            STATE.matrix_size, dict(STATE.pass_options),
                            {k: dict(v) for k, v in STATE.section_options.items()}))
        STATE.pass_options.update(self.pass_options)
        for sec, v in self.section_options.items():
            STATE.section_options.setdefault(sec, {}).update(v)
        if self.vec_tile_shapes is not None:
            set_vec_tile_shapes(*self.vec_tile_shapes)
        if self.cube_tile_shapes is not None:
            set_cube_tile_shapes(*self.cube_tile_shapes[:3], *(self.cube_tile_shapes[3:4]))
        if self.matrix_size is not None:
            set_matrix_size(self.matrix_size)
        return self

    def __exit__(self, *exc):
        (STATE.vec_tile, STATE.cube_tile, STATE.cube_tile_raw, STATE.enable_split_k, STATE.matrix_size,
         STATE.pass_options, STATE.section_options) = self._saved.pop()
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return wrapper
