"""The weight layout's ablation, tile-grouped `swap16g` (G = 8) against tile-major (G = 1):
`chord bench --layout-ablation` (this script forwards to it).

    python tools/layout_ablation.py [--rep-ms 30] [--repeats 2] [--out layout.json]

runs `chord bench --layout-ablation [--rep-ms 30] [--repeats 2]` (chord.lab.bench.layout_ablation)
and, with --out, writes its rows to that file. Exits 1 if a G = 1 output differs from the G = 8
one. Needs an sm_90 GPU.
"""
import argparse
import shutil
import sys
import tempfile
from pathlib import Path


def translate(argv=None) -> tuple[list[str], str | None]:
    """(`chord`'s command line, the --out file to copy layout.json to)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep-ms", default=None)
    ap.add_argument("--repeats", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    out = ["bench", "--layout-ablation"]
    for flag, value in (("--rep-ms", a.rep_ms), ("--repeats", a.repeats)):
        out += [flag, value] if value is not None else []
    return out, a.out


def main(argv=None) -> int:
    from chord.cli import main as chord

    args, out_file = translate(argv)
    with tempfile.TemporaryDirectory(prefix="chord-layout-") as tmp:
        rc = chord([*args, "--out", tmp])
        if out_file and (Path(tmp) / "layout.json").exists():
            shutil.copyfile(Path(tmp) / "layout.json", out_file)
    return rc


if __name__ == "__main__":
    sys.exit(main())
