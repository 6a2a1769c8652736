"""``pypto-lab atc``: CANN's ATC command line, on the workbench.

    pypto-lab atc --model=model.onnx --framework=5 --output=model --soc_version=Ascend910

reads the ONNX model (`onnx_import`), optimises it for the chip with `pypto_lab.optimize` (the
passes of ``--level``, default 2: op mapping, Conv+BN folding and fusion, NC1HWC0/FRACTAL_NZ
layouts, GM buffer reuse: what ATC's graph compiler does), and writes ``<output>.om``
(`om.save_om`; docs/om_format.md).

ATC's flags, as ATC spells them:

* ``--framework``: 5 (ONNX) only; ATC's 0 (Caffe), 1 (MindSpore), 3 (TensorFlow) are refused.
* ``--soc_version``: a chip preset (`pypto_lab.list_chips()`) or ATC's name for it, `SOC_ALIASES`
  (``Ascend910`` is the first-generation Ascend 910, the workbench's ``Ascend910A`` preset).
* ``--input_shape``: ``"name:1,3,224,224;name2:1,128"``; needed for inputs with dynamic dims.
* ``--precision_mode``: ATC's modes mapped to the workbench's precision, `PRECISION_MODES`.
  The default is ATC's, force_fp16.
* ``--out_nodes``: ``"node_name:index;..."`` (or output tensor names): the model's outputs.

TorchScript (a workbench extension: ATC itself has no TorchScript framework, CANN users export to
ONNX first): a ``--model`` file that ``torch.jit.save`` wrote is recognised by its content and
compiled through `pypto_lab.optimize`'s TorchScript path, with ``--framework=5`` as for ONNX.
TorchScript records no input shapes, so ``--input_shape`` is required; each input is an fp32
tensor of that shape, in the order given. ``--out_nodes`` does not apply.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..capture import CaptureError
from ..compiler.optimize import optimize
from ..hw.chip import Chip, get_chip, list_chips
from .om import OMModel, load_om, save_om
from .onnx_import import import_onnx, parse_input_shape

FRAMEWORKS = {0: "Caffe", 1: "MindSpore", 3: "TensorFlow", 5: "ONNX"}
SUPPORTED_FRAMEWORKS = (5,)
SOC_ALIASES = {
    "Ascend910": "Ascend910A",          # ATC's name of the first Ascend 910 (Da Vinci 1.0 training chip)
    "Ascend910ProA": "Ascend910A",
    "Ascend910PremiumA": "Ascend910A",
}
# ATC --precision_mode -> (the workbench's precision, what it means here)
PRECISION_MODES = {
    "force_fp16": ("fp16", "every operator in fp16 (ATC's default); the workbench keeps softmax, norms and "
                           "reductions' arithmetic in fp32, stored in fp16"),
    "allow_mix_precision": ("fp16", "mixed precision: fp16 with fp32 kept for softmax, norms and reductions"),
    "allow_mix_precision_fp16": ("fp16", "as allow_mix_precision"),
    "allow_mix_precision_bf16": ("bf16", "mixed precision in bf16 (chips whose Cube has a bf16 fractal)"),
    "allow_fp32_to_fp16": ("fp32", "fp32 where the Cube computes fp32, else fp16 (CANN's rule; on Ascend910A "
                                   "the Cube runs fp16)"),
    "force_fp32": ("fp32", "fp32; on a chip whose Cube lacks fp32 the Cube runs fp16, as CANN does"),
    "cube_fp16in_fp32out": ("fp32", "as force_fp32"),
    "must_keep_origin_dtype": ("fp32", "the model's own dtype (fp32); refused on a chip whose Cube lacks fp32"),
}
DEFAULT_PRECISION_MODE = "force_fp16"
DEFAULT_LEVEL = 2


class AtcError(ValueError):
    """Bad ``pypto-lab atc`` input; the message names the flag, its value, the rule and a fix."""


@dataclass
class AtcResult:
    path: Path
    om: OMModel
    precision: str
    chip: Chip


def resolve_soc(soc_version: str) -> Chip:
    """The chip of an ATC ``--soc_version`` (a preset name, an alias of `SOC_ALIASES`, or a preset file)."""
    name = SOC_ALIASES.get(soc_version, soc_version)
    try:
        return get_chip(name)
    except (ValueError, KeyError, OSError) as exc:
        names = ", ".join([*list_chips(), *SOC_ALIASES])
        raise AtcError(f"--soc_version={soc_version}: not a chip the workbench models; choose one of {names} (or "
                       "the path of a .toml chip preset)") from exc


def resolve_precision_mode(mode: str | None, chip: Chip) -> str:
    mode = mode or DEFAULT_PRECISION_MODE
    if mode not in PRECISION_MODES:
        raise AtcError(f"--precision_mode={mode}: not one of ATC's modes the workbench models; choose one of "
                       f"{', '.join(PRECISION_MODES)}")
    precision = PRECISION_MODES[mode][0]
    if mode == "must_keep_origin_dtype" and not chip.cube.supports("fp32"):
        raise AtcError(f"--precision_mode=must_keep_origin_dtype: {chip.name}'s Cube has no fp32 fractal, so the "
                       "model's fp32 convolutions and matmuls cannot keep their dtype (ATC fails the same way); use "
                       "--precision_mode=allow_fp32_to_fp16 or force_fp16")
    if precision == "bf16" and not chip.cube.supports("bf16"):
        raise AtcError(f"--precision_mode={mode}: {chip.name}'s Cube has no bf16 fractal; use force_fp16")
    return precision


def om_path(output: str) -> Path:
    """ATC's ``--output``: the name without .om; ``.om`` is appended (kept if given)."""
    return Path(output if output.endswith(".om") else output + ".om")


