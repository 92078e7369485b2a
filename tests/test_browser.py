"""A real browser check of the workbench: JupyterLab on localhost, notebook 01 in headless
Chromium (Debian's `chromium` + `chromium-driver`, driven by Selenium), run all cells, move the
tok_e slider, and see both the decision text and the figure change.

CI installs Chromium (.ci/run) and never skips this; elsewhere it runs when Chromium, its driver
and JupyterLab are installed.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_tokens_per_expert.py"
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


@needs_browser
def test_tok_e_slider_changes_decision_and_figure(tmp_path):
    import jupytext
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    nb = jupytext.read(NOTEBOOK)
    jupytext.write(nb, tmp_path / "01.ipynb")
    port, token = _free_port(), "chord-browser-test"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={tmp_path}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.disable_check_xsrf=True", "--allow-root"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    driver = None
    try:
        base = f"http://127.0.0.1:{port}"
        _wait(lambda: urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).status == 200, 60,
              "the JupyterLab server")
        opts = Options()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1400,1800"):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
        driver.get(f"{base}/lab/tree/01.ipynb?token={token}")
        _wait(lambda: driver.execute_script(
            "const a = window.jupyterapp; const w = a && a.shell.currentWidget;"
            "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
            " && w.sessionContext.session.kernel.status === 'idle');"), 90, "the notebook's kernel")
        driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

        def decision():
            for el in driver.find_elements(By.CSS_SELECTOR, ".widget-html-content"):
                if "rows/expert" in el.text:
                    return el.text
            return None

        def selected_x():
            return driver.execute_script(
                "for (const d of document.querySelectorAll('.js-plotly-plot')) {"
                "  for (const t of (d.data || [])) { if (t.name === 'selected') return t.x[0]; } }"
                "return null;")

        before = _wait(decision, 120, "the decision under the slider")
        x_before = _wait(selected_x, 60, "the figure's selected point")
        handle = _wait(lambda: driver.find_element(By.CSS_SELECTOR, ".widget-slider .noUi-handle"), 30,
                       "the tok_e slider")
        handle.click()
        for _ in range(4):
            handle.send_keys(Keys.ARROW_RIGHT)
        after = _wait(lambda: (d := decision()) != before and d, 30, "the decision to change")
        x_after = _wait(lambda: (x := selected_x()) != x_before and x, 30, "the figure to change")
        print("decision before:", before[:90], "| after:", after[:90], "| selected x:", x_before, "->", x_after)
        assert "rows/expert" in after and float(x_after) > float(x_before)
        errors = driver.execute_script(
            "return Array.from(document.querySelectorAll('.jp-OutputArea-output[data-mime-type="
            "\"application/vnd.jupyter.stderr\"]')).map(e => e.innerText).filter(t => /Error|Traceback/.test(t));")
        assert not errors, errors
    finally:
        if driver is not None:
            driver.quit()
        lab.terminate()
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:  # pragma: no cover
            lab.kill()
