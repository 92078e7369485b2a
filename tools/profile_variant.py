"""A copy of a profile with knobs set on every rule: `chord variant` (this script forwards to it).

    python tools/profile_variant.py --set pdl=1 --out /tmp/h200-pdl.json [--profile h200]

runs `chord variant --set pdl=1 --out /tmp/h200-pdl.json [--profile h200]` (chord.lab.variant): each
value is checked against the knob table and the written file is loaded back, so a bad knob or
value fails here, naming it.
"""
import argparse
import sys


def translate(argv=None) -> list[str]:
    """This script's command line as `chord`'s."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=None)
    ap.add_argument("--set", action="append", required=True, metavar="KNOB=VALUE")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = ["variant", "--out", a.out]
    for item in a.set:
        out += ["--set", item]
    return out + (["--profile", a.profile] if a.profile else [])


def main(argv=None) -> int:
    from chord.cli import main as chord

    return chord(translate(argv))


if __name__ == "__main__":
    sys.exit(main())
