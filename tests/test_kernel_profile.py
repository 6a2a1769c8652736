"""Whole kernels measured on a 910B1 (a public msprof profile) against the chip model: the large
GEMMs take the measured time, and the preset's L2 read rate is the one its script fits."""

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
        assert abs(c.error) < 0.10, (c.shape.name, c.simulated_us, c.shape.measured_us)


def test_the_192_mb_l2_presets_carry_one_l2_read_rate_per_core():
    rates = {name: get_chip(name).l2_gbps * 1e3 / (get_chip(name).cube_cores * get_chip(name).clock_mhz)
             for name in ("Ascend910B1", "Ascend910B2", "Ascend910B3")}
    assert max(rates.values()) - min(rates.values()) < 0.1, rates
    assert 85 < rates["Ascend910B1"] < 100   # below GE's per-core 110 B/cycle: all cores draw at once
