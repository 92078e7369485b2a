"""The weight layout's ablation: tile-grouped `swap16g` (G = 8) against tile-major (G = 1).

    python tools/layout_ablation.py [--rep-ms 30] [--repeats 2] [--out layout.json]

`chord.tune.time_layouts`: for each GEMM of `chord.tune.LAYOUT_GEMMS`, the profile's schedule
timed on weights packed as always (G = 8) and packed with CHORD_TILE_GROUP=1 (the tile-major
order of the first layout: each 16-row tile's K blocks contiguous, a stage's pieces K/64 x 512
bytes apart); chord.ops runs the kernel built for each one's G. Only where the bytes come from
changes, not which MMAs run in which order, so the two outputs must be bit-identical; the script
exits 1 if they are not (the G = 8 kernels themselves are checked against the float32 reference
by the GPU tests and by every `chord bench` row). Notebook 03 shows the same table. Needs an
sm_90 GPU.
"""
import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rep-ms", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    from chord.tune import LAYOUT_GEMMS, time_layouts

    rows = time_layouts(LAYOUT_GEMMS, rep_ms=a.rep_ms, repeats=a.repeats)
    for r in rows:
        print(f"rep{r['repeat']} {r['scenario']:20s} {r['family']:19s} {r['gemm']:8s} {r['schedule']:40s} "
              f"G={r['tile_group']} {r['us']:9.1f} us" + ("" if r["same_bits"] else "  OUTPUT DIFFERS FROM G=8"))
    print("\nGEMM                                            G=8 us   G=1 us   G=1 / G=8  (per repeat)")
    for scenario, family, gemm in LAYOUT_GEMMS:
        def times(g):
            return [r["us"] for r in rows if (r["scenario"], r["family"], r["gemm"], r["tile_group"]) ==
                    (scenario, family, gemm, g)]
        t8, t1 = times(8), times(1)
        print(f"{scenario + ' ' + family + ' ' + gemm:46s} " + "  ".join(
            f"{x8:8.1f} {x1:8.1f} {x1 / x8:6.3f}" for x8, x1 in zip(t8, t1)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    raise SystemExit(0 if rows and all(r["same_bits"] for r in rows) else 1)


if __name__ == "__main__":
    main()
