"""`chord tune`: measure candidate schedules on the suite's shapes and write a profile.

For every scenario and family of a suite, and for each of its two GEMMs (gate_up, down), every
candidate schedule is checked and timed (CUDA-graph replay, do_bench median, L2 flushed), and
the fastest one becomes a rule of the profile:

* check: the current decision's output is checked against the float32 reference first
  (chord.lab.bench.inputs' tolerance). A candidate that runs the same per-thread arithmetic in the
  same order (`same_arithmetic`: the knobs change tiling, occupancy and pipelining, never the
  reduction order) must be **bit-identical** to it, so any difference is a bug, and the
  candidate is dropped and reported. One that sums in another order (split-K, stream-K, another
  main loop, folded group scales) must be within SPLIT_TOL of it or, failing that, within the
  bench's tolerance of the float32 reference itself.
* rules: per deployment and family, one rule per scenario point, bounded half-way (geometric
  mean) to the next point's rows per expert; the down GEMM gets its own rule when its K differs
  (``k_max``). The last rule of each family is unconditional.

The written profile keeps the measurements (device, date, command) in its `about` strings.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from pathlib import Path
from typing import Iterable

from chord import _env
from chord.schedule import (KNOB, MAX_SMEM_PER_CTA, WGMMA_BLOCK_MS, Problem, Schedule, load_profile, pairs_fit,
                            profile_for, select)

BLOCK_MS = (8, 16, 32, 64)
BN_WARPS = ((64, 4), (128, 4), (256, 4), (256, 8))
SPLITS = (2, 4, 8)
# stream-K candidates (indexed, below STREAM_K_MAX_ROWS rows per expert: TP8 1-64 tokens, where the
# tile grid of the touched experts fills few CTA slots): 8-row tiles, (block_n, stages)
STREAM_K_MAX_ROWS = 1
STREAM_K_TILES = ((64, 8), (64, 12), (128, 8), (128, 12), (256, 6))
STREAM_K_CTAS = (1, 2, 3)  # the grid is SMs x ctas_per_sm (chord.ops._resident_ctas)
SPLIT_TOL = 1e-3  # split-K / another main loop sum in another order: compared by relative error, not bits
# wgmma token tiles (chord.schedule.WGMMA_BLOCK_MS): any multiple of 8 is one instruction shape
# (m64nBTk16); 48/96/192 cut the padding where rows per expert sit between powers of two (TP8
# m4096: 85 rows per expert)
WGMMA_MIN_ROWS = 8.0  # below this many rows per expert the wgmma tile (64 features x >= 8 tokens) is not tried
# wgmma rasters tried at every rows-per-expert (was: raster 8 from 64 rows per expert only). Where
# the token tiles' activations overflow L2 a raster can pay (tp8-m1024: 8192 routed rows, 117 MB of
# activations; gate_up 324 -> 311 us with raster 4 in one H200 run,
# results/2026-12-01-h200-timing-ccd1a08-sustained-clock.json), but another machine's tune ranked
# raster 4 behind no raster (362 vs 345 us,
# results/2026-12-01-h200-tuning-ccd1a08-tok32-tp8m1024-warm100.json): within the run-to-run
# spread, so the tune decides.
RASTERS = (0, 4, 8)
# (producer, CTAs per SM) of the wgmma candidates. The first form of the warp-specialized producer
# timed 1.5-2.0x slower than the multistage loop at every prefill point of the tuning runs of
# 2026-12-01. Its second form (copy-engine weights, arriving gathers; docs/optimizations.md) was
# 0.91x its multistage twin on the 64-token tiles in the A/B of 2026-12-07 because ptxas had
# serialized their wgmmas for want of registers; with the producer keeping only what its gather
# needs (chord.knobs.wgmma_producer_regs) the same A/B gave 1.02-1.06x on the 64- and 128-token
# tiles and the suite pairs 1.3-4.4 % faster (H100, results/2026-12-07-h100-510523d-ws1-*), so it
# is a candidate again, at 1 CTA per SM (setmaxnreg needs it). A candidate ptxas serialized is
# dropped before timing (tune_schedules).
PRODUCER_CTAS = ((0, 1), (0, 2), (1, 1))
# (block_n, warps, group_steps) of the wgmma candidates: one 16-feature weight tile per warp
# (block_n 128 / 256 on 8 / 16 warps, one wgmma group per K block) and the wide warp tiles, 2 or 4
# weight tiles per warp with one or two k16 steps per group (docs/optimizations.md, "Wide warp
# tiles"); a tile whose accumulators and A registers exceed the budget is not a Schedule.
WGMMA_TILES = ((128, 8, 4), (256, 16, 4), (256, 8, 1), (256, 8, 2), (256, 4, 1), (256, 4, 2), (512, 8, 1), (512, 8, 2))
SHORT_K_BLOCKS = 8  # at most this many 64-wide K blocks: also try CTAs that walk several N blocks
# CTA pairs (cluster_n 2) and the TMA activation box (tma_x, grouped families) are tried on the
# raster-8 wgmma candidates, and the TMA box from this token tile up: measured on the H200
# (2026-12-01, chord/data/results/2026-12-01-h200-timing-37dd90f-bulk-tma-pairs.json) 2-4 % faster on
# 256-row tiles and with pairs on 32-row wide tiles, neutral to slower on 32-128-row tiles with TMA.
PAIR_RASTER = 8
TMA_X_MIN_BLOCK_M = 192
# L2 policies are tried on the raster-8 wgmma candidates of the indexed family, whose tiles
# gather token rows that the next expert a token is routed to reads again; the grouped families
# read each row once per N block, which the raster already keeps in L2. Only l2_hint 1: in the
# A/B of 2026-12-07 (H100, results/2026-12-07-h100-ab4fdde-timing-l2-ws1-ab.json) it was 3.5 %
# faster on ep8-prefill tok128 gate_up and 1-4 % slower on TP8 m4096 / m16384, while l2_hint 2
# was never faster (0.955-0.995x), so 2 only cost tuning time.
L2_HINTS = (1,)
N_TILES = (2, 4)  # n_tiles candidates at short K
# Warp-private rings (direct=1), 8-token tiles below DIRECT_MAX_ROWS rows per expert (every row of
# the bandwidth band: TP8 1-256 tokens, EP decode at 1-5 rows per expert): (block_n, warps, stages), narrow N blocks with deep rings
# to give every SM several independent weight streams without split-K, wide ones for short K (TP8
# down: 4 K blocks, one per warp), and 4-warp tiles with deeper rings at two CTAs per SM's shared
# memory for the long K walks of EP decode (28 K blocks per warp). Not yet timed on a GPU: the
# first tune of the shapes decides.
DIRECT_MAX_ROWS = 8
DIRECT_TILES = ((32, 8, 8), (64, 8, 4), (64, 4, 4), (128, 4, 2), (128, 8, 3), (128, 4, 4), (64, 4, 6))


def block_m_candidates(rows_per_expert: float, block_ms: tuple = BLOCK_MS, above: int = 0) -> tuple[int, ...]:
    """The block_m that covers an expert's expected rows, the next smaller one and `above` larger."""
    need = max(1.0, rows_per_expert)
    first = next((b for b in block_ms if b >= need), block_ms[-1])
    i = block_ms.index(first)
    return tuple(block_ms[max(0, i - 1): i + 1 + above])


