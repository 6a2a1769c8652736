"""One gate for model descriptions and the engine's arguments: every way a model reaches the LLM
engine, serving and training (a known name, a ``config.json``, a dict, a transformers config, a
module's ``.config``, an `LLMSpec`) passes the rules here before anything is costed.

* `check_config(cfg)`: a config in Hugging Face ``config.json`` form, one rule per key (`KEY_RULES`:
  positive integers, fractions, epsilons) and the rules between keys (`RELATIONS`: attention heads
  divide the hidden size, KV heads divide the heads, top-k within the experts and their groups,
  dense layers within the layers). Errors name the key as the config spells it.
* `check_spec(spec)`: the same rules on an `LLMSpec`'s own fields (for a spec built by hand).
* `check_count`, `check_real`: the entry points' numeric arguments (a bool is not a count).
* `check_positions`: a request longer than the model's positions, refused the same way by
  `simulate_generation` and by serving (`ContextLengthError`).

Every error is a `FieldError`: ``field``, ``value``, ``rule`` and ``fixes`` (values that would be
accepted, each with an optional note), so the message reads ``field = value: rule. Fix: field=...``
in Python, and the command line can say the same with its own flags (`FieldError.cli_message`).
This module imports nothing else of pypto_lab, so every layer that needs a rule can use it.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

# ---- errors ------------------------------------------------------------------------------------


def _py(v: Any) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "float('inf')"
    return repr(v)


def _cli(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:g}"
    return str(v)


_ARG = re.compile(r"\{(\w+)=([^{}]*)\}")


def render(template: str, flags: dict[str, str] | None = None) -> str:
    """A message whose ``{name=value}`` placeholders (arguments the user can change) read as Python
    (``name=value``) or, with ``flags`` mapping argument names to options, as a command line
    (``--flag value``; strings unquoted, ``float('inf')`` as ``inf``)."""
    def sub(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        flag = (flags or {}).get(name)
        if flag is None:
            return f"{name}={value}"
        v = "inf" if value == "float('inf')" else value.strip("'\"")
        return f"{flag} {v}"
    return _ARG.sub(sub, template)


def hinted(cls: type[Exception], template: str) -> Exception:
    """An exception of ``cls`` whose message is ``template`` rendered for Python (see `render`); the
    command line renders ``exc.template`` with its own flags."""
    exc = cls(render(template))
    exc.template = template
    return exc


def cli_text(exc: BaseException, flags: dict[str, str]) -> str:
    """``exc``'s message for the command line: a `FieldError` on an argument the command has a flag
    for, or a `hinted` message, in CLI syntax; anything else as it is."""
    field = getattr(exc, "field", None)
    if isinstance(exc, FieldError) and field in flags:
        return exc.cli_message(flags[field], flags)
    template = getattr(exc, "template", None)
    if template:
        return render(template, flags)
    return str(exc)


class FieldError(ValueError):
    """A value outside its rule. ``field`` (as the caller spelled it: an argument or a config key),
    ``value``, ``rule`` (what a value must be), ``fixes`` (``(value, note)`` pairs that would be
    accepted), ``hint`` (more of the fix, in prose) and ``where`` (the model or file it is about).
    ``FieldError("a whole message")`` is a plain error with no parts (``field`` None)."""

    def __init__(self, field: str, value: Any = None, rule: str = "", fixes: Iterable[tuple[Any, str]] = (),
                 hint: str = "", where: str = ""):
        if not rule:   # a plain message
            self.field, self.value, self.rule, self.fixes, self.hint, self.where = None, None, "", (), "", ""
            super().__init__(field)
            return
        self.field, self.value, self.rule, self.hint, self.where = field, value, rule, hint, where
        self.fixes = tuple(fixes)
        super().__init__(self.python_message())

    def _fix_text(self, fmt: Callable[[Any], str], flags: dict[str, str] | None) -> str:
        parts = [fmt(v) + (f" ({note})" if note else "") for v, note in self.fixes]
        text = " or ".join(parts)
        if self.hint:
            hint = render(self.hint, flags)
            text = f"{text}; {hint}" if text else hint
        return text

    def python_message(self) -> str:
        head = f"{self.where}: " if self.where else ""
        return (f"{head}{self.field} = {_py(self.value)}: {self.rule}. "
                f"Fix: {self._fix_text(lambda v: f'{self.field}={_py(v)}', None)}")

    def cli_message(self, flag: str, flags: dict[str, str] | None = None) -> str:
        """The same error for a command-line flag: ``--flag value: rule; e.g. --flag fix``."""
        if self.field is None:
            return str(self)
        head = f"{self.where}: " if self.where else ""
        fix = self._fix_text(lambda v: f"{flag} {_cli(v)}", {self.field: flag, **(flags or {})})
        return f"{head}{flag} {_cli(self.value)}: {self.rule}; e.g. {fix}"


class LLMConfigError(FieldError):
    """A model argument the LLM engine cannot read; the message names the rule, the value and a fix."""


class ContextLengthError(LLMConfigError):
    """A request longer than the model's positions (``max_position_embeddings``): refused the same
    way by `simulate_generation` and by the serving simulator."""


# ---- numeric arguments ----------------------------------------------------------------------------


def is_count(v: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_count(name: str, value: Any, example: int = 1, minimum: int = 1, cls: type[FieldError] = LLMConfigError,
                what: str = "", where: str = "") -> int:
    """``value`` as an int if it is an integer (not a bool) of at least ``minimum``."""
    if not is_count(value) or value < minimum:
        rule = (f"{what + ' ' if what else ''}must be an integer >= {minimum}"
                + (" (True and False are not counts)" if isinstance(value, bool) else ""))
        raise cls(name, value, rule, [(max(example, minimum), "")], where=where)
    return int(value)


def check_real(name: str, value: Any, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False, example: float = 1.0,
               cls: type[FieldError] = LLMConfigError, what: str = "", allow_inf: bool = False,
               fixes: Iterable[tuple[Any, str]] | None = None, where: str = "") -> float:
    """``value`` as a float if it is a real number (not a bool, not NaN) within the bounds."""
    v = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    bad = math.isnan(v) or (math.isinf(v) and not allow_inf)
    if not bad and low is not None:
        bad = v <= low if low_open else v < low
    if not bad and high is not None:
        bad = v >= high if high_open else v > high
    if bad:
        lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        rule = f"{what + ' ' if what else ''}must be a {'' if allow_inf else 'finite '}number" + \
            (f" {bounds}" if bounds else "")
        raise cls(name, value, rule, fixes if fixes is not None else [(example, "")], where=where)
    return v


# ---- model descriptions: one rule per config key ---------------------------------------------------


@dataclass(frozen=True)
class KeyRule:
    """What one config key holds: ``kind`` "int" (``minimum`` and up) or "real" (in ``(low, high]``
    with ``low_open``), what it means, and a typical value for the fix."""

    kind: str
    what: str
    example: Any
    minimum: int = 1
    low: float | None = None
    high: float | None = None
    low_open: bool = True


def _pos(what: str, example: int) -> KeyRule:
    return KeyRule("int", what, example, 1)


def _nonneg(what: str, example: int) -> KeyRule:
    return KeyRule("int", what, example, 0)


KEY_RULES: dict[str, KeyRule] = {
    "vocab_size": _pos("the vocabulary (tokens the embedding and LM head hold)", 32000),
    "padded_vocab_size": _pos("the vocabulary (tokens the embedding and LM head hold)", 65024),
    "hidden_size": _pos("the hidden size (width of the residual stream)", 4096),
    "n_embd": _pos("the hidden size (width of the residual stream)", 768),
    "num_hidden_layers": _pos("the number of decoder layers", 32),
    "n_layer": _pos("the number of decoder layers", 12),
    "num_layers": _pos("the number of decoder layers", 28),
    "num_attention_heads": _pos("the number of attention heads", 32),
    "n_head": _pos("the number of attention heads", 12),
    "num_key_value_heads": _pos("the number of key/value heads", 8),
    "multi_query_group_num": _pos("the number of key/value head groups", 2),
    "head_dim": _pos("each attention head's width", 128),
    "kv_channels": _pos("each attention head's width", 128),
    "intermediate_size": _pos("the MLP's width", 11008),
    "n_inner": _pos("the MLP's width", 3072),
    "ffn_hidden_size": _pos("the MLP's width", 13696),
    "moe_intermediate_size": _pos("each expert's MLP width", 768),
    "shared_expert_intermediate_size": _nonneg("the shared expert's MLP width", 5632),
    "max_position_embeddings": _pos("the positions (longest sequence) the model handles", 4096),
    "n_positions": _pos("the positions (longest sequence) the model handles", 1024),
    "seq_length": _pos("the positions (longest sequence) the model handles", 8192),
    "num_experts": _nonneg("the routed experts (0: a dense MLP)", 128),
    "num_local_experts": _nonneg("the routed experts (0: a dense MLP)", 8),
    "n_routed_experts": _nonneg("the routed experts (0: a dense MLP)", 256),
    "num_experts_per_tok": _pos("the experts each token is routed to (top-k)", 8),
    "n_shared_experts": _nonneg("the always-on shared experts", 1),
    "n_group": _pos("the expert groups of group-limited routing", 8),
    "topk_group": _pos("the groups each token may pick experts from", 4),
    "first_k_dense_replace": _nonneg("the leading layers that keep a dense MLP", 3),
    "decoder_sparse_step": _pos("the layer interval of MoE layers", 1),
    "kv_lora_rank": _pos("the cached latent's width (multi-head latent attention)", 512),
    "q_lora_rank": _nonneg("the query's low-rank width (0 or null: none)", 1536),
    "qk_rope_head_dim": _pos("the part of each head RoPE rotates", 64),
    "qk_nope_head_dim": _pos("the part of each head RoPE does not rotate", 128),
    "v_head_dim": _pos("each head's value width", 128),
    "partial_rotary_factor": KeyRule("real", "the share of each head RoPE rotates", 0.5, low=0.0, high=1.0),
    "rms_norm_eps": KeyRule("real", "the RMSNorm epsilon", 1e-6, low=0.0),
    "layer_norm_epsilon": KeyRule("real", "the LayerNorm epsilon", 1e-5, low=0.0),
    "layernorm_epsilon": KeyRule("real", "the LayerNorm epsilon", 1e-5, low=0.0),
    "layer_norm_eps": KeyRule("real", "the LayerNorm epsilon", 1e-12, low=0.0),
    "rope_theta": KeyRule("real", "RoPE's base", 10000.0, low=0.0),
}

# the keys that say the same thing, in the order the readers (`configs.spec_from_dict`) take them
HIDDEN = ("n_embd", "hidden_size")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
HEADS = ("n_head", "num_attention_heads")
HEAD_DIM = ("head_dim", "kv_channels")
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")


def _key(cfg: dict, names: tuple[str, ...]) -> tuple[str | None, Any]:
    for n in names:
        if cfg.get(n) is not None:
            return n, cfg[n]
    return None, None


def _check_key(key: str, value: Any, rule: KeyRule, where: str) -> None:
    if rule.kind == "int":
        # a whole float (4096.0) reads as its integer; 4096.5, "4096" and True do not
        whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        if not (is_count(value) or whole) or value < rule.minimum:
            raise LLMConfigError(key, value, f"{rule.what} must be an integer >= {rule.minimum}"
                                 + (" (true/false is not a count)" if isinstance(value, bool) else ""),
                                 hint=f"the value the model's config.json gives, e.g. {{{key}={rule.example}}}",
                                 where=where)
        return
    check_real(key, value, low=rule.low, high=rule.high, low_open=rule.low_open, example=rule.example,
               what=rule.what, where=where)


def _divisors_near(n: int, around: int, k: int = 2) -> list[int]:
    divs = [d for d in range(1, min(n, 4096) + 1) if n % d == 0]
    return sorted(sorted(divs, key=lambda d: (abs(d - around), -d))[:k])


def check_config(cfg: dict[str, Any], where: str = "") -> None:
    """Raise `LLMConfigError` (naming the key, its value, the rule and a fix) unless every key of
    ``cfg`` that the engine or training reads holds a value within its rule, and the keys agree
    with each other (`RELATIONS`). Keys the rules do not know are not checked."""
    if not isinstance(cfg, dict):
        raise LLMConfigError("config", type(cfg).__name__, "a model config is a dict in config.json form",
                             hint="pass a dict, a config.json path or a transformers PretrainedConfig", where=where)
    for key, rule in KEY_RULES.items():
        v = cfg.get(key)
        if v is not None:
            _check_key(key, v, rule, where)
    mt = cfg.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise LLMConfigError("model_type", mt, "the architecture's name is a string",
                             [("llama", "")], where=where)
    for relation in RELATIONS:
        relation(cfg, where)


def _heads_divide_hidden(cfg: dict, where: str) -> None:
    hk, hidden = _key(cfg, HIDDEN)
    nk, heads = _key(cfg, HEADS)
    if hk is None or nk is None or cfg.get("qk_nope_head_dim") is not None or cfg.get("kv_lora_rank"):
        return   # multi-head latent attention: every head width is given
    if hidden % heads == 0:
        return
    _, head_dim = _key(cfg, HEAD_DIM)
    if head_dim is not None and head_dim != hidden // heads:
        return   # an explicit head width that is not the rounded-down share (Qwen3 and others)
    raise LLMConfigError(
        nk, heads, f"attention heads must divide {hk} = {hidden} (each head would get {hidden / heads:.2f} "
        f"dims; rounded down to {hidden // heads}, the heads would cover {heads * (hidden // heads)} of the "
        f"{hidden} dims)", [(d, f"head_dim {hidden // d}") for d in _divisors_near(hidden, heads)],
        "or give head_dim explicitly", where)


def _kv_heads_divide_heads(cfg: dict, where: str) -> None:
    if cfg.get("kv_lora_rank") or cfg.get("qk_nope_head_dim") is not None:
        return   # MLA caches one latent, whatever num_key_value_heads says
    nk, heads = _key(cfg, HEADS)
    if nk is None:
        return
    if cfg.get("model_type") == "chatglm":
        if not cfg.get("multi_query_attention"):
            return
        kk, kv = "multi_query_group_num", cfg.get("multi_query_group_num")
    else:
        kk, kv = "num_key_value_heads", cfg.get("num_key_value_heads")
    if kv is None or heads % kv == 0:
        return
    raise LLMConfigError(kk, kv, f"key/value heads must divide {nk} = {heads} (each KV head serves a whole group "
                         f"of query heads; {heads} / {kv} = {heads / kv:.2f})",
                         [(d, "") for d in _divisors_near(heads, kv)], where=where)


def _experts_and_top_k(cfg: dict, where: str) -> None:
    ek, experts = _key(cfg, EXPERTS)
    k = cfg.get("num_experts_per_tok")
    if not experts:
        return
    if k is None:
        raise LLMConfigError("num_experts_per_tok", None, f"a MoE config ({ek} = {experts}) routes each token to "
                             "top-k experts, and top-k is missing", [(min(8, experts), "")], where=where)
    if k > experts:
        raise LLMConfigError("num_experts_per_tok", k, f"top-k must be at most the {experts} experts ({ek})",
                             [(min(8, experts), "")], where=where)
    groups, topk_groups = cfg.get("n_group"), cfg.get("topk_group")
    if groups is not None:
        if experts % groups:
            raise LLMConfigError("n_group", groups, f"expert groups must divide the {experts} experts ({ek})",
                                 [(d, "") for d in _divisors_near(experts, groups)], where=where)
        if topk_groups is not None and topk_groups > groups:
            raise LLMConfigError("topk_group", topk_groups, f"a token picks from at most the {groups} groups "
                                 "(n_group)", [(groups, "")], where=where)
        reach = (topk_groups or groups) * (experts // groups)
        if k > reach:
            raise LLMConfigError("num_experts_per_tok", k, f"top-k must be at most the {reach} experts of the "
                                 f"{topk_groups or groups} groups a token may pick from (topk_group x {ek} / n_group)",
                                 [(reach, "")], where=where)


def _dense_layers_within_layers(cfg: dict, where: str) -> None:
    dense = cfg.get("first_k_dense_replace")
    lk, layers = _key(cfg, LAYERS)
    if dense is not None and lk is not None and dense > layers:
        raise LLMConfigError("first_k_dense_replace", dense, f"the leading dense layers must be at most the {layers} "
                             f"layers ({lk})", [(min(3, layers), "")], where=where)


RELATIONS: tuple[Callable[[dict, str], None], ...] = (
    _heads_divide_hidden, _kv_heads_divide_heads, _experts_and_top_k, _dense_layers_within_layers)


# ---- an LLMSpec built by hand ---------------------------------------------------------------------

SPEC_POSITIVE = ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "max_positions",
                 "expert_groups", "topk_groups")
SPEC_NONNEGATIVE = ("experts", "top_k", "expert_intermediate", "shared_experts", "shared_intermediate",
                    "dense_layers", "kv_lora_rank", "q_lora_rank", "qk_rope_dim", "v_head_dim")
SPEC_BOOLS = ("qkv_bias", "qk_norm", "tied_embeddings")
SPEC_CHOICES = {"mlp": ("swiglu", "gelu"), "norm": ("rms", "layer"), "router": ("softmax", "sigmoid")}


def check_spec(spec: Any) -> Any:
    """``spec`` (an `LLMSpec`) if every field holds a value within its rule; else `LLMConfigError`
    naming the field (``LLMSpec.<field>``)."""
    if not is_dataclass(spec):
        raise LLMConfigError("model", type(spec).__name__, "an LLMSpec is a dataclass",
                             hint="build it with LLMSpec(...)")
    names = {f.name for f in fields(spec)}

    def err(name, rule, fixes=(), hint=""):
        return LLMConfigError(f"LLMSpec.{name}", getattr(spec, name), rule, (), hint or (
            " or ".join(f"LLMSpec(..., {name}={_py(v)})" for v, _ in fixes)), where=str(getattr(spec, "name", "")))

    for n in SPEC_POSITIVE:
        v = getattr(spec, n)
        if not is_count(v) or v < 1:
            raise err(n, "must be an integer >= 1", [(1, "")])
    for n in SPEC_NONNEGATIVE:
        v = getattr(spec, n)
        if not is_count(v) or v < 0:
            raise err(n, "must be an integer >= 0", [(0, "")])
    for n in SPEC_BOOLS:
        if not isinstance(getattr(spec, n), bool):
            raise err(n, "must be True or False", [(False, "")])
    for n, choices in SPEC_CHOICES.items():
        if n in names and getattr(spec, n) not in choices:
            raise err(n, f"must be one of {', '.join(choices)}", [(choices[0], "")])
    check_real("LLMSpec.rotary_fraction", spec.rotary_fraction, low=0.0, high=1.0, low_open=False, example=1.0,
               what="the share of each head RoPE rotates")
    if not spec.kv_lora_rank and spec.heads % spec.kv_heads:
        raise err("kv_heads", f"key/value heads must divide the {spec.heads} heads",
                  [(d, "") for d in _divisors_near(spec.heads, spec.kv_heads)])
    if spec.experts:
        if not 1 <= spec.top_k <= spec.experts:
            raise err("top_k", f"a MoE spec routes each token to 1 to {spec.experts} experts", [(1, "")])
        if spec.expert_intermediate < 1:
            raise err("expert_intermediate", "each routed expert needs an MLP width >= 1", [(spec.intermediate, "")])
        if spec.experts % spec.expert_groups:
            raise err("expert_groups", f"expert groups must divide the {spec.experts} experts", [(1, "")])
        if spec.topk_groups > spec.expert_groups:
            raise err("topk_groups", f"at most the {spec.expert_groups} expert groups", [(spec.expert_groups, "")])
        reach = spec.topk_groups * (spec.experts // spec.expert_groups)
        if spec.top_k > reach:
            raise err("top_k", f"at most the {reach} experts of the groups a token may pick from", [(reach, "")])
    elif spec.top_k:
        raise err("top_k", "top-k routing needs experts (experts = 0: a dense MLP)", [(0, "")])
    if spec.dense_layers > spec.layers:
        raise err("dense_layers", f"at most the {spec.layers} layers", [(0, "")])
    if spec.shared_experts and spec.shared_intermediate < 1:
        raise err("shared_intermediate", "shared experts need an MLP width >= 1", [(spec.intermediate, "")])
    if spec.kv_lora_rank:
        if not 0 < spec.qk_rope_dim < spec.head_dim:
            raise err("qk_rope_dim", f"multi-head latent attention rotates part of each {spec.head_dim}-wide head: "
                      "between 1 and head_dim - 1", [(min(64, spec.head_dim // 2), "")])
        if spec.v_head_dim < 1:
            raise err("v_head_dim", "multi-head latent attention needs a value width >= 1", [(spec.head_dim, "")])
    return spec


# ---- requests against the model's positions --------------------------------------------------------


def positions_rule(model: str, max_positions: int) -> str:
    return f"{model} handles at most {max_positions:,} positions (its max_position_embeddings)"


def check_positions(model: str, max_positions: int, prompt_len: int, output_len: int) -> None:
    """Raise `ContextLengthError` unless a prompt and its output fit the model's positions."""
    total = prompt_len + output_len
    if total > max_positions:
        keep = max(1, max_positions - output_len)
        raise ContextLengthError(
            "prompt_len + output_len", total, positions_rule(model, max_positions),
            hint=(f"a prompt and output of at most {max_positions:,} tokens together, e.g. prompt_len={keep} "
                  f"with output_len={min(output_len, max_positions - keep)}, or a model with more positions"))


__all__ = ["ContextLengthError", "FieldError", "KEY_RULES", "KeyRule", "LLMConfigError", "RELATIONS",
           "check_config", "check_count", "check_positions", "check_real", "check_spec", "cli_text", "hinted",
           "is_count", "positions_rule", "render"]
