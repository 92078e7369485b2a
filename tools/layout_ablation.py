"""The weight layout's ablation: tile-grouped `swap16g` (G = 8) against tile-major (G = 1).

    python tools/layout_ablation.py [--rep-ms 30] [--repeats 2] [--out layout.json]

For each GEMM below, the profile's schedule is timed twice per repeat: once with weights packed
as always (G = 8), once packed with CHORD_TILE_GROUP=1 (the tile-major order of the first layout:
each 16-row tile's K blocks contiguous, a stage's pieces K/64 x 512 bytes apart); chord.ops runs
the kernel built for each one's G.
Only where the bytes come from changes, not which MMAs run in which order, so the two outputs
must be bit-identical; the script exits 1 if they are not (the G = 8 kernels themselves are
checked against the float32 reference by the GPU tests and by every `chord bench` row). Needs an
sm_90 GPU.
"""
import argparse
import json
import os

GEMMS = (
    ("ep8-decode-tok1", "indexed", "gate_up"),
    ("ep8-decode-tok1", "indexed", "down"),
    ("ep8-decode-tok4", "grouped_masked", "gate_up"),
    ("ep8-decode-tok4", "grouped_masked", "down"),
    ("tp8-m64", "indexed", "gate_up"),
    ("tp8-m1024", "indexed", "gate_up"),
    ("ep8-prefill-tok512", "grouped_contiguous", "gate_up"),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rep-ms", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    from chord.bench import inputs as I
    from chord.bench.timing import bench
    from chord.schedule import profile_for, select
    from chord.testing import same_bits
    from chord.tune import _gemm_calls

    rows, bad = [], 0
    for rep in range(a.repeats):
        for scenario, family, gemm in GEMMS:
            outs = {}
            for g in ("8", "1"):
                os.environ["CHORD_TILE_GROUP"] = g  # how chord.formats packs; the ops pick the kernel from the weights
                sc, w13, w2, data, fi = I.one_scenario(None, scenario, family, 0, "cuda", who="layout_ablation")
                for name, n, k, prob, make in _gemm_calls(family, sc, data, fi, w13, w2):
                    if name != gemm:
                        continue
                    s = select(profile_for(family, sc.experts, n, k), prob)
                    fn, out = make(s)
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    t = bench(fn, warmup_ms=10, rep_ms=a.rep_ms, graph=True)
                    outs[g] = out.clone()
                    row = {"scenario": scenario, "family": family, "gemm": gemm, "schedule": s.id,
                           "tile_group": int(g), "us": t.p50, "repeat": rep}
                    rows.append(row)
                    print(f"rep{rep} {scenario:20s} {family:19s} {gemm:8s} {s.id:40s} G={g} {t.p50:9.1f} us", flush=True)
                del w13, w2
            if not same_bits(outs["8"], outs["1"]):
                print(f"  {scenario} {family} {gemm}: G=8 and G=1 outputs differ", flush=True)
                bad += 1
    os.environ.pop("CHORD_TILE_GROUP", None)
    print("\nGEMM                                            G=8 us   G=1 us   G=1 / G=8")
    for scenario, family, gemm in GEMMS:
        t8 = sorted(r["us"] for r in rows if (r["scenario"], r["family"], r["gemm"], r["tile_group"]) == (scenario, family, gemm, 8))
        t1 = sorted(r["us"] for r in rows if (r["scenario"], r["family"], r["gemm"], r["tile_group"]) == (scenario, family, gemm, 1))
        m8, m1 = t8[len(t8) // 2], t1[len(t1) // 2]
        print(f"{scenario + ' ' + family + ' ' + gemm:46s} {m8:8.1f} {m1:8.1f}   {m1 / m8:6.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
