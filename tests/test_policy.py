"""The selection policy: the tuned profile or the heuristic's rules alone (chord.schedule), one
decision whoever calls, and each heuristic rule switched off on its own."""
import pytest

from chord.lab.bench.suite import load_suite
from chord.schedule import (POLICY_RULES, Policy, Problem, Schedule, current_policy, explain, parse_policy,
                            profile_for, schedule_table, select)

POINTS = [(sc, fam, gemm) for sc in load_suite().scenarios for fam in sc.families for gemm in ("gate_up", "down")]


def _prob(sc, family, gemm):
    n, k, top_k = (sc.n_gate_up, sc.k_gate_up, sc.top_k) if gemm == "gate_up" else (sc.n_down, sc.k_down, 1)
    return profile_for(family, sc.experts, n, k), Problem(family, sc.experts, n, k, sc.rows,
                                                          top_k if family == "indexed" else 1)


def test_parse_policy():
    assert parse_policy("profile") == Policy()
    p = parse_policy("heuristic, -wave_aware_bn,-split_k_gate")
    assert p.source == "heuristic" and p.off == {"wave_aware_bn", "split_k_gate"}
    assert p.name == "heuristic,-split_k_gate,-wave_aware_bn" and parse_policy(p.name) == p
    for bad, match in (("fast", "'profile', 'heuristic' or 'batch_invariant'"), ("heuristic,-nope", "unknown rules"),
                       ("heuristic,wave_aware_bn", "as '-<rule>'"), ("profile,-wave_aware_bn", "only under")):
        with pytest.raises(ValueError, match=match):
            parse_policy(bad)
    with pytest.raises(TypeError, match="policy must be"):
        parse_policy(3)


def test_env_policy(monkeypatch):
    monkeypatch.setenv("CHORD_POLICY", "heuristic,-split_k_gate")
    assert current_policy().off == {"split_k_gate"}
    monkeypatch.setenv("CHORD_POLICY", "bogus")
    with pytest.raises(ValueError, match="CHORD_POLICY='bogus'"):
        current_policy()


@pytest.mark.parametrize("sc, family, gemm", POINTS, ids=lambda v: getattr(v, "id", v))
def test_heuristic_gives_a_valid_reasoned_schedule(sc, family, gemm):
    prof, prob = _prob(sc, family, gemm)
    d = explain(prof, prob, "heuristic")
    assert isinstance(d.schedule, Schedule) and d.schedule.family == family
    assert prob.n % d.schedule.block_n_cta == 0
    assert d.profile.endswith(":heuristic") and "tok_e_block_m" in d.reason and d.schedule.id in d.reason
    # each rule off changes only what it decides
    bm_off = select(prof, prob, "heuristic,-tok_e_block_m")
    assert bm_off.block_m == (128 if bm_off.mainloop == "wgmma" else 16)
    wb_off = select(prof, prob, "heuristic,-wave_aware_bn,-decode_stream_tile")
    assert wb_off.block_n <= 128 or wb_off.ntw > 1  # a wide warp tile is not the wave rule's choice
    assert select(prof, prob, "heuristic,-wide_warp_tiles,-wave_aware_bn,-decode_stream_tile").block_n <= 128
    ds = select(prof, prob, "heuristic")
    if ds.mainloop == "mma" and ds.block_m <= 16 and prob.k >= 4096 and prob.n >= 2048:  # decode_stream_tile's
        assert (ds.block_n, ds.stages) == (256, 6)
    assert select(prof, prob, "heuristic,-split_k_fill").split_k in (1, ds.split_k) or ds.split_k == 1
    wide_off = select(prof, prob, "heuristic,-wide_warp_tiles")
    assert wide_off.mainloop == "mma" or wide_off.ntw == 1
    assert select(prof, prob, "heuristic,-split_k_gate").split_k == 1
    assert select(prof, prob, "heuristic,-wgmma_raster").raster == 0
    bk_off = select(prof, prob, "heuristic,-buffered_k,-decode_stream_tile")
    assert bk_off.stages <= (4 if bk_off.mainloop == "mma" and prob.family != "indexed" else 8)
    te_off = explain(prof, prob, "heuristic,-touched_estimate")
    assert "touched_estimate off: min(E, rows)" in te_off.reason and te_off.schedule.family == family


