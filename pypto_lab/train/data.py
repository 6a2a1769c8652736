"""The input pipeline of the seed article's training section: `NPUDataLoader(dataset, batch_size,
shuffle, num_workers, pin_memory, prefetch_factor)` and its diagnosis "low NPU utilisation: data not
ready" (fixed with more workers, prefetching and pinned memory).

`NPUDataLoader` is a real loader: iterating it yields exactly the batches of a
`torch.utils.data.DataLoader` built with the same arguments. Around that it measures, on this
machine, how long each ``next()`` waited for its batch (host side), and models what the batch's
host-to-device copy over the card's link would cost:

* pinned memory (``pin_memory=True``): ``bytes / host_link_gbps`` (the chip preset's PCIe figure,
  GB/s per direction, with its source in the preset file);
* pageable memory: the driver first stages the batch through a pinned bounce buffer, so it costs
  one host memory copy more: ``bytes / host_link_gbps + bytes / host memcpy bandwidth``, the
  latter measured once on this machine with numpy (`host_memcpy_gbps`).

No fixed per-copy latency (driver call, DMA set-up) is added: no public source for the Ascend
runtime's figure was found, so the modelled copy time is a bandwidth-only lower bound.

`NPUDataLoader.profile` runs some batches and returns a `LoaderProfile`, whose `starves` and
`advice` compare the time to feed one batch with an NPU step time. With ``pin_memory=True`` and
worker processes (which prefetch), the copy of batch k+1 overlaps the step of batch k, so a batch
costs the longer of the host wait and the copy; otherwise it costs their sum.

Two small training sets ship with the project (made by ``scripts/make_train_datasets.py``):
`image_folder` (an ``ImageFolder`` of 32x32 PNG shapes, 3 classes) and `text_set` (short
sentences in 4 topics, as token-id tensors over a whitespace vocabulary built from the file).
"""

from __future__ import annotations

import csv
import re
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..files.paths import DATASETS_DIR
from ..hw.chip import DEFAULT_CHIP, Chip, get_chip

__all__ = [
    "NPUDataLoader",
    "LoaderProfile",
    "host_memcpy_gbps",
    "batch_bytes",
    "link_copy_ms",
    "image_folder",
    "text_set",
    "text_dataset",
    "TextSet",
    "DATASETS_DIR",
]


_MEMCPY_BYTES = 64 * 1024 * 1024
_MEMCPY_REPEATS = 5
_memcpy_gbps: float | None = None


def host_memcpy_gbps(remeasure: bool = False) -> float:
    """Host memory-copy bandwidth of this machine in GB/s (1e9 bytes/s of data copied), measured once
    per process: copy a 64 MiB array with ``numpy.copyto`` five times (after one warm-up) and take
    the median time."""
    global _memcpy_gbps
    if _memcpy_gbps is None or remeasure:
        src = np.ones(_MEMCPY_BYTES, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # warm-up: page in the destination
        times = []
        for _ in range(_MEMCPY_REPEATS):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        _memcpy_gbps = _MEMCPY_BYTES / float(np.median(times)) / 1e9
    return _memcpy_gbps


def link_copy_ms(chip: Chip, nbytes: int, pinned: bool = True) -> float:
    """Modelled time (ms) of one copy of `nbytes` over ``chip``'s host link, in either direction
    (``host_link_gbps`` is per direction): ``bytes / host_link_gbps``, plus, for pageable host
    memory (``pinned=False``), one host memcpy through the driver's pinned bounce buffer at the
    measured `host_memcpy_gbps`. Bandwidth only: no fixed per-copy latency (see the module notes)."""
    seconds = nbytes / (chip.host_link_gbps * 1e9)
    if not pinned:
        seconds += nbytes / (host_memcpy_gbps() * 1e9)
    return seconds * 1e3


def batch_bytes(batch: Any) -> int:
    """Bytes of every tensor (or numpy array) in a batch: tensors, and lists, tuples and dicts of them."""
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        return sum(batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v) for v in batch)
    return 0


def _batch_len(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict) and batch:
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_len(batch[0])
    return 1


