"""The layout pass: device formats (NC1HWC0, FRACTAL_NZ, ND) and the TransData between them."""

import pytest
import torch
import torch.nn as nn
import torchvision

from pypto_lab.capture import Graph, Node, TensorInfo, Value, capture
from pypto_lab.hw.chip import get_chip
from pypto_lab.kernels.ir import TransDataKernel
from pypto_lab.lowering.costing import cost_kernels
from pypto_lab.lowering.lower import kernels_of, lower
from pypto_lab.lowering.table import lookup
from pypto_lab.passes import PassContext, PassManager, RecordSnapshots, get_pass
from pypto_lab.passes.layout import NC1HWC0, ND, NZ, TRANSDATA, transdata_node

LEVEL1 = ["map_ops", "decompose", "fold_batchnorm", "fuse_conv_bn_relu", "fuse_layernorm", "fuse_attention",
          "fuse_elementwise"]
LEVEL2 = LEVEL1 + ["layout"]


A910 = PassContext(get_chip("Ascend910A"))  # whose Cube reads matmul operands in FRACTAL_NZ


def run(graph, names, ctx=A910):
    rec = RecordSnapshots()
    out = PassManager(names, [rec]).run(graph, ctx)
    return out, rec.snapshots[-1]


def mapped(graph, node):
    """``node`` as map_ops leaves it: its catalogue entry and its own kernel's spec."""
    node.npu = lookup(node.target)
    node.kernel = lower(graph, node, A910.chip, "fp16")
    return node


def transdatas(graph):
    return [n for n in graph.nodes if n.target == TRANSDATA]


def kinds(graph):
    out = {}
    for n in transdatas(graph):
        key = (n.kernel.src_format, n.kernel.dst_format)
        out[key] = out.get(key, 0) + 1
    return out


def readers(graph, name):
    return [n for n in graph.nodes if name in n.inputs]


def assert_topological(graph):
    """Every node reads a graph value or an earlier node; args name what inputs name."""
    known = set(graph.values)
    for n in graph.nodes:
        missing = [i for i in n.inputs if i not in known]
        assert not missing, f"{n.name} reads {missing}, not produced before it"
        flat = []

        def walk(o, flat=flat):
            if isinstance(o, str):
                flat.append(o)
            elif isinstance(o, (list, tuple)):
                for x in o:
                    walk(x)
            elif isinstance(o, dict):
                for x in o.values():
                    walk(x)
        walk(n.args)
        walk(n.kwargs)
        assert set(n.inputs) <= set(flat), f"{n.name}: inputs {n.inputs} not all in args {n.args}"
        known.add(n.name)
    assert graph.outputs and all(o in known for o in graph.outputs)


def assert_consistent(graph):
    """Each node's input formats are what it reads: TransData read their src format, and every
    activation a node reads is recorded in the format its producer gives."""
    fmt = {name: ND for name in graph.values}
    fmt.update({n.name: n.format for n in graph.nodes})
    for n in graph.nodes:
        if n.target == TRANSDATA:
            assert fmt[n.inputs[0]] == n.kernel.src_format != n.kernel.dst_format
        else:
            for i, f in n.input_formats.items():
                assert fmt[i] == f
    assert all(fmt[o] == ND for o in graph.outputs)


@pytest.fixture(scope="module")
def resnet50():
    g = capture(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224))
    return run(g, LEVEL2)


@pytest.fixture(scope="module")
def encoder():
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    g = capture(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(2, 16, 64))
    return run(g, LEVEL2)


