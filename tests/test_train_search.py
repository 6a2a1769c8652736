"""The training-configuration search (`pypto_lab.explore.train_search`): every layout it lists fits
the card, is ranked by tokens/s, and is the step `simulate_step` runs for the same arguments."""

import pytest
import transformers

from pypto_lab.explore.train_search import SearchError, candidate_layouts, search_layouts
from pypto_lab.train import simulate_step


def _tiny():
    return transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                    num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
                                    max_position_embeddings=256)


def test_candidates_follow_megatrons_rules():
    cands = candidate_layouts(_tiny(), 8, 16, 256, per_server=8, megatron=True)
    assert cands
    for c in cands:
        assert c.tp * c.pp * c.cp * c.dp == 8
        assert 4 % c.tp == 0 and 4 % c.pp == 0                     # kv heads and layers split evenly
        assert c.mbs * c.dp * c.micro_batches == 16                # the global batch
        assert c.vpp == 1 or (c.pp > 1 and c.micro_batches % c.pp == 0 and (4 // c.pp) % c.vpp == 0)
        assert not (c.distributed_optimizer and c.dp * c.cp == 1)  # nothing to shard over


def test_search_ranks_fitting_layouts_and_matches_simulate_step():
    cfg = _tiny()
    s = search_layouts(cfg, 8, 16, 256, tp=(1, 2), pp=(1, 2), cp=(1, 2), micro_batch_sizes=(1, 2), local=True)
    assert s.rows and s.counts["costed"] == len(s.rows)
    speeds = [r["tokens_per_s"] for r in s.rows]
    assert speeds == sorted(speeds, reverse=True)
    assert all(r["peak_gib"] * 2 ** 30 <= 64 * 2 ** 30 for r in s.rows)
    # a tiny model fits without recomputation: every recomputing variant is dominated, never costed
    assert all(r["recompute"] == "none" for r in s.rows)
    assert s.counts["dominated"] == 2 * len(s.rows)
    best = s.best
    import torch
    ids = torch.zeros(best["micro_batch"], 256, dtype=torch.long)
    rep = simulate_step(cfg, {"input_ids": ids}, chip="Ascend910B2", **best["args"])
    assert rep.tokens_per_s == pytest.approx(best["tokens_per_s"], rel=0.02)
    assert rep.peak_hbm_bytes / 2 ** 30 == pytest.approx(best["peak_gib"], rel=1e-6)
    why = s.why()
    assert why.startswith("best: ") and "tokens/s per card" in why
    assert "tokens/s/card" in s.table()


def test_recomputation_is_chosen_only_when_needed():
    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=4,
                                   num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                                   max_position_embeddings=8192)
    s = search_layouts(cfg, 8, 64, 8192, tp=(1,), pp=(1,), cp=(1,), micro_batch_sizes=(8,), zero=(0, 1),
                       chip="Ascend910B2", local=True)
    # at 8 x 8k tokens per card the activations do not fit unless the layers are recomputed
    assert s.rows and {r["recompute"] for r in s.rows} == {"full"}


def test_bad_arguments_name_the_rule():
    with pytest.raises(SearchError, match="global_batch"):
        search_layouts(_tiny(), 8, 0, 256, local=True)
    with pytest.raises(SearchError, match="recompute"):
        search_layouts(_tiny(), 8, 16, 256, recompute=("sometimes",), local=True)
    with pytest.raises(SearchError, match="no layout"):
        search_layouts(_tiny(), 8, 3, 256, tp=(1,), pp=(1,), cp=(1,), local=True)   # 3 sequences over dp=8
