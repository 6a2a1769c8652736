"""Files are untrusted input: every reader of a file a user hands the workbench — serving traces,
chip and topology presets, model config.json files, OM files, ONNX models, TorchScript files and
tuning caches — answers random bytes, a file cut short, text in another encoding and (for CSV)
ragged rows with one error of its own kind naming the file, or reads a valid file correctly.
A fuzz test per reader (hypothesis), then the cases issue 30 names one by one."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from pypto_lab.tuning import CACHE_VERSION, TuneError, _load_cache

from pypto_lab.capture.torchscript import TorchScriptError
from pypto_lab.capture.torchscript import load as load_torchscript
from pypto_lab.deploy.om import OMError, load_om, save_om
from pypto_lab.deploy.onnx_import import OnnxImportError, import_onnx
from pypto_lab.files.atomic import remove_stale_temps, write_bytes_atomic
from pypto_lab.hw.chip import PRESET_DIR, ChipConfigError, load_chip
from pypto_lab.hw.topology import TOPOLOGY_DIR, TopologyError, load_topology
from pypto_lab.llm import KNOWN_MODELS, LLMConfigError, spec_of
from pypto_lab.llm.serving import ServingConfigError, read_trace

SCRATCH = Path(tempfile.mkdtemp(prefix="pypto_lab_fuzz_"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])


# ---- a valid file of each kind ---------------------------------------------------------------------

def _onnx_bytes() -> bytes:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8], np.ones(128, np.float32))
    g = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["mm"], name="mm"),
                           helper.make_node("Relu", ["mm"], ["output"], name="relu")], "g", [x], [y], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _torchscript_bytes() -> bytes:
    path = SCRATCH / "valid.pt"
    torch.jit.save(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())), str(path))
    return path.read_bytes()


_OM: dict[str, bytes] = {}


def _om_bytes() -> bytes:
    if "om" not in _OM:
        import pypto_lab

        om = pypto_lab.optimize(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval(),
                                (torch.randn(1, 16),), chip="Ascend910B1", level=1, precision="fp16")
        _OM["om"] = save_om(om, SCRATCH / "valid.om").read_bytes()
    return _OM["om"]


def _cache_bytes() -> bytes:
    entry = {"tile": {"m_l0": 128, "m_l1": 128, "k_l0": 64, "k_l1": 256, "n_l0": 128, "n_l1": 128},
             "default_us": 12.5, "tuned_us": 10.0, "candidates": 40, "trials": 8}
    return json.dumps({"version": CACHE_VERSION, "entries": {"Ascend910B1@abc|1|256|256|256|fp16|none|fast": entry}},
                      indent=2).encode()


def _llama_json() -> bytes:
    return json.dumps({k: v for k, v in KNOWN_MODELS["llama-2-7b"].items() if not k.startswith("_")}).encode()


# name: (read(path), its error, a valid file's bytes (a function), suffix, text?)
READERS = {
    "serving trace": (read_trace, ServingConfigError,
                      lambda: b"prompt_tokens,output_tokens,arrival_s\n500,20,0.0\n30,7,1.5\n1200,1,0.5\n", ".csv", True),
    "chip preset": (load_chip, ChipConfigError, lambda: (PRESET_DIR / "Ascend910B1.toml").read_bytes(), ".toml", True),
    "topology preset": (load_topology, TopologyError, lambda: (TOPOLOGY_DIR / "Atlas800T-A2.toml").read_bytes(),
                        ".toml", True),
    "config.json": (spec_of, LLMConfigError, _llama_json, ".json", True),
    "tuning cache": (lambda p: _load_cache(Path(p)), TuneError, _cache_bytes, ".json", True),
    "ONNX": (lambda p: import_onnx(p), OnnxImportError, _onnx_bytes, ".onnx", False),
    "TorchScript": (load_torchscript, TorchScriptError, _torchscript_bytes, ".pt", False),
    "OM": (load_om, OMError, _om_bytes, ".om", False),
}
_VALID: dict[str, bytes] = {}


def valid(name: str) -> bytes:
    if name not in _VALID:
        _VALID[name] = READERS[name][2]()
    return _VALID[name]


def _read(name: str, data: bytes):
    """Read ``data`` as a file of kind ``name``: the result, or the reader's own error (which must
    name the file). Any other exception fails the test."""
    read, error, _, suffix, _ = READERS[name]
    path = SCRATCH / f"fuzz_{name.replace(' ', '_')}{suffix}"
    path.write_bytes(data)
    try:
        return read(path)
    except error as exc:
        msg = str(exc)
        assert path.name in msg, f"{name}: the error does not name the file: {msg}"
        assert "Traceback" not in msg
        return exc


@pytest.mark.parametrize("name", READERS)
def test_a_valid_file_reads(name):
    assert not isinstance(_read(name, valid(name)), Exception)


@pytest.mark.parametrize("name", READERS)
@FUZZ
@given(data=st.binary(min_size=0, max_size=512))
def test_random_bytes_give_one_clear_error(name, data):
    _read(name, data)


@pytest.mark.parametrize("name", READERS)
@FUZZ
@given(fraction=st.floats(0.0, 1.0, exclude_max=True))
def test_a_file_cut_short_gives_one_clear_error_or_reads(name, fraction):
    whole = valid(name)
    _read(name, whole[: int(len(whole) * fraction)])


@pytest.mark.parametrize("name", [n for n, r in READERS.items() if r[4]])
@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "cp1252-with-accent"])
def test_text_in_another_encoding_gives_one_clear_error(name, encoding):
    text = valid(name).decode("utf-8")
    if encoding == "cp1252-with-accent":   # a Windows editor's save of the file with one accented character
        text = text.replace("\n", "\r\n", 1)
        text = {"config.json": text.replace('"llama"', '"llamà"'), "serving trace": text.replace("500,20", "500,20é"),
                "tuning cache": text.replace("fast", "fást")}.get(name, text + "\n# café\n")
        data = text.encode("cp1252", errors="replace")
    else:
        data = text.encode(encoding)
    out = _read(name, data)
    assert isinstance(out, Exception), f"{name} read {encoding} bytes without an error"
    if encoding.startswith("utf-"):
        assert "UTF-8" in str(out) or "not text" in str(out) or "not valid" in str(out)


@FUZZ
@given(rows=st.lists(st.lists(st.sampled_from(["12", "3", "0.5", "", "x", "1e3", " 7 ", "nan", "-1"]),
                              min_size=0, max_size=5), min_size=1, max_size=6))
def test_ragged_trace_rows_give_one_error_with_the_line(rows):
    text = "prompt_tokens,output_tokens,arrival_s\n" + "\n".join(",".join(r) for r in rows) + "\n"
    out = _read("serving trace", text.encode())
    if isinstance(out, Exception):
        assert "line " in str(out) or "no requests" in str(out)
    else:   # read: every row had three whole, positive values
        assert len(out.prompt) >= 1 and (out.prompt >= 1).all() and (out.output >= 1).all()


def test_the_issue_30_trace_cases(tmp_path):
    """Row 6: random bytes raised UnicodeDecodeError; a ragged row said "got '100', None"."""
    path = tmp_path / "trace.csv"
    path.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(ServingConfigError, match=r"trace.csv: not UTF-8 text \(byte 0x80 at offset 0\).*Fix"):
        read_trace(path)
    path.write_text("prompt_tokens,output_tokens,arrival_s\n100,20,0.0\n100\n")
    with pytest.raises(ServingConfigError, match=r"trace.csv, line 3: has 1 field \('100'\), the header 3 "
                                                 r"\(prompt_tokens,output_tokens,arrival_s\)"):
        read_trace(path)
    path.write_text("\ufeffprompt_tokens,output_tokens\n100,20\n")   # Excel's UTF-8 with a BOM reads
    assert read_trace(path).prompt.tolist() == [100]


def test_a_damaged_tuning_cache_entry_is_refused_not_applied(tmp_path):
    path = tmp_path / "tuning.json"
    good = json.loads(_cache_bytes())
    (key, entry), = good["entries"].items()
    for bad, what in (({**entry, "tile": {"m_l0": "x"}}, "tile"), ({**entry, "default_us": -1}, "default_us"),
                      ({k: v for k, v in entry.items() if k != "tuned_us"}, "tuned_us"),
                      ({**entry, "tile": {**entry["tile"], "m_l0": 100}}, "tile")):
        path.write_text(json.dumps({"version": CACHE_VERSION, "entries": {key: bad}}))
        with pytest.raises(TuneError, match=rf"{path.name} has a damaged entry {re.escape(repr(key))} \({what}"):
            _load_cache(path)


# ---- interrupted writes ---------------------------------------------------------------------------

_HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pypto_lab.files import atomic as fileio
    target = Path(sys.argv[1])
    fd, tmp = fileio._create_beside(target)       # a write under way: its temporary file, locked
    import os
    os.write(fd, b"x" * 1_000_000)
    print(tmp, flush=True)
    time.sleep(60)
""")


