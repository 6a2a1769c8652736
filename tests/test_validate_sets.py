"""`pypto-lab validate --set ...`: every published figure, per regime and stack, with the
leave-one-model-out error of the one fitted stack constant, and the mechanisms behind the decode rows."""

from __future__ import annotations

import json

import pytest

from pypto_lab.cli import main
from pypto_lab.llm import simulate_generation
from pypto_lab.llm.configs import LLMConfigError
from pypto_lab.stack import Launch, get_stack, run_in_order
from pypto_lab.validation import llm_rows, suite
from pypto_lab.validation.compare import Comparison, Summary
from pypto_lab.validation.validate import ValidationError


def _c(model="m", err=0.1, stack="s", regime="LLM decode (TPOT)", held=False, setup="b1", published=100.0, **kw):
    return Comparison(set="llm", regime=regime, model=model, setup=setup, stack=stack, metric="decode_step_latency_ms",
                      unit="ms", published=published, source="src", simulated=published * (1 + err),
                      held_back=held, **kw)


def test_a_regime_reports_its_median_worst_bands_and_held_back_rows_apart():
    rows = [_c(err=e) for e in (0.05, -0.10, 0.20, -0.30)] + [_c(model="h", err=0.5, held=True)]
    [s] = Summary(rows).regimes()
    assert s.rows == 4 and s.median == pytest.approx(0.15) and s.worst == pytest.approx(0.30)
    assert s.within_band == pytest.approx(0.5) and s.within_wide == pytest.approx(0.75)
    assert s.held_back_rows == 1 and s.held_back_median == pytest.approx(0.5)
    assert s.lomo_median == pytest.approx(0.15)      # nothing refitted: each row's own error


def test_regimes_are_split_by_stack_and_rows_that_did_not_run_say_why():
    rows = [_c(stack="torchair-graph"), _c(stack="torch_npu-eager", err=0.6),
            Comparison(set="training", regime="training throughput", model="x", setup="8p", stack="mindspeed",
                       metric="tokens/s/card", unit="tokens/s/card", published=1.0, source="s",
                       skipped="pipeline parallelism is not modelled")]
    summary = Summary(rows)
    assert {(s.regime, s.stack) for s in summary.regimes()} == {("LLM decode (TPOT)", "torchair-graph"),
                                                                  ("LLM decode (TPOT)", "torch_npu-eager")}
    assert "not run: training x 8p tokens/s/card: pipeline parallelism is not modelled" in summary.table()


def test_published_rows_no_one_figure_can_meet_are_listed_with_their_stacks():
    graph = _c(stack="torchair-graph", published=35.1, row="id 43")
    eager = _c(stack="torch_npu-eager", published=110.0, row="id 101")
    near = _c(stack="torchair-graph", published=38.0, setup="b2")
    summary = Summary([graph, eager, near])
    assert summary.conflicts() == [(graph, eager)]
    assert "(two stacks)" in summary.table() and "torch_npu-eager, id 101" in summary.table()
    assert summary.to_dict()["conflicting_rows"][0][0]["stack"] == "torchair-graph"


def test_the_additive_fit_recovers_a_known_constant_and_leaves_each_model_out():
    # base + runs * t / 1000 with t = 100 us hits every published figure exactly
    pts = [(20.0, 28, 22.8), (30.0, 80, 38.0), (40.0, 80, 48.0)]
    assert llm_rows.solve_additive(pts) == pytest.approx(100.0)
    assert llm_rows.solve_additive([(20.0, 28, 19.0)]) == 0.0          # never a negative time
    rows = [_c(model=m, stack=llm_rows.GRAPH_STACK, published=p, ifa_runs=n) for m, (_, n, p) in
            zip(("a", "b", "c"), pts)]
    for r, (b, _, _) in zip(rows, pts):
        r.simulated = b
    t, lomo = llm_rows.fit_ifa_overhead(rows)
    assert t == pytest.approx(100.0) and lomo == pytest.approx({"a": 100.0, "b": 100.0, "c": 100.0})


def test_leave_one_model_out_refits_the_stack_constant_without_the_rows_model():
    stack = get_stack(llm_rows.GRAPH_STACK).with_values(ifa_overhead_us=100.0, name=llm_rows.GRAPH_STACK)
    # model a needs 200 us per run, model b 0 us: each refit without one model is the other's value
    a = _c(model="a", stack=stack.name, published=40.0, ifa_runs=50)
    b = _c(model="b", stack=stack.name, published=30.0, ifa_runs=50)
    a.simulated, b.simulated = 30.0 + 5.0, 30.0 + 5.0            # simulated with 100 us: base 30 ms each
    fitted = llm_rows.with_leave_one_model_out([a, b], stack)
    assert fitted.value == 100.0 and fitted.name == "ifa_overhead_us"
    assert a.lomo_simulated == pytest.approx(30.0) and b.lomo_simulated == pytest.approx(40.0)


