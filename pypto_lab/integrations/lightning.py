"""`AscendSimCallback`: what the step a PyTorch Lightning ``Trainer`` is running would cost on
simulated Ascend cards, logged beside the loss.

On the first training batch of each new shape, the callback costs one step of the module being
trained with `pypto_lab.train.simulate_step` (forward, loss, backward and the optimizer the Trainer
uses, on ``cards`` x ``chip`` at ``precision``) and keeps the report for that shape; on every
step it logs, through ``LightningModule.log`` (so to every logger of the Trainer and to
``trainer.callback_metrics``):

* ``ascend_sim/step_ms``: the simulated step time;
* ``ascend_sim/samples_per_s``: the samples per second it gives (global batch over the step);
* ``ascend_sim/peak_hbm_gb``: the peak HBM per card, in GiB.

When the step would not fit in a card's HBM, `simulate_step` says so (`HBMCapacityError`, with the
largest batch that fits): the callback warns once per shape with that message and logs nothing
for it; training goes on, on the CPU. The loss is the module's own ``training_step`` (its
``self.log`` calls are muted while the step is captured), unless ``loss_fn`` is given: then the
batch is ``(inputs..., target)`` and the step is ``loss_fn(module(*inputs), target)``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from lightning.pytorch import Callback

from ..llm.memory import HBMCapacityError
from ..train.step import TrainReport, simulate_step

_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw"}


class HBMWarning(UserWarning):
    """The simulated step does not fit a card's HBM."""


def _loss_itself(loss, _unused_target):
    return loss


class _TrainingStep(torch.nn.Module):
    """A LightningModule's ``training_step`` as a module: ``forward(*batch)`` is its loss (the
    capture's batch ends with a placeholder target that `_loss_itself` ignores)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        out = self.module.training_step(tuple(args), 0)
        return out["loss"] if isinstance(out, dict) else out


def _signature(batch) -> tuple:
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape), str(batch.dtype))
    if isinstance(batch, (list, tuple)):
        return tuple(_signature(b) for b in batch)
    if isinstance(batch, dict):
        return tuple((k, _signature(v)) for k, v in sorted(batch.items()))
    return (type(batch).__name__,)


class AscendSimCallback(Callback):
    """Cost each step shape on ``cards`` x ``chip`` at ``precision`` and log it (see the module).
    ``optimizer``: "sgd", "adam" or "adamw" (default: the Trainer's first optimizer's kind);
    ``loss_fn``: see the module; other keyword arguments go to `simulate_step` (``amp``, ``tp``,
    ``checkpoint``, ``stack``, ...). ``reports`` maps each batch signature to its `TrainReport`
    (None when it did not fit)."""

    def __init__(self, chip: str = "Ascend910B1", cards: int = 1, precision: str = "fp16", *,
                 optimizer: str | None = None, loss_fn=None, **simulate_kwargs: Any):
        super().__init__()
        self.chip, self.cards, self.precision = chip, cards, precision
        self.optimizer, self.loss_fn, self.simulate_kwargs = optimizer, loss_fn, simulate_kwargs
        self.reports: dict[tuple, TrainReport | None] = {}
        self._current: TrainReport | None = None

    def _optimizer_name(self, trainer) -> str:
        if self.optimizer is not None:
            return self.optimizer
        opts = getattr(trainer, "optimizers", None) or []
        kind = type(opts[0]).__name__ if opts else "AdamW"
        if kind not in _OPTIMIZERS:
            warnings.warn(f"AscendSimCallback: the Trainer's optimizer {kind} is not one simulate_step costs "
                          f"({', '.join(_OPTIMIZERS)}); costing AdamW. Fix: AscendSimCallback(optimizer='sgd'|'adam'|"
                          "'adamw')", stacklevel=2)
        return _OPTIMIZERS.get(kind, "adamw")

    def cost(self, trainer, pl_module, batch) -> TrainReport | None:
        """The report for ``batch``'s shape (costed on first sight, then cached)."""
        key = _signature(batch)
        if key in self.reports:
            return self.reports[key]
        kw = dict(optimizer=self._optimizer_name(trainer), chip=self.chip, cards=self.cards,
                  precision=self.precision, **self.simulate_kwargs)
        try:
            if self.loss_fn is not None:
                report = simulate_step(pl_module, tuple(batch), self.loss_fn, **kw)
            else:
                inputs = tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)
                mute = {name: getattr(pl_module, name) for name in ("log", "log_dict")}
                try:
                    pl_module.log = pl_module.log_dict = lambda *a, **k: None
                    report = simulate_step(_TrainingStep(pl_module), inputs + (torch.zeros(()),), _loss_itself, **kw)
                finally:
                    for name, fn in mute.items():
                        setattr(pl_module, name, fn)
                    for name in mute:      # the bound methods come back from the class
                        pl_module.__dict__.pop(name, None)
        except HBMCapacityError as exc:
            warnings.warn(f"AscendSimCallback: this training step would run out of HBM on {self.cards} x {self.chip} "
                          f"at {self.precision}: {exc}", HBMWarning, stacklevel=2)
            report = None
        self.reports[key] = report
        return report

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        was = pl_module.training
        try:
            self._current = self.cost(trainer, pl_module, batch)
        finally:
            pl_module.train(was)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        r = self._current
        if r is None:
            return
        pl_module.log_dict({"ascend_sim/step_ms": float(r.step_ms), "ascend_sim/samples_per_s": float(r.samples_per_s),
                            "ascend_sim/peak_hbm_gb": r.peak_hbm_bytes / 2**30},
                           on_step=True, on_epoch=False, prog_bar=False, logger=True)


__all__ = ["AscendSimCallback", "HBMWarning"]
