"""The host's image input pipeline of a CNN training step: torch DataLoader workers decoding JPEGs and
running the training transforms on the host's CPU cores, and the batch's way onto the card.

`ImagePipeline` describes one training process's loader as its script configures it (workers,
whether ``ToTensor`` + ``Normalize`` run in the workers in fp32 or the batch stays uint8 and is
normalised on the NPU, pinned memory) and the host it runs on. `simulate_step(...,
image_pipeline=...)` sets it against the device's step:

* **feed rate**: each worker turns one JPEG into a training crop in ``image_ms`` of one core
  (decode, then RandomResizedCrop's resize to ``crop`` x ``crop``); a process's workers run on at
  most the cores it has (``cores_per_process`` when the script binds each process with ``taskset``,
  else the host's cores shared by the training processes of the server), so one process is fed
  ``min(workers, cores) * 1000 / image_ms`` images per second. A step shorter than the time to
  feed its batch waits for the data (``data_wait_ms``): throughput is min(device, host);
* **the batch's copy**: ``images.to(npu, non_blocking=...)`` is issued on the current stream, so the
  host-to-device copy runs between the previous step's last kernel and the next step's first one,
  stream-ordered, not under compute: ``bytes / host_link_gbps`` (the chip preset's PCIe figure; for
  pageable memory the driver's staging copy through a pinned buffer would come on top, and is left
  out for want of a public figure for the host's memcpy bandwidth: a lower bound);
* **normalisation on the NPU** (the batch left uint8 by a ``fast_collate``): the scripts' ``.to(
  torch.float).sub(mean).div(std)`` is three element-wise kernels over the batch, each reading and
  writing HBM (uint8 -> fp32, then fp32 -> fp32 twice): 21 bytes per element at the chip's HBM
  bandwidth.

The per-image figure is public, not fitted (each constant below carries its source). Its parts:
`PIL_DECODE_MS`, Pillow's one-thread JPEG decode of ImageNet images on an Arm Neoverse-N1 (the Arm
server core closest to the Kunpeng 920's TaiShan v110 in the public benchmarks: both Armv8.2 at
2.6-3.0 GHz), and `RESIZE_MS`, the one-thread bilinear resize of a 600 x 400 image to 224 x 224
that PyTorch measured for "a typical torchvision ImageNet training job" (x86). ``ToTensor`` and
``Normalize`` in the workers (the fp32 path) have no public per-image figure and are left out, so
``image_ms`` is a lower bound of the host's work per image and the feed rate an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

# Pillow, "Pure decode speed with one thread, bytes pre-loaded to memory", ImageNet validation set,
# Neoverse-N1: 360 img/s (github.com/ternaus/imread_benchmark README table; arXiv:2605.08731,
# Iglovikov & Kosarevsky 2026, "Single-Thread JPEG Decoder Benchmarks Mis-Evaluate ML Data Loaders").
# torchvision's ImageFolder decodes with Pillow (its default loader, pil_loader).
PIL_DECODE_MS = 1e3 / 360
# pytorch/pytorch@93b2d991581db86074dd8011fdc903bd554466b1 (PR #86361) commit message: "In a typical
# torchvision ImageNet training job (where num_threads=1 because of DataLoader multi-processing) ...
# (1, 3, 600, 400) -> (224, 224) linear float32 num_threads=1 1.0X 1.0ms vs 1.0ms".
RESIZE_MS = 1.0
IMAGE_MS = PIL_DECODE_MS + RESIZE_MS
# The Atlas 800 training server (model 9000) of the ModelZoo and MindSpore rows: mindspore-ai/models
# @145444c6 official/cv/ResNet/README.md, "Resource | Ascend 910; CPU 2.60GHz, 192cores; Memory 755G;
# OS Euler2.8" (four 48-core Kunpeng 920); ModelZoo-PyTorch's DenseNet-121 8p script binds its eight
# processes to cores 24*i .. 24*i+23 (test/train_performance_8p.sh @ 05360171: taskset -c
# $p_start-$p_end), 8 x 24 = 192.
ATLAS_800_CORES = 192
# Element-wise traffic of the NPU normalisation (uint8 -> fp32 cast, sub, div): read + write bytes
NORMALIZE_BYTES_PER_ELEMENT = (1 + 4) + (4 + 4) + (4 + 4)


@dataclass(frozen=True)
class ImagePipeline:
    """One training process's image loader and the host it runs on (see the module notes).

    ``workers``: the DataLoader's ``num_workers`` in one training process (the scripts that launch
    one process per card divide their ``--workers`` by the cards: ``(workers + n - 1) // n``);
    ``processes``: training processes on the host (one per card); ``cores_per_process``: the cores
    ``taskset`` gives each process (None: the host's cores shared by the processes);
    ``normalize_on_device``: the batch stays uint8 (``fast_collate``) and is normalised on the NPU;
    else ``ToTensor`` + ``Normalize`` run in the workers and an fp32 batch is copied;
    ``pin_memory``: the loader's. ``source``: where the settings were read."""

    workers: int
    processes: int = 1
    host_cores: int = ATLAS_800_CORES
    cores_per_process: int | None = None
    normalize_on_device: bool = False
    pin_memory: bool = True
    crop: int = 224
    image_ms: float = IMAGE_MS
    source: str = ""

    def __post_init__(self):
        if self.workers < 1 or self.processes < 1 or self.host_cores < 1 or self.image_ms <= 0:
            raise ValueError(f"ImagePipeline needs workers, processes and host_cores >= 1 and image_ms > 0: {self}")

    @property
    def cores(self) -> int:
        """Cores the process's workers run on: no more than its workers, nor than its share."""
        share = self.cores_per_process or max(1, self.host_cores // self.processes)
        return min(self.workers, share)

    @property
    def images_per_s(self) -> float:
        return self.cores * 1e3 / self.image_ms

    def feed_ms(self, batch: int) -> float:
        """Host time to produce one batch of ``batch`` images, the workers in parallel."""
        return batch * 1e3 / self.images_per_s

    def batch_bytes(self, batch: int) -> int:
        return batch * 3 * self.crop * self.crop * (1 if self.normalize_on_device else 4)

    def copy_ms(self, chip, batch: int) -> float:
        """The batch's host-to-device copy on the compute stream (bandwidth only)."""
        if chip.host_link_gbps <= 0:
            return 0.0
        return self.batch_bytes(batch) / (chip.host_link_gbps * 1e9) * 1e3

    def normalize_ms(self, chip, batch: int) -> float:
        """The NPU's cast, subtract and divide of a uint8 batch, at HBM bandwidth (0 for fp32 batches)."""
        if not self.normalize_on_device:
            return 0.0
        return batch * 3 * self.crop * self.crop * NORMALIZE_BYTES_PER_ELEMENT / (chip.hbm_gbps * 1e9) * 1e3

    def describe(self) -> str:
        where = (f"{self.cores_per_process} cores (taskset)" if self.cores_per_process
                 else f"{self.host_cores} cores / {self.processes} processes")
        return (f"{self.workers} workers on {where}: {self.images_per_s:,.0f} img/s at {self.image_ms:.2f} ms/img; "
                + ("uint8 batch normalised on the NPU" if self.normalize_on_device else "fp32 batch normalised on the host")
                + (", pinned" if self.pin_memory else ", pageable"))


def apply_image_pipeline(report, pipe: ImagePipeline, chip):
    """Set ``pipe`` against ``report``'s step (in place; returns the report): the copy and the NPU's
    normalisation join each micro-batch's stream, then the step waits for the host when feeding its
    micro-batches takes longer."""
    micro = report.grad_accum
    device_ms = report.step_ms + micro * (pipe.copy_ms(chip, report.batch) + pipe.normalize_ms(chip, report.batch))
    feed_ms = micro * pipe.feed_ms(report.batch)
    report.input_ms = device_ms - report.step_ms
    report.data_wait_ms = max(0.0, feed_ms - device_ms)
    report.step_ms = max(device_ms, feed_ms)
    report.image_pipeline = pipe
    bound = "the host's input pipeline bounds the step" if feed_ms > device_ms else "the device bounds the step"
    report.notes.append(
        f"image input: {pipe.describe()}; feeding a batch of {report.batch} takes {pipe.feed_ms(report.batch):.1f} ms, "
        f"its copy {pipe.copy_ms(chip, report.batch):.1f} ms and NPU normalisation "
        f"{pipe.normalize_ms(chip, report.batch):.1f} ms on the stream: {bound}")
    return report


__all__ = ["ATLAS_800_CORES", "IMAGE_MS", "ImagePipeline", "PIL_DECODE_MS", "RESIZE_MS", "apply_image_pipeline"]
