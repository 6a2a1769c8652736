"""The command line, ``pypto-lab ...`` (also ``python -m pypto_lab.cli``): `main` builds the
parser of every command (`commands.py`: tour, report, simulate, calibrate, atc, ...; `llm.py`: llm,
serve, validate)."""

from .commands import main

__all__ = ["main"]
