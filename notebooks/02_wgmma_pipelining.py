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
from chord.schedule import Problem, profile_for, select
from chord.bench.suite import load_suite
from chord.workbench import best_by, gpu_available, recorded_tuning
from chord.workbench import figures

LIVE = gpu_available()
sc = load_suite().scenario(SCENARIO)
n, k, top_k = (sc.n_gate_up, sc.k_gate_up, sc.top_k) if GEMM == "gate_up" else (sc.n_down, sc.k_down, 1)
sched = select(profile_for(FAMILY, sc.experts, n, k),
               Problem(FAMILY, sc.experts, n, k, sc.rows, top_k if FAMILY == "indexed" else 1))
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
print(f"recorded: chord/bench/results/{points[0]['file']}")
print(f"{'scenario':20s} {'family':20s} {'gemm':8s} {'mma us':>8s} {'wgmma us':>9s} {'ratio':>6s}")
for r in rows:
    w = min(v for v in (r["wgmma_us"], r["wgmma+raster_us"]) if v is not None) if r["wgmma_us"] else None
    ratio = f"{w / r['mma_us']:.2f}" if w else "-"
    print(f"{r['scenario']:20s} {r['family']:20s} {r['gemm']:8s} {r['mma_us']:8.0f} "
          f"{(f'{w:9.0f}' if w else '        -')} {ratio:>6s}")
figures.ablation_figure(rows, ["mma", "wgmma", "wgmma+raster"], "best schedule of each main loop per GEMM (H200)")

# %% [markdown]
# ## Live: the profile's schedule and each knob switched off
# With an sm_90 GPU this times the scenario's GEMM under the profile schedule and each of its
# ablations (`chord.tune.time_schedules`: same inputs as `chord tune`, do_bench median of a
# CUDA-graph replay) and checks whether the outputs are bit-identical (wait_group 1 vs 0 and the
# raster must be; another main loop only agrees to rounding). Without a GPU it says so.

# %%
live = []
if LIVE:
    from chord import tune

    from chord.schedule import override

    variants = [sched, *ablations.values()]
    if sched.mainloop == "wgmma":
        try:  # the warp-specialized producer switched on (it needs block_n <= 192)
            variants.append(override(sched, producer=1))
        except ValueError as exc:
            print("no warp-specialized variant of", sched.id, "-", exc)
    live = tune.time_schedules(SCENARIO, FAMILY, GEMM, variants, rep_ms=20 if QUICK else 100)
    flops = 2 * sc.rows * n * k
    for r in live:
        same = "bit-identical" if r["same_bits"] else f"rel_err {r['rel_err']:.1e}"
        print(f"{r['schedule']:45s} {r['us']:9.1f} us  {flops / r['us'] / 1e6:6.0f} TFLOP/s  {same}")
else:
    print("no sm_90 GPU here: nothing timed live (the recorded tuning run above is from an H200)")

# %% [markdown]
# ## NVTX capture of these calls
# The same gate_up + down calls the bench times, each launch in a `chord/<op>[<schedule id>]`
# range: live with torch.profiler on an H200, else the committed capture when there is one, and
# the `chord profile` commands for Nsight Systems / Compute (notebook 07 explains the capture).

# %%
from chord.workbench.captures import show_capture

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
    if r["schedule"] in {s.id for name, s in ablations.items() if name != "wgmma main loop"}:
        assert r["same_bits"], r
assert all(r["wgmma_us"] is None or r["wgmma_us"] > 0 for r in rows)
print("invariants hold for", sched.id)
