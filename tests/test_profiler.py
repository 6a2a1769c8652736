"""pypto_lab.profiler: torch.profiler-style tables, Chrome traces and kernel_details.csv of simulated runs."""

import csv
import json
import math

import pytest
import torch
import torch.nn as nn

from pypto_lab import optimize
from pypto_lab.files import atomic as fileio
from pypto_lab.tools import profiler
from pypto_lab.tools.profiler import ProfilerActivity, ProfilerError

ACTS = [ProfilerActivity.CPU, ProfilerActivity.NPU]


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()
    x = torch.randn(4, 64)
    return optimize(model, x, chip="Ascend910B1", level=3), x


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, 10)).eval()


@pytest.fixture(scope="module")
def cnn_910b():
    x = torch.randn(2, 3, 32, 32)
    return optimize(_cnn(), x, chip="Ascend910B1", level=3), x


@pytest.fixture(scope="module")
def cnn_910a():
    x = torch.randn(2, 3, 32, 32)
    return optimize(_cnn(), x, chip="Ascend910A", level=2), x


def _profile(om, x, runs=1, cpu_us=(1500.0, 500.0), **kw):
    kw.setdefault("activities", ACTS)
    kw.setdefault("record_shapes", True)
    kw.setdefault("profile_memory", True)
    with profiler.profile(**kw) as prof:
        for i in range(runs):
            profiler.notify_run(om, (x,), cpu_us[i % len(cpu_us)])
    return prof


# ---- numbers ------------------------------------------------------------------------------

def test_events_carry_the_simulators_times_and_the_measured_cpu_time(mlp):
    om, x = mlp
    rep = om.report()
    prof = _profile(om, x, runs=2)
    ev = prof.events()
    cpu = [e for e in ev if e.device == "CPU"]
    npu = [e for e in ev if e.device == "NPU"]
    assert [e.self_cpu_time_us for e in cpu] == [1500.0, 500.0] and all(e.name == "optimized_model.__call__"
                                                                        for e in cpu)
    assert len(npu) == 2 * len(rep.kernels)
    assert [e.kernel for e in npu] == [k.name for k in rep.kernels] * 2
    assert [e.self_npu_time_us for e in npu] == [k.time_us for k in rep.kernels] * 2
    assert all(e.self_cpu_time_us == 0 and e.cpu_time_total_us == 0 for e in npu)   # no invented CPU times
    assert npu[0].name == "MatMulV2" and npu[0].gm_bytes == rep.kernels[0].gm_bytes
    # the second run starts where the first run's schedule ends
    for i, s in enumerate(rep.schedule.kernels):
        assert npu[i].start_us == pytest.approx(s.start_us)
        assert npu[len(rep.kernels) + i].start_us == pytest.approx(rep.latency_us + s.start_us)
    assert npu[0].input_shapes == ((4, 64), (128, 64), (128,))
    assert npu[0].input_dtypes == ("FLOAT16",) * 3 and npu[0].input_formats == ("ND",) * 3
    # GM the kernel's output takes: (4, 128) fp16 for linear+gelu, aligned to 512 bytes
    assert npu[0].npu_memory_bytes == 1024 and npu[0].block_num == rep.kernels[0].reports[0].cores_used
    assert cpu[0].input_shapes == ((4, 64),) and cpu[0].cpu_memory_bytes == 4 * 32 * 4


def test_notify_run_without_a_profile_does_nothing_and_activities_filter(mlp):
    om, x = mlp
    profiler.notify_run(om, (x,), 10.0)          # no profile: a no-op
    only_npu = _profile(om, x, activities=[ProfilerActivity.NPU])
    assert {e.device for e in only_npu.events()} == {"NPU"}
    only_cpu = _profile(om, x, activities=["cpu"])
    assert [e.device for e in only_cpu.events()] == ["CPU"]


def test_with_stack_records_the_callers_frames(mlp):
    om, x = mlp
    prof = _profile(om, x, with_stack=True)
    stack = next(e for e in prof.events() if e.device == "CPU").stack
    assert stack and any("test_profiler.py" in f for f in stack)
    assert not any("pypto_lab/profiler.py" in f for f in stack)


# ---- the table --------------------------------------------------------------------------------

