"""``torch_npu.profiler`` on the simulated card: ``profile`` (with ``schedule``, ``on_trace_ready`` and
``step()``), ``tensorboard_trace_handler``, ``ProfilerActivity``, ``ProfilerAction`` and the
experimental configuration names (``_ExperimentalConfig``, ``ProfilerLevel``, ``AiCMetrics``,
``ExportType``: accepted and recorded; every level records the same simulated kernels).

A profile records the card's kernels and copies from ``start()`` (or the start of a scheduled
``RECORD`` window) to ``stop()``, and answers as the project's profiler does
(`pypto_lab.tools.profiler`: ``key_averages().table(sort_by="npu_time_total")``,
``export_chrome_trace``). ``tensorboard_trace_handler(dir)`` writes what torch_npu's writes where it
writes it: ``dir/<worker>_<time>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json`` and
``kernel_details.csv``.
"""

from __future__ import annotations

import enum
import os
import socket
import time
import types

from ..tools.profiler import ProfilerError
from . import standin
from .report import KERNEL_DETAILS, TRACE, build_profile


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0, skip_first: int = 0):
    """torch.profiler.schedule's steps: skip_first, then cycles of wait, warmup, active (the last active
    step RECORD_AND_SAVE), repeat times (0: forever)."""
    if active <= 0 or wait < 0 or warmup < 0 or repeat < 0 or skip_first < 0:
        raise ProfilerError(f"schedule(wait={wait}, warmup={warmup}, active={active}, repeat={repeat}, "
                            f"skip_first={skip_first}): active must be > 0, the others >= 0")

    def action(step: int) -> ProfilerAction:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        cycle = wait + warmup + active
        if repeat and step // cycle >= repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE
    return action


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None, analyse_flag: bool = True,
                              async_mode: bool = False):
    """Writes each recorded window as torch_npu does (see the module docstring)."""
    def handler(prof) -> None:
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        stamp = time.strftime("%Y%m%d%H%M%S") + f"{prof.saved:03d}"
        out = os.path.join(dir_name, f"{worker}_{stamp}_ascend_pt", "ASCEND_PROFILER_OUTPUT")
        os.makedirs(out, exist_ok=True)
        p = prof._profile()
        p.export_chrome_trace(os.path.join(out, TRACE))
        p.export_kernel_details(os.path.join(out, KERNEL_DETAILS))
        prof.written.append(out)
    return handler


class _Permissive(types.SimpleNamespace):
    """A configuration namespace that names any attribute asked of it (profiler levels, metrics)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return name


class _ExperimentalConfig:
    def __init__(self, **kwargs):
        self.options = dict(kwargs)


def build_module(sim) -> types.ModuleType:
    m = standin._Missing("torch_npu.profiler")
    m.__doc__ = __doc__

    class profile:    # noqa: N801  (torch's name)
        """``torch_npu.profiler.profile`` over the simulated card (see the module docstring)."""

        def __init__(self, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                     profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                     experimental_config=None, use_cuda=None, **kwargs):
            acts = [a.value if isinstance(a, enum.Enum) else a for a in (activities or [ProfilerActivity.CPU,
                                                                                     ProfilerActivity.NPU])]
            self.activities = [("NPU" if str(a).upper() in ("NPU", "CUDA") else "CPU") for a in acts]
            self.schedule = schedule
            self.on_trace_ready = on_trace_ready
            self.record_shapes, self.profile_memory, self.with_stack = record_shapes, profile_memory, with_stack
            self.experimental_config = experimental_config
            self.step_num = 0
            self.saved = 0
            self.written: list[str] = []
            self._window: tuple[int, int] | None = None
            self._open: int | None = None
            self._action = ProfilerAction.RECORD

        # -- lifetime
        def start(self):
            self.step_num = 0
            self._action = self.schedule(0) if self.schedule else ProfilerAction.RECORD
            if self._action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                self._open = len(sim.card.records)
            return self

        def stop(self):
            if self._open is not None:
                self._close()
            return None

        def __enter__(self):
            return self.start()

        def __exit__(self, *exc):
            self.stop()

        def step(self):
            prev = self._action
            self.step_num += 1
            self._action = self.schedule(self.step_num) if self.schedule else ProfilerAction.RECORD
            if prev == ProfilerAction.RECORD_AND_SAVE and self._open is not None:
                self._close()
            if self._action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE) and self._open is None:
                self._open = len(sim.card.records)

        def _close(self):
            self._window = (self._open, len(sim.card.records))
            self._open = None
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)
            self.saved += 1

        # -- results
        def _profile(self):
            lo, hi = self._window if self._window is not None else (self._open or 0, len(sim.card.records))
            return build_profile(sim.card, sim.card.records[lo:hi], record_shapes=True,
                                 profile_memory=self.profile_memory, activities=self.activities,
                                 with_stack=self.with_stack)

        def key_averages(self, group_by_input_shape: bool = False, **kwargs):
            return self._profile().key_averages(group_by_input_shape=group_by_input_shape)

        def events(self):
            return self._profile().events()

        def export_chrome_trace(self, path):
            return self._profile().export_chrome_trace(path)

        def export_kernel_details(self, path):
            return self._profile().export_kernel_details(path)

    m.profile = profile
    m.schedule = schedule
    m.tensorboard_trace_handler = tensorboard_trace_handler
    m.ProfilerActivity = ProfilerActivity
    m.ProfilerAction = ProfilerAction
    m._ExperimentalConfig = _ExperimentalConfig
    for name in ("ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem"):
        setattr(m, name, _Permissive())
    m.supported_activities = lambda: {ProfilerActivity.CPU, ProfilerActivity.NPU}
    return m


__all__ = ["ProfilerAction", "ProfilerActivity", "build_module", "schedule", "tensorboard_trace_handler"]
