"""The PyPTO language as the real framework has it at 883e7df: every configuration option (checked
by type, with a fix), the 24 dtypes of its DataType enum, the v0.2 annotations, semantic labels,
PrecisionType and the experimental namespace."""

from __future__ import annotations

import json

import pytest
import torch

pypto = pytest.importorskip("pypto_lab.pto")
from pypto_lab.pto import option_table  # noqa: E402

SIM = {"run_mode": pypto.RunMode.SIM}


@pytest.fixture(autouse=True)
def _clean_options():
    pypto.reset_options()
    yield
    pypto.reset_options()


# ---------------------------------------------------------------------------- options

def test_every_real_option_section_is_accepted_and_read_back():
    pypto.set_pass_options(enable_slice=True, vec_nbuffer_setting={-1: 2}, sg_set_scope=3,
                           cube_l1_reuse_setting={"DEFAULT": 4, "func8_0": (1, "left")}, ooo_sched_mode="HLF")
    assert pypto.get_pass_options()["enable_slice"] is True
    assert pypto.get_pass_options()["sg_set_scope"] == (3, False, False)
    pypto.set_host_options(compile_stage=pypto.CompStage.TILE_GRAPH, compile_timeout=60)
    assert pypto.get_host_options() == {"compile_stage": 2, "compile_timeout": 60}
    pypto.set_codegen_options(enable_pmu_trace=True, soc_version="Ascend910B1")
    pypto.set_verify_options(enable_pass_verify=True, pass_verify_error_tol=[1e-3, 1e-2])
    pypto.set_debug_options(compile_debug_mode=1, dump_pass_graph=["ExpandFunction"])
    pypto.set_runtime_options(device_sched_mode=1, stitch_function_max_num=64)
    pypto.experimental.set_operation_options(combine_axis=False)
    opts = pypto.get_options()
    assert opts["codegen.enable_pmu_trace"] is True and opts["verify.pass_verify_error_tol"] == [1e-3, 1e-2]
    assert opts["debug.dump_pass_graph"] == ["ExpandFunction"] and opts["operation.combine_axis"] is False
    assert opts["runtime.stitch_function_max_num"] == 64
    # every section of the real schema has its setter here
    for sec in option_table.SECTIONS:
        assert callable(getattr(pypto, f"set_{sec}_options")) or sec == "operation"


def test_option_of_the_wrong_type_names_option_value_type_and_fix():
    with pytest.raises(pypto.OptionError) as e:
        pypto.options(pass_options={"enable_slice": 1})
    msg = str(e.value)
    assert "'enable_slice' = 1 (int)" in msg and "bool" in msg and "Fix: e.g. pass_options={'enable_slice': True}" in msg
    with pytest.raises(pypto.OptionError, match=r"stitch_function_max_num.*out of range.*\[1, 1024\]"):
        pypto.jit(runtime_options={**SIM, "stitch_function_max_num": 0})(lambda x: x)(torch.zeros(2))
    with pytest.raises(pypto.OptionError, match="ooo_sched_mode.*one of '', 'GAPMIN', 'HLF'"):
        pypto.set_pass_options(ooo_sched_mode="FAST")
    with pytest.raises(pypto.OptionError, match="vec_nbuffer_setting.*value '2' of key -1 is not an int"):
        pypto.set_pass_options(vec_nbuffer_setting={-1: "2"})
    with pytest.raises(pypto.OptionError, match="compile_debug_mode"):
        pypto.set_debug_options(compile_debug_mode=True)  # a bool is not an int here
    with pytest.raises(pypto.OptionError, match=r"runtime_options = \['run_mode'\] is not a dict.*Fix"):
        pypto.options(runtime_options=["run_mode"])


def test_unknown_option_suggests_the_close_name_or_the_right_section():
    with pytest.raises(pypto.OptionError, match="Did you mean 'enable_slice'"):
        pypto.options(pass_options={"enable_slcie": True})
    with pytest.raises(pypto.OptionError, match="'run_mode' is a runtime option: pass it in runtime_options"):
        pypto.frontend.jit(pass_options={"run_mode": 1})(lambda x: x)
    with pytest.raises(pypto.OptionError, match="host option 'nonsense' is not known"):
        pypto.frontend.jit(host_options={"nonsense": 1})(lambda x: x)


def test_options_scope_restores_every_section_and_double_buffer_is_modelled():
    with pypto.options(pass_options={"enable_slice": True}, debug_options={"runtime_debug_mode": 1},
                       matrix_size=[64, 64, 64]):
        assert pypto.get_options()["debug.runtime_debug_mode"] == 1
        assert pypto.get_pass_options() == {"enable_slice": True}
    assert pypto.get_options() == {}

    def kernel(x, out):
        pypto.set_vec_tile_shapes(16, 64)
        out[:] = (x * 2.0).exp()

    x = torch.randn(4096, 64)
    one = pypto.jit(runtime_options=SIM, pass_options={"double_buffer": False})(kernel)
    two = pypto.jit(runtime_options=SIM, pass_options={"double_buffer": True, "enable_slice": True})(kernel)
    o1, o2 = torch.empty_like(x), torch.empty_like(x)
    one(x, o1)
    two(x, o2)
    torch.testing.assert_close(o1, o2)
    assert two.last_run.cycles < one.last_run.cycles  # ping-pong overlaps load and compute
    assert two.options["pass_options"] == {"double_buffer": True, "enable_slice": True}


