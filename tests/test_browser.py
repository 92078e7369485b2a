"""A real browser check of the workbench: JupyterLab on localhost in headless Chromium (Debian's
`chromium` + `chromium-driver`, driven by Selenium), as a user meets it:

* the file browser lists `notebooks/`; a double click on `01_tokens_per_expert.py` opens the
  notebook view (the project's JupyterLab setting, share/jupyter/lab/settings/overrides.d,
  which a Chord install puts into the environment), not the text editor;
* Run All renders the tok_e explorer; moving its slider changes the decision and the figure;
* Run All again on the same kernel, and again after closing and reopening the notebook on the
  kernel still alive: the widgets render and work each time (no "model not found");
* saving writes the tracked file back byte for byte (notebooks/jupytext.toml: no header);
* it writes the README's screenshot, docs/img/workbench-01-tokens-per-expert.png.

CI installs Chromium (.ci/run) and never skips this; elsewhere it runs when Chromium, its driver
and JupyterLab are installed.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "01_tokens_per_expert.py"
OVERRIDES = REPO / "share" / "jupyter" / "lab" / "settings" / "overrides.d" / "chord-moe.json"
SCREENSHOT = REPO / "docs" / "img" / "workbench-01-tokens-per-expert.png"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def _have_lab() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("jupyterlab", "selenium", "jupytext"))


needs_browser = pytest.mark.skipif(
    not (CHROMIUM and DRIVER and _have_lab()) and not os.environ.get("CI"),
    reason="needs chromium, chromium-driver, jupyterlab and selenium (CI installs them and never skips)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str, poll: float = 0.25):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = pred()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - the page is still loading
            last = exc
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


KERNEL_IDLE = ("const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
               "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
               " && w.sessionContext.session.kernel.status === 'idle');")
CELLS_DONE = ("const w = window.jupyterapp.shell.currentWidget;"
              "const code = w.content.widgets.filter(c => c.model.type === 'code');"
              "return code.length > 0 && code.every(c => c.model.executionCount !== null);")
PANEL = "window.jupyterapp.shell.currentWidget.node"
PAGE_STATE = (f"const panel = {PANEL};"
              "const outs = Array.from(panel.querySelectorAll('.jp-OutputArea-output')).map(e => e.textContent);"
              "return {errors: outs.filter(t => /Error|Traceback|model not found/.test(t)).map(t => t.slice(0, 300)),"
              " sliders: panel.querySelectorAll('.widget-slider').length,"
              " plots: panel.querySelectorAll('.js-plotly-plot').length};")


@needs_browser
def test_double_click_run_twice_and_the_widgets_work(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    root = tmp_path / "root"
    (root / "notebooks").mkdir(parents=True)
    nb_path = root / "notebooks" / NOTEBOOK.name
    shutil.copy(NOTEBOOK, nb_path)
    shutil.copy(NOTEBOOK.parent / "jupytext.toml", root / "notebooks")
    tracked = nb_path.read_bytes()
    # JupyterLab's app settings as a Chord install leaves them: the shipped overrides.d file
    app_settings = tmp_path / "app-settings"
    (app_settings / "overrides.d").mkdir(parents=True)
    shutil.copy(OVERRIDES, app_settings / "overrides.d")
    # this test's own defaults: no news / update pop-up over the screenshot
    labconfig = tmp_path / "cfg" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "default_setting_overrides.json").write_text(json.dumps(
        {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}))
    port, token = _free_port(), "chord-browser-test"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         f"--LabApp.app_settings_dir={app_settings}", f"--LabApp.user_settings_dir={tmp_path / 'user-settings'}",
         f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--ServerApp.disable_check_xsrf=True",
         "--allow-root"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    driver = None
    try:
        base = f"http://127.0.0.1:{port}"
        _wait(lambda: urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).status == 200, 60,
              "the JupyterLab server")
        opts = Options()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1400,1000"):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
        driver.get(f"{base}/lab/tree/notebooks?token={token}")

        def open_by_double_click():
            item = _wait(lambda: next(e for e in driver.find_elements(By.CSS_SELECTOR, ".jp-DirListing-item")
                                      if NOTEBOOK.name in e.text), 60, "the notebook in the file browser")
            ActionChains(driver).double_click(item).perform()
            view = _wait(lambda: driver.execute_script(
                "const w = window.jupyterapp.shell.currentWidget;"
                "return w && w.context && w.context.path.endsWith(arguments[0]) && w.node.className;",
                NOTEBOOK.name), 30, "the opened document")
            assert "jp-NotebookPanel" in view, f"a double click opened {view!r}, not the notebook view"
            _wait(lambda: driver.execute_script(KERNEL_IDLE), 90, "the notebook's kernel")

        def run_all():
            driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
            time.sleep(1)
            _wait(lambda: driver.execute_script(CELLS_DONE) and driver.execute_script(KERNEL_IDLE), 300,
                  "every cell to run")
            state = _wait(lambda: (s := driver.execute_script(PAGE_STATE)) and s["sliders"] and s["plots"] and s,
                          30, "the widgets to render")
            assert not state["errors"], state["errors"]
            assert state["sliders"] == 1, state

        def decision():
            return driver.execute_script(
                f"for (const e of {PANEL}.querySelectorAll('.widget-html-content'))"
                "  { if (e.textContent.includes('rows/expert')) return e.textContent; } return null;")

        def selected_x():
            return driver.execute_script(
                f"for (const d of {PANEL}.querySelectorAll('.js-plotly-plot')) {{"
                "  for (const t of (d.data || [])) { if (t.name === 'selected') return t.x[0]; } }"
                "return null;")

        def slider_moves_decision_and_figure():
            before = _wait(decision, 60, "the decision under the slider")
            x_before = _wait(selected_x, 60, "the figure's selected point")
            handle = _wait(lambda: driver.execute_script(
                f"return {PANEL}.querySelector('.widget-slider .noUi-handle');"), 30, "the tok_e slider")
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", handle)
            handle.click()
            for _ in range(2):
                handle.send_keys(Keys.ARROW_RIGHT)
            after = _wait(lambda: (d := decision()) != before and d, 30, "the decision to change")
            x_after = _wait(lambda: (x := selected_x()) != x_before and x, 30, "the figure to change")
            assert "rows/expert" in after and float(x_after) > float(x_before), (before, after, x_before, x_after)
            return x_before, x_after

        open_by_double_click()
        run_all()
        print("run 1: selected tok_e", slider_moves_decision_and_figure())
        run_all()  # the same kernel, the same tab
        print("run 2: selected tok_e", slider_moves_decision_and_figure())

        driver.execute_script("return window.jupyterapp.commands.execute('docmanager:save');")
        _wait(lambda: not driver.execute_script("return window.jupyterapp.shell.currentWidget.context.model.dirty"),
              30, "the save")
        assert nb_path.read_bytes() == tracked, "opening, running and saving rewrote the tracked notebook"

        kernel = driver.execute_script("return window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id")
        driver.execute_script("window.jupyterapp.commands.execute('application:close-all');")
        _wait(lambda: not list(driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel")), 30, "the tab to close")
        open_by_double_click()  # the kernel of the earlier tab is still alive
        assert driver.execute_script(
            "return window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id") == kernel
        run_all()
        print("reopened, run 3: selected tok_e", slider_moves_decision_and_figure())

        # the README's picture: the explorer (slider, decision, figure) as it renders today
        explorer = driver.execute_script(f"return {PANEL}.querySelector('.widget-slider').closest('.jp-Cell');")
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", explorer)
        time.sleep(1)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(SCREENSHOT))
        assert SCREENSHOT.stat().st_size > 20_000
    finally:
        if driver is not None:
            driver.quit()
        lab.terminate()
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:  # pragma: no cover
            lab.kill()
