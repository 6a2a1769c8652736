"""`pypto-lab validate`: whole models against the published Ascend throughput in datasets/published/."""

from __future__ import annotations

import csv

import pytest

from pypto_lab.cli import main
from pypto_lab.validation.validate import ValidationError, published_rows, validate


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


def _row(key="roberta-base", batch=1, published=205.0, source="Ascend/ModelZoo-PyTorch/ACL_PyTorch/x"):
    from pypto_lab.validation.validate import Row
    return Row(model=key, key=key, chip="Ascend310P3", batch=batch, seq=70, resolution=None, published=published,
               source=source, notes="")


def test_published_rows_too_far_apart_for_one_figure_are_flagged():
    from pypto_lab.validation.validate import conflicting_rows
    atc, aie = _row(published=205.0), _row(published=356.0, source="Ascend/ModelZoo-PyTorch/AscendIE/TorchAIE/x")
    # no x has |x/205 - 1| <= 0.15 and |x/356 - 1| <= 0.15: 356/205 = 1.74 > 1.15/0.85 = 1.35
    assert conflicting_rows([atc, aie]) == [(atc, aie)]
    # 3,940 and 4,250 (ResNet-50 b64 from two READMEs) can both be met: 4,250/3,940 = 1.08
    assert conflicting_rows([_row(published=3940.0), _row(published=4250.0)]) == []
    # a different batch is a different workload, not a conflict
    assert conflicting_rows([atc, _row(batch=16, published=1027.0)]) == []
    with pytest.raises(ValidationError, match="strictly between 0 and 1"):
        conflicting_rows([atc, aie], tolerance=1.5)


def test_the_shipped_published_set_holds_rows_no_simulator_can_all_meet():
    from pypto_lab.validation.validate import conflicting_rows
    pairs = {(a.key, a.batch) for a, b in conflicting_rows(published_rows())}
    assert {("roberta-base", 1), ("albert-base-v2", 1)} <= pairs
