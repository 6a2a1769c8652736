"""The workbench against published Ascend figures (`validate.py`: whole-model inference
throughput, ``pypto-lab validate``). Above the whole path: nothing imports it."""

from .validate import *  # noqa: F403
from .validate import __all__  # noqa: F401
