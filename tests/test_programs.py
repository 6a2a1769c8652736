"""Tile-program building blocks (pypto_lab.hw.programs) and the timelines of replicated programs."""

import numpy as np
import pytest

from pypto_lab import simulate_matmul
from pypto_lab.hw import get_chip, programs, simulator
from pypto_lab.hw.programs import CubeProgram, mmad_loop
from pypto_lab.hw.simulator import InstructionLimitError, PingPong, Program, simulate
from pypto_lab.hw.tiling import CubeTile, plan_cube


def test_kind_ids_go_past_int16():
    """pto kernels name one kind per tensor and loop iteration: 40,000 of them must simulate."""
    p = Program()
    for i in range(40_000):
        p.emit(0, "VECTOR", 1.0, f"load %{i} GM->UB")
    tl = simulate(p)
    assert tl.kind.dtype == np.int32 and len(tl.kinds) == 40_000
    assert tl.kinds[tl.kind[-1]] == "load %39999 GM->UB" and tl.total_cycles == 40_000


def test_mmad_loop_moves_both_operands_then_runs_one_mmad_per_chunk():
    chip = get_chip("Ascend910B1")
    p = Program()
    load = p.emit(0, "MTE2", 100, "load GM->L1", latency=300)
    l0a, l0b = PingPong(2), PingPong(2)
    mv_a, mv_b, mm = mmad_loop(p, chip, "fp16", 64, 96, 32, 32, load, load, l0a, l0b, None, ("A", "B", "mmad"))
    assert len(p) == 1 + 3 * 3 and [p.kinds[k] for k in p.kind[1:4]] == ["A", "B", "mmad"]
    assert p.deps[mm] == (mv_a, mv_b) and p.deps[1] == (load,)       # the first A waits for the panel
    assert p.duration[mm] == chip.cube.startup_cycles + 4 * 2 * 2      # (64/16) x (32/16) x (32/16) fractals
    # the third chunk reuses the first chunk's L0A slot: it waits for that chunk's mmad
    assert p.deps[7] == (load, 3)
    assert l0a.acquire() == (1, mm - 3)                                 # slot states carried back
    tl = simulate(p)
    assert tl.start[1] == 300 and not tl.overlapping()


def test_a_cube_program_on_a_chip_core_is_its_template_shifted():
    chip = get_chip("Ascend910A")
    tile = CubeTile(64, 128, 64, 128, 64, 128)
    plan = plan_cube(chip, tile, "fp16", 512, 256, 512)
    prog = CubeProgram.for_matmul(chip, plan, "fp16", "fp16", 8.0, 16.0, 4.0)
    blocks = [(128, 128), (128, 64)]
    template = prog.build(blocks, 256)
    p = Program()
    barrier = p.emit(5, "SCALAR", 0.0, "wait for producer stage")
    prog.emit(p, 5, blocks, 256, barrier=barrier)
    assert len(p) == 1 + template.size and set(p.core[1:]) == {5}
    assert p.duration[1:] == template.duration.tolist()
    assert [p.kinds[k] for k in p.kind[1:]] == [template.kinds[k] for k in template.kind]
    gm_loads = [i for i in range(1, len(p)) if p.kinds[p.kind[i]].endswith("GM->L1")]
    assert gm_loads and all(barrier in p.deps[i] for i in gm_loads)


def test_cores_with_the_same_blocks_have_the_same_timeline():
    r = simulate_matmul(4096, 1024, 4096, chip="Ascend910B1")
    tl = r.instructions
    assert tl.simulated < len(tl) == r.instruction_count
    assert len(tl) == tl.core.shape[0] == tl.start.shape[0]
    a, b = tl.start[tl.core == 0], tl.start[tl.core == 1]
    assert a.shape == b.shape and np.array_equal(a, b)
    assert tl.busy[0].tolist() == tl.busy[1].tolist() and not tl.overlapping()
    assert tl.total_cycles == pytest.approx(tl.ready.max())


def test_a_matmul_over_the_instruction_limit_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setattr(programs, "MAX_SIMULATED_INSTRUCTIONS", 1000)
    with pytest.raises(InstructionLimitError, match=r"would simulate [\d,]+ instructions .* over the limit of 1,000 "
                                                    r".*use larger tiles .* or simulate a smaller problem"):
        simulate_matmul(2048, 2048, 2048, tile=CubeTile(64, 64, 64, 64, 64, 64))
    assert issubclass(InstructionLimitError, ValueError)


def test_a_timeline_too_long_to_lay_out_keeps_its_totals(monkeypatch):
    r = simulate_matmul(2048, 2048, 2048, chip="Ascend910B1")
    monkeypatch.setattr(simulator, "MAX_TIMELINE_ROWS", 100)
    tl = r.instructions
    assert tl.total_cycles == r.cycles and tl.pipe_busy()["CUBE"] > 0 and len(tl) > 100
    with pytest.raises(InstructionLimitError, match=r"[\d,]+ instructions .* over the limit of 100 instructions"):
        _ = tl.start
