"""The streaming-read probe's sweep (chord.lab.bench.read_probe): HBM read rate per copy path, ring
depth and step size, next to the copy ceiling the bench's floors use, on this GPU.

    python tools/read_probe.py [--total-mb 1536] [--rep-ms 200] [--out probe.json]

Each configuration is checked (the sink against the host's XOR of the addressed bytes) before it
is timed; prints one line per configuration and the copy ceiling (chord.lab.bench.ceilings) last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=int, default=1536, help="bytes streamed per launch (MiB; far above L2)")
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    if a.total_mb < 64:
        print("read_probe: --total-mb must be at least 64 (far above the 50 MB L2)", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("read_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    from chord.lab.bench import ceilings
    from chord.lab.bench import read_probe as RP

    total = a.total_mb << 20
    src = torch.randint(-2**31, 2**31 - 1, (total // 4,), dtype=torch.int32, device="cuda").view(torch.uint8)
    rows = []
    for cfg in RP.SWEEP:
        r = RP.measure(cfg, total, rep_ms=a.rep_ms, src=src)
        rows.append(r.as_dict())
        print(f"{cfg.label:36s} {r.TB_per_s:6.3f} TB/s  {r.us:9.1f} us  {r.ctas:5d} CTAs  {r.ctas_per_sm} CTAs/SM", flush=True)
    copy = ceilings.measure_copy_TB_per_s()
    print(f"{'copy ceiling (read + write)':36s} {copy:6.3f} TB/s")
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "copy_TB_per_s": copy, "rows": rows},
                                    indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
