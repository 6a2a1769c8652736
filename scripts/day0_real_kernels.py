#!/usr/bin/env python3
"""The real framework's model kernels (hicann/pypto ``models/``, not vendored) plugged into the LLM
engine's decode and prefill steps in place of the workbench's own (`pypto_lab.llm.plug`).

    python scripts/day0_real_kernels.py PYPTO_SRC [--batch 1] [--prompt 4096] [--output 16]

PYPTO_SRC is a checkout of the framework's repository. A model file is loaded as
``scripts/run_pypto_example.py`` runs it (``import pypto`` is ``pypto_lab.pto``, the NPU-only torch
API stood in by ``scripts/npu_on_cpu.py`` while it loads), its ``@pypto.frontend.jit`` kernel taken
from the module, and a `LayerKernel` gives it the arguments the file's own test gives it, at the
decode step's shapes on the card.

* `glm_moe_fusion`: GLM-4.5's ``moe_fusion_kernel`` (``models/glm_v4_5/glm_moe_fusion.py``): the
  router matmul in fp32, sigmoid scores, the correction bias, (group-limited) top-k and the
  renormalised weights, plus the **shared** expert with per-token int8 quantisation and int8
  weights in FRACTAL_NZ. It replaces the engine's router, MoeGatingTopK and shared-expert kernels;
  the routed experts stay the engine's (the file leaves them to a grouped matmul). The file's test
  runs the shared expert at intermediate 192 (GLM-4.5's 1,536 over 8 cards), so the setup is 16
  cards with tp 8 in w8a8.
* `deepseek_sparse_attention`: DeepSeek-V3.2's ``sparse_flash_attention_quant_d`` in place of
  IncreFlashAttention (16 cards, w8a16).
* `qwen3_next_chunk_gated_delta_rule`: Qwen3-Next's ``chunk_gated_delta_rule``
  (``models/qwen3_next/gated_delta_rule_impl.py``, run by ``qwen3_next_gated_delta_rule.py``): the
  **chunked** gated delta rule, the prompt's form (chunks of 128 tokens: within-chunk attention, the
  triangular inverse, the state carried from chunk to chunk), so it is plugged into the prefill of
  Qwen3-Next's 36 Gated DeltaNet layers (``phase="prefill"``) and the workbench's
  ``gated_delta_rule_decode`` runs the decode steps. Its test's layout: tokens of all sequences
  packed (TND: q, k ``[T, Nqk, 128]``, v ``[T, Nv, 128]``, beta and the log gate ``[T, Nv]``), the
  states ``[B, Nv, 128, 128]``, its constant masks, the cumulative sequence lengths ``[B + 1]``
  (read by the kernel: the step's prompt lengths), all fp32 as the test passes them. On 4 cards a
  card holds 4 key and 8 value heads, the test case ``b2_nqk4_nv8``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pypto_lab.kernels.ir import TensorMeta  # noqa: E402
from pypto_lab.llm.plug import LayerKernel, StepShape  # noqa: E402


def _script(name: str):
    """scripts/<name>.py as a module (registered under its name, as its dataclasses need)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_model_file(src: Path, rel: str) -> dict:
    """The namespace of ``models/<rel>`` of the checkout, loaded as run_pypto_example runs it (its own
    folder on sys.path, ``import pypto`` as pypto_lab.pto, the NPU stand-in installed while it loads)."""
    import pypto_lab.pto as pto

    rpe = _script("run_pypto_example")
    path = Path(src) / "models" / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in the checkout. Rule: PYPTO_SRC is a checkout of hicann/pypto with "
                                f"models/{rel}. Fix: clone the repository and pass its folder")
    code, _ = rpe.rewrite(path.read_text(encoding="utf-8"), str(path), golden=False)
    sys.modules.setdefault("pypto", pto)
    for sub in [m for m in list(sys.modules) if m.startswith("pypto_lab.pto.")]:
        sys.modules.setdefault("pypto" + sub[len("pypto_lab.pto"):], sys.modules[sub])
    saved = list(sys.path)
    sys.path.insert(0, str(path.parent))
    namespace = {"__name__": "__pto_model__", "__file__": str(path), "__builtins__": __builtins__}
    before = set(sys.modules)
    try:
        with npu_stand_in():
            exec(code, namespace)
    finally:
        sys.path[:] = saved
        # the model folder's own modules (each folder has a `utils` package) leave with it
        models = str(Path(src).resolve() / "models")
        for name in set(sys.modules) - before:
            m = sys.modules[name]
            where = [getattr(m, "__file__", None) or ""] + [str(p) for p in (getattr(m, "__path__", None) or [])]
            if any(w.startswith(models) for w in where):
                del sys.modules[name]
    return namespace


