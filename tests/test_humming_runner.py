"""The runner of upstream Humming never imports the name `humming` in Chord's process (Chord ships
its own `humming` root): only its worker, a child process, does. Checked from the source (nothing
chord.lab.bench.humming_baseline imports, directly or through other modules, imports `humming`) and
at run time (its in-process functions, with the child mocked and with a real child on a fake
upstream install, leave sys.modules without `humming`)."""
import subprocess
import sys
from pathlib import Path

from test_import_cycles import import_graph

ROOT = Path(__file__).resolve().parents[1]
RUNNER = "chord.lab.bench.humming_baseline"


def _reach(graph: dict, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def test_nothing_the_runner_imports_imports_humming():
    graph = import_graph()
    reached = _reach(graph, RUNNER)
    assert not [m for m in reached if m == "humming" or m.startswith("humming.")], sorted(reached)
    assert "chord.lab.bench.humming_worker" not in reached and "chord.lab.bench.vllm_sequence" not in reached
    # the worker is where upstream is imported: the check above is not vacuous
    assert [m for m in _reach(graph, "chord.lab.bench.humming_worker") if m.startswith("humming.")]


_IN_PROCESS = r"""
import json, subprocess, sys
from pathlib import Path

def humming_loaded():
    return sorted(m for m in sys.modules if m == "humming" or m.startswith("humming."))

assert humming_loaded() == [], humming_loaded()
from chord.lab.bench import humming_baseline as HB
from chord.lab.bench import runner
assert humming_loaded() == [], humming_loaded()
up, tmp = Path(sys.argv[1]), Path(sys.argv[2])

# the child mocked: it writes its rows where the command says
calls = []
def fake_run(cmd, env=None, cwd=None, capture_output=False, text=None):
    calls.append((cmd, env))
    out = Path(cmd[cmd.index("--json-out") + 1])
    out.write_text(json.dumps({"meta": {"humming_version": "0.1.20"}, "rows": [
        {"metric": "host_us_gate_up", "p50": 20.0, "p90": 25.0}, {"metric": "host_us_down", "p50": 18.0, "p90": 21.0},
        {"metric": "time_us", "p50": 7.0}]}))
    return subprocess.CompletedProcess(cmd, 0, "", "")
real_run = subprocess.run
subprocess.run = fake_run
rows = HB.host_time_rows(up, "tp8-m1", 10)
assert rows == [("upstream Humming humming_forward gate_up", 20.0, 25.0),
                ("upstream Humming humming_forward down", 18.0, 21.0)], rows
cmd, env = calls[-1]
assert cmd[:4] == [sys.executable, "-P", "-m", HB.WORKER] and "--host-time" in cmd
assert env["PYTHONPATH"].split(":")[0] == str(up.resolve())
opts = runner.BenchOptions(humming_dir=str(up), quick=True)
logged = []
rows, meta = runner.run_humming_subprocess(runner.load_suite().select("tp8-m1"), opts, tmp, logged.append)
assert meta["returncode"] == 0 and [r["metric"] for r in rows][-1] == "time_us" and logged
subprocess.run = real_run
assert humming_loaded() == [], humming_loaded()

# a real child on a fake upstream install of another version: it refuses, the parent reads that
out = tmp / "real.json"
cmd = HB.command(up, out, scenarios="tp8-m1")
rows, meta = HB.run_worker(cmd, HB.environment(up), out, capture=True, log=logged.append)
assert meta["returncode"] == HB.EXIT_WRONG_HUMMING and rows == [], meta
assert "version 0.1.19" in meta["stderr"] and "upstream humming not found" in logged[-1]
assert humming_loaded() == [], humming_loaded()
print("ok")
"""


def test_the_runners_in_process_functions_leave_humming_unimported(tmp_path):
    up = tmp_path / "up"
    (up / "humming" / "ops").mkdir(parents=True)
    (up / "humming" / "__init__.py").write_text("__version__ = '0.1.19'\nimport humming.ops\n")
    (up / "humming" / "ops" / "__init__.py").write_text("")
    p = subprocess.run([sys.executable, "-c", _IN_PROCESS, str(up), str(tmp_path)], cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


def test_the_childs_earlier_name_still_runs_the_worker(tmp_path):
    up = tmp_path / "up"
    (up / "humming").mkdir(parents=True)
    (up / "humming" / "__init__.py").write_text("__version__ = '0.1.19'\n")
    p = subprocess.run([sys.executable, "-m", RUNNER, "--humming-dir", str(up), "--json-out",
                        str(tmp_path / "o.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 3 and "humming_worker: refusing to run" in p.stderr, p.stderr
    assert not (tmp_path / "o.json").exists()  # refused before anything was written
