"""``conv``: 1-D and 2-D convolution on the Cube, with the real signature (docs/zh/api/operation/
pypto-conv.md): ``conv(input_conv, weight, out_dtype, strides, paddings, dilations, *, groups=1,
transposed=False, output_paddings=[], extend_params=None)``.

Costed as the implicit GEMM the Cube runs: per group, ``M = N * Ho * Wo`` output pixels,
``K = Cin / groups * kh * kw``, ``Cout / groups`` columns, cut by the cube tile shape in force
(or `hw.tiling.default_cube_tile` when none is set). A block of ``m_l1`` pixels x ``n_l1``
channels loads the input rows its pixels need (GM -> L1) and its weight panel, then per ``k_l0``
step builds the im2col tile in L0A (L1 -> L0A, the load3d of the hardware), the weight tile in
L0B, and an mmad; the result leaves L0C by FixPipe (or L0C -> UB -> GM on chips without it).
``paddings`` are read as (before, after) pairs per spatial axis, outermost first. Numerics: inputs
in their dtype, fp32 accumulation (bias added there), rounded once to ``out_dtype``.
3-D convolution, transposed convolution and fixpipe quantization are not modelled.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import config, special
from .dtypes import as_dtype
from .errors import DTypeError, NoTileShapeError, ShapeError, TraceError
from .ops import _tensor
from .tensor import current_trace
from .tiling import check_cube_tile


def conv(input_conv, weight, out_dtype, strides, paddings, dilations, *, groups=1, transposed=False,
         output_paddings=(), extend_params=None):
    """Convolution of NCL / NCHW ``input_conv`` with ``weight`` [Cout, Cin / groups, k...] (see module)."""
    tr = current_trace("pypto.conv")
    x, w = _tensor(input_conv, "conv"), _tensor(weight, "conv")
    if transposed or list(output_paddings):
        raise TraceError("conv: transposed=True (deconvolution) is not supported (the real API does not support "
                         "it either). Fix: transposed=False")
    if x.ndim not in (3, 4):
        raise ShapeError(f"conv: input_conv of shape {x.shape}. Rule: pypto_lab models 1-D (NCL) and 2-D (NCHW) "
                         "convolution; 3-D (NCDHW) is not modelled")
    if x.dtype.lab not in ("fp16", "bf16", "fp32"):
        raise DTypeError(f"conv: input_conv dtype {x.dtype!r}. Rule: conv takes DT_FP16, DT_BF16 or DT_FP32")
    od = as_dtype(out_dtype, "conv out_dtype")
    if w.dtype is not x.dtype or od is not x.dtype:
        raise DTypeError(f"conv: input_conv {x.dtype!r}, weight {w.dtype!r}, out_dtype {od!r}. Rule: all three are "
                         "the same dtype (fixpipe quantization is not modelled)")
    sp = x.ndim - 2
    strides, dilations, paddings = [int(v) for v in strides], [int(v) for v in dilations], [int(v) for v in paddings]
    if w.ndim != x.ndim or len(strides) != sp or len(dilations) != sp or len(paddings) != 2 * sp:
        raise ShapeError(f"conv: weight {w.shape}, strides {strides}, paddings {paddings}, dilations {dilations} for "
                         f"a {sp}-D convolution. Rule: weight has rank {x.ndim}; {sp} strides, {sp} dilations, "
                         f"{2 * sp} paddings")
    n, cin = x.shape[:2]
    cout, cin_g = w.shape[:2]
    ks = list(w.shape[2:])
    if groups < 1 or cin % groups or cout % groups or cin_g * groups != cin:
        raise ShapeError(f"conv: Cin {cin}, Cout {cout}, weight Cin {cin_g}, groups {groups}. Rule: Cin and Cout "
                         "divisible by groups, and weight.shape[1] * groups == Cin")
    if any(not 1 <= s <= 63 for s in strides + dilations) or any(
            not 0 <= p < k for p, k in zip(paddings, [k for k in ks for _ in (0, 1)])):
        raise ShapeError(f"conv: strides {strides}, dilations {dilations}, paddings {paddings} for kernel {ks}. Rule: "
                         "strides and dilations in 1..63; each padding in 0..(kernel size - 1)")
    out_sp = []
    for d in range(sp):
        size = x.shape[2 + d] + paddings[2 * d] + paddings[2 * d + 1]
        o = (size - dilations[d] * (ks[d] - 1) - 1) // strides[d] + 1
        if o < 1:
            raise ShapeError(f"conv: spatial axis {d} of size {x.shape[2 + d]} with padding {paddings[2 * d:2 * d + 2]} "
                             f"is smaller than the dilated kernel ({dilations[d] * (ks[d] - 1) + 1})")
        out_sp.append(o)
    bias, relu = None, False
    for key, val in (extend_params or {}).items():
        if key == "bias_tensor":
            bias = _tensor(val, "conv bias_tensor")
            if list(bias.shape) != [cout]:
                raise ShapeError(f"conv: bias_tensor of shape {bias.shape}. Rule: shape [Cout] = [{cout}]")
        elif key == "relu_type":
            relu = "NO_RELU" not in str(getattr(val, "name", val)).upper()
        else:
            raise TraceError(f"conv: extend_params key {key!r} (fixpipe quantization) is not supported by pypto_lab; "
                             "'bias_tensor' and 'relu_type' are")
    m, k, ncol = n * math.prod(out_sp), cin_g * math.prod(ks), cout // groups
    tile = config.STATE.cube_tile
    if tile is not None:
        check_cube_tile(tr.chip, tile, x.dtype, m, k, ncol, f"conv {list(x.shape)} * {list(w.shape)}")
    else:
        from ..hw.tiling import TilingError, default_cube_tile
        try:
            tile = default_cube_tile(tr.chip, m, k, ncol, x.dtype.lab)
        except TilingError as e:
            raise NoTileShapeError(f"conv: no cube tile fits this convolution ({e}). Fix: "
                                   "pypto.set_cube_tile_shapes(...) before it") from None
    inputs = [x._id, w._id] + ([bias._id] if bias is not None else [])
    attrs = {"strides": tuple(strides), "paddings": tuple(paddings), "dilations": tuple(dilations),
             "groups": int(groups), "relu": relu, "tile": tuple(tuple(t) for t in tile.as_pypto())}
    out = tr.new("conv", inputs, [n, cout] + out_sp, od, attrs)
    for i in inputs:
        tr.note_read(i, out._id)
    return out


def _run_conv(n, ins, graph):
    x, w = ins[0].float(), ins[1].float()
    a = n.attrs
    pads = a["paddings"]
    # F.pad takes (last axis before, after, previous axis before, after, ...)
    flat = []
    for d in reversed(range(len(a["strides"]))):
        flat += [pads[2 * d], pads[2 * d + 1]]
    x = F.pad(x, flat)
    fn = F.conv1d if x.ndim == 3 else F.conv2d
    bias = ins[2].float() if len(ins) > 2 else None
    r = fn(x, w, bias, stride=a["strides"], dilation=a["dilations"], groups=a["groups"])
    if a["relu"]:
        r = torch.relu(r)
    return r.to(n.dtype.torch)


def _tasks_conv(n, nodes, chip):
    x, w = nodes[n.inputs[0]], nodes[n.inputs[1]]
    a = n.attrs
    (_, m_l1), (k_l0, _), (_, n_l1) = a["tile"]
    eb, ob = x.dtype.bytes, n.dtype.bytes
    g = a["groups"]
    cin_g, cout_g = w.shape[1], w.shape[0] // g
    ks = list(w.shape[2:])
    out_sp = list(n.shape[2:])
    m, k = n.shape[0] * math.prod(out_sp), cin_g * math.prod(ks)
    wo = out_sp[-1]
    in_w = x.shape[-1] + a["paddings"][-2] + a["paddings"][-1]
    m0, k0, n0 = chip.cube.fractals[x.dtype.lab]
    outs = ["L0C_TO_GM"] if "L0C_TO_GM" in chip.paths else ["L0C_TO_UB", "UB_TO_GM"]

    def footprint(bm):
        """Bytes of input one block of ``bm`` consecutive output pixels reads (rows of the padded map)."""
        if len(out_sp) == 1:
            span = (min(bm, wo) - 1) * a["strides"][0] + a["dilations"][0] * (ks[0] - 1) + 1
            return cin_g * min(span, in_w) * eb
        rows_out = min(out_sp[0], -(-bm // wo) + 1)
        rows_in = (rows_out - 1) * a["strides"][0] + a["dilations"][0] * (ks[0] - 1) + 1
        return cin_g * min(rows_in, x.shape[-2] + a["paddings"][0] + a["paddings"][1]) * in_w * eb

    tasks = []
    for _ in range(g):
        for i in range(0, m, m_l1):
            bm = min(m_l1, m - i)
            for j in range(0, cout_g, n_l1):
                bn = min(n_l1, cout_g - j)
                steps = [("path", "GM_TO_L1", footprint(bm), 1), ("path", "GM_TO_L1", bn * k * eb, 1)]
                for kk in range(0, k, k_l0):
                    kc = min(k_l0, k - kk)
                    frac = -(-bm // m0) * -(-kc // k0) * -(-bn // n0)
                    steps += [("path", "L1_TO_L0A", bm * kc * eb, 1), ("path", "L1_TO_L0B", kc * bn * eb, 1),
                              ("cube", frac)]
                steps += [("path", p, bm * bn * ob, 1) for p in outs]
                tasks.append(steps)
    return tasks


def _flops_conv(n, nodes):
    w = nodes[n.inputs[1]]
    return 2.0 * math.prod(n.shape) * math.prod(w.shape[1:])


special.register("conv", _run_conv, _tasks_conv, unit="cube", flops=_flops_conv)

__all__ = ["conv"]
