# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 — BN 128 vs 256: waves, the last wave, and measured time
#
# The N width of a tile trades the number of CTAs against work per CTA: BN = 256 halves the
# tiles, which pays when they still fill whole waves of the 132 SMs and costs a half-empty last
# wave otherwise. The *wave-aware BN* rule (BN = 256 only when its tiles fill whole
# waves, at least one and the last >= 90 % full) is a rule of the heuristic selection policy
# (`select(..., policy="heuristic")`; off: `"heuristic,-wave_aware_bn"`); the tuned profile keeps
# whichever width `chord tune` measured faster. This notebook shows the prediction (waves,
# last-wave utilization, from tile counts), the rule's measured ablation, and the fastest
# measured schedule of each width per GEMM point (the committed `chord tune` run).

# %% tags=["parameters"]
QUICK = True
DEPLOYMENT = "ep8"
FAMILY = "indexed"
GEMM = "gate_up"

# %%
from chord import optimizations
from chord.lab.workbench import SMS_H200, best_by, decision_row, recorded_file, recorded_tuning
from chord.lab.workbench import figures
from chord.lab.workbench.explore import gemm_shape, tile_count, waves

print(optimizations.BY_NAME["wave-aware BN"].status, "-", optimizations.BY_NAME["wave-aware BN"].what)

# %% [markdown]
# ## Predicted: tiles and waves per BN over tokens per expert

# %%
e, n, k = gemm_shape(DEPLOYMENT, GEMM)
print(f"{DEPLOYMENT} {FAMILY} {GEMM}: {e} experts, N={n}, K={k}, {SMS_H200} SMs; block_m is the profile's")
print(f"{'tok_e':>6s} {'block_m':>7s} | {'BN':>4s} {'tiles':>6s} {'waves':>5s} {'last wave':>9s} | "
      f"{'BN':>4s} {'tiles':>6s} {'waves':>5s} {'last wave':>9s}")
pred = []
for tok_e in (1, 4, 12, 32, 64, 128, 256, 512):
    bm = decision_row(DEPLOYMENT, FAMILY, GEMM, tok_e)["block_m"]
    cells = []
    for bn in (128, 256):
        tiles = tile_count(e, tok_e, bm, n, bn)
        w, last = waves(tiles)
        cells.append((bn, tiles, w, last))
        pred.append({"tok_e": tok_e, "bn": bn, "tiles": tiles, "waves": w, "last_wave": last})
    print(f"{tok_e:6d} {bm:7d} | " + " | ".join(f"{bn:4d} {t:6d} {w:5d} {100 * lw:8.0f}%" for bn, t, w, lw in cells))

# %% [markdown]
# ## Measured: the fastest schedule of each width per suite GEMM (recorded)

# %%
points = recorded_tuning()
rows = best_by(points, {"BN=128": lambda s: s.block_n == 128, "BN=256": lambda s: s.block_n == 256})
print(f"recorded: {recorded_file(points[0]['file'])}")
print(f"{'scenario':20s} {'family':20s} {'gemm':8s} {'BN=128 us':>10s} {'BN=256 us':>10s} {'256/128':>8s}")
for r in rows:
    a, b = r["BN=128_us"], r["BN=256_us"]
    ratio = f"{b / a:8.2f}" if a and b else "       -"
    print(f"{r['scenario']:20s} {r['family']:20s} {r['gemm']:8s} {a or float('nan'):10.1f} {b or float('nan'):10.1f} {ratio}")
figures.ablation_figure(rows, ["BN=128", "BN=256"], "fastest schedule per block_n and GEMM (H200, chord tune)")

# %% [markdown]
# ## Measured: the wave-aware BN rule switched off
# The heuristic policy with the rule on (BN 256 only when its tiles fill whole waves) and off
# (BN 128 always), next to the tuned profile (`chord.lab.workbench.ablate`: live on an H200, else
# the committed table).

# %%
from chord.lab.workbench import ablate

POINTS = [("ep8-decode-tok1", FAMILY, "gate_up"), ("ep8-decode-tok12", FAMILY, "gate_up"),
          ("tp8-m1024", "indexed", "gate_up")]
