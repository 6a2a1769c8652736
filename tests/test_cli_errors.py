"""Bad command-line input ends with one line on stderr, "pypto-lab: error: ..." naming the value, the
rule and a fix, and exit code 2: no traceback, no silently changed value."""

import re
import sys
import textwrap

import pytest

from pypto_lab.cli import main

BUILDERS = textwrap.dedent('''
    import torch

    CALLS = []

    def with_batch(batch=1):
        CALLS.append(batch)
        return torch.nn.Linear(8, 8), (torch.randn(batch, 8),)

    def without_arguments():
        return torch.nn.Linear(8, 8), (torch.randn(3, 8),)

    def with_seq(batch=1, seq=16):
        return torch.nn.Linear(seq, 8), (torch.randn(batch, seq),)

    def broken(batch=1, seq=None):
        CALLS.append("broken")
        raise TypeError("a bug inside the builder")
''')


@pytest.fixture
def builders(tmp_path, monkeypatch):
    """A builder module in the current folder, which is not on sys.path (as under the console script)."""
    (tmp_path / "cli_test_builders.py").write_text(BUILDERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cli_test_builders", raising=False)
    yield "cli_test_builders"
    sys.modules.pop("cli_test_builders", None)


def _error(capsys, argv) -> str:
    """Run the command, check it fails the way bad input must, return its error line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pypto-lab: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("flag,value", [("--batch", "0"), ("--batch", "-2"), ("--seq", "0"), ("--seq", "-1")])
@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_batch_or_seq_below_one_is_refused(capsys, command, flag, value):
    line = _error(capsys, [command, "bert-base", flag, value])
    assert f"{flag} {value}: must be a positive integer" in line and f"e.g. {flag} " in line


def test_a_seq_the_model_cannot_take_is_refused(capsys):
    line = _error(capsys, ["report", "resnet50", "--seq", "64"])
    assert "resnet50 takes no sequence length (seq = 64 given)" in line and "leave seq out" in line


def test_a_builder_gets_the_batch_asked_for(capsys, builders):
    assert main(["report", f"{builders}:with_batch", "--batch", "8", "--chip", "Ascend910B1"]) == 0
    assert "batch 8" in capsys.readouterr().out
    assert sys.modules[builders].CALLS == [8]
    assert main(["compare", f"{builders}:with_seq", "--batch", "4", "--seq", "32", "--chip", "Ascend910B1"]) == 0
    assert "batch 4" in capsys.readouterr().out


def test_a_builder_is_found_in_the_current_folder(capsys, builders):
    assert main(["report", f"{builders}:without_arguments", "--chip", "Ascend910B1"]) == 0
    assert "Linear on Ascend910B1" in capsys.readouterr().out


def test_a_batch_or_seq_the_builder_cannot_take_is_refused(capsys, builders):
    line = _error(capsys, ["report", f"{builders}:with_batch", "--batch", "8", "--seq", "4"])
    assert f"{builders}:with_batch takes no 'seq' parameter (its signature is with_batch(batch=1))" in line
    assert "leave --seq out" in line
    line = _error(capsys, ["report", f"{builders}:without_arguments", "--batch", "8"])
    assert "takes no 'batch' parameter" in line and "add a batch parameter to it, or leave --batch out" in line
    assert sys.modules[builders].CALLS == []  # refused before the builder ran


def test_a_type_error_inside_a_builder_is_not_retried_without_arguments(builders):
    with pytest.raises(TypeError, match="a bug inside the builder"):
        main(["report", f"{builders}:broken", "--batch", "8"])
    assert sys.modules[builders].CALLS == ["broken"]  # called once, with its arguments


@pytest.mark.parametrize("argv", [
    ["matmul", "64", "64", "64", "--chip", "{dir}"],
    ["vector", "softmax", "1024", "--chip", "{dir}"],
    ["calibrate", "--chip", "{dir}"],
    ["report", "resnet50", "--chip", "{dir}"],
    ["compare", "resnet50", "--chip", "{dir}"],
    ["tour", "--no-html", "--chips", "{dir}"],
], ids=["matmul", "vector", "calibrate", "report", "compare", "tour"])
def test_a_folder_as_chip_is_refused(capsys, tmp_path, argv):
    line = _error(capsys, [a.replace("{dir}", str(tmp_path)) for a in argv])
    assert f"{tmp_path}: is a folder" in line and "a chip is a preset name (Ascend310P3" in line
    assert ".toml preset file" in line


@pytest.mark.parametrize("argv,flag", [
    (["matmul", "64", "64", "64", "--json", "{out}"], "--json"),
    (["vector", "softmax", "1024", "--json", "{out}"], "--json"),
    (["calibrate", "--chip", "Ascend910B1", "--json", "{out}"], "--json"),
    (["report", "resnet50", "--json", "{out}"], "--json"),
    (["tour", "--chips", "Ascend910A", "--html", "{out}"], "--html"),
    (["llm", "gpt2", "--json", "{out}"], "--json"),
    (["serve", "gpt2", "--quiet", "--json", "{out}"], "--json"),
    (["validate", "--quiet", "--json", "{out}"], "--json"),
], ids=["matmul", "vector", "calibrate", "report", "tour", "llm", "serve", "validate"])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(capsys, tmp_path, argv, flag):
    line = _error(capsys, [a.replace("{out}", str(tmp_path)) for a in argv])
    assert f"{flag} {tmp_path}: is a folder, not a file" in line and f"e.g. {flag} out/" in line
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = blocker / "r.json"
    line = _error(capsys, [a.replace("{out}", str(out)) for a in argv])
    assert f"{flag} {out}: {blocker} is a file, so no folder can be made there" in line


def test_an_output_folder_without_write_permission_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("pypto_lab.cli.commands.os.access", lambda path, mode: False)  # as a user without the right
    line = _error(capsys, ["matmul", "64", "64", "64", "--json", str(tmp_path / "mm.json")])
    assert f"--json {tmp_path / 'mm.json'}: permission denied (cannot write into {tmp_path})" in line


def test_an_os_error_while_writing_is_one_line(capsys, tmp_path, monkeypatch):
    def refuse(path, obj):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr("pypto_lab.cli.commands.write_json_atomic", refuse)
    line = _error(capsys, ["matmul", "64", "64", "64", "--json", str(tmp_path / "mm.json")])
    assert "--json" in line and "cannot write it (Permission denied)" in line


@pytest.mark.parametrize("value", ["0", "-4"])
def test_vector_row_len_below_one_is_refused(capsys, value):
    line = _error(capsys, ["vector", "softmax", "1024", "--row-len", value])
    assert f"--row-len {value}: must be a positive integer" in line


def test_negative_sizes_and_top_are_refused(capsys):
    assert "matmul m = -64" in _error(capsys, ["matmul", "-64", "64", "64"])
    assert "numel = -5" in _error(capsys, ["vector", "softmax", "-5"])
    assert "--top -1: must be 0 or more" in _error(capsys, ["report", "resnet50", "--top", "-1"])


@pytest.mark.parametrize("argv", [["llm", "gpt2"], ["serve", "gpt2", "--quiet"], ["validate", "--quiet"]],
                         ids=["llm", "serve", "validate"])
def test_llm_serve_and_validate_check_their_output_before_any_work(capsys, tmp_path, monkeypatch, argv):
    """Issue 30: `validate --json` into a folder that cannot be written ran 3.5 minutes, then failed."""
    import pypto_lab.cli.llm as cli_llm

    def never(*args, **kwargs):
        raise AssertionError("the work started before the output path was checked")
    for name in ("validate_sets", "serve", "simulate_generation"):
        monkeypatch.setattr(cli_llm, name, never)
    monkeypatch.setattr("pypto_lab.files.atomic.os.access", lambda path, mode: False)   # a folder this user cannot write
    line = _error(capsys, [*argv, "--json", str(tmp_path / "r.json")])
    assert f"--json {tmp_path / 'r.json'}: permission denied (cannot write into {tmp_path})" in line


def test_an_output_the_permission_bits_allow_but_the_system_refuses_is_refused(capsys, tmp_path, monkeypatch):
    """A read-only mount, /proc, a full quota: the path is tried, not only its permission bits."""
    import pypto_lab.files.atomic as fileio

    def refuse(path):
        raise PermissionError(30, "Read-only file system", str(path))
    monkeypatch.setattr(fileio, "_create_beside", refuse)
    line = _error(capsys, ["llm", "gpt2", "--json", str(tmp_path / "r.json")])
    assert f"cannot write into {tmp_path} (Read-only file system)" in line and "e.g. --json out/llm.json" in line


@pytest.mark.parametrize("argv, expected", [
    (["llm", "gpt2", "--batch", "0"], "--batch 0: sequences in the batch must be an integer >= 1; e.g. --batch 1"),
    (["llm", "gpt2", "--prompt", "-5"], "--prompt -5: prompt tokens per sequence must be an integer >= 1; e.g. --prompt 128"),
    (["llm", "gpt2", "--launch-us", "-1"], "--launch-us -1: a per-kernel launch cost in us must be a finite number >= 0; "
                                           "e.g. --launch-us 0"),
    (["serve", "gpt2", "--rate", "0", "--quiet"], "--rate 0: requests per second must be a number > 0; e.g. --rate 10 "
                                                  "or --rate inf (every request at t=0)"),
    (["serve", "gpt2", "--block-size", "0", "--quiet"], "--block-size 0: tokens per KV block must be an integer >= 1; "
                                                        "e.g. --block-size 128"),
    (["serve", "gpt2", "--requests", "0", "--quiet"], "--requests 0: requests to serve must be an integer >= 1; "
                                                      "e.g. --requests 1000"),
    (["validate", "--level", "7"], "level 7: the optimisation levels are 0, 1, 2, 3. Fix: --level 3"),
], ids=["batch", "prompt", "launch-us", "rate", "block-size", "requests", "level"])
def test_llm_fixes_are_written_as_flags(capsys, argv, expected):
    line = _error(capsys, argv)
    assert expected in line
    assert not re.search(r"\b(batch|prompt_len|launch_us|rate|block_size|requests|level)=|float\(", line), line  # no Python
