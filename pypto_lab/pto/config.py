"""Compile-time configuration of the PyPTO API: the tile shapes in force
(``set_vec_tile_shapes`` / ``set_cube_tile_shapes`` and their getters) and the option scopes
(``pypto.options(...)`` as a context manager or decorator, ``set_pass_options``).

Tile shapes set inside a kernel apply to the operations traced after them; tile shapes set
outside a kernel are the defaults a kernel starts with.
"""

from __future__ import annotations

import functools
import threading

from ..hw.tiling import CubeTile
from .errors import OptionError, TileShapeError

# pass options of the real framework (recorded, not modelled) and the lab's own
REAL_PASS_OPTIONS = ("vec_nbuffer_setting", "cube_l1_reuse_setting", "cube_nbuffer_setting", "sg_set_scope",
                     "auto_mix_partition", "sg_set_ooo_scope", "ooo_sched_mode", "sg_set_tunevf_mode")
LAB_PASS_OPTIONS = ("double_buffer",)  # pypto_lab: False gives every buffer one slot (no ping-pong)
RUNTIME_OPTIONS = ("run_mode", "chip", "device_sched_mode", "stitch_function_max_num", "valid_shape_optimize",
                   "ready_on_host_tensors", "device_sched_parallelism",
                   # the real runtime's control-flow cache sizes: accepted and recorded, not modelled
                   "cfgcache_device_task_num", "cfgcache_root_task_num", "cfgcache_leaf_task_num",
                   "stitch_cfgcache_size")
# host options of the real framework: accepted and recorded. "only_codegen" stops the real one
# after code generation; in SIM mode pypto_lab always compiles, simulates and computes the outputs
HOST_OPTIONS = ("only_codegen", "compile_stage")


class _State(threading.local):
    def __init__(self):
        self.vec_tile: tuple[int, ...] | None = None
        self.cube_tile: CubeTile | None = None
        self.cube_tile_raw = None
        self.enable_split_k = False
        self.matrix_size: list[int] | None = None
        self.pass_options: dict = {}
        self.trace = None  # the TraceContext being recorded, if any


STATE = _State()


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
    opts = dict(opts or {})
    for key in opts:
        if key not in REAL_PASS_OPTIONS + LAB_PASS_OPTIONS:
            raise OptionError(f"pass option {key!r} is not known; known: {', '.join(REAL_PASS_OPTIONS + LAB_PASS_OPTIONS)}"
                              " (the real options are recorded; 'double_buffer' is pypto_lab's switch for ping-pong)")
    return opts


def set_pass_options(**opts) -> None:
    STATE.pass_options.update(check_pass_options(opts))


def get_pass_options() -> dict:
    return dict(STATE.pass_options)


def reset_options() -> None:
    STATE.vec_tile = None
    STATE.cube_tile = None
    STATE.cube_tile_raw = None
    STATE.enable_split_k = False
    STATE.matrix_size = None
    STATE.pass_options = {}


class options:
    """``pypto.options(name=None, pass_options=..., vec_tile_shapes=..., cube_tile_shapes=...)``: a
    scope of options, as a context manager (``with pypto.options(...):``) or a decorator. On exit
    the previous tile shapes and pass options come back."""

    def __init__(self, name: str | None = None, *, pass_options: dict | None = None, vec_tile_shapes=None,
                 cube_tile_shapes=None, **others):
        self.name = name
        self.pass_options = check_pass_options(pass_options)
        self.vec_tile_shapes = vec_tile_shapes
        self.cube_tile_shapes = cube_tile_shapes
        self.others = others  # codegen/host/runtime options: recorded only
        self._saved: list = []

    def __enter__(self):
        self._saved.append((STATE.vec_tile, STATE.cube_tile, STATE.cube_tile_raw, dict(STATE.pass_options)))
        STATE.pass_options.update(self.pass_options)
        if self.vec_tile_shapes is not None:
            set_vec_tile_shapes(*self.vec_tile_shapes)
        if self.cube_tile_shapes is not None:
            set_cube_tile_shapes(*self.cube_tile_shapes[:3])
        return self

    def __exit__(self, *exc):
        STATE.vec_tile, STATE.cube_tile, STATE.cube_tile_raw, STATE.pass_options = self._saved.pop()
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return wrapper