def test_table_has_torch_layout_and_sorts(cnn_910b):
    om, x = cnn_910b
    prof = _profile(om, x, runs=2)
    text = prof.key_averages().table(sort_by="npu_time_total", row_limit=20)
    lines = text.rstrip("\n").split("\n")
    rule = lines[0]
    assert set(rule.replace(" ", "")) == {"-"} and lines[2] == rule
    header = lines[1].split()
    joined = " ".join(header)
    for col in ("Name", "Self CPU %", "Self CPU", "CPU total", "Self NPU", "Self NPU %", "NPU total",
                "NPU time avg", "CPU Mem", "NPU Mem", "# of Calls", "Input Shapes"):
        assert col in joined
    assert joined.index("Self CPU %") < joined.index("Self NPU %") < joined.index("# of Calls") \
        < joined.index("Input Shapes")
    end = lines.index(rule, 3)
    rows = lines[3:end]
    assert lines[end + 1].startswith("Self CPU time total: 2.000ms")
    assert lines[end + 2].startswith("Self NPU time total: ")
    names = [r.split()[0] for r in rows]
    assert names[0] == "optimized_model.__call__"     # its NPU total is all its kernels
    avgs = {a.key: a for a in prof.key_averages()}
    npu_order = [n for n in names if n != "optimized_model.__call__"]
    assert npu_order == sorted(npu_order, key=lambda n: -avgs[n].npu_time_total)
    rep = om.report()
    conv = avgs["Conv2D"]
    assert conv.count == 2 * sum(k.name.startswith("Conv2D:") for k in rep.kernels)
    assert conv.self_npu_time_total == pytest.approx(2 * sum(k.time_us for k in rep.kernels
                                                             if k.name.startswith("Conv2D:")))
    total = sum(k.time_us for k in rep.kernels) * 2
    assert f"Self NPU time total: {profiler.format_time(total)}" in text
    pct = sum(float(r.split("%")[1].split()[-1]) for r in rows if r.split()[0] != "optimized_model.__call__")
    assert pct == pytest.approx(100, abs=0.05)       # Self NPU % of the kernels adds up
    assert len(prof.key_averages().table(sort_by="count", row_limit=2).split("\n")) == 3 + 2 + 1 + 3 + 1
    for key in profiler.SORT_KEYS:
        prof.key_averages().table(sort_by=key)


def test_table_group_by_input_shape_and_optional_columns(mlp):
    om, x = mlp
    prof = _profile(om, x)
    rows = [a for a in prof.key_averages(group_by_input_shape=True) if a.key == "MatMulV2"]
    assert sorted(a.input_shapes for a in rows) == [((4, 64), (128, 64), (128,)), ((4, 128), (32, 128), (32,))]
    assert len([a for a in prof.key_averages() if a.key == "MatMulV2"]) == 1
    plain = _profile(om, x, record_shapes=False, profile_memory=False).key_averages().table()
    assert "Input Shapes" not in plain and "NPU Mem" not in plain and "# of Calls" in plain
    with pytest.raises(ProfilerError, match="record_shapes=True"):
        _profile(om, x, record_shapes=False).key_averages(group_by_input_shape=True)


def test_unknown_sort_key_names_the_allowed_keys(mlp):
    om, x = mlp
    with pytest.raises(ProfilerError, match="sort_by='cuda_time_total'.*npu_time_total.*self_cpu_time_total"):
        _profile(om, x).key_averages().table(sort_by="cuda_time_total")


def test_empty_profile_gives_an_empty_table_with_a_note(tmp_path):
    with profiler.profile(activities=ACTS) as prof:
        pass
    text = prof.key_averages().table(sort_by="npu_time_total")
    assert "no run was recorded" in text and "Self NPU time total: 0.000us" in text
    trace = json.loads(prof.export_chrome_trace(tmp_path / "t.json").read_text())
    assert trace["traceEvents"] and not [e for e in trace["traceEvents"] if e["ph"] == "X"]
    rows = list(csv.reader(prof.export_kernel_details(tmp_path / "k.csv").open()))
    assert rows == [list(profiler.KERNEL_DETAILS_COLUMNS)]