def test_a_stack_charges_its_incre_flash_attention_overhead_on_each_run():
    stack = get_stack("torchair-graph").with_values(ifa_overhead_us=50.0, launch_us=2.0)
    plain = run_in_order([Launch(10.0, 4)], stack)
    ifa = run_in_order([Launch(10.0, 4, ifa_overhead=True)], stack)
    comm = run_in_order([Launch(10.0, 4, collective=True, ifa_overhead=True)], stack)
    assert plain.step_us == pytest.approx(4 * 12.0)
    assert ifa.step_us == pytest.approx(4 * 62.0)
    assert comm.step_us == pytest.approx(40.0)                      # HCCL launches its own
    assert get_stack("vllm-ascend-aclgraph").ifa_overhead_us == 0.0  # absent from a preset: none


def test_the_torchair_graph_decode_step_pays_the_ifa_overhead_once_per_layer():
    chip = llm_rows.atlas_800i_a2()
    stack = get_stack("torchair-graph")
    kw = dict(batch=1, prompt_len=128, output_len=8, chip=chip, precision="bf16")
    with_it = simulate_generation("qwen2-7b", stack=stack, **kw)
    without = simulate_generation("qwen2-7b", stack=stack.with_values(ifa_overhead_us=0.0), **kw)
    assert with_it.tpot_ms - without.tpot_ms == pytest.approx(28 * stack.ifa_overhead_us / 1000, rel=1e-6)
    assert with_it.ttft_ms == pytest.approx(without.ttft_ms)         # prefill runs PromptFlashAttention
    full = simulate_generation("qwen2-7b", stack=stack, kv_impl="in-place-full", **kw)
    cat = simulate_generation("qwen2-7b", stack=stack, kv_impl="concat-expand", **kw)
    assert sum(k.count for k in full.decode_kernels if k.spec.ifa_overhead) == 28      # a preallocated cache
    assert not any(k.spec.ifa_overhead for k in cat.decode_kernels)                     # grown by concatenation


def test_attention_without_actual_lengths_reads_the_whole_preallocated_cache():
    # torchair's Qwen2 port as its batch tables were measured: no actual_seq_lengths, so every decode
    # step's IncreFlashAttention reads the cache allocated for prompt + output tokens, whatever the context
    chip = llm_rows.atlas_800i_a2()
    stack = get_stack("torchair-graph").with_values(ifa_overhead_us=0.0)
    kw = dict(batch=16, prompt_len=1024, output_len=1024, chip=chip, precision="bf16", stack=stack)
    used = simulate_generation("qwen2-7b", **kw)
    full = simulate_generation("qwen2-7b", kv_impl="in-place-full", **kw)
    [ifa] = [k.spec for k in full.decode_kernels if k.name == "IncreFlashAttention"]
    assert ifa.context == 2048 and not ifa.actual_lengths and ifa.preallocated
    steps = [t for _, t in full.step_vs_context]
    assert max(steps) == pytest.approx(min(steps))              # the same cache read at every context
    assert full.tpot_ms > used.tpot_ms and full.ttft_ms == pytest.approx(used.ttft_ms)
    from pypto_lab.llm.configs import spec_of
    from pypto_lab.llm.engine import hardware
    from pypto_lab.llm.forward import forward_kernels
    hw = hardware(chip, precision="bf16", stack=stack, kv_impl="in-place-full")   # no capacity given
    with pytest.raises(LLMConfigError, match="kv_capacity = 0: .*in-place-full.*Fix: .*kv_capacity"):
        forward_kernels(spec_of("qwen2-7b"), hw, decode=[1500])


def test_concatenating_and_expanding_the_cache_costs_the_copies_the_code_makes():
    chip = llm_rows.atlas_800i_a2()
    stack = get_stack("torchair-graph").with_values(ifa_overhead_us=0.0)   # the copies alone
    kw = dict(batch=8, prompt_len=512, output_len=8, chip=chip, precision="fp16", stack=stack)
    in_place = simulate_generation("chatglm3-6b", **kw)
    concat = simulate_generation("chatglm3-6b", kv_impl="concat-expand", **kw)
    names = {k.name: k for k in concat.decode_kernels}
    assert {"ConcatD_kv_cache", "BroadcastTo_kv_bnsd"} <= set(names) and "ScatterUpdate_kv_cache" not in names
    ifa = names["IncreFlashAttention"].spec
    assert ifa.kv_heads == 32 and ifa.group == 1 and not ifa.actual_lengths   # every head's own copy, no lengths
    [base_ifa] = [k.spec for k in in_place.decode_kernels if k.name == "IncreFlashAttention"]
    assert base_ifa.kv_heads == 2 and base_ifa.group == 16 and base_ifa.actual_lengths
    # the expansion writes 16x what it reads: its bytes grow with the context and the heads
    bcast = names["BroadcastTo_kv_bnsd"]
    assert bcast.cost.hbm_bytes > 8 * 2 * 2 * 512 * 32 * 128      # more than the expanded keys and values once
    copies_ms = sum(names[n].cost.time_us * names[n].count for n in ("ConcatD_kv_cache", "BroadcastTo_kv_bnsd")) / 1e3
    assert concat.tpot_ms - in_place.tpot_ms > copies_ms       # and attention reads 16x the keys and values
    with pytest.raises(LLMConfigError, match="kv_impl = 'cat'.*Fix: kv_impl='in-place'"):
        simulate_generation("chatglm3-6b", kv_impl="cat")


