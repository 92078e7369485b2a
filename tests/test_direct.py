"""Warp-private rings (`direct`, id token `dr1`) on the host: the knob's rules and errors, its
shared-memory count, its off side, `chord tune`'s candidates, and the SASS of built kernels (no
CTA barrier inside the K loop, copy groups waited per warp)."""
import re

import pytest

from chord import jit, optimizations
from chord.lab import tune
from chord.schedule import KNOB, Schedule

from test_jit import needs_nvcc
from test_pdl import _toolkit_file


def test_id_round_trip_and_rules():
    fo = Schedule.from_id("idx-m8n32k64-w8-s8-c1-fo1-dr1")  # folded group scales on the warps' rings
    assert fo.fold == 1 and fo.direct == 1
    pf = Schedule.from_id("idx-m8n64k64-w4-s4-c1-pd1-pf1-dr1")  # each warp's first stages before the PDL wait
    assert optimizations.BY_NAME["PDL weight prefetch"].is_on(pf) and pf.direct == 1
    assert optimizations.BY_NAME["folded group scales"].switch_off(fo) == Schedule.from_id("idx-m8n32k64-w8-s8-c1-dr1")
    s = Schedule.from_id("idx-m8n32k64-w8-s8-c1-dr1")
    assert s.direct == 1 and s.warps == 8 and s.block_n == 32 and s.id == "idx-m8n32k64-w8-s8-c1-dr1"
    assert KNOB["direct"].off == 0 and KNOB["direct"].applies(lambda k: getattr(s, k))
    # 8 warps on 2 tiles: legal only because the warps split K (the CTA ring needs block_n >= 16 * warps)
    with pytest.raises(ValueError, match="block_n must be a positive multiple of 16\\*warps=128"):
        Schedule("indexed", 8, 32, 8, 8, 1)
    for bad, text in (("idx-m8n48k64-w4-s4-c1-dr1", "direct=1 .* block_n must be one of \\(16, 32, 64, 128\\), got 48"),
                      ("idx-m8n256k64-w4-s4-c1-dr1", "block_n must be one of \\(16, 32, 64, 128\\), got 256"),
                      ("idx-m40n64k64-w4-s4-c1-dr1", "block_m must be at most 32, got 40"),
                      ("idx-m16n64k64-w4-s4-c1-swap0-dr1", "needs swap=1 .* got swap=0"),
                      ("idx-m8n128k64-w4-s4-c1-ws1-dr1", "got producer=1"),
                      ("idx-m8n64k64-w4-s4-c1-stk1-dr1", "got stream_k=1"),
                      ("idx-m8n64k64-w4-s4-c1-nt2-dr1", "got n_tiles=2"),
                      ("idx-m16n64k64-w4-s4-c1-wgmma-dr1", "direct=1 is a form of the mma loop")):
        with pytest.raises(ValueError, match=text):
            Schedule.from_id(bad)


