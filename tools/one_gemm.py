"""One suite GEMM under one or more schedules: `chord bench --gemm` (this script forwards to it).

    python tools/one_gemm.py --scenario ep8-prefill-tok512 --family grouped_contiguous --gemm gate_up \\
        [--schedule gcon-m128n256k64-w16-s5-c1-wgmma ...] [--rep-ms 50] [--warmup-ms 100]

runs

    chord bench --scenarios ep8-prefill-tok512 --families grouped_contiguous --gemm gate_up \\
        [--schedule gcon-m128n256k64-w16-s5-c1-wgmma ...] [--rep-ms 50] [--warmup-ms 100]

(chord.lab.bench.one_gemm); every flag is checked there, before any GPU work.
"""
import argparse
import sys


def translate(argv=None) -> list[str]:
    """This script's command line as `chord`'s."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--family", default=None)
    ap.add_argument("--gemm", default="gate_up")
    ap.add_argument("--schedule", action="append", default=[])
    ap.add_argument("--rep-ms", default=None)
    ap.add_argument("--warmup-ms", default=None)
    a = ap.parse_args(argv)
    out = ["bench", "--scenarios", a.scenario, "--gemm", a.gemm]
    out += ["--families", a.family] if a.family else []
    for sid in a.schedule:
        out += ["--schedule", sid]
    for flag, value in (("--rep-ms", a.rep_ms), ("--warmup-ms", a.warmup_ms)):
        out += [flag, value] if value is not None else []
    return out


def main(argv=None) -> int:
    from chord.cli import main as chord

    return chord(translate(argv))


if __name__ == "__main__":
    sys.exit(main())
