"""chord.lab.stamps on the CPU: the per-CTA anatomy from known records, the record layout against
csrc/common/stamps.cuh, the stamped build (nvcc, no GPU) and `chord stamps`' refusals."""
from __future__ import annotations

import math
import re
import shutil
import os
from pathlib import Path

import pytest

from chord.lab import stamps as S

ROOT = Path(__file__).resolve().parents[1]

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("CHORD_NVCC") and not os.environ.get("CI"),
    reason="nvcc not installed (CI always has it and never skips this)")


def rec(entry_ns, exit_ns, sm, clk0, rows=0, first=None, epi=None, fixup=0, exit_clk=None, wait=0):
    r = S.fill_pattern()
    r[S.ENTRY], r[S.EXIT], r[S.SM] = entry_ns, exit_ns, sm
    r[S.ENTRY_CLK] = clk0
    r[S.WAIT_CLK], r[S.ROWS_CLK], r[S.FIXUP_CLK] = wait, rows, fixup
    if first is not None:
        r[S.FIRST_CLK] = first
    if epi is not None:
        r[S.EPI_CLK] = epi
    # 2 cycles per ns unless given
    r[S.EXIT_CLK] = exit_clk if exit_clk is not None else clk0 + 2 * (exit_ns - entry_ns)
    return r


def test_the_record_layout_is_csrc_s():
    text = (ROOT / "csrc/common/stamps.cuh").read_text()
    slots = {m.group(1): int(m.group(2)) for m in re.finditer(r"kStamp(\w+) = (\d+),", text)}
    assert slots == {"Entry": S.ENTRY, "EntryClk": S.ENTRY_CLK, "WaitClk": S.WAIT_CLK, "RowsClk": S.ROWS_CLK,
                     "FirstClk": S.FIRST_CLK, "EpiClk": S.EPI_CLK, "FixupClk": S.FIXUP_CLK,
                     "ExitClk": S.EXIT_CLK, "Exit": S.EXIT, "Sm": S.SM, "Slots": S.SLOTS}
    # the earliest-thread slots are the ones csrc writes with atomicMin
    for name in ("kStampFirstClk", "kStampEpiClk"):
        assert f"CHORD_STAMP_MIN({name})" in "".join(p.read_text() for p in (ROOT / "csrc").rglob("*.cuh"))
    assert S.fill_pattern()[S.FIRST_CLK] == S.NONE and S.fill_pattern()[S.ENTRY] == 0


def test_anatomy_of_known_records():
    # 4 CTAs on 2 SMs; the launch mark at 1000 ns; clocks at 2 cycles per ns
    rs = [
        rec(2000, 6000, 0, 10_000, rows=10_200, first=11_000, epi=17_000),  # 4 us
        rec(2100, 7000, 1, 50_000, rows=50_400, first=51_000, epi=58_000),  # 4.9 us
        rec(2200, 6500, 0, 10_400, rows=10_600, first=11_600, epi=18_000, fixup=18_200),
        rec(2500, 9000, 1, 50_800, rows=51_000, first=52_000, epi=60_000),
    ]
    a = S.anatomy("gate_up", "idx-x", rs + [S.fill_pattern()], prev_end_ns=1000, nbytes=14_000_000)
    assert a.ctas == 4 and a.sms == 2 and a.max_ctas_per_sm == 2
    assert a.ns_per_cycle == pytest.approx(0.5)
    assert a.launch_us == pytest.approx(1.0)  # 2000 - 1000 ns
    assert a.ramp_us == pytest.approx(0.5)  # 2500 - 2000
    assert a.span_us == pytest.approx(7.0)  # 9000 - 2000
    assert a.tail_us == pytest.approx(9.0 - 6.75)  # last exit - median exit (6500 + 7000) / 2
    assert a.tb_s == pytest.approx(14_000_000 / 7000 / 1000)
    assert a.fixup_ctas == 1
    ph = a.phases_us
    assert ph["setup"]["ctas"] == 4 and ph["fixup"]["ctas"] == 1
    # CTA 0: setup 200 cycles = 0.1 us, first data 0.4 us, streaming 3 us, epilogue (18000 - 17000) / 2000
    assert sorted(ph) == ["epilogue", "first_data", "fixup", "setup", "streaming"]
    assert ph["streaming"]["p90"] >= ph["streaming"]["p50"] > 0
    assert ph["fixup"]["p50"] == pytest.approx((10_400 + 2 * 4300 - 18_200) * 0.5 / 1000)