def test_resnet50_converts_only_at_the_edges(resnet50):
    # The convs, their fused add/ReLU epilogues, max pooling and the global average pool all stay in
    # NC1HWC0, so the body needs no conversion. Four TransData remain: the input x (ND -> NC1HWC0)
    # for conv1, the pooled features back to ND for flatten (a reshaping view), ND -> FRACTAL_NZ for
    # the fc linear, and the logits FRACTAL_NZ -> ND for the graph output.
    g, snap = resnet50
    assert kinds(g) == {(ND, NC1HWC0): 1, (NC1HWC0, ND): 1, (ND, NZ): 1, (NZ, ND): 1}
    first, to_nd, to_nz, out = transdatas(g)
    assert first.inputs == ["x"] and [r.op for r in readers(g, first.name)] == ["conv2d"]
    assert g.node(to_nd.inputs[0]).op == "adaptive_avg_pool2d"
    assert [r.op for r in readers(g, to_nd.name)] == ["flatten"]
    assert g.node(to_nz.inputs[0]).op == "flatten" and [r.op for r in readers(g, to_nz.name)] == ["linear"]
    assert g.node(out.inputs[0]).op == "linear" and g.outputs == [out.name]
    assert snap.summary == ("inserted 4 TransData (ND->NC1HWC0 1, NC1HWC0->ND 1, ND->FRACTAL_NZ 1, "
                            "FRACTAL_NZ->ND 1), removed 0 redundant pairs")
    assert any("offline" in n.reason for n in snap.notes)  # weights: no TransData in the graph
    assert all(v.kind == "input" for td in transdatas(g) for v in [g.values.get(td.inputs[0])] if v)


def test_resnet50_formats_and_order(resnet50):
    g, _ = resnet50
    assert_topological(g)
    assert_consistent(g)
    convs = [n for n in g.nodes if n.op == "conv2d"]
    assert len(convs) == 53 and all(c.format == NC1HWC0 for c in convs)
    assert all(c.kernel.a_format == c.kernel.c_format == NC1HWC0 for c in convs)  # the Cube specs say so too
    # no conversion between consecutive convs: every conv reads NC1HWC0 straight from its producer
    for c in convs[1:]:
        assert g.node(c.inputs[0]).target != TRANSDATA
        assert c.input_formats[c.inputs[0]] == NC1HWC0
    assert g.node("linear").format == NZ and g.node("linear").kernel.a_format == NZ
    # TransData are data-movement kernels of their own, costed like copies
    td_kernels = [k for k in kernels_of(g) if isinstance(k.spec, TransDataKernel)]
    assert len(td_kernels) == 4 and all(len(k.nodes) == 1 for k in td_kernels)
    costs = [k for k in cost_kernels(g, A910.chip) if k.name.startswith("TransData:transdata")]
    assert len(costs) == 4 and all(k.unit == "move" and k.time_us > 0 for k in costs)


def test_layout_is_idempotent(resnet50):
    g, _ = resnet50
    again = get_pass("layout")(g, A910)
    assert not again.modified and len(again.graph.nodes) == len(g.nodes)
    assert again.graph.outputs == g.outputs


def test_encoder_converts_around_matmuls(encoder):
    # Per layer: in_proj reads the transposed input (ND -> NZ) and its output goes to the unflatten
    # view (NZ -> ND); out_proj likewise (reshape -> NZ, NZ -> view); linear1 reads the LayerNorm
    # (ND -> NZ); ReLU and dropout keep NZ so linear2 needs nothing; linear2's output meets the
    # residual (the LayerNorm output, ND) at the add (NZ -> ND). 6 per layer, 2 layers.
    g, snap = encoder
    assert_topological(g)
    assert_consistent(g)
    assert kinds(g) == {(ND, NZ): 6, (NZ, ND): 6}
    # batch 2 sits in the last two axes of some Reshape + Transpose pairs (not divisible by 16): those
    # run as TransposeD kernels (no ConfusionTransposeD), which the summary counts after the TransData
    assert snap.summary.startswith("inserted 12 TransData (ND->FRACTAL_NZ 6, FRACTAL_NZ->ND 6), removed 0 redundant "
                                   "pairs")
    for n in g.nodes:
        if n.op in ("layer_norm", "scaled_dot_product_attention", "view", "reshape", "transpose", "unflatten"):
            assert n.format == ND and set(n.input_formats.values()) <= {ND}, n.name
        if n.op == "linear":
            assert n.format == NZ and n.input_formats[n.inputs[0]] == NZ
    # what each ND -> NZ conversion feeds a linear from: the layers' input views and norm1
    fed = sorted(g.node(td.inputs[0]).op for td in transdatas(g) if td.kernel.dst_format == NZ)
    assert fed == ["layer_norm", "layer_norm", "reshape", "reshape", "transpose", "transpose"]
    # linear2 reads ReLU's NZ output through dropout: no TransData in between
    linear2 = [n for n in g.nodes if n.module.endswith("linear2")]
    assert linear2 and all(g.node(n.inputs[0]).target != TRANSDATA for n in linear2)
    # one TransData per (tensor, format), shared: no two convert the same tensor to the same format
    keys = [(n.inputs[0], n.kernel.dst_format) for n in transdatas(g)]
    assert len(keys) == len(set(keys))


