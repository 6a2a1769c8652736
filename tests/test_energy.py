"""The energy model (`pypto_lab.hw.energy`): the report's energy_mj, avg_power_w and tops_per_w,
the preset's [energy] table and its errors."""

import json
from pathlib import Path

import pytest
import tomllib
import torch
import torch.nn as nn
import torchvision

from pypto_lab import optimize
from pypto_lab.hw.chip import PRESET_DIR, ChipConfigError, get_chip, list_chips, load_chip
from pypto_lab.hw.energy import LEVELS, OP_DTYPES, EnergyModelError, kernel_traffic
from pypto_lab.hw.kernels import VECTOR_DTYPES, simulate_matmul

PRESETS = list_chips()


@pytest.fixture(scope="module")
def resnet50():
    return torchvision.models.resnet50().eval()


@pytest.fixture(scope="module")
def bert_small():
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    return BertModel(config).eval(), torch.randint(0, config.vocab_size, (8, 128))


def test_every_shipped_preset_has_a_sourced_energy_table():
    assert set(OP_DTYPES) == set(VECTOR_DTYPES)
    for name in PRESETS:
        doc = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text())
        chip = get_chip(name)
        assert chip.energy is not None
        for key, value in doc["energy"].items():
            entries = value.items() if "value" not in value else [("", value)]
            for sub, entry in entries:
                assert isinstance(entry, dict) and entry.get("source"), f"{name}: energy.{key}.{sub} has no source"
        assert 0 < chip.energy.static_w < chip.energy.tdp_w
        assert set(chip.cube.fractals) <= set(chip.energy.mac_pj_45nm)
        assert "TDP" in chip.sources["energy.static_w"] and "assumption" in chip.sources["energy.static_w"]
        assert "Horowitz" in doc_comment(name) and "[horowitz]" in chip.sources["energy.mac_pj_45nm.fp16"]


def doc_comment(name):
    return (PRESET_DIR / f"{name}.toml").read_text()


@pytest.mark.parametrize("name", PRESETS)
def test_average_power_stays_under_the_card_tdp(name, resnet50, bert_small):
    """ResNet-50 (batch 8, fp16 and int8) and a small BERT (4 layers, batch 8 x 128 tokens): the
    model's average power is positive and below the card's published TDP on every chip."""
    x = torch.randn(8, 3, 224, 224)
    bert, ids = bert_small
    reports = [optimize(resnet50, x, chip=name, level=3, precision=p).report() for p in ("fp16", "int8")]
    reports.append(optimize(bert, (ids,), chip=name, level=3).report())
    tdp = get_chip(name).energy.tdp_w
    for rep in reports:
        assert 0 < rep.avg_power_w <= tdp, (rep.model, rep.precision, rep.avg_power_w, tdp)
        assert rep.energy_mj > 0 and rep.tops_per_w > 0
        e = rep.energy()
        assert e.energy_mj == pytest.approx(e.dynamic_mj + e.static_mj)
        assert e.avg_power_w == pytest.approx(rep.energy_mj / rep.latency_us * 1e3)
        assert rep.tops_per_w == pytest.approx(2 * e.macs / (rep.energy_mj * 1e-3) / 1e12)


def test_int8_uses_less_energy_than_fp16_and_energy_grows_with_batch(resnet50):
    for chip in ("Ascend310P3", "Ascend910B1"):
        fp16 = optimize(resnet50, torch.randn(1, 3, 224, 224), chip=chip, level=3, precision="fp16").report()
        int8 = optimize(resnet50, torch.randn(1, 3, 224, 224), chip=chip, level=3, precision="int8").report()
        many = optimize(resnet50, torch.randn(4, 3, 224, 224), chip=chip, level=3, precision="fp16").report()
        assert int8.energy_mj < fp16.energy_mj
        assert int8.tops_per_w > fp16.tops_per_w
        assert many.energy_mj > fp16.energy_mj
        # per sample, a batch amortises the weights' DRAM traffic and the static power of small kernels
        assert many.energy_mj / 4 < fp16.energy_mj
        # ResNet-50 is ~4.1 GMACs per image, all on the Cube
        assert fp16.energy().macs == pytest.approx(4.1e9, rel=0.05)


