# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 — The whole suite: Chord vs humming-kernels 0.1.20
#
# `chord bench` as a notebook: every scenario of the Kimi K2 H200 suite, gate_up + down, checked
# against the float32 reference first, then timed (do_bench median of a CUDA-graph replay) next
# to upstream humming-kernels 0.1.20 driven exactly as vLLM 0.33 drives it, in a subprocess
# (both packages own the import name `humming`), on the same GPU in the same run.
#
# Upstream Humming for the live comparison: `pip install --no-deps --target DIR
# humming-kernels==0.1.20`, then set `HUMMING_DIR = DIR` below (or `CHORD_HUMMING_DIR`).

# %% tags=["parameters"]
QUICK = True  # live: 4 representative scenarios with short timing; False: the whole suite
HUMMING_DIR = None  # install dir of upstream humming-kernels 0.1.20 (default $CHORD_HUMMING_DIR)
OUT_DIR = "bench-out"

# %%
import os

from chord.lab.bench import report, runner
from chord.lab.workbench import figures, gpu_available, recorded_results
from chord.lab.workbench.tables import show_bench

HUMMING_DIR = HUMMING_DIR or os.environ.get("CHORD_HUMMING_DIR")
if gpu_available():
    opts = runner.BenchOptions(quick=QUICK, humming_dir=HUMMING_DIR, out_dir=OUT_DIR,
                               humming_tuning_rows="matching" if QUICK else "all")
    result = runner.run_gpu(opts)
    if not HUMMING_DIR:
        print("no upstream Humming install given: its column shows the committed baseline file, labelled so")
else:
    result = recorded_results()

# %%
show_bench(result)  # where the numbers come from, then the table (HTML in JupyterLab, text in a script)

# %%
figures.speedup_figure(result)

# %%
time_fig, floor_fig = figures.suite_figures(result)
floor_fig

# %% [markdown]
# ## Larger expert parallelism: EP16 and EP32
# Prefill/decode-disaggregated deployments spread Kimi K2.x's experts over 16 or 32 GPUs (24 or
# 12 local experts). Their rules are the EP16 / EP32 entries of `profiles/h200.json`, tuned by
# `chord tune --suite kimi_k2_h200_large_ep`; `chord bench --suite kimi_k2_h200_large_ep` times
# them next to upstream Humming (live with `QUICK = False` on a GPU, else the committed H200 run).

# %%
if gpu_available() and not QUICK:
    result_ep = runner.run_gpu(runner.BenchOptions(suite="kimi_k2_h200_large_ep", humming_dir=HUMMING_DIR,
                                                   out_dir=OUT_DIR + "-large-ep"))
else:
    result_ep = recorded_results(suite="kimi-k2-h200-large-ep")
show_bench(result_ep)
print("geomean speed-up:", ", ".join(f"{k} {g:.3f}x ({n} rows, {f} faster)"
                                     for k, (g, n, f) in report.speedup_summary(result_ep).items()))

# %%
figures.speedup_figure(result_ep)

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord capture` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.lab.workbench.captures import show_capture

show_capture("ep8-prefill-tok128", "indexed")

# %% [markdown]
# ## Invariant
# Every Chord row passed its float32 check before it was timed, and each speed-up is Humming's
# time over Chord's time of the same scenario and family.

# %%
cells = report.pivot(result) + report.pivot(result_ep)
assert cells and all(c.get("chord_check") == "pass" for c in cells if c.get("chord_us"))
assert {r.get("deployment") for r in result_ep["rows"]} >= {"EP16", "EP32"}
for c in cells:
    h = c.get("humming_us", c.get("humming_committed_us"))
    if c.get("speedup"):
        assert abs(c["speedup"] - h / c["chord_us"]) < 1e-9
print(len(cells), "rows checked")
