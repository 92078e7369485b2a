"""Where a GEMM pair's time goes, CTA by CTA: per-CTA time stamps (`chord stamps`).

    python -m chord.cli stamps --scenarios tp8-m1 --families indexed --out stamps-out

The scenario's gate_up and down (the bench's inputs, routing and schedules) run as stamped
builds (-DCHORD_STAMPS, csrc/common/stamps.cuh): every CTA writes its SM, %globaltimer at entry
and exit, and %clock64 at entry, after griddepcontrol.wait (PDL kernels), when its rows are in
shared memory, when the first K block of its ring has landed, when its first epilogue begins,
when it starts a split-K fix-up (the tile's last CTA) and when its last thread leaves. The pair
is captured into one CUDA graph between two one-thread marker kernels that read %globaltimer, and
replayed `reps` times with L2 flushed and the stamp buffers refilled before each replay, so each
replay is what `chord bench` times (a cold L2, kernels back to back, no host launches).

Per kernel and replay it reduces the records to:

* launch: from the end of what ran before (the first marker, or the last CTA of gate_up) to the
  first CTA's entry; ramp: from the first CTA's entry to the last one's; span: first entry to
  last exit; tail: the last exit after the median CTA's exit; end: the second marker after the
  last exit of down;
* per CTA (median and 90th percentile, from %clock64 at the clock the replay measured): setup
  (entry to rows, including the PDL wait), first data (rows to the first K block landed),
  streaming (first K block to the first epilogue), epilogue (to the CTA's exit) and fix-up (the
  last CTA of a split-K tile: fix-up start to exit);
* the kernel's floor bytes (weights and scales of the touched experts, activations in and out,
  chord.lab.bench.floors) over its span, in TB/s, and CTAs per SM.

The stamped pair's outputs are compared with the unstamped pair's, bit for bit, and both pairs
are timed as CUDA-graph replays with the bench's protocol, so the stamps' own cost is on the
page. Writes ``stamps.json`` (every replay's numbers), ``stamps.md`` (medians over replays) and
``ctas.csv`` (the last replay's raw records). Needs an sm_90 GPU.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import statistics
from contextlib import contextmanager
from pathlib import Path

SLOTS = 16  # 64-bit words per CTA (csrc/common/stamps.cuh kStampSlots)
ENTRY, ENTRY_CLK, WAIT_CLK, ROWS_CLK, FIRST_CLK, EPI_CLK, FIXUP_CLK, EXIT_CLK, EXIT, SM = range(10)
EARLIEST = (FIRST_CLK, EPI_CLK)  # slots written by atomicMin (filled with ~0 before a launch)
NONE = (1 << 64) - 1  # an "earliest" slot no thread reached
MAX_CTAS = 1 << 16  # records per kernel (a CTA past it records nothing)
PHASES = ("setup", "first_data", "streaming", "epilogue", "fixup")

_MARK_SOURCE = r'''
extern "C" __global__ void chord_stamp_mark(unsigned long long* t) {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(v));
  t[0] = v;
}
'''


class StampsError(RuntimeError):
    """A stamps run that cannot run here, or records that do not add up."""


def fill_pattern() -> list[int]:
    """One CTA's record before a launch: ~0 in the earliest-thread slots, 0 elsewhere."""
    return [NONE if i in EARLIEST else 0 for i in range(SLOTS)]


@dataclasses.dataclass
class KernelAnatomy:
    gemm: str
    schedule: str
    ctas: int
    sms: int
    max_ctas_per_sm: int
    ns_per_cycle: float
    launch_us: float
    ramp_us: float
    span_us: float
    tail_us: float
    bytes: int
    tb_s: float | None
    phases_us: dict  # phase -> {"p50": us, "p90": us, "ctas": count}
    fixup_ctas: int


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    i = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[i]


def reached(records: list[list[int]]) -> list[list[int]]:
    """The records of CTAs that ran (entry stamped)."""
    return [r for r in records if r[ENTRY] != 0]


