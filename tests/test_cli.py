"""The pypto-lab command line: what `make demo` runs and what the README shows."""

import json

from pypto_lab.cli import main


def test_tour_prints_chip_summaries_and_the_sweep(capsys):
    assert main(["tour", "--chips", "Ascend910A", "--no-html"]) == 0
    out = capsys.readouterr().out
    for word in ("Ascend910B1", "Ascend310P3", "fp16 TFLOPS", "HBM GB/s", "L1/L0A/L0B/L0C/UB KB"):
        assert word in out
    assert "Ascend910A: fp16 matmul sweep" in out and "4096x4096x4096" in out
    assert "compute" in out and "memory" in out  # the sweep has shapes on both sides of the roofline


def test_matmul_json_is_written_whole(tmp_path, capsys):
    path = tmp_path / "sub" / "mm.json"
    assert main(["matmul", "512", "512", "512", "--chip", "Ascend910B1", "--json", str(path)]) == 0
    d = json.loads(path.read_text())
    assert d["shape"] == {"m": 512, "k": 512, "n": 512, "batch": 1, "epilogue": "none"} and d["cycles"] > 0
    assert [p.name for p in path.parent.iterdir()] == ["mm.json"]  # no temporary file left behind


def test_calibrate_json_has_one_entry_per_family(tmp_path, capsys):
    path = tmp_path / "cal.json"
    assert main(["calibrate", "--chip", "Ascend910B1", "--json", str(path)]) == 0
    d = json.loads(path.read_text())
    assert d["mmad/MMAD/FP16_FP16_FP32"]["rows"] == 63
    assert all(set(v) == {"rows", "mape", "max_ape"} for v in d.values())
    out = capsys.readouterr().out
    assert "mmad/MMAD/FP16_FP16_FP32" in out and "MAPE" in out


def test_bad_input_exits_2_with_the_reason(capsys):
    assert main(["matmul", "64", "64", "64", "--chip", "Ascend999"]) == 2
    assert "unknown chip 'Ascend999'; known chips: Ascend310P3" in capsys.readouterr().err
    assert main(["matmul", "64", "64", "64", "--chip", "Ascend910A", "--dtype", "bf16"]) == 2
    assert "no bf16 fractal" in capsys.readouterr().err


def test_report_and_compare_on_resnet50(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["report", "resnet50", "--chip", "Ascend910A", "--level", "1", "--top", "3", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ResNet on Ascend910A, level 1" in out and "total: 56 kernels" in out
    d = json.loads(path.read_text())
    assert d["kernel_count"] == 56 and d["level"] == 1
    assert main(["compare", "resnet50", "--chip", "Ascend910B1"]) == 0
    out = capsys.readouterr().out
    assert all(f"level {lv}" in out for lv in range(4)) and "peak memory MB" in out
    assert "fuse_conv_bn_relu" in out and "tune_tiling" in out and "schedule" in out and "fused 53" in out


def test_report_names_what_it_cannot_load(capsys):
    assert main(["report", "alexnet9"]) == 2
    assert "unknown model 'alexnet9'" in capsys.readouterr().err
    assert main(["report", "torchvision.models:resnet18"]) == 2
    assert "must return (model, example_inputs)" in capsys.readouterr().err
    assert main(["report", "resnet50", "--level", "4"]) == 2
    assert "level 4 is not known" in capsys.readouterr().err
