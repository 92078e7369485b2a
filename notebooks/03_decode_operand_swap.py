# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 — Decode: the operand swap, and how close the weights stream to HBM
#
# At 1-32 rows per expert a GEMM is a weight stream: every INT4 weight is read once and used by
# a handful of tokens. Chord puts the dequantized weights on the MMA's M side (16 rows per
# m16n8k16 tile) and the tokens on N (8 per tile), so a tile of 8 tokens wastes nothing where an
# unswapped kernel would pad the tokens to 16 rows. The swap is the `swap` knob of the mma main
# loop: its off side (`swap=0`) runs the same copies and the same dequantized weight registers
# with the tokens on the M side in 16-row tiles. Measured here: what the swap buys over tok_e
# 1-32 (the ablation, live on an H200 or the committed table), weight bytes per second against
# the HBM ceiling, what the tile-grouped weight layout buys, and these calls next to upstream
# Humming. Semi-static token slicing (the `queue` knob of persistent schedules: 0, the static walk,
# against 1, a dynamic work queue) is measured in docs/optimizations.md.

# %% tags=["parameters"]
QUICK = True
FAMILY = "grouped_masked"

# %%
import torch

from chord import optimizations
from chord.lab.bench.ceilings import Ceilings
from chord.lab.bench.floors import scenario_floor, weight_bytes
from chord.lab.bench.inputs import make_topk_ids
from chord.lab.bench.report import pivot
from chord.lab.bench.suite import load_suite
from chord.schedule import Schedule
from chord.lab.workbench import decision_row, recorded_results, where_results_come_from

for name in ("decode operand swap", "semi-static token slicing"):
    o = optimizations.BY_NAME[name]
    print(f"{name:28s} {o.status}" + (f" (issue {o.issue})" if o.issue else f" (knob {o.knob})") + f": {o.what}")
r = decision_row("ep8", "grouped_masked", "gate_up", 4)
print("EP8 decode at 4 rows/expert:", r["schedule"], "- block_m", r["block_m"], "tokens on the MMA's N side")

# %% [markdown]
# ## Weight streaming rate at decode (recorded H200 run)
# Bytes = INT4 weights + bf16 scales of the experts the routing touches, for gate_up + down;
# rate = bytes / measured time; the ceiling is the copy bandwidth measured in the same run.

# %%
res = recorded_results()
print(where_results_come_from(res))
c = res["meta"]["ceilings"]
ceil = Ceilings(c["copy_TB_per_s"], c["bf16_matmul_TFLOP_per_s"])
suite = load_suite()
rates = []
print(f"{'scenario':18s} {'family':16s} {'weights MB':>10s} {'Chord us':>9s} {'TB/s':>6s} {'% copy':>7s} "
      f"{'Humming us':>10s} {'TB/s':>6s}")
for cell in pivot(res):
    sc = suite.scenario(cell["scenario"])
    if sc.rows_per_expert > 32 or not cell.get("chord_us"):
        continue
    touched = int(torch.unique(make_topk_ids(sc)).numel())
    wbytes = touched * (weight_bytes(sc.n_gate_up, sc.k_gate_up) + weight_bytes(sc.n_down, sc.k_down))
    h = cell.get("humming_us", cell.get("humming_committed_us"))
    rate = wbytes / cell["chord_us"] / 1e6
    rates.append(rate)
    print(f"{sc.id:18s} {cell['family']:16s} {wbytes / 1e6:10.1f} {cell['chord_us']:9.1f} {rate:6.2f} "
          f"{100 * rate / ceil.copy_TB_per_s:6.1f}% {h or float('nan'):10.1f} {wbytes / h / 1e6 if h else float('nan'):6.2f}")

# %% [markdown]
# ## The swap's ablation: swapped vs unswapped over tok_e
# For each decode point: the profile's schedule, and the same schedule with `swap=0` (an 8-row
# token tile becomes a 16-row one: tokens on M come in 16-row MMA tiles). Both through
# `chord.lab.tune.time_schedules` (the inputs of `chord tune`, do_bench median of a CUDA-graph
# replay); the off side's output is checked against the swapped one. wgmma schedules have no
# unswapped side (the weights are always wgmma's register A operand) and are skipped.

# %%
from chord.schedule import profile_for, select
from chord.lab.workbench.data import live_or_recorded

SWAP = optimizations.BY_NAME["decode operand swap"]
POINTS = ("ep8-decode-tok1", "ep8-decode-tok4", "ep8-decode-tok32") if QUICK else \
    ("ep8-decode-tok1", "ep8-decode-tok4", "ep8-decode-tok12", "ep8-decode-tok32")
GEMMS = ("gate_up",) if QUICK else ("gate_up", "down")


def measure_swap():
    from chord.lab import tune

    out = []
    for sid in POINTS:
        sc = suite.scenario(sid)
        for gemm in GEMMS:
            n, k, prob = sc.gemm_problem(FAMILY, gemm)
            on = select(profile_for(FAMILY, sc.experts, n, k), prob)
            if not SWAP.is_on(on):
                print(f"{sid} {gemm}: {on.id} has no unswapped side (wgmma), skipped")
                continue
            touched = int(torch.unique(make_topk_ids(sc)).numel())
            wb = touched * weight_bytes(n, k)
            for r in tune.time_schedules(sid, FAMILY, gemm, [on, SWAP.switch_off(on)], rep_ms=20 if QUICK else 60):
                out.append({"scenario": sid, "tok_e": sc.rows_per_expert, "gemm": gemm, "schedule": r["schedule"],
                            "swap": int(r["schedule"] == on.id), "us": round(r["us"], 2),
                            "weight_TB_per_s": round(wb / r["us"] / 1e6, 3), "rel_err_vs_swapped": r["rel_err"]})
    return out


