"""BatchNorm folding, Conv/matmul epilogue fusion and element-wise chain fusion."""

from collections import defaultdict

import pytest
import torch
import torch.nn as nn
import torchvision

from pypto_lab.capture import capture, from_exported
from pypto_lab.passes import PassManager, PassOrderError, RecordSnapshots, get_pass
from pypto_lab.passes.verify import verify

CONV_PIPELINE = ["map_ops", "fold_batchnorm", "fuse_conv_bn_relu"]


def run(graph, names):
    rec = RecordSnapshots()
    out = PassManager(names, [rec]).run(graph)
    return out, {s.name: s for s in rec.snapshots}


def groups(graph):
    out = defaultdict(list)
    for n in graph.nodes:
        if n.group is not None:
            out[n.group].append(n)
    return dict(out)


def assert_well_formed(graph):
    """Every node reads a graph value or an earlier node; every graph output exists."""
    known = set(graph.values)
    for n in graph.nodes:
        missing = [i for i in n.inputs if i not in known]
        assert not missing, f"{n.name} reads {missing}, which no longer exist"
        known.add(n.name)
    assert graph.outputs and all(o in known for o in graph.outputs)


@pytest.fixture(scope="module")
def resnet50():
    return capture(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224))


@pytest.fixture(scope="module")
def resnet50_fused(resnet50):
    return run(resnet50, CONV_PIPELINE)


def test_resnet50_folds_every_bn_and_fuses_every_conv(resnet50, resnet50_fused):
    g, snaps = resnet50_fused
    assert not [n for n in g.nodes if "batch_norm" in n.target]
    assert len(g.nodes) == len(resnet50.nodes) - 53
    convs = [n for n in g.nodes if n.op == "conv2d"]
    assert len(convs) == 53 and all(c.folded_bn is not None and c.kernel.epilogue.bias for c in convs)
    grouped = groups(g)
    conv_groups = {name: members for name, members in grouped.items() if g.node(name).op == "conv2d"}
    assert len(conv_groups) == 53 and set(conv_groups) == {c.name for c in convs}
    assert all(n.fused_by == "fuse_conv_bn_relu" for n in g.nodes if n.group is not None)
    relus = [n for n in g.nodes if n.op == "relu_"]
    assert len(relus) == 49 and all(r.group in conv_groups for r in relus)
    adds = [n for n in g.nodes if n.op == "add_"]
    assert len(adds) == 16 and all(a.group in conv_groups for a in adds)
    assert sum(c.kernel.epilogue.residual for c in convs) == 16
    assert sum(c.kernel.epilogue.activation == "relu" for c in convs) == 49
    # every add's residual is its other operand, and that operand is ready before the group's conv
    order = {n.name: i for i, n in enumerate(g.nodes)}
    producers = g.producers()
    for a in adds:
        conv = g.node(a.group)
        other = [i for i in a.inputs if i not in producers or producers[i].group != conv.name]
        assert len(other) == 1 and order.get(other[0], -1) < order[conv.name]
    assert_well_formed(g)
    assert g.info(g.outputs[0]).shape == (1, 1000)
    assert snaps["fuse_conv_bn_relu"].summary.startswith(
        "fused 53 convolution groups (16 with a residual add, 49 with an activation)")
    assert snaps["fold_batchnorm"].summary == "folded 53 of 53 BatchNorms into their convolutions"
    assert snaps["fold_batchnorm"].notes == ()


def test_folded_bn_params_name_the_bn_state(resnet50_fused, resnet50):
    g, _ = resnet50_fused
    conv = next(n for n in g.nodes if n.module == "layer1.0.conv3")
    folded = conv.folded_bn
    assert folded.bn == "batch_norm_3"
    targets = {k: g.values[getattr(folded, k)].target for k in ("weight", "bias", "running_mean", "running_var")}
    assert targets == {"weight": "layer1.0.bn3.weight", "bias": "layer1.0.bn3.bias",
                       "running_mean": "layer1.0.bn3.running_mean", "running_var": "layer1.0.bn3.running_var"}
    assert folded.eps == pytest.approx(1e-5)
    assert resnet50.node("conv2d_3").folded_bn is None  # the input graph is untouched


