"""A notice when numba compiles the simulator, so a first run is never a silent wait.

The event simulator and the tile programs are numba functions compiled on first use and cached
in ``NUMBA_CACHE_DIR`` (`make demo` and `make lab` point it at the repository's ``.numba_cache``,
and `make demo`'s tour fills it). On a machine where nothing is cached yet, the first simulation
compiles for tens of seconds. numba announces each compilation as a ``numba:compile`` event
(`numba.core.event`); `CompileNotice` listens, and when a compilation is still running after
``delay`` seconds it prints, once per process, what is happening and that it happens once.
"""

from __future__ import annotations

import sys
import threading

from numba.core import event

MESSAGE = ("pypto_lab: compiling the simulator's numba kernels (once per machine; they are cached in "
           "NUMBA_CACHE_DIR, and `make demo` compiles them ahead): this takes up to a minute ...")


class CompileNotice(event.Listener):
    """Prints `MESSAGE` to ``stream`` (stderr) when a numba compilation lasts longer than
    ``delay`` seconds; at most once."""

    def __init__(self, delay: float = 2.0, stream=None):
        self.delay = delay
        self.stream = stream
        self.depth = 0
        self.said = False
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def on_start(self, ev) -> None:
        with self._lock:
            self.depth += 1
            if self.depth == 1 and not self.said:
                self._timer = threading.Timer(self.delay, self._say)
                self._timer.daemon = True
                self._timer.start()

    def on_end(self, ev) -> None:
        with self._lock:
            self.depth = max(0, self.depth - 1)
            if self.depth == 0 and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _say(self) -> None:
        with self._lock:
            if self.said or self.depth == 0:
                return
            self.said = True
        print(MESSAGE, file=self.stream or sys.stderr, flush=True)


_INSTALLED: CompileNotice | None = None


def install(delay: float = 2.0) -> CompileNotice:
    """Listen to numba's compilations in this process (once)."""
    global _INSTALLED
    if _INSTALLED is None:
        _INSTALLED = CompileNotice(delay)
        event.register("numba:compile", _INSTALLED)
    return _INSTALLED


__all__ = ["CompileNotice", "MESSAGE", "install"]
