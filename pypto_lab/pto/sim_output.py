"""The output folder of a SIM-mode run, where the real framework puts it.

In SIM mode the real framework's launcher (``framework/src/cost_model/simulation/
cost_model_launcher.h``: ``RunModel`` -> ``RunDynCostModel``) runs its cost model after every
kernel launch, and the cost model writes the swimlane of the run, a Chrome trace
(``{"traceEvents": [...]}``, chrome://tracing or Perfetto), to
``<top folder>/CostModelSimulationOutput/merged_swimlane.json``. No option turns this on: it is
what a SIM run does.

The top folder is made once per process (``config_manager.cpp``: ``CreateLogTopFolder``), as
``<base>/output_<YYYYmmdd_HHMMSS>_<microseconds>_<pid>_<host>``, where ``<base>`` is
``$TILE_FWK_OUTPUT_DIR`` if set, else ``$ASCEND_WORK_PATH/pypto``, else ``output`` under the
current working directory. Later runs in the same process write into the same folder, so the
file holds the last run. pypto_lab does the same with ``kernel.last_run.chrome_trace()`` (written
atomically); ``kernel.last_run.swimlane_path`` says where. A run of more than `MAX_EVENTS`
instructions (a long loop's simulated waves: millions) writes the instructions that start before
the cycle at which `MAX_EVENTS` have started, and says so in ``otherData["truncated"]``; the whole
trace is ``kernel.last_run.chrome_trace()``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from ..files.atomic import write_text_atomic

SWIMLANE = ("CostModelSimulationOutput", "merged_swimlane.json")
MAX_EVENTS = 200_000   # about 40 MB of JSON

_top: dict[str, Path] = {}   # resolved base folder -> this process's top folder under it


def output_base() -> Path:
    """``$TILE_FWK_OUTPUT_DIR``, else ``$ASCEND_WORK_PATH/pypto``, else ``./output``."""
    env = os.environ.get("TILE_FWK_OUTPUT_DIR")
    if env:
        return Path(env)
    work = os.environ.get("ASCEND_WORK_PATH")
    if work:
        return Path(work) / "pypto"
    return Path("output")


def top_folder() -> Path:
    """This process's output folder under `output_base` (made on first use)."""
    base = output_base().resolve()
    key = f"{base}:{os.getpid()}"
    folder = _top.get(key)
    if folder is None or not folder.is_dir():
        now = time.time()
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now)) + f"_{int(now * 1e6) % 1000000:06d}"
        folder = base / f"output_{stamp}_{os.getpid()}_{socket.gethostname() or 'unknown-host'}"
        folder.mkdir(parents=True, exist_ok=True)
        _top[key] = folder
    return folder


_last: dict = {}   # the run whose trace the file holds: a cached call's run is the same object


def write_swimlane(run) -> str:
    """Write ``run``'s Chrome trace as the cost model's merged_swimlane.json; returns its path.

    A cached call of the same kernel on the same signature (and the same loop trip counts) gives
    the same `RunResult` object, whose trace the file already holds: it is not written again (the
    file's content would be byte for byte the same), so repeated calls do not pay for it."""
    path = top_folder().joinpath(*SWIMLANE)
    if _last.get("run") is run and _last.get("path") == path and path.is_file():
        return str(path)
    out = str(write_text_atomic(path, json.dumps(run.chrome_trace(MAX_EVENTS))))
    _last.update(run=run, path=path)
    return out
