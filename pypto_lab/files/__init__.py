"""The workbench's input and output around the user: files written whole or not at all
(`atomic`: every report, trace, cache and model file goes through it), where the shipped data lives
(`paths`), and progress shown while long work runs (`progress`, tqdm bars that a saved notebook keeps
at their last state). The lowest layer: it imports nothing of pypto_lab."""

from .atomic import check_writable, write_bytes_atomic, write_json_atomic, write_text_atomic

__all__ = ["check_writable", "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]
