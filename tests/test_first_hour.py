"""A student's first hour (issue 30): the tour ends by pointing to the course; no exercise's answer
is printed before the exercise; `make lab` opens trusted notebooks; every widget a notebook
stores keeps a static picture, and a stored progress bar shows how it ended. (How long
`00_quickstart` takes after `make demo` is measured by benchmarks/bench_quickstart.py, not here.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ipywidgets as W
import nbformat
import pytest
from matplotlib.figure import Figure

from pypto_lab.cli import main
from pypto_lab.hw.tiling import CubeTile

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
sys.path.insert(0, str(ROOT / "notebooks" / "_build"))
from _exercises import EXERCISES  # noqa: E402


def _tiling_answers() -> dict[str, list[str]]:
    """Each Cube-tiling exercise's reference answer, in every form a print would show it."""
    out = {}
    for ex in EXERCISES:
        if "def answer():" not in ex.solution:
            continue
        ns: dict = {}
        exec(compile(ex.solution, ex.slug, "exec"), ns)
        answer = ns.get("answer")
        if answer is None:
            continue
        value = answer()
        if not (isinstance(value, tuple) and len(value) == 3):
            continue
        tile = CubeTile.from_pypto(*value)
        d = tile.to_dict()
        out[ex.slug] = [str(tile), repr(d), str(value)[1:-1]]
    return out


ANSWERS = _tiling_answers()


@pytest.fixture(scope="module")
def tour_text():
    from contextlib import redirect_stdout
    from io import StringIO

    buf = StringIO()
    with redirect_stdout(buf):
        assert main(["tour", "--no-html", "--chips", "Ascend910B1"]) == 0
    return buf.getvalue()


def test_the_tour_ends_by_pointing_to_make_lab_and_the_first_notebook(tour_text):
    last = tour_text.strip().splitlines()[-3:]
    assert any("make lab" in line for line in last) and any("00_quickstart.ipynb" in line for line in last)


def test_there_are_tiling_answers_to_look_for():
    assert {"01_fit_the_tiles", "02_beat_the_default"} <= set(ANSWERS)


def test_no_exercise_answer_is_printed_by_the_tour(tour_text):
    for slug, forms in ANSWERS.items():
        assert not any(f in tour_text for f in forms), f"the tour prints exercise {slug}'s answer"


def test_no_exercise_answer_is_printed_by_the_quickstart():
    nb = nbformat.read(ROOT / "notebooks" / "00_quickstart.ipynb", as_version=4)
    for cell in nb.cells:
        shown = cell.source + json.dumps(cell.get("outputs", []))
        for slug, forms in ANSWERS.items():
            assert not any(f in shown for f in forms), f"00_quickstart shows exercise {slug}'s answer"


def test_make_lab_signs_the_notebooks_as_trusted(tmp_path):
    from nbformat.sign import NotebookNotary

    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lab: .*\btrust\b", makefile, re.M)
    venv = Path(sys.executable).parent.parent
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path)}   # this test's own signature database
    subprocess.run(["make", "-s", "-C", str(ROOT), "trust", f"VENV={venv}"], env=env, check=True,
                   capture_output=True)
    notary = NotebookNotary(data_dir=str(tmp_path))
    for path in [*NOTEBOOKS, *(ROOT / "notebooks" / "exercises").rglob("*.ipynb")]:
        assert notary.check_signature(nbformat.read(path, as_version=4)), f"{path.name} is not trusted"


def _widget_outputs():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if "application/vnd.jupyter.widget-view+json" in data:
                    yield path.name, i, data


def test_every_stored_widget_keeps_a_static_picture_or_a_finished_bar():
    """Where no widget runs (GitHub, nbviewer, before running), each widget shows a picture; a
    progress bar shows its last state (`pypto_lab.files.progress`), not "0/12"."""
    seen = 0
    for name, i, data in _widget_outputs():
        seen += 1
        text = data.get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        bar = re.search(r"(\d+)/(\d+) \[", text)
        if bar:
            assert bar.group(1) == bar.group(2), f"{name} cell {i}: the stored bar reads {text!r}"
        else:
            assert "image/png" in data, f"{name} cell {i}: a widget without a picture ({text[:60]!r})"
            assert "<function" not in text
    assert seen >= 6


def test_a_figure_interact_redraws_and_keeps_its_picture():
    from IPython.core.formatters import DisplayFormatter

    from pypto_lab.viz.widgets import figure_interact

    def draw(n):
        fig = Figure(figsize=(3, 2))
        fig.add_subplot().plot(range(n))
        return fig

    w = figure_interact(draw, title="a line", n=W.IntSlider(value=3, min=2, max=9, description="n"))
    first = w.image.value
    w.controls["n"].value = 8
    assert w.image.value != first and w.image.value[:4] == b"\x89PNG"
    data, _ = DisplayFormatter().format(w)
    assert "application/vnd.jupyter.widget-view+json" in data and "image/png" in data
    assert data["text/plain"] == "a line: n = 8"


def test_a_stored_progress_bar_shows_how_it_ended(tmp_path):
    """In a notebook, a bar from `pypto_lab.files.progress` is stored at its last state; a bar still
    within its ``delay`` when the work ends is not shown at all."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell("from pypto_lab.files.progress import progress\nfor _ in progress(range(12), desc='points'): pass"),
        new_code_cell("for _ in progress(range(5), desc='quick', delay=30): pass")])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    texts = ["".join(o.get("data", {}).get("text/plain", "")) for o in nb.cells[0].outputs]
    assert any("12/12" in t for t in texts) and not any("0/12" in t for t in texts), texts
    assert not nb.cells[1].outputs


def test_a_long_numba_compilation_says_so_once(capsys):
    """Without `make demo`, the first simulation compiles numba kernels for up to a minute: the
    listener of numba's compile events prints what is happening instead of a silent wait."""
    import io
    import time

    import pypto_lab.hw  # noqa: F401  (installs the listener)
    from pypto_lab.hw import compile_notice

    assert compile_notice._INSTALLED is not None
    out = io.StringIO()
    notice = compile_notice.CompileNotice(delay=0.05, stream=out)
    notice.on_start(None)          # a quick compilation: nothing said
    notice.on_end(None)
    time.sleep(0.1)
    assert out.getvalue() == ""
    notice.on_start(None)          # a long one, with a nested compilation inside
    notice.on_start(None)
    time.sleep(0.2)
    notice.on_end(None)
    notice.on_end(None)
    notice.on_start(None)          # and another: said once only
    time.sleep(0.2)
    notice.on_end(None)
    assert out.getvalue().count("compiling the simulator's numba kernels") == 1
