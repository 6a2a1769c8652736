"""What each AI Core version can do with a Cube result, and which layouts its units read: one table
that the fusion and layout passes ask and the costers obey.

A Cube kernel's result leaves L0C through an *epilogue*: bias, dequantisation (int32 -> fp16),
a residual add, an activation and requantisation (-> int8 for the next Cube kernel), in that
order. Each stage runs either

* on FixPipe, in flight on the way L0C -> GM (AIC-C-220, the 910B): free in time, but only the
  stages FixPipe has, and only while every stage before it ran there too (FixPipe works before
  the data reaches GM or UB); or
* on the Vector unit: on AIC-C-100 / AIC-M-200 (910A, 310P) the result drains L0C -> UB through
  the Vector unit anyway, so every stage is a few vector instructions in UB on the same core;
  on AIC-C-220 the cube and vector cores are separate, so the result goes to GM and a paired
  vector core reads it back, applies the stages and writes it again.

Sources:

* [fixpipe] Ascend C API "Fixpipe" (hiascend.com, CANN community edition, ascendcopapi
  atlasascendc_api_07_0251): supported on Atlas A2/A3 (FixpipeParamsV220), not on the Atlas
  training series (910A) nor the Atlas inference series AI Core (310P); its quantPre modes
  (F322F16, F322BF16, DEQF16/VDEQF16 int32 -> half, QF322B8_PRE/REQ8 -> int8) and reluEn.
* [c220] CANN asc-devkit impl/basic_api/dav_c220/kernel_operator_fixpipe_impl.h: on this core
  version SetFixPipeAddr (an element-wise operand, i.e. a residual) and SetFixPipeClipRelu report
  "not supported", so a residual add and clipped activations cannot ride FixPipe.
* [bt] Ascend C Mmad with a BiasTable (A2): the first MMAD of an L0C tile starts from the bias in
  BT, so the bias costs no vector work on AIC-C-220.
* [nd2nz] Ascend C DataCopy with Nd2NzParams (Atlas A2): MTE2 converts ND to FRACTAL_NZ on the
  way GM -> L1, and Fixpipe's nz2nd writes ND: matmuls on AIC-C-220 read and write ND.
* [vconv] The Vector unit's instruction set as the chip presets time it (VADD, VRELU, VADDRELU,
  VCONV, VEXP, ...): an activation FixPipe lacks costs the instructions listed in
  `VECTOR_ACTIVATIONS`; vconv_deq / VCONV does the (de)quantising cast.
* [fa] FlashAttentionScore's product support: Atlas A2/A3 training products only, not the Atlas
  training series (910A) nor the Atlas inference series (310P) (cann/ops-transformer
  attention/flash_attention_score/README.md; hiascend aclnnFlashAttentionScoreV2, CANN community
  8.3.RC1.alpha003: "Atlas 推理系列产品 ×", "Atlas 训练系列产品 ×"). PromptFlashAttention later
  gained fp16 support on Atlas inference accelerator cards, as an aclnn / torch_npu operator a
  model calls; ATC's graph-fusion rule list (hiascend graphdevg atlasag_25_0078) has no pass that
  turns a model's matmul, softmax, matmul into it, so an attention there runs as BatchMatMul,
  SoftmaxV2, BatchMatMul with the scores in GM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .chip import CORE_VERSIONS, Chip

STAGES = ("bias", "dequant", "residual", "activation", "quant")

# Vector instructions (instruction, passes over the tile) an activation costs on the Vector unit
# [vconv]. tanh-GELU: x^3, a*x^3 + x, scale, tanh through exp and a division, (1 + t) * x / 2.
VECTOR_ACTIVATIONS: dict[str, tuple[tuple[str, int], ...]] = {
    "relu": (("VRELU", 1),),
    "gelu": (("VMUL", 2), ("VMULS", 2), ("VADD", 2), ("VEXP", 1), ("VADDS", 2), ("VDIV", 1), ("VMUL", 1)),
    "silu": (("VMULS", 1), ("VEXP", 1), ("VADDS", 1), ("VDIV", 1)),      # x / (1 + exp(-x))
    "sigmoid": (("VMULS", 1), ("VEXP", 1), ("VADDS", 1), ("VREC", 1)),   # 1 / (1 + exp(-x))
    "hardtanh": (("VMAXS", 1), ("VMINS", 1)),                            # clamp (ReLU6 too)
}
_STAGE_OPS = {"bias": (("VADD", 1),), "dequant": (("VCONV", 1),), "residual": (("VADD", 1),),
              "quant": (("VCONV", 1),)}


@dataclass(frozen=True)
class Epilogue:
    """The stages a Cube kernel applies to its result, and which of them FixPipe applies (the
    others run on the Vector unit). Build one with `CoreCapabilities.place` (or `place_epilogue`),
    which puts each stage where the core version can run it."""

    bias: bool = False
    dequant: bool = False
    residual: bool = False
    activation: str = ""
    quant: bool = False
    fixpipe: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        if self.activation and self.activation not in VECTOR_ACTIVATIONS:
            raise ValueError(f"epilogue activation {self.activation!r} is not known; choose one of "
                             f"{', '.join(VECTOR_ACTIVATIONS)} (or '' for none)")
        stray = set(self.fixpipe) - set(self.stages)
        if stray:
            raise ValueError(f"epilogue puts {sorted(stray)} on FixPipe but does not apply them; stages: "
                             f"{', '.join(self.stages) or 'none'}")

    @cached_property
    def stages(self) -> tuple[str, ...]:
        """The stages applied, in the order the result meets them."""
        return tuple(s for s in STAGES if (getattr(self, s) if s != "activation" else bool(self.activation)))

    @cached_property
    def vector_stages(self) -> tuple[str, ...]:
        return tuple(s for s in self.stages if s not in self.fixpipe)

    @property
    def on_vector(self) -> bool:
        """Whether any stage runs on the Vector unit."""
        return bool(self.vector_stages)

    def vector_instructions(self) -> tuple[tuple[str, int], ...]:
        """The vector instructions of the stages the Vector unit applies, in order. An add (bias or
        residual) directly followed by ReLU is one VADDRELU."""
        out: list[tuple[str, int]] = []
        for s in self.vector_stages:
            if s == "activation":
                if self.activation == "relu" and out and out[-1] == ("VADD", 1):
                    out[-1] = ("VADDRELU", 1)
                else:
                    out.extend(VECTOR_ACTIVATIONS[self.activation])
            else:
                out.extend(_STAGE_OPS[s])
        return tuple(out)

    @property
    def converts(self) -> bool:
        """Whether a Vector stage already casts the accumulator (dequant or quant on the Vector unit)."""
        return "dequant" in self.vector_stages or "quant" in self.vector_stages

    def label(self) -> str:
        """E.g. "bias+relu on FixPipe", "bias on FixPipe; residual+relu on Vector", "none"."""
        names = {"activation": self.activation}
        fix = [names.get(s, s) for s in self.stages if s in self.fixpipe]
        vec = [names.get(s, s) for s in self.vector_stages]
        parts = ([f"{'+'.join(fix)} on FixPipe"] if fix else []) + ([f"{'+'.join(vec)} on Vector"] if vec else [])
        return "; ".join(parts) or "none"

    def __str__(self) -> str:
        return self.label()


NO_EPILOGUE = Epilogue()


@dataclass(frozen=True)
class CoreCapabilities:
    """What one core version does with a Cube result and which layouts its Cube reads."""

    core_version: str
    fixpipe_stages: frozenset          # stages FixPipe applies ([fixpipe], [c220], [bt]); empty: no FixPipe
    fixpipe_activations: frozenset     # activations FixPipe applies (reluEn)
    matmul_formats: frozenset          # GM formats a matmul kernel reads and writes
    conv_formats: frozenset            # GM formats a convolution kernel reads and writes (activations)
    nd2nz_on_load: bool                # MTE2 converts ND -> FRACTAL_NZ on the way into L1 [nd2nz]
    sources: str = ""
    flash_attention: bool = False      # a FlashAttention kernel exists for this core version [fa]
    data_copy_pad: bool = False        # MTE moves rows that are not whole 32-byte blocks in one DataCopyPad [pad]

    @property
    def has_fixpipe(self) -> bool:
        return bool(self.fixpipe_stages)

    def where(self, activation: str) -> str:
        """Where this core version applies ``activation`` after a Cube kernel: "fixpipe", "vector",
        or "" when nothing can (the fusion is declined)."""
        if activation in self.fixpipe_activations:
            return "fixpipe"
        return "vector" if activation in VECTOR_ACTIVATIONS else ""

    def place(self, bias: bool = False, dequant: bool = False, residual: bool = False, activation: str = "",
              quant: bool = False) -> Epilogue:
        """The epilogue with each stage on the unit that runs it here: a stage rides FixPipe when
        FixPipe has it and every stage before it rode FixPipe too; the rest run on the Vector unit."""
        if activation and not self.where(activation):
            raise ValueError(f"{self.core_version} cannot apply {activation!r} after a Cube kernel; supported: "
                             f"{', '.join(sorted(set(VECTOR_ACTIVATIONS) | set(self.fixpipe_activations)))}")
        draft = Epilogue(bias, dequant, residual, activation, quant)
        on_fixpipe = []
        for s in draft.stages:
            ok = (activation in self.fixpipe_activations) if s == "activation" else s in self.fixpipe_stages
            if not ok:
                break
            on_fixpipe.append(s)
        return Epilogue(bias, dequant, residual, activation, quant, frozenset(on_fixpipe))


ND, NC1HWC0, NZ = "ND", "NC1HWC0", "FRACTAL_NZ"

CAPABILITIES: dict[str, CoreCapabilities] = {
    "AIC-C-220": CoreCapabilities(
        "AIC-C-220",
        fixpipe_stages=frozenset({"bias", "dequant", "activation", "quant"}),
        fixpipe_activations=frozenset({"relu"}),
        matmul_formats=frozenset({ND, NZ}),
        conv_formats=frozenset({NC1HWC0}),
        nd2nz_on_load=True,
        sources="[fixpipe] FixpipeParamsV220 quantPre / reluEn; [c220] no element-wise operand, no clip-ReLU; "
                "[bt] bias from the BiasTable; [nd2nz] DataCopy Nd2NzParams, Fixpipe nz2nd; [fa] FlashAttentionScore; "
                "[pad] DataCopyPad (Ascend C API atlasascendc_api_07_0265: supported on Atlas A2/A3, not on the "
                "Atlas inference series AI Core nor the Atlas training series)",
        flash_attention=True, data_copy_pad=True,
    ),
    "AIC-C-100": CoreCapabilities(
        "AIC-C-100", frozenset(), frozenset(), matmul_formats=frozenset({NZ}), conv_formats=frozenset({NC1HWC0}),
        nd2nz_on_load=False,
        sources="[fixpipe] Fixpipe is not supported on the Atlas training series: L0C drains to UB through the "
                "Vector unit; [fa] no FlashAttentionScore on the Atlas training series",
    ),
    "AIC-M-200": CoreCapabilities(
        "AIC-M-200", frozenset(), frozenset(), matmul_formats=frozenset({NZ}), conv_formats=frozenset({NC1HWC0}),
        nd2nz_on_load=False,
        sources="[fixpipe] Fixpipe is not supported on the Atlas inference series AI Core: L0C drains to UB "
                "through the Vector unit; [fa] no FlashAttentionScore on the Atlas inference series",
    ),
}
assert set(CAPABILITIES) == set(CORE_VERSIONS), "every core version a preset may name needs a row"


def capabilities(chip: Chip) -> CoreCapabilities:
    """The capability row of ``chip``'s core version."""
    return CAPABILITIES[chip.core_version]


