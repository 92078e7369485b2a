"""The optimization table: every entry names a real knob with a legal 'off' value or is a policy,
and switching an implemented knob off gives a valid schedule that differs only there."""
import pytest

from chord import optimizations as O
from chord.schedule import KNOB, Schedule, load_profile_file

PROFILE = sorted(load_profile_file("h200").all_schedules(), key=lambda s: s.id)


def test_every_entry_is_well_formed():
    assert len({o.name for o in O.OPTIMIZATIONS}) == len(O.OPTIMIZATIONS)
    for o in O.OPTIMIZATIONS:
        assert o.kind in ("knob", "policy") and o.status in (O.IMPLEMENTED, O.PLANNED)
        assert o.notebook[:2].isdigit()
        if o.status == O.PLANNED:
            assert o.issue is not None, o.name
        if o.kind == "knob" and o.status == O.IMPLEMENTED:
            k = KNOB[o.knob]
            assert k.off in k.legal and k.off is not None, o.name


def test_every_optimization_knob_of_the_table_is_in_the_knob_table():
    optional = {k.name for k in KNOB.values() if k.off is not None}
    assert optional == {o.knob for o in O.implemented_knobs()}


@pytest.mark.parametrize("sched", PROFILE, ids=lambda s: s.id)
def test_switch_off_each_knob_of_every_profile_schedule(sched):
    for name, off in O.ablations(sched).items():
        o = O.BY_NAME[name]
        assert isinstance(off, Schedule) and not o.is_on(off) and off != sched
        changed = {k for k in KNOB if getattr(off, k) != getattr(sched, k)}
        allowed = {o.knob} | ({"warps", "wgmma_wait", "producer", "group_steps", "block_m", "persistent", "queue",
                                                     "bulk_w", "tma_x"} if o.knob == "mainloop" else
                              {"queue"} if o.knob == "persistent" else
                              {"split_cluster"} if o.knob == "split_k" else
                              {"block_m", "fold"} if o.knob == "swap" else set())
        assert changed <= allowed, (name, changed)


def test_planned_entries_cannot_be_switched_off():
    planned = [o for o in O.OPTIMIZATIONS if o.status == O.PLANNED]
    assert planned
    with pytest.raises(ValueError, match="planned"):
        planned[0].switch_off(PROFILE[0])
    with pytest.raises(ValueError, match="not a schedule knob"):
        O.BY_NAME["tok_e block-M rule"].off_value


def test_wgmma_prefill_schedule_ablations():
    s = Schedule.from_id("gcon-m128n256k64-w16-s5-c1-wgmma-r8")
    ab = O.ablations(s)
    assert set(ab) == {"wgmma main loop", "batched wgmma.wait_group 1", "tile raster", "stmatrix epilogue"}
    assert ab["stmatrix epilogue"].id == "gcon-m128n256k64-w16-s5-c1-wgmma-r8-stm0"
    assert ab["wgmma main loop"].id == "gcon-m128n256k64-w4-s5-c1-r8"
    assert ab["batched wgmma.wait_group 1"].id == "gcon-m128n256k64-w16-s5-c1-wgmma-wait0-r8"
    assert ab["tile raster"].id == "gcon-m128n256k64-w16-s5-c1-wgmma"


def test_decode_swap_off_side():
    s = Schedule.from_id("gmsk-m8n256k64-w4-s8-c1")
    o = O.BY_NAME["decode operand swap"]
    assert o.is_on(s)
    off = o.switch_off(s)
    assert off.id == "gmsk-m16n256k64-w4-s8-c1-swap0" and not o.is_on(off)
    assert Schedule.from_id(off.id) == off
    assert o.switch_off(Schedule.from_id("idx-m32n256k64-w4-s3-c1")).block_m == 32
    assert not o.is_on(Schedule.from_id("gcon-m128n256k64-w16-s5-c1-wgmma-r8"))  # wgmma: no swap knob


@pytest.mark.parametrize("bad, match", [
    (dict(block_m=8, swap=0), "multiple of 16"),
    (dict(block_m=64, block_n=128, warps=8, stages=4, mainloop="wgmma", swap=0), "mma only"),
    (dict(block_m=16, swap=2), "swap must be one of"),
])
def test_swap_knob_bad_values(bad, match):
    kw = dict(block_n=256, warps=4, stages=4)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        Schedule("grouped_masked", **kw)


def test_policy_entries_name_heuristic_rules():
    from chord.schedule import POLICY_RULES, parse_policy

    rules = {o.rule for o in O.OPTIMIZATIONS if o.rule}
    assert rules == set(POLICY_RULES)
    for o in O.OPTIMIZATIONS:
        if o.rule:
            assert o.kind == "policy" and o.status == O.IMPLEMENTED
            assert parse_policy(o.policy_off).off == {o.rule}
    with pytest.raises(ValueError, match="not a rule"):
        O.BY_NAME["tile raster"].policy_off
