"""One suite GEMM under one or more schedules, for profilers (ncu, nsys) and quick A/B timings.

    python tools/one_gemm.py --scenario ep8-prefill-tok512 --family grouped_contiguous --gemm gate_up \\
        [--schedule gcon-m128n256k64-w16-s5-c1-wgmma ...] [--rep-ms 50]

The inputs are the ones `chord tune` and `chord bench` build; the first schedule (default: the
profile's) is the reference the others are compared with (chord.tune.time_schedules).
"""
import argparse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--family", default="indexed")
    ap.add_argument("--gemm", choices=("gate_up", "down"), default="gate_up")
    ap.add_argument("--schedule", action="append", default=[])
    ap.add_argument("--rep-ms", type=float, default=50.0)
    ap.add_argument("--warmup-ms", type=float, default=None,
                    help="do_bench warm-up per schedule (ms; default chord.tune.WARMUP_MS)")
    a = ap.parse_args()

    from chord import tune
    from chord.bench.suite import load_suite
    from chord.schedule import profile_for, select

    sc = load_suite().scenario(a.scenario)
    n, k, prob = sc.gemm_problem(a.family, a.gemm)
    default = select(profile_for(a.family, sc.experts, n, k), prob)
    warm = tune.WARMUP_MS if a.warmup_ms is None else a.warmup_ms
    for r in tune.time_schedules(a.scenario, a.family, a.gemm, a.schedule or [default.id], rep_ms=a.rep_ms,
                                 warmup_ms=warm):
        same = "bit-identical" if r["same_bits"] else f"rel_err {r['rel_err']:.1e}"
        print(f"{r['scenario']} {r['family']} {r['gemm']} {r['schedule']:45s} {r['us']:9.1f} us  ({same} vs first)",
              flush=True)


if __name__ == "__main__":
    main()
