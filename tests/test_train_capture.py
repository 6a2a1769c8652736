"""Training steps of models that used to stop the capture, and LoRA: a value the forward reads back
(Marian), a contrastive loss with no label key (CLIP), ReLU6's gradient on the NPU, adapters on a
frozen model."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from pypto_lab.train import TrainConfigError, simulate_step

F = nn.functional


def test_a_value_the_forward_reads_back_is_a_host_sync():
    cfg = transformers.MarianConfig(vocab_size=500, d_model=32, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                    decoder_ffn_dim=64, max_position_embeddings=32, pad_token_id=0,
                                    decoder_start_token_id=0)
    ids = torch.randint(1, 500, (2, 8))
    rep = simulate_step(transformers.MarianMTModel(cfg), {"input_ids": ids, "labels": ids})
    syncs = [k for k in rep.kernels if k.name.startswith("host sync")]
    # transformers' mask builder asks whether any token is padded: one read per forward
    assert len(syncs) == 1 and syncs[0].spec.op == "aten._local_scalar_dense"
    assert any("_local_scalar_dense" in n for n in rep.notes) and not rep.unmapped_ops


def test_clip_trains_on_its_contrastive_loss_with_return_loss():
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=1, eos_token_id=2),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16, patch_size=8), projection_dim=16)
    batch = {"input_ids": torch.randint(3, 500, (4, 8)), "pixel_values": torch.randn(4, 3, 16, 16),
             "return_loss": True}
    rep = simulate_step(transformers.CLIPModel(cfg), batch)
    assert rep.step_ms > 0 and rep.batch == 4
    with pytest.raises(Exception, match="return_loss=True"):
        simulate_step(transformers.CLIPModel(cfg), {k: v for k, v in batch.items() if k != "return_loss"})


def test_relu6_and_average_pooling_gradients_run_on_the_npu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU6(), nn.AvgPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 4 * 4, 10))
    rep = simulate_step(model, (torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))), F.cross_entropy)
    ops = {getattr(k.spec, "op", "") for k in rep.kernels if k.phase == "backward"}
    assert {"HardtanhGrad", "AvgPoolGrad"} <= ops and not rep.unmapped_ops


def test_lora_trains_the_adapters_only():
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=500)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    ids = {"input_ids": torch.randint(0, 500, (2, 32))}
    full = simulate_step(model, ids)
    lora = simulate_step(model, ids, lora=dict(r=4, targets=("q_proj", "v_proj")))
    adapters = 2 * ((256 * 4 + 4 * 256) + (256 * 4 + 4 * 128))   # two layers: q (256 out), v (2 KV heads x 64)
    assert lora.memory["optimizer state"] == adapters * 8   # Adam's two fp32 moments, adapters only
    assert lora.memory["weights"] > full.memory["weights"]  # the frozen model is still held
    dw = [k for k in lora.kernels if k.phase == "backward" and getattr(k.spec, "op", "") == "MatMulV2"
          and k.spec.m == 256 and k.spec.n == 512]           # the MLP's weight gradients: frozen, none
    assert not dw
    assert all(p.requires_grad for p in model.parameters())   # the model is given back as it was
    assert any(n.startswith("LoRA: rank 4 adapters on 4 linear layers") for n in lora.notes)
    with pytest.raises(TrainConfigError, match="match no linear layer"):
        simulate_step(model, ids, lora=dict(r=4, targets=("nope",)))
