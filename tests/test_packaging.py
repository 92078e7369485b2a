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
             not f.startswith(("chord/data/", "chord/bench/suites/", "chord/bench/baselines/"))]
    assert not stray, f"data files in the package outside chord/data: {stray}"


def test_the_workbench_reads_only_shipped_files():
    from chord.workbench import data

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
