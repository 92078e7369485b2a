"""A copy of a profile with knobs set on every rule: ``chord variant --set KNOB=VALUE --out FILE``.

The "knob on everywhere" side of an A/B that `chord tune` cannot time (it times one GEMM alone),
such as programmatic dependent launch, whose gain is between the calls of a layer::

    chord variant --set pdl=1 --out h200-pdl.json [--profile h200]
    chord variant --set pdl=1 --set pdl_prefetch=1 --out h200-pdl-pf.json
    chord bench --profile h200-pdl.json --humming-dir /tmp/humming ...
    chord precompile --profile h200-pdl.json --out pdl.tar.xz

Each value is checked against the knob table (chord.schedule.KNOBS) and the written file is
loaded back with chord.schedule.load_profile_file (every rule must still give a legal schedule),
so a bad knob or value fails here, naming it, not on the GPU machine. Each rule's `why` records
the change.
"""
from __future__ import annotations

import json
from pathlib import Path

from chord.schedule import KNOB, _profile_path, load_profile_file


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
    e.g. fold on the mma loop with the operand swap) have their values there and those it needs
    above a value (KNOB[name].above, e.g. split_cluster where split_k > 1) exceed it (absent =
    default)."""
    return KNOB[name].applies(lambda k: rule.get(k, KNOB[k].default))


def variant(profile: str, sets: dict) -> dict:
    """The profile with `sets` on every rule; a knob that does not apply to a rule (its main loop)
    leaves that rule as it is, and the rule's `why` says so."""
    data = json.loads(_profile_path(profile).read_text())
    for dep in data["deployments"].values():
        for rules in dep["families"].values():
            for rule in rules:
                on = {}
                for k, v in sets.items():  # in order: a knob may require one set before it (pdl_prefetch, pdl)
                    if applies({**rule, **on}, k):
                        on[k] = v
                rule.update(on)
                note = ", ".join(f"{k}={v}" for k, v in on.items()) or "none"
                skipped = "".join(f"; {k} does not apply here" for k in sets if k not in on)
                rule["why"] = f"variant ({note}{skipped}, chord variant) of: {rule.get('why', '')}"
    note = ", ".join(f"{k}={v}" for k, v in sets.items())
    data["about"] = f"{data.get('about', '')} [variant: {note} on every rule it applies to]".strip()
    return data


def write(profile: str, sets: dict, out: str | Path) -> int:
    """Writes the variant to `out` and loads it back (a rule that no longer gives a legal schedule
    is a ValueError naming it, and the file is removed); returns its number of schedules."""
    out = Path(out)
    out.write_text(json.dumps(variant(profile, sets), indent=1) + "\n")
    try:
        load_profile_file.cache_clear()  # a file of the same path may have been read before
        return len(load_profile_file(str(out)).all_schedules())
    except ValueError:
        out.unlink()
        raise
