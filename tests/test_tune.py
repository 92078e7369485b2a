"""`chord tune` host logic: candidate spaces and turning measured points into a profile."""
import dataclasses
import json

import pytest

from chord.lab import tune
from chord.schedule import Problem, Schedule, load_profile_file, select


def test_candidates_are_valid_and_cover_block_m():
    c = tune.candidates("indexed", 4096, 12.0)
    assert c and all(isinstance(s, Schedule) and 4096 % s.block_n == 0 for s in c)
    assert {s.block_m for s in c if s.mainloop == "mma"} == {8, 16}
    assert {s.block_m for s in tune.candidates("indexed", 512, 0.02)} == {8}
    assert {s.block_m for s in tune.candidates("indexed", 7168, 512) if s.mainloop == "mma"} == {32, 64}
    assert {s.block_m for s in tune.candidates("indexed", 7168, 512) if s.mainloop == "wgmma"} == {192, 256}
    assert {s.block_m for s in tune.candidates("indexed", 4096, 12.0) if s.mainloop == "wgmma"} == {16, 32}
    # between powers of two: the covering tile, one smaller and one larger (TP8 m4096: 85 rows per expert)
    assert {s.block_m for s in tune.candidates("indexed", 512, 85.3) if s.mainloop == "wgmma"} == {64, 96, 128}
    assert not any(s.mainloop == "wgmma" for s in tune.candidates("indexed", 4096, 4.0))  # decode: mma only
    assert {s.raster for s in tune.candidates("indexed", 4096, 256)} == {0, 4, 8}
    # a raster is tried below 64 rows per expert too (tp8-m1024: 21 rows, activations beyond L2)
    assert {s.raster for s in tune.candidates("indexed", 512, 21.3) if s.mainloop == "wgmma"} == {0, 4, 8}
    # the wgmma producer loop is a candidate, at 1 CTA per SM (setmaxnreg)
    ws = [s for s in tune.candidates("grouped_contiguous", 4096, 64) if s.producer]
    assert ws and all(s.mainloop == "wgmma" and s.ctas_per_sm == 1 for s in ws)
    assert any(s.id == "gcon-m64n512k64-w8-s4-c1-wgmma-ws1-gs2-r8" for s in ws)
    wg = [s for s in tune.candidates("indexed", 4096, 32) if s.mainloop == "wgmma"]
    assert {s.ntw for s in wg} == {1, 2, 4} and {s.group_steps for s in wg if s.ntw > 1} == {1, 2}
    assert any(s.block_n == 512 and s.warps == 8 for s in wg)  # the wide tile of ep8-decode-tok32 gate_up
    assert all(s.warps % 4 == 0 for s in wg)


