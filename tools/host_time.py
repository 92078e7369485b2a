"""Host time of one GEMM call, Chord and upstream Humming: `chord bench --host-time` (this script
forwards to it).

    python tools/host_time.py [--scenario tp8-m1] [--calls 2000] [--humming-dir /tmp/humming]
                              [--profile NAME] [--cprofile] [--parts]

runs

    chord bench --host-time [--scenarios tp8-m1] [--calls 2000] [--humming-dir /tmp/humming]
                [--profile NAME] [--cprofile] [--parts]

(chord.lab.bench.host_time: what is measured and how). The profile is the library's default
($CHORD_PROFILE, else h200) unless --profile names another; every flag is checked before any
GPU work.
"""
import argparse
import sys


def translate(argv=None) -> list[str]:
    """This script's command line as `chord`'s."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--calls", default=None)
    ap.add_argument("--humming-dir", default=None)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--parts", action="store_true")
    a = ap.parse_args(argv)
    out = ["bench", "--host-time"]
    for flag, value in (("--scenarios", a.scenario), ("--calls", a.calls), ("--humming-dir", a.humming_dir),
                        ("--profile", a.profile)):
        out += [flag, value] if value is not None else []
    return out + ["--cprofile"] * a.cprofile + ["--parts"] * a.parts


def main(argv=None) -> int:
    from chord.cli import main as chord

    return chord(translate(argv))


if __name__ == "__main__":
    sys.exit(main())
