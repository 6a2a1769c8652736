"""Files written whole or not at all (`atomic`): every report, trace, cache and model file the
workbench writes goes through here. The lowest layer: it imports nothing of pypto_lab."""

from .atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

__all__ = ["write_bytes_atomic", "write_json_atomic", "write_text_atomic"]