TIE_TOL = 0.02  # timings this close to the fastest are a tie (repeat runs of one point differ by up to ~7 %)


def pick_best(timings: dict) -> str:
    """The schedule id a tuned rule takes: among those within TIE_TOL of the fastest, the one with
    the largest block_m (then the fastest). A larger token tile reads each weight tile fewer times
    and issues fewer dequantization instructions per FMA, which counts under sustained load: the
    H200 holds ~700 W and drops to 1.4-1.8 GHz through a long prefill run (measured during `chord
    bench`), while `chord tune`'s short bursts run at ~1.98 GHz. It also keeps block_m growing with
    rows per expert where the timings cannot tell the tiles apart."""
    if not timings:
        raise ValueError("pick_best: no timings (every candidate was rejected)")
    fastest = min(timings.values())
    near = [sid for sid, us in timings.items() if us <= fastest * (1 + TIE_TOL)]
    return max(near, key=lambda sid: (Schedule.from_id(sid).block_m, -timings[sid]))


def _fits(s: Schedule) -> bool:
    return s.smem_bytes * s.ctas_per_sm <= MAX_SMEM_PER_CTA


def candidates(family: str, n: int, rows_per_expert: float,
               mainloops: tuple[str, ...] = ("mma", "wgmma"), k: int | None = None) -> list[Schedule]:
    """Schedules `chord tune` times for one GEMM point (every one is checked before timing).

    With `k` of at most SHORT_K_BLOCKS K blocks (TP8 down: 4), each one-tile candidate also comes
    with n_tiles in N_TILES (one CTA walks that many N blocks through one ring), where it fits.
    (Split-K is tried below 1 row per expert only: at 1-16 rows per expert and K >= 2048, split 2
    and 4 were 3-22 % slower than the best one-split tile at every EP8-decode and TP8 point, H200
    2026-12-01, chord/data/results/2026-12-01-h200-tuning-ep8decode-tp8-ntiles.json.)"""
    out = _one_tile_candidates(family, n, rows_per_expert, mainloops)
    out += [v for s in out for v in _pair_and_tma_variants(family, n, rows_per_expert, s)]
    # folded group scales on the 8-token mma tiles, where they save most instructions per weight
    # (docs/optimizations.md: -1.4 to -3 % on EP8-decode gate_up, +2-4 % on TP8 one / 16 tokens)
    out += [dataclasses.replace(s, fold=1) for s in list(out) if s.mainloop == "mma" and s.block_m == 8 and s.swap == 1]
    # the decode tiles fed by a producer warp (bulk copies of whole tile groups, an mbarrier ring)
    out += [c for c in (_or_none(dataclasses.replace, s, producer=1) for s in list(out)
                        if s.mainloop == "mma" and s.block_m <= 16 and s.block_n % 128 == 0 and not s.stream_k)
            if c is not None and _fits(c)]
    if k is not None and k // 64 <= SHORT_K_BLOCKS:
        for s in list(out):
            if s.split_k != 1 or s.producer or s.cluster_n != 1:
                continue
            for nt in N_TILES:
                if (n // s.block_n) % nt:
                    continue
                try:
                    c = dataclasses.replace(s, n_tiles=nt)
                except ValueError:
                    continue
                if _fits(c):
                    out.append(c)
    return out


def _or_none(make, *args, **kw):
    """make(*args, **kw), or None where that schedule is not legal."""
    try:
        return make(*args, **kw)
    except ValueError:
        return None


def _pair_and_tma_variants(family: str, n: int, rows_per_expert: float, s: Schedule) -> list[Schedule]:
    """A raster-8 wgmma multistage candidate as CTA pairs (an even N-block count), with L2
    policies for the indexed family's gathered rows, with the TMA activation box where the
    family's rows are consecutive and the tile is tall, and (tall tiles, an expert with 2+ tiles)
    at the raster of one expert's tiles."""
    if s.mainloop != "wgmma" or s.producer or s.raster != PAIR_RASTER:
        return []
    pairs = pairs_fit(n, s.block_n_cta)
    tall = family != "indexed" and s.block_m >= TMA_X_MIN_BLOCK_M
    knobs = [{"cluster_n": 2}] if pairs else []
    if family == "indexed":
        knobs += [{"l2_hint": v} for v in L2_HINTS]
    if tall:
        knobs += [{"tma_x": 1}] + ([{"tma_x": 1, "cluster_n": 2}] if pairs else [])
    per_expert = -(-int(math.ceil(rows_per_expert)) // s.block_m)
    if tall and per_expert >= 2 and per_expert in KNOB["raster"].legal and per_expert not in RASTERS:
        knobs += [dict(kw, raster=per_expert) for kw in knobs if "tma_x" in kw]
    return _legal_variants(s, knobs)


def _legal_variants(s: Schedule, changes) -> list[Schedule]:
    """`s` with each set of knob changes in turn, where the result is a legal Schedule that fits."""
    out = []
    for kw in changes:
        try:
            c = dataclasses.replace(s, **kw)
        except ValueError:
            continue
        if _fits(c):
            out.append(c)
    return out


def _one_tile_candidates(family: str, n: int, rows_per_expert: float, mainloops: tuple[str, ...]) -> list[Schedule]:
    out = []
    rasters = RASTERS
    if "mma" in mainloops:
        for bm in block_m_candidates(rows_per_expert):
            for bn, warps in BN_WARPS:
                if n % bn:
                    continue
                for stages in ((6, 8) if bm <= 16 else (3, 4)):
                    for ctas in (1, 2):
                        try:
                            s = Schedule(family, bm, bn, warps, stages, ctas)
                        except ValueError:
                            continue
                        if _fits(s):
                            out.append(s)
        if rows_per_expert < 1:  # few, long tiles (TP8 decode): split K over more CTAs
            for bn in (64, 128):
                if n % bn == 0:
                    for split in SPLITS:
                        for ctas in (1, 2):
                            out.append(Schedule(family, 8, bn, 4, 8, ctas, split))
        if rows_per_expert < STREAM_K_MAX_ROWS and family == "indexed":  # one wave splits the valid units
            for bn, stages in STREAM_K_TILES:
                if n % bn == 0:
                    for ctas in STREAM_K_CTAS:
                        s = Schedule(family, 8, bn, 4, stages, ctas, stream_k=1)
                        if _fits(s):
                            out.append(s)
        if rows_per_expert < DIRECT_MAX_ROWS:  # warp-private rings: every warp of a CTA streams its own K share
            for bn, warps, stages in DIRECT_TILES:
                if n % bn:
                    continue
                for split in ((1, 2) if rows_per_expert < 1 else (1,)):  # split K below 1 row only (as above)
                    s = _or_none(Schedule, family, 8, bn, warps, stages, 1, split, direct=1)
                    if s is not None and _fits(s):
                        out.append(s)
    if "wgmma" in mainloops and rows_per_expert >= WGMMA_MIN_ROWS:
        for bm in block_m_candidates(rows_per_expert, WGMMA_BLOCK_MS, above=1):
            for bn, warps, gs in WGMMA_TILES:
                if n % bn:
                    continue
                for stages in ((4, 6, 8) if bm <= 32 else (3, 4, 5)):
                    for raster in rasters:
                        # 2 CTAs/SM: one CTA's prologue and epilogue hide behind the other's
                        # main loop (short K: TP8 down has 4 K blocks); producer=1 needs 1.
                        for producer, ctas in PRODUCER_CTAS:
                            try:
                                s = Schedule(family, bm, bn, warps, stages, ctas, mainloop="wgmma", raster=raster,
                                             producer=producer, group_steps=gs)
                            except ValueError:
                                continue
                            if _fits(s):
                                out.append(s)
    return out


@dataclasses.dataclass
class Point:
    deployment: str
    family: str
    gemm: str  # gate_up | down
    scenario: str
    rows_per_expert: float
    n: int
    k: int
    best: Schedule
    best_us: float
    default: Schedule
    default_us: float
    timings: dict  # schedule id -> us
    rejected: list  # schedule ids that disagreed with the default's output


def _gemm_calls(family, sc, data, fi, w13, w2):
    """Yields (gemm, n, k, problem, make_fn(schedule) -> (fn, out))."""
    import torch

    from chord import ops, routing

    e = sc.experts
    routes: dict[int, object] = {}

    def route(bm):
        if bm not in routes:
            routes[bm] = routing.align_block_size(data.topk_ids, bm, e)
        return routes[bm]

    specs = (("gate_up", w13, sc.n_gate_up, sc.k_gate_up, fi.gate_up_in, sc.top_k),
             ("down", w2, sc.n_down, sc.k_down, fi.down_in, 1))
    for gemm, w, n, k, x, top_k in specs:
        rows = sc.rows
        prob = Problem(family, e, n, k, rows, top_k if family == "indexed" else 1)

        def make(s, w=w, n=n, x=x, top_k=top_k):
            if family == "indexed":
                out = torch.empty(sc.rows, n, dtype=torch.bfloat16, device=x.device)
                r = route(s.block_m)
                return (lambda: ops.gemm_indexed(x, w, r, top_k=top_k, out=out, schedule=s)), out
            if family == "grouped_contiguous":
                out = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device=x.device)
                return (lambda: ops.gemm_contiguous(x, w, fi.expert_offsets, out=out, schedule=s)), out
            out = torch.empty(*x.shape[:-1], n, dtype=torch.bfloat16, device=x.device)
            return (lambda: ops.gemm_masked(x, w, fi.expert_num_tokens, out=out, schedule=s)), out

        yield gemm, n, k, prob, make


def tune_schedules(suite_path=None, scenario_ids: Iterable[str] | str | None = None, families=None, *,
                   profile_file: str = "h200", suite=None, max_candidates: int | None = None) -> list[Schedule]:
    """Every schedule `tune_suite` would build for these scenarios (defaults and candidates, the
    same `max_candidates` cut), so they can be compiled ahead on a machine without a GPU
    (`chord precompile --tune`)."""
    from chord.lab.bench.suite import load_suite

    suite = suite if suite is not None else load_suite(suite_path)
    out: dict = {}
    for sc, fams in suite.select(scenario_ids, families):
        for family in fams:
            prof = sc.profile(profile_file, family)
            for gemm in ("gate_up", "down"):
                n, k, prob = sc.gemm_problem(family, gemm)
                default = select(prof, prob)
                for s in tuning_candidates(family, prob, sc.rows_per_expert, default, profile_file, max_candidates):
                    out[s.id] = s
    return list(out.values())


#: do_bench warm-up before each candidate is timed (ms). The GPU runs a compute-bound GEMM at a
#: lower clock once its power draw has settled: ep8-prefill-tok512's contiguous gate_up took
#: 1909 us with 10 ms of warm-up and 20 ms of timing and 2207 us over 2000 ms on the H200 (the
#: bench's sustained state). A candidate timed cold is ranked by cycles; one timed after this
#: warm-up nearer its sustained speed, where moving fewer bytes per MAC also counts.
WARMUP_MS = 100.0


def _check_timing_args(who: str, rep_ms: float, warmup_ms: float) -> None:
    def number(v) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

    if not number(rep_ms) or not rep_ms > 0:
        raise ValueError(f"{who}: rep_ms must be a positive number of milliseconds, got {rep_ms!r}")
    if not number(warmup_ms) or not warmup_ms >= 0:
        raise ValueError(f"{who}: warmup_ms must be a non-negative number of milliseconds, got {warmup_ms!r}")


def tune_suite(suite_path=None, scenario_ids: Iterable[str] | str | None = None, families=None, *,
               profile_file: str = "h200", rep_ms: float = 25.0, warmup_ms: float = WARMUP_MS,
               log=print, suite=None, max_candidates: int | None = None, budget_minutes: float | None = None,
               timing_cache: "TimingCache | None" = None, progress: bool = False) -> list[Point]:
    """Times the candidates of each suite GEMM (do_bench median of a CUDA-graph replay after
    `warmup_ms` of warm-up; see WARMUP_MS) against the profile's schedule, rejecting any whose
    output disagrees; the fastest per GEMM (`pick_best`) is its Point.

    `suite`: a chord.lab.bench.suite.Suite instead of a file (`chord tune --experts ...` builds one).
    `max_candidates`: per GEMM, the first that many of the cost model's order (chord.cost.rank)
    besides the seeds (the current decision, the heuristic's, and the nearest tuned deployment's
    rule at the same rows per expert); None times every candidate. `budget_minutes`: the
    timing is spread over the GEMMs left so each gets its share, and a GEMM stops timing (in the
    cost model's order) once its share is spent. The default schedule's output is checked against
    the float32 reference (chord.reference) before any candidate may win; `timing_cache` reuses
    the timings of (GPU, schedule, shape, timing) measured before."""
    _check_timing_args("tune_suite", rep_ms, warmup_ms)
    import time

    import torch

    from chord import formats, jit
    from chord.lab.bench import inputs as I
    from chord.lab.bench.suite import load_suite
    from chord.lab.bench.timing import bench

    suite = suite if suite is not None else load_suite(suite_path)
    selected = suite.select(scenario_ids, families)
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name()
    points: list[Point] = []
    packed_cache: dict = {}
    plan = []
    for sc, fams in selected:
        for family in fams:
            for gemm in ("gate_up", "down"):
                n, k, prob = sc.gemm_problem(family, gemm)
                prof = sc.profile(profile_file, family)
                default = select(prof, prob)
                cands = tuning_candidates(family, prob, sc.rows_per_expert, default, profile_file, max_candidates)
                plan.append((sc, family, gemm, default, cands))
    todo = [c for *_, cands in plan for c in cands]
    log(f"chord tune: {len(plan)} GEMMs, {len(set(todo))} distinct candidates to build")
    built = {c.id: b for c, b in zip(dict.fromkeys(todo), jit.precompile(list(dict.fromkeys(todo)), progress=progress))}
    t_start = time.monotonic()
    for i, (sc, family, gemm, default, cands) in enumerate(plan):
        key = sc.weights_key
        if key not in packed_cache:
            packed_cache.clear()
            torch.cuda.empty_cache()
            ew = I.expert_weights(sc, 0, dev)
            packed_cache[key] = (formats.pack_experts(ew.q13, ew.s13), formats.pack_experts(ew.q2, ew.s2), ew)
        w13, w2, ew = packed_cache[key]
        data = I.scenario_data(sc, 0, dev)
        fi = I.family_inputs(family, data)
        make = next(m for g, n, k, prob, m in _gemm_calls(family, sc, data, fi, w13, w2) if g == gemm)
        n, k, prob = sc.gemm_problem(family, gemm)
        cands = [c for c in cands if c == default or (built[c.id].spill_bytes == 0 and not built[c.id].wgmma_serialized)]
        ref_fn, ref_out = make(default)
        ref_out.fill_(float("nan"))
        ref_fn()
        torch.cuda.synchronize()
        ref = ref_out.clone()
        ref_err = I.gemm_check(fi, data, ew, gemm,
                               I.sample_routes(sc.rows, REFERENCE_ROWS, data.seed, data.device).to(data.device))
        err = ref_err(ref)
        if not err <= I.TOLERANCE:
            raise RuntimeError(f"chord tune: {sc.id} {family} {gemm}: the default schedule {default.id} disagrees "
                               f"with the float32 reference (relative error {err:.3g} > {I.TOLERANCE}); "
                               "nothing of this shape can be tuned against it")
        share = None
        if budget_minutes is not None:
            left = budget_minutes * 60.0 - (time.monotonic() - t_start)
            share = max(0.0, left / (len(plan) - i))
        t_gemm = time.monotonic()
        timings, rejected, reused = {}, [], 0
        for s in cands:
            if share is not None and timings and time.monotonic() - t_gemm > share:
                break
            ckey = timing_cache.key(gpu, s, prob, warmup_ms, rep_ms) if timing_cache is not None else None
            if ckey is not None and ckey in timing_cache:
                timings[s.id] = timing_cache[ckey]
                reused += 1
                continue
            fn, out = make(s)
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            exact = same_arithmetic(s, default)
            if not _agrees(out, ref, exact=exact) and (exact or not ref_err(out) <= I.TOLERANCE):
                rejected.append(s.id)
                log(f"  REJECTED {s.id}: output differs from {default.id}"
                    + ("" if exact else f" and from the float32 reference beyond {I.TOLERANCE}"))
                continue
            timings[s.id] = bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, graph=True).p50
            if ckey is not None:
                timing_cache[ckey] = timings[s.id]
        if default.id not in timings:  # the budget never cut the default: it is first in the order
            raise RuntimeError(f"chord tune: {sc.id} {family} {gemm}: the default {default.id} was not timed")
        best_id = pick_best(timings)
        pt = Point(sc.profile_deployment, family, gemm, sc.id, sc.rows_per_expert, n, k, Schedule.from_id(best_id),
                   timings[best_id], default, timings[default.id], timings, rejected)
        points.append(pt)
        log(f"{sc.id:20s} {family:18s} {gemm:7s} default {default.id:26s} {pt.default_us:9.1f} us   "
            f"best {best_id:26s} {pt.best_us:9.1f} us  ({len(timings)} of {len(cands)} timed, {reused} reused, "
            f"{len(rejected)} rejected)")
        if timing_cache is not None:
            timing_cache.save()
    return points