def clock_ratio(records: list[list[int]]) -> float:
    """ns per %clock64 cycle over the CTAs: their globaltimer lifetimes over their cycle lifetimes
    (summed, so a coarse globaltimer step averages out)."""
    ns = sum(r[EXIT] - r[ENTRY] for r in records)
    cyc = sum(r[EXIT_CLK] - r[ENTRY_CLK] for r in records)
    if cyc <= 0 or ns <= 0:
        raise StampsError(f"the stamps give no clock: {ns} ns over {cyc} cycles in {len(records)} CTAs")
    return ns / cyc


def cta_phases(r: list[int], ns_per_cycle: float) -> dict:
    """One CTA's phases in us (chord.lab.stamps module doc); a phase its kernel has no stamp for
    (no rows stamp in a persistent kernel, no fix-up in most CTAs) is left out."""
    us = ns_per_cycle / 1000.0
    out = {}
    rows = r[ROWS_CLK] or None
    first = r[FIRST_CLK] if r[FIRST_CLK] != NONE else None
    epi = r[EPI_CLK] if r[EPI_CLK] != NONE else None
    if rows:
        out["setup"] = (rows - r[ENTRY_CLK]) * us
        if first is not None:
            out["first_data"] = (first - rows) * us
    if first is not None and epi is not None:
        out["streaming"] = (epi - first) * us
    if epi is not None:
        out["epilogue"] = (r[EXIT_CLK] - epi) * us
    if r[FIXUP_CLK]:
        out["fixup"] = (r[EXIT_CLK] - r[FIXUP_CLK]) * us
    return out


def anatomy(gemm: str, schedule: str, records: list[list[int]], prev_end_ns: int, nbytes: int) -> KernelAnatomy:
    """One kernel's launch / ramp / span / tail and per-CTA phases from its stamp records (one per
    launched CTA, SLOTS words each, as the kernel left them); `prev_end_ns`: %globaltimer when what
    ran before it ended; `nbytes`: the bytes its floor moves."""
    rs = reached(records)
    if not rs:
        raise StampsError(f"{gemm} ({schedule}): no CTA wrote a stamp (is it a stamped build?)")
    bad = [i for i, r in enumerate(rs) if r[EXIT] < r[ENTRY] or r[EXIT_CLK] < r[ENTRY_CLK]]
    if bad:
        raise StampsError(f"{gemm} ({schedule}): {len(bad)} CTAs left before they entered (first: record {bad[0]})")
    ratio = clock_ratio(rs)
    entries = [r[ENTRY] for r in rs]
    exits = [r[EXIT] for r in rs]
    per_sm: dict[int, int] = {}
    for r in rs:
        per_sm[r[SM]] = per_sm.get(r[SM], 0) + 1
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    for r in rs:
        for k, v in cta_phases(r, ratio).items():
            phases[k].append(v)
    span_ns = max(exits) - min(entries)
    return KernelAnatomy(
        gemm=gemm, schedule=schedule, ctas=len(rs), sms=len(per_sm), max_ctas_per_sm=max(per_sm.values()),
        ns_per_cycle=ratio, launch_us=(min(entries) - prev_end_ns) / 1000.0,
        ramp_us=(max(entries) - min(entries)) / 1000.0, span_us=span_ns / 1000.0,
        tail_us=(max(exits) - statistics.median(exits)) / 1000.0, bytes=nbytes,
        tb_s=nbytes / span_ns / 1000.0 if span_ns > 0 else None,
        phases_us={k: {"p50": _q(v, 0.5), "p90": _q(v, 0.9), "ctas": len(v)} for k, v in phases.items() if v},
        fixup_ctas=len(phases["fixup"]))


def order_violations(records: list[list[int]]) -> list[str]:
    """Records whose stamps are out of their order in the kernel (entry <= PDL wait <= rows <=
    first K block <= epilogue <= fix-up <= exit on the CTA's SM clock): empty for a sound build."""
    bad = []
    for i, r in enumerate(reached(records)):
        seq = [("entry", r[ENTRY_CLK]), ("wait", r[WAIT_CLK] or None), ("rows", r[ROWS_CLK] or None),
               ("first", None if r[FIRST_CLK] == NONE else r[FIRST_CLK]),
               ("epilogue", None if r[EPI_CLK] == NONE else r[EPI_CLK]), ("fixup", r[FIXUP_CLK] or None),
               ("exit", r[EXIT_CLK])]
        seen = [(n, v) for n, v in seq if v is not None]
        for (n0, v0), (n1, v1) in zip(seen, seen[1:]):
            if v1 < v0:
                bad.append(f"CTA {i}: {n1} ({v1}) before {n0} ({v0})")
                break
    return bad


