"""Files are written whole or not at all: write to a temporary file beside the target, then rename.

The file gets the permissions a plain ``open(path, "w")`` would give it: those of the file it
replaces, or for a new file 0666 minus the umask (the temporary file is created with mode 0666
and the operating system applies the umask, so no process-wide umask is read or changed).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file in ``path``'s folder, opened for writing: (fd, its path)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def _regular_file_mode(path: Path) -> int | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` (UTF-8) whole or not at all; returns ``path``. Through a symbolic
    link the file it points to is replaced, as ``open(path, "w")`` would write it."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all; returns ``path`` (as `write_text_atomic`)."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            mode = _regular_file_mode(target)
            if mode is not None:  # keep the mode of the file it replaces
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


__all__ = ["write_bytes_atomic", "write_json_atomic", "write_text_atomic"]
