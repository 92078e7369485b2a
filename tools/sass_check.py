"""The SASS of the profile's kernels, fingerprinted, to check a source change that should not change code.

    python tools/sass_check.py --write sass-before.json        # on the tree before the change
    python tools/sass_check.py --compare sass-before.json      # after it: every kernel the same?

Builds (or finds in the kernel cache) every kernel the profile can select, disassembles it with
`cuobjdump --dump-sass`, drops what names the build rather than the code (the file header and
the line-info comments) and hashes the instruction text. `--compare` prints each kernel whose
instructions changed and exits 1 if any did. `--schedule ID` adds a kernel the profile does not select.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

_KEEP = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*(/\*.*\*/)?\s*$")


def fingerprint(cubin: Path) -> tuple[str, int]:
    from chord import jit

    res = jit.run_cuobjdump(cubin)
    if res is None or res.returncode != 0:
        raise SystemExit(f"sass_check: cuobjdump failed on {cubin}: {res and res.stderr}")
    lines = [m.group(1) for m in map(_KEEP.match, res.stdout.splitlines()) if m]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest(), len(lines)


def schedules(profile: str, extra: list[str]) -> list:
    from chord.schedule import Schedule, load_profile_file

    out = set(load_profile_file(profile).all_schedules()) | {Schedule.from_id(i) for i in extra}
    return sorted(out, key=lambda s: s.id)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path, help="write the fingerprints to this JSON file")
    g.add_argument("--compare", type=Path, help="compare with fingerprints written earlier")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--schedule", action="append", default=[], help="also this schedule id (repeatable)")
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args()
    from chord import jit

    todo = schedules(a.profile, a.schedule)
    results = jit.precompile(todo, progress=False, jobs=a.jobs)
    prints = {}
    for s, r in zip(todo, results):
        h, n = fingerprint(Path(r.cubin))
        prints[s.id] = {"sass_sha256": h, "instructions": n}
    if a.write:
        a.write.write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n")
        print(f"sass_check: {len(prints)} kernels fingerprinted into {a.write}")
        return 0
    before = json.loads(a.compare.read_text())
    changed = [k for k in prints if k in before and before[k]["sass_sha256"] != prints[k]["sass_sha256"]]
    missing = sorted(set(before) - set(prints))
    for k in changed:
        print(f"changed: {k} ({before[k]['instructions']} -> {prints[k]['instructions']} instructions)")
    for k in missing:
        print(f"not built now: {k}")
    same = len(prints) - len(changed)
    print(f"sass_check: {same} of {len(prints)} kernels have the same SASS as {a.compare.name}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
