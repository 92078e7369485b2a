"""A copy of a profile with knobs set on every rule: the "knob on everywhere" side of an A/B that
`chord tune` cannot time (it times one GEMM alone), such as programmatic dependent launch, whose
gain is between the calls of a layer.

    python tools/profile_variant.py --set pdl=1 --out /tmp/h200-pdl.json [--profile h200]
    python -m chord.cli bench --profile /tmp/h200-pdl.json --humming-dir /tmp/humming ...
    python tools/device_cache.py --profile /tmp/h200-pdl.json --no-tests --out .cache/pdl.tar.xz

Each value is checked against the knob table (chord.schedule.KNOBS) and the written file is
loaded back with chord.schedule.load_profile_file (every rule must still give a legal schedule),
so a bad knob or value fails here, naming it, not on the GPU machine. Each rule's `why` records
the change.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chord.schedule import KNOB, _profile_path, load_profile_file  # noqa: E402


def parse_sets(items: list[str]) -> dict:
    """{knob: int value} of `name=value` items, each checked against the knob table."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in KNOB:
            raise ValueError(f"--set {item!r}: expected <knob>=<value> with a knob of chord.schedule.KNOBS "
                             f"({', '.join(sorted(KNOB))})")
        knob = KNOB[name]
        if knob.always:
            raise ValueError(f"--set {item!r}: {name} is a tile shape knob, not one to switch on every rule")
        v = value if isinstance(knob.default, str) else int(value) if value.lstrip("-").isdigit() else value
        if v not in knob.legal:
            raise ValueError(f"--set {item!r}: {name} must be one of {', '.join(map(str, knob.legal))}")
        out[name] = v
    return out


def applies(rule: dict, name: str) -> bool:
    """Whether knob `name` applies to a profile rule: the knobs it requires (KNOB[name].requires,
    e.g. fold on the mma loop with the operand swap) have their values there (absent = default)."""
    return all(rule.get(k, KNOB[k].default) == v for k, v in KNOB[name].requires)


def variant(profile: str, sets: dict) -> dict:
    """The profile with `sets` on every rule; a knob that does not apply to a rule (its main loop)
    leaves that rule as it is, and the rule's `why` says so."""
    data = json.loads(_profile_path(profile).read_text())
    for dep in data["deployments"].values():
        for rules in dep["families"].values():
            for rule in rules:
                on = {k: v for k, v in sets.items() if applies(rule, k)}
                rule.update(on)
                note = ", ".join(f"{k}={v}" for k, v in on.items()) or "none"
                skipped = "".join(f"; {k} does not apply here" for k in sets if k not in on)
                rule["why"] = f"variant ({note}{skipped}, tools/profile_variant.py) of: {rule.get('why', '')}"
    note = ", ".join(f"{k}={v}" for k, v in sets.items())
    data["about"] = f"{data.get('about', '')} [variant: {note} on every rule it applies to]".strip()
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200", help="profile to start from (name or path; default h200)")
    ap.add_argument("--set", action="append", required=True, metavar="KNOB=VALUE",
                    help="knob value for every rule it applies to")
    ap.add_argument("--out", type=Path, required=True, help="where to write the variant (a .json path)")
    a = ap.parse_args(argv)
    try:
        data = variant(a.profile, parse_sets(a.set))
    except ValueError as exc:
        print(f"profile_variant: {exc}", file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(data, indent=1) + "\n")
    pf = load_profile_file(str(a.out))  # every rule still a legal schedule, or a ValueError naming it
    print(f"profile_variant: {len(pf.all_schedules())} schedules with {', '.join(a.set)} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