def glm_moe_fusion(src: Path) -> LayerKernel:
    """GLM-4.5's ``moe_fusion_kernel`` as the "moe" layer kind (see the module's docstring)."""
    ns = load_model_file(src, "glm_v4_5/glm_moe_fusion.py")
    kernel = ns["moe_fusion_kernel"]
    nz = _script("npu_on_cpu").NzTensor

    def args(s: StepShape):
        spec, b = s.spec, s.batch
        h, e, k, i = spec.hidden, spec.experts, spec.top_k, spec.shared_intermediate // s.hw.tp
        ins = [TensorMeta((b, h), "bfloat16"), TensorMeta((e, h), "float32"), TensorMeta((e,), "bfloat16"),
               TensorMeta((h, 2 * i), "int8"), TensorMeta((2 * i,), "bfloat16"), TensorMeta((i, h), "int8"),
               TensorMeta((h,), "bfloat16")]
        outs = [TensorMeta((b, k), "float32"), TensorMeta((b, k), "int32"), TensorMeta((b, h), "bfloat16"),
                spec.topk_groups, spec.expert_groups]
        return ins, outs

    def make_tensor(index: int, meta, shape):
        if not isinstance(meta, TensorMeta):
            return meta
        dt = getattr(torch, meta.dtype)
        t = torch.zeros(meta.shape, dtype=dt) if not dt.is_floating_point else torch.empty(meta.shape, dtype=dt)
        return torch.Tensor._make_subclass(nz, t) if index in (3, 5) else t      # w13 and w2 are FRACTAL_NZ

    return LayerKernel("moe", kernel, args=args, name="moe_fusion_kernel (hicann/pypto glm_v4_5)",
                       replaces=("MatMul_router", "MoeGatingTopK", "MatMul_shared_gate_up", "SwiGlu_shared",
                                 "MatMul_shared_down"), make_tensor=make_tensor, run_context=npu_stand_in)


@contextlib.contextmanager
def npu_stand_in():
    """scripts/npu_on_cpu.py installed for the kernel's run (its NZ weights are torch_npu tensors)."""
    stand_in = _script("npu_on_cpu").NpuOnCpu().install()
    try:
        yield
    finally:
        stand_in.uninstall()