#: rows of the default schedule's output checked against the float32 reference before a tune
#: trusts it (the bench's check, chord.lab.bench.inputs.check_family_outputs, with its tolerance)
REFERENCE_ROWS = 512


def same_arithmetic(s: Schedule, default: Schedule) -> bool:
    """Whether `s` runs the per-thread arithmetic of `default` in the same order, so their outputs
    must be bit-identical: no split-K (another order of the K sum), the same main loop and operand
    layout, and the same group-scale form (fold=1 applies each group's scale to its fp32 partial,
    fold=0 to the bf16 operands)."""
    return (s.split_k == default.split_k == 1 and not s.stream_k and not default.stream_k
            and s.mainloop == default.mainloop and s.swap == default.swap and s.fold == default.fold)


#: a GEMM whose leading one-split mma tiles fill fewer than this many waves of CTA slots also
#: tries split-K and (indexed) stream-K variants of them: with 12-24 local experts (EP16 / EP32)
#: a decode grid is 1-3 waves, and a partial last wave idles SMs that could stream
WAVE_FILL_MAX_WAVES = 3
WAVE_FILL_TILES = 4  # leading one-split mma tiles that get split / stream-K variants
WAVE_FILL_SPLITS = (2, 3, 4)


def wave_fill_variants(family: str, prob: Problem, ranked: list[Schedule]) -> list[Schedule]:
    """Split-K (workspace and cluster fix-ups) and stream-K variants of the leading one-split mma
    CTA-ring tiles of `ranked` where their grid fills few waves (WAVE_FILL_MAX_WAVES), each kept only if
    legal with at least 8 K blocks per split."""
    from chord import cost

    out: list[Schedule] = []
    lead = [s for s in ranked if s.mainloop == "mma" and s.split_k == 1 and not s.stream_k and s.n_tiles == 1
            and not s.direct]  # (the direct tiles come with their own splits: candidates)
    for s in lead[:WAVE_FILL_TILES]:
        e = cost.estimate(s, prob)
        if e.units >= WAVE_FILL_MAX_WAVES * e.slots:
            continue
        kb = prob.k // 64
        # each split with its partials summed through a global workspace and through the cluster
        tries = [dict(split_k=z, split_cluster=c) for z in WAVE_FILL_SPLITS if kb // z >= 8 for c in (0, 1)]
        if family == "indexed":
            tries.append(dict(stream_k=1, fold=0))
        out += _legal_variants(s, tries)
    return out


def tuning_candidates(family: str, prob: Problem, rows_per_expert: float, default: Schedule,
                      profile_file: str = "h200", limit: int | None = None) -> list[Schedule]:
    """What `chord tune` times for one GEMM, in order: the default (the current decision), the
    heuristic's decision, the nearest tuned deployment's rule at the same rows per expert, then
    the candidates (`candidates`) in the cost model's order (chord.cost.rank), the first `limit`
    of them (None: all), then split-K / stream-K variants of the leading tiles where their grid
    fills few waves (`wave_fill_variants`)."""
    from chord import cost
    from chord.schedule import explain

    near = _nearest_entry(profile_file, prob)
    base = f"{profile_file}:{near}" if near else _any_entry(profile_file)
    seeds = [default, explain(base, prob, "heuristic").schedule]
    if near:
        seeds.append(explain(base, prob, "profile").schedule)
    ranked = cost.rank(candidates(family, prob.n, rows_per_expert, k=prob.k), prob, limit)
    return list(dict.fromkeys(seeds + ranked + wave_fill_variants(family, prob, ranked)))


def _any_entry(profile_file: str) -> str:
    from chord.schedule import load_profile_file

    return f"{profile_file}:{next(iter(load_profile_file(profile_file).deployments))}"


def _nearest_entry(profile_file: str, prob: Problem) -> str | None:
    """The profile entry (with `covers`) whose expert count is nearest the problem's and which has
    rules for its family: its rules at the same rows per expert are a strong first guess."""
    from chord.schedule import load_profile_file

    best = None
    for name, prof in load_profile_file(profile_file).deployments.items():
        if not prof.covers_experts or prob.family not in prof.rules:
            continue
        d = min(abs(math.log(e / prob.num_experts)) for e in prof.covers_experts)
        if best is None or d < best[0]:
            best = (d, name)
    return best[1] if best else None


class TimingCache:
    """Timings `chord tune` measured, keyed by (GPU, schedule, shape, warm-up, rep), in a JSON
    file (default ``<kernel cache>/tune-timings.json``), so a repeated or widened tune times only
    what is new. Written with an atomic rename."""

    def __init__(self, path=None):
        from chord import jit

        self.path = Path(path) if path is not None else Path(jit.cache_dir()) / "tune-timings.json"
        try:
            data = json.loads(self.path.read_text())
            self.data = {k: float(v) for k, v in data.items()} if isinstance(data, dict) else {}
        except (OSError, ValueError, TypeError):
            self.data = {}

    @staticmethod
    def key(gpu: str, s: Schedule, p: Problem, warmup_ms: float, rep_ms: float) -> str:
        return (f"{gpu}|{s.id}|{p.num_experts}x{p.n}x{p.k}|rows{p.rows}|top{p.top_k}|"
                f"w{warmup_ms:g}|r{rep_ms:g}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def __getitem__(self, key: str) -> float:
        return self.data[key]

    def __setitem__(self, key: str, us: float) -> None:
        self.data[key] = float(us)

    def save(self) -> None:
        import os
        import tempfile

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tune-timings-")
        with os.fdopen(fd, "w") as f:
            json.dump(self.data, f, indent=0, sort_keys=True)
        os.replace(tmp, self.path)


def time_schedules(scenario_id: str, family: str, gemm: str, schedules, *, rep_ms: float = 50.0,
                   warmup_ms: float = WARMUP_MS, suite_path=None, seed: int = 0) -> list[dict]:
    """Time one suite GEMM under several schedules (the same inputs `chord tune` uses): for each,
    the do_bench median of a CUDA-graph replay and how its output compares with the first
    schedule's (bit-identical, or the relative error). Needs an sm_90 GPU.

    What the notebooks' ablations and `chord bench --gemm` (chord.lab.bench.one_gemm) call: an ablation is this with the
    schedule and its `chord.optimizations.ablations`.
    """
    import torch

    from chord.lab.bench import inputs as I
    from chord.testing import rel_err, same_bits

    _check_timing_args("time_schedules", rep_ms, warmup_ms)
    scheds = [s if isinstance(s, Schedule) else Schedule.from_id(s) for s in schedules]
    if not scheds:
        raise ValueError("time_schedules: schedules must name at least one schedule")
    if gemm not in ("gate_up", "down"):
        raise ValueError(f"time_schedules: gemm must be 'gate_up' or 'down', got {gemm!r}")
    sc, w13, w2, data, fi = I.one_scenario(suite_path, scenario_id, family, seed, "cuda", who="time_schedules")
    out_rows = []
    for g, n, k, prob, make in _gemm_calls(family, sc, data, fi, w13, w2):
        if g != gemm:
            continue
        first = None
        for s in scheds:
            out, t = _run_and_time(make, s, rep_ms, warmup_ms)
            if first is None:
                first = out.clone()
            valid = ~torch.isnan(first)
            out_rows.append({"scenario": scenario_id, "family": family, "gemm": gemm, "schedule": s.id,
                             "us": t.p50, "p20": t.p20, "p80": t.p80, "same_bits": same_bits(out, first),
                             "rel_err": rel_err(out[valid], first[valid]), "gpu": torch.cuda.get_device_name()})
    return out_rows


# The weight layout's ablation (docs/optimizations.md, "Tile-grouped weight layout"): GEMMs whose
# weight stream the tile groups change most, bandwidth-bound and one wgmma prefill GEMM.
LAYOUT_GEMMS = (
    ("ep8-decode-tok1", "indexed", "gate_up"),
    ("ep8-decode-tok1", "indexed", "down"),
    ("ep8-decode-tok4", "grouped_masked", "gate_up"),
    ("ep8-decode-tok4", "grouped_masked", "down"),
    ("tp8-m64", "indexed", "gate_up"),
    ("tp8-m1024", "indexed", "gate_up"),
    ("ep8-prefill-tok512", "grouped_contiguous", "gate_up"),
)


def _run_and_time(make, s: Schedule, rep_ms: float, warmup_ms: float = WARMUP_MS):
    """One call of `make(s)`'s GEMM into its NaN-poisoned output, then the do_bench median of its
    CUDA-graph replay after `warmup_ms` of warm-up: (output, Timing)."""
    import torch

    from chord.lab.bench.timing import bench

    fn, out = make(s)
    out.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    return out, bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, graph=True)


def time_layouts(gemms=LAYOUT_GEMMS, *, rep_ms: float = 30.0, warmup_ms: float = WARMUP_MS, repeats: int = 1,
                 suite_path=None, seed: int = 0) -> list[dict]:
    """Each GEMM's profile schedule on weights packed tile-grouped (G = 8, the layout) and
    tile-major (G = 1: CHORD_TILE_GROUP=1 while packing; chord.ops runs the kernel built for the
    weights' G), do_bench median of a CUDA-graph replay per repeat. Only where the bytes come from
    differs, so each G = 1 row says whether its output has the G = 8 output's bits
    (``same_bits``). Needs an sm_90 GPU."""
    from chord.lab.bench import inputs as I
    from chord.lab.bench.suite import load_suite
    from chord.testing import same_bits

    suite = load_suite(suite_path)
    for scenario, family, gemm in gemms:  # every name checked before anything is packed
        suite.scenario(scenario).gemm_problem(family, gemm)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"time_layouts: repeats must be a positive int, got {repeats!r}")
    _check_timing_args("time_layouts", rep_ms, warmup_ms)
    rows = []
    for (scenario, family), group in _grouped_points(gemms).items():
        calls = {}
        for g in (8, 1):  # each layout packed once; chord.ops runs the kernel built for the weights' G
            with _env.override(CHORD_TILE_GROUP=g):  # the packing's cap; the weights carry their G after
                sc, w13, w2, data, fi = I.one_scenario(suite_path, scenario, family, seed, "cuda", who="time_layouts")
                calls[g] = {name: (n, k, prob, make) for name, n, k, prob, make in _gemm_calls(family, sc, data, fi, w13, w2)}
        firsts: dict = {}
        for rep in range(repeats):
            for gemm in group:
                for g in (8, 1):  # interleaved, so drift over the run hits both alike
                    n, k, prob, make = calls[g][gemm]
                    s = select(profile_for(family, sc.experts, n, k), prob, "profile")
                    out, t = _run_and_time(make, s, rep_ms, warmup_ms)
                    first = firsts.setdefault(gemm, out.clone())
                    rows.append({"scenario": scenario, "family": family, "gemm": gemm, "schedule": s.id,
                                 "tile_group": g, "repeat": rep, "us": round(t.p50, 2),
                                 "same_bits": int(same_bits(out, first))})
        del calls, firsts
    return rows