def timer_step_ns(records: list[list[int]]) -> int | None:
    """The smallest step between distinct %globaltimer values of the records (its resolution as
    this GPU runs it), or None with fewer than two distinct values."""
    vals = sorted({v for r in records for v in (r[ENTRY], r[EXIT]) if v})
    steps = [b - a for a, b in zip(vals, vals[1:]) if b > a]
    return min(steps) if steps else None


def replay_anatomy(marks: tuple[int, int], gate_up: tuple[str, list], down: tuple[str, list],
                   nbytes: tuple[int, int]) -> dict:
    """One replay: both kernels' anatomies (down's launch counted from gate_up's last exit) and
    the second marker's gap after down, in us."""
    gu = anatomy("gate_up", gate_up[0], gate_up[1], marks[0], nbytes[0])
    gu_end = max(r[EXIT] for r in reached(gate_up[1]))
    dn = anatomy("down", down[0], down[1], gu_end, nbytes[1])
    dn_end = max(r[EXIT] for r in reached(down[1]))
    return {"gate_up": dataclasses.asdict(gu), "down": dataclasses.asdict(dn),
            "end_us": (marks[1] - dn_end) / 1000.0, "pair_us": (marks[1] - marks[0]) / 1000.0,
            "timer_step_ns": timer_step_ns(gate_up[1] + down[1])}


def summarize(replays: list[dict]) -> dict:
    """Medians over replays of every number of replay_anatomy."""
    def med(path):
        vals = []
        for r in replays:
            v = r
            for p in path:
                v = v.get(p) if isinstance(v, dict) else None
            if isinstance(v, (int, float)) and v == v:
                vals.append(v)
        return statistics.median(vals) if vals else None

    out = {"pair_us": med(("pair_us",)), "end_us": med(("end_us",)), "timer_step_ns": med(("timer_step_ns",))}
    for g in ("gate_up", "down"):
        d = {k: med((g, k)) for k in ("ctas", "sms", "max_ctas_per_sm", "ns_per_cycle", "launch_us", "ramp_us",
                                       "span_us", "tail_us", "tb_s", "fixup_ctas")}
        d["schedule"] = replays[0][g]["schedule"] if replays else None
        d["phases_us"] = {p: {"p50": med((g, "phases_us", p, "p50")), "p90": med((g, "phases_us", p, "p90"))}
                          for p in PHASES if any(p in r[g]["phases_us"] for r in replays)}
        out[g] = d
    return out


