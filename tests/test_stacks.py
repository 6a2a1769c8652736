"""Software stacks (pypto_lab.stack): the presets, the one model of a step's launches, and every
front end costing through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_lab.stack import (
    FUSIONS,
    STACK_DIR,
    Launch,
    StackConfigError,
    Stream,
    get_stack,
    list_stacks,
    load_stack,
    run_in_order,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_shipped_stack_loads_and_every_number_has_a_source():
    assert {"atc-om", "torch_npu-eager", "torchair-graph", "vllm-ascend-aclgraph", "vllm-ascend-eager", "mindie",
            "mindspeed"} <= set(list_stacks())
    for name in list_stacks():
        stack = get_stack(name)
        doc = tomllib.loads((STACK_DIR / f"{name}.toml").read_text())["stack"]
        for key in ("dispatch_us", "launch_us", "step_host_us", "host_device_overlap", "fusions"):
            assert isinstance(doc[key], dict) and doc[key].get("source"), (name, key)
        assert stack.fusions <= set(FUSIONS)
        assert stack.runs == "eager" or stack.dispatch_us == 0


@pytest.mark.parametrize("edit, rule", [
    ("launch_us = { value = -1.0, source = \"x\" }", "launch_us.*>= 0"),
    ("colour = \"blue\"", "unknown key"),
    ("fusions = { value = [\"everything\"], source = \"x\" }", "not known"),
    ("runs = \"quantum\"", "unknown way"),
])
def test_a_bad_stack_file_names_the_key_the_value_and_a_fix(tmp_path, edit, rule):
    text = (STACK_DIR / "torch_npu-eager.toml").read_text()
    key = edit.split(" =")[0]
    lines = [ln for ln in text.splitlines() if not ln.startswith(key + " =")]
    lines.append(edit)
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(StackConfigError, match=rule):
        load_stack(path)


def test_a_graph_stack_cannot_dispatch_from_the_host_and_an_unknown_name_lists_the_presets(tmp_path):
    text = (STACK_DIR / "atc-om.toml").read_text().replace(
        'dispatch_us = { value = 0.0,', 'dispatch_us = { value = 5.0,')
    path = tmp_path / "graph.toml"
    path.write_text(text)
    with pytest.raises(StackConfigError, match="dispatch_us.*set dispatch_us = 0"):
        load_stack(path)
    with pytest.raises(StackConfigError, match="atc-om"):
        get_stack("nonsense")
    with pytest.raises(StackConfigError, match="launch_us = -2"):
        get_stack("atc-om").with_values(launch_us=-2)


kernel_lists = st.lists(st.tuples(st.floats(0.0, 200.0), st.integers(1, 6), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(kernels=kernel_lists, dispatch=st.floats(0.0, 60.0), launch=st.floats(0.0, 10.0), host=st.floats(0.0, 300.0),
       overlap=st.booleans())
def test_a_kernel_run_count_times_is_placed_as_count_single_runs(kernels, dispatch, launch, host, overlap):
    """The closed form for a kernel repeated ``count`` times equals placing its runs one by one."""
    stack = get_stack("torch_npu-eager").with_values(dispatch_us=dispatch, launch_us=launch, step_host_us=host,
                                                     host_device_overlap=overlap)
    grouped = run_in_order([Launch(t, c, coll) for t, c, coll in kernels], stack)
    single = Stream(stack)
    for t, c, coll in kernels:
        for _ in range(c):
            single.run(t, 1, coll)
    assert grouped.step_us == pytest.approx(single.timeline().step_us, rel=1e-9, abs=1e-6)
    work = sum(c * (t + (0.0 if coll else launch)) for t, c, coll in kernels)
    assert grouped.step_us >= work - 1e-6                                       # never faster than the device
    assert grouped.step_us >= host + sum(c for _, c, _ in kernels) * dispatch - 1e-6   # nor than the host


def test_a_host_bound_step_is_as_long_as_its_dispatches_and_graph_mode_removes_them():
    eager, graph = get_stack("torch_npu-eager"), get_stack("torchair-graph")
    tiny = [Launch(1.0)] * 200
    line = run_in_order(tiny, eager)
    assert line.host_bound and line.step_us == pytest.approx(200 * eager.dispatch_us + 1.0 + eager.launch_us)
    g = run_in_order(tiny, graph)
    assert not g.host_bound and g.step_us == pytest.approx(200 * (1.0 + graph.launch_us) + graph.step_host_us)


def test_one_launch_value_moves_inference_llm_decode_and_training_by_their_kernel_counts():
    """The per-kernel launch cost is one value of a stack preset: optimize (ResNet-50), an LLM decode
    step (Qwen2-7B) and a training step (BERT) each move by their kernel runs times the change, and a
    collective (two cards) is charged its HCCL launch once, not the stack's as well."""
    import torch
    import torchvision
    from transformers import BertConfig, BertForSequenceClassification

    import pypto_lab
    from pypto_lab.llm import simulate_generation
    from pypto_lab.train import simulate_step

    delta = 3.0
    atc = get_stack("atc-om")
    resnet = torchvision.models.resnet50().eval()
    x = torch.randn(1, 3, 224, 224)
    a = pypto_lab.optimize(resnet, x, chip="Ascend910B1", level=1, stack=atc).report()
    b = pypto_lab.optimize(resnet, x, chip="Ascend910B1", level=1,
                           stack=atc.with_values(launch_us=atc.launch_us + delta)).report()
    assert b.latency_us - a.latency_us == pytest.approx(delta * len(a.kernels), rel=1e-6)

    # without the host time of the PIECEWISE graph's eager attention, which would hide the device's launches
    graph = get_stack("vllm-ascend-aclgraph").with_values(layer_host_us=0.0)
    kw = dict(batch=4, prompt_len=128, output_len=2, chip="Ascend910B1")
    one = simulate_generation("qwen2-7b", stack=graph, **kw)
    two = simulate_generation("qwen2-7b", stack=graph.with_values(launch_us=graph.launch_us + delta), **kw)
    runs = sum(k.count for k in one.decode_kernels)
    assert (two.tpot_ms - one.tpot_ms) * 1000 == pytest.approx(delta * runs, rel=1e-6)

    tp = simulate_generation("qwen2-7b", stack=graph, cards=2, **kw)
    tp2 = simulate_generation("qwen2-7b", stack=graph.with_values(launch_us=graph.launch_us + delta), cards=2, **kw)
    compute_runs = sum(k.count for k in tp.decode_kernels if not k.collective)
    assert any(k.collective for k in tp.decode_kernels)
    assert (tp2.tpot_ms - tp.tpot_ms) * 1000 == pytest.approx(delta * compute_runs, rel=1e-6)
    assert tp2.comm_ms_per_step == pytest.approx(tp.comm_ms_per_step)        # HCCL's launch, once

    bert = BertForSequenceClassification(BertConfig(num_hidden_layers=2))
    ids = torch.randint(0, 30522, (8, 128))
    batch = {"input_ids": ids, "labels": torch.randint(0, 2, (8,))}
    graph_train = get_stack("mindspeed").with_values(dispatch_us=0.0)   # device-bound: every launch is seen
    s1 = simulate_step(bert, batch, stack=graph_train)
    s2 = simulate_step(bert, batch, stack=graph_train.with_values(launch_us=graph_train.launch_us + delta))
    assert (s2.step_ms - s1.step_ms) * 1000 == pytest.approx(delta * sum(k.count for k in s1.kernels), rel=1e-6)
    assert s1.stack.startswith("mindspeed")


