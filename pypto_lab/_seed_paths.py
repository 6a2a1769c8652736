"""The seed article's import paths: ``import pypto_lab.amp``, ``from pypto_lab.profiler import
profile``, ``from pypto_lab.data import NPUDataLoader``, ... keep working although each module
lives in the folder of its stage (``pypto_lab/precision/amp.py``, ``pypto_lab/tools/profiler.py``).

`install` puts a finder on ``sys.meta_path`` that answers for exactly the names of `SEED_PATHS`:
the alias is the very module object of its real path (one module, two names), imported only when
the alias is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

SEED_PATHS: dict[str, str] = {
    "pypto_lab.amp": "pypto_lab.precision.amp",
    "pypto_lab.quantization": "pypto_lab.precision.quantization",
    "pypto_lab.profiler": "pypto_lab.tools.profiler",
    "pypto_lab.tuning": "pypto_lab.tools.tuning",
    "pypto_lab.debug": "pypto_lab.tools.debug",
    "pypto_lab.nn": "pypto_lab.models.nn",
    "pypto_lab.memory": "pypto_lab.session.memory",
    "pypto_lab.custom_ops": "pypto_lab.lowering.custom_ops",
    "pypto_lab.data": "pypto_lab.train.data",
    "pypto_lab.distributed": "pypto_lab.train.distributed",
}


class SeedPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of `SEED_PATHS` under their seed names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in SEED_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(SEED_PATHS[spec.name])

    def exec_module(self, module) -> None:
        """The real module ran when it was imported under its own name."""


def install() -> None:
    if not any(isinstance(f, SeedPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SeedPathFinder())


__all__ = ["SEED_PATHS", "SeedPathFinder", "install"]
