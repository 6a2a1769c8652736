"""The workbench inside other frameworks' training loops: `lightning.AscendSimCallback` costs the
step a PyTorch Lightning `Trainer` runs on a simulated Ascend card (needs ``pip install lightning``,
or the ``lightning`` extra)."""
