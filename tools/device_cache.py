"""Build, on a machine without a GPU, the kernel cache a GPU machine needs, and pack it to carry:
`chord precompile --tests --out ARCHIVE` (this script forwards to it).

    python tools/device_cache.py --out .cache/device.tar.xz [--tune ep8-decode-tok32,tp8-m1024]
    # on the GPU machine: mkdir -p $CHORD_CACHE_DIR && tar -xf .cache/device.tar.xz -C $CHORD_CACHE_DIR

runs

    chord precompile --quiet --tests --out .cache/device.tar.xz [--tune --scenarios ep8-decode-tok32,tp8-m1024]

(chord.lab.precompile: what is collected). This script's flags map one to one: --no-tests builds
--ablations without the GPU tests' schedules; --tune SCENARIOS is --tune --scenarios SCENARIOS
('all': every scenario of the suite), --tune-suite is --suite; --record (default: the committed
tools/device_kernels.txt when it exists), --profile, --max-candidates, --cache-dir, --jobs and
--list are passed as they are. The archive defaults to .cache/device.tar.xz.
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECORD = ROOT / "tools" / "device_kernels.txt"


def translate(argv=None) -> list[str]:
    """This script's command line as `chord`'s."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / ".cache" / "device.tar.xz"))
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--tune", default=None, metavar="SCENARIOS")
    ap.add_argument("--tune-suite", default=None, metavar="SUITE")
    ap.add_argument("--max-candidates", default=None)
    ap.add_argument("--record", action="append", default=None)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--jobs", default=None)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    out = ["precompile", "--quiet", "--ablations" if a.no_tests else "--tests", "--out", a.out]
    if a.tune:
        out += ["--tune"] + ([] if a.tune == "all" else ["--scenarios", a.tune])
        out += ["--suite", a.tune_suite] if a.tune_suite else []
    records = a.record if a.record is not None else ([str(DEFAULT_RECORD)] if DEFAULT_RECORD.is_file() else [])
    for r in records:
        out += ["--record", r]
    for flag, value in (("--profile", a.profile), ("--max-candidates", a.max_candidates),
                        ("--cache-dir", a.cache_dir), ("--jobs", a.jobs)):
        out += [flag, value] if value is not None else []
    return out + ["--list"] * a.list


def main(argv=None) -> int:
    from chord.cli import main as chord

    return chord(translate(argv))


if __name__ == "__main__":
    sys.exit(main())