def _f(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def markdown(results: list[dict]) -> str:
    """The medians of every (scenario, family) as two tables: the kernels, and their CTAs' phases."""
    lines = ["| scenario | family | GEMM | schedule | CTAs | CTAs/SM | launch µs | ramp µs | span µs | tail µs | "
             "TB/s over span | pair µs (markers) | graph µs stamped / plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        s = res["summary"]
        for g in ("gate_up", "down"):
            d = s[g]
            lines.append(f"| {res['scenario']} | {res['family']} | {g} | `{d['schedule']}` | {_f(d['ctas'], 0)} | "
                         f"{_f(d['max_ctas_per_sm'], 0)} | {_f(d['launch_us'])} | {_f(d['ramp_us'])} | "
                         f"{_f(d['span_us'])} | {_f(d['tail_us'])} | {_f(d['tb_s'])} | {_f(s['pair_us'])} | "
                         f"{_f(res['graph_us']['stamped'])} / {_f(res['graph_us']['plain'])} |")
    lines += ["", "| scenario | family | GEMM | " + " | ".join(f"{p} p50 / p90 µs" for p in PHASES) + " |",
              "|---|---|---|" + "---|" * len(PHASES)]
    for res in results:
        for g in ("gate_up", "down"):
            ph = res["summary"][g]["phases_us"]
            cells = [f"{_f(ph[p]['p50'])} / {_f(ph[p]['p90'])}" if p in ph else "-" for p in PHASES]
            lines.append(f"| {res['scenario']} | {res['family']} | {g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# the GPU side


class _Stamper:
    """While active (chord.jit.STAMP_HOOK): gives each stamped kernel chord.ops loads its own
    record buffer (set into the module's globals once, before any graph capture)."""

    def __init__(self, device) -> None:
        import torch

        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}
        self.fill = torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in fill_pattern()],
                                 dtype=torch.int64, device=device).repeat(MAX_CTAS, 1)

    def __call__(self, schedule, kernel) -> None:
        import torch

        if schedule.id in self.buffers:
            return
        if torch.cuda.is_current_stream_capturing():
            raise StampsError(f"{schedule.id}: a stamped kernel first seen inside a graph capture (run the pair "
                              "once before capturing it)")
        buf = self.fill.clone()
        dev = buf.device.index
        kernel.set_global(dev, "chord_stamp_buf", buf.data_ptr().to_bytes(8, "little"))
        kernel.set_global(dev, "chord_stamp_ctas", MAX_CTAS.to_bytes(4, "little"))
        self.buffers[schedule.id] = buf

    def refill(self) -> None:
        for buf in self.buffers.values():
            buf.copy_(self.fill)

    def records(self, schedule_id: str) -> list[list[int]]:
        rows = self.buffers[schedule_id].cpu().tolist()
        out = []
        for r in rows:
            if r[ENTRY] == 0:
                continue
            out.append([v & ((1 << 64) - 1) for v in r])
        return out


@contextmanager
def stamping(device):
    """chord.ops launches stamped builds inside (the C launch path is off meanwhile: its plans
    hold the unstamped functions); yields the _Stamper that owns the record buffers."""
    from chord import jit, launch

    if jit.STAMP_HOOK is not None:
        raise StampsError("stamping: already stamping (not reentrant)")
    was_fast = launch.MODULE is not None
    stamper = _Stamper(device)
    launch.fast_launch(False)
    jit.STAMP_HOOK = stamper
    try:
        yield stamper
    finally:
        jit.STAMP_HOOK = None
        launch.fast_launch(was_fast)


def _marker():
    from chord import jit

    return jit.compile_source(_MARK_SOURCE, "chord_stamp_mark", name="chord-stamp-mark")


