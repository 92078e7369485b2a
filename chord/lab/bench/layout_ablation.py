"""The weight layout's ablation: tile-grouped `swap16g` (G = 8) against tile-major (G = 1):
``chord bench --layout-ablation [--repeats N] [--rep-ms MS]``.

`chord.lab.tune.time_layouts`: for each GEMM of `chord.lab.tune.LAYOUT_GEMMS`, the profile's schedule
timed on weights packed as always (G = 8) and packed with CHORD_TILE_GROUP=1 (the tile-major
order of the first layout: each 16-row tile's K blocks contiguous, a stage's pieces K/64 x 512
bytes apart); chord.ops runs the kernel built for each one's G. Only where the bytes come from
changes, not which MMAs run in which order, so the two outputs must be bit-identical; the
command exits 1 if they are not (the G = 8 kernels themselves are checked against the float32
reference by the GPU tests and by every `chord bench` row). Notebook 03 shows the same table.
Needs an sm_90 GPU.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


def table(rows: list[dict], gemms) -> list[str]:
    """The lines printed for `rows` (chord.lab.tune.time_layouts): one per timing, then per GEMM the
    G = 8 and G = 1 times and their ratio, per repeat."""
    lines = [f"rep{r['repeat']} {r['scenario']:20s} {r['family']:19s} {r['gemm']:8s} {r['schedule']:40s} "
             f"G={r['tile_group']} {r['us']:9.1f} us" + ("" if r["same_bits"] else "  OUTPUT DIFFERS FROM G=8")
             for r in rows]
    lines += ["", "GEMM                                            G=8 us   G=1 us   G=1 / G=8  (per repeat)"]
    for scenario, family, gemm in gemms:
        def times(g):
            return [r["us"] for r in rows if (r["scenario"], r["family"], r["gemm"], r["tile_group"]) ==
                    (scenario, family, gemm, g)]
        lines.append(f"{scenario + ' ' + family + ' ' + gemm:46s} " + "  ".join(
            f"{x8:8.1f} {x1:8.1f} {x1 / x8:6.3f}" for x8, x1 in zip(times(8), times(1))))
    return lines


def run(*, rep_ms: float = 30.0, repeats: int = 2, warmup_ms: float | None = None, out_file: str | Path | None = None,
        out: Callable[[str], None] = print) -> int:
    """Times, prints, writes the rows to `out_file` (JSON) when given; 0 when every G = 1 output
    has the G = 8 output's bits, else 1."""
    import torch

    from chord.lab.tune import LAYOUT_GEMMS, WARMUP_MS, time_layouts

    rows = time_layouts(LAYOUT_GEMMS, rep_ms=rep_ms, repeats=repeats,
                        warmup_ms=WARMUP_MS if warmup_ms is None else warmup_ms)
    for line in table(rows, LAYOUT_GEMMS):
        out(line)
    if out_file:
        Path(out_file).parent.mkdir(parents=True, exist_ok=True)
        Path(out_file).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
        out(f"wrote {out_file}")
    return 0 if rows and all(r["same_bits"] for r in rows) else 1
