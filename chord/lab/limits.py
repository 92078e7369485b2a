"""What limits each GEMM of the suite: Nsight Compute counters per kernel (`chord limits`).

    python -m chord.cli limits --out limits-out                      # every suite point
    python -m chord.cli limits --scenarios ep8-decode-tok1 --families indexed

One `ncu --clock-control none --profile-from-start off` subprocess runs every selected (scenario,
family) point with the bench's inputs, routing and schedules (`chord.lab.capture`): each point's
gate_up and down run once as a warm-up, then once each between cudaProfilerStart / Stop, so ncu
sees exactly one Chord kernel per GEMM, in the order the worker writes to its manifest. The
report is read back as its raw page (`ncu --import --csv --page raw --print-units base`) and
reduced, per kernel, to what says where the time goes:

* duration, SM clock (the GPU runs at its power cap on the big prefill tiles, so a kernel can be
  slower at the same cycle count), DRAM bytes read and their rate (% of the DRAM peak), L2 bytes,
  and the DRAM bytes over the bytes the GEMM has to move at least (`chord.lab.bench.floors`);
* issue slots busy, the tensor pipe's busiest counter, achieved occupancy, CTAs per SM and the
  limit that sets it (registers / shared memory / warps), waves;
* the three largest warp stall reasons (cycles per issued instruction);
* a one-word limiter by fixed thresholds (:func:`limiter`): ``hbm``, ``tensor``, ``issue`` or
  ``latency:<largest stall>``.

Writes ``limits.json`` (every row with every raw metric kept), ``limits.md`` (the table) and
the raw CSV into ``--out``. Needs an sm_90 GPU and Nsight Compute (`chord.lab.capture.find_tool`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import subprocess
import sys
from pathlib import Path

from chord import _env
from chord.lab.capture import CaptureError, _tool_binary

# sections whose raw metrics hold everything below; each name exists in every Nsight Compute
# since 2023 (a missing one would fail the whole run, so no version-specific metric names here)
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "WarpStateStats", "LaunchStats",
            "Occupancy")
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "smsp__inst_executed.sum")

# limiter thresholds (percent of peak): HBM-bound from this DRAM throughput on, tensor- or
# issue-bound from these pipe / issue utilizations on; otherwise the kernel waits on latency
HBM_PCT, TENSOR_PCT, ISSUE_PCT = 75.0, 60.0, 60.0

_STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$")
_TENSOR = re.compile(r"^sm__(?:pipe_tensor\w*|inst_executed_pipe_tensor\w*)\.avg\.pct_of_peak_sustained_active$")


class LimitsError(CaptureError):
    """A limits run that cannot run here or whose report does not match what the worker ran."""


@dataclasses.dataclass
class KernelLimits:
    scenario: str
    family: str
    gemm: str
    schedule: str
    duration_us: float | None
    sm_clock_ghz: float | None
    dram_read_mb: float | None
    dram_tb_s: float | None
    dram_pct: float | None
    floor_mb: float | None
    traffic_ratio: float | None  # DRAM bytes read / the floor's bytes
    l2_mb: float | None
    issue_pct: float | None
    tensor_pct: float | None
    tensor_metric: str | None
    occupancy_pct: float | None
    ctas_per_sm: int | None
    cta_limit: str | None
    waves: float | None
    registers: int | None
    inst_executed_m: float | None
    stalls: list  # [(reason, cycles per issued instruction)], largest first, top 3
    limiter: str
    raw: dict

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _num(v) -> float | None:
    if v is None:
        return None
    s = str(v).strip().replace(",", "")
    if s in ("", "n/a", "N/A", "nan"):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def parse_raw_csv(text: str) -> list[dict]:
    """Rows of ``ncu --import --csv --page raw``: one dict per profiled kernel, header -> value.

    The raw page's second line holds the units (``--print-units base``: bytes, ns, Hz, %); it is
    recognised by its empty ID field and dropped. Lines ncu prints before the header (``==PROF==``)
    are skipped."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    head, body = rows[0], rows[1:]
    out = []
    for r in body:
        d = dict(zip(head, r))
        if not str(d.get("ID", "")).strip():
            continue  # the units row
        out.append(d)
    return out


def _first(raw: dict, *names):
    for n in names:
        v = _num(raw.get(n))
        if v is not None:
            return v
    return None


def limiter(dram_pct, tensor_pct, issue_pct, stalls) -> str:
    """One word for what bounds a kernel, by the module's fixed thresholds (in this order)."""
    if dram_pct is not None and dram_pct >= HBM_PCT:
        return "hbm"
    if tensor_pct is not None and tensor_pct >= TENSOR_PCT:
        return "tensor"
    if issue_pct is not None and issue_pct >= ISSUE_PCT:
        return "issue"
    return f"latency:{stalls[0][0]}" if stalls else "latency"


