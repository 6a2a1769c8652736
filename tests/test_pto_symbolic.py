"""SymbolicScalar, tensor reads as scalars (a paged-attention block table) and long loops kept as
loops (pypto_lab.pto.symbolic / loops): what a kernel author relies on."""

import warnings

import pytest
import torch

import pypto_lab.pto as pypto
from pypto_lab.pto import loops
from pypto_lab.pto.errors import (
    LoopError,
    PtoError,
    SymbolicIndexError,
    UnwrittenOutputWarning,
)

SIM = {"run_mode": pypto.RunMode.SIM, "chip": "Ascend910B1"}


def test_symbolic_scalar_api_matches_the_real_one():
    s1, s2, x = pypto.SymbolicScalar(10), pypto.SymbolicScalar(5), pypto.SymbolicScalar("x")
    assert s1.is_concrete() and s1.is_immediate() and not s1.is_symbol() and not s1.is_expression()
    assert x.is_symbol() and not x.is_concrete() and not x.is_expression()
    e = x + 5
    assert e.is_expression() and not e.is_symbol()
    assert s1.max(s2).concrete() == 10 and s1.max(13).concrete() == 13 and s1.min(3).concrete() == 3
    assert str(x.max(2)) == "RUNTIME_Max(x, 2)" and str(x.min(2)) == "RUNTIME_Min(x, 2)"
    assert ((s1 * 3 - 4) // 2 % 5).concrete() == 3
    assert str(pypto.max(x, 4)) == "RUNTIME_Max(x, 4)" and pypto.min(3, 7) == 3
    assert pypto.symbolic_scalar is pypto.SymbolicScalar
    assert pypto.SymbolicScalar(x).name == "x"
    with pytest.raises(PtoError, match="not a concrete value"):
        x.concrete()
    with pytest.raises(ValueError):   # the real API raises ValueError: PtoError is one
        x.concrete()


def _rows_add(n_rows_per_iter=1):
    r = n_rows_per_iter

    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, y: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(r, 64)
        for i in pypto.loop(x.shape[0] // r, name="LOOP_rows", idx_name="i"):
            out[i * r:(i + 1) * r, :] = x[i * r:(i + 1) * r, :] + y[i * r:(i + 1) * r, :]
    return k


def test_a_long_loop_is_one_node_traced_once_and_costs_per_iteration():
    x = torch.randn(2000, 64, dtype=torch.float16)
    out = torch.empty_like(x)
    k = _rows_add()
    k(x, x, out)
    assert torch.equal(out, x + x)
    g = k.last_compiled.tensor_graph
    loop_nodes = [n for n in g.nodes if n.op == "loop"]
    assert len(loop_nodes) == 1 and len(loop_nodes[0].attrs["variants"]) == 1
    assert len(g.nodes) < 12                       # not 2000 x (view, view, add, assemble)
    info = k.last_run.loops[0]
    assert info["loop"] == "LOOP_rows" and info["iterations"] == 2000
    assert info["variants"][0]["simulated"] < 2000
    small = _rows_add()
    small(x[:1000], x[:1000], out[:1000])
    ratio = k.last_run.cycles / small.last_run.cycles
    assert 1.6 < ratio < 2.4                       # twice the iterations, about twice the time
    assert "2,000 iterations" in k.last_run.summary()


def test_the_extrapolated_cost_is_close_to_the_unrolled_simulation(monkeypatch):
    x = torch.randn(1000 * 8, 64, dtype=torch.float16)
    out = torch.empty_like(x)
    sym = _rows_add(8)
    sym(x, x, out)
    monkeypatch.setattr(loops, "UNROLL_LIMIT", 10**6)
    unrolled = _rows_add(8)
    unrolled(x, x, out)
    assert len(unrolled.last_compiled.tensor_graph.nodes) > 3000
    assert abs(sym.last_run.cycles - unrolled.last_run.cycles) / unrolled.last_run.cycles < 0.10


def test_python_if_and_cond_on_the_index_trace_one_body_per_iteration_class():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(0, 200, 1, name="L", idx_name="i"):
            row = x[i:i + 1, :]
            if i < 3:                                   # a Python if on the symbolic index
                out[i:i + 1, :] = row + row
            elif pypto.cond(pypto.is_loop_end(i)):
                out[i:i + 1, :] = row * row
            else:
                out[i:i + 1, :] = row - row
    x = torch.randn(200, 64, dtype=torch.float16)
    out = torch.empty_like(x)
    k(x, out)
    ref = x - x
    ref[:3] = x[:3] + x[:3]
    ref[199] = x[199] * x[199]
    assert torch.equal(out, ref)
    (node,) = [n for n in k.last_compiled.tensor_graph.nodes if n.op == "loop"]
    assert len(node.attrs["variants"]) == 3
    counts = sorted(v["iterations"] for v in k.last_run.loops[0]["variants"])
    assert counts == [1, 3, 196]


def test_is_loop_begin_and_end_of_a_symbolic_loop():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(100, name="L", idx_name="i"):
            row = x[i:i + 1, :]
            if pypto.is_loop_begin(i):
                out[i:i + 1, :] = row * 2.0
            else:
                out[i:i + 1, :] = row * 3.0
    x = torch.randn(100, 64, dtype=torch.float32)
    out = torch.empty_like(x)
    k(x, out)
    assert torch.equal(out[0], x[0] * 2) and torch.equal(out[1:], x[1:] * 3)


def test_nested_symbolic_loops_pick_the_inner_class_per_outer_iteration():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(80, name="Lo", idx_name="i"):
            for j in pypto.loop(70, name="Li", idx_name="j"):
                r = i * 70 + j
                if pypto.is_loop_begin(j):
                    out[r:r + 1, :] = x[r:r + 1, :] * 2.0
                else:
                    out[r:r + 1, :] = x[r:r + 1, :] + 1.0
    x = torch.randn(80 * 70, 64)
    out = torch.empty_like(x)
    k(x, out)
    ref = x + 1
    ref[::70] = x[::70] * 2
    assert torch.equal(out, ref)
    inner = next(lp for lp in k.last_run.loops if lp["loop"] == "Li")
    assert [v["iterations"] for v in inner["variants"]] == [80, 80 * 69]


def _paged_gather(n_blocks, block):
    @pypto.jit(runtime_options=SIM)
    def gather(cache: pypto.Tensor, block_table: pypto.Tensor([1, pypto.DYNAMIC], pypto.DT_INT32),
               out: pypto.Tensor):
        pypto.set_vec_tile_shapes(block, 64)
        for j in pypto.loop(n_blocks, name="LOOP_blocks", idx_name="j"):
            blk = block_table[0, j]                     # a scalar read when the kernel runs
            out[j * block:(j + 1) * block, :] = pypto.view(cache, [block, 64], [blk * block, 0]) * 1.0
    return gather


@pytest.mark.parametrize("n_blocks", [6, 100])        # unrolled, and kept as a loop
def test_block_table_reads_give_view_offsets_at_run_time(n_blocks):
    block, pool = 8, 128
    cache = torch.randn(pool * block, 64, dtype=torch.float32)
    out = torch.empty(n_blocks * block, 64, dtype=torch.float32)
    k = _paged_gather(n_blocks, block)
    for seed in (0, 1):                                # the same compiled kernel, another table
        table = torch.randperm(pool, generator=torch.Generator().manual_seed(seed))[:n_blocks]
        table = table.to(torch.int32).reshape(1, -1)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnwrittenOutputWarning)   # the table is read, not unused
            k(cache, table, out)
        ref = torch.cat([cache[int(b) * block:(int(b) + 1) * block] for b in table[0]])
        assert torch.equal(out, ref)
    assert k.cache_info()["traces"] == 1


def test_a_block_table_entry_out_of_range_names_value_bound_tensor_and_fix():
    block, pool = 8, 16
    cache = torch.randn(pool * block, 64, dtype=torch.float32)
    table = torch.arange(100, dtype=torch.int32).reshape(1, -1) % pool
    table[0, 70] = 99                                  # block 99 of a 16-block pool
    out = torch.empty(100 * block, 64, dtype=torch.float32)
    with pytest.raises(SymbolicIndexError) as err:
        _paged_gather(100, block)(cache, table, out)
    msg = str(err.value)
    assert "cache" in msg and "= 792" in msg and "size 128" in msg and "j = 70" in msg and "Fix:" in msg
    assert isinstance(err.value, PtoError)


def test_a_loop_bound_read_from_a_tensor_is_known_at_run_time():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, n: pypto.Tensor([1], pypto.DT_INT32), out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(n[0], name="L", idx_name="i"):
            out[i:i + 1, :] = x[i:i + 1, :] + 1.0
    x = torch.randn(300, 64, dtype=torch.float32)
    runs = {}
    for count in (50, 250):
        out = torch.zeros_like(x)
        k(x, torch.tensor([count], dtype=torch.int32), out)
        assert torch.equal(out[:count], x[:count] + 1) and not out[count:].any()
        assert k.last_run.loops[0]["iterations"] == count
        runs[count] = k.last_run.cycles
    assert k.cache_info()["traces"] == 1 and runs[250] > 2 * runs[50]


def test_an_index_read_from_data_drives_a_python_if_as_a_kernel_guard():
    """As the real frontend compiles both branches and picks one at run time, a Python ``if`` on
    argument data takes the branch this call's data take and records it as a kernel guard: a call
    whose data go the other way is traced again, and each call computes what its data say."""
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, t: pypto.Tensor([1], pypto.DT_INT32), out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        if t[0] > 0:
            out[:] = x + 1.0
        else:
            out[:] = x - 1.0
    x = torch.rand(4, 64)
    for flag, want in ((1, x + 1), (0, x - 1), (5, x + 1)):
        out = torch.zeros(4, 64)
        k(x, torch.tensor([flag], dtype=torch.int32), out)
        assert torch.equal(out, want), flag
    assert k.cache_info()["traces"] == 2


def test_an_accumulator_written_in_a_symbolic_loop_carries_its_value():
    """``acc = pypto.full(...)`` before a traced-once loop and ``acc[:] = acc + part`` in its body
    (the QAT backward kernels): each iteration reads the previous one's write, the code after the
    loop reads the last; the loop is not batched (its iterations depend on each other)."""
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP32), out: pypto.Tensor([1, 1], pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 64)
        acc = pypto.full([1, 1], 1.0, pypto.DT_FP32)
        for i in pypto.loop(0, x.shape[0], 8, name="L", idx_name="i"):
            rows = pypto.view(x, [8, 64], [i, 0])
            part = pypto.sum(pypto.sum(rows, dim=1, keepdim=True), dim=0, keepdim=True)
            acc[:] = pypto.add(acc, part)
        pypto.assemble(pypto.mul(acc, 2.0), [0, 0], out)
    x = torch.rand(800, 64)
    out = torch.zeros(1, 1)
    k(x, out)
    assert out.item() == pytest.approx(2 * (1 + x.double().sum().item()), rel=1e-5)
    assert k.last_run.loops[0]["iterations"] == 100


