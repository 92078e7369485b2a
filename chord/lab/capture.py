"""Profiler captures of the very calls the bench times, NVTX-annotated (`chord capture`).

    from chord.lab import capture
    cap = capture.capture("ep8-prefill-tok128", "indexed", tool="torch", out_dir="prof-out")
    cap.ranges      # one row per `chord/<op>[<schedule id>]` range: calls, GPU us per call
    cap.kernels     # one row per GPU kernel name: calls, GPU us per call

One scenario of the suite, one family: gate_up then down, with the inputs, routing and
schedules of `chord bench` (chord.lab.bench.runner), `iters` times after one warm-up pair. NVTX is
switched on for the capture, so every launch sits in a range named `chord/<op>[<schedule id>]`
(chord.profiling) inside an outer `chord/profile[<scenario> <family>]` range.

Tools:
* ``torch``: torch.profiler (CPU + CUDA activity) in this process; writes ``trace.json`` (Chrome
  trace, opens in Perfetto), ``summary.json`` and ``timeline.html``. The NVTX ranges are mirrored as
  record_function ranges, which torch.profiler does see.
* ``nsys``: ``nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi`` over ``chord capture
  --tool none`` in a subprocess (the warm-up pair runs before cudaProfilerStart); writes
  ``report.nsys-rep``, the ``nsys stats`` tables as CSV (``stats_<report>.csv``: NVTX ranges
  with their GPU projection, kernels, and the per-event traces) parsed into the capture's range
  and kernel tables, and ``timeline.html``. PATH, $CUDA_HOME and the usual Nsight folders are
  searched (:func:`find_tool`); on the H200 machine nsys is the copy bundled with Nsight Compute,
  and its report importer needs libdw/libelf on LD_LIBRARY_PATH (docs/profiling.md).
* ``ncu``: ``ncu --nvtx --clock-control none`` on the captured iterations' Chord kernels in a
  subprocess (``--set`` chooses the sections); writes ``report.ncu-rep`` and ``ncu.txt`` (the
  per-kernel summary). Validated on the H200 (2026-12-01, ``/usr/local/cuda/bin/ncu``).
* ``none``: only runs the calls (what the nsys/ncu subprocesses run).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from chord import _env
from chord.lab import timeline

TOOLS = ("torch", "nsys", "ncu", "none")


class CaptureError(RuntimeError):
    """A capture that cannot run here (no GPU, no profiler binary, a failed subprocess)."""


@dataclasses.dataclass
class Capture:
    scenario: str
    family: str
    tool: str
    iters: int
    schedules: dict  # {"gate_up": id, "down": id}
    ranges: list  # [{"range", "calls", "gpu_us_per_call", "gpu_us_total"}]
    kernels: list  # [{"kernel", "calls", "gpu_us_per_call", "gpu_us_total"}]
    files: dict  # name -> path written
    cuda_graph: bool = False  # the pairs were replays of one CUDA graph of the pair (as vLLM decodes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def expected_ranges(family: str, schedules: dict) -> set:
    """The range names a capture of these schedules must show (chord.profiling.range_name)."""
    from chord.profiling import range_name

    op = {"indexed": "gemm_indexed", "grouped_contiguous": "gemm_contiguous", "grouped_masked": "gemm_masked"}[family]
    return {range_name(op, sid) for sid in schedules.values()}


def merge_rows(rows: list[dict], key: str) -> list[dict]:
    """One row per name: torch.profiler reports a range twice, as the CPU-side annotation (which
    carries the GPU time of the kernels launched in it) and as its projection on the GPU
    timeline (no kernel time of its own); keep the larger count and time. Sorted by GPU time."""
    by: dict = {}
    for r in rows:
        m = by.setdefault(r[key], {key: r[key], "calls": 0, "gpu_us_total": 0.0})
        m["calls"] = max(m["calls"], int(r["calls"]))
        m["gpu_us_total"] = max(m["gpu_us_total"], float(r["gpu_us_total"]))
    out = sorted(by.values(), key=lambda r: -r["gpu_us_total"])
    for r in out:
        r["gpu_us_total"] = round(r["gpu_us_total"], 2)
        r["gpu_us_per_call"] = round(r["gpu_us_total"] / max(r["calls"], 1), 2)
    return out


def _calls(scenario: str, family: str, suite=None, profile_file: str | None = None, seed: int = 0):
    from chord.lab.bench import inputs as I
    from chord.lab.bench.runner import ChordAPI, _chord_calls
    from chord.schedule import gpu_profile_name

    sc, w13, w2, data, fi = I.one_scenario(suite, scenario, family, seed, "cuda", who="capture")
    prof = ChordAPI.profile(profile_file or gpu_profile_name(), sc)
    gate_up, down, _gu, _dn, info = _chord_calls(family, sc, data, fi, w13, w2, prof)
    return gate_up, down, {"gate_up": info["schedule_gate_up"], "down": info["schedule_down"]}


def run_calls(scenario: str, family: str, iters: int = 3, suite=None, profile_file: str | None = None,
              calls=None, cuda_graph: bool = False) -> dict:
    """Warm-up pair, then `iters` x (gate_up, down) with NVTX on; returns the schedule ids.
    `calls`: (gate_up, down, schedules) already built by _calls (so a profiler around this
    function sees no input preparation). `cuda_graph`: the pair is captured once into a CUDA
    graph (chord.lab.bench.timing.capture_graph, as `chord bench` times it and vLLM decodes) and
    the iterations are replays of it: the profile shows the kernels and the gaps between them
    without host launches (the per-GEMM NVTX ranges are then the capture's, outside the profile)."""
    import torch

    from chord import profiling
    from chord.lab.bench.timing import capture_graph

    gate_up, down, schedules = calls if calls is not None else _calls(scenario, family, suite, profile_file)
    was = profiling.nvtx_enabled()
    profiling.enable_nvtx(True)
    try:
        gate_up()
        down()
        if cuda_graph:
            graph = capture_graph(lambda: (gate_up(), down()))
            graph.replay()

            def pair():
                graph.replay()
        else:
            def pair():
                gate_up()
                down()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi: the warm-up stays outside
        try:
            with profiling.nvtx_range("profile", f"{scenario} {family}{' cuda-graph' if cuda_graph else ''}"):
                for _ in range(iters):
                    pair()
                torch.cuda.synchronize()
        finally:
            torch.cuda.profiler.stop()
    finally:
        profiling.enable_nvtx(was)
    return schedules


def _gpu_us(evt, self_only: bool = False) -> float:
    """GPU microseconds of a key_averages() event (torch renamed cuda_* to device_*)."""
    names = ("self_device_time_total", "self_cuda_time_total") if self_only else ("device_time_total", "cuda_time_total")
    for name in names:
        v = getattr(evt, name, None)
        if v:
            return float(v)
    return 0.0


def _torch_capture(scenario, family, iters, out_dir: Path, suite, profile_file, cuda_graph: bool = False) -> Capture:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from chord import profiling

    calls = _calls(scenario, family, suite, profile_file)
    torch.cuda.synchronize()
    profiling.record_function_ranges(True)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            schedules = run_calls(scenario, family, iters, calls=calls, cuda_graph=cuda_graph)
    finally:
        profiling.record_function_ranges(False)
    trace = out_dir / "trace.json"
    prof.export_chrome_trace(str(trace))
    ranges, kernels = [], []
    for evt in prof.key_averages():
        if evt.key.startswith("chord/"):
            total = _gpu_us(evt)
            ranges.append({"range": evt.key, "calls": int(evt.count), "gpu_us_total": round(total, 2),
                           "gpu_us_per_call": round(total / max(evt.count, 1), 2)})
        elif _gpu_us(evt, self_only=True) > 0 and not evt.key.startswith(("cuda", "Memcpy", "Memset")):
            total = _gpu_us(evt, self_only=True)
            kernels.append({"kernel": evt.key, "calls": int(evt.count), "gpu_us_total": round(total, 2),
                            "gpu_us_per_call": round(total / max(evt.count, 1), 2)})
    ranges = merge_rows(ranges, "range")
    kernels = merge_rows(kernels, "kernel")
    torch.cuda.synchronize()
    page = timeline.write_html(timeline.from_chrome_trace(trace), out_dir / "timeline.html",
                               f"chord capture {scenario} {family}{_graph_title(cuda_graph)} (torch.profiler)")
    return Capture(scenario, family, "torch", iters, schedules, ranges, kernels,
                   {"trace": str(trace), "timeline": str(page)}, cuda_graph)


def _graph_title(cuda_graph: bool) -> str:
    return ", CUDA-graph replays" if cuda_graph else ""


NSYS_REPORTS = ("nvtx_sum", "nvtx_gpu_proj_sum", "cuda_gpu_kern_sum", "cuda_gpu_trace", "nvtx_gpu_proj_trace")


def _nsys_tables(nsys: str, rep: Path, out: Path) -> dict:
    """``nsys stats`` of each report in NSYS_REPORTS as CSV (one call each: a report this nsys
    version lacks fails alone); returns report -> CSV path for those that were written."""
    files = {}
    with (out / "nsys-stats.log").open("w") as log:
        for r in NSYS_REPORTS:
            prefix = out / "stats"
            for stale in out.glob(f"stats*{r}.csv"):  # an earlier capture's table must not stand in for this one
                stale.unlink()
            subprocess.run([nsys, "stats", "--report", r, "--format", "csv", "--force-export", "true",
                            "--force-overwrite", "true", "--output", str(prefix), str(rep)],
                           stdout=log, stderr=subprocess.STDOUT)
            # nsys names the file <prefix>_<report>.csv (older versions: other separators)
            hits = sorted(p for p in out.glob(f"stats*{r}.csv") if p.stat().st_size)
            if hits:
                files[r] = hits[0]
    return files


def _range_name(name: str) -> str:
    """An NVTX range as nsys names it ("<domain>:<name>", e.g. "chord:chord/gemm_masked[...]")
    without the domain."""
    i = name.find("chord/")
    return name[i:] if i > 0 else name.lstrip(":")


def _nsys_summary_rows(path: Path, key: str, only_chord: bool) -> list[dict]:
    """(name, calls, GPU µs) rows of an nsys ``*_sum`` CSV table."""
    rows = timeline.read_csv_table(path)
    if not rows:
        return []
    header = list(rows[0])
    name_col = next((h for h in header if h.strip().lower() in ("range", "name")), header[-1])
    total_col = next((h for h in header if "total" in h.lower() and "ns" in h.lower()), None)
    calls_col = next((h for h in header if "instances" in h.lower() or h.strip().lower() in ("count", "calls")), None)
    if total_col is None or calls_col is None:
        raise CaptureError(f"{path}: an nsys summary table needs a 'Total ... (ns)' and an 'Instances' column, "
                           f"got {header}")
    out = []
    for r in rows:
        name = _range_name(r[name_col])
        if only_chord and not name.startswith("chord/"):
            continue
        out.append({key: name, "calls": int(float(r[calls_col])), "gpu_us_total": float(r[total_col]) / 1e3})
    return merge_rows(out, key)


def _planned_schedules(scenario, family, suite, profile_file) -> dict:
    """The schedule ids the captured calls launch (host-side selection, as the bench makes it),
    for the tools that run the calls in a subprocess."""
    from chord.lab.bench import inputs as I
    from chord.lab.bench.runner import ChordAPI, scenario_schedules
    from chord.schedule import gpu_profile_name

    sc = I.scenario_for(suite, scenario, family, who="capture")
    s1, s2 = scenario_schedules(family, sc, ChordAPI.profile(profile_file or gpu_profile_name(), sc))
    return {"gate_up": s1.id, "down": s2.id}


def _self_command(scenario, family, iters, suite, profile_file, cuda_graph: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "chord.cli", "capture", "--tool", "none", "--scenario", scenario,
           "--family", family, "--iters", str(iters), *(["--cuda-graph"] if cuda_graph else [])]
    if suite:
        cmd += ["--suite", str(suite)]
    if profile_file:
        cmd += ["--profile", profile_file]
    return cmd


# where Nsight installs itself besides PATH (the CUDA toolkit's bundled copies, the standalone
# installers); the newest version wins
_TOOL_GLOBS = {
    "nsys": ("{cuda}/bin/nsys", "{cuda}/nsight-systems-*/bin/nsys", "/usr/local/cuda*/nsight-systems-*/bin/nsys",
             "/opt/nvidia/nsight-systems/*/bin/nsys", "/usr/lib/nsight-systems/bin/nsys",
             # the copy Nsight Compute bundles (the H200 machine has only this one)
             "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"),
    "ncu": ("{cuda}/bin/ncu", "{cuda}/nsight-compute-*/ncu", "/usr/local/cuda*/nsight-compute-*/ncu",
            "/opt/nvidia/nsight-compute/*/ncu", "/usr/lib/nsight-compute/ncu"),
}


def find_tool(name: str) -> str | None:
    """Path of `nsys` / `ncu`: PATH first, then $CUDA_HOME (or /usr/local/cuda) and the usual
    install folders, newest version first; None when there is none."""
    import glob

    path = shutil.which(name)
    if path:
        return path
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for pattern in _TOOL_GLOBS[name]:
        hits = sorted((p for p in glob.glob(pattern.format(cuda=cuda)) if os.access(p, os.X_OK)), reverse=True)
        if hits:
            return hits[0]
    return None


def _tool_binary(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise CaptureError(f"{name} not found on PATH, in $CUDA_HOME or the usual Nsight install folders: install "
                           f"Nsight {'Systems' if name == 'nsys' else 'Compute'} or use tool='torch'")
    return path


def _run(cmd: list[str], log: Path) -> None:
    env = _env.environ(CHORD_NVTX="1")
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc:
        tail = log.read_text()[-2000:]
        raise CaptureError(f"{Path(cmd[0]).name} exited with {rc} (log {log}):\n{tail}")


def capture(scenario: str, family: str = "indexed", tool: str = "torch", out_dir: str | Path = "prof-out", *,
            iters: int = 3, suite=None, profile_file: str | None = None, ncu_set: str = "basic",
            cuda_graph: bool = False) -> Capture:
    """Capture `iters` gate_up + down pairs of one suite scenario with `tool` into `out_dir`
    (`cuda_graph`: as replays of one CUDA graph of the pair, run_calls)."""
    if tool not in TOOLS:
        raise ValueError(f"capture: tool must be one of {TOOLS}, got {tool!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"capture: iters must be a positive int, got {iters!r}")
    if not isinstance(cuda_graph, bool):
        raise ValueError(f"capture: cuda_graph must be a bool, got {cuda_graph!r}")
    import torch

    from chord.lab.bench.inputs import scenario_for

    scenario_for(suite, scenario, family, who="capture")  # a bad id or family says so, GPU or not
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        raise CaptureError("capture: needs an sm_90 (Hopper) GPU; the recorded H200 captures are in "
                           "chord/data/results (chord.lab.workbench.recorded_capture)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tool == "torch":
        cap = _torch_capture(scenario, family, iters, out, suite, profile_file, cuda_graph)
    elif tool == "none":
        schedules = run_calls(scenario, family, iters, suite, profile_file, cuda_graph=cuda_graph)
        cap = Capture(scenario, family, "none", iters, schedules, [], [], {}, cuda_graph)
    elif tool == "nsys":
        nsys = _tool_binary("nsys")
        rep = out / "report"
        # graph replays: each kernel node traced on its own (nsys's default traces a graph as one range)
        _run([nsys, "profile", "-t", "cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
              *(["--cuda-graph-trace=node"] if cuda_graph else []), "--force-overwrite", "true", "-o", str(rep),
              *_self_command(scenario, family, iters, suite, profile_file, cuda_graph)], out / "nsys.log")
        tables = _nsys_tables(nsys, Path(str(rep) + ".nsys-rep"), out)
        if "cuda_gpu_kern_sum" not in tables:
            raise CaptureError(f"nsys stats wrote no kernel table (see {out / 'nsys-stats.log'}; its importer needs "
                               "libdw/libelf: docs/profiling.md)")
        # GPU time per range: the GPU projection where this nsys has it, else the CPU-side range
        rng = tables.get("nvtx_gpu_proj_sum") or tables.get("nvtx_sum")
        ranges = _nsys_summary_rows(rng, "range", True) if rng else []
        kernels = _nsys_summary_rows(tables["cuda_gpu_kern_sum"], "kernel", False)
        page = timeline.write_html(timeline.from_nsys_traces(tables.get("cuda_gpu_trace"),
                                                             tables.get("nvtx_gpu_proj_trace")),
                                   out / "timeline.html",
                                   f"chord capture {scenario} {family}{_graph_title(cuda_graph)} (Nsight Systems)")
        cap = Capture(scenario, family, "nsys", iters, _planned_schedules(scenario, family, suite, profile_file),
                      ranges, kernels,
                      {"tool": nsys, "report": str(rep) + ".nsys-rep", "log": str(out / "nsys.log"),
                       "timeline": str(page), "range_table": "nvtx_gpu_proj_sum" if tables.get("nvtx_gpu_proj_sum")
                       else "nvtx_sum", **{f"stats_{k}": str(v) for k, v in tables.items()}}, cuda_graph)
    else:
        ncu = _tool_binary("ncu")
        rep = out / "report"
        # the warm-up pair's two launches are skipped (with cuda_graph also the capture's warm-up pair
        # and the first replay: ncu profiles a graph's kernel nodes one by one); then every Chord
        # kernel of the iterations
        _run([ncu, "--clock-control", "none", "--nvtx", "--kernel-name", "chord_w4a16_kernel", "--launch-skip",
              "6" if cuda_graph else "2",
              "--launch-count", str(2 * iters), "--set", ncu_set, "--force-overwrite", "-o", str(rep),
              *_self_command(scenario, family, iters, suite, profile_file, cuda_graph)], out / "ncu.log")
        with (out / "ncu.txt").open("w") as f:
            subprocess.run([ncu, "--import", str(rep) + ".ncu-rep", "--print-summary", "per-kernel"], stdout=f,
                           stderr=subprocess.STDOUT)
        cap = Capture(scenario, family, "ncu", iters, _planned_schedules(scenario, family, suite, profile_file), [], [],
                      {"tool": ncu, "report": str(rep) + ".ncu-rep",
                                                                    "summary": str(out / "ncu.txt")}, cuda_graph)
    (out / "summary.json").write_text(json.dumps(cap.as_dict(), indent=1) + "\n")
    cap.files["summary"] = str(out / "summary.json")
    return cap