def _writer_midway(target: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(target)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    tmp = Path(proc.stdout.readline().strip())
    assert tmp.exists() and tmp.parent == target.parent
    return proc, tmp


def test_a_killed_writes_temporary_file_is_removed_by_the_next_write(tmp_path):
    """Row 13: a large atomic write killed midway left a hidden 216 MB .tmp file for good."""
    target = tmp_path / "model.om"
    target.write_bytes(b"old")
    proc, tmp = _writer_midway(target)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert tmp.exists() and target.read_bytes() == b"old"   # the target intact, the temp left behind
    write_bytes_atomic(target, b"new")
    assert not tmp.exists() and target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.om"]


def test_a_live_writes_temporary_file_is_left_alone(tmp_path):
    target = tmp_path / "r.json"
    proc, tmp = _writer_midway(target)
    try:
        write_bytes_atomic(target, b"{}")
        assert tmp.exists(), "another process's write under way was removed"
        assert remove_stale_temps(target) == []
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.05)
    assert remove_stale_temps(target) == [tmp] and not tmp.exists()


def test_only_this_targets_temporary_files_are_touched(tmp_path):
    for name in (".other.json.0123abcd.tmp", ".r.json.notahex!.tmp", "r.json.0123abcd.tmp", ".r.jsonx.0123abcd.tmp"):
        (tmp_path / name).write_text("keep")
    write_bytes_atomic(tmp_path / "r.json", b"{}")
    assert len(list(tmp_path.iterdir())) == 5


