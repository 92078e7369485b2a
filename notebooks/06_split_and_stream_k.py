# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 — Split-K, the 2-CTA/SM window, multi-tile CTAs and programmatic dependent launch
#
# At TP8 one token, 8 of 384 experts are active and each GEMM has only a few output tiles: the
# GPU idles unless K is split over more CTAs (`split_k`: fp32 partials, the last CTA of a tile
# sums them in a fixed order, so the result is deterministic). Mid-size tiles gain from two
# resident CTAs per SM (`ctas_per_sm`), which hides cp.async latency. At short K (TP8 down: four
# K blocks per tile) a CTA that walks several N blocks through one ring (`n_tiles`) keeps the
# ring full instead of filling and draining it per tile; the epilogue's fragment stores and
# persistent CTAs are the other two short-K knobs. Stream-K (`stream_k`) goes further: one wave
# of CTAs splits the (tile, K block) units of the valid blocks evenly, whatever the grid's
# shape, and its shape-aware gate keeps it to grids that do not fill the GPU; warp-private rings
# (`direct`) give each warp of a CTA its own K share and ring instead. All are knobs of the one
# kernel template.

# %% tags=["parameters"]
QUICK = True
SCENARIO = "tp8-m1"

# %%
from chord import optimizations
from chord.lab.workbench import best_by, decision_row, recorded_tuning
from chord.lab.workbench import figures

for name in ("split-K", "bounded 2-CTA/SM window", "multi-tile CTAs", "stmatrix epilogue", "persistent tile scheduling",
             "stream-K", "shape-aware stream-K gate", "warp-private rings"):
    o = optimizations.BY_NAME[name]
    print(f"{name:28s} {o.status:12s} knob={o.knob}  {o.what}")

# %% [markdown]
# ## What the profile picks for one token at TP8

# %%
for gemm in ("gate_up", "down"):
    r = decision_row("tp8", "indexed", gemm, 8 / 384)
    print(f"{gemm:8s} {r['schedule']:32s} {r['tiles']:4d} working CTAs on 132 SMs (8 experts x N blocks x splits)")

# %% [markdown]
# ## Measured: split-K 1 / 2 / 4 / 8 and 1 vs 2 CTAs per SM (recorded `chord tune` run)

# %%
points = [p for p in recorded_tuning() if p["scenario"].startswith("tp8")]
split_rows = best_by([p for p in points if p["scenario"] == SCENARIO],
                     {f"split {s}": (lambda s_: (lambda sch: sch.split_k == s_))(s) for s in (1, 2, 4, 8)})
for r in split_rows:
    print(r["scenario"], r["gemm"], "  ".join(f"split {s}: {r[f'split {s}_us']:.1f} us" if r[f"split {s}_us"] else
                                          f"split {s}: -" for s in (1, 2, 4, 8)))
figures.ablation_figure(split_rows, [f"split {s}" for s in (1, 2, 4, 8)], f"{SCENARIO}: best schedule per split_k")

# %%
cta_rows = best_by(points, {"1 CTA/SM": lambda s: s.ctas_per_sm == 1, "2 CTAs/SM": lambda s: s.ctas_per_sm == 2})
for r in cta_rows:
    a, b = r["1 CTA/SM_us"], r["2 CTAs/SM_us"]
    print(f"{r['scenario']:12s} {r['gemm']:8s} 1 CTA/SM {a:8.1f} us   2 CTAs/SM {b:8.1f} us   ratio {b / a:.2f}")
figures.ablation_figure(cta_rows, ["1 CTA/SM", "2 CTAs/SM"], "TP8: best schedule with 1 vs 2 CTAs per SM")

# %% [markdown]
# ## Measured: multi-tile CTAs at short K (`n_tiles` 1 / 2 / 4, TP8 down, recorded `chord tune` run)
# The same tuning run timed every one-tile candidate and the same schedules with n_tiles 2 and 4.

# %%
nt_points = [p for p in recorded_tuning("2026-12-01-h200-tuning-ep8decode-tp8-ntiles")
             if p["scenario"].startswith("tp8") and p["gemm"] == "down"]
nt_groups = {f"n_tiles {t}": (lambda t_: (lambda sch: sch.n_tiles == t_))(t) for t in (1, 2, 4)}
nt_rows = best_by(nt_points, nt_groups)
for r in nt_rows:
    print(f"{r['scenario']:12s} " + "  ".join(f"{g}: {r[g + '_us']:7.1f} us" if r[g + "_us"] else f"{g}: -"
                                              for g in nt_groups))
