"""Whole-workload figures for `check_parity.py --parts models`: models through `optimize`, LLMs
through `simulate_generation` and `serve`, and training steps through `simulate_step`.

Each case keeps the figures a user reads (latency, TTFT, TPOT, step time, HBM) and every kernel's
time, so a refactor of the path from workload to cost shows where a number moved. Figures are
compared at a relative tolerance of 1 % (`REL_MODELS`): the kernel-level parts (hw, pto) are
compared exactly. Only public entry points are used, so a reference recorded before a
restructuring of the package is checked after it.
"""

from __future__ import annotations

import time

import torch

REL_MODELS = 0.01


def _zero_stack(fn, default: str, launch_us: float = 0.0) -> dict:
    """``stack=`` for ``fn``: its default stack with no launch, dispatch or host cost (the figures
    of a workbench that charged none), or nothing for an ``fn`` that takes no stack (the reference
    recorded before stacks existed); ``launch_us`` there becomes the old ``launch_us=`` argument."""
    import inspect

    params = inspect.signature(fn).parameters
    if "stack" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return {"launch_us": launch_us} if launch_us else {}
    from pypto_lab.stack import get_stack

    return {"stack": get_stack(default).with_values(dispatch_us=0.0, launch_us=launch_us, step_host_us=0.0)}


def _optimize_cases():
    # (label, zoo model, batch, seq, chip, level, precision)
    return [
        ("resnet50 b1 910A L0", "resnet50", 1, None, "Ascend910A", 0, "fp16"),
        ("resnet50 b1 910A L1", "resnet50", 1, None, "Ascend910A", 1, "fp16"),
        ("resnet50 b8 910B1 L2", "resnet50", 8, None, "Ascend910B1", 2, "fp16"),
        ("resnet50 b8 910B1 L3", "resnet50", 8, None, "Ascend910B1", 3, "fp16"),
        ("resnet50 b4 310P3 L2 int8", "resnet50", 4, None, "Ascend310P3", 2, "int8"),
        ("bert-base b1 910A L0", "bert-base", 1, 128, "Ascend910A", 0, "fp16"),
        ("bert-base b1 910A L1", "bert-base", 1, 128, "Ascend910A", 1, "fp16"),
        ("bert-base b8 910B1 L3", "bert-base", 8, 128, "Ascend910B1", 3, "fp16"),
        ("bert-base b4 310P3 L2", "bert-base", 4, 128, "Ascend310P3", 2, "fp16"),
    ]


def optimize_figures() -> dict:
    import pypto_lab
    from pypto_lab.models.zoo import load_model

    out = {}
    for label, name, batch, seq, chip, level, precision in _optimize_cases():
        model, inputs = load_model(name, batch=batch, seq=seq)
        model.eval()
        rep = pypto_lab.optimize(model, inputs, chip=chip, level=level, precision=precision,
                                 **_zero_stack(pypto_lab.optimize, "atc-om")).report()
        out[label] = {
            "latency_us": float(rep.latency_us), "kernels": len(rep.kernels),
            "kernel_time_us": [float(k.time_us) for k in rep.kernels],
            "kernel_gm_bytes": [float(k.gm_bytes) for k in rep.kernels],
            "passes_us": [float(p.latency_us) for p in rep.passes],
        }
    return out


def _llm_cases():
    # (label, model, kwargs of simulate_generation)
    return [
        ("qwen2-7b b1", "qwen2-7b", dict(batch=1, prompt_len=128, output_len=128)),
        ("qwen2-7b b16", "qwen2-7b", dict(batch=16, prompt_len=512, output_len=256)),
        ("qwen2-7b b4 w8a16 kv int8", "qwen2-7b", dict(batch=4, prompt_len=256, output_len=64, precision="w8a16",
                                                        kv_dtype="int8")),
        ("chatglm3-6b b8", "chatglm3-6b", dict(batch=8, prompt_len=1024, output_len=128)),
        ("llama-2-70b x8 b1", "llama-2-70b", dict(batch=1, prompt_len=128, output_len=128, cards=8)),
        ("mixtral-8x7b x8 b8", "mixtral-8x7b", dict(batch=8, prompt_len=256, output_len=64, cards=8)),
        ("qwen3-30b-a3b x4 ep4 b8", "qwen3-30b-a3b", dict(batch=8, prompt_len=256, output_len=64, cards=4, ep=4)),
        ("deepseek-v3 x16 b4 w8a16", "deepseek-v3", dict(batch=4, prompt_len=512, output_len=64, cards=16,
                                                         precision="w8a16")),
        ("qwen2-7b b8 launch 10us", "qwen2-7b", dict(batch=8, prompt_len=128, output_len=64, _launch=10.0)),
        ("llama-3-8b 910B3 bf16 b2", "llama-3-8b", dict(batch=2, prompt_len=2048, output_len=32, chip="Ascend910B3",
                                                       precision="bf16")),
    ]


