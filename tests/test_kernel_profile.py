"""Whole kernels measured on a 910B1 (a public msprof profile) against the chip model: the large
GEMMs take the measured time with the L2 read rate its script fits, and streams that read and
write run at the rate the profile measures."""

from __future__ import annotations

import pytest

from pypto_lab.hw.chip import get_chip
from pypto_lab.validation.kernel_profile import LARGE_GEMM_US, compare_gemms, gemm_rows, stream_rows


def test_the_profile_reads_as_the_gemms_and_streams_it_measured():
    shapes = {s.name: s for s in gemm_rows()}
    big = shapes["MatMul 4096x12288x4608"]
    assert (big.batch, big.m, big.k, big.n, big.dtype, big.runs) == (1, 4096, 12288, 4608, "fp16", 2)
    assert big.measured_us == pytest.approx((1478.18 + 1470.9) / 2)
    assert shapes["BatchMatMul 12x1024x512x1024"].batch == 12
    # the Adam update of 78.6 M fp32 parameters: four tensors read, three written
    adam = max((r for r in stream_rows() if r["type"] == "ApplyAdamW"), key=lambda r: r["read_bytes"])
    assert adam["read_bytes"] == 4 * 78643200 * 4 and adam["written_bytes"] == 3 * 78643200 * 4


def test_large_gemms_take_the_time_the_910b1_profile_measures():
    """Measured 0.5-2.1 ms at a MAC ratio of 0.86-0.89; with GE's nominal 110 B/cycle of L2 per core
    the model ran them 6-16 % fast, its Cube never waiting."""
    large = [c for c in compare_gemms() if c.shape.measured_us >= LARGE_GEMM_US]
    assert len(large) == 5
    for c in large:
        assert abs(c.error) < 0.12, (c.shape.name, c.simulated_us, c.shape.measured_us)


def test_the_192_mb_l2_presets_carry_one_l2_read_rate_per_core():
    rates = {name: get_chip(name).l2_gbps * 1e3 / (get_chip(name).cube_cores * get_chip(name).clock_mhz)
             for name in ("Ascend910B1", "Ascend910B2", "Ascend910B3")}
    assert max(rates.values()) - min(rates.values()) < 0.1, rates
    assert 85 < rates["Ascend910B1"] < 100   # below GE's per-core 110 B/cycle: all cores draw at once


def test_a_stream_that_reads_and_writes_runs_at_the_rate_the_profile_measures():
    """RealDiv of 544 M fp16 elements by a scalar: 1.09 GB read and 1.09 GB written, measured at
    1,714.6 us (1.27 TB/s) on the 910B1; the model streamed it at 1.57 TB/s before HBM lost time to
    mixed reads and writes."""
    from pypto_lab.hw.kernels import VectorOp, simulate_vector

    r = simulate_vector(VectorOp(1, 2, (("VMULS", 1),)), 544404480, "fp16", chip="Ascend910B1")
    assert r.time_us == pytest.approx(1714.6, rel=0.07)


def test_hbm_loses_bandwidth_only_to_mixed_reads_and_writes():
    chip = get_chip("Ascend910B1")
    assert chip.hbm_stream_efficiency(1e9, 0) == 1.0 == chip.hbm_stream_efficiency(0, 1e9)
    equal = chip.hbm_stream_efficiency(1e9, 1e9)
    assert equal == pytest.approx(1 - chip.hbm_mixed_loss)
    # a decode step's weights stream in with a sliver of output: next to no loss
    assert chip.hbm_stream_efficiency(1e9, 1e6) > 0.999
    assert equal < chip.hbm_stream_efficiency(2e9, 1e9) < 1.0
    assert get_chip("Ascend310P3").hbm_mixed_loss == 0.0   # LPDDR4X: nothing measured, nothing charged


def test_a_preset_whose_mixed_loss_is_not_a_share_is_refused(tmp_path):
    from pypto_lab.hw.chip import PRESET_DIR, ChipConfigError, load_chip

    text = (PRESET_DIR / "Ascend910B1.toml").read_text()
    path = tmp_path / "bad.toml"
    path.write_text(text.replace("hbm_mixed_loss = { value = 0.215", "hbm_mixed_loss = { value = 1.5"))
    with pytest.raises(ChipConfigError, match=r"hbm_mixed_loss.*1\.5.*below 1"):
        load_chip(path)
