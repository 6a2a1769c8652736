"""A DeepSpeed configuration (the ``--deepspeed ds_config.json`` of a training script) as the options
of `simulate_step`.

`read_deepspeed_config(config)` takes the JSON (a path, a JSON string or a dict) and returns the
options it sets: ``zero`` (``zero_optimization.stage``), the precision (``fp16.enabled`` /
``bf16.enabled``), ``micro_batches`` (``gradient_accumulation_steps``, or what
``train_batch_size`` / ``train_micro_batch_size_per_gpu`` and the data-parallel size give), the
gradient bucket (``reduce_bucket_size`` elements in the gradients' dtype; DeepSpeed's default
5e8) and whether gradients are reduced during the backward (``overlap_comm``). Values written
``"auto"`` (filled in by the HF Trainer from its own arguments) come from ``trainer``: a dict with
``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``fp16`` / ``bf16``.

Offloading the optimizer or parameters to the host (``offload_optimizer``, ``offload_param``) is
not modelled: such a configuration is refused, naming the key. Activation checkpointing is the
script's choice (HF's ``gradient_checkpointing_enable``, Megatron-DeepSpeed's
``--checkpoint-activations``), not the JSON's: pass ``recompute="full"`` with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .step import TrainConfigError

DEFAULT_REDUCE_BUCKET = 5e8   # elements (deepspeed/runtime/zero/config.py: ZERO_OPTIMIZATION reduce_bucket_size)


class DeepSpeedConfigError(TrainConfigError):
    """A DeepSpeed configuration that cannot be simulated: the message names the key and a fix."""


def _load(config) -> dict:
    if isinstance(config, dict):
        return config
    text = str(config)
    path = Path(text) if not text.lstrip().startswith("{") else None
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise DeepSpeedConfigError(f"DeepSpeed config {path}: cannot be read ({e.strerror}). Fix: the path of "
                                       "the ds_config.json the script passes") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(f"DeepSpeed config: not JSON ({e.msg} at line {e.lineno}). Fix: the JSON file "
                                   "DeepSpeed reads") from None
    if not isinstance(doc, dict):
        raise DeepSpeedConfigError("DeepSpeed config: the top level must be a JSON object. Fix: {\"zero_optimization\": "
                                   "{\"stage\": 2}, ...}")
    return doc


def _value(doc: dict, key: str, trainer: dict, trainer_key: str, default: Any) -> Any:
    v = doc.get(key, default)
    if v == "auto":
        if trainer_key not in trainer:
            raise DeepSpeedConfigError(f"{key} is \"auto\" (the HF Trainer fills it in). Fix: pass trainer="
                                       f"{{'{trainer_key}': ...}} with the script's value")
        return trainer[trainer_key]
    return v


def read_deepspeed_config(config, dp: int | None = None, trainer: dict | None = None) -> dict[str, Any]:
    """The `simulate_step` options a DeepSpeed configuration sets (see the module docstring);
    ``dp`` the data-parallel size (to derive the micro-batches from ``train_batch_size``)."""
    doc = _load(config)
    trainer = dict(trainer or {})
    zero = doc.get("zero_optimization", {}) or {}
    if not isinstance(zero, dict):
        raise DeepSpeedConfigError(f"zero_optimization = {zero!r}: an object. Fix: {{\"stage\": 2}}")
    for key in ("offload_optimizer", "offload_param", "cpu_offload"):
        v = zero.get(key)
        device = v.get("device") if isinstance(v, dict) else v
        if device not in (None, False, "none"):
            raise DeepSpeedConfigError(f"zero_optimization.{key} = {v!r}: offloading to the host is not modelled. "
                                       f"Fix: remove {key} (or set its device to \"none\")")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise DeepSpeedConfigError(f"zero_optimization.stage = {stage!r}: 0, 1, 2 or 3. Fix: \"stage\": 2")
    fp16 = doc.get("fp16", {}) or {}
    bf16 = doc.get("bf16", {}) or doc.get("bfloat16", {}) or {}
    on16 = fp16.get("enabled", False)
    onbf = bf16.get("enabled", False)
    if on16 == "auto":
        on16 = bool(trainer.get("fp16", False))
    if onbf == "auto":
        onbf = bool(trainer.get("bf16", False))
    precision = "bf16" if onbf else ("fp16" if on16 else "fp32")
    opts: dict[str, Any] = {"zero": stage or None, "precision": precision, "amp": None if precision == "fp32" else "O2"}
    micro = _value(doc, "train_micro_batch_size_per_gpu", trainer, "per_device_train_batch_size", None)
    accum = _value(doc, "gradient_accumulation_steps", trainer, "gradient_accumulation_steps", None)
    total = _value(doc, "train_batch_size", trainer, "train_batch_size", None)
    if accum is None and total is not None and micro is not None and dp:
        if total % (micro * dp):
            raise DeepSpeedConfigError(f"train_batch_size {total} is not micro-batch {micro} x data-parallel {dp} x "
                                       "gradient_accumulation_steps. Fix: a multiple of micro x dp")
        accum = total // (micro * dp)
    if accum is not None:
        opts["micro_batches"] = int(accum)
    if micro is not None:
        opts["micro_batch_size"] = int(micro)
    bucket = float(zero.get("reduce_bucket_size", DEFAULT_REDUCE_BUCKET))
    grad_bytes = 4 if precision == "fp32" else 2
    # stage 0 all-reduces the gradients after the backward (DeepSpeed's engine.allreduce_gradients);
    # ZeRO-1/2/3 reduce them in buckets of reduce_bucket_size elements, during it with overlap_comm
    opts["overlap_grad_reduce"] = bool(zero.get("overlap_comm", stage == 3)) if stage else False
    opts["bucket_mb"] = bucket * grad_bytes / 2 ** 20 if stage else 1e9
    return opts


__all__ = ["DEFAULT_REDUCE_BUCKET", "DeepSpeedConfigError", "read_deepspeed_config"]
