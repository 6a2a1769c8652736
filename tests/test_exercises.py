"""The exercise checkers (`pypto_lab.course`) and the exercise notebooks built on them.

Each checker must fail a wrong answer with the hardware reason computed from that answer (the
buffer and the bytes it overflows by, the re-read factor, the pipe that bounds the kernel, the
TransData and the rule behind it), pass the reference answer, and report the notebooks' unsolved
starting cells as FAIL or NOT ATTEMPTED without raising. The expected figures are read from the
simulator here too, never written down, so the tests follow the chip model when it changes.
The ``start`` and ``solution`` cells are the very text the notebooks hold
(notebooks/_build/_exercises/).
"""

from __future__ import annotations

import json
import math
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import pypto_lab
import pypto_lab.pto as pypto
from pypto_lab.course import (
    FAIL,
    NOT_ATTEMPTED,
    PASS,
    AvoidTransData,
    BeatTheDefault,
    FastAddRelu,
    FitTheTiles,
    FusedTraffic,
    VectorTiles,
)
from pypto_lab.course.cube import traffic_lines
from pypto_lab.course.verdict import bound_line, busy_fractions
from pypto_lab.hw.tiling import CubeTile, ceil_div

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks" / "_build"))
from _exercises import EXERCISES  # noqa: E402

BY_SLUG = {ex.slug: ex for ex in EXERCISES}


def run_cells(ex, which: str) -> dict:
    """Run an exercise's setup cell (without IPython magics) and its ``start`` or ``solution`` cell."""
    ns: dict = {}
    setup = "\n".join(line for line in ex.setup.splitlines() if not line.startswith("%"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(setup, f"<{ex.slug} setup>", "exec"), ns)
        exec(compile(getattr(ex, which), f"<{ex.slug} {which}>", "exec"), ns)
    return ns


def check_cell(ex, which: str):
    ns = run_cells(ex, which)
    exec(compile(ex.check, f"<{ex.slug} check>", "exec"), ns)
    return ns["verdict"]


# ---- every exercise: the unsolved start is reported, the reference passes ---------------------

@pytest.mark.parametrize("slug", list(BY_SLUG))
def test_the_unsolved_start_is_a_fail_or_not_attempted_never_an_exception(slug, capsys):
    verdict = check_cell(BY_SLUG[slug], "start")
    assert verdict.status in (FAIL, NOT_ATTEMPTED)
    assert str(verdict).strip()
    if verdict.status == NOT_ATTEMPTED:
        assert "NotImplementedError" in str(verdict)


@pytest.mark.parametrize("slug", list(BY_SLUG))
def test_the_reference_answer_passes(slug, capsys):
    verdict = check_cell(BY_SLUG[slug], "solution")
    assert verdict.status == PASS, str(verdict)


def test_there_are_six_exercises_in_course_order():
    assert [ex.number for ex in EXERCISES] == [1, 2, 3, 4, 5, 6]
    assert {"01_fit_the_tiles", "02_beat_the_default", "03_vector_tiles"} <= set(BY_SLUG)


@pytest.mark.parametrize("slug", list(BY_SLUG))
def test_the_notebooks_on_disk_hold_the_start_unsolved_and_the_solution_apart(slug):
    ex = BY_SLUG[slug]
    cells = lambda path: ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]  # noqa: E731
    exercise = cells(ROOT / "notebooks" / "exercises" / f"{slug}.ipynb")
    solution = cells(ROOT / "notebooks" / "exercises" / "solutions" / f"{slug}.ipynb")
    assert ex.start.strip("\n") in exercise
    assert ex.solution.strip("\n") not in exercise
    assert ex.solution.strip("\n") in solution
    assert "What it teaches" in exercise[0] and "How it is checked" in exercise[0]
    assert "Why the reference answer works" not in "".join(exercise)


# ---- 01 fit the tiles ---------------------------------------------------------------------------

FIT = FitTheTiles()


def test_an_overflowing_tiling_names_the_buffer_and_the_bytes_over():
    chip = pypto_lab.get_chip(FIT.chip)
    v = FIT.check(([256, 256], [128, 512], [256, 256]))
    need = 256 * 256 * 4                                   # an fp32 accumulator tile in L0C
    cap = chip.buffer("L0C").size_bytes
    assert v.status == FAIL and "rule 1" in str(v)
    assert v.facts["overflow"] == {"L0C": (need, cap)}
    assert f"L0C overflows by {need - cap:,} bytes" in str(v)