# ---- ATC and OM -----------------------------------------------------------------------------------

def _custom_domain_onnx(path: Path) -> Path:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 16])
    mid = helper.make_tensor_value_info("mid", TensorProto.FLOAT, [1, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], np.eye(16, dtype=np.float32).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["mid"], name="mm"),
                           helper.make_node("FancyAct", ["mid"], ["output"], name="fancy", domain="com.example")],
                          "g", [x], [y], initializer=[w], value_info=[mid])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_an_onnx_op_nothing_can_run_is_named_at_atc_time(tmp_path, capsys):
    """Row 9: "ATC run success" with a CPU fallback, then a raw NotImplementedError when run."""
    from pypto_lab.cli import main

    model = _custom_domain_onnx(tmp_path / "custom.onnx")
    out = tmp_path / "custom"
    assert main(["atc", f"--model={model}", "--framework=5", f"--output={out}", "--soc_version=Ascend910B1"]) == 2
    err = capsys.readouterr().err
    assert "ONNX operator com.example::FancyAct (node fancy) cannot run" in err and "Fix: export the model" in err
    assert not (tmp_path / "custom.om").exists()


def test_an_om_given_another_shape_says_to_run_atc_again(tmp_path):
    """Row 10: the fix said to call optimize, not to re-run atc with --input_shape."""
    from pypto_lab.deploy.atc import run_atc
    from pypto_lab.runtime.interpreter import RuntimeInputError

    model = tmp_path / "mlp.onnx"
    model.write_bytes(_onnx_bytes())
    om = run_atc(str(model), 5, str(tmp_path / "mlp"), "Ascend910B1").om
    assert tuple(om(torch.randn(1, 16)).shape) == (1, 8)
    with pytest.raises(RuntimeInputError, match=r"expected shape \(1, 16\).*got shape \(4, 16\).*mlp.om was compiled "
                                                r"for the input shapes input \(1, 16\).*Fix: .*pypto-lab atc "
                                                rf"--model={re.escape(str(model))} --framework=5 .*--soc_version="
                                                r"Ascend910B1 --input_shape=\"input:4,16\"") as e:
        om(torch.randn(4, 16))
    assert "pypto_lab.optimize" not in str(e.value)