def test_heuristic_rules_on_known_shapes():
    # EP8 decode, 48 rows over 48 experts: uniform routes touch ~31 experts, 8-row tiles, BN 128 (BN 256
    # would be 496 tiles = 2 waves of 264 slots, the last 88 % full); counted as balanced (all 48 touched) BN 256 (768
    # tiles: 3 waves, the last 91 % full)
    p = Problem("indexed", 48, 4096, 7168, 48, 8)
    prof = profile_for("indexed", 48, 4096, 7168)
    s = select(prof, p, "heuristic,-decode_stream_tile")
    assert (s.mainloop, s.block_m, s.block_n) == ("mma", 8, 128)
    assert "~31 touched experts" in explain(prof, p, "heuristic").reason
    s = select(prof, p, "heuristic,-touched_estimate,-decode_stream_tile")
    assert (s.mainloop, s.block_m, s.block_n) == ("mma", 8, 256)
    # with decode_stream_tile on (the default): BN 256 and a 6-stage ring whatever the waves
    s = select(prof, p, "heuristic")
    assert (s.block_n, s.stages, s.split_k) == (256, 6, 1) and "decode_stream_tile" in explain(prof, p, "heuristic").reason
    # EP32 (12 experts) at 2 rows per expert: the 176 tiles fill 2/3 of a wave of 264: split_k_fill splits K in two
    p32 = Problem("indexed", 12, 4096, 7168, 24, 8)
    s = select(profile_for("indexed", 12, 4096, 7168), p32, "heuristic")
    assert (s.block_n, s.split_k) == (256, 2)
    assert select(profile_for("indexed", 12, 4096, 7168), p32, "heuristic,-split_k_fill").split_k == 1
    # the down GEMM (K = 2048) and TP8's gate_up (N = 512) keep the wave-aware tile
    assert select(prof, Problem("indexed", 48, 7168, 2048, 48, 1), "heuristic").stages == 8
    tp = Problem("indexed", 384, 512, 7168, 8, 8)
    assert select(profile_for("indexed", 384, 512, 7168), tp, "heuristic") == \
        select(profile_for("indexed", 384, 512, 7168), tp, "heuristic,-decode_stream_tile")
    # TP8 64 tokens (512 routes over 384 experts, ~283 touched): gate_up BN 128 (BN 256: 566 tiles, 3
    # waves, the last 14 % full); counted as 384 touched experts BN 256 (768 tiles)
    p = Problem("indexed", 384, 512, 7168, 64 * 8, 8)
    prof = profile_for("indexed", 384, 512, 7168)
    assert select(prof, p, "heuristic").block_n == 128
    assert select(prof, p, "heuristic,-touched_estimate").block_n == 256
    # masked decode: buffered-K keeps 512 K elements in flight (8 stages of 64) at 4 and at 32 rows per
    # expert; off: the default ring of 4 stages
    prof = profile_for("grouped_masked", 48, 4096, 7168)
    for rows, pol in ((4, "heuristic,-decode_stream_tile"), (32, "heuristic,-wide_warp_tiles")):
        p = Problem("grouped_masked", 48, 4096, 7168, rows * 48)
        s, off = select(prof, p, pol), select(prof, p, pol + ",-buffered_k")
        assert (s.mainloop, s.stages, off.stages) == ("mma", 8, 4), rows
        assert s.ctas_per_sm * (s.smem_bytes + 1024) <= 228 * 1024
        assert "buffered_k off: a ring of 4 stages" in explain(prof, p, pol + ",-buffered_k").reason
    # the indexed family is not a grouped decode: no buffered-K rule
    p = Problem("indexed", 48, 4096, 7168, 32 * 48, 8)
    assert "buffered_k" not in explain(profile_for("indexed", 48, 4096, 7168), p, "heuristic").reason
    # prefill 64 rows per expert: one wgmma token tile per expert, still raster 8 (off: launch order)
    p = Problem("grouped_contiguous", 48, 4096, 7168, 64 * 48)
    prof = profile_for("grouped_contiguous", 48, 4096, 7168)
    assert (select(prof, p, "heuristic").mainloop, select(prof, p, "heuristic").raster) == ("wgmma", 8)
    assert select(prof, p, "heuristic,-wgmma_raster").raster == 0
    # TP8 one token: 8 experts x 4 N blocks fill 32 of 264 slots -> split-K (stream-K measured
    # slower there, so no rule gives it)
    p = Problem("indexed", 384, 512, 7168, 8, 8)
    s = select(profile_for("indexed", 384, 512, 7168), p, "heuristic")
    assert s.split_k > 1 and s.stream_k == 0 and 8 * (512 // s.block_n) * s.split_k <= 264
    # TP8 m4096 (85 rows per expert): one 96-row wgmma tile per expert
    p = Problem("indexed", 384, 512, 7168, 4096 * 8, 8)
    s = select(profile_for("indexed", 384, 512, 7168), p, "heuristic")
    assert (s.mainloop, s.block_m) == ("wgmma", 96)
    # wide warp tiles: 32 rows per expert (EP8 decode tok32, masked too) -> wgmma, 32 x 512 on 8 warps (4
    # weight tiles per warp, one k16 step per group, a 512-K ring); 64 rows: 64 x 512, two steps per group;
    # 192-row tiles: 2 per warp; short K (TP8 down, 4 K blocks): one per warp; off: mma below 40 rows
    for fam in ("indexed", "grouped_masked"):
        p = Problem(fam, 48, 4096, 7168, 32 * 48, 8 if fam == "indexed" else 1)
        prof = profile_for(fam, 48, 4096, 7168)
        s = select(prof, p, "heuristic")
        assert (s.mainloop, s.block_m, s.block_n, s.warps, s.group_steps, s.stages) == ("wgmma", 32, 512, 8, 1, 8)
        assert "wide_warp_tiles: block_n 512 on 8 warps" in explain(prof, p, "heuristic").reason
        assert select(prof, p, "heuristic,-wide_warp_tiles").mainloop == "mma"
    p = Problem("grouped_contiguous", 48, 4096, 7168, 64 * 48)
    s = select(profile_for("grouped_contiguous", 48, 4096, 7168), p, "heuristic")
    assert (s.block_m, s.block_n, s.ntw, s.group_steps) == (64, 512, 4, 2)
    p = Problem("indexed", 384, 512, 7168, 16384 * 8, 8)
    s = select(profile_for("indexed", 384, 512, 7168), p, "heuristic")
    assert (s.block_m, s.block_n, s.ntw, s.group_steps) == (192, 256, 2, 1)
    p = Problem("indexed", 384, 7168, 256, 16384 * 8, 1)
    s = select(profile_for("indexed", 384, 7168, 256), p, "heuristic")
    assert s.ntw == 1 and "wide_warp_tiles: not at 4 K blocks" in explain(profile_for("indexed", 384, 7168, 256), p,
                                                                           "heuristic").reason
    # prefill 512 rows per expert: two 256-row tiles, BN 128 (a 256x256 wgmma tile has no registers)
    p = Problem("grouped_contiguous", 48, 4096, 7168, 512 * 48)
    s = select(profile_for("grouped_contiguous", 48, 4096, 7168), p, "heuristic")
    assert (s.block_m, s.block_n, s.raster) == (256, 128, 8)


@pytest.mark.parametrize("family, e, n, k", [("indexed", 48, 4096, 7168), ("grouped_masked", 48, 7168, 2048),
                                             ("indexed", 384, 512, 7168), ("indexed", 384, 7168, 256)])
def test_heuristic_table_is_what_select_decides(family, e, n, k):
    prof = profile_for(family, e, n, k)
    table = schedule_table(prof, family, e, n, k, policy="heuristic")
    assert table[0][0] == 0 and table[-1][1] == 2**31 - 1
    assert all(a[1] == b[0] for a, b in zip(table, table[1:]))
    for rows in [1, 2, 7, 8, 9, 47, 48, 95, 383, 384, 385, 1000, 1536, 4095, 4096, 24576, 32768, 131072, 10**6]:
        want = select(prof, Problem(family, e, n, k, rows), "heuristic")
        row = next(t for t in table if t[0] < rows <= t[1])
        assert row[2] == want, rows


def test_heuristic_one_decision_through_the_humming_root(monkeypatch):
    from humming import tune

    monkeypatch.setenv("CHORD_POLICY", "heuristic")
    for sc, family, gemm in POINTS:
        prof, prob = _prob(sc, family, gemm)
        ops = select(prof, prob).id
        vllm = tune.row_for(tune.rows_for(family, sc.experts, prob.n, prob.k), sc.rows)["schedule"]
        assert ops == vllm == select(prof, prob, "heuristic").id, (sc.id, family, gemm, ops, vllm)
    monkeypatch.setenv("CHORD_POLICY", "profile")
    sc, family, gemm = POINTS[0]
    prof, prob = _prob(sc, family, gemm)
    assert tune.row_for(tune.rows_for(family, sc.experts, prob.n, prob.k), sc.rows)["schedule"] == select(prof, prob).id


def test_grouped_tma_pairs_rule():
    # 512 rows per expert, contiguous: the 256-row wgmma tile gets the TMA activation box and CTA pairs
    # (gate_up 32 N blocks, down 56: both even); off: the same tile with the cp.async gather
    for n, k in ((4096, 7168), (7168, 2048)):
        prof = profile_for("grouped_contiguous", 48, n, k)
        p = Problem("grouped_contiguous", 48, n, k, 512 * 48)
        s, off = select(prof, p, "heuristic"), select(prof, p, "heuristic,-grouped_tma_pairs")
        assert (s.block_m, s.tma_x, s.cluster_n) == (256, 1, 2) and (off.tma_x, off.cluster_n) == (0, 1)
        assert s == Schedule.from_id(off.id + "-tx1-cn2")
        assert "grouped_tma_pairs: TMA activation box, CTA pairs (256-row tiles)" in explain(prof, p, "heuristic").reason
    # an odd N-block count: TMA without pairs
    p = Problem("grouped_masked", 8, 384, 1024, 256 * 8)
    s = select(profile_for("grouped_masked", 8, 384, 1024), p, "heuristic")
    assert s.block_m == 256 and s.tma_x == 1 and s.cluster_n == 1 and 384 // s.block_n % 2 == 1
    # smaller tiles and the indexed family (gathered rows) keep the gather
    p = Problem("grouped_contiguous", 48, 4096, 7168, 128 * 48)
    assert select(profile_for("grouped_contiguous", 48, 4096, 7168), p, "heuristic").tma_x == 0
    p = Problem("indexed", 48, 4096, 7168, 512 * 48, 8)
    s = select(profile_for("indexed", 48, 4096, 7168), p, "heuristic")
    assert s.block_m == 256 and (s.tma_x, s.cluster_n) == (0, 1)
    assert "grouped_tma_pairs" not in explain(profile_for("indexed", 48, 4096, 7168), p, "heuristic").reason


def test_rules_table_documents_every_rule():
    assert set(POLICY_RULES) == {"tok_e_block_m", "wave_aware_bn", "split_k_gate", "touched_estimate", "wgmma_raster",
                                  "buffered_k", "wide_warp_tiles", "grouped_tma_pairs", "decode_stream_tile",
                                  "split_k_fill"}
    assert all(" off: " in v for v in POLICY_RULES.values())
