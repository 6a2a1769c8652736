"""scripts/survey_pypto_examples.py: a checkout's examples classified pass / ran / fail / timeout,
with comparisons, max |diff| and the failure's reason, written whole (JSON and markdown).

The examples are tiny scripts written in tmp_path (no network, no real checkout needed)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "survey_pypto_examples.py"

pytest.importorskip("pypto_lab.pto")

PASSING = '''
    import torch
    import pypto

    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
    def double(x: pypto.Tensor([pypto.DYNAMIC, 32], pypto.DT_FP32)) -> pypto.Tensor([pypto.DYNAMIC, 32], pypto.DT_FP32):
        pypto.set_vec_tile_shapes(8, 32)
        return x * 2.0

    x = torch.randn(16, 32)
    torch.testing.assert_close(double(x), x * 2)
'''

FAILING = '''
    import torch
    import pypto

    pypto.set_pass_options(no_such_option=True)
'''

WRONG = '''
    import torch
    import pypto

    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
    def plus_one(x: pypto.Tensor([], pypto.DT_FP32)) -> pypto.Tensor([], pypto.DT_FP32):
        pypto.set_vec_tile_shapes(8, 32)
        return x + 1.0

    x = torch.zeros(8, 32)
    torch.testing.assert_close(plus_one(x), x + 2)
'''


def _load():
    spec = importlib.util.spec_from_file_location("survey_pypto_examples", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def checkout(tmp_path):
    ex = tmp_path / "repo" / "examples"
    for rel, text in {"a_pass/ok.py": PASSING, "b_fail/bad_option.py": FAILING, "c_wrong/wrong.py": WRONG,
                      "d_quiet/quiet.py": "print('hello')\n"}.items():
        p = ex / rel
        p.parent.mkdir(parents=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path / "repo"


def test_survey_classifies_pass_fail_and_wrong_numbers(checkout, tmp_path):
    out_json, out_md = tmp_path / "s.json", tmp_path / "s.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(checkout), "--json", str(out_json), "--markdown",
                           str(out_md), "--timeout", "240", "--jobs", "2"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out_json.read_text())
    rows = {r["file"]: r for r in res["rows"]}
    assert list(rows) == ["examples/a_pass/ok.py", "examples/b_fail/bad_option.py", "examples/c_wrong/wrong.py",
                          "examples/d_quiet/quiet.py"]
    ok = rows["examples/a_pass/ok.py"]
    assert (ok["status"], ok["passed"], ok["total"], ok["max_abs_diff"]) == ("pass", 1, 1, 0.0)
    bad = rows["examples/b_fail/bad_option.py"]
    assert bad["status"] == "fail" and bad["total"] == 0
    assert bad["reason"].startswith("OptionError") and "no_such_option" in bad["reason"]
    wrong = rows["examples/c_wrong/wrong.py"]
    assert (wrong["status"], wrong["passed"], wrong["total"]) == ("fail", 0, 1)
    assert wrong["max_abs_diff"] == pytest.approx(1.0)
    assert rows["examples/d_quiet/quiet.py"]["status"] == "ran"
    assert res["counts"] == {"pass": 1, "ran": 1, "fail": 2, "timeout": 0}
    assert res["commit"] is None  # not a git checkout
    md = out_md.read_text()
    assert "1 pass, 1 run without a comparison, 2 fail" in md
    assert "| `examples/a_pass/ok.py` | pass | 1/1 | 0 |" in md


def test_parse_output_reads_the_runner_report():
    mod = _load()
    text = ("[run_pypto_example] 3 comparisons with torch: 2 passed, 1 FAILED\n"
            "    line    10  torch.testing.assert_close       max|diff|=0.5  default tol  ok\n"
            "    line    12  torch.allclose                   max|diff|=nan  default tol  ok\n"
            "    line    14  torch.allclose                   max|diff|=2.5  default tol  FAILED x\n")
    row = mod.parse_output(text, 1)
    assert row == {"status": "fail", "passed": 2, "total": 3, "max_abs_diff": 2.5,
                   "reason": "1 of 3 comparisons failed"}
    assert mod.parse_output("", None)["status"] == "timeout"
    bare = ('  File "/x/ex.py", line 7, in main\n    assert output_path\nAssertionError\n'
            "[run_pypto_example] FAILED: AssertionError: \n")
    assert mod.parse_output(bare, 1)["reason"] == "AssertionError at ex.py:7: assert output_path"


def test_survey_refuses_a_folder_without_examples(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no examples/ folder" in proc.stderr
