"""Upstream Humming (humming-kernels 0.1.20) as Chord's baseline: the side that runs in Chord's process.

Chord ships its own ``humming`` package (the vLLM-facing root) under the import name upstream
uses, so upstream can only run in a process of its own whose ``sys.path`` starts with its install
folder. This module is what ``chord bench --humming-dir`` and ``chord bench --host-time`` use in
their own process: it builds the child's command line (:func:`command`) and environment
(:func:`environment`), spawns it and reads its JSON rows back (:func:`run_worker`,
:func:`host_time_rows`). It never imports ``humming``, Chord's or upstream's, nor a module that
does (``tests/test_humming_runner.py`` checks both): everything that imports upstream ``humming``
is in :mod:`chord.lab.bench.humming_worker`, which runs only in the child.

``python -m chord.lab.bench.humming_baseline ...`` (the child's earlier name) still runs the worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

UPSTREAM_VERSION = "0.1.20"
PROVIDER = f"humming-{UPSTREAM_VERSION}"
#: the worker's exit status when ``import humming`` does not give upstream from --humming-dir
EXIT_WRONG_HUMMING = 3
#: the child's module (``python -P -m WORKER``)
WORKER = "chord.lab.bench.humming_worker"


def command(humming_dir: str | os.PathLike, json_out: str | os.PathLike, *, scenarios: str,
            families: str | None = None, suite: str | os.PathLike | None = None, seed: int = 0,
            warmup_ms: float | None = None, rep_ms: float | None = None, check_rows: int | None = None,
            codes: str | None = None, tuning_rows: str | None = None, cuda_graph: bool = True,
            extra: Sequence[str] = ()) -> list[str]:
    """The worker's command line: ``python -P -m chord.lab.bench.humming_worker --humming-dir DIR ...``
    (``-P``: the current folder, which may hold Chord's ``humming``, is not put on the path)."""
    cmd = [sys.executable, "-P", "-m", WORKER, "--humming-dir", str(humming_dir), "--scenarios", scenarios,
           "--seed", str(seed), "--json-out", str(json_out)]
    for flag, value in (("--warmup-ms", warmup_ms), ("--rep-ms", rep_ms), ("--check-rows", check_rows),
                        ("--codes", codes), ("--tuning-rows", tuning_rows), ("--suite", suite),
                        ("--families", families)):
        if value is not None:
            cmd += [flag, str(value)]
    if not cuda_graph:
        cmd += ["--no-cuda-graph"]
    return cmd + list(extra)


def environment(humming_dir: str | os.PathLike) -> dict:
    """The worker's environment: this process's (``chord._env.environ()``: a ``chord bench
    --policy`` included) with ``PYTHONPATH`` = the upstream folder first, then the folder that
    holds the ``chord`` package, then what was there."""
    import chord
    from chord import _env

    chord_root = str(Path(chord.__file__).resolve().parents[1])
    env = _env.environ()
    parts = [str(Path(humming_dir).expanduser().resolve()), chord_root]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def run_worker(cmd: Sequence[str], env: dict, json_out: str | os.PathLike, *, cwd: str | os.PathLike | None = None,
               capture: bool = False, log: Callable[[str], None] | None = None) -> tuple[list[dict], dict]:
    """Runs the worker and reads its rows back: ``(rows, meta)``, meta with the exit status
    (``returncode``) and, with ``capture``, the end of its stderr (``stderr``). A worker that wrote
    nothing gives no rows; a failed one is said through `log` (upstream not found: exit status 3)."""
    proc = subprocess.run(list(cmd), env=env, cwd=None if cwd is None else str(cwd), capture_output=capture,
                          text=True if capture else None)
    path = Path(json_out)
    data = json.loads(path.read_text()) if path.exists() else {"meta": {}, "rows": []}
    meta = dict(data.get("meta") or {})
    meta["returncode"] = proc.returncode
    if capture:
        meta["stderr"] = (proc.stderr or "")[-3000:]
    if proc.returncode != 0 and log is not None:
        log(f"humming: the baseline subprocess exited with status {proc.returncode}"
            + (" (upstream humming not found where --humming-dir says)"
               if proc.returncode == EXIT_WRONG_HUMMING else ""))
    return list(data.get("rows") or []), meta


def host_time_rows(humming_dir: str | os.PathLike, scenario: str, calls: int) -> list[tuple[str, float, float]]:
    """Upstream ``humming_forward``'s host time per call in the worker, same scenario, seed and
    calls as Chord's (``--host-time``): ``[(name, median us, p90 us)]`` for gate_up and down.
    Raises RuntimeError with the end of the worker's stderr when it fails."""
    with tempfile.TemporaryDirectory(prefix="chord-humming-") as tmp:
        out = Path(tmp) / "humming.json"
        cmd = command(humming_dir, out, scenarios=scenario, families="indexed", rep_ms=50, warmup_ms=20,
                      extra=["--host-time", "--host-calls", str(calls), "--no-split"])
        rows, meta = run_worker(cmd, environment(humming_dir), out, capture=True)
    if meta["returncode"] != 0:
        raise RuntimeError(f"upstream Humming worker failed ({meta['returncode']}):\n{meta.get('stderr', '')}")
    return [(f"upstream Humming humming_forward {r['metric'][len('host_us_'):]}", r["p50"], r.get("p90"))
            for r in rows if str(r.get("metric", "")).startswith("host_us_")]


if __name__ == "__main__":  # the child's earlier name: run the worker in this (child) process
    import runpy

    runpy.run_module(WORKER, run_name="__main__", alter_sys=True)
