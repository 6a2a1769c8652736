"""pypto_lab.files.atomic: output files are written whole, with the permissions open(path, "w") gives."""

import os
import stat

import pytest

from pypto_lab.files.atomic import write_json_atomic, write_text_atomic


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it after."""
    saved = os.umask(0o022)
    yield os.umask
    os.umask(saved)


@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)],
                         ids=["umask 022", "umask 077", "umask 002"])
def test_new_files_get_0666_minus_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    path = write_text_atomic(tmp_path / "out" / "report.txt", "hello\n")
    assert _mode(path) == expected
    with open(tmp_path / "plain.txt", "w") as fh:  # what a plain open gives, for comparison
        fh.write("x")
    assert _mode(tmp_path / "plain.txt") == expected
    json_path = write_json_atomic(tmp_path / "r.json", {"a": 1})
    assert _mode(json_path) == expected


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "r.json"
    path.write_text("{}")
    os.chmod(path, 0o640)
    write_json_atomic(path, {"a": 1})
    assert _mode(path) == 0o640 and path.read_text() == '{\n  "a": 1\n}\n'


def test_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old\n")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"not json": object()})
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temporary file left behind


def test_through_a_symbolic_link_the_target_is_written(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_text_atomic(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