@dataclass(frozen=True)
class LoaderProfile:
    """What `NPUDataLoader.profile` measured (host wait) and modelled (host-to-device copy).

    ``wait_ms_median``/``wait_ms_p90``: wall time ``next()`` waited per batch on this machine;
    ``h2d_ms``: modelled copy time of the median batch (``h2d_ms_pinned``/``h2d_ms_pageable`` give
    both cases); ``samples_per_s``: samples the host can feed per second, i.e. samples per batch over
    the per-batch feed time (`feed_ms`)."""

    batches: int
    batch_size: int
    bytes_per_batch: int
    wait_ms: tuple[float, ...]
    wait_ms_median: float
    wait_ms_p90: float
    h2d_ms: float
    h2d_ms_pinned: float
    h2d_ms_pageable: float
    pinned: bool
    workers: int
    prefetch: int
    chip: str
    host_link_gbps: float
    host_memcpy_gbps: float
    samples_per_s: float

    @property
    def overlapped(self) -> bool:
        """Copies overlap the NPU step: pinned memory and worker processes prefetching batches."""
        return self.pinned and self.workers > 0 and self.prefetch > 0

    @property
    def feed_ms(self) -> float:
        """Time to get one batch onto the card: the longer of host wait and copy when they overlap,
        their sum otherwise."""
        if self.overlapped:
            return max(self.wait_ms_median, self.h2d_ms)
        return self.wait_ms_median + self.h2d_ms

    def starves(self, step_ms: float) -> bool:
        """True when feeding a batch takes longer than the NPU step (`step_ms`, ms) that consumes it."""
        _check_step(step_ms)
        return self.feed_ms > step_ms

    def advice(self, step_ms: float) -> str:
        """One line: where the time goes and what to change."""
        _check_step(step_ms)
        feed = self.feed_ms
        how = "host wait" if self.overlapped else "host wait + copy"
        parts = (
            f"{how} {feed:.3f} ms per batch (wait {self.wait_ms_median:.3f} ms, copy {self.h2d_ms:.3f} ms)"
        )
        if feed > step_ms:
            if self.workers:
                fixes = [f"raise num_workers (now {self.workers}) or prefetch_factor (now {self.prefetch})"]
            else:
                fixes = ["raise num_workers (now 0) and use prefetch_factor (it needs workers)"]
            if not self.pinned:
                fixes.append("set pin_memory=True")
            return (
                f"low NPU utilisation: data not ready — NPU idle {feed - step_ms:.3f} ms of every "
                f"{feed:.3f} ms step ({step_ms:.3f} ms compute; {parts}); {', '.join(fixes)}"
            )
        return (
            f"the NPU is the bottleneck: {parts} fits in the {step_ms:.3f} ms step; "
            f"more workers (now {self.workers}) will not speed training up"
        )


def _check_step(step_ms: float) -> None:
    if not step_ms > 0:
        raise ValueError(
            f"step_ms must be > 0 (NPU time per training step, ms); got {step_ms!r}: pass a positive time"
        )


def _resolve_chip(chip: str | Path | Chip) -> Chip:
    try:
        resolved = get_chip(chip)
    except ValueError as exc:
        raise ValueError(f"chip must be a known chip preset; got {chip!r}: {exc}") from exc
    if resolved.host_link_gbps <= 0:
        raise ValueError(
            f"chip {resolved.name!r} has no host link bandwidth (host_link_gbps = {resolved.host_link_gbps}); "
            f"host-to-device copies cannot be modelled: add host_link_gbps = {{ value = ..., source = '...' }} "
            f"to the [chip] section of its preset ({resolved.path or 'the preset file'}) or pick another chip"
        )
    return resolved


