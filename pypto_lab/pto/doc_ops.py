"""The operations documented by CANN PyPTO, and which of them ``pypto_lab.pto`` implements.

`DOCUMENTED` is the toctree of docs/zh/api/operation/index.md in hicann/pypto at commit 883e7df
(2026-08-22): 134 pages, 127 ops of the ``pypto`` namespace and 7 of ``pypto.experimental``
(named ``experimental-<op>`` there and here). ``python -m pypto_lab.pto.doc_ops`` prints which
exist in this package and which do not.
"""

from __future__ import annotations

SOURCE = "hicann/pypto@883e7df:docs/zh/api/operation/index.md"

DOCUMENTED = (
    "abs", "acos", "acosh", "add", "amax", "amin", "arange", "argmax", "argmin", "argsort", "asin", "asinh",
    "assemble", "atan", "atan2", "atanh", "atomic_add", "axpy_", "bitwise_and", "bitwise_left_shift",
    "bitwise_not", "bitwise_or", "bitwise_right_shift", "bitwise_xor", "cast", "cbrt", "ceil", "ceil_div", "clip",
    "clone", "concat", "conv", "cos", "cosh", "cumprod", "cumsum", "deinterleave", "dequantize", "div", "eq",
    "erf", "erfc", "exp", "exp2", "expand_clone", "expand_exp_dif", "experimental-gather_in_l1",
    "experimental-gather_in_ub", "experimental-get_operation_options", "experimental-online_softmax",
    "experimental-online_softmax_update", "experimental-set_operation_options",
    "experimental-transposed_batchmatmul", "expm1", "fillpad", "floor", "floor_div", "fmod", "full", "gather",
    "gathermask", "gcd", "ge", "gt", "hypot", "index_add", "index_add_", "index_add__ub", "index_add_ub",
    "index_put_", "index_select", "interleave", "isfinite", "isnan", "le", "log", "log10", "log1p", "log2",
    "logical_and", "logical_not", "lrelu", "lt", "matmul", "maximum", "minimum", "mul", "ne", "neg", "normal",
    "one_hot", "ones", "pack", "pad", "permute", "pow", "prelu", "prod", "quant_mx", "quantize", "reciprocal",
    "relu", "remainder", "reshape", "rms_norm", "round", "rsqrt", "scaled_mm", "scatter", "scatter_",
    "scatter_update", "sigmoid", "sign", "signbit", "sin", "sinh", "softmax", "sqrt", "sub", "sum", "tan", "tanh",
    "topk", "transpose", "tril", "triu", "trunc", "uniform", "unpack", "unsqueeze", "var", "view", "where",
    "zeros",
)


def implemented(name: str) -> bool:
    """Whether documented op ``name`` is callable from ``pypto_lab.pto`` (``experimental-x``: from
    ``pypto_lab.pto.experimental``)."""
    import pypto_lab.pto as pypto

    if name.startswith("experimental-"):
        ns = getattr(pypto, "experimental", None)
        return ns is not None and callable(getattr(ns, name.split("-", 1)[1], None))
    return callable(getattr(pypto, name, None))


def coverage() -> tuple[list[str], list[str]]:
    """(implemented, missing) documented op names, in the docs' order."""
    have = [n for n in DOCUMENTED if implemented(n)]
    return have, [n for n in DOCUMENTED if n not in have]


if __name__ == "__main__":
    have, missing = coverage()
    print(f"{len(have)} of {len(DOCUMENTED)} documented ops implemented ({SOURCE})")
    print("missing:", ", ".join(missing))