def test_every_report_says_which_stack_it_assumed():
    import torch

    import pypto_lab
    from pypto_lab.llm import simulate_generation

    rep = pypto_lab.optimize(torch.nn.Linear(64, 64), torch.randn(4, 64), level=1).report()
    assert rep.stack.name == "atc-om" and "atc-om" in rep.schedule.summary()
    assert simulate_generation("qwen2-0.5b", output_len=2).to_dict()["stack"] == "vllm-ascend-aclgraph"
    eager = pypto_lab.optimize(torch.nn.Linear(64, 64), torch.randn(4, 64), level=1, stack="torch_npu-eager").report()
    assert eager.latency_us > rep.latency_us          # the host dispatches each kernel


def test_a_stack_that_applies_no_fusion_leaves_the_graph_unfused_and_says_why():
    import torch
    from torch import nn

    import pypto_lab

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(1, 3, 32, 32)
    fused = pypto_lab.optimize(model, x, level=1).report()
    eager = pypto_lab.optimize(model, x, level=1, stack="torch_npu-eager").report()
    assert len(eager.kernels) > len(fused.kernels)
    step = next(p for p in eager.passes if p.name == "fuse_conv_bn_relu")
    assert "not run: the torch_npu-eager stack does not apply" in step.summary


def test_the_llm_engine_refuses_the_old_launch_argument_with_the_stack_fix():
    from pypto_lab.llm import LLMConfigError, simulate_generation

    with pytest.raises(LLMConfigError, match=r"launch_us = 10: .*software stack.*with_values\(launch_us="):
        simulate_generation("qwen2-0.5b", output_len=2, launch_us=10)