def _grouped_points(gemms) -> dict:
    """{(scenario, family): [gemm, ...]} in the order given."""
    out: dict = {}
    for scenario, family, gemm in gemms:
        out.setdefault((scenario, family), []).append(gemm)
    return out


def _agrees(out, ref, exact: bool) -> bool:
    """Bit-identical (same main loop, no split-K), or within SPLIT_TOL with the same unwritten rows."""
    import torch

    nan_o, nan_r = torch.isnan(out), torch.isnan(ref)
    if not torch.equal(nan_o, nan_r):
        return False
    if exact:
        return torch.equal(out.view(-1).view(torch.int16), ref.view(-1).view(torch.int16))
    a, b = out[~nan_o].float(), ref[~nan_r].float()
    return bool(((a - b).norm() / b.norm().clamp_min(1e-30)) < SPLIT_TOL)


def entry_meta(selected) -> dict:
    """{profile entry: its deployment, role and covered shapes} of a suite selection (what
    `write_tuning` stores beside a new entry's rules, so the entry is chosen by shape)."""
    out: dict = {}
    for sc, _ in selected:
        e = out.setdefault(sc.profile_deployment, {"deployment": sc.deployment, "role": sc.role,
                                                   "covers": {"experts": [sc.experts], "gemms": []}})
        for g in ([sc.n_gate_up, sc.k_gate_up], [sc.n_down, sc.k_down]):
            if g not in e["covers"]["gemms"]:
                e["covers"]["gemms"].append(g)
    return out


