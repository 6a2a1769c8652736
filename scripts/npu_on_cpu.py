"""The CPU stand-in for the NPU-only torch API, for ``scripts/run_pypto_example.py --npu-on-cpu`` and
tests/test_pto_models.py: a thin wrapper, the stand-in itself is `pypto_lab.torch_npu_sim.standin`
(its docstring says what it stands in and how). ``pypto-lab run SCRIPT`` builds the timed simulated
card on the same pieces (`pypto_lab.torch_npu_sim.device`)."""

from pypto_lab.torch_npu_sim import standin as _standin
from pypto_lab.torch_npu_sim.standin import *  # noqa: F401,F403
from pypto_lab.torch_npu_sim.standin import (  # noqa: F401  (the names the runner and the tests read)
    FORMAT_CASTS,
    ND,
    NPU_IMPLS,
    NZ,
    NPUGraph,
    NpuOnCpu,
    NzTensor,
    get_npu_format,
    npu_dynamic_quant,
    npu_format_cast,
    npu_quant_matmul,
    npu_quantize,
    npu_swiglu,
)

__doc__ = (__doc__ or "") + "\n\n" + (_standin.__doc__ or "")
