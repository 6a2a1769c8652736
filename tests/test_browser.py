"""The tiling explorer in a real browser, driven by Playwright with Debian's chromium (installed by
`make test`, never downloaded by Playwright):

* Voilà serves tests/browser/tiling_explorer.ipynb on localhost; the test moves sliders with the
  keyboard and checks that every step is a well-formed tiling, that cycles and occupancy change,
  and that an overflow lists every buffer with its fix;
* JupyterLab opens notebooks/00_quickstart.ipynb (the page Binder opens) from a temporary folder,
  runs all its cells from the Run menu, moves the widget's m_l0 slider and checks the cycles change.

Each test compares what the page shows with the same explorer driven headless in this process.
Screenshots are kept in out/test-artifacts/. Both servers listen on a free localhost port, with a
private Jupyter config, and are shut down at the end.

Outside CI the tests are skipped when chromium, playwright, voila or jupyterlab are missing; with
CI=true they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "tests/browser/tiling_explorer.ipynb"
QUICKSTART = ROOT / "notebooks/00_quickstart.ipynb"
ARTIFACTS = ROOT / "out/test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Playwright must use the system chromium: never look for (or fetch) a browser of its own.
os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


def _unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} -- the browser test must run in CI (CI=true); `make test` installs it "
                    "(chromium via apt-get as root, playwright, voila and jupyterlab via the dev extra)", pytrace=False)
    pytest.skip(f"{reason}; skipped because CI is not set (with CI=true this test fails instead)")


def _chromium() -> str:
    exe = os.environ.get("PYPTO_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(exe, os.X_OK):
        _unavailable("chromium is not installed (as root: apt-get install -y chromium; "
                     "or point PYPTO_CHROMIUM at a chromium binary)")
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the server did not listen on port {port} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _server_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    env.setdefault("NUMBA_NUM_THREADS", "2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    # a private Jupyter config/runtime dir: the user's settings do not leak into the test, nor ours into theirs
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "jupyter_config")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "jupyter_runtime")
    return env


def _run_all_cells(page, attempts: int = 3) -> None:
    """Run > Run All Cells, again if no cell has started after a minute: on a busy machine the page can
    report the kernel idle before its connection is ready, and JupyterLab then drops the request."""
    started = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"
    for attempt in range(attempts):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click()
        try:
            page.wait_for_function(started, timeout=60_000)
            return
        except Exception:
            if attempt == attempts - 1:
                raise


@pytest.fixture(scope="module", autouse=True)
def _warm_numba_cache():
    """Compile the simulator's numba kernels into the cache the servers' kernels read, before any page
    opens: on a fresh clone the first compile takes minutes on 2 busy cores, and these tests are about
    the page, not the compiler (`binder/postBuild` warms the cache the same way)."""
    env = _server_env(ROOT / "out")
    code = ("from pypto_lab.viz.widgets import tiling_explorer; import pypto_lab; "
            "tiling_explorer(1024, 1024, 1024); pypto_lab.simulate_vector('add', 4096)")
    subprocess.run([sys.executable, "-c", code], env={**env, "MPLBACKEND": "Agg"}, cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, timeout=1200)


@contextlib.contextmanager
def _serve(cmd: list[str], cwd: Path, env: dict, log: Path, port: int):
    """Run a server until the block ends, then stop it (it shuts its kernels down on SIGTERM)."""
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, proc, log)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def voila_url(tmp_path):
    try:
        import voila  # noqa: F401
    except ImportError:
        _unavailable("voila is not installed (pip install -e '.[dev]')")
    port = _free_port()
    log = tmp_path / "voila.log"
    cmd = [sys.executable, "-m", "voila", str(NOTEBOOK), "--no-browser", f"--port={port}",
           "--Voila.ip=127.0.0.1", "--show_tracebacks=True"]
    with _serve(cmd, ROOT, _server_env(tmp_path), log, port):
        yield f"http://127.0.0.1:{port}/", log


@pytest.fixture
def jupyterlab_url(tmp_path):
    """JupyterLab on a free localhost port with a token, serving a temporary folder that holds a
    copy of the quickstart notebook; its settings, workspaces and runtime files stay in tmp_path."""
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        _unavailable("jupyterlab is not installed (pip install -e '.[dev]')")
    if not QUICKSTART.exists():
        pytest.fail(f"{QUICKSTART} is missing: run notebooks/_build/00_quickstart.py")
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(QUICKSTART, root / QUICKSTART.name)
    settings = tmp_path / "lab_settings"
    # no news poll: the server never goes online and no toast covers the notebook
    news = settings / "@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
           f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp_path / 'lab_workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    with _serve(cmd, root, _server_env(tmp_path), log, port):
        yield f"http://127.0.0.1:{port}/lab/tree/{QUICKSTART.name}?token={token}", log


CYCLES = re.compile(r"cycles:\s*(\d+|n/a)")
_TEXT_JS = "((c) => document.querySelector('.' + c)?.innerText || '')"


def _text(page, cls: str) -> str:
    return page.locator(f".{cls}").first.inner_text()


def _press(page, slider: str, key: str, until_js: str, arg, timeout_ms: int = 60_000) -> float:
    """Focus a slider's handle, press ``key`` and wait until ``until_js(arg)`` holds and the figure
    is the new one; the seconds to the new text."""
    old_src = page.locator("img.pypto-figure").first.get_attribute("src")
    page.locator(f".pypto-{slider} .noUi-handle").first.focus()
    t0 = time.monotonic()
    page.keyboard.press(key)
    page.wait_for_function(until_js, arg=arg, timeout=timeout_ms)
    took = time.monotonic() - t0
    # the figure (occupancy bars, swimlane) is a PNG sent after the labels: wait for the new one
    page.wait_for_function("(old) => { const i = document.querySelector('img.pypto-figure');"
                           " return i && i.src !== old && i.complete; }", arg=old_src, timeout=timeout_ms)
    return took


def _cycles_change_js(old: str) -> tuple[str, str]:
    """JS (and its argument) that holds once the cycles label reads something other than ``old``."""
    return (f"(c0) => {{ const t = {_TEXT_JS}('pypto-cycles'); return /cycles:/.test(t) && t !== c0; }}", old)


def _readouts(page) -> dict[str, str]:
    """The readout of each tile slider, by name."""
    out = {}
    for name in ("m_l0", "m_l1", "k_l0", "k_l1", "n_l0", "n_l1"):
        loc = page.locator(f".pypto-{name} .widget-readout")
        if loc.count():
            out[name] = loc.first.inner_text().strip()
    return out


@pytest.fixture
def chromium():
    """Debian's chromium and Playwright, checked before a server starts."""
    exe = _chromium()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
    return exe


