"""Design-space sweeps (`sweeps.py`): `optimize` over models x chip variants x batches x levels on
Dask, one row per design point, with Pareto fronts. Above the whole path: nothing imports it."""

from .sweeps import *  # noqa: F403
from .sweeps import __all__  # noqa: F401