def test_bn_after_a_shared_conv_is_not_folded():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    g, snaps = run(capture(Shared(), torch.randn(1, 3, 8, 8)), CONV_PIPELINE)
    assert [n.op for n in g.nodes].count("batch_norm") == 1
    assert g.node("conv2d").folded_bn is None
    assert snaps["fold_batchnorm"].summary == "folded 0 of 1 BatchNorms into their convolutions"
    notes = [str(n) for n in snaps["fold_batchnorm"].notes]
    assert "batch_norm bn (batch_norm): conv2d conv (conv2d) output also read by add; BatchNorm not folded" in notes
    assert snaps["fold_batchnorm"].notes[0].node == "batch_norm"
    assert not snaps["fold_batchnorm"].modified


def test_bn_after_a_non_conv_is_not_folded():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.BatchNorm2d(8))
    g, snaps = run(capture(model, torch.randn(1, 3, 8, 8)), CONV_PIPELINE)
    assert [n.op for n in g.nodes] == ["conv2d", "relu", "batch_norm"]
    assert any("input is relu" in n.reason and "not a convolution" in n.reason for n in snaps["fold_batchnorm"].notes)


def test_decomposed_batch_norm_folds_through_its_getitem():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    ep = torch.export.export(model, (torch.randn(1, 3, 8, 8),)).run_decompositions()
    graph = from_exported(ep)
    assert "aten._native_batch_norm_legit_no_training.default" in graph.op_counts()
    g, _ = run(graph, CONV_PIPELINE)
    assert [n.op for n in g.nodes] == ["convolution", "relu"]
    assert g.node("relu").inputs == ["convolution"] and g.node("relu").args == ("convolution",)
    assert g.node("convolution").kernel.epilogue.activation == "relu"
    assert {n.group for n in g.nodes} == {"convolution"}
    assert_well_formed(g)


def test_conv_residual_add_and_relu_fuse_and_unsupported_activation_is_noted():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x)) + x)
            return torch.tanh(self.conv2(y))

    g, snaps = run(capture(Block(), torch.randn(1, 8, 8, 8)), CONV_PIPELINE)
    conv = g.node("conv2d")
    epi = conv.kernel.epilogue
    assert epi.bias and epi.residual and epi.activation == "relu"
    # 910B (the default context): the folded BN's bias rides FixPipe; the residual add and the ReLU
    # after it run on the Vector unit (FixPipe has no element-wise operand on AIC-C-220)
    assert epi.fixpipe == {"bias"} and epi.vector_stages == ("residual", "activation")
    assert [n.name for n in groups(g)["conv2d"]] == ["conv2d", "add", "relu"]
    assert g.node("tanh").group is None and g.node("conv2d_1").group is None
    assert any(str(n).startswith("conv2d conv2 (conv2d_1): tanh is not applied by FixPipe")
               and str(n).endswith("tanh not fused") for n in snaps["fuse_conv_bn_relu"].notes)


@pytest.fixture(scope="module")
def encoder_graph():
    layer = nn.TransformerEncoderLayer(64, 4, 128, activation="gelu", batch_first=True)
    return capture(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(2, 16, 64))


def test_linear_gelu_is_a_matmul_epilogue(encoder_graph):
    g, snaps = run(encoder_graph, CONV_PIPELINE)
    gelus = [n for n in g.nodes if n.op == "gelu"]
    assert len(gelus) == 2
    for gelu in gelus:
        lin = g.node(gelu.group)
        assert lin.op == "linear" and lin.kernel.epilogue.activation == "gelu" and lin.inputs[0] != gelu.name
        assert [n.name for n in groups(g)[lin.name]] == [lin.name, gelu.name]
    assert len(groups(g)) == 2  # the other linears have no activation to take
    assert "and 2 matmul epilogues" in snaps["fuse_conv_bn_relu"].summary


