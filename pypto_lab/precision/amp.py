"""Automatic mixed precision as in the seed article's ``pypto.amp`` (section 4.2): `autocast`,
`initialize(model, optimizer, opt_level)` and dynamic loss scaling (`GradScaler`, `scale_loss`).

O1 semantics (the seed's and apex's): ops on the fp16 list (matmul, linear, convolutions, bmm,
attention) run in fp16; ops on the fp32 list (softmax, the norms, sums and means, exp/log, the
losses) run in fp32; everything else runs in the dtype its inputs have. On the CPU this is done
by a ``TorchFunctionMode`` that casts the floating arguments of the listed ops (torch's own CPU
autocast keeps softmax in fp16, which the seed advises against). Inside `autocast`,
`pypto_lab.optimize` lowers to the autocast dtype when no precision is given; the fp32 list is
what the `mixed_precision` pass keeps in fp32 on the simulated chip.

O2: the model's weights are cast to fp16 except the norm layers (kept fp32, computing in fp32);
floating inputs are cast to fp16 and floating outputs back to fp32 (so the loss is fp32); the
optimizer updates fp32 master copies of the weights (`AmpOptimizer`: fp16 grads are copied into
the fp32 masters, unscaled, the inner optimizer steps, the masters are copied back to fp16).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..passes.mixed_precision import FP32_KEPT

# ops computed in the low precision (the Cube's work)
FP16_OPS: tuple[str, ...] = (
    "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "mv",
    "einsum", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "scaled_dot_product_attention", "prelu", "bilinear",
)
# ops whose arithmetic stays fp32 (the numerically sensitive ones); a superset of what the
# `mixed_precision` pass keeps in fp32 on the simulated chip
FP32_OPS: tuple[str, ...] = tuple(sorted(set(FP32_KEPT) | {
    "softmax", "log_softmax", "softmin", "layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm",
    "local_response_norm", "normalize", "norm", "sum", "mean", "var", "std", "var_mean", "std_mean", "cumsum",
    "cumprod", "prod", "exp", "expm1", "log", "log1p", "log2", "log10", "pow", "reciprocal", "rsqrt",
    "logsumexp", "softplus", "erfinv", "acos", "asin", "cosh", "sinh", "tan", "dist", "cdist", "renorm",
    "cosine_similarity", "pdist", "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
    "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss",
    "gaussian_nll_loss", "cosine_embedding_loss", "hinge_embedding_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "multi_margin_loss", "triplet_margin_loss", "ctc_loss",
}))
_FP16_SET, _FP32_SET = frozenset(FP16_OPS), frozenset(FP32_OPS)
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
OPT_LEVELS = ("O0", "O1", "O2")
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm)
if hasattr(nn, "RMSNorm"):
    NORM_LAYERS = (*NORM_LAYERS, nn.RMSNorm)
_LOW = (torch.float16, torch.bfloat16, torch.float32)


class AmpError(ValueError):
    """Bad arguments to pypto_lab.amp: the message names the value, the rule and a fix."""


def _cast(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype in _LOW and obj.dtype != dtype else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast(o, dtype) for o in obj) if not hasattr(obj, "_fields") else obj
    if isinstance(obj, dict):
        items = {k: _cast(v, dtype) for k, v in obj.items()}
        try:
            return type(obj)(**items) if type(obj) is not dict else items   # keeps e.g. ModelOutput
        except TypeError:
            return items
    return obj


class _CastMode(TorchFunctionMode):
    """Casts the floating arguments of the fp16-list ops to the low dtype, of the fp32-list ops to fp32."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        low = _STACK[-1] if _STACK else None    # the innermost autocast decides (None: disabled)
        if low is not None and not (torch.compiler.is_exporting() or torch.compiler.is_compiling()):
            name = getattr(func, "__name__", "")
            if name in _FP16_SET:
                args, kwargs = _cast(args, low), _cast(kwargs, low)
            elif name in _FP32_SET:
                args, kwargs = _cast(args, torch.float32), _cast(kwargs, torch.float32)
        return func(*args, **kwargs)


_STACK: list[torch.dtype | None] = []   # innermost autocast last; None: disabled


def autocast_precision(model: nn.Module | None = None) -> str | None:
    """The precision `pypto_lab.optimize` uses when none is given: the innermost active
    `autocast`'s ("fp16"/"bf16"), else that of a model from `initialize` at O1/O2, else None."""
    if _STACK:
        return DTYPES[_STACK[-1]] if _STACK[-1] is not None else None
    cfg = getattr(model, "_pypto_amp", None)
    if isinstance(cfg, AmpConfig) and cfg.opt_level != "O0":
        return DTYPES[cfg.dtype]
    return None


@contextlib.contextmanager
def autocast(enabled: bool = True, dtype: torch.dtype = torch.float16):
    """Run the fp16 list in ``dtype`` and the fp32 list in fp32 (see `FP16_OPS`, `FP32_OPS`);
    `pypto_lab.optimize` inside it defaults to ``dtype``. ``enabled=False`` turns an outer one off."""
    if dtype not in DTYPES:
        raise AmpError(f"autocast dtype {dtype!r} is not a low precision: use torch.float16 or torch.bfloat16")
    if not isinstance(enabled, bool):
        raise AmpError(f"enabled={enabled!r}: pass True or False")
    _STACK.append(dtype if enabled else None)
    try:
        if enabled:
            with _CastMode(dtype):
                yield
        else:
            yield
    finally:
        _STACK.pop()


