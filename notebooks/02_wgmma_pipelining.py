# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 — The WGMMA main loop and its pipelining
#
# Compute-heavy tiles (64+ rows per expert) run `wgmma.m64n{BT}k16`: each warp dequantizes its
# 16 weight rows (swap16 words) straight into the A registers, the tensor cores read the token
# tile from the 128-byte-swizzled cp.async ring. Three knobs of that one kernel template:
#
# * `mainloop` — `wgmma`, or the foundation loop `mma` (mma.sync.m16n8k16; same weight layout);
# * `wgmma_wait` — batched `wait_group 1` (dequantize block kb+1 while block kb runs) or 0;
# * `producer` — a warp-specialized producer warpgroup with mbarriers, or every thread copies.
#
# An ablation is the same call with one knob at its "off" value (`chord.optimizations`).

# %% tags=["parameters"]
QUICK = True
SCENARIO = "ep8-prefill-tok512"
FAMILY = "grouped_contiguous"
GEMM = "gate_up"

# %%
from chord import optimizations
from chord.schedule import profile_for, select
from chord.lab.bench.suite import load_suite
from chord.lab.workbench import best_by, recorded_file, recorded_tuning
from chord.lab.workbench import figures

sc = load_suite().scenario(SCENARIO)
n, k, prob = sc.gemm_problem(FAMILY, GEMM)
sched = select(profile_for(FAMILY, sc.experts, n, k), prob)
ablations = optimizations.ablations(sched)
print("profile schedule:", sched.id)
for name, s in ablations.items():
    print(f"  {name:28s} off -> {s.id}")

# %% [markdown]
# ## mma.sync vs WGMMA over the suite (recorded)
# The fastest schedule of each main loop per GEMM point, from the committed `chord tune` run
# (every candidate checked against the profile's output before it was timed).

# %%
points = recorded_tuning()
rows = best_by([p for p in points if p["rows_per_expert"] >= 12], {
    "mma": lambda s: s.mainloop == "mma",
    "wgmma": lambda s: s.mainloop == "wgmma" and s.raster == 0,
    "wgmma+raster": lambda s: s.mainloop == "wgmma" and s.raster > 0,
})
print(f"recorded: {recorded_file(points[0]['file'])}")
print(f"{'scenario':20s} {'family':20s} {'gemm':8s} {'mma us':>8s} {'wgmma us':>9s} {'ratio':>6s}")
for r in rows:
    w = min(v for v in (r["wgmma_us"], r["wgmma+raster_us"]) if v is not None) if r["wgmma_us"] else None
    ratio = f"{w / r['mma_us']:.2f}" if w else "-"
    print(f"{r['scenario']:20s} {r['family']:20s} {r['gemm']:8s} {r['mma_us']:8.0f} "
          f"{(f'{w:9.0f}' if w else '        -')} {ratio:>6s}")
figures.ablation_figure(rows, ["mma", "wgmma", "wgmma+raster"], "best schedule of each main loop per GEMM (H200)")

# %% [markdown]
# ## Measured: the profile's schedule and each knob switched off
# This times the scenario's GEMM under the profile schedule, each of its ablations and the
# warp-specialized producer switched on (`chord.lab.workbench.ablate`: `chord.lab.tune.time_schedules`,
# the inputs of `chord tune`, do_bench median of a CUDA-graph replay) and checks whether the
# outputs are bit-identical (wait_group 1 vs 0 and the raster must be; another main loop only
# agrees to rounding). Live on an H200, else the committed table of the same run.

# %%
from chord.lab.workbench import ablate

from chord.schedule import override


def _producer_on(prof, prob):
    s = select(prof, prob, "profile")
    try:  # the producer loop needs wgmma, consumer warps to take its registers and one CTA per SM
        return override(s, producer=1, ctas_per_sm=1, n_tiles=1) if s.mainloop == "wgmma" else None
    except ValueError:
        return None


VARIANTS = {"profile": ablate.policy("profile"), **{f"{name} off": ablate.knob_off(name) for name in ablations},
            "producer on": _producer_on}
LABELS = list(VARIANTS)
live, where = ablate.ablation("02_wgmma_knobs", [(SCENARIO, FAMILY, GEMM)], VARIANTS,
                              "the profile's wgmma schedule with each knob off, and the producer on",
                              rep_ms=20 if QUICK else 100)