def run_point(scenario: str, family: str, reps: int = 20, suite=None, profile_file: str | None = None,
              seed: int = 0) -> dict:
    """Stamps of one (scenario, family): every replay's anatomy, their medians, both graphs' times
    and the same-bits check of the stamped outputs."""
    import torch

    from chord.lab.bench import inputs as I
    from chord.lab.bench.floors import gemm_floor
    from chord.lab.bench.ceilings import Ceilings
    from chord.lab.bench.runner import ChordAPI, _chord_calls
    from chord.lab.bench.timing import bench, capture_graph, _FLUSH_BYTES
    from chord.schedule import gpu_profile_name

    if reps < 1:
        raise ValueError(f"stamps: reps must be >= 1, got {reps}")
    sc, w13, w2, data, fi = I.one_scenario(suite, scenario, family, seed, "cuda", who="stamps")
    prof = ChordAPI.profile(profile_file or gpu_profile_name(), sc)
    dev = data.device
    touched = I.describe_touched(data.topk_ids, sc.experts)["experts_touched"]
    unit = Ceilings(1.0, 1.0, "bytes only")  # the floors' bytes; their times are not used here
    gu_in = sc.m if family == "indexed" else sc.rows
    nbytes = (gemm_floor("gate_up", touched, sc.n_gate_up, sc.k_gate_up, sc.rows, gu_in, unit).bytes,
              gemm_floor("down", touched, sc.n_down, sc.k_down, sc.rows, sc.rows, unit).bytes)

    gate_up, down, gu_out, dn_out, info = _chord_calls(family, sc, data, fi, w13, w2, prof)
    gate_up()
    down()
    torch.cuda.synchronize()
    want = (gu_out.clone(), dn_out.clone())
    plain_us = bench(lambda: (gate_up(), down()), graph=True).p50

    mark = _marker()
    marks = torch.zeros(2, dtype=torch.int64, device=dev)
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device=dev)

    def marker(i: int) -> None:
        mark.launch((1, 1, 1), (1, 1, 1), (marks.data_ptr() + 8 * i).to_bytes(8, "little"), dev.index,
                    torch.cuda.current_stream().cuda_stream)

    replays = []
    with stamping(dev) as st:
        gu_out.fill_(float("nan"))
        dn_out.fill_(float("nan"))
        gate_up()
        down()
        torch.cuda.synchronize()
        same = bool(torch.equal(gu_out, want[0]) and torch.equal(dn_out, want[1]))
        sids = (info["schedule_gate_up"], info["schedule_down"])
        missing = [s for s in sids if s not in st.buffers]
        if missing:
            raise StampsError(f"stamps: no stamped kernel was launched for {missing}")
        stamped_us = bench(lambda: (gate_up(), down()), graph=True).p50
        graph = capture_graph(lambda: (marker(0), gate_up(), down(), marker(1)))
        for _ in range(reps):
            flush.zero_()
            st.refill()
            marks.zero_()
            graph.replay()
            torch.cuda.synchronize()
            m = marks.cpu().tolist()
            for sid in sids:
                bad = order_violations(st.records(sid))
                if bad:
                    raise StampsError(f"{sid}: {len(bad)} CTAs' stamps are out of order, e.g. {bad[0]}")
            replays.append(replay_anatomy((m[0], m[1]), (sids[0], st.records(sids[0])), (sids[1], st.records(sids[1])),
                                          nbytes))
        last = {sids[0]: st.records(sids[0]), sids[1]: st.records(sids[1])}
    return {"scenario": scenario, "family": family, "schedules": {"gate_up": sids[0], "down": sids[1]},
            "experts_touched": touched, "floor_bytes": {"gate_up": nbytes[0], "down": nbytes[1]},
            "same_bits": same, "graph_us": {"stamped": stamped_us, "plain": plain_us}, "reps": reps,
            "summary": summarize(replays), "replays": replays, "_last": last}


def run(out_dir="stamps-out", *, suite=None, scenarios=None, families=None, reps: int = 20,
        profile_file: str | None = None) -> list[dict]:
    """Every (scenario, family) point of the selection (chord.lab.limits.select_points); writes
    stamps.json, stamps.md and ctas.csv into out_dir. Raises StampsError when a stamped pair's
    outputs differ from the plain pair's."""
    import torch

    from chord.lab.limits import select_points

    points = select_points(suite, scenarios, families)  # a bad scenario / family says so first, GPU or not
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"stamps: reps must be an int >= 1, got {reps!r}")
    if not torch.cuda.is_available():
        raise StampsError("stamps: needs a CUDA GPU (sm_90); none is visible to torch")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = [run_point(scenario, family, reps, suite, profile_file) for scenario, family in points]
    with open(out / "ctas.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "family", "schedule", "cta", "sm", "entry_ns", "exit_ns", "entry_clk", "wait_clk",
                    "rows_clk", "first_clk", "epilogue_clk", "fixup_clk", "exit_clk"])
        for res in results:
            for sid, recs in res.pop("_last").items():
                for i, r in enumerate(recs):
                    w.writerow([res["scenario"], res["family"], sid, i, r[SM], r[ENTRY], r[EXIT], r[ENTRY_CLK],
                                r[WAIT_CLK], r[ROWS_CLK], "" if r[FIRST_CLK] == NONE else r[FIRST_CLK],
                                "" if r[EPI_CLK] == NONE else r[EPI_CLK], r[FIXUP_CLK], r[EXIT_CLK]])
    from chord.lab.bench.runner import git_commit

    meta = {"gpu": torch.cuda.get_device_name(), "commit": git_commit()}
    (out / "stamps.json").write_text(json.dumps({"meta": meta, "points": results}, indent=1))
    (out / "stamps.md").write_text(markdown(results))
    bad = [f"{r['scenario']} {r['family']}" for r in results if not r["same_bits"]]
    if bad:
        raise StampsError(f"stamps: the stamped kernels' outputs differ from the plain ones at {', '.join(bad)}")
    return results