def test_a_phase_without_its_stamps_is_left_out():
    # a persistent CTA (no rows stamp), no fix-up; and one that left with no tile (no first / epilogue)
    r = rec(0 + 1, 4001, 3, 100, first=300, epi=4100)
    ph = S.cta_phases(r, 0.5)
    assert set(ph) == {"streaming", "epilogue"}
    r2 = rec(1, 501, 3, 100, rows=0)
    assert S.cta_phases(r2, 0.5) == {}


def test_records_that_do_not_add_up_are_refused():
    with pytest.raises(S.StampsError, match="no CTA wrote a stamp"):
        S.anatomy("down", "idx-y", [S.fill_pattern()] * 3, 0, 1)
    bad = rec(5000, 4000, 0, 100, exit_clk=50)
    with pytest.raises(S.StampsError, match="left before they entered"):
        S.anatomy("down", "idx-y", [bad], 0, 1)
    assert S.order_violations([rec(1, 2001, 0, 100, rows=90, first=200, epi=300)]) == \
        ["CTA 0: rows (90) before entry (100)"]
    assert S.order_violations([rec(1, 2001, 0, 100, rows=110, first=200, epi=300, fixup=350)]) == []


def test_timer_step_and_the_replay_summary():
    gu = [rec(2000, 6000, 0, 10_000, rows=10_200, first=11_000, epi=17_000),
          rec(2032, 6064, 1, 50_000, rows=50_400, first=51_000, epi=58_000)]
    dn = [rec(7000, 9000, 0, 20_000, rows=20_100, first=20_500, epi=23_000)]
    assert S.timer_step_ns(gu) == 32
    one = S.replay_anatomy((1000, 9500), ("idx-gu", gu), ("idx-dn", dn), (1_000_000, 500_000))
    assert one["down"]["launch_us"] == pytest.approx((7000 - 6064) / 1000)
    assert one["end_us"] == pytest.approx(0.5) and one["pair_us"] == pytest.approx(8.5)
    summ = S.summarize([one, one])
    assert summ["gate_up"]["schedule"] == "idx-gu" and summ["pair_us"] == pytest.approx(8.5)
    md = S.markdown([{"scenario": "tp8-m1", "family": "indexed", "summary": summ,
                      "graph_us": {"stamped": 10.0, "plain": 9.8}}])
    assert "`idx-gu`" in md and "`idx-dn`" in md and "10.00 / 9.80" in md
    assert not math.isnan(summ["down"]["phases_us"]["streaming"]["p50"])


@needs_nvcc
def test_the_stamped_build_has_the_stamp_globals_and_the_plain_one_none(tmp_path, monkeypatch):
    from chord import jit
    from chord.schedule import Schedule

    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    s = Schedule.from_id("idx-m8n64k64-w4-s4-c1-sk2")
    stamped = jit.build_schedule(s, 8, stamps=True)
    plain = jit.build_schedule(s, 8)
    assert stamped.cubin != plain.cubin
    assert b"chord_stamp_buf" in stamped.cubin.read_bytes() and b"chord_stamp_ctas" in stamped.cubin.read_bytes()
    assert b"chord_stamp_buf" not in plain.cubin.read_bytes()


def test_chord_stamps_refuses_bad_flags_before_any_gpu_work(capsys):
    from chord.lab import cli

    assert cli.main(["stamps", "--scenarios", "tp8-m1", "--reps", "0"]) == 2
    assert "--reps must be >= 1" in capsys.readouterr().err
    assert cli.main(["stamps", "--scenarios", "tp8-m9"]) == 2
    assert "unknown scenario 'tp8-m9'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="reps must be an int >= 1"):
        S.run(scenarios="tp8-m1", families="indexed", reps=0)
