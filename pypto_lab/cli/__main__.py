"""``python -m pypto_lab.cli``: the ``pypto-lab`` command."""

import sys

from .commands import main

sys.exit(main())
