"""The HTML report of `pypto-lab tour`, on small models (the full tour runs ResNet-50 and BERT-base)."""

import base64
import os
import re
import stat

import pytest
import torch
from torch import nn

from pypto_lab import ChipConfigError
from pypto_lab.cli import main
from pypto_lab.viz import tour_report
from pypto_lab.viz.tour_report import Walkthrough, level_rows, write_tour_report


class _TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(y.mean(dim=(2, 3)))


def tiny_cnn(batch=1, seq=None):
    torch.manual_seed(0)
    return _TinyCNN().eval(), torch.randn(batch, 3, 16, 16)


def tiny_mlp(batch=1, seq=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 64)).eval()
    return model, torch.randn(batch, seq or 8, 64)


SMALL = [Walkthrough(tiny_cnn, batch=2, title="tiny CNN, batch 2"),
         Walkthrough(tiny_mlp, batch=2, seq=8, title="tiny MLP, batch 2")]


def _pngs(text):
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)]


def test_report_has_the_tables_and_figures_of_every_walkthrough(tmp_path):
    path = tmp_path / "sub" / "tour.html"
    lines = []
    tour = write_tour_report(path, walkthroughs=SMALL, chips=["Ascend910A", "Ascend910B1"], progress=lines.append)
    html = path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["tour.html"]  # written whole, no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # what open(path, "w") would give
    # the chip table lists every preset; each walkthrough has both chips' comparison and pass tables
    for chip in ("Ascend310P3", "Ascend910A", "Ascend910B1", "Ascend910B3"):
        assert f"<td>{chip}</td>" in html
    for title in ("tiny CNN, batch 2", "tiny MLP, batch 2"):
        for chip in ("Ascend910A", "Ascend910B1"):
            assert f"<h3>{title} on {chip}, fp16</h3>" in html
    for header in ("latency us", "kernels", "GM MB", "peak memory MB", "speedup", "energy mJ", "avg W", "TOPS/W",
                   "after pass", "what it did"):
        assert f"<th>{header}</th>" in html
    assert "fuse_conv_bn_relu" in html and "tune_tiling" in html and "schedule" in html
    # the numbers in the tables are the simulator's
    res = tour.results[0]
    for row in level_rows(res.reports["Ascend910B1"]):
        assert f"<td class=num>{row['latency_us']:,.1f}</td>" in html
        assert f"<td class=num>{row['speedup']:.2f}x</td>" in html
        assert f"<td class=num>{row['tops_per_w']:.2f}</td>" in html and row["energy_mj"] > 0
    assert [r.level for r in res.reports["Ascend910A"]] == [0, 1, 2, 3]
    assert level_rows(res.reports["Ascend910A"])[0]["speedup"] == 1.0
    assert res.reports["Ascend910A"][1].kernels != res.reports["Ascend910A"][0].kernels  # fusion did something
    # per walkthrough: a levels figure, then per chip the pass-by-pass and roofline figures (and GM memory)
    pngs = _pngs(html)
    assert len(pngs) == len(tour.figures) >= 2 * (1 + 2 * 2)
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 5_000 for p in pngs)
    assert any("tiny CNN, batch 2 on Ascend910A, fp16" in ln and "level 3" in ln for ln in lines)


def test_tour_command_writes_the_report_and_keeps_its_console_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tour_report, "DEFAULT_WALKTHROUGHS", SMALL[:1])
    path = tmp_path / "tour.html"
    assert main(["tour", "--chips", "Ascend910B1", "--html", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Ascend910B1: fp16 matmul sweep" in out and "4096x4096x4096" in out  # the console tour as before
    assert "tiny CNN, batch 2 on Ascend910B1, fp16" in out and f"wrote {path}" in out
    html = path.read_text()
    assert "<h3>tiny CNN, batch 2 on Ascend910B1, fp16</h3>" in html and "Ascend910A, fp16</h3>" not in html

    other = tmp_path / "none.html"
    assert main(["tour", "--chips", "Ascend910B1", "--no-html", "--html", str(other)]) == 0
    assert not other.exists() and "walkthroughs" not in capsys.readouterr().out


def test_unknown_chip_fails_before_any_model_is_built(tmp_path, capsys):
    called = []

    def never(batch=1, seq=None):
        called.append(1)
        return tiny_cnn(batch)

    assert main(["tour", "--chips", "Ascend999", "--html", str(tmp_path / "t.html")]) == 2
    assert "unknown chip 'Ascend999'" in capsys.readouterr().err
    with pytest.raises(ChipConfigError, match="unknown chip 'Ascend999'"):
        write_tour_report(tmp_path / "t.html", walkthroughs=[Walkthrough(never)], chips=["Ascend999"])
    assert not called and not (tmp_path / "t.html").exists()
