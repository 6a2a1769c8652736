"""The workbench against every published Ascend figure in ``datasets/`` (``pypto-lab validate``):
`suite.py` runs the sets (inference, llm, serving, training) the way each row was measured,
`compare.py` holds a row's comparison and the per-regime, per-stack summary, `inference_rows.py`,
`llm_rows.py` and `training_rows.py` set the rows up, `validate.py` reads the inference rows.
Above the whole path: nothing imports it."""

from .compare import Comparison, FittedConstant, RegimeStats, Summary
from .suite import SETS, check_sets, validate_sets
from .validate import *  # noqa: F403
from .validate import __all__ as _inference_all

__all__ = ["SETS", "Comparison", "FittedConstant", "RegimeStats", "Summary", "check_sets", "validate_sets",
           *_inference_all]