def deepseek_sparse_attention(src: Path) -> LayerKernel:
    """DeepSeek-V3.2's ``sparse_flash_attention_quant_d`` (``models/deepseek_v32_exp/``, the decode
    variant, bf16 keys): the query's latent and RoPE parts, the paged latent cache and RoPE keys,
    the indexer's top-k positions, the block table and each sequence's length (read by the kernel:
    set to the step's context), one decode token per sequence. It replaces IncreFlashAttention;
    the group tile is the card's head count (the file's 128 is all of V3.2's heads on one card)."""
    ns = load_model_file(src, "deepseek_v32_exp/deepseekv32_sparse_flash_attention_quant.py")
    kernel, tiles = ns["sparse_flash_attention_quant_d"], ns["SaTileShapeConfig"]
    block = 128

    def args(s: StepShape):
        spec, b = s.spec, s.batch
        nq, r, rope, topk = spec.heads // s.hw.tp, spec.kv_lora_rank, spec.qk_rope_dim, int(spec.extra["index_topk"])
        blocks = -(-s.context // block)
        rows = b * blocks * block
        cfg = tiles(g_tile=min(128, nq), s_kv_tile=2048, gather_vec_tile_shape=[32, 512],
                    c1_tile_shape=[128, 128, 128, 128, 128, 128], v1_tile_shape=[8, 2048],
                    c2_tile_shape=[128, 128, 128, 128, 128, 128], v2_tile_shape=[64, 256])
        ins = [TensorMeta((b * nq, r), "bfloat16"), TensorMeta((b * nq, rope), "bfloat16"),
               TensorMeta((rows, r), "bfloat16"), TensorMeta((rows, rope), "bfloat16"), TensorMeta((rows, 4), "float32"),
               TensorMeta((b, topk), "int32"), TensorMeta((b, blocks), "int32"), TensorMeta((b,), "int32")]
        outs = [TensorMeta((b, 1, nq, r), "bfloat16"), nq, 1, (r + rope) ** -0.5, topk, block, blocks, cfg]
        return ins, outs

    def make_tensor(index: int, meta, shape):
        if not isinstance(meta, TensorMeta):
            return meta
        b, blocks = shape.batch, -(-shape.context // block)
        if index == 5:   # the indexer's picks: positions within the context (here its first topk tokens)
            return torch.arange(meta.shape[1], dtype=torch.int32).remainder(shape.context).repeat(b, 1)
        if index == 6:   # each sequence's blocks, in order
            return torch.arange(b * blocks, dtype=torch.int32).reshape(b, blocks)
        if index == 7:
            return torch.full((b,), shape.context, dtype=torch.int32)
        return torch.empty(meta.shape, dtype=getattr(torch, meta.dtype))

    return LayerKernel("attention", kernel, args=args, sparse=True, block=block,
                       name="sparse_flash_attention_quant_d (hicann/pypto deepseek_v32_exp)",
                       replaces=("IncreFlashAttention",), make_tensor=make_tensor, run_context=npu_stand_in)


def qwen3_next_chunk_gated_delta_rule(src: Path) -> LayerKernel:
    """Qwen3-Next's chunked gated delta rule as the prefill form of the "linear_attention" layer kind
    (see the module's docstring): the file's ``chunk_gated_delta_rule(b, nqk, nv, d, l)`` when every
    prompt is a whole number of 128-token chunks, ``chunk_gated_delta_rule_unaligned`` otherwise, as
    the file's ``pypto_chunk_gated_delta_rule_dyn`` chooses."""
    from pypto_lab.llm.plug import PluggedKernelError

    ns = load_model_file(src, "qwen3_next/qwen3_next_gated_delta_rule.py")
    chunk = 128                          # the test's L (gen_dims), the kernel's chunk

    def heads(s: StepShape) -> tuple[int, int, int]:
        x = s.spec.extra
        d = x["linear_key_head_dim"]
        if d != 128 or x["linear_value_head_dim"] != 128:
            raise PluggedKernelError(f"kernels['linear_attention']: the real chunk_gated_delta_rule in {s.spec.name}: "
                                     f"head dims {d} / {x['linear_value_head_dim']}. Rule: the file's kernel runs "
                                     "128-dim heads (gen_dims' D). Fix: a model with 128-dim linear-attention heads")
        return max(1, x["linear_num_key_heads"] // s.hw.tp), max(1, x["linear_num_value_heads"] // s.hw.tp), d

    def build(s: StepShape):
        nqk, nv, d = heads(s)
        aligned = all(c % chunk == 0 for c, _ in s.chunks)
        make = ns["chunk_gated_delta_rule" if aligned else "chunk_gated_delta_rule_unaligned"]
        return make(s.batch, nqk, nv, d, chunk)

    def args(s: StepShape):
        nqk, nv, d = heads(s)
        t, b, f = s.tokens, s.batch, "float32"
        ins = [TensorMeta((t, nqk, d), f), TensorMeta((t, nqk, d), f), TensorMeta((t, nv, d), f),
               TensorMeta((t, nv), f), TensorMeta((t, nv), f), TensorMeta((b, nv, d, d), f),
               TensorMeta((chunk, chunk), f), TensorMeta((chunk, chunk), f), TensorMeta((16, chunk), f),
               TensorMeta((b + 1,), "int32")]
        return ins, [TensorMeta((t, nv, d), f), TensorMeta((b, nv, d, d), f)]

    def make_tensor(index: int, meta, s: StepShape):
        if index == 6:                   # the test's constants (gen_inputs)
            return torch.tril(-torch.ones(chunk, chunk), diagonal=-1)
        if index == 7:
            return torch.ones(chunk, chunk).tril()
        if index == 8:                   # both variants take eye_data ([16, 128]), as the file's wrapper passes
            return torch.eye(16).repeat(1, 8)
        if index == 9:                   # cumulative prompt lengths: where each sequence's tokens start
            return torch.tensor([0] + [sum(c for c, _ in s.chunks[:i + 1]) for i in range(s.batch)],
                                dtype=torch.int32)
        return torch.empty(meta.shape, dtype=getattr(torch, meta.dtype))

    return LayerKernel("linear_attention", build, args=args, phase="prefill", make_tensor=make_tensor,
                       name="chunk_gated_delta_rule (hicann/pypto qwen3_next)")


def main(argv=None) -> int:
    from pypto_lab.llm import plug, simulate_generation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pypto_src", type=Path)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--output", type=int, default=16)
    a = ap.parse_args(argv)
    kw = dict(batch=a.batch, prompt_len=a.prompt, output_len=a.output, cards=16, tp=8, precision="w8a8")
    base = simulate_generation("glm-4.5", **kw)
    r = simulate_generation("glm-4.5", kernels={"moe": glm_moe_fusion(a.pypto_src)}, **kw)
    print(f"glm-4.5, 16 cards (tp 8) w8a8, batch {a.batch}, {a.prompt} + {a.output} tokens: TPOT "
          f"{base.tpot_ms:.3f} ms with the engine's kernels, {r.tpot_ms:.3f} ms with the real kernel")
    print(r.plugged_table())
    kw = dict(batch=a.batch, prompt_len=a.prompt, output_len=a.output, cards=16, precision="w8a16")
    base = simulate_generation("deepseek-v3.2", **kw)
    r = simulate_generation("deepseek-v3.2", kernels={"attention": deepseek_sparse_attention(a.pypto_src)}, **kw)
    print(f"deepseek-v3.2, 16 cards w8a16, batch {a.batch}, {a.prompt} + {a.output} tokens: TPOT "
          f"{base.tpot_ms:.3f} ms with the engine's kernels, {r.tpot_ms:.3f} ms with the real kernel")
    print(r.plugged_table())
    kw = dict(batch=a.batch, prompt_len=a.prompt, output_len=a.output, cards=4)
    base = simulate_generation("qwen3-next", **kw)
    r = simulate_generation("qwen3-next", kernels={"linear_attention": (
        qwen3_next_chunk_gated_delta_rule(a.pypto_src), plug.gated_delta_rule())}, **kw)
    print(f"qwen3-next, 4 cards fp16, batch {a.batch}, {a.prompt} + {a.output} tokens: TTFT {base.ttft_ms:.2f} ms with "
          f"the engine's kernels, {r.ttft_ms:.2f} ms with the real chunked kernel in the prefill; TPOT "
          f"{base.tpot_ms:.3f} ms, {r.tpot_ms:.3f} ms with gated_delta_rule_decode")
    print(r.plugged_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
