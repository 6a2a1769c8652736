"""`AscendSimCallback` in a real Lightning `Trainer`: a small model trained 3 steps on the CPU logs
the simulated step time, samples/s and peak HBM per card, equal to `simulate_step`'s; a step that
cannot fit a card's HBM is a warning, not a crash."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from pypto_lab.hw.chip import get_chip  # noqa: E402
from pypto_lab.integrations.lightning import AscendSimCallback, HBMWarning  # noqa: E402
from pypto_lab.train import simulate_step  # noqa: E402


class Net(pl.LightningModule):
    def __init__(self, width=256):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Remember(pl.loggers.logger.Logger):
    """An in-memory logger: what the Trainer's loggers receive."""

    def __init__(self):
        super().__init__()
        self.rows = []

    name = "remember"
    version = "0"

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def _loader(n=96, batch=32):
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=batch)


def _trainer(cb, logger):
    return pl.Trainer(max_steps=3, callbacks=[cb], logger=logger, accelerator="cpu", devices=1, log_every_n_steps=1,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def test_the_callback_logs_the_simulated_step_to_the_trainers_loggers():
    torch.manual_seed(0)
    model, log = Net(), Remember()
    cb = AscendSimCallback(chip="Ascend910B1", cards=1, precision="fp16")
    _trainer(cb, log).fit(model, _loader())
    rows = [m for _, m in log.rows if "ascend_sim/step_ms" in m]
    assert len(rows) == 3 and len(cb.reports) == 1                 # costed once, logged every step
    x, y = next(iter(_loader()))
    ref = simulate_step(Net(), (x, y), torch.nn.functional.cross_entropy, optimizer="adamw", chip="Ascend910B1",
                        cards=1, precision="fp16")
    r = rows[-1]
    assert r["ascend_sim/step_ms"] == pytest.approx(ref.step_ms, rel=0.02)
    assert r["ascend_sim/samples_per_s"] == pytest.approx(32e3 / r["ascend_sim/step_ms"], rel=1e-6)
    assert r["ascend_sim/peak_hbm_gb"] == pytest.approx(ref.peak_hbm_bytes / 2**30, rel=0.02)
    assert any("train_loss" in m for _, m in log.rows)             # the module's own logging still works


def test_a_step_that_cannot_fit_the_card_is_a_warning():
    tiny = dataclasses.replace(get_chip("Ascend910B1"), hbm_bytes=2 * 2**20)     # a 2 MiB card
    model, log = Net(width=2048), Remember()
    cb = AscendSimCallback(chip=tiny, cards=1, precision="fp16")
    with pytest.warns(HBMWarning, match="run out of HBM"):
        _trainer(cb, log).fit(model, _loader())
    assert list(cb.reports.values()) == [None]
    assert not [m for _, m in log.rows if "ascend_sim/step_ms" in m]