@pytest.mark.parametrize("sid,smem", [
    # warps x stages x (words 512 + scales 64 per tile, 144 bytes per token row), or the partials
    ("idx-m8n32k64-w8-s8-c1-dr1", 8 * 8 * (2 * 576 + 8 * 144)),
    ("idx-m8n128k64-w4-s2-c1-dr1", 4 * 2 * (8 * 576 + 8 * 144)),
    ("idx-m16n16k64-w1-s3-c1-dr1", 1 * 3 * (1 * 576 + 16 * 144)),
    ("gmsk-m32n128k64-w8-s2-c1-sk3-dr1", 8 * 2 * (8 * 576 + 32 * 144)),
    ("gcon-m8n32k64-w2-s5-c1-sk2-skc1-dr1", 2 * 5 * (2 * 576 + 8 * 144)),
])
def test_shared_memory_count(sid, smem):
    s = Schedule.from_id(sid)
    partials = s.warps * (s.block_n // 16) * (s.block_m // 8) * 512 if s.warps > 1 else 0
    epilogue = max(s.block_m * (s.block_n + 8) * 2, s.block_m * s.block_n * 4 if s.split_cluster else 0)
    assert s.smem_bytes == max(smem, partials, epilogue)


def test_off_side_is_the_cta_ring_with_at_most_block_n_over_16_warps():
    o = optimizations.BY_NAME["warp-private rings"]
    cases = [Schedule.from_id(i) for i in ("idx-m8n32k64-w8-s8-c1-dr1", "idx-m8n128k64-w4-s2-c1-dr1",
                                           "gmsk-m8n64k64-w8-s4-c1-sk2-skc1-dr1", "gcon-m24n32k64-w1-s4-c1-pd1-dr1")]
    for s in cases + [c for n, k in ((512, 7168), (7168, 256)) for c in tune.candidates("indexed", n, 8 / 384, k=k)
                      if c.direct]:
        off = o.switch_off(s)
        assert o.is_on(s) and not o.is_on(off) and off.direct == 0
        assert off.warps == min(s.warps, s.block_n // 16) and off.block_n == s.block_n and off.split_k == s.split_k
    assert "warp-private rings" in optimizations.ablations(cases[0])


def test_tune_offers_direct_tiles_only_at_few_rows_per_expert():
    tp8 = tune.candidates("indexed", 512, 8 / 384, k=7168)
    ids = {s.id for s in tp8 if s.direct}
    assert {"idx-m8n32k64-w8-s8-c1-dr1", "idx-m8n64k64-w8-s4-c1-sk2-dr1"} <= ids
    assert any(s.direct for s in tune.candidates("indexed", 512, 5.3, k=7168))  # tp8-m256: 2048 rows, 384 experts
    assert not any(s.direct for s in tune.candidates("indexed", 512, 16.0, k=7168))
    assert not any(s.direct for s in tune.candidates("indexed", 512, 0.5, mainloops=("wgmma",), k=7168))
    assert all(s.producer == 0 for s in tp8 if s.direct)
    assert {s.id for s in tp8 if s.direct and s.fold} == {i.replace("-dr1", "-fo1-dr1") for i in ids if "-fo1" not in i}


def _sass_lines(cubin):
    res = jit.run_cuobjdump(cubin)
    assert res is not None and res.returncode == 0, res and res.stderr
    out = []
    for line in res.stdout.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


@needs_nvcc
@pytest.mark.parametrize("sid", ["idx-m8n32k64-w8-s8-c1-dr1", "idx-m8n64k64-w8-s4-c1-sk2-dr1",
                                 "gmsk-m8n128k64-w4-s3-c1-pd1-dr1", "gcon-m16n64k64-w2-s4-c1-sk2-skc1-dr1",
                                 "idx-m8n32k64-w8-s8-c1-fo1-dr1"])
def test_the_k_loop_waits_per_warp_and_has_no_cta_barrier(sid, tmp_path, monkeypatch):
    """The built kernel's K loop (the backward branch around the wait on the copy groups) holds the
    ring's DEPBAR.LE SB0, stages - 2, a WARPSYNC, the copies and the MMAs, and no BAR: no warp waits
    for another before the partials meet."""
    _toolkit_file("cuobjdump")
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    s = Schedule.from_id(sid)
    r = jit.build_schedule(s)
    assert r.spill_bytes == 0, r.log
    sass = _sass_lines(r.cubin)
    waits = [a for a, ins in sass if ins.startswith(f"DEPBAR.LE SB0, 0x{s.stages - 2:x}")]
    assert waits, f"{sid}: no wait for the ring's copy groups"
    loops = []
    for a, ins in sass:
        m = re.match(r"(@!?U?P\d+ )?BRA (0x[0-9a-f]+)", ins)
        if m and int(m.group(2), 16) < a:
            lo = int(m.group(2), 16)
            if any(lo <= w <= a for w in waits):
                loops.append((lo, a))
    assert loops, f"{sid}: no loop around the ring's wait"
    lo, hi = min(loops, key=lambda x: x[1] - x[0])
    body = [ins for a, ins in sass if lo <= a <= hi]
    assert not [i for i in body if i.startswith("BAR.")], f"{sid}: a CTA barrier inside the K loop"
    assert any(i.startswith("WARPSYNC") for i in body)
    assert any("LDGSTS" in i for i in body) and any(i.startswith("HMMA.16816.F32.BF16") for i in body)


def test_the_tune_cut_keeps_the_one_token_direct_candidates():
    """chord tune's default cut (24 in the cost model's order, chord.cost): a direct warp whose K
    share is shorter than its ring has every byte in flight at once (no ring-fill penalty), so TP8
    one token keeps its direct candidates of both GEMMs (docs/optimizations.md, "Warp-private rings")."""
    from chord.lab.bench.suite import load_suite
    from chord.schedule import select

    sc = load_suite().scenario("tp8-m1")
    for gemm, want in (("gate_up", "idx-m8n32k64-w8-s8-c1-dr1"), ("down", "idx-m8n128k64-w4-s2-c1-dr1")):
        n, k, prob = sc.gemm_problem("indexed", gemm)
        cut = tune.tuning_candidates("indexed", prob, sc.rows_per_expert, select(sc.profile(None, "indexed"), prob),
                                     "h200", 24)
        assert Schedule.from_id(want) in cut, (gemm, [s.id for s in cut if s.direct])


def test_a_profile_rule_keeps_the_direct_warps(tmp_path):
    """A profile rule with direct=1 keeps its warps when fitted to a GEMM's N (the warps split K, so
    8 warps on a 32-feature block are legal), and the bench launches what the rule says: a copy of
    the H200 profile whose two TP8 one-token rules are the direct candidates."""
    from chord.lab.bench import runner
    from chord.lab.bench.suite import load_suite
    from chord.profiles import _fit_schedule
    from chord.testing import DIRECT_ONE_TOKEN, direct_one_token_profile

    assert _fit_schedule("indexed", {"block_m": 8, "block_n": 32, "warps": 8, "stages": 8, "direct": 1}, 512).id == \
        "idx-m8n32k64-w8-s8-c1-dr1"
    assert _fit_schedule("indexed", {"block_m": 8, "block_n": 128, "warps": 8, "stages": 3, "direct": 1}, 7232).id == \
        "idx-m8n64k64-w8-s3-c1-dr1"  # block_n halves until it divides N; the warps stay
    path = direct_one_token_profile(tmp_path / "h200-direct.json")
    sc = load_suite().scenario("tp8-m1")
    got = runner.scenario_schedules("indexed", sc, runner.ChordAPI.profile(path, sc))
    assert tuple(s.id for s in got) == DIRECT_ONE_TOKEN