def test_an_l1_overflow_names_l1_and_its_formula():
    chip = pypto_lab.get_chip(FIT.chip)
    v = FIT.check(([128, 512], [64, 512], [128, 512]))
    need = (512 + 512) * 512 * 2
    assert v.facts["overflow"]["L1"] == (need, chip.buffer("L1").size_bytes)
    assert "(m_l1 + n_l1) x k_l1" in str(v)


def test_a_misaligned_tiling_quotes_the_rule_and_a_fix():
    v = FIT.check(([100, 100], [64, 64], [128, 128]))
    assert v.status == FAIL and "multiples of 16" in str(v) and "try m_l0 = 112" in str(v)


def test_one_operand_tile_per_buffer_fails_rule_2_naming_the_buffer():
    v = FIT.check(([256, 256], [128, 256], [128, 128]))   # 256 x 128 fp16 = 64 KB: L0A holds one
    assert v.status == FAIL and v.facts["single_slot"] == "L0A"
    assert "two need 131,072" in str(v)


def test_a_slow_tiling_fails_rule_3_naming_the_busiest_pipe_and_the_target():
    v = FIT.check(([128, 128], [64, 64], [128, 128]))     # level 0's naive tiling
    r = v.report
    assert v.status == FAIL and "rule 3" in str(v)
    busy = busy_fractions(r.pipe_busy, r.cycles)
    assert v.facts["bound"] == max(busy, key=busy.get)
    assert bound_line(busy) in str(v)
    assert f"{r.cycles:,.0f} cycles where the target is {v.facts['target_cycles']:,.0f}" in str(v)
    assert f"Cube utilisation {r.cube_utilization:.1%}" in str(v)


def test_an_l1_block_larger_than_the_l0_tile_shows_its_re_read_factor():
    tile = CubeTile.from_pypto([128, 256], [128, 256], [128, 256])   # 2 x 2 L0 tiles per L1 block
    v = FIT.check(tile)
    r = v.report
    c_bytes = FIT.m * FIT.n * 2
    factor = (r.gm_bytes - c_bytes) / (r.min_gm_bytes - c_bytes)
    assert f"re-reads its operands {factor:.1f}x" in str(v)
    blocked = 2 * FIT.m * FIT.k * 2 * ceil_div(FIT.n, 256)           # A and B once per block column / row
    per_sub_tile = abs((r.gm_bytes - c_bytes) / blocked - 4) <= 0.4
    assert ("for each of its 4 L0 sub-tiles" in str(v)) == per_sub_tile


def _fake_report(gm_bytes, min_gm_bytes):
    return types.SimpleNamespace(gm_bytes=gm_bytes, min_gm_bytes=min_gm_bytes)


def test_the_traffic_lines_blame_the_l0_sub_tiles_only_when_the_excess_matches_them():
    m = k = n = 3072
    tile = CubeTile.from_pypto([128, 256], [128, 256], [128, 256])   # 2 x 2 sub-tiles, 12 K panels
    a = b = c = m * k * 2
    blocked = a * ceil_div(n, 256) + b * ceil_div(m, 256)
    least = a + b + c
    four = traffic_lines(_fake_report(4 * blocked + c, least), tile, m, k, n, "fp16")
    assert any("4 L0 sub-tiles" in line and "make m_l1 = m_l0" in line for line in four)
    once = traffic_lines(_fake_report(blocked + c, least), tile, m, k, n, "fp16")
    assert not any("sub-tiles" in line for line in once)
    odd = traffic_lines(_fake_report(3 * blocked + c, least), tile, m, k, n, "fp16")
    assert any("reads 3.0x that count" in line for line in odd)
    assert not any("sub-tiles" in line for line in odd)


def test_an_answer_that_is_not_a_tiling_is_a_fail_quoting_it():
    v = FIT.check(lambda: "256")
    assert v.status == FAIL and "is not a tiling" in str(v)


# ---- 02 beat the default ------------------------------------------------------------------------