def test_units_as_torch_prints_them():
    assert profiler.format_time(12.3456) == "12.346us"
    assert profiler.format_time(2500.0) == "2.500ms"
    assert profiler.format_time(3.2e6) == "3.200s"
    assert profiler.format_memory(512) == "512 b"
    assert profiler.format_memory(3 * 1024) == "3.00 Kb"
    assert profiler.format_memory(5 * 1024 ** 2) == "5.00 Mb"
    assert profiler.format_memory(2 * 1024 ** 3) == "2.00 Gb"


# ---- the Chrome trace -------------------------------------------------------------------------

def _trace(prof, tmp_path):
    return json.loads(prof.export_chrome_trace(tmp_path / "trace.json").read_text())


def _names(trace, kind):
    return {(e["pid"], e["tid"]) if kind == "thread_name" else e["pid"]: e["args"]["name"]
            for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == kind}


@pytest.mark.parametrize("which", ["cnn_910b", "cnn_910a"])
def test_chrome_trace_is_valid_and_complete(which, request, tmp_path):
    om, x = request.getfixturevalue(which)
    rep = om.report()
    prof = _profile(om, x, runs=2)
    trace = _trace(prof, tmp_path)
    assert trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and math.isfinite(e["ts"])
    procs = _names(trace, "process_name")
    threads = _names(trace, "thread_name")
    pid_of = {v: k for k, v in procs.items()}
    assert {"CPU", "NPU kernels"} <= set(procs.values())
    cores = {p: n for p, n in procs.items() if n not in ("CPU", "NPU kernels")}
    if which == "cnn_910b":
        assert "AIC 0" in cores.values() and "AIV 0" in cores.values()
    else:
        assert all(n.startswith("AI Core ") for n in cores.values())
    for pid in cores:   # one thread per pipe, named after it
        assert sorted(n for (p, _), n in threads.items() if p == pid) == sorted(
            ["MTE1", "MTE2", "MTE3", "FIXP", "CUBE", "VECTOR", "SCALAR"])
    kernel_events = [e for e in events if e["ph"] == "X" and e["pid"] == pid_of["NPU kernels"]]
    assert len(kernel_events) == 2 * len(rep.kernels)
    cpu_events = [e for e in events if e["ph"] == "X" and e["pid"] == pid_of["CPU"]]
    assert [e["dur"] for e in cpu_events] == [1500.0, 500.0]
    instr = [e for e in events if e["ph"] == "X" and e["pid"] in cores]
    assert len(instr) == 2 * sum(len(r.instructions) for k in rep.kernels for r in k.reports)
    assert trace["otherData"]["pypto_lab"]["truncated"] is False
    # every instruction sits inside its kernel, on a thread named after its pipe
    span = {}
    for e in kernel_events:
        span[(e["name"], e["args"]["run"])] = (e["ts"], e["ts"] + e["dur"])
    for e in instr:
        lo, hi = span[(e["args"]["kernel"], e["args"]["run"])]
        assert lo - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-3
        assert threads[(e["pid"], e["tid"])] == e["cat"]


def test_chrome_trace_caps_instruction_events_and_says_so(cnn_910b, tmp_path):
    om, x = cnn_910b
    prof = _profile(om, x, max_instruction_events=50)
    trace = _trace(prof, tmp_path)
    procs = _names(trace, "process_name")
    cores = {p for p, n in procs.items() if n not in ("CPU", "NPU kernels")}
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] in cores]) == 50
    meta = trace["otherData"]["pypto_lab"]
    assert meta["truncated"] is True and meta["instruction_events"] == 50
    assert "max_instruction_events" in meta["note"]
    with pytest.raises(ProfilerError, match="max_instruction_events=-1"):
        profiler.profile(max_instruction_events=-1)


# ---- kernel_details.csv ----------------------------------------------------------------------

