# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 — A tour: the Kimi K2 MoE layer on one H200
#
# Per GPU, Kimi K2.x routes each token to 8 of 384 experts (hidden 7168, expert width 2048).
# EP8 holds 48 experts per GPU, TP8 holds all 384 with an eighth of their width. This notebook
# puts numbers on that problem (bytes, FLOPs, floors), runs one call of each kernel family
# against the float32 reference, and shows where time goes today. Everything comes from
# `chord`: the same code serving runs.

# %% tags=["parameters"]
QUICK = True  # CI runs the notebooks with QUICK; on the GPU machine set False for full sizes

# %%
import torch

from chord import reference, routing, testing
from chord.lab.bench.ceilings import Ceilings
from chord.lab.bench.floors import scenario_floor, weight_bytes
from chord.lab.bench.inputs import make_topk_ids
from chord.lab.bench.suite import load_suite
from chord.lab.workbench import gpu_available, recorded_results, where_results_come_from
from chord.lab.workbench import figures

LIVE = gpu_available()
print("live GPU:", LIVE, "(Chord's kernels run here)" if LIVE else "(no sm_90 GPU: reference path, recorded H200 tables)")

# %% [markdown]
# ## The problem in numbers
# Bytes that must move (INT4 weights + bf16 group scales of the experts touched, activations in
# and out) and FLOPs, with the floors they imply at the H200 ceilings of the recorded run.

# %%
res = recorded_results()
c = res["meta"]["ceilings"]
ceil = Ceilings(c["copy_TB_per_s"], c["bf16_matmul_TFLOP_per_s"], source=res["meta"]["file"])
suite = load_suite()
print(f"{'scenario':20s} {'rows/exp':>8s} {'experts':>7s} {'weights MB':>10s} {'GFLOP':>8s} {'floor us':>9s}  bound")
for sc in suite.scenarios:
    touched = int(torch.unique(make_topk_ids(sc)).numel())  # the suite's routing, drawn on the CPU
    fl = scenario_floor(sc, ceil, touched)
    wmb = touched * (weight_bytes(sc.n_gate_up, sc.k_gate_up) + weight_bytes(sc.n_down, sc.k_down)) / 1e6
    gflop = 2 * sc.rows * (sc.n_gate_up * sc.k_gate_up + sc.n_down * sc.k_down) / 1e9
    print(f"{sc.id:20s} {sc.rows_per_expert:8.1f} {touched:7d} {wmb:10.1f} {gflop:8.1f} {fl.floor_us:9.1f}  {fl.bound}")

# %% [markdown]
# ## One call of each family against the float32 reference
# Random non-zero INT4 weights, outputs poisoned with NaN first. With a GPU the kernels run and
# are compared with `chord.reference`; without one the reference itself runs (it is the oracle
# the GPU tests use), on a small shape.

# %%
e, n, k, m, top_k = (8, 256, 512, 24, 2) if QUICK or not LIVE else (48, 4096, 7168, 384, 8)
dev = "cuda" if LIVE else "cpu"
qe, pw = testing.random_experts(e, n, k, seed=0, device=dev)
x = torch.randn(m, k, device=dev).bfloat16()
ids = routing.random_topk_ids(m, e, top_k, seed=1, device=dev)
errors = {}
for family in ("indexed", "grouped_contiguous", "grouped_masked"):
    if family == "indexed":
        r = routing.align_block_size(ids, 16, e)
        ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
        if LIVE:
            from chord import ops
            from chord.schedule import Schedule

            out = testing.poisoned(m * top_k, n, device=dev)
            ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=Schedule("indexed", 16, 128))
    elif family == "grouped_contiguous":
        lay = routing.contiguous_layout(x, ids, e)
        ref = reference.contiguous_gemm_ref(lay.x, qe, None, lay.expert_offsets)
        if LIVE:
            out = testing.poisoned(lay.x.shape[0], n, device=dev)
            ops.gemm_contiguous(lay.x, pw, lay.expert_offsets, out=out)
    else:
        lay = routing.masked_layout(x, ids, e, max_rows=m)
        ref = reference.masked_gemm_ref(lay.x, qe, None, lay.expert_num_tokens)
        if LIVE:
            out = testing.poisoned(*lay.x.shape[:-1], n, device=dev)
            ops.gemm_masked(lay.x, pw, lay.expert_num_tokens, out=out)
    written = ~torch.isnan(ref[..., 0])
    errors[family] = testing.rel_err(out[written], ref[written]) if LIVE else float("nan")
    print(f"{family:20s} reference output {tuple(ref.shape)}, rows written {int(written.sum())}"
          + (f", kernel rel. error {errors[family]:.1e}" if LIVE else ""))

# %% [markdown]
# ## Where time goes today
# The suite as Chord and upstream humming-kernels 0.1.20 ran it on one H200, side by side.

# %%
print(where_results_come_from(res))
figures.speedup_figure(res)

# %%
t_fig, pct_fig = figures.suite_figures(res)
pct_fig

# %% [markdown]
# ## Live: these calls next to upstream Humming
# `chord.lab.workbench.compare` runs the bench on this notebook's scenario and family: Chord here,
# upstream humming-kernels 0.1.20 in a worker subprocess with its own install
# (`CHORD_HUMMING_DIR`); without a GPU, the committed H200 run's rows of the same cell.

# %%
from chord.lab.workbench.compare import show_comparison

vs_humming = show_comparison("ep8-prefill-tok128", "indexed", quick=QUICK)

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
# The kernel layout costs exactly 0.5625 bytes per weight (INT4 + one bf16 scale per 32), every
# recorded Chord row passed its float32 check, and with a GPU every family matched the reference.

# %%
assert weight_bytes(4096, 7168) == 4096 * 7168 * 0.5625
assert all(r.get("check") in (None, "pass") for r in res["rows"] if r["provider"] == "chord")
assert not LIVE or all(v < testing.BF16_TOL for v in errors.values()), errors
print("invariants hold")