def _failure(page, name: str, exc: Exception, errors: list[str], log: Path) -> AssertionError:
    page.screenshot(path=str(ARTIFACTS / f"{name}_failure.png"), full_page=True)
    text = page.locator("body").inner_text()[-3000:]
    return AssertionError(f"{exc}\n--- page text ---\n{text}\n--- page errors ---\n{errors}\n"
                          f"--- server log ---\n{log.read_text()[-3000:]}")


# key presses on a slider handle, and where they take an IntSlider
KEYS = {"ArrowRight": lambda s: s.value + s.step, "ArrowLeft": lambda s: s.value - s.step,
        "End": lambda s: s.max, "Home": lambda s: s.min}
# m_l0 one step up (128 -> 144; m_l1 follows to 144); m_l0 to the end of its range (m_l1 follows:
# L1, L0A and L0C overflow at once); m_l0 back to the start (m_l1 stays: L1 still overflows, and the
# fix says m_l1); m_l1 to the start of its range: legal again
MOVES = [("m_l0", "ArrowRight"), ("m_l0", "End"), ("m_l0", "Home"), ("m_l1", "Home")]


def test_every_slider_step_is_well_formed_and_overflows_list_every_buffer(chromium, voila_url):
    """Each key press moves the page's explorer exactly as the same explorer moves headless: the
    readouts, the cycles and the overflow lines agree, every tiling is well-formed, an overflow lists
    every buffer with its fix, and the figure neither moves nor changes size."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    from pypto_lab.viz.widgets import tiling_explorer

    url, log = voila_url
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "tiling_explorer.png"
    # the notebook's explorer, driven headless the same way: what the page must show
    twin = tiling_explorer(32 * 14 * 14, 256 * 9, 256, chip="Ascend910B1", dtype="fp16", render=False)
    expect = []
    for name, key in MOVES:
        twin.sliders[name].value = KEYS[key](twin.sliders[name])
        expect.append((twin.cycles_text, twin.error_text, dict(twin.values)))

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(url, timeout=120_000)
            # the kernel starts, imports pypto_lab and runs the notebook before the widget appears
            page.locator(".pypto-m_l0 .noUi-handle").first.wait_for(state="visible", timeout=180_000)
            page.wait_for_function(f"() => /cycles:\\s*\\d+/.test({_TEXT_JS}('pypto-cycles'))", timeout=60_000)
            page.locator("img.pypto-figure").first.wait_for(state="visible", timeout=60_000)
            seen = [(_text(page, "pypto-cycles"), _text(page, "pypto-error"), _readouts(page))]
            boxes = [page.locator("img.pypto-figure").first.bounding_box()]
            times = []
            for i, (name, key) in enumerate(MOVES):
                times.append(_press(page, name, key, *_cycles_change_js(seen[-1][0])))
                seen.append((_text(page, "pypto-cycles"), _text(page, "pypto-error"), _readouts(page)))
                boxes.append(page.locator("img.pypto-figure").first.bounding_box())
                if i == 1:
                    page.screenshot(path=str(ARTIFACTS / "tiling_explorer_overflow.png"), full_page=True)
            page.screenshot(path=str(shot), full_page=True)
        except (PlaywrightTimeout, AssertionError, AttributeError) as exc:
            raise _failure(page, "tiling_explorer", exc, errors, log) from exc
        finally:
            browser.close()

    for (cycles, err, readouts), (want_cycles, want_err, values) in zip(seen[1:], expect):
        assert readouts == {k: str(v) for k, v in values.items()}, (readouts, values)   # the tiling moved as headless
        assert CYCLES.search(cycles).group(0) == CYCLES.search(want_cycles).group(0), (cycles, want_cycles)
        assert all(v % 16 == 0 for v in values.values()) and values["m_l1"] % values["m_l0"] == 0
        assert [ln.strip() for ln in err.splitlines() if ln.strip()] == want_err.splitlines(), (err, want_err)
    step, over, still, back = seen[1:]
    assert step[2]["m_l0"] == step[2]["m_l1"] == str(int(seen[0][2]["m_l0"]) + 16)
    assert CYCLES.search(over[0]).group(1) == "n/a"
    assert [ln.split()[0] for ln in over[1].splitlines() if ln.strip()] == ["L1", "L0A", "L0C"], over
    assert over[1].count("try ") == 2                                  # L1 has no single-size fix there
    assert CYCLES.search(still[0]).group(1) == "n/a" and "try m_l1 = " in still[1], still
    assert CYCLES.search(back[0]).group(1) != "n/a" and not back[1].strip()
    assert all(box == boxes[0] for box in boxes), boxes                # the figure never moves or resizes
    assert not errors, errors
    assert shot.stat().st_size > 10_000
    print(f"\nvoila: cycles {[CYCLES.search(c[0]).group(1) for c in seen]}; key press to new text: "
          f"{', '.join(f'{1000 * t:.0f} ms' for t in times)}; screenshots in {ARTIFACTS.relative_to(ROOT)}")


def test_quickstart_runs_in_jupyterlab_and_its_slider_changes_cycles(chromium, jupyterlab_url):
    """JupyterLab opens the quickstart, Run > Run All Cells runs it, and one step of the explorer's
    m_l0 slider (128 -> 144, m_l1 follows) changes the cycles to what the simulator says for that
    tiling, as the notebook suggests trying."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    from pypto_lab.viz.widgets import tiling_explorer

    url, log = jupyterlab_url
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "jupyterlab_quickstart.png"
    twin = tiling_explorer(1024, 1024, 1024, chip="Ascend910B1", render=False)   # the quickstart's explorer
    before = twin.cycles_text
    m = twin.sliders["m_l0"]
    m.value = m.value + m.step
    after, tiling = twin.cycles_text, {name: str(v) for name, v in twin.values.items()}

    t0 = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(url, timeout=120_000)
            page.locator(".jp-Notebook").first.wait_for(state="visible", timeout=120_000)
            # the kernel is idle once it has started
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
                state="attached", timeout=120_000)
            _run_all_cells(page)
            # all the quickstart's cells run first (about 10 s on 2 idle cores; minutes on busy ones)
            page.locator(".pypto-m_l0 .noUi-handle").first.wait_for(state="visible", timeout=300_000)
            page.wait_for_function(f"() => /cycles:\\s*\\d+/.test({_TEXT_JS}('pypto-cycles'))", timeout=60_000)
            page.locator("img.pypto-figure").first.wait_for(state="visible", timeout=60_000)
            page.locator(".pypto-tiling-explorer").first.scroll_into_view_if_needed()
            shown_before = _text(page, "pypto-cycles")
            took = _press(page, "m_l0", "ArrowRight", *_cycles_change_js(shown_before))
            shown_after, readouts = _text(page, "pypto-cycles"), _readouts(page)
            page.locator(".pypto-tiling-explorer").first.screenshot(path=str(shot))
        except (PlaywrightTimeout, AssertionError, AttributeError) as exc:
            raise _failure(page, "jupyterlab_quickstart", exc, errors, log) from exc
        finally:
            browser.close()

    assert CYCLES.search(shown_before).group(0) == CYCLES.search(before).group(0), (shown_before, before)
    assert CYCLES.search(shown_after).group(0) == CYCLES.search(after).group(0), (shown_after, after)
    assert shown_after != shown_before and readouts == tiling, (readouts, tiling)
    assert not errors, errors
    assert shot.stat().st_size > 10_000
    print(f"\njupyterlab: {CYCLES.search(shown_before).group(0)} -> {CYCLES.search(shown_after).group(0)} "
          f"(m_l0 {m.value - m.step} -> {m.value}); key press to new text {1000 * took:.0f} ms; "
          f"page {time.monotonic() - t0:.0f} s")