def test_each_fixed_batch_row_runs_on_its_stack_with_its_code():
    rows = {r["id"]: r for r in llm_rows.read_rows()}
    assert llm_rows.row_stack(rows["65"]) == "torchair-graph" and llm_rows.row_kv_impl(rows["65"]) == "in-place-full"
    assert llm_rows.row_kv_impl(rows["41"]) == "in-place"          # Llama: measured with actual_seq_lengths
    assert llm_rows.row_stack(rows["103"]) == "torch_npu-eager"
    assert llm_rows.row_kv_impl(rows["89"]) == "concat-expand"      # torchair's ChatGLM3 port
    [c] = llm_rows.fixed_batch([rows["65"]])
    assert c.stack == "torchair-graph" and c.ifa_runs == 28 and c.regime == "LLM decode (TPOT)"
    assert any("whole preallocated cache" in m for m in c.mechanisms) and not c.held_back
    [h] = llm_rows.fixed_batch([rows["53"]])
    assert h.held_back and h.model in llm_rows.HELD_BACK


def test_validate_sets_filters_by_stack_and_names_a_bad_set(monkeypatch):
    def fake(tick=None):
        tick()
        return [_c(stack="torchair-graph"), _c(stack="vllm-ascend-aclgraph")], []
    monkeypatch.setattr(suite, "_runner", lambda name: fake)
    summary = suite.validate_sets("llm", stack="torchair-graph")
    assert [r.stack for r in summary.rows] == ["torchair-graph"]
    assert suite.check_sets("all") == suite.SETS
    with pytest.raises(ValidationError, match="the sets are inference, llm, serving, training or all"):
        suite.check_sets("decode")
    with pytest.raises(ValidationError, match="measured on stack 'mindie'"):
        suite.validate_sets("llm", stack="mindie")