def profile_from_points(points: list[Point], base_profile_file: str = "h200", *, gpu: str,
                        note: str, meta: dict | None = None, about: str | None = None) -> dict:
    """A profile JSON dict: the base profile with the tuned families' rules replaced. `meta`
    ({entry: {deployment, role, covers}}, `entry_meta`) is written into each tuned entry, with
    `about` (what was measured, where and how) as the entry's about text."""
    from chord.schedule import _profile_path

    base = json.loads(_profile_path(base_profile_file).read_text())
    for dep, m in (meta or {}).items():
        entry = base["deployments"].setdefault(dep, {"families": {}})
        entry.update({k: v for k, v in m.items()})
        if about:
            entry["about"] = about
    by: dict = {}
    for p in points:
        by.setdefault((p.deployment, p.family), []).append(p)
    for (dep, family), pts in by.items():
        rpes = sorted({p.rows_per_expert for p in pts})
        bounds = {r: (None if i == len(rpes) - 1 else math.sqrt(max(r, 0.01) * rpes[i + 1]))
                  for i, r in enumerate(rpes)}
        gate_k = {p.k for p in pts if p.gemm == "gate_up"}
        # keep the base profile's rules for row counts well below the smallest tuned point
        below = rpes[0] / math.sqrt(2)
        old = base["deployments"].get(dep, {}).get("families", {}).get(family, [])
        rules = [dict(r) for r in old if r.get("max_rows_per_expert") is not None and r["max_rows_per_expert"] < below]
        for r in rpes:
            at = {p.gemm: p for p in pts if p.rows_per_expert == r}
            b = bounds[r]
            down, gate = at.get("down"), at.get("gate_up")
            if down is not None and down.k not in gate_k:
                rules.append(_rule(b, down, k_max=down.k))
            if gate is not None:
                rules.append(_rule(b, gate))
        # the unconditional fallback: the largest point's gate_up rule without a k filter
        if rules[-1]["max_rows_per_expert"] is not None or "k_max" in rules[-1]:
            last = dict(rules[-1])
            last.pop("k_max", None)
            last["max_rows_per_expert"] = None
            rules.append(last)
        base["deployments"].setdefault(dep, {"families": {}})["families"][family] = rules
    base["about"] = note
    base["gpu"] = gpu if gpu else base.get("gpu")
    return base