def is_autocast_enabled() -> bool:
    return bool(_STACK) and _STACK[-1] is not None


# ---- dynamic loss scaling ----------------------------------------------------------------------


class GradScaler:
    """Dynamic loss scaling: multiply the loss by ``scale`` before backward; before the step,
    divide the grads by it; if any grad is inf/NaN skip the step and multiply the scale by
    ``backoff_factor``; after ``growth_interval`` clean steps in a row multiply it by ``growth_factor``."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        checks = [("init_scale", init_scale, init_scale > 0, "a number > 0, e.g. 2**16"),
                  ("growth_factor", growth_factor, growth_factor > 1, "a number > 1, e.g. 2"),
                  ("backoff_factor", backoff_factor, 0 < backoff_factor < 1, "a number in (0, 1), e.g. 0.5")]
        for name, value, ok, want in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
                raise AmpError(f"GradScaler {name}={value!r}: must be {want}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise AmpError(f"GradScaler growth_interval={growth_interval!r}: must be an integer >= 1, e.g. 2000")
        self.scale_value = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = growth_interval
        self.enabled = enabled
        self.clean_steps = 0          # steps without inf/NaN since the last change of scale
        self.skipped_steps = 0
        self._found_inf: dict[int, bool] = {}

    def get_scale(self) -> float:
        return self.scale_value if self.enabled else 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.get_scale() if self.enabled else loss

    def unscale_(self, optimizer) -> bool:
        """Divide ``optimizer``'s grads by the scale (an `AmpOptimizer` does it into its fp32
        masters); returns whether an inf/NaN was found. Once per step."""
        key = id(optimizer)
        if key in self._found_inf:
            return self._found_inf[key]
        inv = 1.0 / self.get_scale()
        if isinstance(optimizer, AmpOptimizer):
            found = optimizer._grads_to_masters(inv)
        else:
            found = False
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.mul_(inv)
                            found = found or not bool(torch.isfinite(p.grad).all())
        self._found_inf[key] = found
        return found

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step()`` unless the (unscaled) grads hold inf/NaN; then the step is skipped."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        if self.unscale_(optimizer):
            self.skipped_steps += 1
            if isinstance(optimizer, AmpOptimizer):
                optimizer._grads_ready = False
            return None
        return optimizer.step(*args, **kwargs)

    def update(self) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps."""
        if not self.enabled:
            return
        if any(self._found_inf.values()):
            self.scale_value *= self.backoff_factor
            self.clean_steps = 0
        elif self._found_inf:
            self.clean_steps += 1
            if self.clean_steps >= self.growth_interval:
                self.scale_value *= self.growth_factor
                self.clean_steps = 0
        self._found_inf.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale_value, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "clean_steps": self.clean_steps,
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale_value = float(state["scale"])
        self.clean_steps = int(state.get("clean_steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))


# ---- initialize: O0 / O1 / O2 ------------------------------------------------------------------


@dataclass(frozen=True)
class AmpConfig:
    """What `initialize` did, attached to the model as ``model._pypto_amp``."""

    opt_level: str
    dtype: torch.dtype
    fp16_ops: tuple[str, ...] = FP16_OPS
    fp32_ops: tuple[str, ...] = FP32_OPS
    master_weights: bool = False


class AmpOptimizer:
    """Wraps an optimizer so that it updates fp32 master weights (O2) and cooperates with loss
    scaling; at O0/O1 the masters are the model's own fp32 parameters."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: GradScaler):
        self.optimizer = optimizer
        self.scaler = scaler
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []   # (model param, fp32 master)
        for group in optimizer.param_groups:
            masters = []
            for p in group["params"]:
                master = p if p.dtype == torch.float32 else p.detach().float().requires_grad_(p.requires_grad)
                self.pairs.append((p, master))
                masters.append(master)
            group["params"] = masters
        self._grads_ready = False
        self._skip = False
        self.skipped_steps = 0

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def master_params(self) -> list[torch.Tensor]:
        return [m for _, m in self.pairs]

    @torch.no_grad()
    def _grads_to_masters(self, inv_scale: float) -> bool:
        """fp32 master grads = model grads (fp16) in fp32 times ``inv_scale``; True on inf/NaN."""
        found = False
        for p, m in self.pairs:
            if p.grad is None:
                m.grad = None
                continue
            g = p.grad.float() * inv_scale
            found = found or not bool(torch.isfinite(g).all())
            m.grad = g
        self._grads_ready = True
        return found

    def step(self, closure=None):
        if self._skip:   # scale_loss found an overflow
            self._skip = False
            self._grads_ready = False
            self.skipped_steps += 1
            return None
        if not self._grads_ready:
            self._grads_to_masters(1.0)
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        with torch.no_grad():
            for p, m in self.pairs:
                if p is not m:
                    p.copy_(m)
        self._grads_ready = False
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, m in self.pairs:
            for t in {id(p): p, id(m): m}.values():
                if t.grad is not None:
                    if set_to_none:
                        t.grad = None
                    else:
                        t.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])


def _wrap_forward(module: nn.Module, wrapper) -> None:
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return wrapper(inner, *args, **kwargs)

    module.forward = forward


def _norm_in_fp32(inner, *args, **kwargs):
    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    out = inner(*_cast(args, torch.float32), **_cast(kwargs, torch.float32))
    return out.to(x.dtype) if x is not None and x.is_floating_point() and isinstance(out, torch.Tensor) else out


def initialize(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, opt_level: str = "O1",
               dtype: torch.dtype = torch.float16, loss_scale: float | str = "dynamic"):
    """Prepare ``model`` and ``optimizer`` for mixed precision; returns ``(model, optimizer)``
    (``optimizer`` an `AmpOptimizer` holding a `GradScaler` as ``.scaler``; just ``model`` if
    no optimizer is given).

    * O0: fp32, nothing changes (a baseline);
    * O1: weights untouched; the model's forward runs under `autocast` (fp16 list in fp16, fp32 list in fp32);
    * O2: weights cast to ``dtype`` except norm layers (fp32, computing in fp32), inputs cast to
      ``dtype``, outputs to fp32, fp32 master weights in the optimizer.

    ``loss_scale``: "dynamic" (a `GradScaler` with its defaults) or a fixed number."""
    if opt_level not in OPT_LEVELS:
        raise AmpError(f"opt_level {opt_level!r} is not known; choose one of {', '.join(OPT_LEVELS)} "
                       "(O0 fp32, O1 autocast lists, O2 fp16 weights with fp32 masters)")
    if dtype not in DTYPES:
        raise AmpError(f"dtype {dtype!r} is not a low precision: use torch.float16 or torch.bfloat16")
    if not isinstance(model, nn.Module):
        raise AmpError(f"initialize needs a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, "_pypto_amp", None) is not None:
        raise AmpError(f"this model was already initialised at {model._pypto_amp.opt_level}; call initialize "
                       "once, on the fp32 model")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise AmpError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if loss_scale == "dynamic":
        scaler = GradScaler(enabled=opt_level != "O0")
    elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool) and loss_scale > 0:
        scaler = GradScaler(init_scale=float(loss_scale), growth_interval=2**62, enabled=opt_level != "O0")
        scaler.backoff_factor = 1.0   # a fixed scale: overflowing steps are skipped, the scale stays
    else:
        raise AmpError(f"loss_scale {loss_scale!r}: pass 'dynamic' or a number > 0, e.g. 128.0")
    if opt_level == "O1":
        _wrap_forward(model, lambda inner, *a, **k: _under_autocast(inner, dtype, *a, **k))
    elif opt_level == "O2":
        norms = [m for m in model.modules() if isinstance(m, NORM_LAYERS)]
        keep = {id(p) for m in norms for p in m.parameters(recurse=False)}
        keep |= {id(b) for m in norms for b in m.buffers(recurse=False)}
        for m in model.modules():
            for p in list(m.parameters(recurse=False)):
                if p.is_floating_point() and id(p) not in keep:
                    p.data = p.data.to(dtype)
            for name, b in list(m.named_buffers(recurse=False)):
                if b is not None and b.is_floating_point() and id(b) not in keep:
                    setattr(m, name, b.to(dtype))
        for m in norms:
            _wrap_forward(m, _norm_in_fp32)
        _wrap_forward(model, lambda inner, *a, **k: _cast(inner(*_cast(a, dtype), **_cast(k, dtype)), torch.float32))
    object.__setattr__(model, "_pypto_amp", AmpConfig(opt_level, dtype, master_weights=opt_level == "O2"))
    if optimizer is None:
        return model
    return model, AmpOptimizer(optimizer, scaler)


def _under_autocast(inner, dtype, *args, **kwargs):
    with autocast(dtype=dtype):
        return inner(*args, **kwargs)


@contextlib.contextmanager
def scale_loss(loss: torch.Tensor, optimizer: AmpOptimizer):
    """``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``: backward runs on
    the scaled loss; on exit the grads are unscaled into the fp32 masters and, on inf/NaN, the
    next ``optimizer.step()`` is skipped and the scale backs off."""
    if not isinstance(optimizer, AmpOptimizer):
        raise AmpError(f"scale_loss needs the optimizer returned by amp.initialize, got "
                       f"{type(optimizer).__name__}; call model, optimizer = amp.initialize(model, optimizer)")
    scaler = optimizer.scaler
    yield scaler.scale(loss)
    if scaler.unscale_(optimizer):
        optimizer._skip = True
        scaler.skipped_steps += 1
    scaler.update()


__all__ = ["AmpConfig", "AmpError", "AmpOptimizer", "FP16_OPS", "FP32_OPS", "GradScaler", "OPT_LEVELS",
           "autocast", "autocast_precision", "initialize", "is_autocast_enabled", "scale_loss"]