abl, LABELS = ablate.rule_ablation("04_wave_aware_bn", "wave_aware_bn", "wave rule off", POINTS,
                                   "wave-aware BN on/off under the heuristic policy, and the tuned profile")
for r in ablate.schedules(POINTS, {"heuristic": ablate.policy("heuristic")}):
    print(r["scenario"], r["gemm"], "-", decision_row("tp8" if r["scenario"].startswith("tp8") else "ep8", r["family"],
                                                       r["gemm"], r["rows_per_expert"], policy="heuristic")["reason"])
figures.ablation_figure(ablate.figure_rows(abl, LABELS), LABELS, "wave-aware BN: on, off, tuned profile")

# %% [markdown]
# ## Measured: the touched-experts estimate switched off
# The wave rule counts the tiles of the experts a batch touches. For routes spread uniformly at
# random that is E (1 - (1 - 1/E)^rows): 48 rows touch about 31 of 48 experts, 64 TP8 tokens (512
# routes) about 283 of 384. Switched off (`heuristic,-touched_estimate`) every expert counts as
# touched once there are as many rows as experts, which is exact only for balanced routing. The
# suite's EP8 routing is balanced (every expert gets tok_e rows) and its TP8 routing random, so
# the estimate is right for TP8 and pessimistic for the EP8 decode point.

# %%
POINTS_T = [("ep8-decode-tok1", "indexed", "gate_up"), ("tp8-m64", "indexed", "gate_up"),
            ("tp8-m256", "indexed", "gate_up")]
abl_t, LABELS_T = ablate.rule_ablation("04_touched_estimate", "touched_estimate", "touched as balanced", POINTS_T,
                                       "touched-experts estimate on/off under the heuristic policy, and the tuned profile")
figures.ablation_figure(ablate.figure_rows(abl_t, LABELS_T), LABELS_T, "touched-experts estimate: on, off, profile")

# %% [markdown]
# ## Live: these calls next to upstream Humming
# `chord.lab.workbench.compare` runs the bench on this notebook's scenario and family: Chord here,
# upstream humming-kernels 0.1.20 in a worker subprocess with its own install
# (`CHORD_HUMMING_DIR`); without a GPU, the committed H200 run's rows of the same cell.

# %%
from chord.lab.workbench.compare import show_comparison

vs_humming = show_comparison("ep8-prefill-tok512" if DEPLOYMENT == "ep8" else "tp8-m16384", FAMILY, quick=QUICK)

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord capture` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.lab.workbench.captures import show_capture

show_capture("ep8-prefill-tok512" if DEPLOYMENT == "ep8" else "tp8-m16384", FAMILY)

# %% [markdown]
# ## Invariant
# The predicted waves cover every tile exactly once (no tile lost or counted twice), and BN=256
# never has more waves than BN=128 for the same block_m.

# %%
for tok_e in {p["tok_e"] for p in pred}:
    a, b = (next(p for p in pred if p["tok_e"] == tok_e and p["bn"] == bn) for bn in (128, 256))
    for p in (a, b):
        assert (p["waves"] - 1) * SMS_H200 < p["tiles"] <= p["waves"] * SMS_H200
    assert b["tiles"] * 2 == a["tiles"] and b["waves"] <= a["waves"]
print("wave arithmetic holds for", len(pred) // 2, "shapes")

# the measured ablation: same product for every variant; the rule off never picks BN 256
assert abl and all(r["rel_err_vs_first"] < 1e-2 for r in abl), abl
from chord.schedule import Schedule

assert all(Schedule.from_id(r["schedule"]).block_n <= 128 for r in abl if r["variant"] == "wave rule off")
# the touched-experts estimate only moves BN (and so the tile grid), never the arithmetic of a row:
# every variant's output has the first variant's bits, and counted as balanced the heuristic never
# takes a narrower tile than with the estimate
assert abl_t and all(r["same_bits_as_first"] for r in abl_t), abl_t
for key in {(r["scenario"], r["gemm"]) for r in abl_t}:
    by = {r["variant"]: Schedule.from_id(r["schedule"]) for r in abl_t if (r["scenario"], r["gemm"]) == key}
    assert by["touched as balanced"].block_n >= by["heuristic"].block_n, (key, by)
