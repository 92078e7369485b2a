"""One suite GEMM under one or more schedules: ``chord bench --gemm gate_up|down --schedule ID ...``.

For profilers (ncu, nsys around the command) and quick A/B timings. The inputs are the ones
`chord tune` and `chord bench` build; the first schedule (default: the one `chord bench` launches
for that GEMM under the profile and policy in use) is the reference the others are compared with,
bit for bit or by relative error (chord.lab.tune.time_schedules). Needs an sm_90 GPU.
"""
from __future__ import annotations

from typing import Callable, Sequence

GEMMS = ("gate_up", "down")


def default_schedule(scenario, family: str, gemm: str, profile: str):
    """The schedule `chord bench` launches for this GEMM (chord.lab.bench.runner.scenario_schedules)."""
    from chord.lab.bench.runner import ChordAPI, scenario_schedules

    gate_up, down = scenario_schedules(family, scenario, ChordAPI.profile(profile, scenario))
    return gate_up if gemm == "gate_up" else down


def run(scenario: str, family: str, gemm: str, schedules: Sequence[str] = (), *, profile: str, rep_ms: float = 50.0,
        warmup_ms: float | None = None, suite=None, out: Callable[[str], None] = print) -> list[dict]:
    """Times the GEMM under each schedule (the bench's decision when none is given), prints one
    line per schedule through `out` and returns chord.lab.tune.time_schedules' rows."""
    from chord.lab import tune
    from chord.lab.bench.suite import load_suite

    s = load_suite(suite)
    ids = list(schedules) or [default_schedule(s.scenario(scenario), family, gemm, profile).id]
    rows = tune.time_schedules(scenario, family, gemm, ids, rep_ms=rep_ms,
                               warmup_ms=tune.WARMUP_MS if warmup_ms is None else warmup_ms, suite_path=s.path)
    for r in rows:
        same = "bit-identical" if r["same_bits"] else f"rel_err {r['rel_err']:.1e}"
        out(f"{r['scenario']} {r['family']} {r['gemm']} {r['schedule']:45s} {r['us']:9.1f} us  ({same} vs first)")
    return rows
