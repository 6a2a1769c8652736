"""`pypto-lab validate`: whole models against the published Ascend throughput in datasets/published/."""

from __future__ import annotations

import csv

import pytest

from pypto_lab.cli import main
from pypto_lab.validate import ValidationError, published_rows, validate


def test_every_published_row_has_a_model_a_chip_and_a_source():
    rows = published_rows()
    assert len(rows) >= 16
    for r in rows:
        assert r.published > 0 and r.batch >= 1 and r.source and r.chip.startswith("Ascend")
        assert (r.seq is None) != (r.resolution is None)   # a transformer row has a sequence, a CNN a resolution


def test_a_row_is_simulated_at_its_batch_and_compared():
    [row] = [r for r in published_rows() if r.key == "resnet18" and r.batch == 1]
    rep = validate(rows=[row])
    assert row.simulated > 0 and row.error == pytest.approx(row.simulated / row.published - 1)
    assert rep.leave_one_model_out() == {"resnet18": pytest.approx(abs(row.error))}
    assert "resnet18" in rep.table() and "median |error|" in rep.table()


def test_a_row_of_an_unknown_model_names_the_rule(tmp_path):
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "source_repo", "source_path", "chip", "mode", "batch", "seq_len", "resolution",
                    "precision", "throughput_per_s", "latency_ms", "notes"])
        w.writerow(["alexnet", "r", "p", "Ascend310P3", "inference", 1, "", "224x224", "fp16", 100, "", ""])
    with pytest.raises(ValidationError, match="has no builder"):
        published_rows([path])


def test_validate_for_a_chip_without_rows_says_so(capsys):
    assert main(["validate", "--chip", "Ascend910B4", "--quiet"]) == 2
    assert "no published rows" in capsys.readouterr().err