def test_kernel_details_has_ascends_columns_and_one_row_per_kernel(cnn_910b, cnn_910a, tmp_path):
    for om, x in (cnn_910b, cnn_910a):
        rep = om.report()
        prof = _profile(om, x, runs=2)
        with prof.export_kernel_details(tmp_path / f"{rep.chip.name}.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        assert list(rows[0]) == ["Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
                                 "Wait Time(us)", "Block Num", "Input Shapes", "Input Data Types", "Input Formats"]
        assert len(rows) == 2 * len(rep.kernels)
        assert [r["Name"] for r in rows] == [k.name for k in rep.kernels] * 2
        assert [r["Type"] for r in rows] == [k.name.split(":")[0] for k in rep.kernels] * 2
        assert all(float(r["Duration(us)"]) == pytest.approx(k.time_us, abs=1e-3)
                   for r, k in zip(rows, rep.kernels))
        conv = next(r for r in rows if r["Type"] == "Conv2D")
        assert conv["Input Shapes"] == "2,3,32,32;16,3,3,3;16" and conv["Input Formats"].startswith("NC1HWC0;")
        assert conv["Input Data Types"] == "FLOAT16;FLOAT16;FLOAT16" and int(conv["Block Num"]) > 1
        cores = {r["Type"]: r["Accelerator Core"] for r in rows}
        if rep.chip.name == "Ascend910B1":
            assert cores["Conv2D"] == "AI_CORE" and cores["MaxPool"] == "AI_VECTOR_CORE"
        else:
            assert set(cores.values()) == {"AI_CORE"}
        assert all(float(r["Wait Time(us)"]) >= 0 for r in rows)


# ---- files are written whole or not at all ------------------------------------------------------

def test_unwritable_paths_raise_and_leave_nothing(mlp, tmp_path, monkeypatch):
    om, x = mlp
    prof = _profile(om, x)
    with pytest.raises(ProfilerError, match="does not exist; create it first"):
        prof.export_chrome_trace(tmp_path / "missing" / "trace.json")
    assert not (tmp_path / "missing").exists()
    with pytest.raises(ProfilerError, match="is a directory"):
        prof.export_kernel_details(tmp_path)
    with pytest.raises(ProfilerError, match="must be a file path"):
        prof.export_chrome_trace("")

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", fail)
    with pytest.raises(ProfilerError, match="No space left on device.*nothing was written"):
        prof.export_chrome_trace(tmp_path / "trace.json")
    with pytest.raises(ProfilerError, match="nothing was written"):
        prof.export_kernel_details(tmp_path / "kernel_details.csv")
    assert list(tmp_path.iterdir()) == []


# ---- errors -----------------------------------------------------------------------------------

def test_bad_arguments_are_named(mlp):
    om, x = mlp
    with pytest.raises(ProfilerError, match="activity 'CUDA' is not known.*ProfilerActivity.NPU"):
        profiler.profile(activities=["CUDA"])
    with pytest.raises(ProfilerError, match="activity 3 is not known"):
        profiler.profile(activities=[3])
    with pytest.raises(ProfilerError, match="activities=\\[\\] records nothing"):
        profiler.profile(activities=[])
    with pytest.raises(ProfilerError, match="record_shapes='yes' must be True or False"):
        profiler.profile(record_shapes="yes")
    with profiler.profile(activities=ACTS):
        for bad in (-1.0, float("nan"), "12", True):
            with pytest.raises(ProfilerError, match="cpu_time_us=.* must be a finite number"):
                profiler.notify_run(om, (x,), bad)
        with pytest.raises(ProfilerError, match="must be an OptimizedModel.*got Sequential"):
            profiler.notify_run(om.model, (x,), 1.0)


def test_profiles_do_not_nest(mlp):
    om, x = mlp
    with profiler.profile(activities=ACTS) as outer:
        with pytest.raises(ProfilerError, match="profiles do not nest"):
            with profiler.profile(activities=ACTS):
                pass
        profiler.notify_run(om, (x,), 5.0)       # the outer one still records
    assert outer.runs == 1
    profiler.notify_run(om, (x,), 5.0)           # after exit: nothing recorded
    assert outer.runs == 1
    with profiler.profile(activities=ACTS) as again:   # a new profile can start once the first ended
        profiler.notify_run(om, (x,), 5.0)
    assert again.runs == 1


def test_calling_the_optimized_model_records_its_measured_time(mlp):
    om, x = mlp
    if not callable(om):
        pytest.skip("OptimizedModel.__call__ is not there yet")
    with profiler.profile(activities=ACTS, record_shapes=True) as prof:
        om(x)
    cpu = [e for e in prof.events() if e.device == "CPU"]
    assert len(cpu) == 1 and cpu[0].self_cpu_time_us == pytest.approx(om.last_cpu_us)
    assert cpu[0].input_shapes == ((4, 64),)
    assert len([e for e in prof.events() if e.device == "NPU"]) == len(om.report().kernels)