class NPUDataLoader:
    """A `torch.utils.data.DataLoader` that also times its host side and models the copy to the NPU.

    Arguments as torch's (``prefetch_factor`` is passed on only with ``num_workers > 0``, as torch
    requires; torch then defaults it to 2), plus ``chip`` (preset name, path or `Chip`, for its host
    link) and ``seed`` (seeds the shuffle order). Iterating yields torch's batches unchanged; the
    wait of each ``next()`` in ms is kept in `wait_ms` and each batch's size in bytes in
    `batch_nbytes` (both for the latest pass). There is no NPU here, so ``pin_memory`` is modelled
    (its copy rate), not performed: torch pins only when an accelerator exists.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int = 1,
        shuffle: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        chip: str | Path | Chip = DEFAULT_CHIP,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        seed: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"batch_size must be an integer >= 1; got {batch_size!r}: pass batch_size=1 or more"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(
                f"num_workers must be an integer >= 0; got {num_workers!r}: "
                "pass 0 (load in this process) or the number of worker processes"
            )
        if prefetch_factor is not None:
            if num_workers == 0:
                raise ValueError(
                    f"prefetch_factor needs worker processes; got prefetch_factor={prefetch_factor!r} with "
                    "num_workers=0: set num_workers >= 1 or leave prefetch_factor=None"
                )
            if (
                isinstance(prefetch_factor, bool)
                or not isinstance(prefetch_factor, int)
                or prefetch_factor < 1
            ):
                raise ValueError(
                    f"prefetch_factor must be an integer >= 1 (batches each worker loads ahead); "
                    f"got {prefetch_factor!r}: pass 2 (torch's default) or more"
                )
        self.chip = _resolve_chip(chip)
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.num_workers = num_workers
        self.pin_memory = bool(pin_memory)
        self.prefetch_factor = prefetch_factor
        self.drop_last = bool(drop_last)
        self.seed = seed
        kwargs: dict[str, Any] = {
            "batch_size": batch_size,
            "shuffle": self.shuffle,
            "num_workers": num_workers,
            "pin_memory": self.pin_memory,
            "drop_last": self.drop_last,
        }
        if collate_fn is not None:
            kwargs["collate_fn"] = collate_fn
        if num_workers > 0 and prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
        if seed is not None:
            kwargs["generator"] = torch.Generator().manual_seed(seed)
        self.loader = DataLoader(dataset, **kwargs)
        self.wait_ms: list[float] = []
        self.batch_nbytes: list[int] = []

    @property
    def prefetch(self) -> int:
        """Batches each worker loads ahead: 0 without workers, else prefetch_factor (torch's default 2)."""
        if self.num_workers == 0:
            return 0
        return self.prefetch_factor if self.prefetch_factor is not None else 2

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.wait_ms = []
        self.batch_nbytes = []
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            # torch warns that pin_memory is ignored without an accelerator; here pinning is modelled
            warnings.filterwarnings("ignore", message=".*pin_memory.*")
            it = iter(self.loader)
        first_wait = time.perf_counter() - t0  # worker start-up counts towards the first batch
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.wait_ms.append((time.perf_counter() - t0 + first_wait) * 1e3)
            first_wait = 0.0
            self.batch_nbytes.append(batch_bytes(batch))
            yield batch

    def h2d_ms(self, nbytes: int, pinned: bool | None = None) -> float:
        """Modelled host-to-device copy time (ms) of `nbytes` over this chip's host link; pageable
        memory (``pinned=False``) adds one host memcpy into the pinned bounce buffer. `pinned`
        defaults to this loader's ``pin_memory``."""
        return link_copy_ms(self.chip, nbytes, self.pin_memory if pinned is None else pinned)

    def profile(self, batches: int = 20) -> LoaderProfile:
        """Iterate up to `batches` batches and summarise the host wait and the modelled copy."""
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
            raise ValueError(
                f"batches must be an integer >= 1; got {batches!r}: pass how many batches to time"
            )
        samples = 0
        for i, batch in enumerate(self):
            samples += _batch_len(batch)
            if i + 1 >= batches:
                break
        waits = list(self.wait_ms)
        if not waits:
            raise ValueError("the dataset gave no batch to profile: check len(dataset) and drop_last")
        nbytes = int(np.median(self.batch_nbytes))
        pinned_ms, pageable_ms = self.h2d_ms(nbytes, True), self.h2d_ms(nbytes, False)
        prof = LoaderProfile(
            batches=len(waits),
            batch_size=self.batch_size,
            bytes_per_batch=nbytes,
            wait_ms=tuple(waits),
            wait_ms_median=float(np.median(waits)),
            wait_ms_p90=float(np.percentile(waits, 90)),
            h2d_ms=pinned_ms if self.pin_memory else pageable_ms,
            h2d_ms_pinned=pinned_ms,
            h2d_ms_pageable=pageable_ms,
            pinned=self.pin_memory,
            workers=self.num_workers,
            prefetch=self.prefetch,
            chip=self.chip.name,
            host_link_gbps=self.chip.host_link_gbps,
            host_memcpy_gbps=host_memcpy_gbps(),
            samples_per_s=0.0,
        )
        per_batch = samples / len(waits)
        rate = per_batch / (prof.feed_ms / 1e3) if prof.feed_ms > 0 else float("inf")
        return replace(prof, samples_per_s=rate)


# --- the shipped training sets ------------------------------------------------------------------


def image_folder(size: int = 64, root: str | Path | None = None) -> Dataset:
    """``datasets/train_images`` as a torchvision ``ImageFolder``: 3 classes (circle, square,
    stripes) of 32x32 PNGs, resized to ``size`` x ``size`` (1..224) and returned as 3xHxW float
    tensors in [0, 1] with integer class labels."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 224:
        raise ValueError(
            f"size must be an integer in 1..224 (pixels per side); got {size!r}: pass e.g. size=64"
        )
    from torchvision import datasets, transforms

    folder = Path(root) if root is not None else DATASETS_DIR / "train_images"
    if not folder.is_dir():
        raise ValueError(
            f"image folder must exist; got {str(folder)!r}: run scripts/make_train_datasets.py to make it"
        )
    tf = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])
    return datasets.ImageFolder(str(folder), transform=tf)


_TOKEN = re.compile(r"[a-z0-9']+")
PAD, UNK = "<pad>", "<unk>"


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class TextSet(Dataset):
    """Short labelled sentences as ``(token ids, label)``: ids are a LongTensor of length `seq_len`
    (truncated, then padded with id 0 = ``<pad>``; unknown words map to 1 = ``<unk>``) over a
    whitespace vocabulary built from the file itself (sorted, so ids are stable); labels are
    indices into `classes` (sorted label names)."""

    def __init__(self, path: str | Path, seq_len: int = 32) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(
                f"seq_len must be an integer >= 1 (tokens per sample); got {seq_len!r}: pass e.g. 32"
            )
        path = Path(path)
        if not path.is_file():
            raise ValueError(
                f"text set file must exist; got {str(path)!r}: run scripts/make_train_datasets.py to make it"
            )
        with open(path, newline="", encoding="utf-8") as f:
            rows = [(r["text"], r["label"]) for r in csv.DictReader(f)]
        self.seq_len = seq_len
        self.texts = [t for t, _ in rows]
        self.classes = sorted({lab for _, lab in rows})
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        words = sorted({w for t in self.texts for w in _tokens(t)})
        self.vocab = {PAD: 0, UNK: 1, **{w: i + 2 for i, w in enumerate(words)}}
        self.targets = [self.class_to_idx[lab] for _, lab in rows]

    def encode(self, text: str) -> torch.Tensor:
        ids = [self.vocab.get(w, 1) for w in _tokens(text)][: self.seq_len]
        ids += [0] * (self.seq_len - len(ids))
        return torch.tensor(ids, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.encode(self.texts[i]), self.targets[i]


def text_set(seq_len: int = 32, path: str | Path | None = None) -> TextSet:
    """``datasets/train_text/train_text.csv`` as a `TextSet` (4 topics, 320 sentences)."""
    return TextSet(path if path is not None else DATASETS_DIR / "train_text" / "train_text.csv", seq_len)


def text_dataset(tokenizer_max_len: int = 32) -> TextSet:
    """Same as `text_set`, named after the tokenizer's ``max_length``."""
    return text_set(seq_len=tokenizer_max_len)