def test_a_value_carried_out_of_a_symbolic_loop_is_refused():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        acc = x[0:1, :]
        for i in pypto.loop(100):
            acc = acc + x[i:i + 1, :]
        out[0:1, :] = acc
    with pytest.raises(LoopError, match=r"traced once.*Fix: write the value to a tensor"):
        k(torch.zeros(100, 64), torch.zeros(1, 64))


def test_an_index_made_a_python_int_in_every_iteration_is_refused_by_name():
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(1000, name="LOOP_i"):
            r = int(i)
            out[r:r + 1, :] = x[r:r + 1, :] + 1.0
    with pytest.raises(LoopError, match=r"'LOOP_i' \(1000 iterations\).*int\(\)|'LOOP_i' \(1000 iterations\)"):
        k(torch.zeros(1000, 64), torch.zeros(1000, 64))


def test_the_trace_groups_a_loop_into_one_lane_with_its_iteration_count(tmp_path):
    x = torch.randn(5000, 64, dtype=torch.float16)
    out = torch.empty_like(x)
    k = _rows_add()
    k(x, x, out)
    tr = k.last_run.chrome_trace()
    procs = [e for e in tr["traceEvents"] if e.get("name") == "process_name"]
    loops_pid = next(e["pid"] for e in procs if e["args"]["name"] == "loops")
    lanes = [e for e in tr["traceEvents"] if e.get("name") == "thread_name" and e["pid"] == loops_pid]
    assert [e["args"]["name"] for e in lanes] == ["LOOP_rows (5,000 iterations)"]
    spans = [e for e in tr["traceEvents"] if e.get("ph") == "X" and e["pid"] == loops_pid]
    assert len(spans) == 1 and spans[0]["args"]["iterations"] == 5000 and spans[0]["dur"] > 0
    assert len(k.last_compiled.execute_graph.program) < 5000     # not one task per iteration
    k.dump_stages(tmp_path)                                       # symbolic offsets serialise
    assert "loop_idx_i" in (tmp_path / "tensor_graph.json").read_text()