def reduce_row(raw: dict, scenario: str, family: str, gemm: str, schedule: str,
               floor_bytes: int | None = None) -> KernelLimits:
    """The per-kernel figures of one raw-page row (base units: ns, bytes, Hz, %)."""
    dur_ns = _first(raw, "gpu__time_duration.sum")
    # (ncu 2025.3's sections report the GPC clock and executed instructions per active cycle, not
    # the SM clock and issue slots: those are the fallbacks; an SM executes at most 4 per cycle)
    clock = _first(raw, "sm__cycles_elapsed.avg.per_second", "smsp__cycles_elapsed.avg.per_second",
                   "gpc__cycles_elapsed.avg.per_second")
    rd = _first(raw, "dram__bytes_read.sum")
    dram_pct = _first(raw, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                      "dram__throughput.avg.pct_of_peak_sustained_elapsed")
    l2 = _first(raw, "lts__t_bytes.sum")
    issue = _first(raw, "sm__inst_issued.avg.pct_of_peak_sustained_active",
                   "smsp__issue_active.avg.pct_of_peak_sustained_active")
    if issue is None and (ipc := _first(raw, "sm__inst_executed.avg.per_cycle_active")) is not None:
        issue = 100.0 * ipc / 4
    tensor, tmetric = None, None
    for k, v in raw.items():
        if _TENSOR.match(k) and _num(v) is not None and (tensor is None or _num(v) > tensor):
            tensor, tmetric = _num(v), k
    stalls = sorted(((m.group(1), _num(v)) for k, v in raw.items() if (m := _STALL.match(k)) and _num(v) is not None
                     and m.group(1) not in ("selected",)), key=lambda t: -t[1])[:3]
    limits = {name: _first(raw, f"launch__occupancy_limit_{name}") for name in ("registers", "shared_mem", "warps",
                                                                               "blocks")}
    known = {k: v for k, v in limits.items() if v is not None}
    ctas = int(min(known.values())) if known else None
    cta_limit = ",".join(k for k, v in known.items() if v == ctas) if known else None
    inst = _first(raw, "smsp__inst_executed.sum")
    return KernelLimits(
        scenario=scenario, family=family, gemm=gemm, schedule=schedule,
        duration_us=dur_ns / 1e3 if dur_ns is not None else None,
        sm_clock_ghz=clock / 1e9 if clock is not None else None,
        dram_read_mb=rd / 1e6 if rd is not None else None,
        dram_tb_s=rd / dur_ns / 1e3 if rd is not None and dur_ns else None,
        dram_pct=dram_pct,
        floor_mb=floor_bytes / 1e6 if floor_bytes else None,
        traffic_ratio=rd / floor_bytes if rd is not None and floor_bytes else None,
        l2_mb=l2 / 1e6 if l2 is not None else None,
        issue_pct=issue, tensor_pct=tensor, tensor_metric=tmetric,
        occupancy_pct=_first(raw, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        ctas_per_sm=ctas, cta_limit=cta_limit,
        waves=_first(raw, "launch__waves_per_multiprocessor"),
        registers=int(r) if (r := _first(raw, "launch__registers_per_thread")) is not None else None,
        inst_executed_m=inst / 1e6 if inst is not None else None,
        stalls=[list(s) for s in stalls],
        limiter=limiter(dram_pct, tensor, issue, stalls),
        raw=raw,
    )


def match_manifest(raw_rows: list[dict], manifest: list[dict]) -> list[KernelLimits]:
    """Pair the report's kernels (in launch order) with what the worker launched, one each."""
    rows = sorted(raw_rows, key=lambda r: int(_num(r.get("ID")) or 0))
    if len(rows) != len(manifest):
        raise LimitsError(f"the ncu report holds {len(rows)} Chord kernels but the worker launched {len(manifest)} "
                          "GEMMs between cudaProfilerStart/Stop (one kernel each); the report cannot be attributed")
    out = []
    for raw, m in zip(rows, manifest):
        name = raw.get("Kernel Name", "")
        if name and "chord_w4a16_kernel" not in name:
            raise LimitsError(f"ncu profiled kernel {name!r} for {m['scenario']} {m['family']} {m['gemm']}; expected "
                              "chord_w4a16_kernel")
        out.append(reduce_row(raw, m["scenario"], m["family"], m["gemm"], m["schedule"], m.get("floor_bytes")))
    return out


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(rows: list[KernelLimits]) -> str:
    head = ("| scenario | family | GEMM | schedule | µs | SM GHz | DRAM TB/s (% peak) | DRAM / floor bytes | L2 MB | "
            "issue % | tensor % | warps % | CTAs/SM (limit) | waves | top stalls (cycles/inst) | limiter |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        stalls = ", ".join(f"{n} {c:.1f}" for n, c in r.stalls) or "-"
        lines.append(f"| {r.scenario} | {r.family} | {r.gemm} | `{r.schedule}` | {_fmt(r.duration_us, '.1f')} | "
                     f"{_fmt(r.sm_clock_ghz, '.2f')} | {_fmt(r.dram_tb_s, '.2f')} ({_fmt(r.dram_pct, '.0f')}) | "
                     f"{_fmt(r.traffic_ratio, '.2f')} | {_fmt(r.l2_mb, '.0f')} | {_fmt(r.issue_pct, '.0f')} | "
                     f"{_fmt(r.tensor_pct, '.0f')} | {_fmt(r.occupancy_pct, '.0f')} | "
                     f"{_fmt(r.ctas_per_sm, 'd')} ({r.cta_limit or '-'}) | {_fmt(r.waves, '.2f')} | {stalls} | "
                     f"{r.limiter} |")
    return "\n".join(lines) + "\n"


def select_points(suite=None, scenarios=None, families=None) -> list[tuple[str, str]]:
    """(scenario id, family) of the suite selection, in suite order (unknown names raise)."""
    from chord.lab.bench.suite import load_suite

    return [(sc.id, fam) for sc, fams in load_suite(suite).select(scenarios, families) for fam in fams]


def _worker(points: list[tuple[str, str]], manifest_path: Path, suite, profile_file) -> None:
    """Run each point's gate_up + down once warm, then once each inside a profiler range."""
    import gc

    import torch

    from chord.lab.bench import floors as F
    from chord.lab.bench import inputs as I
    from chord.lab.bench.runner import ChordAPI, _chord_calls
    from chord.lab.bench.ceilings import Ceilings
    from chord.schedule import gpu_profile_name

    ceil = Ceilings(1.0, 1.0, "unused: only the floor's byte count is kept")
    with manifest_path.open("w") as mf:
        for scenario, family in points:
            sc, w13, w2, data, fi = I.one_scenario(suite, scenario, family, 0, "cuda", who="limits")
            prof = ChordAPI.profile(profile_file or gpu_profile_name(), sc)
            gate_up, down, _gu, _dn, info = _chord_calls(family, sc, data, fi, w13, w2, prof)
            touched = I.describe_touched(data.topk_ids, sc.experts)["experts_touched"]
            fl = F.scenario_floor(sc, ceil, touched, family)
            gate_up()
            down()
            torch.cuda.synchronize()
            for gemm, fn in (("gate_up", gate_up), ("down", down)):
                torch.cuda.profiler.start()
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                mf.write(json.dumps({"scenario": scenario, "family": family, "gemm": gemm,
                                     "schedule": info[f"schedule_{gemm}"],
                                     "floor_bytes": getattr(fl, gemm).bytes}) + "\n")
                mf.flush()
            del sc, w13, w2, data, fi, gate_up, down, _gu, _dn
            gc.collect()
            torch.cuda.empty_cache()


def run(out_dir: str | Path = "limits-out", *, suite=None, scenarios=None, families=None,
        profile_file: str | None = None) -> list[KernelLimits]:
    """Profile the selection under ncu in one subprocess and reduce its report (module docstring)."""
    points = select_points(suite, scenarios, families)  # a bad scenario / family says so first, GPU or not
    if not points:
        raise LimitsError("limits: the selection holds no (scenario, family) point")
    import torch

    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        raise LimitsError("limits: needs an sm_90 (Hopper) GPU and Nsight Compute; the recorded H200 run is in "
                          "the source repository's results/ folder (results/*-limits.md)")
    ncu = _tool_binary("ncu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest, rep = out / "manifest.jsonl", out / "limits"
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--kernel-name", "chord_w4a16_kernel",
           *[a for s in SECTIONS for a in ("--section", s)], "--metrics", ",".join(EXTRA_METRICS),
           "--force-overwrite", "-o", str(rep), sys.executable, "-m", "chord.lab.limits", "--worker",
           "--manifest", str(manifest), "--points", ",".join(f"{s}:{f}" for s, f in points)]
    if suite:
        cmd += ["--suite", str(suite)]
    if profile_file:
        cmd += ["--profile", profile_file]
    with (out / "ncu.log").open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env.environ()).returncode
    if rc:
        raise LimitsError(f"ncu exited with {rc} (log {out / 'ncu.log'}):\n{(out / 'ncu.log').read_text()[-2000:]}")
    res = subprocess.run([ncu, "--import", str(rep) + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True)
    if res.returncode:
        raise LimitsError(f"ncu --import failed ({res.returncode}): {res.stderr[-2000:]}")
    (out / "raw.csv").write_text(res.stdout)
    man = [json.loads(ln) for ln in manifest.read_text().splitlines() if ln.strip()]
    rows = match_manifest(parse_raw_csv(res.stdout), man)
    (out / "limits.json").write_text(json.dumps({"tool": ncu, "sections": SECTIONS, "thresholds":
                                                 {"hbm_pct": HBM_PCT, "tensor_pct": TENSOR_PCT, "issue_pct": ISSUE_PCT},
                                                 "rows": [r.as_dict() for r in rows]}, indent=1) + "\n")
    (out / "limits.md").write_text(markdown(rows))
    return rows


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m chord.lab.limits", description="the ncu worker of `chord limits`")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--points", required=True, help="comma-separated scenario:family")
    p.add_argument("--suite", default=None)
    p.add_argument("--profile", default=None)
    a = p.parse_args(argv)
    points = [tuple(x.split(":", 1)) for x in a.points.split(",") if x]
    _worker(points, Path(a.manifest), a.suite, a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
