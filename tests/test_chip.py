"""Chip presets: loading, derived figures, and the errors a broken preset gets."""

import re
from pathlib import Path

import pytest
import tomllib

from pypto_lab.hw import ChipConfigError, get_chip, list_chips, load_chip
from pypto_lab.hw.chip import PRESET_DIR

PRESETS = ["Ascend310P3", "Ascend910A", "Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4"]


def test_list_chips_has_the_six_presets():
    assert list_chips() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_with_all_buffers_and_pipes(name):
    chip = get_chip(name)
    assert chip.name == name
    for buf in ("L1", "L0A", "L0B", "L0C", "UB"):
        assert chip.buffer(buf).size_bytes > 0
    assert chip.data_path("GM_TO_L1").pipe == "MTE2"
    assert chip.data_path("UB_TO_GM").pipe == "MTE3"
    if chip.split_cores:
        assert chip.data_path("L0C_TO_GM").pipe == "FIXP"
        assert {"BT", "FB"} <= set(chip.buffers)
    else:
        assert chip.data_path("L0C_TO_UB").pipe == "VECTOR"
        assert "FB" not in chip.buffers


def test_public_figures():
    a = get_chip("Ascend910A")
    assert a.peak_tflops("fp16") == pytest.approx(262.1, abs=0.1)  # 32 x 4096 x 2 x 1 GHz
    assert a.cube.macs_per_cycle("int8") == 2 * a.cube.macs_per_cycle("fp16")
    assert not a.cube.supports("fp32") and not a.cube.supports("bf16")
    b1 = get_chip("Ascend910B1")
    assert b1.cube.supports("bf16") and b1.cube.fractals["fp32"] == (16, 8, 16)
    assert b1.buffer("L0C").size_bytes == 128 * 1024 and a.buffer("L0C").size_bytes == 256 * 1024


def test_910b2_and_910b4_differ_from_910b1_where_their_sources_say():
    b1, b2, b3, b4 = (get_chip(f"Ascend910B{i}") for i in (1, 2, 3, 4))
    # 910B2: same 24 AIC / 48 AIV and 64 GB as 910B1, its platform config says cube_freq 1800 (910B1: 1850)
    assert (b2.cube_cores, b2.vector_cores, b2.hbm_bytes) == (24, 48, b1.hbm_bytes)
    assert b2.clock_mhz == 1800 and b1.clock_mhz == 1850
    assert b2.peak_tflops("fp16") == pytest.approx(24 * 4096 * 2 * 1.8e9 / 1e12)
    assert "ai_core_cnt=24" in b2.sources["chip.cube_cores"]
    # 910B4: 20 AIC / 40 AIV like 910B3, but 32 GiB HBM, a 96 MiB L2 and a 1500 MHz clock
    assert (b4.cube_cores, b4.vector_cores) == (20, 40) == (b3.cube_cores, b3.vector_cores)
    assert b4.hbm_bytes == 32 * 2**30 and b1.hbm_bytes == 64 * 2**30
    assert b4.l2_bytes == 96 * 2**20 < b1.l2_bytes
    assert b4.clock_mhz == 1500 and b4.hbm_gbps < b1.hbm_gbps
    assert "estimate" in b4.sources["chip.hbm_gbps"]
    # no measurements of their own: the per-cycle pipe constants are carried over, and the sources say so
    assert b2.paths == b1.paths and b4.paths == b3.paths
    assert b2.vector == b1.vector and b4.cube == b3.cube
    assert "Ascend910B2 has no public measurements" in b2.sources["paths.GM_TO_L1.bytes_per_cycle"]
    assert "Ascend910B4 has no public measurements" in b4.sources["cube.startup_cycles"]


def _flatten(prefix, table):
    for key, value in table.items():
        full = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and "value" not in value:
            yield from _flatten(full, value)
        else:
            yield full, value


@pytest.mark.parametrize("name", PRESETS)
def test_every_hand_written_constant_has_a_source(name):
    doc = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text())
    for section in ("chip", "buffers"):
        for key, value in _flatten(section, doc[section]):
            assert isinstance(value, dict) and value.get("source"), f"{name}: {key} has no source"


def test_unknown_chip_lists_the_known_ones():
    with pytest.raises(ChipConfigError, match="Ascend910B1") as exc:
        get_chip("Ascend999")
    assert "unknown chip 'Ascend999'" in str(exc.value)


def _write_variant(tmp_path: Path, edit) -> Path:
    text = (PRESET_DIR / "Ascend910B1.toml").read_text()
    path = tmp_path / "custom.toml"
    path.write_text(edit(text))
    return path


def test_a_copied_preset_with_a_changed_value_loads(tmp_path):
    path = _write_variant(tmp_path, lambda t: t.replace("value = 524288", "value = 1048576", 1))
    chip = get_chip(path)
    assert chip.buffer("L1").size_bytes == 1048576
    assert get_chip("Ascend910B1").buffer("L1").size_bytes == 524288


def test_unknown_key_names_file_key_and_value(tmp_path):
    path = _write_variant(tmp_path, lambda t: t.replace("[chip]\n", "[chip]\nturbo_mode = 3\n", 1))
    with pytest.raises(ChipConfigError) as exc:
        load_chip(path)
    msg = str(exc.value)
    assert str(path) in msg and "chip.turbo_mode" in msg and "3" in msg and "unknown key" in msg


def test_missing_key_is_named(tmp_path):
    path = _write_variant(tmp_path, lambda t: re.sub(r"\nclock_mhz = .*\n", "\n", t, count=1))
    with pytest.raises(ChipConfigError, match=r"chip\.clock_mhz.*missing key"):
        load_chip(path)


def test_negative_size_is_impossible(tmp_path):
    path = _write_variant(tmp_path, lambda t: t.replace("value = 65536", "value = -65536", 1))
    with pytest.raises(ChipConfigError, match=r"buffers\.L0A\.size_bytes.*-65536.*must be > 0"):
        load_chip(path)


def test_zero_clock_is_impossible(tmp_path):
    path = _write_variant(tmp_path, lambda t: t.replace("value = 1850.0", "value = 0.0", 1))
    with pytest.raises(ChipConfigError, match=r"chip\.clock_mhz.*0\.0.*must be > 0"):
        load_chip(path)


def test_wrong_type_and_bad_pipe(tmp_path):
    path = _write_variant(tmp_path, lambda t: t.replace('value = 24, source', 'value = "many", source', 1))
    with pytest.raises(ChipConfigError, match=r"chip\.cube_cores.*must be an integer"):
        load_chip(path)
    path = _write_variant(tmp_path, lambda t: t.replace('pipe = "MTE2"', 'pipe = "WARP"', 1))
    with pytest.raises(ChipConfigError, match=r"pipe.*WARP.*unknown pipe"):
        load_chip(path)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ChipConfigError, match="no such preset file"):
        get_chip(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[chip\n")
    with pytest.raises(ChipConfigError, match="not valid TOML"):
        load_chip(bad)


def test_host_link_is_sourced_optional_and_not_negative(tmp_path):
    chip = get_chip("Ascend910B1")
    assert chip.host_link_gbps == 31.5 and "PCIe 4.0 x16" in chip.sources["chip.host_link_gbps"]
    path = _write_variant(tmp_path, lambda t: t.replace("host_link_gbps = { value = 31.5", "host_link_gbps = { value = -8", 1))
    with pytest.raises(ChipConfigError, match="host_link_gbps"):
        get_chip(path)
    no_link = _write_variant(tmp_path, lambda t: "\n".join(x for x in t.split("\n") if not x.startswith("host_link_gbps")))
    assert get_chip(no_link).host_link_gbps == 0.0
