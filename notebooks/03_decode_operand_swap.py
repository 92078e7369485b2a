# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 — Decode: the operand swap, and how close the weights stream to HBM
#
# At 1-32 rows per expert a GEMM is a weight stream: every INT4 weight is read once and used by
# a handful of tokens. Chord puts the dequantized weights on the MMA's M side (16 rows per
# m16n8k16 tile) and the tokens on N (8 per tile), so a tile of 8 tokens wastes nothing where an
# unswapped kernel would pad the tokens to 16 rows. The unswapped kernel (the ablation's "off"
# side) and semi-static token slicing are not built yet (`chord.optimizations`, planned); what is
# measured here is what the swap achieves: weight bytes per second against the HBM ceiling.

# %% tags=["parameters"]
QUICK = True

# %%
import torch

from chord import optimizations
from chord.bench.ceilings import Ceilings
from chord.bench.floors import scenario_floor, weight_bytes
from chord.bench.inputs import make_topk_ids
from chord.bench.report import pivot
from chord.bench.suite import load_suite
from chord.workbench import decision_row, recorded_results, where_results_come_from

for name in ("decode operand swap", "semi-static token slicing"):
    o = optimizations.BY_NAME[name]
    print(f"{name:28s} {o.status} (issue {o.issue}): {o.what}")
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
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord profile` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.workbench.captures import show_capture

show_capture("ep8-decode-tok4", "grouped_masked")

# %% [markdown]
# ## Invariant
# No measured rate exceeds what HBM can deliver (reads alone run about 4 % above the copy
# ceiling, so 10 % is the physical margin), and the floors agree with the bytes counted here.

# %%
assert rates and max(rates) < 1.1 * ceil.copy_TB_per_s, (max(rates), ceil.copy_TB_per_s)
sc = suite.scenario("ep8-decode-tok1")
fl = scenario_floor(sc, ceil, sc.experts)
assert fl.bound == "memory" and fl.floor_us > 0.9 * 48 * (weight_bytes(4096, 7168) + weight_bytes(7168, 2048)) \
    / ceil.copy_bytes_per_us
print(f"{len(rates)} decode rows; best {max(rates):.2f} TB/s = {100 * max(rates) / ceil.copy_TB_per_s:.0f} % of copy")