def test_a_run_time_loop_shorter_than_the_simulated_waves_is_simulated_as_it_ran():
    # the trip count comes from a tensor (as paged attention reads a sequence's length): 3 here, far
    # fewer than the two waves of copies the loop's cost is extrapolated from
    @pypto.jit(runtime_options=SIM)
    def by_table(x: pypto.Tensor, n: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(n[0], name="LOOP_n", idx_name="i"):
            out[i:i + 1, :] = x[i:i + 1, :] + x[i:i + 1, :]

    @pypto.jit(runtime_options=SIM)
    def unrolled(x: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(3):
            out[i:i + 1, :] = x[i:i + 1, :] + x[i:i + 1, :]

    x = torch.randn(8, 64, dtype=torch.float16)
    a, b = torch.zeros_like(x), torch.zeros_like(x)
    by_table(x, torch.tensor([3], dtype=torch.int32), a)
    unrolled(x, b)
    assert torch.equal(a, b) and torch.equal(a[:3], x[:3] + x[:3]) and not a[3:].any()
    run = by_table.last_run
    assert run.loops[0]["iterations"] == 3 and run.loops[0]["variants"][0]["simulated"] == 3
    assert run.cycles == pytest.approx(unrolled.last_run.cycles) and run.cycles > 0


def test_sizes_and_unrolled_indices_take_the_symbolic_scalar_methods_models_call():
    # GLM's gating kernel: valid_shape=[(bs - bs_idx * rows).min(rows), ne] with bs = x.shape[0]
    @pypto.frontend.jit(runtime_options=SIM)
    def tail_rows(x: pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP32),
                  out: pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP32)):
        bs, rows = x.shape[0], 4
        pypto.set_vec_tile_shapes(rows, 64)
        for i in pypto.loop((bs + rows - 1) // rows, name="LOOP", idx_name="i"):
            n = (bs - i * rows).min(rows)
            assert n.is_concrete() and n.concrete() == min(bs - int(i) * rows, rows)
            out[i * rows:i * rows + n, :] = x[i * rows:i * rows + n, :] * 2.0

    x = torch.randn(10, 64)
    out = torch.zeros_like(x)
    tail_rows(x, out)
    assert torch.equal(out, x * 2)
    from pypto_lab.pto.symbolic import ConcreteScalar
    assert (ConcreteScalar(7) - 3).max(5) == 5 and isinstance(10 - ConcreteScalar(3), ConcreteScalar)
    assert isinstance(ConcreteScalar(2) + pypto.SymbolicScalar("n"), pypto.SymbolicScalar)


def test_a_valid_shape_read_from_a_tensor_applies_when_the_kernel_runs():
    # GLM attention's tail block: view(..., valid_shape=[g, (seq_len - i * t).min(t)]); the ops after
    # the view see only the valid part, and the tiles (and so the cost) are those of the full view
    @pypto.jit(runtime_options=SIM)
    def masked_rowsum(x: pypto.Tensor, n: pypto.Tensor, out: pypto.Tensor):
        pypto.set_vec_tile_shapes(8, 64)
        part = pypto.view(x, [8, 64], [0, 0], valid_shape=[8, n[0].min(64)])
        assert part.shape == [8, 64] and part.valid_shape[0] == 8
        assert isinstance(part.valid_shape[1], pypto.SymbolicScalar)
        out[:] = pypto.sum(part * 2.0, dim=-1, keepdim=True)

    x = torch.randn(8, 64)
    cycles = set()
    for k in (64, 10, 33):
        out = torch.zeros(8, 1)
        masked_rowsum(x, torch.tensor([k], dtype=torch.int32), out)
        assert torch.allclose(out, (x[:, :k] * 2).sum(-1, keepdim=True), atol=1e-5), k
        cycles.add(masked_rowsum.last_run.cycles)
    assert masked_rowsum.trace_count == 1 and len(cycles) == 1   # one compile; cost of the full tile


def test_a_branch_on_the_last_iteration_of_a_loop_whose_bound_is_read_from_data():
    # GLM attention: `if pypto.is_loop_end(s2_idx):` on a loop whose trip count comes from kv_act_seqs;
    # the first call's data picks the classes to trace, each run counts its own iterations
    @pypto.jit(runtime_options=SIM)
    def k(x: pypto.Tensor, n: pypto.Tensor([1], pypto.DT_INT32), out: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 64)
        for i in pypto.loop(n[0], name="L", idx_name="i"):
            if pypto.is_loop_end(i):
                out[i:i + 1, :] = x[i:i + 1, :] * 2.0
            else:
                out[i:i + 1, :] = x[i:i + 1, :] + 1.0

    x = torch.randn(16, 64)
    for count in (5, 9):
        out = torch.zeros_like(x)
        k(x, torch.tensor([count], dtype=torch.int32), out)
        want = torch.zeros_like(x)
        want[:count - 1] = x[:count - 1] + 1.0
        want[count - 1] = x[count - 1] * 2.0
        assert torch.equal(out, want), count
        assert sorted(v["iterations"] for v in k.last_run.loops[0]["variants"]) == [1, count - 1]
    assert k.cache_info()["traces"] == 1
