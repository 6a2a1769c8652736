"""pypto_lab.pto: PyPTO kernels in SIM mode — outputs against torch, cycles that react to tiling
the way the hardware does, the compile cache, the trace and the stage dumps."""

import json

import pytest
import torch

import pypto_lab.pto as pypto


def _add(tile, shape=(64, 64), dtype=torch.float32, **opts):
    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM}, **opts)
    def add_kernel(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(*tile)
        out[:] = x + y
    x, y = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    out = torch.empty(shape, dtype=dtype)
    add_kernel(x, y, out)
    return add_kernel, x, y, out


def test_add_matches_torch():
    k, x, y, out = _add((32, 32))
    torch.testing.assert_close(out, x + y)
    r = k.last_run
    assert r.cycles > 0 and r.time_us > 0 and r.pipe_busy["MTE2"] > 0 and r.pipe_busy["VECTOR"] > 0
    assert 0 < r.fraction_of_peak <= 1 and r.bound == "memory" and r.buffer_peak["UB"] > 0


def softmax_core(x):
    row_max = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - row_max)
    return e / pypto.sum(e, dim=-1, keepdim=True)


def make_softmax(tile=(1, 4, 1, 64), **opts):
    bs = pypto.frontend.dynamic("bs")

    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM}, **opts)
    def softmax_kernel(x: pypto.Tensor((bs, 32, 1, 256), pypto.DT_FP16)) -> pypto.Tensor((bs, 32, 1, 256), pypto.DT_FP16):
        out = pypto.tensor((bs, 32, 1, 256), pypto.DT_FP16)
        pypto.set_vec_tile_shapes(*tile)
        for idx in pypto.loop(0, bs, 1, name="LOOP_L0_bIdx", idx_name="idx"):
            out[idx:, ...] = softmax_core(x[idx:idx + 1, :32, :1, :256])
        return out
    return softmax_kernel


def test_softmax_fp16_matches_torch_and_caches():
    k = make_softmax()
    x = torch.rand(32, 32, 1, 256, dtype=torch.float16)
    y = k(x)
    assert y.dtype == torch.float16 and y.shape == x.shape
    torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), rtol=1e-3, atol=1e-3)
    assert k.trace_count == 1
    y2 = k(torch.rand(32, 32, 1, 256, dtype=torch.float16))
    assert k.trace_count == 1 and k.cache_info()["entries"] == 1  # cache hit: no re-trace
    assert not torch.equal(y, y2)
    k(torch.rand(8, 32, 1, 256, dtype=torch.float16))  # new dynamic size: a new signature
    assert k.trace_count == 2
    assert k.last_run.cores_used == 48


def test_matmul_with_cube_tiles_matches_torch():
    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"})
    def mm(a: pypto.Tensor((256, 512), pypto.DT_FP16), b: pypto.Tensor((512, 384), pypto.DT_FP16)):
        pypto.set_cube_tile_shapes([64, 128], [64, 256], [64, 128])
        return pypto.matmul(a, b, pypto.DT_FP16)
    a, b = torch.randn(256, 512, dtype=torch.float16), torch.randn(512, 384, dtype=torch.float16)
    c = mm(a, b)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=5e-2)
    r = mm.last_run
    assert r.bound == "cube" and 0 < r.fraction_of_peak < 1 and r.pipe_busy["CUBE"] > 0
    assert r.buffer_peak["L0A"] > 0 and r.buffer_peak["L0C"] > 0 and r.buffer_peak["L1"] > 0


def test_bigger_tiles_amortise_startup():
    small, *_ = _add((8, 16), shape=(512, 1024), dtype=torch.float16)
    big, *_ = _add((16, 1024), shape=(512, 1024), dtype=torch.float16)
    assert big.last_run.cycles < small.last_run.cycles


def test_idle_cores_are_slower():
    few, *_ = _add((32, 512), shape=(64, 1024), dtype=torch.float16)   # 4 tiles for 48 cores
    many, *_ = _add((2, 512), shape=(64, 1024), dtype=torch.float16)   # 64 tiles
    assert few.last_run.cores_used == 4 and many.last_run.cores_used == 48
    assert many.last_run.cycles < few.last_run.cycles


def test_double_buffering_overlaps_mte2_with_vector():
    on = make_softmax()
    off = make_softmax(pass_options={"double_buffer": False})
    x = torch.rand(32, 32, 1, 256, dtype=torch.float16)
    torch.testing.assert_close(on(x), off(x))
    tl = on.last_run.timeline
    mte2 = [(s, e, c) for s, e, c, p in zip(tl.start, tl.end, tl.core, tl.pipe) if p == 1]
    vec = [(s, e, c) for s, e, c, p in zip(tl.start, tl.end, tl.core, tl.pipe) if p == 5]
    core = int(vec[0][2])
    m = [(s, e) for s, e, c in mte2 if c == core]
    v = [(s, e) for s, e, c in vec if c == core]
    assert any(ms < ve and vs < me for ms, me in m for vs, ve in v)
    assert on.last_run.cycles < off.last_run.cycles
    assert on.last_run.buffer_peak["UB"] == 2 * off.last_run.buffer_peak["UB"]