def test_too_few_blocks_are_blamed_on_idle_cores():
    ex = BeatTheDefault(m=512)
    chip = pypto_lab.get_chip(ex.chip)
    v = ex.check(([256, 256], [64, 256], [128, 128]))    # 2 x 8 blocks of C
    r = v.report
    assert r.cores_used < chip.cube_cores
    assert v.status == FAIL
    assert f"only {r.cores_used} of {chip.cube_cores} cores get a block" in str(v)
    assert f"{v.facts['saved']:+.1%} time saved" in str(v)


# ---- 03 vector tiles ----------------------------------------------------------------------------

VEC = VectorTiles()


def test_a_vector_tile_that_overflows_ub_names_the_bytes_and_a_size_that_fits():
    chip = pypto_lab.get_chip(VEC.chip)
    v = VEC.check({"tile": (1, 65536), "double_buffer": True})
    need, cap = 65536 * 2 * VEC.live_tiles, chip.buffer("UB").size_bytes
    assert v.status == FAIL and v.facts["overflow"] == {"UB": (need, cap)}
    assert f"UB overflows by {need - cap:,} bytes" in str(v)
    assert f"at most {cap // (VEC.live_tiles * 2):,} elements" in str(v)


def test_double_buffering_that_does_not_fit_is_reported_as_one_slot():
    v = VEC.check({"tile": (1, 32768), "double_buffer": True})
    assert v.facts["slots"] == 1
    assert v.status == FAIL and "the kernel ran with one slot" in str(v)


def test_a_single_buffered_small_tile_fails_naming_the_slot_and_the_pipes():
    v = VEC.check({"tile": (1, 1024), "double_buffer": False})
    r = v.report
    assert v.status == FAIL and "one UB slot" in str(v)
    assert bound_line(busy_fractions(r.pipe_busy, r.cycles)) in str(v)
    assert f"{r.roofline_cycles / r.cycles:.1%}" in str(v)


# ---- 04 fuse and predict ------------------------------------------------------------------------

FUSE = FusedTraffic()


def test_a_prediction_that_forgets_the_residual_read_is_told_which_tensor_and_how_often():
    act, conv = FUSE.activation_bytes, {lvl: FUSE.conv_alone(lvl) for lvl in (0, 1)}
    v = FUSE.check({"level0": conv[0] + 6 * act, "level1": conv[1]})   # the add reads two tensors, not one
    assert v.status == FAIL
    true0, true1 = FUSE.report(0).gm_bytes, FUSE.report(1).gm_bytes
    text = str(v)
    assert f"{abs(conv[0] + 6 * act - true0) / act:.2f} activations" in text
    assert "reads batch_norm, x (2 x" in text
    assert f"{abs(conv[1] - true1):,.0f} B too few" in text
    assert "the residual x read once" in text


def test_the_fused_kernel_is_the_bare_convolution_plus_what_its_epilogue_reads():
    k = FUSE.conv_kernel(1)
    assert k.spec.epilogue.residual
    assert k.gm_bytes - FUSE.conv_alone(1) == pytest.approx(FUSE.activation_bytes)


def test_a_prediction_that_is_not_a_number_is_a_fail_not_an_exception():
    v = FUSE.check({"level0": "many", "level1": 1})
    assert v.status == FAIL and "write a number of bytes" in str(v)


def test_on_a_chip_with_separate_vector_cores_the_epilogue_round_trip_is_named():
    ex = FusedTraffic(chip="Ascend910B1")
    act = ex.activation_bytes
    v = ex.check({"level0": ex.conv_alone(0) + 7 * act, "level1": ex.conv_alone(1) + act})
    named = "read back and written again by the Vector core" in str(v)
    assert named == ex.conv_kernel(1).spec.epilogue.on_vector
    if named:
        assert v.status == FAIL


# ---- 05 avoid the TransData ---------------------------------------------------------------------

LAYOUT = AvoidTransData()


class StartHead(nn.Module):
    """The shape of exercise 05's starting cell: a reshape and a width of 1000 between the matmuls."""

    def __init__(self, d_model=256, hidden=1000):
        super().__init__()
        self.up = nn.Linear(d_model, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x):
        h = nn.functional.gelu(self.up(x))
        h = h.reshape(-1, h.shape[-1])
        return self.down(self.norm(h)).reshape(x.shape)


