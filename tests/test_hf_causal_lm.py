"""Hugging Face causal LMs on the workbench: captured as they come, built from configs on the meta
device, and their prefill and decode step (KV cache as explicit tensors) exported once for every
length and run by the runtime with fp16 numerics against eager transformers."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from pypto_lab import optimize  # noqa: E402
from pypto_lab.capture import CaptureError, capture  # noqa: E402
from pypto_lab.capture.hf_models import is_causal_lm  # noqa: E402
from pypto_lab.cli import main  # noqa: E402
from pypto_lab.llm import hf  # noqa: E402
from pypto_lab.runtime.interpreter import RuntimeInputError  # noqa: E402

VOCAB = 256
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 256}
GPT2 = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": VOCAB, "n_positions": 256}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
CONFIGS = {
    "GPT2Model": ("gpt2", GPT2),
    "GPT2LMHeadModel": ("gpt2", GPT2),
    "LlamaForCausalLM": ("llama", SMALL),
    "Qwen2ForCausalLM": ("qwen2", SMALL),
    "Qwen3ForCausalLM": ("qwen3", {**SMALL, "head_dim": 16}),
    "Qwen3MoeForCausalLM": ("qwen3_moe", {**SMALL, "head_dim": 16, **MOE}),
    "Qwen2MoeForCausalLM": ("qwen2_moe", {**SMALL, **MOE, "shared_expert_intermediate_size": 64}),
    "MixtralForCausalLM": ("mixtral", {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}),
}


def build(cls_name: str) -> torch.nn.Module:
    kind, fields = CONFIGS[cls_name]
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(kind, **fields)
    return getattr(transformers, cls_name)(config).eval()


def ids(batch: int = 1, seq: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama():
    return build("LlamaForCausalLM")


@pytest.fixture(scope="module")
def gpt2():
    return build("GPT2LMHeadModel")


# ---- 1. capture as they come ----------------------------------------------------------------------

@pytest.mark.parametrize("cls_name", list(CONFIGS))
def test_transformers_models_optimize_as_they_come(cls_name):
    model = build(cls_name)
    x = ids()
    with torch.no_grad():
        eager = model(x)  # as it comes: a cache in the output, which torch.export refuses
    assert eager["cache"] is not None
    optimized = optimize(model, (x,), chip="Ascend910B1", level=1, precision="fp32")
    report = optimized.report()
    assert report.latency_us > 0
    out = optimized(x)
    with torch.no_grad():
        ref = model(x, use_cache=False)
    ref = ref.logits if hasattr(ref, "logits") else ref.last_hidden_state
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert set(report.fallback_ops) == set()   # a MoE layer's routing too (topk, sort, histc) runs on the NPU
    if "Moe" in cls_name or "Mixtral" in cls_name:
        grouped = [n for n in optimized.graph.nodes if n.target == "transformers.grouped_mm_fallback.default"]
        assert len(grouped) == 4 and all(n.unit == "cube" for n in grouped)  # gate_up and down, 2 layers
        # 8 tokens x top-2 over 4 experts: costed as 4 experts of 4 tokens, every expert's weight read
        assert [(n.kernel.batch, n.kernel.m) for n in grouped] == [(4, 4)] * 4


def test_encoder_models_are_not_adapted():
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                                          intermediate_size=128, vocab_size=VOCAB))
    assert not is_causal_lm(bert)
    assert is_causal_lm(build("GPT2Model")) and is_causal_lm(build("LlamaForCausalLM"))


def test_a_failed_transformers_export_says_what_to_do(llama, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("some layer does not export")

    monkeypatch.setattr(torch.export, "export", refuse)
    with pytest.raises(CaptureError) as err:
        capture(llama, (ids(seq=3),))
    msg = str(err.value)
    assert "some layer does not export" in msg and "use_cache=False" in msg and "capture_decode_step" in msg


# ---- 2. configs without weights ---------------------------------------------------------------------

def test_build_causal_lm_from_a_config_a_dict_a_path_and_a_name(tmp_path):
    fields = {"model_type": "llama", **SMALL}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    config = transformers.LlamaConfig(**SMALL)
    for spec in (config, fields, str(tmp_path / "config.json"), tmp_path):
        model = hf.build_causal_lm(spec)
        assert type(model).__name__ == "LlamaForCausalLM" and model.config.hidden_size == 64
        assert all(p.is_meta for p in model.parameters())
    named = hf.build_causal_lm("llama-2-7b")
    assert named.config.hidden_size == 4096 and named.config.num_hidden_layers == 32
    assert named.config.intermediate_size == 11008 and named.config.vocab_size == 32000
    cpu = hf.build_causal_lm(fields, device="cpu")
    assert not any(p.is_meta for p in cpu.parameters())


@pytest.mark.parametrize(("spec", "words"), [
    ("llama-9000b", ["unknown model name 'llama-9000b'", "llama-2-7b"]),
    ("missing/config.json", ["config path 'missing/config.json' does not exist", "config.json"]),
    ({"hidden_size": 8}, ["no model_type", "hidden_size", "\"model_type\": \"llama\""]),
    ({"model_type": "no-such-type"}, ["model_type 'no-such-type' is not known"]),
])
def test_build_causal_lm_errors_name_the_value_and_the_fix(spec, words):
    with pytest.raises(hf.HFModelError) as err:
        hf.build_causal_lm(spec)
    for word in words:
        assert word in str(err.value)


def test_a_meta_model_is_costed_like_the_real_one_and_refuses_to_run():
    fields = {"model_type": "llama", **SMALL}
    meta = hf.build_causal_lm(fields)
    cpu = hf.build_causal_lm(fields, device="cpu")
    x = ids(seq=16)
    on_meta = optimize(meta, (x,), chip="Ascend910B1", level=1, precision="fp16")
    on_cpu = optimize(cpu, (x,), chip="Ascend910B1", level=1, precision="fp16")
    assert [(n.target, n.outputs) for n in on_meta.graph.nodes] == [(n.target, n.outputs) for n in on_cpu.graph.nodes]
    assert on_meta.report().latency_us == pytest.approx(on_cpu.report().latency_us)
    with pytest.raises(RuntimeInputError) as err:
        on_meta(x)
    msg = str(err.value)
    assert "meta device" in msg and "model.embed_tokens.weight" in msg and "device='cpu'" in msg


def test_report_command_takes_an_hf_config(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"model_type": "qwen2", **SMALL}))
    assert main(["report", f"hf:{path}", "--chip", "Ascend910B1", "--seq", "16", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "Qwen2ForCausalLM on Ascend910B1" in out and "kernels" in out
    assert main(["report", "hf:llama-9000b"]) == 2
    assert "unknown model name 'llama-9000b'" in capsys.readouterr().err


# ---- 3. decode step and prefill, exported once --------------------------------------------------------

def count_exports(monkeypatch) -> list:
    calls = []
    real = torch.export.export

    def counted(*args, **kwargs):
        calls.append(kwargs.get("dynamic_shapes"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    return calls


def test_one_decode_export_serves_every_context(llama, monkeypatch):
    calls = count_exports(monkeypatch)
    step = hf.capture_decode_step(llama, batch=2, context=6)
    assert step.dynamic and step.note == "" and step.seconds > 0 and len(calls) == 1 and calls[0] is not None
    layers, kv_heads, head_dim = hf.kv_layout(llama.config)
    for ctx in (1, 6, 37):
        graph = step.graph(ctx)
        inputs = [v.info.shape for v in graph.values.values() if v.kind == "input"]
        assert inputs[:2] == [(2, 1), (2, 1)]
        assert inputs[2:] == [(2, kv_heads, ctx, head_dim)] * (2 * layers)
        outputs = [graph.info(o).shape for o in graph.outputs]
        assert outputs == [(2, 1, VOCAB)] + [(2, kv_heads, ctx + 1, head_dim)] * (2 * layers)
        assert not any(n.target in ("aten.sym_size.int", "<built-in function add>") for n in graph.nodes)  # sizes
    assert len(calls) == 1  # every context specialised from the one export


def test_one_prefill_export_serves_every_prompt_length(gpt2, monkeypatch):
    calls = count_exports(monkeypatch)
    step = hf.capture_prefill(gpt2, batch=1, prompt_len=8)
    assert step.dynamic and len(calls) == 1
    for seq in (3, 8, 50):
        graph = step.graph(seq)
        assert graph.info(graph.outputs[0]).shape == (1, seq, VOCAB)
        assert graph.info(graph.outputs[1]).shape == (1, 4, seq, 16)
    assert len(calls) == 1


def test_a_length_the_export_cannot_serve_is_refused(llama):
    step = hf.capture_decode_step(llama, context=4, max_context=32)
    with pytest.raises(hf.HFModelError, match=r"context 40 is outside 1\.\.32"):
        step.inputs(40)
    with pytest.raises(hf.HFModelError, match="context = 300"):
        hf.capture_decode_step(llama, context=300)
    with pytest.raises(hf.HFModelError, match="needs a transformers decoder-only model"):
        hf.capture_decode_step(torch.nn.Linear(2, 2))


def test_without_a_dynamic_export_each_context_is_captured_on_its_own(llama, monkeypatch):
    def refuse(*args, **kwargs):
        raise CaptureError("the context length cannot be dynamic here")

    monkeypatch.setattr(hf, "export_dynamic", refuse)
    step = hf.capture_decode_step(llama, context=4)
    assert not step.dynamic and "cannot be dynamic here" in step.note and "captured on its own" in step.note
    calls = count_exports(monkeypatch)
    for ctx in (4, 9, 4):
        graph = step.graph(ctx)
        assert graph.info(graph.outputs[1]).shape[2] == ctx + 1
    assert len(calls) == 2 and calls == [None, None]  # one static export per new context, memoised


def test_decode_costs_less_than_prefill_on_a_meta_model():
    model = hf.build_causal_lm({"model_type": "llama", **SMALL, "num_hidden_layers": 4, "hidden_size": 256,
                                "intermediate_size": 512})
    prefill = hf.capture_prefill(model, prompt_len=128)
    decode = hf.capture_decode_step(model, context=128)
    p = optimize(prefill.module, prefill.inputs(), chip="Ascend910B1", level=1, precision="fp16").report()
    d = optimize(decode.module, decode.inputs(), chip="Ascend910B1", level=1, precision="fp16").report()
    assert 0 < d.latency_us < p.latency_us


# ---- 4. numerics: prefill then decode steps through the runtime, K/V fed back ---------------------------

def eager_generation(model, prompt, tokens):
    """Eager transformers: the prompt, then one token at a time with its own cache."""
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        logits, cache = [out.logits], out["cache"]
        for i, tok in enumerate(tokens):
            pos = torch.full((prompt.shape[0], 1), prompt.shape[1] + i)
            out = model(tok, cache=cache, position_ids=pos, use_cache=True)
            logits.append(out.logits)
            cache = out["cache"]
    return logits, [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("which", ["llama", "gpt2", "Qwen3ForCausalLM", "MixtralForCausalLM"])
def test_decode_steps_on_the_runtime_match_eager_transformers_in_fp16(which, request):
    model = request.getfixturevalue(which) if which in ("llama", "gpt2") else build(which)
    batch, prompt_len, steps = 2, 5, 4
    prompt = ids(batch, prompt_len, seed=1)
    tokens = [ids(batch, 1, seed=10 + i) for i in range(steps)]
    ref, ref_cache = eager_generation(model, prompt, tokens)
    prefill = hf.capture_prefill(model, batch, prompt_len)
    decode = hf.capture_decode_step(model, batch, prompt_len)
    positions = torch.arange(prompt_len).expand(batch, prompt_len)
    optimized = optimize(prefill.module, (prompt, positions), level=1, precision="fp16")
    logits, past = optimized(prompt, positions)
    errors = [(logits - ref[0]).abs().max().item() / ref[0].abs().max().item()]
    for i, tok in enumerate(tokens):
        pos = torch.full((batch, 1), prompt_len + i)
        step = optimize(decode.module, (tok, pos, past), level=1, precision="fp16")
        assert step.cube_precision == "fp16"
        logits, past = step(tok, pos, past)  # the new K/V, fed back
        assert past[0][0].shape[2] == prompt_len + i + 1
        errors.append((logits - ref[i + 1]).abs().max().item() / ref[i + 1].abs().max().item())
    # fp16 storage (unit roundoff 2^-11 ~ 4.9e-4) through two layers: within 8 roundoffs of the logits' scale,
    # and not fp32-exact (the fp16 numerics did run)
    assert max(errors) < 8 * 2.0 ** -11, errors
    assert max(errors) > 1e-5, errors
    for (k, v), (rk, rv) in zip(past, ref_cache, strict=True):
        torch.testing.assert_close(k, rk, rtol=0, atol=8 * 2.0 ** -11 * rk.abs().max().item())
        torch.testing.assert_close(v, rv, rtol=0, atol=8 * 2.0 ** -11 * rv.abs().max().item())
    # the check can fail: the last step on an emptied cache is far off
    empty = tuple((torch.zeros_like(k[:, :, :-1]), torch.zeros_like(v[:, :, :-1])) for k, v in past)
    wrong, _ = step(tokens[-1], torch.full((batch, 1), prompt_len + steps - 1), empty)
    assert (wrong - ref[-1]).abs().max().item() / ref[-1].abs().max().item() > 8 * 2.0 ** -11


@pytest.mark.parametrize("cls_name", list(CONFIGS))
def test_every_model_exports_its_decode_step_once(cls_name, monkeypatch):
    model = build(cls_name)
    calls = count_exports(monkeypatch)
    step = hf.capture_decode_step(model, batch=1, context=4)
    assert step.dynamic, step.note
    short = optimize(step.module, step.inputs(4), chip="Ascend910B1", level=1, precision="fp16").report()
    long = optimize(step.module, step.inputs(200), chip="Ascend910B1", level=1, precision="fp16").report()
    assert len(calls) == 1
    assert 0 < short.latency_us < long.latency_us  # attention over 200 cached tokens costs more than over 4
    assert set(long.fallback_ops) == set()
