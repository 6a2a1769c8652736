"""The host's image input pipeline set against a training step (`pypto_lab.train.host_input`)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pypto_lab.hw.chip import get_chip
from pypto_lab.train import simulate_step
from pypto_lab.train.host_input import ATLAS_800_CORES, IMAGE_MS, ImagePipeline


def _cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def _batch(b=32, hw=32):
    return torch.randn(b, 3, hw, hw), torch.randint(0, 10, (b,))


def test_feed_rate_is_workers_on_the_cores_the_process_has():
    # fewer workers than cores: each worker is one core
    assert ImagePipeline(workers=16, processes=8).cores == 16
    assert ImagePipeline(workers=16, processes=8).images_per_s == pytest.approx(16e3 / IMAGE_MS)
    # more workers than the process's share of the host: the share bounds them
    assert ImagePipeline(workers=64, processes=8).cores == ATLAS_800_CORES // 8
    # taskset binding gives the process its cores
    assert ImagePipeline(workers=40, processes=8, cores_per_process=24).cores == 24
    assert ImagePipeline(workers=10, image_ms=2.0).feed_ms(100) == pytest.approx(20.0)


def test_batch_bytes_copy_and_normalisation_follow_where_the_batch_is_normalised():
    chip = get_chip("Ascend910A")
    fp32 = ImagePipeline(workers=8)
    u8 = ImagePipeline(workers=8, normalize_on_device=True)
    assert fp32.batch_bytes(512) == 4 * u8.batch_bytes(512) == 512 * 3 * 224 * 224 * 4
    assert fp32.copy_ms(chip, 512) == pytest.approx(fp32.batch_bytes(512) / (chip.host_link_gbps * 1e6))
    assert fp32.normalize_ms(chip, 512) == 0.0
    # cast + sub + div over the uint8 batch: 21 bytes of HBM traffic per element
    assert u8.normalize_ms(chip, 512) == pytest.approx(512 * 3 * 224 * 224 * 21 / (chip.hbm_gbps * 1e6))


def test_device_bound_step_gains_only_the_copy_on_the_stream():
    model, batch = _cnn(), _batch()
    base = simulate_step(model, batch, F.cross_entropy, optimizer="sgd", chip="Ascend910A")
    pipe = ImagePipeline(workers=64, crop=32, image_ms=1e-4)   # workers far faster than the step
    rep = simulate_step(model, batch, F.cross_entropy, optimizer="sgd", chip="Ascend910A", image_pipeline=pipe)
    copy = pipe.copy_ms(get_chip("Ascend910A"), 32)
    assert copy > 0 and rep.input_ms == pytest.approx(copy)
    assert rep.data_wait_ms == 0.0
    assert rep.step_ms == pytest.approx(base.step_ms + copy)
    assert "the device bounds the step" in rep.notes[-1]


def test_host_bound_step_waits_for_the_workers():
    model, batch = _cnn(), _batch()
    pipe = ImagePipeline(workers=1, crop=32)          # one core: 32 images x 3.8 ms, far longer than the step
    rep = simulate_step(model, batch, F.cross_entropy, optimizer="sgd", chip="Ascend910A", image_pipeline=pipe)
    assert rep.step_ms == pytest.approx(pipe.feed_ms(32))
    assert rep.data_wait_ms > 0
    assert rep.samples_per_s == pytest.approx(pipe.images_per_s)
    assert "host's input pipeline bounds the step" in rep.notes[-1]


def test_modelzoo_rows_read_their_scripts_workers():
    from pypto_lab.validation.training_rows import IMAGE_PIPELINES

    # 8p scripts pass --workers for the whole server; each of the 8 processes gets (workers + 7) // 8
    assert IMAGE_PIPELINES[("resnet50", 8)].workers == (128 + 7) // 8
    assert IMAGE_PIPELINES[("mobilenet_v2", 8)].workers == (128 + 7) // 8
    assert IMAGE_PIPELINES[("densenet121", 8)].workers == (160 + 7) // 8
    assert IMAGE_PIPELINES[("densenet121", 8)].cores_per_process == 24
    assert not IMAGE_PIPELINES[("resnet50", 1)].normalize_on_device
    assert IMAGE_PIPELINES[("resnet50", 8)].normalize_on_device