def test_report_dict_table_and_per_kernel_counts():
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    rep = optimize(model, torch.randn(64, 256), chip="Ascend910B1", level=1).report()
    d = rep.to_dict()
    json.dumps(d)
    assert d["energy_mj"] == pytest.approx(rep.energy_mj) and d["avg_power_w"] == pytest.approx(rep.avg_power_w)
    assert d["tops_per_w"] == pytest.approx(rep.tops_per_w)
    assert set(d["energy"]["level_mj"]) == set(LEVELS)
    assert "energy:" in rep.table() and "TOPS/W" in rep.table() and "TDP 400 W" in rep.table()
    # the Cube MACs counted are the model's: 64 x 256 x 512 + 64 x 512 x 256
    assert rep.energy().macs == 2 * 64 * 256 * 512

    r = simulate_matmul(512, 512, 512, dtype="fp16", chip="Ascend910B1")
    t = kernel_traffic(r)
    assert t.macs == 512 ** 3
    assert t.bytes["L2"] == r.gm_bytes and r.min_gm_bytes <= t.bytes["DRAM"] <= r.gm_bytes
    assert t.bytes["L0"] > t.bytes["L1"] > 0   # the Cube's operand reads happen in L0


def _variant(tmp_path: Path, edit, name="Ascend910B1") -> Path:
    text = (PRESET_DIR / f"{name}.toml").read_text()
    path = tmp_path / "custom.toml"
    path.write_text(edit(text))
    return path


def test_a_negative_energy_constant_names_the_rule_the_value_and_a_fix(tmp_path):
    path = _variant(tmp_path, lambda t: t.replace("dram_pj_per_byte = { value = 31.2", "dram_pj_per_byte = { value = -31.2"))
    with pytest.raises(ChipConfigError) as exc:
        load_chip(path)
    msg = str(exc.value)
    assert "energy.dram_pj_per_byte" in msg and "-31.2" in msg
    assert "an energy or power must be > 0" in msg and "fix: copy the [energy] table of a shipped preset" in msg


def test_a_missing_energy_constant_names_the_rule_and_a_fix(tmp_path):
    path = _variant(tmp_path, lambda t: "\n".join(line for line in t.splitlines() if not line.startswith("int8 = { value = 0.3")))
    with pytest.raises(ChipConfigError, match=r"energy\.mac_pj_45nm\.int8.*missing key: every Cube dtype needs its "
                                              r"energy per MAC.*fix: add it"):
        load_chip(path)
    path = _variant(tmp_path, lambda t: t.replace("static_w = { value = 80.0", "static_w = { value = 450.0"))
    with pytest.raises(ChipConfigError, match=r"energy\.static_w.*450\.0.*static power must be below the card TDP"
                                              r".*fix"):
        load_chip(path)


def test_a_preset_without_an_energy_table_costs_time_but_not_energy(tmp_path):
    def drop_energy(text):
        start = text.index("# Energy model")
        return text[:start] + text[text.index("# ---- fitted: begin"):]

    path = _variant(tmp_path, drop_energy)
    chip = load_chip(path)
    assert chip.energy is None and chip.fingerprint == get_chip("Ascend910B1").fingerprint
    rep = optimize(nn.Sequential(nn.Linear(64, 64)), torch.randn(8, 64), chip=path, level=1).report()
    assert rep.latency_us > 0 and rep.to_dict()["energy_mj"] is None and "energy:" not in rep.table()
    with pytest.raises(EnergyModelError, match=r"needs the preset's \[energy\] table \(rule: .*fix: copy the \[energy\]"):
        _ = rep.energy_mj
