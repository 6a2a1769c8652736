"""``python -m pypto_lab.run SCRIPT [ARGS...]``: ``pypto-lab run`` (an unmodified torch_npu script on the
simulated card; `pypto_lab.torch_npu_sim.runner`)."""

import sys

from .torch_npu_sim.runner import main

if __name__ == "__main__":
    sys.exit(main())
