"""The lab's earlier import paths (chord.bench, chord.bench.suite, chord.workbench, chord.tune, ...)
still work for one release: the very module object of the new path under chord.lab, and a
DeprecationWarning naming that path, once per old name, pointing at the importing line."""
import subprocess
import sys
from pathlib import Path

import pytest

from chord import _moved

ROOT = Path(__file__).resolve().parents[1]

# every old name the README, docs/*.md or the notebooks of the last release used
OLD = ["chord.bench", "chord.bench.suite", "chord.bench.runner", "chord.bench.report", "chord.bench.inputs",
       "chord.bench.timing", "chord.bench.floors", "chord.bench.ceilings", "chord.bench.read_probe",
       "chord.bench.humming_baseline", "chord.workbench", "chord.workbench.figures", "chord.workbench.widgets",
       "chord.workbench.data", "chord.workbench.explore", "chord.workbench.captures", "chord.workbench.ablate",
       "chord.workbench.tables", "chord.workbench.compare", "chord.tune", "chord.capture", "chord.limits",
       "chord.timeline", "chord.doctor"]

_CHECK = r"""
import importlib, sys, warnings
old, new = sys.argv[1], sys.argv[2]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mod = importlib.import_module(old)
    again = importlib.import_module(old)
target = importlib.import_module(new)
assert mod is target is again and sys.modules[old] is target, (mod, target)
mine = [w for w in caught if issubclass(w.category, DeprecationWarning) and w.message.args[0].startswith(old + " ")]
assert len(mine) == 1, [str(w.message) for w in caught]
assert new in str(mine[0].message) and "next release" in str(mine[0].message)
print("ok")
"""


@pytest.mark.parametrize("old", OLD)
def test_an_old_path_is_the_new_module_with_one_warning(old):
    new = _moved.new_name(old)
    assert new == old.replace("chord.", "chord.lab.", 1)
    p = subprocess.run([sys.executable, "-c", _CHECK, old, new], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_the_usual_import_forms_and_where_the_warning_points(tmp_path):
    script = tmp_path / "user_code.py"
    script.write_text(
        "import warnings\nwarnings.simplefilter('always')\n"
        "import chord.bench.suite\n"
        "from chord.workbench import figures\n"
        "from chord.bench.suite import load_suite\n"
        "from chord import tune\n"
        "import chord.lab.bench.suite, chord.lab.workbench.figures, chord.lab.tune\n"
        "assert chord.bench.suite is chord.lab.bench.suite and figures is chord.lab.workbench.figures\n"
        "assert load_suite is chord.lab.bench.suite.load_suite and tune is chord.lab.tune\n"
        "print('ok')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # this checkout's chord
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    lines = [line for line in p.stderr.splitlines() if "DeprecationWarning" in line]
    assert all(line.startswith(f"{script}:") for line in lines), lines  # the user's import line, not importlib's
    named = {line.split("DeprecationWarning: ")[1].split()[0] for line in lines}
    assert named == {"chord.bench", "chord.bench.suite", "chord.workbench", "chord.tune"}, lines


def test_python_dash_m_of_an_old_name_runs_the_new_module(tmp_path):
    p = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "chord.bench.humming_worker",
                        "--humming-dir", str(tmp_path), "--json-out", str(tmp_path / "o.json")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 3 and "holds no 'humming' package" in p.stderr, p.stderr
    assert "import chord.lab.bench.humming_worker" in p.stderr


def test_other_names_are_left_alone():
    assert _moved.new_name("chord.ops") is None and _moved.new_name("chord.benchmarks") is None
    assert _moved.new_name("chord.lab.bench") is None and _moved.new_name("chord.cli") is None
    p = subprocess.run([sys.executable, "-c", "import chord.bench.no_such_module"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "No module named 'chord.bench.no_such_module'" in p.stderr, p.stderr
