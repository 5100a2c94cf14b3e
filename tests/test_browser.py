"""The widget labs in a real browser: JupyterLab 4 in headless Chromium, driven as a learner would.

papermill runs the kernel only; nothing there proves that a block-table stepper or the timeline
explorer draws anything in JupyterLab, or that a click or a key press reaches the kernel and comes
back as a new picture. This module does:

- starts JupyterLab on 127.0.0.1 (a token, a free port, its own settings/workspace/config dirs
  with the news pop-up off and every cell kept in the page), serving a temporary folder with
  copies of the SOLUTION notebooks of the widget labs, each with a parameters cell injected after
  its own (LIGHT, BACKEND="cpu", no real servers: the point is the widgets);
- opens each notebook, runs all cells from the Run menu, and checks: every code cell ran, no cell
  shows an error, every plot arrived as a loaded image, no console error or uncaught page error;
- finds each widget by its CSS hook class (`lab_utils.viz.blocks.STEPPER_CLASS`,
  `lab_utils.viz.timeline.EXPLORER_CLASS`) and works it: the stepper must draw coloured blocks and
  draw a new frame after a key press on its slider and after a click on its play button; the
  explorer must draw a timeline and redraw after a key press, a click on a slider track and a
  policy change; the drill runner (lab 11, found by its layout until it carries a hook class) must
  tick its timer, take a typed answer, give feedback and a score plot on Check, and move on at Next;
- counts every console error as a failure: the page holds only JupyterLab and the course's widgets
  (none appeared on a clean run), so an error there is one to look at;
- saves a screenshot of every widget state it checked under out/browser/ (LAB_BROWSER_ARTIFACTS),
  and one of the page when a check fails;
- proves the checks fail on deliberately broken widgets.

Tools: the `playwright` package (requirements/course-cpu.txt) drives Debian's `chromium`
(`make test-tools` installs it as root; LAB_CHROMIUM names another binary). Playwright's own
browser download is not used. Without either, the module skips and says which is missing.

Adding a lab: one `LabCase` line in LABS (and a checker in CHECKERS if it brings a new kind of widget).

Time: the module took 4 min 37 s on the course's 2-core machine while other jobs kept its load
average at 11-20 (about 60 s of CPU for the test itself, most of it the three notebooks' kernels).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
ARTIFACTS = Path(os.environ.get("LAB_BROWSER_ARTIFACTS", REPO / "out" / "browser"))
STEP_TIMEOUT_MS = 20_000  # a widget redraw round-trips through the kernel; generous on 2 busy cores
RUN_ALL_TIMEOUT_MS = 180_000  # one notebook's "Run All Cells"

# The hook classes (kept as literals too, so the fast test below notices a rename on either side).
STEPPER = "lab-block-stepper"
EXPLORER = "lab-timeline-explorer"
DRILLS = "lab-drill-runner"
# Where each kind of widget is in the page. The drill runner (lab_utils.viz.drill_runner) has no hook
# class yet: it is the box whose row holds the answer field and the Check button.
SELECTORS = {
    STEPPER: f".{STEPPER}",
    EXPLORER: f".{EXPLORER}",
    DRILLS: f".{DRILLS}, .widget-vbox:has(> .widget-hbox > .widget-text input[type=number])"
    ":has(> .widget-hbox > button.widget-button)",
}


@dataclass(frozen=True)
class LabCase:
    """One widget lab: the solution notebook's stem, how many of each widget kind it must show, the
    least number of static plots, and parameters injected on top of the common ones."""

    stem: str
    widgets: dict[str, int]
    plots: int = 1
    params: dict = field(default_factory=dict)


COMMON_PARAMS = {
    "BACKEND": "cpu",
    "LIGHT": True,
    "INTERACTIVE": True,
    "RUN_VLLM": False,
    "RUN_REAL": False,
}  # names a lab lacks are harmless

LABS = [
    LabCase("02_kv_cache_paged_attention", {STEPPER: 2}, plots=3),
    # LIGHT=True swaps lab 03's explorer for its static grid (papermill's view); a learner runs
    # LIGHT=False, which with RUN_REAL=False takes about 8 s on this machine.
    LabCase("03_batching", {EXPLORER: 1}, plots=4, params={"LIGHT": False}),
    # LIGHT=True prints lab 11's practice drills as text instead of the runner (as in lab 03)
    LabCase("11_interview_drills", {DRILLS: 1}, plots=0, params={"LIGHT": False}),
]

# Calls that put a widget in a notebook: a solution that makes one must be listed in LABS.
WIDGET_CALL = re.compile(r"\b(show_trace|trace_stepper|timeline_explorer|ipywidgets|drill_runner)\b")


# --------------------------------------------------------------------------------------- fast checks


def test_every_widget_lab_is_checked_in_the_browser():
    """A solution that builds a widget must be in LABS, so the browser test covers it."""
    listed = {case.stem for case in LABS}
    with_widgets = set()
    for path in sorted(SOLUTIONS.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        if any(c.cell_type == "code" and WIDGET_CALL.search(c.source) for c in nb.cells):
            with_widgets.add(path.stem)
    assert with_widgets <= listed, f"widget labs missing from LABS: {sorted(with_widgets - listed)}"


def test_widgets_carry_the_hook_classes():
    pytest.importorskip("ipywidgets")
    from lab_utils.viz import blocks, timeline

    assert blocks.STEPPER_CLASS == STEPPER and timeline.EXPLORER_CLASS == EXPLORER
    assert STEPPER in blocks.trace_stepper(blocks.record_example())._dom_classes
    assert EXPLORER in timeline.timeline_explorer()._dom_classes


# ----------------------------------------------------------------------------------------- the tools


def _chromium() -> str | None:
    named = os.environ.get("LAB_CHROMIUM")
    for candidate in (
        [named]
        if named
        else ["/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser")]
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(settings: Path) -> None:
    """JupyterLab user settings: no news/update pop-up, every cell kept in the DOM (no windowing)."""
    files = {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }
    for rel, content in files.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))


def _with_parameters(src: Path, dest: Path, params: dict) -> None:
    """Copy a notebook with a cell after its parameters cell that sets `params` (as papermill does)."""
    nb = nbformat.read(str(src), as_version=4)
    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), None)
    if index is None:
        raise AssertionError(f"{src.name} has no cell tagged 'parameters'")
    lines = ["# Parameters injected by tests/test_browser.py"] + [f"{k} = {v!r}" for k, v in params.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    nbformat.write(nb, str(dest))


BROKEN = "broken_widgets"


def _broken_notebook(folder: Path) -> None:
    """A notebook whose widgets are broken on purpose (the checks must fail on it); the raising cell
    is last, as Run All stops there."""
    cells = [
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nfrom lab_utils.viz import blocks",
        # the real stepper with its redraw unhooked: the slider moves, the picture does not
        "box = blocks.trace_stepper(blocks.record_example())\nbox.children[0].children[1].unobserve_all('value')\nbox",
        # a stepper that redraws, but only a title: no blocks for a learner to see
        "def blank(frame, colours=None, ncols=None):\n"
        "    fig, ax = plt.subplots(figsize=(6, 2))\n"
        "    ax.axis('off')\n"
        "    ax.set_title(f'[{frame.index}] {frame.description}')\n"
        "    return fig\n\n"
        "blocks.plot_frame = blank   # trace_stepper draws through the module's plot_frame\n"
        "blank_box = blocks.trace_stepper(blocks.record_example())\n"
        "blank_box",
        "raise RuntimeError('deliberate failure')",
    ]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(folder / f"{BROKEN}.ipynb"))


def _stop_group(proc: subprocess.Popen, others: list) -> None:
    """SIGTERM the server's process group (it shuts its kernels down), then SIGKILL what is left."""
    import psutil

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
    gone, alive = psutil.wait_procs([p for p in others if p.is_running()], timeout=5)
    for p in alive:  # kernels run in sessions of their own; kill any the server did not stop
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory):
    """JupyterLab serving a folder of prepared notebooks; yields (base url, token, folder)."""
    import httpx
    import psutil

    root = tmp_path_factory.mktemp("browser")
    notebooks = root / "notebooks"
    notebooks.mkdir()
    for case in LABS:
        if not (SOLUTIONS / f"{case.stem}.ipynb").exists():
            continue
        _with_parameters(
            SOLUTIONS / f"{case.stem}.ipynb",
            notebooks / f"{case.stem}.ipynb",
            {**COMMON_PARAMS, **case.params},
        )
    _broken_notebook(notebooks)
    _write_settings(root / "settings")
    port, token = _free_port(), os.urandom(16).hex()
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "JUPYTER_TOKEN")}
    env.update(
        JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
        JUPYTER_CONFIG_DIR=str(root / "config"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        LAB_RESULTS_FILE=str(root / "results.json"),
        LAB_REPO_ROOT=str(REPO),
        PYTHONPATH=os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])),
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={notebooks}",
        "--ServerApp.port_retries=0",
        "--LabApp.expose_app_in_browser=True",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(root / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        cmd, cwd=notebooks, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                tail = (root / "jupyterlab.log").read_text()[-3000:]
                raise RuntimeError(f"JupyterLab exited ({proc.returncode}):\n{tail}")
            try:
                if httpx.get(f"{base}/api/status", params={"token": token}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("JupyterLab did not answer within 90 s")
            time.sleep(0.3)
        yield base, token, notebooks
    finally:
        kernels = []
        try:
            kernels = psutil.Process(proc.pid).children(recursive=True)
            with httpx.Client(base_url=base, params={"token": token}, timeout=10) as client:
                for k in client.get("/api/kernels").json():
                    client.delete(f"/api/kernels/{k['id']}")
        except Exception:  # the server may be gone already; the group kill below still runs
            pass
        _stop_group(proc, kernels)
        log.close()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium under playwright; closed (driver and browser) on every path."""
    chromium = _chromium()
    if chromium is None:
        named = os.environ.get("LAB_CHROMIUM")
        pytest.skip(
            f"LAB_CHROMIUM={named} is not an executable"
            if named
            else "chromium not found (install it with `make test-tools` as root, "
            "`apt-get install chromium`, or set LAB_CHROMIUM)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is missing (it is in requirements/course-cpu.txt)")
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(
            executable_path=chromium,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


# ------------------------------------------------------------------------------ driving the notebook


@dataclass
class Session:
    page: object
    name: str
    console_errors: list


@pytest.fixture(scope="module")
def lab_page(browser, jupyter_lab):
    """One JupyterLab page for the module (loading the app is the slowest step); console errors
    and uncaught page errors are collected as they come. (browser first: without Chromium the
    tests skip before JupyterLab starts.)"""
    base, token, _ = jupyter_lab
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on(
            "console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None
        )
        page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
        # a workspace of its own, reset: nothing reopened from an earlier layout
        page.goto(f"{base}/lab/workspaces/browser-test?reset&token={token}")
        page.wait_for_function(
            "() => window.jupyterapp && window.jupyterapp.shell && document.querySelector('.jp-LabShell')",
            timeout=90_000,
        )
        yield page, errors, jupyter_lab
    finally:
        context.close()


def _open(lab_page, name: str) -> Session:
    """Open NAME.ipynb in the page (as a double click in the file browser would) and wait for its kernel."""
    page, errors, _ = lab_page
    (ARTIFACTS / f"{name}-FAILED.png").unlink(missing_ok=True)
    errors.clear()
    page.evaluate(
        "p => window.jupyterapp.commands.execute('docmanager:open', {path: p, factory: 'Notebook'})",
        f"{name}.ipynb",
    )
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell", timeout=60_000)
    page.wait_for_function(f"() => {{ {_KERNEL_JS} return k && k.status === 'idle'; }}", timeout=90_000)
    return Session(page, name, errors)


def _close(lab, s: Session) -> None:
    """Close every open document without the save dialog, and end the notebook's kernel."""
    try:
        s.page.keyboard.press("Escape")
        s.page.evaluate(
            "() => { for (const w of [...window.jupyterapp.shell.widgets('main')]) {"
            " if (w.context) w.context.model.dirty = false; w.dispose(); } }"
        )
    finally:
        _shut_kernel(lab, s.name)


# the kernel of the notebook on show (JupyterLab exposes its app with --LabApp.expose_app_in_browser)
_KERNEL_JS = """const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"""


def _shut_kernel(lab, name: str) -> None:
    """End the notebook's kernel session, so the next lab does not share the cores with it."""
    import httpx

    base, token, _ = lab
    with httpx.Client(base_url=base, params={"token": token}, timeout=10) as client:
        for session in client.get("/api/sessions").json():
            if session.get("path") == f"{name}.ipynb":
                client.delete(f"/api/sessions/{session['id']}")


def _run_all(s: Session) -> None:
    """Run > Run All Cells, as a learner would; returns when the queue is empty and the kernel idle."""
    page = s.page
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item:visible", has_text="Run All Cells").first.click()
    page.wait_for_function(
        """() => { const ps = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);"""
        + _KERNEL_JS
        + """return ps.some(t => /\\[\\d+\\]/.test(t)) && !ps.some(t => t.includes('*'))
                  && k && k.status === 'idle'; }""",
        timeout=RUN_ALL_TIMEOUT_MS,
        polling=500,
    )


def _shot(locator, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    locator.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def check_notebook(s: Session) -> dict:
    """Every code cell ran, no error output, every image loaded; returns counts for the caller."""
    page = s.page
    prompts = page.eval_on_selector_all(
        ".jp-CodeCell .jp-InputPrompt", "ps => ps.map(p => p.textContent.trim())"
    )
    not_run = [i for i, t in enumerate(prompts) if not re.search(r"\[\d+\]", t)]
    # JupyterLab renders an error like stderr text, so ask the notebook's model for outputs of type error
    errors = page.evaluate(
        """() => { const nb = window.jupyterapp.shell.currentWidget.content.model; const found = [];
                   for (let i = 0; i < nb.cells.length; i++) {
                       const c = nb.cells.get(i);
                       if (c.type !== 'code') continue;
                       for (const o of c.outputs.toJSON())
                           if (o.output_type === 'error') found.push(`cell ${i}: ${o.ename}: ${o.evalue}`);
                   }
                   return found; }"""
    )
    assert not errors, f"{s.name}: a cell shows an error:\n" + "\n---\n".join(errors)
    assert not not_run, f"{s.name}: code cells {not_run} did not run (of {len(prompts)})"
    images = page.eval_on_selector_all(
        ".jp-OutputArea-output img",
        "is => is.map(i => ({ok: i.complete && i.naturalWidth > 0, widget: !!i.closest('.jupyter-widgets')}))",
    )
    assert all(i["ok"] for i in images), f"{s.name}: an image output did not load"
    return {"plots": sum(not i["widget"] for i in images), "cells": len(prompts)}


def check_console(s: Session) -> None:
    assert not s.console_errors, f"{s.name}: browser console errors:\n" + "\n".join(s.console_errors)


# a blob: URL (ipywidgets.Image) read back as base64 from inside the page
_BLOB_JS = """async img => {
    const u = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let s = '';
    for (let k = 0; k < u.length; k += 0x8000) s += String.fromCharCode(...u.subarray(k, k + 0x8000));
    return btoa(s);
}"""


def _coloured_share(png: bytes) -> float:
    """Share of pixels with a saturated colour (requests' blocks and bars); greys and white do not count."""
    import io

    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return float(((rgb.max(axis=2) - rgb.min(axis=2)) > 60).mean())


def _image(box, css: str):
    img = box.locator(css).last
    img.wait_for(state="visible", timeout=STEP_TIMEOUT_MS)
    img.page.wait_for_function(
        "i => i.complete && i.naturalWidth > 0", arg=img.element_handle(), timeout=STEP_TIMEOUT_MS
    )
    return img


def _src(box, css: str) -> str:
    return _image(box, css).get_attribute("src") or ""


def _wait_redraw(box, css: str, before: str, what: str, timeout_ms: int) -> str:
    """Wait until the widget's picture is not `before` any more; fail saying what the learner did."""
    page = box.page
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        img = box.locator(css).last
        if img.count():
            now = img.get_attribute("src") or ""
            if now and now != before:
                _image(box, css)
                return now
        page.wait_for_timeout(200)
    raise AssertionError(f"the picture did not change within {timeout_ms / 1000:.0f} s after {what}")


def _coloured(box, css: str) -> float:
    """The coloured share of the picture the page shows (once the browser has loaded it), decoded here."""
    import base64

    img = _image(box, css)
    src = img.get_attribute("src") or ""
    data = src.split(",", 1)[1] if src.startswith("data:") else img.evaluate(_BLOB_JS)
    return _coloured_share(base64.b64decode(data))


MIN_COLOURED = 0.005  # a frame with one request's blocks colours several percent of the picture


def check_block_stepper(box, label: str, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    """The stepper draws blocks; a key press on its slider and a click on play each draw a new frame."""
    frame = ".widget-output img"
    handle = box.locator(".noUi-handle").first
    box.scroll_into_view_if_needed()
    start = _src(box, frame)
    first_value = int(float(handle.get_attribute("aria-valuenow")))
    shares = [_coloured(box, frame)]
    _shot(box, f"{label}-0-start")

    handle.focus()
    handle.press("ArrowRight")
    after_key = _wait_redraw(box, frame, start, "ArrowRight on the slider", timeout_ms)
    assert int(float(handle.get_attribute("aria-valuenow"))) == first_value + 1, (
        "the key did not move the slider"
    )
    shares.append(_coloured(box, frame))
    _shot(box, f"{label}-1-key")

    play = box.locator(".widget-play button").first
    play.click()
    try:
        box.page.wait_for_function(
            "([h, v]) => Number(h.getAttribute('aria-valuenow')) > v",
            arg=[handle.element_handle(), first_value + 1],
            timeout=timeout_ms,
        )
    finally:
        play.click()  # pause
    _wait_redraw(box, frame, after_key, "a click on play", timeout_ms)
    shares.append(_coloured(box, frame))
    _shot(box, f"{label}-2-play")
    assert max(shares) >= MIN_COLOURED, (
        f"the stepper draws no blocks: coloured share {max(shares):.4f} < {MIN_COLOURED} in every frame seen"
    )


def check_timeline_explorer(box, label: str, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    """The explorer draws a timeline and redraws on a key press, a click on a slider and a policy change."""
    picture = "img"
    summary = box.locator(".widget-label").last
    box.scroll_into_view_if_needed()
    before = _src(box, picture)
    assert _coloured(box, picture) >= MIN_COLOURED, "the explorer draws no request bars"
    assert summary.inner_text().strip(), "the explorer shows no summary line"
    _shot(box, f"{label}-0-start")

    batch = box.locator(".widget-hslider .noUi-handle").first
    value = float(batch.get_attribute("aria-valuenow"))
    batch.focus()
    batch.press("ArrowRight")
    before = _wait_redraw(box, picture, before, "ArrowRight on the batch-size slider", timeout_ms)
    assert float(batch.get_attribute("aria-valuenow")) == value + 1
    _shot(box, f"{label}-1-key")

    load = box.locator(".widget-hslider").nth(1).locator(".noUi-base")
    text = summary.inner_text()
    bb = load.bounding_box()
    box.page.mouse.click(bb["x"] + 0.85 * bb["width"], bb["y"] + bb["height"] / 2)
    before = _wait_redraw(box, picture, before, "a click on the load slider's track", timeout_ms)
    try:  # the kernel sends the new picture, then the new summary line
        box.page.wait_for_function(
            "([e, t]) => e.textContent !== t", arg=[summary.element_handle(), text], timeout=timeout_ms
        )
    except Exception:
        raise AssertionError("the summary line did not follow the load slider") from None
    _shot(box, f"{label}-2-click")

    box.locator("select").first.select_option("static")
    _wait_redraw(box, picture, before, "choosing the static policy", timeout_ms)
    box.page.wait_for_function(
        "([e]) => e.textContent.includes('static')", arg=[summary.element_handle()], timeout=timeout_ms
    )
    assert _coloured(box, picture) >= MIN_COLOURED, "the static timeline draws no request bars"
    _shot(box, f"{label}-3-policy")


def check_drill_runner(box, label: str, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    """The drill runner asks a question, its timer runs, a typed answer and Check give feedback and a
    score plot, and Next asks the next question."""
    page = box.page
    question = box.locator(".widget-html").first
    box.scroll_into_view_if_needed()
    asked = question.inner_text().strip()
    assert re.search(r"\(1/\d+\)", asked), f"the runner shows no first question: {asked!r}"
    timer = box.locator(".widget-label").last
    ticks = timer.inner_text()
    page.wait_for_function(
        "([e, t]) => e.textContent !== t", arg=[timer.element_handle(), ticks], timeout=timeout_ms
    )
    _shot(box, f"{label}-0-question")

    answer = box.locator(".widget-text input").first
    answer.click()
    answer.fill("")
    answer.type("42")
    answer.press("Enter")
    box.locator("button.widget-button", has_text="Check").click()
    feedback = box.locator(".widget-output").first
    page.wait_for_function(
        "([e]) => /you said 42\\b/.test(e.innerText)", arg=[feedback.element_handle()], timeout=timeout_ms
    )
    scores = box.locator(".widget-output").nth(1)
    scores.locator("img").first.wait_for(state="visible", timeout=timeout_ms)
    scores.scroll_into_view_if_needed()
    deadline = time.monotonic() + timeout_ms / 1000
    while _coloured(scores, "img") == 0:  # the output is replaced as a whole; give it time to settle
        assert time.monotonic() < deadline, "the score plot is blank"
        page.wait_for_timeout(300)
    _shot(box, f"{label}-1-checked")

    box.locator("button.widget-button", has_text="Next").click()
    page.wait_for_function(
        "([e]) => /\\(2\\/\\d+\\)/.test(e.innerText)", arg=[question.element_handle()], timeout=timeout_ms
    )
    _shot(box, f"{label}-2-next")


CHECKERS = {STEPPER: check_block_stepper, EXPLORER: check_timeline_explorer, DRILLS: check_drill_runner}


def _fail_shot(s: Session) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        s.page.screenshot(path=str(ARTIFACTS / f"{s.name}-FAILED.png"))
    except Exception:
        pass


# --------------------------------------------------------------------------------------- the tests


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", LABS, ids=[c.stem for c in LABS])
def test_widget_lab_in_the_browser(case, lab_page):
    if not (SOLUTIONS / f"{case.stem}.ipynb").exists():
        pytest.skip(f"solutions/{case.stem}.ipynb is not there")
    s = _open(lab_page, case.stem)
    try:
        _run_all(s)
        seen = check_notebook(s)
        assert seen["plots"] >= case.plots, (
            f"{case.stem}: {seen['plots']} plots shown, expected >= {case.plots}"
        )
        panel = s.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        for kind, count in case.widgets.items():
            boxes = panel.locator(SELECTORS[kind])
            assert boxes.count() == count, f"{case.stem}: {boxes.count()} widgets {kind}, expected {count}"
            for i in range(count):
                CHECKERS[kind](boxes.nth(i), f"{case.stem}-{kind}-{i}")
        check_notebook(s)  # working the widgets put no error in an output either
        check_console(s)
    except BaseException:
        _fail_shot(s)
        raise
    finally:
        _close(lab_page[2], s)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_checks_fail_on_broken_widgets(lab_page):
    """The same helpers, on a notebook broken on purpose, must fail each in its own way (short waits:
    failing is the point): a stepper that does not redraw, one that draws no blocks, a cell that raises."""
    s = _open(lab_page, BROKEN)
    try:
        _run_all(s)
        with pytest.raises(AssertionError, match="shows an error"):
            check_notebook(s)
        boxes = s.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").locator(SELECTORS[STEPPER])
        assert boxes.count() == 2, "the broken notebook should show its two steppers"
        with pytest.raises(AssertionError, match="did not change"):
            check_block_stepper(boxes.nth(0), f"{BROKEN}-no-redraw", timeout_ms=4_000)
        with pytest.raises(AssertionError, match="draws no blocks"):
            check_block_stepper(boxes.nth(1), f"{BROKEN}-blank", timeout_ms=8_000)
    finally:
        _close(lab_page[2], s)
