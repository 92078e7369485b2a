"""What a wheel carries: the recorded data the package reads is package data, the raw results
stay in the repository, and results/index.json lists every recorded file."""
import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_under_chord_data_is_package_data():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["chord"]
    data = [p.relative_to(ROOT / "chord").as_posix() for p in (ROOT / "chord" / "data").rglob("*") if p.is_file()]
    assert data
    missed = [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missed, f"chord/data files a wheel would leave out: {missed}"


def test_no_raw_results_inside_the_package():
    tracked = subprocess.run(["git", "ls-files", "chord"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout: the folders instead
        tracked = [p.relative_to(ROOT).as_posix() for p in (ROOT / "chord").rglob("*") if p.is_file()]
    stray = [f for f in tracked if f.endswith((".json", ".csv", ".md", ".txt")) and
             not f.startswith(("chord/data/", "chord/lab/bench/suites/", "chord/lab/bench/baselines/"))]
    assert not stray, f"data files in the package outside chord/data: {stray}"


def test_the_workbench_reads_only_shipped_files():
    from chord.lab.workbench import data

    assert data.RESULTS_DIR == ROOT / "chord" / "data" / "results"
    assert data.DATA_DIR == ROOT / "chord" / "data" / "notebooks"
    assert data.recorded_results()["meta"]["file"] in {p.name for p in data.RESULTS_DIR.glob("*.json")}
    assert data.recorded_file("x.json") == "chord/data/results/x.json"


def test_results_index_is_current():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "results_index.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_results_index_describes_every_file():
    import json

    index = json.loads((ROOT / "results" / "index.json").read_text())["files"]
    for e in index:
        assert (ROOT / e["file"]).is_file(), e["file"]
        assert e["date"] and e["gpu"] and e["kind"] and e["what"] and e["added_in"], e
        assert e["shipped"] == e["file"].startswith("chord/data/results/")


def test_the_jupyterlab_setting_is_installed_with_the_package():
    """pip puts data-files into the environment's prefix: JupyterLab reads
    <prefix>/share/jupyter/lab/settings/overrides.d/*.json as its defaults."""
    import json

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data_files = pyproject["tool"]["setuptools"]["data-files"]
    target = "share/jupyter/lab/settings/overrides.d"
    assert data_files[target] == [f"{target}/chord-moe.json"]
    setting = json.loads((ROOT / target / "chord-moe.json").read_text())
    viewers = setting["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers == {"python": "Jupytext Notebook"}
    assert f"include {target}/chord-moe.json" in (ROOT / "MANIFEST.in").read_text()  # the sdist carries it


def test_notebooks_keep_their_header_when_jupyterlab_saves_them():
    """notebooks/jupytext.toml: what JupyterLab adds when it opens and runs a notebook (jupytext
    version, language info, widget state, cell UI state) is not written back to the .py file."""
    import jupytext
    from jupytext.config import load_jupytext_config

    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        text = path.read_text()
        config = load_jupytext_config(str(path))
        assert config is not None and config.notebook_metadata_filter == "kernelspec,-jupytext"
        nb = jupytext.reads(text, fmt="py:percent")
        nb.metadata["jupytext"] = {"text_representation": {"extension": ".py", "format_name": "percent",
                                                           "format_version": "1.3", "jupytext_version": "1.19.6"}}
        nb.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
        for cell in nb.cells:
            cell.metadata.update(scrolled=True, jupyter={"source_hidden": False}, execution={})
        assert jupytext.writes(nb, fmt="py:percent", config=config) == text, path.name


def test_recorded_results_name_no_folder_of_the_machine_that_wrote_them():
    """Result files are committed and shared: a suite is named by its path in the package, the
    upstream install by its path under --humming-dir (chord.lab.bench.suite.recorded_path)."""
    import re

    home = re.compile(r"(?<![\w.])/(?:work|root|home|tmp)/[\w.-]+/")
    bad = [p.relative_to(ROOT).as_posix() for folder in ("results", "chord/data/results")
           for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and p.suffix in (".json", ".txt", ".md")
           and home.search(p.read_text(errors="replace"))]
    assert not bad, f"result files naming a machine's folder: {bad}"


def test_recorded_path_is_relative_to_the_package_or_the_base(tmp_path):
    from chord.lab.bench.suite import SUITES_DIR, recorded_path

    assert recorded_path(SUITES_DIR / "kimi_k2_h200.json") == "chord/lab/bench/suites/kimi_k2_h200.json"
    (tmp_path / "humming").mkdir()
    assert recorded_path(tmp_path / "humming" / "__init__.py", tmp_path) == "humming/__init__.py"
    assert recorded_path("/elsewhere/suite.json") == "/elsewhere/suite.json"
