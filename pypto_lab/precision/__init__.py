"""Precision as a user asks for it: `amp` (autocast, `initialize`, loss scaling, the seed's
``pypto.amp``) and `quantization` (int8 layers with the Cube's numerics, calibration, QAT, the
seed's ``pypto.quantization``)."""