def test_pair_and_tma_candidates():
    """Raster-8 wgmma candidates also come as CTA pairs (even N-block count); grouped tiles of 192+
    rows also with the TMA activation box, and at the raster of one expert's tiles."""
    c = {s.id for s in tune.candidates("grouped_contiguous", 4096, 512.0, k=7168)}
    for sid in ("gcon-m256n128k64-w8-s4-c1-wgmma-r8-cn2", "gcon-m256n128k64-w8-s4-c1-wgmma-r8-tx1",
                "gcon-m256n128k64-w8-s4-c1-wgmma-r8-tx1-cn2", "gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2"):
        assert sid in c, sid
    assert not any("-tx1" in i and "-m128n" in i for i in c)  # the TMA box only from 192 rows
    assert not any("-r0" in i or ("-cn2" in i and "-r8" not in i and "-r2" not in i) for i in c)
    ind = tune.candidates("indexed", 4096, 512.0, k=7168)
    assert not any(s.tma_x for s in ind) and any(s.cluster_n == 2 for s in ind)  # gathered rows: no TMA
    # one N block of 512 (TP8 gate_up): no pairs
    assert not any(s.cluster_n == 2 and s.block_n == 512 for s in tune.candidates("indexed", 512, 21.3, k=7168))
    for s in tune.candidates("grouped_masked", 4096, 32.0, k=7168):
        assert s.cluster_n == 1 or (4096 // s.block_n) % 2 == 0


def test_l2_hint_candidates_are_the_indexed_raster_8_tiles():
    """l2_hint 1 (tune.L2_HINTS) comes on the indexed family's raster-8 wgmma tiles only: the
    grouped families read each row once per N block."""
    ind = tune.candidates("indexed", 512, 85.3, k=7168)  # TP8 m4096 gate_up
    hinted = [s for s in ind if s.l2_hint]
    assert hinted and all(s.l2_hint in tune.L2_HINTS and s.raster == tune.PAIR_RASTER and s.mainloop == "wgmma"
                          and not s.producer for s in hinted)
    assert {dataclasses.replace(s, l2_hint=0).id for s in hinted} <= {s.id for s in ind}  # each beside its twin
    for fam in ("grouped_contiguous", "grouped_masked"):
        assert not any(s.l2_hint for s in tune.candidates(fam, 4096, 128.0, k=7168))


def test_tune_schedules_cover_defaults_and_candidates():
    from chord.lab.bench.suite import load_suite

    scheds = tune.tune_schedules(scenario_ids="ep8-prefill-tok128")
    assert len({s.id for s in scheds}) == len(scheds)
    assert any(s.mainloop == "wgmma" for s in scheds) and any(s.mainloop == "mma" for s in scheds)
    sc = load_suite().scenario("ep8-prefill-tok128")
    assert set(tune.candidates("indexed", sc.n_down, sc.rows_per_expert)) <= set(scheds)


def test_rule_keeps_every_non_default_knob():
    pt = _pt("ep8-prefill", "indexed", "gate_up", 128.0, 4096, 7168, "idx-m128n256k64-w16-s4-c1-wgmma-r8", 600.0)
    r = tune._rule(None, pt)
    assert r["mainloop"] == "wgmma" and r["raster"] == 8 and "wgmma_wait" not in r and "split_k" not in r


def _pt(dep, fam, gemm, rpe, n, k, best, us):
    s = Schedule.from_id(best)
    return tune.Point(dep, fam, gemm, f"s{rpe}", rpe, n, k, s, us, s, us * 1.1, {best: us}, [])


def test_profile_from_points_round_trip(tmp_path):
    pts = [
        _pt("ep8-decode", "indexed", "gate_up", 1.0, 4096, 7168, "idx-m8n256k64-w4-s8-c1", 200.0),
        _pt("ep8-decode", "indexed", "down", 1.0, 7168, 2048, "idx-m8n128k64-w4-s6-c2", 100.0),
        _pt("ep8-decode", "indexed", "gate_up", 16.0, 4096, 7168, "idx-m16n256k64-w4-s6-c1", 230.0),
        _pt("ep8-decode", "indexed", "down", 16.0, 7168, 2048, "idx-m16n128k64-w4-s6-c2", 120.0),
    ]
    prof = tune.profile_from_points(pts, "h200", gpu="h200", note="test")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    p = load_profile_file(str(path)).profile("ep8-decode")
    assert select(p, Problem("indexed", 48, 4096, 7168, rows=48)).id == "idx-m8n256k64-w4-s8-c1"
    assert select(p, Problem("indexed", 48, 7168, 2048, rows=48)).id == "idx-m8n128k64-w4-s6-c2"
    assert select(p, Problem("indexed", 48, 4096, 7168, rows=48 * 12)).block_m == 16
    # json of points reads back
    jp = tmp_path / "tuning.json"
    jp.write_text(json.dumps([dict(vars(x), best=x.best.id, default=x.default.id) for x in pts]))
    again = tune.points_from_json(jp)
    assert [x.best for x in again] == [x.best for x in pts]


def test_committed_profile_is_loadable_and_complete():
    pf = load_profile_file("h200")
    for dep in ("ep8-decode", "ep8-prefill", "tp8"):
        prof = pf.profile(dep)
        for fam, rules in prof.rules.items():
            assert rules[-1].max_rows_per_expert == float("inf")
    assert all(s.smem_bytes <= 227 * 1024 for s in pf.all_schedules())


def test_pick_best_prefers_the_larger_token_tile_within_the_tie_tolerance():
    from chord.lab.tune import TIE_TOL, pick_best

    a, b = "idx-m128n128k64-w8-s4-c2-wgmma-r8", "idx-m256n128k64-w8-s4-c1-wgmma"
    assert pick_best({a: 100.0, b: 100.0 * (1 + TIE_TOL / 2)}) == b
    assert pick_best({a: 100.0, b: 100.0 * (1 + 2 * TIE_TOL)}) == a
    c = "idx-m256n128k64-w8-s5-c1-wgmma"
    assert pick_best({a: 100.0, b: 101.0, c: 100.5}) == c  # same block_m: the faster of the two
    with pytest.raises(ValueError, match="no timings"):
        pick_best({})


def test_short_k_candidates_walk_several_n_blocks():
    """TP8 down (K = 256: 4 K blocks): every one-tile candidate also comes with n_tiles 2 and 4;
    long K (gate_up) gets none."""
    short = tune.candidates("indexed", 7168, 5.3, k=256)
    long = tune.candidates("indexed", 512, 5.3, k=7168)
    assert {s.n_tiles for s in short} == {1, 2, 4} and {s.n_tiles for s in long} == {1}
    assert {s.split_k for s in long} == {1} and {s.split_k for s in short} == {1}
    ones = {s for s in short if s.n_tiles == 1}
    assert ones == set(tune.candidates("indexed", 7168, 5.3))
    for s in short:
        assert s.split_k == 1 or s.n_tiles == 1
        assert s.smem_bytes * s.ctas_per_sm <= 227 * 1024
    assert {s.n_tiles for s in tune.candidates("indexed", 7168, 85.0, k=256) if s.mainloop == "wgmma"} == {1, 2, 4}


def test_time_layouts_refuses_bad_points_before_any_work():
    """Names and counts are checked before weights are packed (no GPU needed to get the error)."""
    from chord.lab.tune import LAYOUT_GEMMS, time_layouts

    with pytest.raises(ValueError, match="gemm must be 'gate_up' or 'down', got 'gateup'"):
        time_layouts([("tp8-m64", "indexed", "gateup")])
    with pytest.raises(ValueError, match="runs families"):
        time_layouts([("tp8-m64", "grouped_masked", "gate_up")])
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        time_layouts(LAYOUT_GEMMS, repeats=0)
    with pytest.raises(ValueError, match="rep_ms must be a positive number"):
        time_layouts(LAYOUT_GEMMS, rep_ms=0)
    with pytest.raises(ValueError, match="warmup_ms must be a non-negative number"):
        time_layouts(LAYOUT_GEMMS, warmup_ms=-1)


def test_host_time_refuses_a_bad_call_count():
    from chord.lab.bench.timing import host_time

    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="^host_time: calls must be an int >= 1"):
            host_time(lambda: None, calls=bad)