figures.ablation_figure(nt_rows, list(nt_groups), "TP8 down: best schedule per n_tiles")

# %% [markdown]
# ## Measured: the stmatrix epilogue and persistent CTAs (recorded A/B runs, the 6d111f6 runs (2026-12-01))
# At short K a tile's epilogue is a large part of its life. `stmatrix` (default on) moves each
# warp's accumulators to the staged bf16 tile with `stmatrix.trans`, one instruction per two
# 8-token groups of a 16-feature tile; `stm0` stores one 16-bit value at a time. `persistent`
# (`ps1`, not used by the profile) launches about one wave of CTAs that walk every (token tile,
# n_tiles N blocks) item from the device's routing. Each pair was timed in one run on one machine
# instance (Chord only, `chord.lab.tune.time_schedules`); both sides give the same bits. Split-K
# tiles stage through the fix-up instead, so their pairs are left out. Run 7 timed the kernels
# of commit 347cd15, whose stmatrix 96 x 128 tile had 136 registers instead of 128 (e54a0ff);
# the persistent pairs are those of the persistent code as committed (run 4 of its file), whose
# one-CTA-per-item twins had that same extra-register wrap: against the earlier n_tiles kernels
# (run 3: 1342.9 and 408.4 us) persistence is 3 % and 25 % slower (docs/optimizations.md).

# %%
from chord.lab.workbench import knob_pairs, recorded_file, recorded_timing
from chord.lab.workbench.tables import show_pairs

# (knob_pairs leaves out ids that are no schedule any more, e.g. the split-K stm0 one of run 3)
stm = knob_pairs(recorded_timing("2026-12-01-h200-timing-6d111f6-epilogue-tiles"), "stmatrix", 0, "stmatrix", "stm0")
show_pairs(stm, "stmatrix", "stm0", f"recorded: {recorded_file(stm[0]['file'])}")
figures.ablation_figure(stm, ["stm0", "stmatrix"], "stmatrix epilogue on / off (one GEMM, recorded A/B)")

# %%
ps = [r for r in knob_pairs(recorded_timing("2026-12-01-h200-timing-6d111f6-persistent"), "persistent", 0, "persistent",
                            "one CTA per item") if r["run"] == 4]
show_pairs(ps, "persistent", "one CTA per item", f"recorded: {recorded_file(ps[0]['file'])}")
figures.ablation_figure(ps, ["one CTA per item", "persistent"], "persistent CTAs on / off (one GEMM, recorded A/B)")

# %% [markdown]
# ## Measured live: the split-K gate and multi-tile CTAs switched off
# The heuristic policy with its split-K gate on and off at one token (next to the tuned profile),
# and the profile's TP8 down schedule with `n_tiles` on and off (`chord.lab.workbench.ablate`: live
# on an H200, else the committed tables).

# %%
from chord.lab.workbench import ablate

sk, _ = ablate.rule_ablation("06_split_k_gate", "split_k_gate", "split-K gate off", [(SCENARIO, "indexed", "gate_up")],
                             "split-K gate on/off under the heuristic policy, and the tuned profile")
NT_LABELS = ["profile", "n_tiles off"]
nt, where = ablate.ablation("06_n_tiles", [("tp8-m64", "indexed", "down"), ("tp8-m256", "indexed", "down")],
                            {"profile": ablate.policy("profile"), "n_tiles off": ablate.knob_off("multi-tile CTAs")},
                            "n_tiles on/off on the profile's TP8 down schedules")
ablate.show_table(nt, NT_LABELS, where)

# %% [markdown]
# ## Stream-K: one wave splits the valid units
# With `stream_k=1` the grid is SMs x `ctas_per_sm` CTAs; CTA c takes units [U c / G, U (c+1) / G)
# of the U = valid blocks x N blocks x K blocks, read from `num_tokens_post_padded` on the device.
# A tile shared by CTAs meets as fp32 partials, summed by its last contributor in CTA order
# (deterministic, same pass). Below: the plan at one token, then every stream-K candidate of
# `chord tune` against the profile's schedule, one GEMM at a time (live on an H200, else the
# committed A/B). Measured on the H200 it is slower at every point (1.16x on gate_up, 1.45x on
# down at one token): with one to three CTAs of four warps per SM, each K block's dequant and MMAs
# run with too little parallelism, where split-K 8 (gate_up) or one CTA per tile (down) keeps 4-8
# CTAs per SM busy. No rule selects it, so its gate waits (`chord.optimizations`).