def _hand_graph():
    info = TensorInfo((32, 64), "float16")
    values = {"x": Value("x", "input", info)}
    a = transdata_node("td_a", "x", info, ND, NZ)
    b = transdata_node("td_b", "td_a", info, NZ, ND)
    relu = Node("relu", "aten.relu.default", ["td_b"], ("td_b",), {}, [info])
    g = Graph(values, [a, b, relu], ["relu"], "hand")
    mapped(g, relu)
    return g


def test_round_trip_pair_is_removed():
    result = get_pass("layout")(_hand_graph(), A910)
    g = result.graph
    assert [n.name for n in g.nodes] == ["relu"]
    assert g.node("relu").inputs == ["x"] and g.node("relu").args == ("x",)
    assert g.node("relu").format == ND
    assert result.modified and result.summary == "inserted 0 TransData, removed 1 redundant pairs"


def test_round_trip_keeps_first_when_read_elsewhere():
    g = _hand_graph()
    info = g.values["x"].info
    g.values["w"] = Value("w", "param", TensorInfo((64, 64), "float16"), "w")
    g.nodes.append(Node("mm", "aten.mm.default", ["td_a", "w"], ("td_a", "w"), {}, [info]))
    mapped(g, g.nodes[-1])
    g.outputs = ["relu", "mm"]
    out = get_pass("layout")(g, A910).graph
    assert_topological(out)
    assert [n.name for n in out.nodes][:3] == ["td_a", "relu", "mm"]
    assert out.node("relu").inputs == ["x"] and out.node("mm").inputs == ["td_a", "w"]
    # mm's NZ output gets its own conversion back to ND for the graph output
    assert out.nodes[-1].target == TRANSDATA and out.outputs == ["relu", out.nodes[-1].name]


@pytest.mark.parametrize("width, transdata", [(64, {(ND, NZ): 1, (NZ, ND): 1}), (24, {(ND, NZ): 2, (NZ, ND): 2})])
def test_layer_norm_keeps_nz_when_its_last_two_axes_are_multiples_of_16(width, transdata):
    model = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.Linear(width, width))
    out, _ = run(capture(model, torch.randn(32, width)), LEVEL2)
    # 64 wide: ND in, NZ through linear -> LayerNorm -> linear, ND out; 24 wide: LayerNorm needs ND
    assert kinds(out) == transdata
    ln = next(n for n in out.nodes if n.op in ("layer_norm", "native_layer_norm"))
    assert ln.format == (NZ if width == 64 else ND)


def test_910b_matmuls_read_and_write_nd():
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    g = capture(model, torch.randn(32, 64))
    out, snap = run(g, LEVEL2, PassContext(get_chip("Ascend910B1")))
    assert transdatas(out) == [] and any("MTE2 converts ND->NZ" in n.reason for n in snap.notes)
    assert all(n.kernel.a_format == ND for n in out.nodes if n.op == "linear")  # the capability table says ND


def test_a_format_the_cube_cannot_read_is_refused():
    """The Cube coster obeys the capability table: a matmul operand in ND on 910A (whose Cube reads
    FRACTAL_NZ) is an error naming the rule, not a silent guess."""
    from dataclasses import replace

    from pypto_lab.kernels.cost import cost
    from pypto_lab.kernels.cube import KernelSpecError

    g, _ = run(capture(nn.Linear(64, 64), torch.randn(32, 64)), LEVEL2)
    spec = next(n.kernel for n in g.nodes if n.op == "linear")
    assert spec.a_format == NZ and cost(spec, A910.chip).time_us > 0
    with pytest.raises(KernelSpecError, match="A in ND.*read and write FRACTAL_NZ.*layout pass"):
        cost(replace(spec, a_format=ND), A910.chip)
