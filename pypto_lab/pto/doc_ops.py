"""The API documented by CANN PyPTO (docs/zh/api in hicann/pypto at commit 883e7df, 2026-08-22),
and how much of it ``pypto_lab.pto`` implements, checked by behaviour.

`DOCUMENTED` is the toctree of docs/zh/api/operation/index.md: 134 pages, 127 ops of the ``pypto``
namespace and 7 of ``pypto.experimental`` (named ``experimental-<op>`` there and here). `SECTIONS`
holds every section's pages (operation, tensor, config, datatype, symbolic, controlflow, element,
others). ``python -m pypto_lab.pto.doc_ops [--src PYPTO_SRC]`` runs, for every page, the behaviour
check of `doc_checks` (the documented thing run on small inputs against torch or the documented
value) and prints, per section, how many pages work, and why each other one does not; with
``--src`` it first checks that the page lists equal the checkout's docs. `coverage()` still answers
the narrower question of which op names can be called.
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


SECTIONS: dict[str, tuple[str, ...]] = {
    "operation": DOCUMENTED,
    "tensor": tuple(f"Tensor-{n}" for n in (
        "add", "amax", "amin", "assemble", "ceil", "clone", "concat", "cos", "cumprod", "cumsum", "dim", "div",
        "dtype", "exp", "exp2", "expand_clone", "expm1", "floor", "fmod", "format", "gather", "gcd",
        "get_cache_policy", "getitem", "id", "index_add", "index_add_", "log", "log10", "log2", "logical_not",
        "matmul", "maximum", "move", "mul", "name", "permute", "reciprocal", "remainder", "reshape", "round",
        "rsqrt", "scatter", "scatter_", "scatter_update", "set_cache_policy", "shape", "sigmoid", "sin", "softmax",
        "sqrt", "sub", "sum", "topk", "transpose", "tril", "tril_", "triu", "triu_", "trunc", "unsqueeze", "view",
        "where")) + ("Tensor_constructor", "Tensor_introduction"),
    "config": tuple(f"pypto-{n}" for n in (
        "frontend-jit", "get_codegen_options", "get_conv_tile_shapes", "get_cube_tile_shapes", "get_debug_options",
        "get_host_options", "get_pass_config", "get_pass_configs", "get_pass_default_config", "get_pass_options",
        "get_vec_tile_shapes", "get_verify_options", "reset_options", "set_codegen_options", "set_conv_tile_shapes",
        "set_cube_tile_shapes", "set_debug_options", "set_host_options", "set_matrix_size", "set_pass_config",
        "set_pass_default_config", "set_pass_options", "set_semantic_label", "set_vec_tile_shapes",
        "set_verify_options")),
    "datatype": ("CachePolicy", "CastMode", "DataType", "LogBaseType", "OpType", "OutType", "PrecisionType",
                 "ReLuType", "ReduceMode", "SaturationMode", "ScatterMode", "TileOpFormat", "TopKAlgo", "TransMode",
                 "pypto-bytes_of"),
    "symbolic": tuple(f"pypto-SymbolicScalar{n}" for n in (
        "-as_variable", "-concrete", "-is_concrete", "-is_expression", "-is_immediate", "-is_symbol", "-max", "-min",
        "_constructor", "_introduction")),
    "controlflow": tuple(f"pypto-{n}" for n in ("cond", "function", "is_loop_begin", "is_loop_end", "loop",
                                                 "loop_unroll")),
    "element": ("pypto-Element-dtype", "pypto-Element-value", "pypto-Element_constructor",
                "pypto-Element_introduction"),
    "others": tuple(f"pypto-{n}" for n in ("DYNAMIC", "from_torch", "frontend-function", "pass_verify_print",
                                            "pass_verify_save", "set_verify_golden_data")),
}


def pages_in_checkout(src) -> dict[str, tuple[str, ...]]:
    """The pages of each section of ``src``/docs/zh/api (a checkout of hicann/pypto), as `SECTIONS` names
    them (operation pages from the toctree, the others from the files)."""
    import re
    from pathlib import Path

    api = Path(src) / "docs" / "zh" / "api"
    out = {}
    toc = (api / "operation" / "index.md").read_text(encoding="utf-8")
    out["operation"] = tuple(dict.fromkeys(
        m.group(1).replace("pypto-experimental-", "experimental-").replace("pypto-", "", 1)
        for m in re.finditer(r"^(pypto-[\w-]+)\s*$", toc, re.M)))
    for sec in SECTIONS:
        if sec == "operation":
            continue
        names = sorted(p.stem for p in (api / sec).glob("*.md") if p.stem != "index")
        out[sec] = tuple(n.replace("pypto-Tensor", "Tensor") for n in names)
    return out


def behaviour(sections=None) -> dict:
    """Per section: (pages that work, {page: why not}) by the checks of `doc_checks`."""
    from .doc_checks import CHECKS, run_all

    results = run_all(sections)
    out = {}
    for sec, pages in SECTIONS.items():
        if sections and sec not in sections:
            continue
        ok, bad = [], {}
        for p in pages:
            if (sec, p) not in CHECKS:
                bad[p] = "no behaviour check"
            elif results[(sec, p)] is None:
                ok.append(p)
            else:
                bad[p] = results[(sec, p)]
        out[sec] = (ok, bad)
    return out


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


def main(argv=None) -> int:
    import argparse
    import os
    import tempfile

    ap = argparse.ArgumentParser(description="the documented API of CANN PyPTO, checked by behaviour")
    ap.add_argument("--src", default=os.environ.get("PYPTO_SRC"), help="a checkout of hicann/pypto: check the page lists")
    ap.add_argument("--section", action="append", help="only these sections")
    args = ap.parse_args(argv)
    if args.src and os.path.isdir(os.path.join(args.src, "docs", "zh", "api")):
        real = pages_in_checkout(args.src)
        for sec, pages in SECTIONS.items():
            if set(real.get(sec, ())) != set(pages):
                print(f"{sec}: the page list differs from {args.src}: missing here "
                      f"{sorted(set(real.get(sec, ())) - set(pages))}, extra here {sorted(set(pages) - set(real.get(sec, ())))}")
                return 1
        print(f"page lists equal those of {args.src}/docs/zh/api")
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:   # the swimlane and verify files of the checks' runs
        os.chdir(tmp)
        try:
            res = behaviour(args.section)
        finally:
            os.chdir(cwd)
    total_ok = total = 0
    for sec, (ok, bad) in res.items():
        n = len(ok) + len(bad)
        total_ok, total = total_ok + len(ok), total + n
        print(f"{sec:12s} {len(ok):4d} of {n:4d} pages work")
        for page, why in bad.items():
            print(f"    {page}: {why}")
    print(f"all sections {total_ok} of {total} documented pages work, behaviour checked ({SOURCE.rsplit(':', 1)[0]}:"
          "docs/zh/api)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
