"""A SIM-mode run writes the cost model's swimlane where the real framework does:
<base>/output_<timestamp>_<pid>_<host>/CostModelSimulationOutput/merged_swimlane.json."""

import json
import os

import torch

import pypto_lab.pto as pypto
from pypto_lab.pto import sim_output


def _kernel():
    @pypto.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
    def add(x: pypto.Tensor[...], y: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(16, 256)
        out[:] = x + y
    return add


def test_a_sim_run_writes_merged_swimlane_under_cwd_output(tmp_path, monkeypatch):
    monkeypatch.delenv("TILE_FWK_OUTPUT_DIR", raising=False)
    monkeypatch.delenv("ASCEND_WORK_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    k = _kernel()
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    k(x, y, torch.empty_like(x))
    # found the way the real example looks for it: a folder under ./output naming this process
    tops = [d for d in (tmp_path / "output").iterdir() if d.is_dir() and str(os.getpid()) in d.name]
    assert len(tops) == 1 and tops[0].name.startswith("output_")
    path = tops[0] / "CostModelSimulationOutput" / "merged_swimlane.json"
    assert os.path.samefile(k.last_run.swimlane_path, path)
    trace = json.loads(path.read_text())
    assert trace == json.loads(json.dumps(k.last_run.chrome_trace()))
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    # a second run in the same process writes into the same folder: the file holds the last run
    k(torch.randn(32, 256), torch.randn(32, 256), torch.empty(32, 256))
    assert [d for d in (tmp_path / "output").iterdir()] == tops
    assert json.loads(path.read_text()) == json.loads(json.dumps(k.last_run.chrome_trace()))
    assert not list(tops[0].rglob("*.tmp*"))


def test_tile_fwk_output_dir_moves_the_output_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_FWK_OUTPUT_DIR", str(tmp_path / "elsewhere"))
    k = _kernel()
    k(torch.randn(16, 256), torch.randn(16, 256), torch.empty(16, 256))
    path = k.last_run.swimlane_path
    assert path.startswith(str((tmp_path / "elsewhere").resolve())) and path.endswith(
        os.path.join(*sim_output.SWIMLANE))
    assert "traceEvents" in json.loads(open(path).read())


def test_the_file_always_holds_the_last_run_even_when_a_cached_call_skips_the_write(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_FWK_OUTPUT_DIR", str(tmp_path))
    k = _kernel()
    small = (torch.randn(32, 256), torch.randn(32, 256), torch.empty(32, 256))
    big = (torch.randn(64, 256), torch.randn(64, 256), torch.empty(64, 256))
    for args in (small, big, small, small):
        k(*args)
        path = k.last_run.swimlane_path
        assert json.loads(open(path).read()) == json.loads(json.dumps(k.last_run.chrome_trace()))
    mtime = os.stat(path).st_mtime_ns
    k(*small)                                  # the same run again: the file is already its trace
    assert os.stat(path).st_mtime_ns == mtime


def test_a_long_run_writes_the_start_of_its_swimlane_and_says_where_it_stops(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_FWK_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setattr(sim_output, "MAX_EVENTS", 50)
    k = _kernel()
    k(torch.randn(1024, 256), torch.randn(1024, 256), torch.empty(1024, 256))
    full = k.last_run.chrome_trace()
    written = json.loads(open(k.last_run.swimlane_path).read())
    cut = written["otherData"]["truncated"]
    n_full = sum(e["ph"] == "X" for e in full["traceEvents"])
    kept = [e for e in written["traceEvents"] if e["ph"] == "X"]
    assert cut["instructions"] == len(k.last_run.timeline) and 0 < cut["kept"] <= 50 < n_full
    assert all(e["args"]["start_cycle"] < cut["complete_up_to_cycle"] for e in kept)
    # complete up to that cycle: every instruction that starts before it is there
    assert len(kept) == sum(e["ph"] == "X" and e["args"]["start_cycle"] < cut["complete_up_to_cycle"]
                            for e in full["traceEvents"])
    assert "truncated" not in full["otherData"]
