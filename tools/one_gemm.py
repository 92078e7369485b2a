"""One suite GEMM with one schedule, for profilers (ncu, nsys) and quick A/B timings.

    python tools/one_gemm.py --scenario ep8-prefill-tok512 --family grouped_contiguous --gemm gate_up \
        [--schedule gcon-m128n256k64-w16-s5-c1-wgmma] [--iters 3] [--time]

Builds the scenario's inputs exactly as `chord bench` / `chord tune` do, checks the output
against the current profile's schedule (relative error), then launches `--iters` times (and,
with --time, prints the do_bench median of a CUDA-graph replay).
"""
import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--family", default="indexed")
    ap.add_argument("--gemm", choices=("gate_up", "down"), default="gate_up")
    ap.add_argument("--schedule", action="append", default=[])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--time", action="store_true")
    a = ap.parse_args()

    from chord import formats, tune
    from chord.bench import inputs as I
    from chord.bench.suite import load_suite
    from chord.bench.timing import bench
    from chord.schedule import Schedule, load_profile, select
    from chord.testing import rel_err

    sc = load_suite().scenario(a.scenario)
    dev = torch.device("cuda")
    ew = I.expert_weights(sc, 0, dev)
    w13, w2 = formats.pack_experts(ew.q13, ew.s13), formats.pack_experts(ew.q2, ew.s2)
    del ew
    data = I.scenario_data(sc, 0, dev)
    fi = I.family_inputs(a.family, data)
    for gemm, n, k, prob, make in tune._gemm_calls(a.family, sc, data, fi, w13, w2):
        if gemm != a.gemm:
            continue
        default = select(load_profile(f"h200:{sc.profile_deployment}"), prob)
        ref_fn, ref_out = make(default)
        ref_fn()
        ref = ref_out.clone()
        for sid in a.schedule or [default.id]:
            s = Schedule.from_id(sid)
            fn, out = make(s)
            out.fill_(float("nan"))
            for _ in range(a.iters):
                fn()
            torch.cuda.synchronize()
            line = f"{a.scenario} {a.family} {gemm} {s.id}: rel_err vs {default.id} {rel_err(out, ref):.1e}"
            if a.time:
                line += f"  {bench(fn, warmup_ms=10, rep_ms=50, graph=True).p50:.1f} us"
            print(line, flush=True)


if __name__ == "__main__":
    main()
