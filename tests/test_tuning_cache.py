"""auto_tune's JSON cache never destroys a file that is not its own: it refuses it, naming the file,
what it found and the fix."""

import json

import pytest
import torch

import pypto_lab
from pypto_lab.tools.tuning import CACHE_VERSION, TuneCacheWarning, TuneError, auto_tune

FAST = {"level": "fast", "progress": False}


def _optimized():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU()).eval()
    return pypto_lab.optimize(model, torch.randn(256, 256), chip="Ascend910B1", level=1)


@pytest.mark.parametrize("content,found", [
    (json.dumps({"version": CACHE_VERSION + 1, "entries": {}}).encode(), f"has version {CACHE_VERSION + 1}"),
    (json.dumps({"version": 0, "entries": {"k": {"tile": None}}}).encode(), "has version 0"),
    (b'["my", "own", "list"]\n', "holds a JSON list"),
    (b'{"name": "my settings"}\n', 'without a "version" key (keys: name)'),
    (b"{not json", "is not readable JSON"),
    (b"\xff\xfe\x00binary", "is not text"),
    (json.dumps({"version": CACHE_VERSION, "entries": [1, 2]}).encode(), '"entries" that are not an object'),
], ids=["newer version", "older version", "a list", "no version", "not JSON", "binary", "bad entries"])
def test_a_file_that_is_not_this_cache_is_refused_and_left_unchanged(tmp_path, content, found):
    path = tmp_path / "tuning.json"
    path.write_bytes(content)
    with pytest.raises(TuneError) as err:
        auto_tune(_optimized(), FAST, cache_path=path)
    msg = str(err.value)
    assert str(path) in msg and found in msg                                   # the file and what it holds
    assert "delete it" in msg and "cache_path=" in msg and "PYPTO_LAB_TUNING_CACHE" in msg  # the fixes
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.json"]


def test_the_default_cache_file_is_refused_too(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    path.write_text("[]")
    monkeypatch.setenv("PYPTO_LAB_TUNING_CACHE", str(path))
    with pytest.raises(TuneError, match="holds a JSON list"):
        auto_tune(_optimized(), FAST)
    assert path.read_text() == "[]"


def test_a_folder_as_cache_is_refused(tmp_path):
    with pytest.raises(TuneError, match=f"tuning cache {tmp_path} is a folder"):
        auto_tune(_optimized(), FAST, cache_path=tmp_path)


def test_its_own_cache_is_reused_and_rewritten(tmp_path):
    path = tmp_path / "tuning.json"
    first = auto_tune(_optimized(), FAST, cache_path=path)
    assert first.simulations > 0 and json.loads(path.read_text())["version"] == CACHE_VERSION
    second = auto_tune(_optimized(), FAST, cache_path=path)
    assert second.simulations == 0 and all(r.cached for r in second.rows)


def test_a_cache_that_cannot_be_written_warns_and_keeps_the_tuning(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache's folder would be\n")
    om = _optimized()
    with pytest.warns(TuneCacheWarning, match="could not write its cache .*not_a_folder.*cache_path="):
        result = auto_tune(om, FAST, cache_path=blocker / "tuning.json")
    assert result.simulations > 0 and om.report() is result.report
    assert blocker.read_text() == "a file where the cache's folder would be\n"