# %%
import math

from chord.lab import tune
from chord.lab.bench.suite import load_suite
from chord.schedule import profile_for, select
from chord.lab.workbench import gpu_available, recorded_file, recorded_timing

for gemm, n, k in (("gate_up", 512, 7168), ("down", 7168, 256)):
    for bn in (64, 128):
        units = 8 * (n // bn) * (k // 64)  # 8 one-block experts at one token
        print(f"{gemm:8s} block_n {bn:3d}: {8 * (n // bn):4d} tiles, {units:5d} units over 132 x 2 CTAs = "
              f"{math.ceil(units / 264)} K blocks per CTA")

def time_against_profile(keep):
    """Live: both GEMMs of SCENARIO under the profile's schedule, then under each tune candidate
    that keep(candidate) picks, one GEMM at a time (CUDA-graph replays)."""
    sc = load_suite().scenario(SCENARIO)
    rows = []
    for gemm in ("gate_up", "down"):
        n, k, prob = sc.gemm_problem("indexed", gemm)
        base = select(profile_for("indexed", sc.experts, n, k), prob)
        cands = [c for c in tune.candidates("indexed", n, prob.rows / prob.num_experts, k=k) if keep(c)]
        rows += tune.time_schedules(SCENARIO, "indexed", gemm, [base, *cands], rep_ms=20 if QUICK else 50,
                                    warmup_ms=30)
    return rows


def show_best(rows, what):
    for gemm in ("gate_up", "down"):
        g = [r for r in rows if r["gemm"] == gemm]
        if g:
            best = min(g[1:], key=lambda r: r["us"])
            print(f"{SCENARIO} {gemm:8s} profile {g[0]['schedule']:28s} {g[0]['us']:6.1f} us   best {what} "
                  f"{best['schedule']:30s} {best['us']:6.1f} us ({best['us'] / g[0]['us']:.2f}x)")


STK_FILE = "2026-12-01-h200-timing-05c29c3-stream-k"
if gpu_available():
    stk = time_against_profile(lambda c: c.stream_k)
    print("live on this GPU")
else:
    stk = [r for r in recorded_timing(STK_FILE) if r["scenario"] == SCENARIO]
    print(f"recorded: {recorded_file(STK_FILE + '.json')} (no sm_90 GPU here, so nothing ran live)")
show_best(stk, "stream-K")

# %% [markdown]
# ## Warp-private rings: each warp its own K share and its own ring (`direct`)
# Stream-K's lesson above is that one wave of 4-warp CTAs has too few independent streams per SM.
# With `direct=1` the CTA's warps split its K range and each walks its share of every tile of the
# N block through its own cp.async ring, waiting only for its own copies (no CTA barrier in the K
# loop); the warps' fp32 partials are summed once, in warp order, before the epilogue. Below: what
# each candidate of `chord tune` streams at one token, then the candidates against the profile's
# schedule, one GEMM at a time, live on an H200. No timing of them is committed yet, so without a
# GPU the cell says so (docs/optimizations.md, "Warp-private rings", has the expected effect and
# the commands that measure it).

# %%
direct = {}
for gemm, n, k in (("gate_up", 512, 7168), ("down", 7168, 256)):
    direct[gemm] = [c for c in tune.candidates("indexed", n, 8 / 384, k=k) if c.direct and not c.fold]
    for c in direct[gemm]:
        per_warp = k // 64 / c.split_k / c.warps
        print(f"{gemm:8s} {c.id:34s} {8 * (n // c.block_n) * c.split_k:4d} CTAs of {c.warps} warps, "
              f"{per_warp:5.1f} K blocks per warp ({min(c.stages - 1, math.ceil(per_warp))} in flight), "
              f"{c.smem_bytes // 1024:3d} KB shared memory")
if gpu_available():
    show_best(time_against_profile(lambda c: c.direct and not c.fold), "direct (live)")
else:
    print("no sm_90 GPU here and no recorded timing of the direct loop yet: run this cell on an H200, or "
          "`chord bench --scenarios tp8-m1 --gemm gate_up --schedule <profile id> --schedule <direct id>`")

# %% [markdown]
# ## Programmatic dependent launch: the gate_up + down pair with and without `pdl`
# At one token the two TP8 GEMMs move ~25 MB (6 µs at HBM speed) but the pair took 22.6 µs in
# the 37dd90f runs (2026-12-01): most of it is launching and starting CTAs. With `pdl=1` each kernel waits for the
# previous grid (`griddepcontrol.wait`) before its first global access and lets the next one
# launch early, so the down GEMM's CTAs are resident when gate_up ends. The effect is between
# the calls, so it is timed on the pair, as `chord bench` does (CUDA-graph replay and eager):
# live on an H200, else the committed table, else a line saying it has not been measured yet.

# %%
PDL_POINTS = [("tp8-m1", "indexed"), ("tp8-m64", "indexed"), ("ep8-decode-tok1", "indexed")]
PDL_VARIANTS = {"profile": {}, "pdl on": {"pdl": 1}}
pdl_rows, where = ablate.pair_ablation("06_pdl", PDL_POINTS, PDL_VARIANTS,
                                       "gate_up + down pair, the profile's schedules with pdl off / on")
print(where)
if pdl_rows:
    print(ablate.pair_table(pdl_rows, list(PDL_VARIANTS)))
for r in ablate.pair_schedules(PDL_POINTS, PDL_VARIANTS):
    print(f"{r['scenario']:16s} {r['variant']:8s} gate_up {r['gate_up']:36s} down {r['down']}")

# %% [markdown]
# ## Live: these calls next to upstream Humming
# `chord.lab.workbench.compare` runs the bench on this notebook's scenario and family: Chord here,
# upstream humming-kernels 0.1.20 in a worker subprocess with its own install
# (`CHORD_HUMMING_DIR`); without a GPU, the committed H200 run's rows of the same cell.

# %%
from chord.lab.workbench.compare import show_comparison

vs_humming = show_comparison(SCENARIO, "indexed", quick=QUICK)

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord capture` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.lab.workbench.captures import show_capture

show_capture(SCENARIO, "indexed")

# %% [markdown]
# ## Invariant
# Split-K spreads the same tiles over more CTAs (split_k x the tiles of the unsplit schedule),
# and switching it off is the same schedule with split_k = 1; multi-tile CTAs do the opposite
# along N (n_tiles times fewer CTAs), and switching them off is the same schedule with 1.

# %%
from chord.schedule import Schedule

s = Schedule.from_id(decision_row("tp8", "indexed", "gate_up", 8 / 384)["schedule"])
split = optimizations.BY_NAME["split-K"]
if split.is_on(s):
    off = split.switch_off(s)
    assert off.split_k == 1 and {kn for kn in s.knobs() if getattr(off, kn) != getattr(s, kn)} == {"split_k"}
    from chord.lab.workbench.explore import tile_count

    assert tile_count(384, 8 / 384, s.block_m, 512, s.block_n, s.split_k) == \
        s.split_k * tile_count(384, 8 / 384, off.block_m, 512, off.block_n, 1)
print("split-K invariants hold for", s.id)

# n_tiles: the CTAs along N shrink by n_tiles, and switching it off is the same schedule with 1
d = Schedule.from_id(decision_row("tp8", "indexed", "down", 256 * 8 / 384)["schedule"])
multi = optimizations.BY_NAME["multi-tile CTAs"]
assert multi.is_on(d), d.id
off = multi.switch_off(d)
assert off.n_tiles == 1 and {kn for kn in d.knobs() if getattr(off, kn) != getattr(d, kn)} == {"n_tiles"}
assert off.grid_n(7168) == d.n_tiles * d.grid_n(7168)
print("n_tiles invariants hold for", d.id)

# warp-private rings: the off side is the CTA ring with at most block_n / 16 warps, the same tile otherwise
rings = optimizations.BY_NAME["warp-private rings"]
for c in direct["gate_up"] + direct["down"]:
    off = rings.switch_off(c)
    assert rings.is_on(c) and not off.direct and off.warps == min(c.warps, c.block_n // 16)
    assert {kn for kn in c.knobs() if getattr(off, kn) != getattr(c, kn)} <= {"direct", "warps"}
print("direct invariants hold for", len(direct["gate_up"]) + len(direct["down"]), "candidates")

# measured live: n_tiles off gives the same bits; the split-K gate's variants agree to rounding
assert nt and all(r["same_bits_as_first"] for r in nt), nt
assert sk and all(r["rel_err_vs_first"] < 1e-2 for r in sk), sk
