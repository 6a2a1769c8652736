"""The chip model against the measured micro-benchmarks (datasets/calibration/*.csv)."""

import pytest
import tomllib

from pypto_lab.hw import get_chip, list_chips
from pypto_lab.hw.calibration import NotCovered, calibrate, format_calibration, load_microbench, microbench
from pypto_lab.hw.chip import PRESET_DIR


@pytest.fixture(scope="module")
def b1():
    return calibrate(get_chip("Ascend910B1"))


@pytest.fixture(scope="module")
def b3():
    return calibrate(get_chip("Ascend910B3"))


def _keys(result, prefix):
    return {k: v for k, v in result.items() if k.startswith(prefix)}


def test_910b1_mmad_target(b1):
    assert b1["mmad/MMAD/FP16_FP16_FP32"]["rows"] == 63
    assert b1["mmad/MMAD/FP16_FP16_FP32"]["mape"] <= 5.0


def test_910b1_vector_targets(b1):
    vec = _keys(b1, "vector/")
    assert len(vec) >= 150
    for key, e in vec.items():
        assert e["mape"] <= 10.0, (key, e)


def test_910b1_transfer_targets(b1):
    tr = _keys(b1, "transfer_")
    for key in ("transfer_bursts/GM_TO_L1", "transfer_bursts/GM_TO_UB", "transfer_bursts/L1_TO_L0A",
                "transfer_bursts/L1_TO_L0B", "transfer_bursts/L0C_TO_GM", "transfer_bursts/UB_TO_GM",
                "transfer_bursts/UB_TO_UB", "transfer_repeats/GM_TO_L0A", "transfer_repeats/L1_TO_L0A"):
        assert key in tr
    for key, e in tr.items():
        assert e["mape"] <= 15.0, (key, e)


def test_910b1_totals(b1):
    tot = b1["_totals"]
    assert tot["covered"] + tot["not_covered"] + tot["excluded"] == sum(
        1 for r in load_microbench() if r["chip"] == "Ascend910B1")
    assert tot["not_covered_keys"] == {"transfer_bursts/GM_TO_L1_TRANS": 39}
    assert tot["excluded"] == 6  # VMUL INT16 x4, VMULS FP32 x2: failed measurements
    text = format_calibration(b1)
    assert "rows covered:" in text and "vector/VADD/FP16_FP16_FP16" in text


def test_910b3_honest_errors(b3):
    keys = [k for k in b3 if not k.startswith("_")]
    assert "mmad/MMAD/FP16_FP16_FP32" in keys and "transfer_bursts/GM_TO_UB" in keys
    for key in keys:
        assert b3[key]["mape"] <= 15.0, (key, b3[key])


def test_hand_checked_rows():
    chip = get_chip("Ascend910B1")
    # MMAD 32x16x1008: 126 fractals + ~2 cycles start-up -> ~8,067 ops/cycle measured
    assert microbench(chip, "mmad", "MMAD", "FP16_FP16_FP32", m=32, k=16, n=1008) == pytest.approx(8067, rel=0.01)
    # MMAD 32x16x16: 2 fractals; start-up dominates (3,370 measured)
    assert microbench(chip, "mmad", "MMAD", "FP16_FP16_FP32", m=32, k=16, n=16) == pytest.approx(3370, rel=0.25)
    # VADD fp16 plateaus at 128 (bytes of the first operand per cycle: 2 cycles per 256-B repeat)
    assert microbench(chip, "vector", "VADD", "FP16_FP16_FP16", x=23040) == pytest.approx(128, rel=0.01)
    assert microbench(chip, "vector", "VEXP", "FP16_FP16", x=1920) == pytest.approx(65.7, rel=0.02)
    # VECTORDUP rows carry their dtypes in the instruction name
    assert microbench(chip, "vector", "VECTORDUP_FP16_FP16", "", x=1920) == pytest.approx(262, rel=0.02)
    # L1 -> L0A plateau ~437 GB/s at 60 KiB (256 B/cycle at 1.85 GHz)
    assert microbench(chip, "transfer_bursts", "L1_TO_L0A", x=60) == pytest.approx(437.3, rel=0.01)
    # GM -> L1: 1 MiB pays the ~180k-cycle harness cost (9.9 GB/s measured; the key's worst row)
    assert microbench(chip, "transfer_bursts", "GM_TO_L1", x=1) == pytest.approx(9.93, rel=0.2)
    assert microbench(chip, "transfer_bursts", "GM_TO_L1", x=496) == pytest.approx(277.1, rel=0.05)