def test_option_table_covers_the_real_schema_and_says_what_is_modelled():
    md = option_table.table_markdown()
    for name in ("pass.enable_slice", "runtime.launch_early_mode", "host.compile_monitor_print_interval",
                 "codegen.vf_options", "verify.pass_verify_pass_filter", "debug.dump_pass_graph",
                 "operation.combine_axis"):
        assert f"`{name}`" in md
    assert "modelled: False: one slot per buffer" in md
    assert "883e7df" in option_table.__doc__


# ---------------------------------------------------------------------------- dtypes

def test_all_24_dtypes_of_the_real_enum_with_sizes_and_torch_types():
    from pypto_lab.pto import dtypes

    assert len(dtypes.ALL) == 24
    assert [d.value for d in dtypes.ALL] == list(range(24))
    assert pypto.DataType.DT_UINT16 is pypto.DT_UINT16
    assert pypto.bytes_of(pypto.DT_UINT64) == 8 and pypto.bytes_of(pypto.DT_DOUBLE) == 8
    assert (pypto.DT_INT4.bits, pypto.DT_HF4.bits, pypto.DT_FP4_E2M1.bits) == (4, 4, 4)
    assert pypto.DT_FP8E4M3.torch is torch.float8_e4m3fn and pypto.DT_FP8E5M2.torch is torch.float8_e5m2
    assert pypto.DT_UINT32.torch is torch.uint32 and pypto.DT_HF8.torch is None
    assert dtypes.as_dtype("float32") is pypto.DT_FP32 and dtypes.as_dtype("bfloat16") is pypto.DT_BF16


def test_new_dtypes_are_storage_only_and_cast_with_torch_numerics():
    @pypto.frontend.jit(runtime_options=SIM)
    def roundtrip(x: pypto.Tensor([pypto.DYNAMIC, 32], pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 32)
        y = pypto.cast(x, pypto.DT_FP8E4M3)
        return pypto.cast(y, pypto.DT_FP32)

    x = torch.randn(16, 32)
    torch.testing.assert_close(roundtrip(x), x.to(torch.float8_e4m3fn).float())

    @pypto.frontend.jit(runtime_options=SIM)
    def add16(x: pypto.Tensor([], pypto.DT_UINT16)):
        pypto.set_vec_tile_shapes(8, 32)
        return x + x

    with pytest.raises(pypto.DTypeError, match=r"DT_UINT16 is storage only.*Fix: pypto.cast\(x, pypto.DT_FP32\)"):
        add16(torch.ones(8, 32, dtype=torch.uint16))

    @pypto.frontend.jit(runtime_options=SIM)
    def to_hf8(x: pypto.Tensor()):
        pypto.set_vec_tile_shapes(8, 32)
        return pypto.cast(x, pypto.DT_HF8)

    with pytest.raises(pypto.DTypeError, match=r"pypto.DT_HF8.*no torch dtype.*Fix:"):
        to_hf8(torch.ones(8, 32))


# ---------------------------------------------------------------------------- annotations

def test_v02_annotations_dynamic_static_empty_and_return():
    @pypto.frontend.jit(runtime_options=SIM)
    def k(a: pypto.Tensor([pypto.DYNAMIC, 32], pypto.DT_FP32), b: pypto.Tensor([], pypto.DT_FP32),
          c: pypto.Tensor(), d: pypto.tensor(), e: pypto.Tensor([pypto.STATIC, ...], pypto.DT_FP32)
          ) -> pypto.Tensor([pypto.DYNAMIC, 32], pypto.DT_FP32):
        pypto.set_vec_tile_shapes(8, 32)
        return a + b + c + d + e

    for rows in (8, 24):
        xs = [torch.randn(rows, 32) for _ in range(5)]
        torch.testing.assert_close(k(*xs), sum(xs))
    assert k.cache_info() == {"entries": 2, "traces": 2}  # one compile per concrete size
    x = torch.randn(8, 32)
    with pytest.raises(pypto.ShapeError, match="size 16 on dimension 1, annotated 32"):
        k(torch.randn(8, 16), x, x, x, x)
    with pytest.raises(pypto.ShapeError, match="rank 0 .*annotated rank at least 1"):
        k(x, x, x, x, torch.tensor(1.0))
    with pytest.raises(pypto.ShapeError, match="dtype pypto.DT_FP16, annotated pypto.DT_FP32"):
        k(x, x.half(), x, x, x)
    ann = pypto.Tensor[[pypto.StatusType.STATIC, 4], pypto.DT_FP16, "w", pypto.TileOpFormat.TILEOP_NZ]
    assert (ann.spec_shape, ann.spec_dtype, ann.name, ann.format) == ((pypto.STATIC, 4), pypto.DT_FP16, "w",
                                                                     pypto.TileOpFormat.TILEOP_NZ)


def test_bad_annotations_and_tensor_without_shape_inside_a_kernel_teach():
    with pytest.raises(pypto.TraceError, match=r"entry 1 = 'x' is not a dimension.*Fix:"):
        pypto.Tensor([4, "x"], pypto.DT_FP32)
    with pytest.raises(pypto.TraceError, match="only the last may be"):
        pypto.Tensor([..., 4])

    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor()):
        return pypto.tensor()

    with pytest.raises(pypto.ShapeError, match=r"pypto.tensor\(\) inside a kernel has no shape.*Fix"):
        k(torch.zeros(8, 32))