def _kernel_rows(kernels) -> list:
    return [[k.name, int(k.count), float(k.time_us)] for k in kernels]


def llm_figures() -> dict:
    from pypto_lab.llm import serve, simulate_generation

    out = {}
    for label, model, kw in _llm_cases():
        kw = dict(kw)
        stack = _zero_stack(simulate_generation, "vllm-ascend-aclgraph", kw.pop("_launch", 0.0))
        r = simulate_generation(model, **kw, **stack)
        out[label] = {"ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "comm_ms": r.comm_ms,
                      "step_vs_context": [float(t) for _, t in r.step_vs_context],
                      "peak_hbm_bytes": float(r.hbm.peak_bytes), "weights_bytes": float(r.hbm.weights_bytes),
                      "prefill": _kernel_rows(r.prefill_kernels), "decode": _kernel_rows(r.decode_kernels)}
    s = serve("qwen2-0.5b", requests=120, rate=20.0, seed=3, progress=False,
              **_zero_stack(serve, "vllm-ascend-aclgraph"))
    d = s.to_dict() if hasattr(s, "to_dict") else {}
    out["serve qwen2-0.5b 120 req @20/s"] = {k: float(v) for k, v in d.items()
                                             if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return out


def _train_cases():
    import torchvision
    from transformers import BertConfig, BertForSequenceClassification, LlamaConfig

    F = torch.nn.functional
    torch.manual_seed(0)
    resnet = torchvision.models.resnet50()
    img = (torch.randn(8, 3, 224, 224), torch.randint(0, 1000, (8,)))
    bert = BertForSequenceClassification(BertConfig())
    ids = torch.randint(0, 30522, (8, 128))
    bert_batch = {"input_ids": ids, "labels": torch.randint(0, 2, (8,))}
    llama = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=8, vocab_size=8000)
    tok = torch.randint(0, 8000, (2, 256))
    lm_batch = {"input_ids": tok, "labels": tok}
    return [
        ("resnet50 b8 O2", resnet, img, F.cross_entropy, {}),
        ("resnet50 b8 O1 x8 cards", resnet, img, F.cross_entropy, dict(amp="O1", cards=8)),
        ("resnet50 b8 checkpoint sgd", resnet, img, F.cross_entropy, dict(checkpoint=True, optimizer="sgd")),
        ("bert-base b8", bert, bert_batch, None, {}),
        ("bert-base b8 x8 cards fp32", bert, bert_batch, None, dict(cards=8, precision="fp32")),
        ("llama-like b2 s256", llama, lm_batch, None, {"_causal": True}),
        ("llama-like b2 s256 tp4 mc2", llama, lm_batch, None, dict(cards=8, tp=4, mc2=True, sequence_parallel=True,
                                                                   _causal=True)),
    ]


def train_figures() -> dict:
    from pypto_lab.train import simulate_step

    out = {}
    for label, model, batch, loss_fn, kw in _train_cases():
        kw = dict(kw)
        stack = _zero_stack(simulate_step, "mindspeed" if kw.pop("_causal", False) else "torch_npu-eager")
        r = simulate_step(model, batch, loss_fn, **kw, **stack)
        out[label] = {"step_ms": r.step_ms, "forward_ms": r.forward_ms, "backward_ms": r.backward_ms,
                      "optimizer_ms": r.optimizer_ms, "comm_ms": r.comm_ms, "exposed_comm_ms": r.exposed_comm_ms,
                      "tp_comm_ms": r.tp_comm_ms, "peak_hbm_bytes": float(r.peak_hbm_bytes),
                      "kernels": len(r.kernels), "kernel_time_us": [float(k.time_us) for k in r.kernels]}
    return out


def model_figures() -> dict:
    out = {}
    for part, fn in (("optimize", optimize_figures), ("llm", llm_figures), ("train", train_figures)):
        t0 = time.perf_counter()
        out[part] = fn()
        print(f"  models/{part}: {len(out[part])} cases in {time.perf_counter() - t0:.0f} s")
    return out