swap_rows, where = live_or_recorded("03_swap_ablation", measure_swap,
                                    f"swapped vs unswapped ({FAMILY}) per decode GEMM, chord.lab.tune.time_schedules")
print(where)
print(f"{'scenario':18s} {'gemm':8s} {'swapped us':>10s} {'unswapped us':>12s} {'off/on':>7s} {'TB/s on':>8s} {'TB/s off':>9s}")
for key in dict.fromkeys((r["scenario"], r["gemm"]) for r in swap_rows):
    on_r = next(r for r in swap_rows if (r["scenario"], r["gemm"]) == key and r["swap"] == 1)
    off_r = next(r for r in swap_rows if (r["scenario"], r["gemm"]) == key and r["swap"] == 0)
    print(f"{key[0]:18s} {key[1]:8s} {on_r['us']:10.1f} {off_r['us']:12.1f} {off_r['us'] / on_r['us']:7.2f} "
          f"{on_r['weight_TB_per_s']:8.2f} {off_r['weight_TB_per_s']:9.2f}")

# %% [markdown]
# ## The weight layout: tile-grouped against tile-major
# A decode GEMM is a weight stream, so where its bytes lie matters. The packed weights keep an
# expert's 16-row tiles in groups of 8 with each K block of a group contiguous (`swap16g`,
# docs/architecture.md): a CTA's pipeline stage is one or two 4 KB runs. The first layout
# (tile-major, G = 1) put the stage's 8-16 pieces of 512 bytes K/64 x 512 bytes apart.
# `chord.lab.tune.time_layouts` packs the same weights both ways (`CHORD_TILE_GROUP=1` for the old
# order; the ops run the kernel built for each one's G) and times each GEMM's profile schedule;
# the outputs must have the same bits.

# %%
from chord.lab.tune import LAYOUT_GEMMS, time_layouts

layout_rows, where = live_or_recorded(
    "03_layout_ablation",
    lambda: time_layouts(LAYOUT_GEMMS[:4] if QUICK else LAYOUT_GEMMS, rep_ms=20 if QUICK else 30,
                         repeats=1 if QUICK else 2),
    "profile schedule per GEMM on tile-grouped (G=8) and tile-major (G=1) weights, chord.lab.tune.time_layouts")
print(where)
print(f"{'GEMM':48s} {'G=8 us':>8s} {'G=1 us':>8s} {'G=1 / G=8':>10s}")
for key in dict.fromkeys((r["scenario"], r["family"], r["gemm"], r["repeat"]) for r in layout_rows):
    g8 = next(r for r in layout_rows if (r["scenario"], r["family"], r["gemm"], r["repeat"]) == key and r["tile_group"] == 8)
    g1 = next(r for r in layout_rows if (r["scenario"], r["family"], r["gemm"], r["repeat"]) == key and r["tile_group"] == 1)
    print(f"{key[0] + ' ' + key[1] + ' ' + key[2]:48s} {g8['us']:8.1f} {g1['us']:8.1f} {g1['us'] / g8['us']:10.3f}")

# %% [markdown]
# ## Live: these calls next to upstream Humming
# `chord.lab.workbench.compare` runs the bench on this scenario and family: Chord here, upstream
# humming-kernels 0.1.20 in a worker subprocess with its own install (`CHORD_HUMMING_DIR`).

# %%
from chord.lab.workbench.compare import show_comparison

show_comparison("ep8-decode-tok4", FAMILY, quick=QUICK)

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord capture` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.lab.workbench.captures import show_capture

show_capture("ep8-decode-tok4", FAMILY)

# %% [markdown]
# ## Invariant
# No measured rate exceeds what HBM can deliver (reads alone run about 4 % above the copy
# ceiling, so 10 % is the physical margin), the floors agree with the bytes counted here, and
# the unswapped side computes the same product (to bf16 rounding) with 16-row token tiles; the
# two weight layouts give the same bits.

# %%
assert rates and max(rates) < 1.1 * ceil.copy_TB_per_s, (max(rates), ceil.copy_TB_per_s)
assert swap_rows and all(r["rel_err_vs_swapped"] < 1e-2 for r in swap_rows), swap_rows
assert all(r["weight_TB_per_s"] < 1.1 * ceil.copy_TB_per_s for r in swap_rows)
assert all(Schedule.from_id(r["schedule"]).block_m % 16 == 0 for r in swap_rows if r["swap"] == 0)
assert layout_rows and all(r["same_bits"] == 1 for r in layout_rows), "the layout changed a product"
assert {r["tile_group"] for r in layout_rows} == {1, 8}
sc = suite.scenario("ep8-decode-tok1")
fl = scenario_floor(sc, ceil, sc.experts)
assert fl.bound == "memory" and fl.floor_us > 0.9 * 48 * (weight_bytes(4096, 7168) + weight_bytes(7168, 2048)) \
    / ceil.copy_bytes_per_us
print(f"{len(rates)} decode rows; best {max(rates):.2f} TB/s = {100 * max(rates) / ceil.copy_TB_per_s:.0f} % of copy")