def test_timing_arguments_are_checked_before_any_gpu_work():
    from chord.lab.tune import WARMUP_MS, time_schedules, tune_suite

    assert WARMUP_MS >= 50  # long enough for a compute-bound GEMM to leave its cold clock
    with pytest.raises(ValueError, match="time_schedules: warmup_ms must be a non-negative number"):
        time_schedules("ep8-decode-tok1", "indexed", "gate_up", ["idx-m8n256k64-w4-s8-c1"], warmup_ms=-5)
    with pytest.raises(ValueError, match="time_schedules: rep_ms must be a positive number"):
        time_schedules("ep8-decode-tok1", "indexed", "gate_up", ["idx-m8n256k64-w4-s8-c1"], rep_ms=True)
    with pytest.raises(ValueError, match="tune_suite: warmup_ms"):
        tune_suite(None, "ep8-decode-tok1", warmup_ms=float("nan"))
    with pytest.raises(ValueError, match="rep_ms must be a positive number"):
        time_schedules("ep8-decode-tok1", "indexed", "gate_up", ["idx-m8n256k64-w4-s8-c1"], rep_ms=float("inf"))


def test_fold_candidates_are_the_8_token_mma_tiles():
    c = tune.candidates("indexed", 4096, 1.0)
    folded = [s for s in c if s.fold]
    assert folded and all(s.mainloop == "mma" and s.block_m == 8 and s.swap == 1 for s in folded)
    assert {dataclasses.replace(s, fold=0) for s in folded} <= set(c)  # each next to its unfolded twin
    assert not any(s.fold for s in tune.candidates("indexed", 7168, 512))