def place_epilogue(chip: Chip, **stages) -> Epilogue:
    """`CoreCapabilities.place` for ``chip``'s core version."""
    return capabilities(chip).place(**stages)


# The epilogue names of `simulate_matmul`'s string form, and what they apply.
EPILOGUE_NAMES: dict[str, dict] = {
    "none": {}, "bias": {"bias": True}, "relu": {"activation": "relu"},
    "bias_relu": {"bias": True, "activation": "relu"}, "quant": {"dequant": True},
    "gelu": {"activation": "gelu"}, "silu": {"activation": "silu"}, "vector": {"residual": True},
    "residual": {"residual": True}, "residual_relu": {"residual": True, "activation": "relu"},
}


def as_epilogue(chip: Chip, epilogue: Epilogue | str | None) -> Epilogue:
    """An `Epilogue` from a name of `EPILOGUE_NAMES` (placed for ``chip``) or an `Epilogue` as is."""
    if epilogue is None:
        return NO_EPILOGUE
    if isinstance(epilogue, Epilogue):
        return epilogue
    if epilogue not in EPILOGUE_NAMES:
        raise ValueError(f"epilogue {epilogue!r} is not known; choose one of {', '.join(EPILOGUE_NAMES)}, or pass "
                         "an Epilogue (pypto_lab.hw.capabilities.place_epilogue(chip, bias=True, activation='gelu'))")
    return place_epilogue(chip, **EPILOGUE_NAMES[epilogue])


__all__ = ["CAPABILITIES", "CoreCapabilities", "Epilogue", "NO_EPILOGUE", "STAGES", "VECTOR_ACTIVATIONS",
           "as_epilogue", "capabilities", "place_epilogue"]
