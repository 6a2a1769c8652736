"""One path from any workload to its cost: the same decoder layer costed through optimize() (a
captured Hugging Face model) and through the LLM engine gives the same kernels and the same time,
and no front end simulates a model's kernel behind the costers' back."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1] / "pypto_lab"
ENGINE_ONLY = ("Gather_embedding", "MatMul_lm_head", "ArgMax_sampling")   # outside the decoder layers


def _decoder_kernels_both_ways(kv_heads: int, batch: int, prompt: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    import pypto_lab
    from pypto_lab.llm import spec_of
    from pypto_lab.llm.engine import hardware
    from pypto_lab.llm.forward import forward_kernels
    from pypto_lab.llm.hf import capture_prefill

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=kv_heads, vocab_size=2000, max_position_embeddings=4096)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    cap = capture_prefill(model, batch=batch, prompt_len=prompt)
    stack = "vllm-ascend-aclgraph"
    rep = pypto_lab.optimize(cap.module, cap.inputs(prompt), chip="Ascend910B1", level=1, stack=stack).report()
    captured = [k for k in rep.kernels if k.name.split(":", 1)[1].startswith(("model.model.layers", "model.model.norm"))]
    hw = hardware("Ascend910B1", stack=stack)
    engine = [k for k in forward_kernels(spec_of(cfg), hw, prefill=[(prompt, 0)] * batch, strategy="exact")
              if k.name not in ENGINE_ONLY]
    return captured, engine


@pytest.mark.parametrize("kv_heads, batch, prompt", [(8, 1, 256), (2, 2, 384)])
def test_a_decoder_layer_costs_the_same_through_optimize_and_the_llm_engine(kv_heads, batch, prompt):
    """A Llama decoder (MHA and GQA) captured from transformers and run through optimize's passes
    (merged projections, RMSNorm, RoPE, SwiGLU, KV-cache writes, causal FlashAttention: the fusions
    the vLLM-Ascend stack applies) lowers to exactly the kernel specs the LLM engine builds for its
    prefill, the norms, projections, attention and MLP of every layer, and costs the same."""
    captured, engine = _decoder_kernels_both_ways(kv_heads, batch, prompt)
    ours = Counter(k.spec for k in captured)
    theirs = Counter()
    for k in engine:
        theirs[k.spec] += k.count
    assert ours == theirs, (f"only through optimize: {ours - theirs}", f"only in the engine: {theirs - ours}")
    t_opt = sum(k.time_us for k in captured)
    t_engine = sum(k.time_us for k in engine)
    assert t_opt == pytest.approx(t_engine, rel=0.02)


def test_the_engines_grid_strategy_stays_near_the_exact_prefill():
    """The grid strategy the engine uses for its many decode and serving steps, against the exact
    costs of one prefill: the same kernels, and the step within a tenth."""
    from transformers import LlamaConfig

    from pypto_lab.llm import spec_of
    from pypto_lab.llm.engine import hardware
    from pypto_lab.llm.forward import forward_kernels, step_time_us

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=2000, max_position_embeddings=4096)
    hw = hardware("Ascend910B1")
    exact = forward_kernels(spec_of(cfg), hw, prefill=[(384, 0)] * 2, strategy="exact")
    grid = forward_kernels(spec_of(cfg), hw, prefill=[(384, 0)] * 2, strategy="grid")
    assert [k.spec for k in exact] == [k.spec for k in grid]
    assert step_time_us(grid, hw.stack) == pytest.approx(step_time_us(exact, hw.stack), rel=0.10)


# modules that may simulate a single kernel themselves: the chip model, the costers, and the views and
# commands that teach one kernel at a time (the public API re-exports the functions)
MAY_SIMULATE = ("pypto_lab/hw/", "pypto_lab/kernels/", "pypto_lab/course/", "pypto_lab/pto/",
                "pypto_lab/viz/widgets.py", "pypto_lab/cli/commands.py")
SIMULATORS = {"simulate_matmul", "simulate_vector", "simulate_conv2d", "simulate_attention"}


def test_no_front_end_simulates_a_models_kernel_outside_the_costers():
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel.startswith(MAY_SIMULATE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in SIMULATORS:
                    offenders.append(f"{rel}:{node.lineno} {name}")
    assert not offenders, offenders