def test_the_eager_dispatch_constant_is_the_one_its_script_derives():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "derive_stack_constants.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_command_line_lists_the_stacks_and_takes_one(capsys):
    from pypto_lab.cli import main

    assert main(["stacks"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in list_stacks()) and "dispatch us" in out
    assert main(["report", "resnet50", "--level", "1", "--stack", "torch_npu-eager", "--top", "1"]) == 0
    assert "torch_npu-eager" in capsys.readouterr().out


def test_the_model_codes_host_operations_lengthen_only_an_eager_host():
    """An eager host also runs the model code's operations around a kernel (views and reshapes too):
    each costs host_op_us, the ones launching a kernel a dispatch_us more; the device waits when the
    host is the slower, and a graph stack ignores them (no Python per operation)."""
    eager = get_stack("torch_npu-eager").with_values(host_op_us=10.0, dispatch_us=5.0, launch_us=1.0)
    plain = run_in_order([Launch(20.0, 8)], eager)
    coded = run_in_order([Launch(20.0, 8, code_ops=4, code_dispatches=1)], eager)
    assert plain.step_us == pytest.approx(5.0 + 8 * 21.0)           # device-bound: 21 us a run, host 5
    assert coded.step_us == pytest.approx(8 * (5.0 + 4 * 10.0 + 5.0) + 21.0)   # host-bound: 50 us a run
    assert coded.host_bound and coded.host_us == pytest.approx(8 * 50.0)
    graph = get_stack("torchair-graph")
    assert (run_in_order([Launch(20.0, 8, code_ops=4, code_dispatches=1)], graph).step_us
            == pytest.approx(run_in_order([Launch(20.0, 8)], graph).step_us))
    one_by_one = Stream(eager)
    for _ in range(8):
        one_by_one.run(20.0, 1, code_ops=4, code_dispatches=1)
    assert one_by_one.timeline().step_us == pytest.approx(coded.step_us)   # the closed form holds


def test_a_graph_whose_shapes_change_every_step_is_scheduled_from_the_host():
    graph = get_stack("torchair-graph")
    host = graph.host_scheduled()
    assert graph.dynamic_shape_dispatch_us > 0 and host.dispatch_us == graph.dynamic_shape_dispatch_us
    assert "concepts.md" in graph.sources["stack.dynamic_shape_dispatch_us"]
    tiny = [Launch(1.0, 200)]
    assert run_in_order(tiny, host).step_us == pytest.approx(200 * host.dispatch_us + 1.0 + graph.launch_us)
    assert run_in_order(tiny, graph).step_us == pytest.approx(200 * (1.0 + graph.launch_us))
    for name in ("torch_npu-eager", "atc-om", "vllm-ascend-aclgraph"):    # no such field, or not a graph
        assert get_stack(name).host_scheduled() == get_stack(name)


def test_a_host_slower_per_kernel_is_placed_layer_by_layer_as_the_code_runs():
    """Where the host's time per kernel is large (the model code on an eager host) the step's kernels
    run in program order, layer after layer: the step is the longer of a layer's host and device
    times, not each kernel's own longer one summed (the closed form over a kernel's runs)."""
    from pypto_lab.llm.forward import layer_by_layer

    stack = get_stack("torch_npu-eager").with_values(dispatch_us=0.0, launch_us=0.0)
    # a layer: a long kernel (100 us, 5 us of host) and a short one with the code's host work (95 us)
    kernels = [Launch(5.0), Launch(1.0, 10, code_ops=1), Launch(100.0, 10), Launch(5.0)]
    stack = stack.with_values(host_op_us=95.0)
    order = layer_by_layer(kernels, 10)
    assert [k.count for k in order] == [1] + [1, 1] * 10 + [1]
    assert order[1].code_ops == 1 and order[2].device_us == 100.0
    grouped = run_in_order(kernels, stack).step_us
    interleaved = run_in_order(order, stack).step_us
    assert grouped == pytest.approx(10 * 95.0 + 1.0 + 10 * 100.0 + 5.0)   # the long kernels wait for all the host work
    assert interleaved == pytest.approx(95.0 + 10 * 101.0 + 5.0)      # the host works while they run
    assert layer_by_layer(kernels, 1) == kernels