def check_args(model: str, framework: int, output: str, soc_version: str, precision_mode: str | None,
               input_shape: str | None) -> tuple[Chip, str]:
    if framework not in SUPPORTED_FRAMEWORKS:
        what = FRAMEWORKS.get(framework, "not an ATC framework")
        raise AtcError(f"--framework={framework} ({what}) is not supported; pypto-lab atc reads ONNX models: "
                       "--framework=5")
    if not Path(model).is_file():
        raise AtcError(f"--model={model}: no such file; give the path of an .onnx file (or of a TorchScript file)")
    if not output:
        raise AtcError("--output is empty; give the OM's name without .om, e.g. --output=model")
    chip = resolve_soc(soc_version)
    precision = resolve_precision_mode(precision_mode, chip)
    parse_input_shape(input_shape)
    return chip, precision


def is_torchscript_file(path: str | Path) -> bool:
    """Whether ``path`` is an archive ``torch.jit.save`` wrote: a zip with TorchScript's ``code/``
    folder and ``constants.pkl`` under its top-level folder (an ONNX file is a protobuf, not a zip)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    return any("/code/" in n for n in names) and any(n.endswith("/constants.pkl") for n in names)


def _torchscript_inputs(model: str, input_shape: str | None, out_nodes: str | None) -> tuple[list[str], tuple]:
    shapes = parse_input_shape(input_shape)
    if not shapes:
        raise AtcError(f"--model={model} is a TorchScript file, which records no input shapes: --input_shape is "
                       "required, e.g. --input_shape=\"input:1,3,224,224\" (several inputs separated by ';', in the "
                       "order forward() takes them)")
    if out_nodes:
        raise AtcError(f"--out_nodes={out_nodes}: a TorchScript model has no named graph nodes to cut at; leave "
                       "--out_nodes out (the outputs are forward()'s)")
    gen = torch.Generator().manual_seed(0)
    return list(shapes), tuple(torch.randn(*dims, generator=gen) for dims in shapes.values())


def run_atc(model: str, framework: int, output: str, soc_version: str, input_shape: str | None = None,
            precision_mode: str | None = None, out_nodes: str | None = None, level: int = DEFAULT_LEVEL,
            argv: list[str] | None = None) -> AtcResult:
    """Compile ``model`` for ``soc_version`` and write ``<output>.om``; returns the path and the
    loaded OM (read back from the file, so what is returned is what was written)."""
    chip, precision = check_args(model, framework, output, soc_version, precision_mode, input_shape)
    if is_torchscript_file(model):
        names, inputs = _torchscript_inputs(model, input_shape, out_nodes)
        optimized = optimize(model, inputs, chip=chip, level=level, precision=precision)
        path = om_path(output)
        source = {"tool": "pypto-lab atc", "model": str(model), "framework": "torchscript (workbench extension)",
                  "soc_version": soc_version, "precision_mode": precision_mode or DEFAULT_PRECISION_MODE,
                  "input_shape": input_shape or ""}
        if argv is not None:
            source["argv"] = list(argv)
        save_om(optimized, path, model_name=Path(model).stem, input_names=names, created_by="pypto-lab atc",
                source=source)
        return AtcResult(path, load_om(path), precision, chip)
    outs = [s for s in (out_nodes or "").split(";") if s.strip()]
    module, inputs = import_onnx(model, parse_input_shape(input_shape), outs or None)
    try:
        optimized = optimize(module, inputs, chip=chip, level=level, precision=precision)
    except CaptureError as exc:
        if not module.changed_dims:
            raise
        raise AtcError(f"{exc}. Note: --input_shape changed dimensions the ONNX model fixed "
                       f"({'; '.join(module.changed_dims)}), and the model's own constants (e.g. a Reshape's "
                       "target shape) may assume the old ones: re-export the model with those dimensions dynamic "
                       "(torch.onnx.export(..., dynamic_axes=...) or dynamic_shapes=...), or keep its shapes") from exc
    path = om_path(output)
    source = {"tool": "pypto-lab atc", "model": str(model), "framework": framework, "soc_version": soc_version,
              "precision_mode": precision_mode or DEFAULT_PRECISION_MODE, "input_shape": input_shape or "",
              "out_nodes": out_nodes or "", "onnx_fallback_ops": list(module.fallback_ops)}
    if argv is not None:
        source["argv"] = list(argv)
    save_om(optimized, path, model_name=Path(model).stem, input_names=module.input_names,
            output_names=module.output_names, created_by="pypto-lab atc", source=source)
    return AtcResult(path, load_om(path), precision, chip)


__all__ = ["AtcError", "AtcResult", "DEFAULT_LEVEL", "FRAMEWORKS", "PRECISION_MODES", "SOC_ALIASES",
           "is_torchscript_file", "om_path",
           "resolve_precision_mode", "resolve_soc", "run_atc"]
