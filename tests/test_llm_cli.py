"""`pypto-lab llm` / `pypto-lab serve`, `pypto_lab.llm.serve`, and more than one card."""

from __future__ import annotations

import json

import pytest

from pypto_lab.cli import main
from pypto_lab.llm import serve, simulate_generation


def test_llm_command_prints_the_report_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["llm", "llama-3-8b", "--batch", "4", "--prompt", "256", "--output", "32", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "TPOT" in text and "IncreFlashAttention" in text
    d = json.loads(out.read_text())
    assert d["batch"] == 4 and d["ttft_ms"] > 0 and d["tpot_ms"] > 0


def test_a_model_that_does_not_fit_is_an_error_with_the_fix(capsys):
    assert main(["llm", "llama-2-70b", "--batch", "1", "--prompt", "128", "--output", "16"]) == 2
    err = capsys.readouterr().err
    assert "usable per card" in err and "(--cards 4)" in err and "cards=4" not in err   # the CLI's own syntax


def test_serve_command_summarises_a_run(capsys):
    assert main(["serve", "llama-3-8b", "--requests", "40", "--rate", "20", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "40 requests" in text and "TTFT" in text and "output tokens/s" in text


def test_serve_reports_latency_percentiles_and_throughput():
    rep = serve("llama-3-8b", requests=60, rate=8.0, seed=1, progress=False)
    d = rep.to_dict()
    assert d["ttft_ms_p50"] <= d["ttft_ms_p90"] <= d["ttft_ms_p99"]
    assert d["output_tokens_per_s"] > 0 and d["requests_per_s"] > 0
    assert serve("llama-3-8b", requests=60, rate=8.0, seed=1, progress=False).to_dict()["e2e_ms_p50"] == d["e2e_ms_p50"]


def test_tensor_parallelism_splits_weights_and_pays_an_allreduce_per_layer():
    one = simulate_generation("llama-3-8b", batch=8, prompt_len=512, output_len=64)
    two = simulate_generation("llama-3-8b", batch=8, prompt_len=512, output_len=64, cards=2)
    assert two.tp == 2
    assert two.hbm.weights_bytes == pytest.approx(one.hbm.weights_bytes / 2, rel=1e-6)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.comm_ms > 0 and one.comm_ms == 0
    names = [k.name for k in two.decode_kernels]
    assert names.count("AllReduce_attention") == 1 and "AllReduce_mlp" in names
    assert next(k for k in two.decode_kernels if k.name == "AllReduce_mlp").count == 32
    assert two.tpot_ms < one.tpot_ms      # half the weights to read per card outweighs the all-reduces


def test_expert_parallelism_sends_tokens_by_all_to_all():
    rep = simulate_generation("mixtral-8x7b", batch=4, prompt_len=256, output_len=16, cards=4, ep=4)
    names = {k.name for k in rep.decode_kernels}
    assert {"AlltoAll_dispatch", "AlltoAll_combine", "GroupedMatmul_down"} <= names
    with pytest.raises(ValueError, match="expert parallelism"):
        simulate_generation("llama-3-8b", batch=1, prompt_len=64, output_len=8, cards=2, ep=2)