def test_fitted_rates_are_physical():
    chip = get_chip("Ascend910B1")
    assert chip.data_path("L1_TO_L0A").bytes_per_cycle == pytest.approx(256, rel=0.01)
    assert chip.data_path("L1_TO_L0B").bytes_per_cycle == pytest.approx(128, rel=0.01)
    assert chip.data_path("UB_TO_GM").bytes_per_cycle == pytest.approx(64, rel=0.05)
    assert chip.data_path("L1_TO_FB").bytes_per_cycle == pytest.approx(32, rel=0.01)
    assert 0 <= chip.data_path("GM_TO_L1").startup_cycles < 1000  # harness cost kept out of the pipe
    for name in ("Ascend910A", "Ascend310P3"):
        c = get_chip(name)
        assert set(c.cube.fractals) == {"fp16", "int8"}
        assert c.data_path("L0C_TO_UB").pipe == "VECTOR"


def test_unknown_path_is_not_covered():
    chip = get_chip("Ascend910B1")
    with pytest.raises(NotCovered, match="L1_TO_GM"):
        microbench(chip, "transfer_bursts", "L1_TO_GM", x=1)
    with pytest.raises(KeyError):  # NotCovered is a KeyError
        microbench(chip, "transfer_bursts", "GM_TO_L1_TRANS", x=4)
    with pytest.raises(NotCovered, match="VFOO"):
        microbench(chip, "vector", "VFOO", "FP16_FP16", x=128)
    with pytest.raises(NotCovered, match="bf16"):
        microbench(get_chip("Ascend910A"), "mmad", "MMAD", "BF16_BF16_FP32", m=16, k=16, n=16)


def test_missing_csv_names_path(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_microbench(missing)


def test_fit_check_presets_in_sync(capsys):
    from pypto_lab.hw.fit import main

    assert main(["--check"]) == 0, capsys.readouterr().err


ROUTE_KEYS = {"src", "dst", "pipe"}  # a path's route: identifiers (their source is a comment)


def _leaves_without_source(node, where, out):
    if where.startswith("paths.") and where.rsplit(".", 1)[-1] in ROUTE_KEYS:
        return
    if isinstance(node, dict):
        if "value" in node:
            if not str(node.get("source", "")).strip():
                out.append(where)
            return
        for k, v in node.items():
            _leaves_without_source(v, f"{where}.{k}" if where else k, out)
    else:
        out.append(where)


@pytest.mark.parametrize("name", list_chips())
def test_every_constant_has_a_source(name):
    doc = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text())
    missing = []
    _leaves_without_source(doc, "", missing)
    assert not missing, missing
    chip = get_chip(name)
    for p in chip.paths:
        assert f"paths.{p}.bytes_per_cycle" in chip.sources
        assert f"paths.{p}.startup_cycles" in chip.sources


def test_mask_writing_compares_pay_for_a_partial_block():
    # VCMPVS fp16 writes 16 B of mask per repeat: odd repeat counts end inside a 32-B block
    chip = get_chip("Ascend910B1")
    even = microbench(chip, "vector", "VCMPVS", "FP16_FP16_FP16", x=4 * 128)
    odd = microbench(chip, "vector", "VCMPVS", "FP16_FP16_FP16", x=5 * 128)
    assert even == pytest.approx(254.2, rel=0.05) and odd == pytest.approx(116.1, rel=0.1)


def test_public_microbench_takes_a_chip_name():
    import pypto_lab.hw as hw

    # VADD fp16 plateaus at 128 (bytes of the first operand per cycle) in the CSV
    assert hw.microbench("Ascend910B1", "vector", "VADD", "FP16_FP16_FP16", x=23040) == pytest.approx(128, rel=0.01)