print(where)
for r in live:
    same = "bit-identical" if r["same_bits_as_first"] else f"rel_err {r['rel_err_vs_first']:.1e}"
    print(f"{r['variant']:36s} {r['schedule']:45s} {r['us']:9.1f} us  {r['TFLOP_per_s']:6.0f} TFLOP/s  {same}")

# %% [markdown]
# ## Measured: wide warp tiles
# A warp may own 2 or 4 16-feature weight tiles (`block_n / 16 / warps`): block_n 512 on 8 warps
# at 32-64 token rows, 256 on 8 warps up to 192. Each token row is then read by fewer CTAs and
# each CTA barrier covers more MACs; the 2-4x accumulators fit because the dequantized A
# operand is issued in groups of one or two k16 steps (`group_steps`) instead of a whole K block.
# The heuristic's `wide_warp_tiles` rule on and off (`heuristic,-wide_warp_tiles`: wgmma only
# above 40 rows per touched expert, one weight tile per warp), next to the tuned profile, on the
# GEMMs where the profile took wide tiles. Outputs are bit-identical whatever the tile (the same
# MMAs per output element in the same order).

# %%
POINTS_W = [("ep8-decode-tok32", "indexed", "gate_up"), ("ep8-decode-tok32", "grouped_masked", "gate_up"),
            ("ep8-prefill-tok64", "grouped_contiguous", "gate_up"), ("ep8-prefill-tok128", "indexed", "gate_up"),
            ("tp8-m1024", "indexed", "gate_up"), ("tp8-m16384", "indexed", "gate_up")]
abl_w, _ = ablate.rule_ablation("02_wide_warp_tiles", "wide_warp_tiles", "wide tiles off", POINTS_W,
                                "wide warp tiles on/off under the heuristic policy, and the profile",
                                rep_ms=20 if QUICK else 100)

# %% [markdown]
# ## Measured: bulk weight copies
# In the `swap16g` layout a stage's weights for 128 features are one contiguous 4 KB run (and
# 512 bytes of scales), so one thread can hand the whole stage to the copy engine
# (`cp.async.bulk`, knob `bulk_w`, id token `bw1`) instead of every thread issuing 16-byte
# cp.async copies. Same bits, and slower on every tile measured (recorded A/B, run 1 of the
# the 37dd90f runs (2026-12-01) file): the copy engine fed by one thread delivers the weights later than the CTA's
# threads do. No profile rule uses it.

# %%
from chord.lab.workbench import figures, knob_pairs, recorded_file, recorded_timing
from chord.lab.workbench.tables import show_pairs

bw = [r for r in knob_pairs(recorded_timing("2026-12-01-h200-timing-37dd90f-bulk-tma-pairs"), "bulk_w", 0, "bw1", "off")
      if r["run"] == 1]
show_pairs(bw, "bw1", "off", f"recorded: {recorded_file(bw[0]['file'])}")
figures.ablation_figure(bw, ["off", "bw1"], "bulk weight copies on / off (one GEMM, recorded A/B)")

# %% [markdown]
# ## Live: these calls next to upstream Humming
# `chord.lab.workbench.compare` runs the bench on this notebook's scenario and family: Chord here,
# upstream humming-kernels 0.1.20 in a worker subprocess with its own install
# (`CHORD_HUMMING_DIR`); without a GPU, the committed H200 run's rows of the same cell.

# %%
from chord.lab.workbench.compare import show_comparison

vs_humming = show_comparison(SCENARIO, FAMILY, quick=QUICK)

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord capture` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.lab.workbench.captures import show_capture

show_capture(SCENARIO, FAMILY)

# %% [markdown]
# ## Invariant
# Batched `wait_group 1` and the raster change when the tensor cores run, never what they
# compute: switching either off gives the same schedule otherwise, and live, the same bits.

# %%
wait = optimizations.BY_NAME["batched wgmma.wait_group 1"]
if wait.is_on(sched):
    off = wait.switch_off(sched)
    assert {kn for kn in sched.knobs() if getattr(off, kn) != getattr(sched, kn)} == {"wgmma_wait"}
for r in live:
    if r["variant"] in {f"{name} off" for name in ablations if name != "wgmma main loop"}:
        assert r["same_bits_as_first"], r
assert all(r["wgmma_us"] is None or r["wgmma_us"] > 0 for r in rows)
for r in abl_w:  # wide or narrow warp tiles: the same MMAs per output element, the same bits
    assert r["same_bits_as_first"], r
print("invariants hold for", sched.id)
