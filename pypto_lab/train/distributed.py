"""Data parallel as the seed writes it: ``init_process_group(backend="hccl")`` for simulated cards.

There is one process and no NPU here, so the process group torch builds underneath is a
one-process gloo group (``torch.distributed`` works as usual: torch's own
``DistributedDataParallel`` wraps the model), and the number of cards the step is simulated on
is the *simulated* world size: the ``world_size`` argument, else the ``WORLD_SIZE`` environment
variable (as ``torchrun`` sets it), else 1. `pypto_lab.train.simulate_step` reads it, and reads
the DDP wrapper's bucket size.

The seed writes ``DistributedDataParallel(model, device_ids=[local_rank])``: the NPU the process
drives. Here the module stays on the CPU, for which torch refuses ``device_ids`` (its own rule).
So while the simulated group is up, DDP's constructor takes ``device_ids`` / ``output_device`` for a
CPU module, keeps them as ``simulated_device_ids`` and builds torch's own DDP without them;
everything else (``broadcast_buffers``, ``bucket_cap_mb``, gradient hooks) is torch's.
`destroy_process_group` restores torch's constructor.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch.distributed as dist

BACKENDS = ("hccl", "gloo")
_state: dict[str, int] = {}
_patched: dict[str, object] = {}   # torch functions replaced while the simulated group is up


class DistributedConfigError(ValueError):
    """An argument of the simulated process group outside its rule (rule, value and fix)."""


def init_process_group(backend: str = "hccl", world_size: int | None = None, rank: int = 0,
                       init_method: str | None = None) -> None:
    """Start the simulated HCCL group of ``world_size`` cards (default: ``WORLD_SIZE`` or 1) and a
    one-process gloo group for torch underneath."""
    if backend not in BACKENDS:
        raise DistributedConfigError(f"backend = {backend!r}: the simulated group speaks {', '.join(BACKENDS)}. "
                                     "Fix: init_process_group(backend='hccl')")
    if world_size is None:
        env = os.environ.get("WORLD_SIZE", "1")
        if not env.isdigit() or int(env) < 1:
            raise DistributedConfigError(f"WORLD_SIZE = {env!r}: must be a positive integer (the number of "
                                         "cards). Fix: export WORLD_SIZE=8, or pass world_size=8")
        world_size = int(env)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise DistributedConfigError(f"world_size = {world_size!r}: the number of simulated cards is a positive "
                                     "integer. Fix: world_size=8")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise DistributedConfigError(f"rank = {rank!r}: must lie in 0..{world_size - 1}. Fix: rank=0")
    _accept_npu_device_ids()
    if not dist.is_initialized():
        if init_method is None:
            store_dir = tempfile.mkdtemp(prefix="pypto_lab_pg_")
            atexit.register(shutil.rmtree, store_dir, ignore_errors=True)  # the rendezvous file, gone at exit
            init_method = "file://" + os.path.join(store_dir, "store")
        dist.init_process_group("gloo", init_method=init_method, world_size=1, rank=0)
    _state.update(world_size=world_size, rank=rank)


def _accept_npu_device_ids() -> None:
    """Let torch's DDP take the seed's ``device_ids=[local_rank]`` for a CPU module (see above)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if "ddp_init" in _patched:
        return
    original = DDP.__init__

    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        on_cpu = all(p.device.type == "cpu" for p in module.parameters())
        if on_cpu and (device_ids or output_device is not None):
            self.simulated_device_ids = list(device_ids or [])
            device_ids = output_device = None
        original(self, module, device_ids, output_device, *args, **kwargs)

    _patched["ddp_init"] = original
    DDP.__init__ = __init__


def is_initialized() -> bool:
    return bool(_state)


def get_world_size() -> int:
    """The simulated number of cards (1 before `init_process_group`)."""
    return _state.get("world_size", 1)


def get_rank() -> int:
    return _state.get("rank", 0)


def local_rank() -> int:
    """``LOCAL_RANK`` as torchrun sets it, else the rank."""
    return int(os.environ.get("LOCAL_RANK", get_rank()))


def destroy_process_group() -> None:
    """Forget the simulated group and tear down torch's one-process group."""
    _state.clear()
    if "ddp_init" in _patched:
        from torch.nn.parallel import DistributedDataParallel as DDP

        DDP.__init__ = _patched.pop("ddp_init")
    if dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["DistributedConfigError", "destroy_process_group", "get_rank", "get_world_size", "init_process_group",
           "is_initialized", "local_rank"]
