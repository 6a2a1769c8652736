"""Checkers of the exercise notebooks (`notebooks/exercises/`).

Each exercise is a small frozen dataclass holding its problem (chip, shapes, target) with a
``check(answer)`` method: it runs the simulator on the student's attempt and returns a `Verdict`
(PASS, FAIL or NOT ATTEMPTED) whose lines give the hardware reason computed from that attempt:
the buffer that overflows and by how many bytes, the pipe that bounds the kernel, the GM bytes
against the minimum, the TransData the layout pass inserted and why. No figure is written into a
message by hand, so the messages follow the chip model when it changes.

| exercise | class |
|---|---|
| 01 fit the tiles | `FitTheTiles` |
| 02 beat the default | `BeatTheDefault` |
| 03 vector tiles | `VectorTiles` |
| 04 fuse and predict the GM traffic | `FusedTraffic` |
| 05 avoid the TransData | `AvoidTransData` |
| 06 a fast kernel in pypto | `FastAddRelu` |
"""

from .cube import BeatTheDefault, FitTheTiles
from .fusion import FusedTraffic, ResidualBlock
from .layout import AvoidTransData
from .pto_kernel import FastAddRelu
from .vector import VectorTiles
from .verdict import FAIL, NOT_ATTEMPTED, PASS, Verdict

__all__ = ["FAIL", "NOT_ATTEMPTED", "PASS", "AvoidTransData", "BeatTheDefault", "FastAddRelu", "FitTheTiles",
           "FusedTraffic", "ResidualBlock", "Verdict", "VectorTiles"]