def test_the_starting_head_is_told_both_rules_with_its_own_shapes():
    v = LAYOUT.check(StartHead)
    assert v.status == FAIL and len(v.facts["inner"]) == 2
    text = str(v)
    assert "reshape rearranges the tensor ([8, 64, 1000] -> [512, 1000])" in text
    assert "1000 = 16 x 62 + 8" in text


def test_fixing_only_the_width_leaves_the_reshape_named():
    class Wide(StartHead):
        def __init__(self):
            super().__init__(hidden=1024)

    v = LAYOUT.check(Wide)
    assert v.status == FAIL
    assert "reshape rearranges" in str(v) and "16 x 62" not in str(v)


def test_an_nd_only_op_between_the_matmuls_is_named():
    class Soft(StartHead):
        def __init__(self):
            super().__init__(hidden=1024)

        def forward(self, x):
            return self.down(torch.softmax(self.norm(nn.functional.gelu(self.up(x))), dim=-1))

    v = LAYOUT.check(Soft)
    assert v.status == FAIL and "softmax works along the last axis of an ND tensor" in str(v)


def test_dropping_the_layernorm_breaks_the_keep_the_layers_rule():
    class NoNorm(StartHead):
        def forward(self, x):
            return self.down(nn.functional.gelu(self.up(x)))

    v = LAYOUT.check(NoNorm)
    assert v.status == FAIL and "rule 2" in str(v) and "0 LayerNorm" in str(v)


def test_a_head_that_cannot_be_built_is_not_attempted_or_quoted():
    class Todo(nn.Module):
        def __init__(self):
            raise NotImplementedError("your head here")

    class Broken(nn.Module):
        def forward(self, x):
            return x.undefined_method()

    assert LAYOUT.check(Todo).status == NOT_ATTEMPTED
    broken = LAYOUT.check(Broken)
    assert broken.status == FAIL and "AttributeError" in str(broken)


# ---- 06 a fast kernel in pypto ------------------------------------------------------------------

KERNEL = FastAddRelu()


def _add_relu(tile, body=lambda x, y: pypto.relu(x + y), chip="Ascend910B1"):
    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": chip})
    def add_relu(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(*tile)
        out[:] = body(x, y)
    return add_relu


def test_the_slow_kernel_names_its_bound_and_its_tasks_per_core():
    chip = pypto_lab.get_chip(KERNEL.chip)
    v = KERNEL.check(_add_relu((1, 128)))
    run = v.report
    assert v.status == FAIL and "too slow" in str(v)
    busy = busy_fractions(run.pipe_busy_max_core, run.cycles)
    assert v.facts["bound"] == max(busy, key=busy.get)
    tasks = math.ceil(KERNEL.rows / 1) * math.ceil(KERNEL.cols / 128)
    assert f"each core runs {ceil_div(tasks, chip.vector_cores):,} tasks" in str(v)
    assert f"target {KERNEL.target_cycles:,}" in str(v)


def test_a_wrong_kernel_fails_on_correctness_before_speed():
    v = KERNEL.check(_add_relu((8, 1024), body=lambda x, y: x + y))
    assert v.status == FAIL and "correctness" in str(v) and "differ from torch.relu(x + y)" in str(v)


def test_a_kernel_that_leaves_part_of_out_unwritten_says_where():
    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
    def half(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(8, 1024)
        out[0:2048, :] = pypto.relu(x[0:2048, :] + y[0:2048, :])

    v = KERNEL.check(half)
    assert v.status == FAIL and "never written, the first at [2048, 0]" in str(v)


def test_a_tile_that_overflows_ub_passes_on_the_compilers_teaching_error():
    v = KERNEL.check(_add_relu((64, 1024)))
    assert v.status == FAIL and "TileCapacityError" in str(v) and "UB" in str(v)


def test_a_kernel_on_another_chip_or_not_a_kernel_is_a_clear_fail():
    assert "wrong chip" in str(KERNEL.check(_add_relu((8, 1024), chip="Ascend910B3")))
    assert "not a kernel" in str(KERNEL.check(lambda x, y, out: None))
