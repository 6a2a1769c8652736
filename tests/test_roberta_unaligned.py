"""fairseq's RoBERTa as the ModelZoo rows ran it, and what the 310P3 does at a sequence length that
is not a multiple of 16: Reshape + Transpose pairs GE cannot fuse into ConfusionTransposeD run as
TransposeD kernels, and row-wise kernels over rows that are not whole 32-byte blocks move and
compute row by row on a core without DataCopyPad."""

import torch
from torch import nn

from pypto_lab.compiler.optimize import optimize
from pypto_lab.hw.capabilities import capabilities
from pypto_lab.hw.chip import get_chip
from pypto_lab.hw.kernels import simulate_vector
from pypto_lab.models.fairseq_roberta import FairseqRoberta, build
from pypto_lab.validation.inference_rows import TORCHAIE_STACK, builder_of, mechanisms_of
from pypto_lab.validation.validate import BUILDERS, published_rows


def test_fairseq_roberta_has_fairseqs_structure_and_head():
    model, (tokens,) = build(2, 20)
    assert tokens.shape == (2, 20) and tokens.dtype == torch.int64
    assert model(tokens).shape == (2, 2)
    attn = model.layers[0].self_attn
    assert all(isinstance(getattr(attn, n), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "out_proj"))
    assert len(model.layers) == 12
    # roberta.base: ~124.6 M parameters with its 50,265-token dictionary, plus the head
    n = sum(p.numel() for p in model.parameters())
    assert 124_000_000 < n < 126_000_000


def test_both_layouts_compute_the_same_function():
    torch.manual_seed(0)
    a = FairseqRoberta("opt_onnx").eval()
    b = FairseqRoberta("fairseq").eval()
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(4, 1000, (2, 9))
    tokens[1, 6:] = 1   # padding: the masked keys must not count in either layout
    with torch.no_grad():
        assert torch.allclose(a(tokens), b(tokens), atol=1e-4)


class _Heads(nn.Module):
    """One attention's projections and scores: Linear -> view -> permute -> matmul, the context
    permuted back and reshaped (the opt_onnx graph's Reshape + Transpose pairs)."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(768, 768)
        self.o = nn.Linear(768, 768)

    def forward(self, x):
        s = x.shape[0]
        q = self.q(x).view(1, s, 12, 64).permute(0, 2, 1, 3)
        ctx = torch.matmul(torch.softmax(torch.matmul(q, q.transpose(2, 3)), -1), q)
        return self.o(ctx.permute(0, 2, 1, 3).reshape(-1, 768))


def _transposes(seq):
    rep = optimize(_Heads().eval(), (torch.randn(seq, 768),), chip="Ascend310P3", level=3, precision="fp16",
                   stack="atc-om").report()
    return [k for k in rep.kernels if k.name.startswith("TransposeD")], rep


def test_reshape_transpose_pairs_run_as_transposed_only_when_not_16_aligned():
    aligned, _ = _transposes(64)
    assert aligned == []    # ConfusionTransposeD: kept in the NZ conversions the engine already charges
    unaligned, rep = _transposes(70)
    assert len(unaligned) == 2    # q's view + permute and the context's permute + reshape
    assert all(k.time_us > 0 for k in unaligned)
    assert any("ConfusionTransposeD" in m for m in mechanisms_of(rep))


def test_rows_not_whole_32_byte_blocks_move_row_by_row_without_datacopypad():
    assert not capabilities(get_chip("Ascend310P3")).data_copy_pad
    assert capabilities(get_chip("Ascend910B2")).data_copy_pad
    n = 32 * 12 * 70
    t = {s: simulate_vector("softmax", n * s, "fp16", chip="Ascend310P3", row_len=s, by_row=True).time_us for s in (64, 70, 80)}
    # 70 fp16 = 140 bytes: padded to 160 per row and handled row by row, slower than 80 aligned ones
    assert t[70] > 1.5 * t[80] and t[70] > 1.5 * t[64]
    # with DataCopyPad (Atlas A2) the unaligned rows cost about their share of the data
    u = {s: simulate_vector("softmax", n * s, "fp16", chip="Ascend910B2", row_len=s, by_row=True).time_us for s in (64, 70, 80)}
    assert u[70] < 1.2 * u[80]
    # rows the caller does not mark (a 5HD or fused layout whose rows are not the ND last axis) are costed as before
    plain = simulate_vector("softmax", n * 70, "fp16", chip="Ascend310P3", row_len=70).time_us
    assert plain < t[70] / 1.5


def test_softmax_by_row_is_named_among_the_rows_mechanisms():
    _, rep = _transposes(70)
    assert any("DataCopyPad" in m for m in mechanisms_of(rep))
    _, rep64 = _transposes(64)
    assert not any("DataCopyPad" in m for m in mechanisms_of(rep64))


def test_roberta_rows_build_fairseqs_model_per_stack():
    rows = [r for r in published_rows(chip="Ascend310P3") if r.key == "roberta-base"]
    atc = next(r for r in rows if "TorchAIE" not in r.source)
    aie = next(r for r in rows if "TorchAIE" in r.source)
    assert builder_of(atc, "atc-om") is BUILDERS["roberta-base"]
    m_atc, _ = builder_of(atc, "atc-om")(1, None, 16)
    m_aie, _ = builder_of(aie, TORCHAIE_STACK)(1, None, 16)
    assert (m_atc.layout, m_aie.layout) == ("opt_onnx", "fairseq")
    # the README's other lengths are rows, some held back
    lengths = {(r.seq, r.batch) for r in rows if "TorchAIE" not in r.source}
    assert {(16, 1), (64, 32), (128, 32), (70, 64)} <= lengths
    assert any(r.held_back for r in rows)