def test_the_command_writes_the_summary_as_json(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(suite, "_runner", lambda name: (lambda tick=None: ([_c(stack="torchair-graph")], [])))
    out = tmp_path / "v.json"
    assert main(["validate", "--set", "serving", "--quiet", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["regimes"][0]["stack"] == "torchair-graph" and doc["rows"][0]["error"] == pytest.approx(0.1)
    assert "LLM decode (TPOT)" in capsys.readouterr().out
    assert main(["validate", "--set", "llm", "--chip", "Ascend310P3", "--quiet"]) == 2
    assert "--chip and --level choose the inference rows" in capsys.readouterr().err


def test_a_short_matmul_in_a_torch_npu_loop_is_bound_by_the_hosts_dispatch():
    rows = llm_rows.matmuls(llm_rows.read_rows())
    small = next(c for c in rows if c.model == "matmul 1024^3")
    big = next(c for c in rows if c.model == "matmul 8192^3")
    eager = get_stack("torch_npu-eager")
    # 1024^3 takes a few microseconds on the Cube: the loop runs at one dispatch per call
    assert small.simulated == pytest.approx(2 * 1024 ** 3 / eager.dispatch_us / 1e6, rel=0.01)
    assert "host-bound" in small.mechanisms[0] and "host-bound" not in big.mechanisms[0]


def test_an_eager_decode_step_runs_the_model_codes_operations_on_the_host():
    """torchair's ports as their eager rows ran: every operation of a decoder layer's code on the host
    (forward.MODEL_CODE), spread over the layer's kernels; an eager decode step becomes host-bound, a
    graph step and the prefill do not move."""
    from pypto_lab.llm.configs import spec_of
    from pypto_lab.llm.engine import hardware
    from pypto_lab.llm.forward import MODEL_CODE, code_launches, forward_kernels

    chip = llm_rows.atlas_800i_a2()
    code = MODEL_CODE["torchair-qwen2"]
    hw = hardware(chip, precision="bf16", stack="torch_npu-eager", code="torchair-qwen2")
    ks = forward_kernels(spec_of("qwen2-7b"), hw, decode=[1100] * 4)
    extra = code_launches(ks, hw.code)
    assert sum(k.count * o for k, (o, _) in zip(ks, extra)) == pytest.approx(28 * code.ops)
    listed = sum(k.count for k in ks if not k.collective and k.count >= 28) / 28
    assert sum(k.count * d for k, (_, d) in zip(ks, extra)) == pytest.approx(28 * (code.kernels - listed))
    assert code_launches(ks, None) == [(0.0, 0.0)] * len(ks)
    kw = dict(batch=4, prompt_len=1024, output_len=4, chip=chip, precision="bf16")
    eager = get_stack("torch_npu-eager")
    bare = simulate_generation("qwen2-7b", stack=eager, **kw)
    coded = simulate_generation("qwen2-7b", stack=eager, code="torchair-qwen2", **kw)
    host_ms = 28 * (code.ops * eager.host_op_us + code.kernels * eager.dispatch_us) / 1000
    assert coded.tpot_ms > bare.tpot_ms and coded.tpot_ms >= host_ms           # the device waits for the host
    assert coded.ttft_ms == pytest.approx(bare.ttft_ms, rel=0.02)              # the prefill's kernels hide it
    graph = get_stack("torchair-graph")
    assert (simulate_generation("qwen2-7b", stack=graph, code="torchair-qwen2", **kw).tpot_ms
            == pytest.approx(simulate_generation("qwen2-7b", stack=graph, **kw).tpot_ms))
    with pytest.raises(LLMConfigError, match="code = 'vllm'"):
        simulate_generation("qwen2-7b", code="vllm", **kw)
    rows = {r["id"]: r for r in llm_rows.read_rows()}
    assert [llm_rows.row_code(rows[i]) for i in ("103", "105", "101")] == [
        "torchair-qwen2", "torchair-chatglm3", "torchair-llama"]
    [c] = llm_rows.fixed_batch([rows["103"]])
    assert any("model code (torchair-qwen2" in m for m in c.mechanisms)


def test_chatglm3s_growing_cache_makes_its_graph_host_scheduled():
    """ChatGLM3's port compiles with dynamic=True over a cache grown by torch.cat: a new input shape
    every step, so GE schedules the graph from the host kernel by kernel, the host running ahead; at
    the stack's per-kernel figure the device hides it, at a slower host the step is the host's. A
    cache written in place keeps a static graph."""
    chip = llm_rows.atlas_800i_a2()
    graph = get_stack("torchair-graph")
    kw = dict(batch=1, prompt_len=1024, output_len=4, chip=chip, precision="fp16", kv_impl="concat-expand")
    sunk = simulate_generation("chatglm3-6b", stack=graph.with_values(dynamic_shape_dispatch_us=0.0), **kw)
    host = simulate_generation("chatglm3-6b", stack=graph, **kw)
    slow = simulate_generation("chatglm3-6b", stack=graph.with_values(dynamic_shape_dispatch_us=200.0), **kw)
    runs = sum(k.count for k in host.decode_kernels)
    assert sunk.tpot_ms <= host.tpot_ms < sunk.tpot_ms * 1.01              # hidden behind the device
    assert slow.tpot_ms >= runs * 0.2 > sunk.tpot_ms                       # host-bound: every kernel's dispatch
    kw["kv_impl"] = "in-place"
    assert (simulate_generation("chatglm3-6b", stack=graph.with_values(dynamic_shape_dispatch_us=200.0), **kw).tpot_ms
            == pytest.approx(simulate_generation("chatglm3-6b", stack=graph, **kw).tpot_ms))
    rows = {r["id"]: r for r in llm_rows.read_rows()}
    [c] = llm_rows.fixed_batch([rows["89"]])
    assert any("dynamic-shape graph" in m for m in c.mechanisms)


def test_the_eager_host_constant_is_fitted_on_the_eager_rows_and_left_out_per_model():
    rows = llm_rows.read_rows()
    fit = llm_rows.eager_fit_rows(rows)
    assert {r["model"] for r in fit} == {"Llama-2-70B", "Qwen2-7B", "ChatGLM3-6B"}   # Llama-2-7B held back
    assert all(r["metric"].startswith("decode") for r in fit)
    t = get_stack("torch_npu-eager").host_op_us
    out = llm_rows.fixed_batch([r for r in rows if r["id"] in ("103", "105")])
    fitted = llm_rows.with_eager_leave_one_model_out(out, [r for r in rows if r["id"] in ("103", "105")],
                                                     get_stack("torch_npu-eager"))
    assert fitted.name == "host_op_us" and fitted.value == t
    assert all(c.lomo_simulated is not None for c in out)