# ---------------------------------------------------------------------------- labels, precision, experimental

def test_semantic_labels_reach_tensor_graph_tile_graph_and_chrome_trace(tmp_path):
    @pypto.frontend.jit(runtime_options=SIM)
    def k(x: pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(16, 64)
        pypto.set_semantic_label("scale")
        y = x * 3.0
        pypto.set_semantic_label("act")
        z = pypto.exp(y, pypto.PrecisionType.HIGH_PRECISION)
        return pypto.sqrt(z)

    x = torch.rand(32, 64)
    torch.testing.assert_close(k(x), (x * 3).exp().sqrt())
    assert pypto.get_semantic_label() is None  # a label set inside a kernel ends with its trace
    k.dump_stages(tmp_path)
    nodes = json.loads((tmp_path / "tensor_graph.json").read_text())["nodes"]
    labels = {n["op"]: n.get("attrs", {}).get("semantic_label") for n in nodes}
    assert labels["muls"] == "scale" and labels["exp"] == "act" and labels["sqrt"] == "act"
    exp = next(n for n in nodes if n["op"] == "exp")
    assert exp["attrs"]["precision_type"] == "HIGH_PRECISION"
    sqrt = next(n for n in nodes if n["op"] == "sqrt")
    assert "precision_type" not in sqrt["attrs"]  # the default is not recorded
    tile = json.loads((tmp_path / "tile_graph.json").read_text())
    assert any(g.get("semantic_labels") == ["scale", "act"] for g in tile["groups"])
    assert k.last_run.chrome_trace()["otherData"]["groups"] == ["muls+exp+sqrt [scale, act]"]


def test_semantic_label_errors():
    with pytest.raises(pypto.SemanticLabelError, match="'func12_3'.*reserves.*Fix"):
        pypto.set_semantic_label("func12_3")
    with pytest.raises(pypto.SemanticLabelError, match="is a int.*Fix"):
        pypto.set_semantic_label(7)
    with pytest.raises(pypto.DTypeError, match="not a PrecisionType.*Fix: precision_type=pypto.PrecisionType.INTRINSIC"):
        @pypto.frontend.jit(runtime_options=SIM)
        def k(x: pypto.Tensor()):
            pypto.set_vec_tile_shapes(8, 32)
            return pypto.exp(x, "fast")

        k(torch.zeros(8, 32))


def test_experimental_namespace():
    @pypto.frontend.jit(runtime_options=SIM)
    def tbmm(a: pypto.Tensor([4, 2, 32], pypto.DT_FP16), b: pypto.Tensor([2, 32, 16], pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(1, 4, 32)
        pypto.set_cube_tile_shapes([16, 16], [32, 32], [16, 16])
        return pypto.experimental.transposed_batchmatmul(a, b, pypto.DT_FP32)

    a, b = torch.randn(4, 2, 32, dtype=torch.float16), torch.randn(2, 32, 16, dtype=torch.float16)
    ref = torch.bmm(a.transpose(0, 1).float(), b.float()).transpose(0, 1)
    torch.testing.assert_close(tbmm(a, b), ref, rtol=1e-3, atol=1e-3)
    with pytest.raises(pypto.NotModelledError, match="shmem_load: pypto_lab does not model"):
        pypto.experimental.shmem_load(None)
    assert isinstance(pypto.NotModelledError("x"), NotImplementedError)


def test_an_unrolled_loop_index_takes_min_like_the_real_symbolic_index():
    # ffn_module.py's dynamic FFN: valid_shape=[(batch - idx * b).min(b), h], with batch an int
    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
    def k(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 64)
        n, b = x.shape[0], 16
        for idx in pypto.loop(0, (n + b - 1) // b, 1, name="L", idx_name="idx"):
            off = idx * b
            rows = (n - off).min(b)
            assert rows == min(n - int(off), b) and (n - off).max(0) == n - int(off)
            v = pypto.view(x, [b, 64], [off, 0], valid_shape=[rows, 64])
            pypto.assemble(pypto.mul(v, 2.0), [off, 0], out)
    x = torch.randn(32, 64)
    out = torch.empty_like(x)
    k(x, out)
    torch.testing.assert_close(out, 2 * x)
