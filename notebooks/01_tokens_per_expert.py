# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 — Tokens per expert decide the schedule
#
# The number of routed rows per local expert (tok_e), not the token count, decides which tile
# and main loop win: decode (1-32 rows/expert) streams the INT4 weights with small `mma.sync`
# tiles; prefill (64+) needs the 128x256 WGMMA tile. Drag the slider: the decision below is
# `chord.schedule.explain` — the same function `chord.ops`, `chord bench` and the vLLM `humming`
# root call — with what the tile means on 132 SMs (tiles, waves, padding).

# %% tags=["parameters"]
QUICK = True
DEPLOYMENT = "ep8"  # "ep8" (48 experts) or "tp8" (384)
FAMILY = "indexed"  # "indexed", "grouped_contiguous" or "grouped_masked"
GEMM = "gate_up"  # "gate_up" or "down"
TOK_E = 64

# %%
from chord.lab.workbench import decision_row, sweep_tok_e
from chord.lab.workbench import figures
from chord.lab.workbench.widgets import TOK_E_GRID, tok_e_explorer

explorer, state = tok_e_explorer(DEPLOYMENT, FAMILY, GEMM, TOK_E)
explorer

# %% [markdown]
# ## The decision at the parameters' tok_e

# %%
row = decision_row(DEPLOYMENT, FAMILY, GEMM, TOK_E)
print(row["schedule"], "-", row["reason"])
print(f"{row['tiles']} tiles on {row['waves']} wave(s) of 132 SMs x {row['ctas_per_sm']} CTA(s): "
      f"wave efficiency {100 * row['wave_efficiency']:.0f} %, padding {100 * row['padding']:.0f} %")

# %% [markdown]
# ## The sweep
# block_m follows rows per expert; the green band is where the profile switches to the WGMMA
# main loop. Padding is the share of computed token rows that are padding (rows per expert not a
# multiple of block_m); wave efficiency = tiles / (waves x SMs x CTAs per SM).

# %%
rows = sweep_tok_e(DEPLOYMENT, FAMILY, GEMM, TOK_E_GRID)
print(f"{'tok_e':>6s}  {'schedule':40s} {'tiles':>6s} {'waves':>5s} {'wave eff':>8s} {'padding':>7s}")
for r in rows:
    print(f"{r['tok_e']:6g}  {r['schedule']:40s} {r['tiles']:6d} {r['waves']:5d} {100 * r['wave_efficiency']:7.0f}% "
          f"{100 * r['padding']:6.0f}%")
figures.sweep_figure(rows, marker=row)

# %% [markdown]
# ## Measured: the tok_e block-M rule switched off
# The heuristic policy (no profile row) with its tok_e rule on and off, next to the tuned
# profile, on a decode, a prefill and a TP8 point: `chord.lab.workbench.ablate` times each distinct
# schedule once (`chord.lab.tune.time_schedules`), live on an H200, else the committed table.

# %%
from chord.lab.workbench import ablate

POINTS = [("ep8-decode-tok1", "indexed", "gate_up"), ("ep8-prefill-tok128", "indexed", "gate_up"),
          ("tp8-m4096", "indexed", "gate_up")]
abl, LABELS = ablate.rule_ablation("01_tok_e_rule", "tok_e_block_m", "tok_e rule off", POINTS,
                                   "tok_e block-M rule on/off under the heuristic policy, and the tuned profile")
figures.ablation_figure(ablate.figure_rows(abl, LABELS), LABELS, "tok_e block-M rule: on, off, tuned profile")

# %% [markdown]
# ## Live: these calls next to upstream Humming
# `chord.lab.workbench.compare` runs the bench on this notebook's scenario and family: Chord here,
# upstream humming-kernels 0.1.20 in a worker subprocess with its own install
# (`CHORD_HUMMING_DIR`); without a GPU, the committed H200 run's rows of the same cell.

# %%
from chord.lab.workbench.compare import show_comparison

vs_humming = show_comparison("ep8-prefill-tok128" if DEPLOYMENT == "ep8" else "tp8-m4096", FAMILY, quick=QUICK)

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord capture` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.lab.workbench.captures import show_capture

show_capture("ep8-prefill-tok128" if DEPLOYMENT == "ep8" else "tp8-m4096", FAMILY)

# %% [markdown]
# ## Invariant: one decision, whoever calls
# For every tok_e of the sweep, the schedule shown here is the one vLLM gets through the
# `humming` root's tuning rows (`valid_shape_m` = routed rows), and block_m never shrinks as
# tok_e grows.

# %%
from humming import tune

from chord.lab.workbench.explore import gemm_shape

e, n, k = gemm_shape(DEPLOYMENT, GEMM)
table = tune.rows_for(FAMILY, e, n, k)
for r in rows:
    assert tune.row_for(table, r["rows"])["schedule"] == r["schedule"], r["tok_e"]
assert all(a["block_m"] <= b["block_m"] for a, b in zip(rows, rows[1:]))
print("the workbench, chord.ops and the vLLM path agree on", len(rows), "shapes")

# the measured ablation: every variant computed the same product (to bf16 rounding), and with the
# rule on the token tile covers the rows of an expert (the tok_e rule's promise)
from chord.schedule import Schedule

assert abl and all(r["rel_err_vs_first"] < 1e-2 for r in abl), abl
for r in ablate.schedules(POINTS, {"heuristic": ablate.policy("heuristic")}):
    bm = Schedule.from_id(r["schedule"]).block_m
    assert bm >= min(r["rows_per_expert"], 256) or bm == 256, r
