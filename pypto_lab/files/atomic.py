"""Files are written whole or not at all: write to a temporary file beside the target, then rename.

The file gets the permissions a plain ``open(path, "w")`` would give it: those of the file it
replaces, or for a new file 0666 minus the umask (the temporary file is created with mode 0666
and the operating system applies the umask, so no process-wide umask is read or changed).

A write killed midway (SIGKILL, a power cut) cannot run its own clean-up and leaves its
temporary file, ``.<name>.<8 hex>.tmp``, beside the target. Each write holds an exclusive
``flock`` on its temporary file until it is renamed, and the next write to the same target
removes every such file no live writer holds, so a killed write costs its disk space only until
then. `check_writable` says, before any long work, whether an output path can be written.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:   # pragma: no cover - not on Windows: leftovers are then not cleaned up
    fcntl = None


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names the path, why, and a fix."""


def _temp_pattern(target: Path) -> re.Pattern:
    return re.compile(rf"^\.{re.escape(target.name)}\.[0-9a-f]{{8}}\.tmp$")


def _lock(fd: int, block: bool = False) -> bool:
    """Take the exclusive lock on ``fd``: True if taken (always without fcntl)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        return True
    except OSError:
        return False


def remove_stale_temps(target: str | Path) -> list[Path]:
    """Remove the temporary files of earlier writes to ``target`` that no live writer holds (their
    writer was killed before it could rename or remove them); returns those removed."""
    if fcntl is None:
        return []
    target = Path(target)
    pattern = _temp_pattern(target)
    removed = []
    try:
        names = [n for n in os.listdir(target.parent) if pattern.match(n)]
    except OSError:
        return []
    for name in names:
        tmp = target.parent / name
        try:
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            if _lock(fd) and os.fstat(fd).st_nlink > 0:   # no writer holds it: its writer is gone
                os.unlink(tmp)
                removed.append(tmp)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file in ``path``'s folder, opened for writing and locked: (fd, path).
    The lock marks the write as alive (`remove_stale_temps` leaves it alone) until the fd closes."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        _lock(fd, block=True)
        if os.fstat(fd).st_nlink == 0:   # a clean-up removed it between open and lock: another name
            os.close(fd)
            continue
        return fd, tmp


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
    """Write ``data`` to ``path`` whole or not at all; returns ``path`` (as `write_text_atomic`).
    Temporary files that killed writes to the same target left behind are removed first."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    fd, tmp = _create_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            mode = _regular_file_mode(target)
            if mode is not None:  # keep the mode of the file it replaces
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.replace(tmp, target)   # renamed while still locked: never taken for a leftover
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def unwritable_reason(path: str | Path) -> str | None:
    """Why ``path`` cannot be written as a file (a folder, under a file, in a folder this user cannot
    write), or None when it can: checked before the work that produces it."""
    path = Path(path)
    if path.is_dir():
        return "is a folder, not a file"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the folders that would be created
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, so no folder can be made there"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"permission denied (cannot write into {folder})"
    try:   # what the permission bits do not tell: a read-only mount, /proc, a full quota
        fd, probe = _create_beside(folder / path.name)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write into {folder} ({exc.strerror or exc})"
    return None


def check_writable(path: str | Path | None, flag: str | None = None, example: str = "out/result.json") -> None:
    """Raise `OutputPathError` if ``path`` cannot be written (see `unwritable_reason`); ``flag``
    words the message for the command line (``--json out/r.json: is a folder ...``)."""
    if not path:
        return
    why = unwritable_reason(path)
    if why is None:
        return
    if flag:
        raise OutputPathError(f"{flag} {path}: {why}; give a file path you can write, e.g. {flag} {example}")
    raise OutputPathError(f"{path}: {why}. Fix: give a file path you can write, e.g. {example!r}")


__all__ = ["OutputPathError", "check_writable", "remove_stale_temps", "unwritable_reason", "write_bytes_atomic",
           "write_json_atomic", "write_text_atomic"]
