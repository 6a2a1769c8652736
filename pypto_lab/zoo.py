"""Models the command line knows by name, and any importable ``package.module:function``.

A builder returns ``(model, example_inputs)``. Weights are random (torchvision and transformers
build from their configs; nothing is downloaded): the simulator's figures depend on shapes only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch


def resnet50(batch: int = 1, seq: int | None = None):
    import torchvision

    return torchvision.models.resnet50(), (torch.randn(batch, 3, 224, 224),)


def bert_base(batch: int = 1, seq: int | None = 128):
    from transformers import BertConfig, BertModel

    config = BertConfig()
    return BertModel(config), (torch.randint(0, config.vocab_size, (batch, seq or 128)),)


MODELS: dict[str, Callable] = {"resnet50": resnet50, "bert-base": bert_base}


def load_model(spec: str, batch: int = 1, seq: int | None = None):
    """``(model, example_inputs)`` for a known name or a ``package.module:function`` that takes
    ``batch`` (and ``seq`` if it wants it)."""
    if spec in MODELS:
        return MODELS[spec](batch=batch, seq=seq)
    if ":" not in spec:
        raise ValueError(f"unknown model {spec!r}; use one of {', '.join(MODELS)} or 'package.module:function' "
                         "for a function returning (model, example_inputs)")
    module_name, func_name = spec.split(":", 1)
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r}: {exc}; the function must be importable from the current "
                         "environment") from exc
    try:
        result = func(batch=batch, seq=seq)
    except TypeError:
        result = func()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise ValueError(f"{spec} must return (model, example_inputs); it returned {type(result).__name__}")
    model, inputs = result
    return model, inputs if isinstance(inputs, tuple) else (inputs,)