def test_trace_and_stage_dumps(tmp_path):
    k = make_softmax()
    k(torch.rand(4, 32, 1, 256, dtype=torch.float16))
    path = k.last_run.export_chrome_trace(tmp_path / "trace.json")
    ev = json.loads(open(path).read())["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert {"MTE2", "VECTOR", "MTE3"} <= names
    assert any(e["ph"] == "X" and e["name"] == "VEXP" for e in ev)
    files = k.dump_stages(tmp_path / "stages")
    stages = {json.loads(open(f).read())["stage"] for f in files}
    assert stages == {"tensor_graph", "tile_graph", "block_graph", "execute_graph"}
    tile = k.stages["tile_graph"].to_json()
    g = tile["groups"][0]
    assert g["ops"][:2] == ["amax", "sub"] and g["reduced_axes"] == [3] and g["tiles_per_task"] == 4


def test_ops_and_control_flow_match_torch():
    @pypto.jit
    def kern(a: pypto.Tensor[...], b: pypto.Tensor[...], y: pypto.Tensor[...], z: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(2, 8)
        for i in pypto.loop(2):
            for j in pypto.loop(2):
                if i == 0:
                    y[i:i + 1, j * 8:(j + 1) * 8] = a[i:i + 1, j * 8:(j + 1) * 8] + b[i:i + 1, j * 8:(j + 1) * 8]
                else:
                    y[i:i + 1, j * 8:(j + 1) * 8] = a[i:i + 1, j * 8:(j + 1) * 8] - b[i:i + 1, j * 8:(j + 1) * 8]
        t = pypto.rsqrt(pypto.sqrt(pypto.exp(a * 0.5) + 1.0))
        s = pypto.amin(t, dim=0, keepdim=True) - pypto.amax(t, -1, True) * 2
        pypto.set_vec_tile_shapes(2, 16)  # fp16 needs 16 elements (32 bytes) innermost
        z.move(pypto.cast(pypto.cast(s, pypto.DT_FP16), pypto.DT_FP32))
    a, b = torch.rand(2, 16), torch.rand(2, 16)
    y, z = torch.zeros(2, 16), torch.zeros(2, 16)
    kern(a, b, y, z)
    torch.testing.assert_close(y, torch.cat([a[:1] + b[:1], a[1:] - b[1:]]))
    t = torch.rsqrt(torch.sqrt(torch.exp(a * 0.5) + 1))
    ref = (t.amin(0, keepdim=True) - t.amax(-1, keepdim=True) * 2).half().float()
    torch.testing.assert_close(z, ref, rtol=1e-3, atol=1e-3)


def test_transpose_reshape_view_assemble_and_loop_unroll():
    @pypto.frontend.jit
    def kern(x: pypto.Tensor([64, 32], pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(16, 32)
        out = pypto.tensor([32, 64], pypto.DT_FP32)
        t = pypto.transpose(x, 0, 1)
        pypto.set_vec_tile_shapes(8, 64)
        for idx, f in pypto.loop_unroll(0, 4, 1, unroll_list=[2]):
            v = pypto.view(t, [8 * f, 64], [idx * 8, 0])
            pypto.assemble(v * 2.0, [idx * 8, 0], out)
        return out
    x = torch.randn(64, 32)
    torch.testing.assert_close(kern(x), x.T * 2)


def test_tile_shape_getters_and_options_scope():
    pypto.reset_options()
    with pypto.options(vec_tile_shapes=[4, 64], pass_options={"vec_nbuffer_setting": {"DEFAULT": 1}}):
        assert pypto.get_vec_tile_shapes() == [4, 64]
        pypto.set_cube_tile_shapes([16, 32], [32, 64], [16, 32])
        assert pypto.get_cube_tile_shapes() == ([16, 32], [32, 64], [16, 32], False)  # as the real API: + split-K
        assert pypto.get_pass_options()["vec_nbuffer_setting"] == {"DEFAULT": 1}
    assert pypto.get_vec_tile_shapes() == [] and pypto.get_cube_tile_shapes() is None


@pytest.mark.parametrize("chip", ["Ascend910A", "Ascend310P3"])
def test_other_chips_matmul_then_vector(chip):
    @pypto.frontend.jit(runtime_options={"chip": chip})
    def ffn(x: pypto.Tensor((64, 128), pypto.DT_FP16), w: pypto.Tensor((128, 64), pypto.DT_FP16)):
        pypto.set_cube_tile_shapes([32, 64], [64, 128], [32, 64])
        h = pypto.matmul(x, w, pypto.DT_FP16)
        pypto.set_vec_tile_shapes(16, 64)
        return pypto.relu(h) + 1.0
    x, w = torch.randn(64, 128, dtype=torch.float16) / 8, torch.randn(128, 64, dtype=torch.float16) / 8
    torch.testing.assert_close(ffn(x, w).float(), torch.relu(x.float() @ w.float()) + 1, rtol=1e-2, atol=1e-2)
    assert [g["kind"] for g in ffn.last_run.groups] == ["cube", "vector"]