def test_linear_read_twice_keeps_its_gelu_apart():
    class TwoReaders(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            h = self.fc(x)
            return nn.functional.gelu(h) + h

    g, snaps = run(capture(TwoReaders(), torch.randn(4, 16)), CONV_PIPELINE)
    assert groups(g) == {}
    assert not g.node("linear").kernel.epilogue.activation
    assert "linear fc (linear): output also read by gelu, add; GELU not fused" in [
        str(n) for n in snaps["fuse_conv_bn_relu"].notes]


class Chain(nn.Module):
    def forward(self, x, y):
        return ((x + y) * 2).relu().exp()


def test_elementwise_chain_becomes_one_group():
    g, snaps = run(capture(Chain(), (torch.randn(4, 8), torch.randn(4, 8))), ["map_ops", "fuse_elementwise"])
    assert groups(g) == {"add": [g.node(n) for n in ("add", "mul", "relu", "exp")]}
    assert all(n.fused_by == "fuse_elementwise" for n in g.nodes)
    assert snaps["fuse_elementwise"].summary == "fused 1 element-wise chains (4 nodes)"
    spec = g.node("add").kernel          # one Vector kernel doing the four ops, reading x and y
    assert spec.ops == ("add", "mul", "relu", "exp") and spec.inputs == 2
    assert all(g.node(n).kernel is None for n in ("mul", "relu", "exp"))


def test_elementwise_chains_step_over_views_stop_at_reductions_and_keep_shared_values_in_ub():
    class Mixed(nn.Module):
        def forward(self, x):
            a = (x * 3).view(32).exp()     # mul -> view -> exp: one chain through a view
            s = a.softmax(-1)              # a reduction is no member: reading the chain, it closes it
            b = s - 1
            return b.sqrt() + b.rsqrt()    # b read twice, by members only: it stays in UB

    g, snaps = run(capture(Mixed(), torch.randn(4, 8)), ["map_ops", "fuse_elementwise"])
    got = {k: [n.op for n in v] for k, v in groups(g).items()}
    assert got == {"mul": ["mul", "view", "exp"], "sub": ["sub", "sqrt", "rsqrt", "add"]}
    assert g.node("softmax").group is None
    assert snaps["fuse_elementwise"].summary == "fused 2 element-wise chains (7 nodes)"
    spec = g.node("sub").kernel          # reads the softmax's output once, writes the sum once
    assert spec.ops == ("sub", "sqrt", "rsqrt", "add") and spec.inputs == 1
    assert not snaps["fuse_elementwise"].notes


def test_a_fused_chain_writes_a_value_read_outside_it_and_runs_after_what_it_reads():
    class Shared(nn.Module):
        def forward(self, x, y):
            a = x * 2
            m = y.sum(-1, keepdim=True)    # a reduction between the chain's members, reading neither
            return (a.exp() + m), a.amax(-1)   # a is also read by a reduction outside the chain

    g, snaps = run(capture(Shared(), (torch.randn(4, 16), torch.randn(4, 16))), ["map_ops", "fuse_elementwise"])
    assert {k: [n.op for n in v] for k, v in groups(g).items()} == {"mul": ["mul", "exp", "add"]}
    spec = g.node("mul").kernel          # streams x in, writes a beside the sum: two streams
    assert spec.ops == ("mul", "exp", "add") and spec.inputs == 2
    assert [str(n) for n in snaps["fuse_elementwise"].notes] == [
        "mul mul: output also read by amax: the fused kernel from mul mul writes it"]
    order = [n.name for n in g.nodes]    # the fused kernel runs after the sum it reads
    assert order.index("sum_1") < order.index("mul") < order.index("amax")
    verify(g)


def test_elementwise_leaves_conv_groups_alone(resnet50_fused):
    g, _ = resnet50_fused
    result = get_pass("fuse_elementwise")(g)
    assert not result.modified and result.summary == "fused 0 element-wise chains (0 nodes)"
    assert groups(result.graph).keys() == groups(g).keys()


def test_wrong_pass_order_is_refused():
    with pytest.raises(PassOrderError, match="'fuse_conv_bn_relu' requires 'fold_batchnorm'"):
        PassManager(["map_ops", "fuse_conv_bn_relu", "fold_batchnorm"])
    with pytest.raises(PassOrderError, match="'fold_batchnorm' requires 'map_ops'"):
        PassManager(["fold_batchnorm", "map_ops"])
    with pytest.raises(PassOrderError, match="'fuse_elementwise' requires 'map_ops'"):
        PassManager(["fuse_elementwise"])
