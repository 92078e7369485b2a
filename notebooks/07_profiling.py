# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 — Profiling: NVTX-annotated captures of the very calls the bench times
#
# `chord capture` (library: `chord.lab.capture`) runs one suite scenario's gate_up + down with the
# bench's inputs, routing and schedules, with NVTX on: every launch sits in a range named
# `chord/<op>[<schedule id>]`, so a Nsight Systems timeline or a Nsight Compute report names the
# schedule of each kernel. Three tools: `torch` (torch.profiler in-process, Chrome trace + a
# summary), `nsys` and `ncu` (Nsight in a subprocess). Without a GPU this notebook shows the
# committed H200 capture and the commands to take one.

# %% tags=["parameters"]
QUICK = True
SCENARIO = "ep8-prefill-tok128"
FAMILY = "indexed"

# %%
from chord.lab import capture
from chord.lab.workbench import decision_row, figures
from chord.lab.workbench.captures import capture_or_recorded, capture_commands

print("capture tools:", ", ".join(capture.TOOLS))
for cmd in capture_commands(SCENARIO, FAMILY):
    print(" ", cmd)

# %% [markdown]
# ## Which schedules the capture will show (the one decision, whoever calls)

# %%
import ipywidgets as W

from chord.lab.bench.suite import load_suite

suite = load_suite()
scen = W.Dropdown(options=[s.id for s in suite.scenarios], value=SCENARIO, description="scenario")
out = W.Output()


def show(_=None):
    sc = suite.scenario(scen.value)
    dep = "tp8" if sc.deployment == "TP8" else "ep8"
    out.clear_output()
    with out:
        for gemm in ("gate_up", "down"):
            r = decision_row(dep, FAMILY, gemm, sc.rows_per_expert)
            print(f"{sc.id:20s} {gemm:8s} {r['schedule']:40s} {r['reason']}")


scen.observe(show, names="value")
show()
W.VBox([scen, out])

# %% [markdown]
# ## The capture: live on an H200, else the committed one
# A recorded capture names its date, commit and schedules, and says so when today's policy picks
# other schedules for these calls (its times are then those of the recorded decision).

# %%
from chord.lab.workbench.captures import stale_schedules, todays_schedules
from chord.lab.workbench.tables import show_rows

cap, where = capture_or_recorded(SCENARIO, FAMILY, iters=2 if QUICK else 5)
print(where)
show_rows(cap["ranges"], ["range", "calls", "gpu_us_per_call", "gpu_us_total"])
show_rows(cap["kernels"][:6], ["kernel", "calls", "gpu_us_per_call", "gpu_us_total"])
figures.capture_figure(cap)

# %% [markdown]
# ## Invariant
# The capture's Chord ranges are exactly today's decision for this scenario (the schedules the
# selection policy in use picks, `chord.lab.capture.expected_ranges`): always for a live capture; a
# recorded one either shows today's schedules or is flagged as recorded under another decision
# (and then shows exactly the schedules it records). Each GEMM range ran once per iteration plus
# the warm-up, and the GEMM kernels' GPU time is inside the ranges.

# %%
today = todays_schedules(SCENARIO, FAMILY)
stale = stale_schedules(cap) if "recorded" in cap else {}  # a live capture ran today's decision
got = {r["range"] for r in cap["ranges"] if not r["range"].startswith("chord/profile")}
if not stale:
    assert cap["schedules"] == today and got == capture.expected_ranges(cap["family"], today), (got, today)
else:
    assert "recorded" in cap, "a live capture always runs today's schedules"
    assert "recorded under another decision" in where and all(now in where for _, now in stale.values())
    assert got == capture.expected_ranges(cap["family"], cap["schedules"]), (got, cap["schedules"])
want = capture.expected_ranges(cap["family"], cap["schedules"])
per_range_calls = {r["range"]: r["calls"] for r in cap["ranges"]}
for name in want:
    n_sched = sum(1 for sid in cap["schedules"].values() if name.endswith(f"[{sid}]"))
    assert per_range_calls[name] == n_sched * (cap["iters"] + 1), (name, per_range_calls[name])
gemm_kernels = sum(r["gpu_us_total"] for r in cap["kernels"] if r["kernel"] == "chord_w4a16_kernel")
in_ranges = sum(r["gpu_us_total"] for r in cap["ranges"] if r["range"] in want)
assert gemm_kernels > 0 and abs(in_ranges - gemm_kernels) <= 0.05 * gemm_kernels, (in_ranges, gemm_kernels)
print("capture invariants hold:", "today's schedules" if not stale else f"recorded under another decision {stale}")
