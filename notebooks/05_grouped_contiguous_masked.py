# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 — The grouped families: contiguous (prefill) and masked (decode)
#
# On the expert-parallel path the tokens arrive already permuted per expert, so the kernel needs
# no gather index: **grouped_contiguous** reads the rows of expert e from `[off[e], off[e+1])`
# (int64 offsets, any alignment); **grouped_masked** reads `[E, max_rows, K]` with a count per
# expert, and rows past an expert's count cost nothing. The **indexed** family consumes vLLM's
# `moe_align_block_size` routing instead. The same main loops run all three; only the row source
# differs (`csrc/moe/rows.cuh`). Masked decode keeps a latency-tuned amount of K in flight
# (buffered-K, measured below).

# %% tags=["parameters"]
QUICK = True
M, E, TOP_K = 12, 6, 2  # a small routing to look at

# %%
import torch

from chord import optimizations, routing
from chord.lab.bench.report import pivot
from chord.lab.workbench import recorded_results, where_results_come_from

ids = routing.random_topk_ids(M, E, TOP_K, seed=3)
x = torch.randn(M, 64).bfloat16()
ind = routing.align_block_size(ids, 8, E)
con = routing.contiguous_layout(x, ids, E)
msk = routing.masked_layout(x, ids, E, max_rows=M)
print("topk_ids:", ids.tolist())
print("indexed   : sorted_ids", ind.sorted_ids[: int(ind.num_tokens_post_padded[0])].tolist(),
      "\n            expert_ids", ind.expert_ids[: int(ind.num_tokens_post_padded[0]) // 8].tolist(),
      "(blocks of 8, sentinel", ind.num_rows, ")")
print("contiguous: expert_offsets", con.expert_offsets.tolist(), "rows", tuple(con.x.shape))
print("masked    : expert_num_tokens", msk.expert_num_tokens.tolist(), "input", tuple(msk.x.shape))
print(optimizations.BY_NAME["latency-tuned buffered-K"].status, "- latency-tuned buffered-K:",
      optimizations.BY_NAME["latency-tuned buffered-K"].what)

# %% [markdown]
# ## The families side by side (recorded H200 run)
# Indexed vs contiguous at prefill, indexed vs masked at decode: same routing, same weights.

# %%
res = recorded_results()
print(where_results_come_from(res))
by = {}
for c in pivot(res):
    by.setdefault(c["scenario"], {})[c["family"]] = c
print(f"{'scenario':20s} {'indexed us':>10s} {'grouped us':>10s} {'grouped family':18s} {'grouped/indexed':>15s}")
for scen, fams in by.items():
    other = [f for f in fams if f != "indexed"]
    if "indexed" in fams and other:
        a, b = fams["indexed"]["chord_us"], fams[other[0]]["chord_us"]
        print(f"{scen:20s} {a:10.1f} {b:10.1f} {other[0]:18s} {b / a:15.2f}")

# %% [markdown]
# ## Measured: the tile raster on the contiguous family
# Groups of token tiles walk every N block before the next group, so an expert's weights are read
# from HBM once per group; off: launch order. The profile's schedule and the same schedule with
# `raster=0` (`chord.lab.workbench.ablate`: live on an H200, else the committed table).

# %%
from chord.lab.workbench import ablate

LABELS = ["profile", "raster off"]
VARIANTS = {"profile": ablate.policy("profile"), "raster off": ablate.knob_off("tile raster")}
POINTS = [("ep8-prefill-tok128", "grouped_contiguous", "gate_up"), ("ep8-prefill-tok512", "grouped_contiguous", "gate_up")]
abl, where = ablate.ablation("05_raster", POINTS, VARIANTS, "tile raster on/off on the profile's contiguous schedules")
ablate.show_table(abl, LABELS, where)

# %% [markdown]
# ## Measured: the heuristic's raster on every wgmma tile
# The heuristic policy gives every wgmma schedule with more than one token tile raster 8, also
# when each expert has one token tile (then 8 experts' tiles walk the N blocks together); off
# (`heuristic,-wgmma_raster`): launch order. Next to it the tuned profile.

# %%
POINTS_R = [("ep8-prefill-tok64", "grouped_contiguous", "gate_up"), ("ep8-prefill-tok128", "grouped_contiguous", "gate_up"),
            ("ep8-prefill-tok128", "grouped_contiguous", "down"), ("ep8-prefill-tok256", "grouped_contiguous", "down")]
abl_r, _ = ablate.rule_ablation("05_wgmma_raster", "wgmma_raster", "raster rule off", POINTS_R,
                                "raster 8 on every wgmma tile on/off under the heuristic policy, and the profile")

# %% [markdown]
# ## Measured: latency-tuned buffered-K on masked decode
# Grouped decode on the mma loop streams weights, so the ring depth sets how many bytes each CTA
# keeps in flight against HBM latency. The heuristic's `buffered_k` rule asks for about 512 K
# elements in flight per CTA (8 stages of 64) at the most CTAs per SM whose ring fits; off
# (`heuristic,-buffered_k`): the knob default ring of 4 stages (256 K elements). A deeper ring,
# 768 K elements for large masked blocks (12 stages at 32 rows per expert) measured 11-12 % slower than 8
# stages on the H200 (docs/optimizations.md), so the rule does not use it. The 8 stages are what
# the heuristic chose before the rule existed; against 4 stages they measure within 3 % either
# way. Next to it the tuned profile.

# %%
POINTS_B = [(f"ep8-decode-tok{t}", "grouped_masked", g) for t in (1, 4, 12, 32) for g in ("gate_up", "down")]
abl_b, _ = ablate.rule_ablation("05_buffered_k", "buffered_k", "buffered-K off", POINTS_B,
                                "buffered-K on/off under the heuristic policy on masked decode, and the profile")
from chord.schedule import Schedule

for r in ablate.schedules(POINTS_B[-2:], {"heuristic": ablate.policy("heuristic")}):
    s = Schedule.from_id(r["schedule"])
    print(r["scenario"], r["gemm"], r["schedule"], f"{s.stages * 64} K elements in flight per CTA,",
          f"{s.smem_bytes * s.ctas_per_sm // 1024} KB of shared memory per SM")

# %% [markdown]
# ## Measured: TMA activation copies and CTA pairs
# On the grouped families a token tile's rows are consecutive rows of x, so the wgmma loop can
# move the whole block_m x 64 activation box of a stage with one TMA copy through a tensor map
# (`tma_x`, id token `tx1`) instead of every thread's 16-byte cp.async gather, and launch CTAs
# in clusters of two that take neighbouring N blocks of one token tile (`cluster_n`, `cn2`),
# so the pair reads its token rows from L2 together. Both give the same bits. Recorded A/B on
# the H200 (run 6 of the the 37dd90f runs (2026-12-01) file: the committed kernels, one machine instance); the
# profile uses `r2-tx1-cn2` on the 256-row tiles of tok256 / tok512 contiguous and `cn2` on masked
# decode at 32 rows per expert. Multicasting the box between the pair measured slower (runs 2-5,
# docs/optimizations.md).

# %%
from chord.lab.workbench import figures, knob_pairs, recorded_file, recorded_timing
from chord.lab.workbench.tables import show_pairs

s9 = recorded_timing("2026-12-01-h200-timing-37dd90f-bulk-tma-pairs")
for knob, label in (("tma_x", "tx1"), ("cluster_n", "cn2")):
    pairs = [r for r in knob_pairs(s9, knob, 0 if knob == "tma_x" else 1, label, "off") if r["run"] == 6
             and r["family"] != "indexed"]
    show_pairs(pairs, label, "off", f"{knob}: recorded {recorded_file(pairs[0]['file'])}")
    figures.ablation_figure(pairs, ["off", label], f"{knob} on / off (one GEMM, recorded A/B)")

# %% [markdown]
# ## Live: these calls next to upstream Humming
# `chord.lab.workbench.compare` runs the bench on this notebook's scenario and family: Chord here,
# upstream humming-kernels 0.1.20 in a worker subprocess with its own install
# (`CHORD_HUMMING_DIR`); without a GPU, the committed H200 run's rows of the same cell.

# %%
from chord.lab.workbench.compare import show_comparison

vs_humming = show_comparison("ep8-prefill-tok128", "grouped_contiguous", quick=QUICK)

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord capture` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.lab.workbench.captures import show_capture

show_capture("ep8-prefill-tok128", "grouped_contiguous")

# %% [markdown]
# ## Invariant
# The three layouts hold exactly the routed rows: contiguous offsets end at M * top_k, masked
# counts sum to it, and indexed pads each expert to whole blocks of its block size.

# %%
rows = M * TOP_K
assert int(con.expert_offsets[-1]) == rows == int(msk.expert_num_tokens.sum())
used = int(ind.num_tokens_post_padded[0])
assert used % 8 == 0 and rows <= used <= rows + E * 7
valid = ind.sorted_ids[:used]
assert sorted(valid[valid < ind.num_rows].tolist()) == list(range(rows))
print("layouts agree on", rows, "routed rows")

# the raster changes the launch order, never the arithmetic: bit-identical outputs
assert abl and all(r["same_bits_as_first"] for r in abl if r["variant"] == "raster off"), abl
assert abl_r and all(r["same_bits_as_first"] for r in abl_r if r["variant"] == "raster rule off"), abl_r
# the ring depth changes when a K block is loaded, never the arithmetic: the 4-stage ring gives the
# 8-stage ring's bits (the profile's tile may differ in BN or main loop: rounding only)
assert abl_b and all(r["same_bits_as_first"] for r in abl_b if r["variant"] == "buffered-K off"), abl_b
assert all(r["rel_err_vs_first"] < 1e-2 for r in abl_b), abl_b