def _profile_text(profile_file: str) -> str:
    from chord.schedule import _profile_path

    return _profile_path(profile_file).read_text()


def points_from_json(path) -> list[Point]:
    """Points back from a `tuning.json` written by write_tuning (to rebuild a profile offline)."""
    out = []
    for d in json.loads(Path(path).read_text()):
        d = dict(d)
        d["best"] = Schedule.from_id(d["best"])
        d["default"] = Schedule.from_id(d["default"])
        out.append(Point(**d))
    return out


def _rule(bound, p: Point, k_max: int | None = None) -> dict:
    from chord.schedule import KNOBS

    s = p.best
    knobs = {k.name: getattr(s, k.name) for k in KNOBS if k.always or getattr(s, k.name) != k.default}
    r = {"max_rows_per_expert": None if bound is None else round(bound, 3), **knobs,
         "why": f"tuned on {p.scenario} {p.gemm}: {p.best_us:.1f} us (was {p.default.id} {p.default_us:.1f} us)"}
    if k_max is not None:
        r["k_max"] = k_max
    return r


def environment() -> dict:
    """GPU, driver, CUDA, torch and Chord versions of this process (what a tuned entry records)."""
    import torch

    import chord

    env = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
           "cuda": torch.version.cuda, "torch": torch.__version__, "chord": getattr(chord, "__version__", "?")}
    env["driver"] = _driver_version()
    return env


