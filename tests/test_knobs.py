"""The knob table checks every knob: a Schedule refuses any value outside a knob's ``legal`` row,
whatever knob it is, and the split modules (knobs, profiles, selection) stay behind one facade."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chord.knobs import KNOB, KNOBS, Schedule

BASES = {  # one legal schedule per main loop (the illegal value is set on top of it)
    "mma": dict(family="indexed", block_m=16, block_n=128),
    "wgmma": dict(family="grouped_contiguous", block_m=64, block_n=128, warps=8, mainloop="wgmma"),
}


def _illegal_values(knob) -> list:
    """Values of the knob's type outside its legal row: below, above and in every gap of it."""
    if isinstance(knob.default, str):
        return ["nope", knob.legal[0].upper()]
    legal = sorted(knob.legal)
    gaps = [v for v in range(legal[0], legal[-1]) if v not in knob.legal]
    return [legal[0] - 1, legal[-1] + 1, -1, *gaps[:3], *gaps[-2:]]


@pytest.mark.parametrize("loop", sorted(BASES))
@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_in_the_table_is_legality_checked(knob, loop):
    Schedule(**BASES[loop])  # the base is legal
    for value in _illegal_values(knob):
        assert value not in knob.legal
        with pytest.raises(ValueError) as err:
            Schedule(**{**BASES[loop], knob.name: value})
        assert knob.name in str(err.value), (knob.name, value, str(err.value))


@pytest.mark.parametrize("name, value, text", [
    ("stages", 13, "stages must be in [2, 12], got 13"),
    ("mainloop", "x", "mainloop must be one of ('mma', 'wgmma'), got 'x'"),
    ("block_n", 2048, "block_n must be a multiple of 16 in [16, 1024], got 2048"),
    ("split_k", 5, "split_k must be one of 1, 2, 3, 4, 6, 8, 12, 16, got 5"),
    ("pdl", 2, "pdl must be one of 0, 1, got 2"),
])
def test_table_errors_name_the_legal_values(name, value, text):
    kw = dict(BASES["mma"], **{name: value})
    if name == "block_n":
        kw["warps"] = 1  # 2048 is a multiple of 16 x warps: only the table refuses it
    with pytest.raises(ValueError) as err:
        Schedule(**kw)
    assert str(err.value) == text


def test_illegal_ctas_per_sm_is_refused_before_the_register_budget():
    # the wgmma register budget divides by ctas_per_sm: 0 is a clear error, not a ZeroDivisionError
    for value in (0, -1, 5):
        with pytest.raises(ValueError, match=f"ctas_per_sm must be one of 1, 2, 3, 4, got {value}"):
            Schedule(**{**BASES["wgmma"], "ctas_per_sm": value})


def test_schedule_facade_re_exports_the_split_modules():
    from chord import deployments, knobs, profiles, schedule, selection

    homes = (knobs, profiles, selection, deployments)
    for name in schedule.__all__:
        obj = getattr(schedule, name)
        assert any(getattr(m, name, None) is obj for m in homes), name
    # the private names other modules and tests import from chord.schedule
    for name in ("_fit_schedule", "_explain", "_profile_path", "_check_family", "_parse_id"):
        assert hasattr(schedule, name), name
    assert schedule.KNOB is KNOB and schedule.Schedule is Schedule


def test_importing_the_schedule_modules_stays_light():
    code = ("import sys, chord.schedule, chord.deployments, chord.cost; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('chord', 'torch', 'humming')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in out if m.startswith(("torch", "humming"))], out
    assert set(out) <= {"chord", "chord._env", "chord._moved", "chord._resources", "chord.knobs", "chord.profiles",
                        "chord.selection", "chord.schedule", "chord.deployments", "chord.cost"}, out


# --- one row per knob: a knob is its KNOBS row, its C++ use and its chord.optimizations entry ---


def _csrc_text() -> str:
    from chord._resources import csrc_dir

    return "\n".join(p.read_text() for p in sorted(Path(csrc_dir()).rglob("*.cuh")))


def test_schedule_fields_come_from_the_table():
    import dataclasses

    fields = dataclasses.fields(Schedule)
    assert [f.name for f in fields] == ["family"] + [k.name for k in KNOBS]
    for f, knob in zip(fields[1:], KNOBS):
        want = dataclasses.MISSING if knob.default is None else knob.default
        assert f.default == want, knob.name


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_has_its_cxx_use(knob):
    """The rendered configuration names the knob, and a part of csrc/ (or the rendered kernel's
    declaration, for the launch bounds and the cluster shape) reads that name."""
    from chord import jit

    assert re.fullmatch(r"k[A-Z][A-Za-z0-9]*", knob.cxx), knob.cxx
    assert len({k.cxx for k in KNOBS}) == len(KNOBS)
    rendered = jit.render(Schedule.from_id("gmsk-m32n256k64-w4-s8-c2-wgmma-gs2-tx1-cn2"))
    assert re.search(rf"static constexpr \S+ {knob.cxx} = ", rendered), knob.cxx
    used = re.search(rf"\bCfg::{knob.cxx}\b", _csrc_text()) or re.search(rf"\bChordCfg::{knob.cxx}\b", rendered)
    assert used, f"knob {knob.name}: no part of csrc/ reads Cfg::{knob.cxx}"


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.off is not None], ids=lambda k: k.name)
def test_every_optimization_knob_has_its_entry(knob):
    from chord.optimizations import OPTIMIZATIONS

    assert any(o.kind == "knob" and o.knob == knob.name for o in OPTIMIZATIONS), (
        f"knob {knob.name} has an off value but no chord.optimizations entry")
