"""One lowering table, one fallback, one tile search for every front end: a captured model's nodes
(`optimize`) and a training step's joint-graph nodes lower through the same entries and rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pypto_lab import optimize
from pypto_lab.capture import capture
from pypto_lab.capture.catalogue import NpuOp, aten_name
from pypto_lab.hw import get_chip
from pypto_lab.kernels.cost import cost
from pypto_lab.kernels.ir import CubeKernel, HostKernel, VectorKernel
from pypto_lab.kernels.tile_search import candidate_tilings, search_tiling, with_tiling
from pypto_lab.lowering.table import TABLE, lookup
from pypto_lab.passes import PassContext, PassManager
from pypto_lab.train import capture_step, policy_of, simulate_step
from pypto_lab.train.step import lower_node

F = nn.functional
CHIP = get_chip("Ascend910B1")


def _batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(32, 64, generator=g), torch.randint(0, 64, (32,), generator=g)


def test_a_training_node_lowers_like_the_captured_node_of_the_same_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.LayerNorm(64))
    x, y = _batch()
    g = PassManager(["map_ops", "mixed_precision"]).run(capture(model.eval(), x), PassContext(CHIP, "fp16"))
    inference = {n.op: n.kernel for n in g.nodes if n.kernel is not None}
    step = capture_step(model.train(), (x, y), F.cross_entropy)
    policy = policy_of("fp16", "O2")
    training = {aten_name(str(n.target)): lower_node(n, CHIP, policy)[0] for n in step.forward}
    # torch.export keeps linear and layer_norm, AOT autograd's joint graph has addmm and
    # native_layer_norm: different ATen ops, the same kernels
    assert training["addmm"] == [inference["linear"]]
    assert isinstance(inference["linear"], CubeKernel) and inference["linear"].epilogue.bias
    assert training["tanh"] == [inference["tanh"]]
    assert training["native_layer_norm"] == [inference["layer_norm"]]
    assert inference["layer_norm"].compute_dtype == "fp32" and inference["layer_norm"].row_len == 64


def test_backward_ops_are_entries_of_the_same_table():
    for target in ("aten.convolution_backward.default", "aten.native_batch_norm_backward.default",
                   "aten.native_layer_norm_backward.default", "aten._softmax_backward_data.default",
                   "aten.threshold_backward.default", "aten.embedding_dense_backward.default"):
        assert lookup(target) is not None, target
    assert lookup("aten.div.Scalar").name == "Muls" and lookup("aten.div.Tensor").name == "RealDiv"
    assert NpuOp("TransData", "move", "copy").vector_ops == ("copy",)   # one operator may be named alone


class _Erfinv(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return torch.erfinv(torch.tanh(self.fc(x)) * 0.5)


def test_an_op_the_table_lacks_falls_back_to_the_host_in_both_reports_and_one_entry_fixes_both(monkeypatch):
    torch.manual_seed(0)
    model = _Erfinv()
    x, y = _batch()
    rep = optimize(model.eval(), x, chip=CHIP, level=0).report()
    assert rep.fallback_ops == ["aten.erfinv.default"]
    train = simulate_step(model.train(), (x, y), F.cross_entropy)
    # the forward's erfinv, and the backward's (its gradient reads erfinv(x) again)
    assert train.unmapped_ops == {"aten.erfinv.default": 2}
    host = [k for k in train.kernels if isinstance(k.spec, HostKernel)]
    assert [k.phase for k in host] == ["forward", "backward"]
    assert all(k.spec.bytes_in == k.spec.bytes_out == 32 * 64 * 4 for k in host)   # the graph's fp32, both ways
    assert any("run on the host CPU" in n and "aten.erfinv.default x2" in n for n in train.notes)

    monkeypatch.setitem(TABLE, "erfinv", NpuOp("Erfinv", "vector", ("gelu",)))
    rep = optimize(model.eval(), x, chip=CHIP, level=0).report()
    train = simulate_step(model.train(), (x, y), F.cross_entropy)
    assert rep.fallback_ops == [] and train.unmapped_ops == {}
    ours = [k.spec for k in rep.kernels if k.name.startswith("Erfinv")]
    theirs = [k.spec for k in train.kernels if k.name.startswith("Erfinv")]
    assert len(ours) == 1 and len(theirs) == 2 and isinstance(ours[0], VectorKernel)
    assert theirs[0] == theirs[1] == ours[0]


def test_the_tile_search_keeps_only_a_faster_tiling_and_stops_when_told():
    spec = CubeKernel("MatMulV2", 1, 1024, 768, 3072, "fp16", "fp16")
    tiles = candidate_tilings(CHIP, spec)
    found = search_tiling(spec, CHIP, tiles)
    assert found.trials == len(tiles) and found.best.time_us <= found.default.time_us
    times = {t: cost(with_tiling(spec, t), CHIP).time_us for t in tiles}
    assert found.best.time_us == pytest.approx(min([found.default.time_us, *times.values()]))
    worst_first = sorted(tiles, key=times.get, reverse=True)
    assert times[worst_first[0]] >= found.default.time_us
    stopped = search_tiling(spec, CHIP, worst_first, patience=1)
    assert stopped.trials == 1 and stopped.tile is None and stopped.best is stopped.default
    # the spec's own tiling is not simulated again
    again = search_tiling(with_tiling(spec, found.tile), CHIP, tiles) if found.tile is not None else found
    assert again.tile is None and again.trials == len(tiles) - (found.tile is not None)


def test_a_gemm_costs_the_same_in_optimize_level_3_and_in_a_training_step():
    """One lowering and one tile search: the forward matmul of a training step is the kernel
    optimize's level 3 runs for the same layer."""
    torch.manual_seed(0)
    model = nn.Linear(256, 512)
    x = torch.randn(64, 256)
    inference = [k for k in optimize(model.eval(), x, chip=CHIP, level=3).report().kernels
                 if isinstance(k.spec, CubeKernel)]
    train = simulate_step(model.train(), (x, torch.randint(0, 512, (64,))), F.cross_entropy)
    forward = [k for k in train.kernels if k.phase == "forward" and isinstance(k.spec, CubeKernel)]
    assert len(inference) == len(forward) == 1
    assert forward[0].time_us == pytest.approx(inference[0].time_us, rel=1e-12)