def _driver_version() -> str:
    """The NVIDIA driver's version (nvidia-smi, else NVML), or "unknown"."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # NVML missing or failing: the version is only recorded, never needed
        return "unknown"


def write_tuning(points: list[Point], out_dir: Path, *, profile_file: str = "h200", meta: dict | None = None,
                 command: str | None = None, seconds: float | None = None) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    note = (f"Tuned by `chord tune` on {env['gpu']}, {stamp}: per suite point the fastest bit-identical schedule "
            "(CUDA-graph do_bench median). See docs/performance.md.")
    about = None
    if meta:
        took = f", {seconds / 60:.1f} min of tuning" if seconds is not None else ""
        about = (f"Tuned {stamp} by `{command or 'chord tune'}` on {env['gpu']} (driver {env['driver']}, CUDA "
                 f"{env['cuda']}, torch {env['torch']}, chord {env['chord']}{took}).")
    prof = profile_from_points(points, profile_file, gpu=profile_file, note=note, meta=meta, about=about)
    if meta:  # the base profile's own about text stays; the tuned entries carry theirs
        prof["about"] = json.loads(_profile_text(profile_file)).get("about", note)
    ppath = out_dir / f"{Path(profile_file).stem}.json"
    ppath.write_text(json.dumps(prof, indent=1) + "\n")
    rpath = out_dir / "tuning.json"
    rpath.write_text(json.dumps([dict(dataclasses.asdict(p), best=p.best.id, default=p.default.id) for p in points],
                                indent=1) + "\n")
    return ppath, rpath
