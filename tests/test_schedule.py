"""Schedule ids, profile loading and the selection policy (pure host code)."""
import json

import pytest

from chord import jit
from chord.schedule import (FAMILIES, Problem, Schedule, default_deployment, explain, load_profile,
                            load_profile_file, schedule_table, select)


def test_schedule_id_round_trip():
    s = Schedule("indexed", 16, 128, 4, 6, 2)
    assert s.id == "idx-m16n128k64-w4-s6-c2"
    assert Schedule.from_id(s.id) == s
    for fam in FAMILIES:
        t = Schedule(fam, 64, 256, 8, 3, 1)
        assert Schedule.from_id(t.id) == t


@pytest.mark.parametrize("kw,msg", [
    (dict(block_m=12), "block_m"), (dict(block_m=256), "block_m"), (dict(warps=3), "warps"),
    (dict(block_n=72), "block_n"), (dict(stages=1), "stages"), (dict(ctas_per_sm=9), "ctas_per_sm"),
    (dict(family="dense"), "family"), (dict(block_m=128, block_n=1024, stages=12), "shared memory"),
])
def test_schedule_rejects_bad_knobs(kw, msg):
    args = dict(family="indexed", block_m=16, block_n=128, warps=4, stages=4, ctas_per_sm=1)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        Schedule(**args)


def test_split_k_id_round_trip():
    s = Schedule("indexed", 8, 64, 4, 8, 1, 4)
    assert s.id == "idx-m8n64k64-w4-s8-c1-sk4" and Schedule.from_id(s.id) == s
    assert Schedule("indexed", 8, 64).id.endswith("-c1")  # no suffix without split-K
    with pytest.raises(ValueError, match="split_k"):
        Schedule("indexed", 8, 64, 4, 8, 1, 5)


def test_bad_id_is_rejected():
    with pytest.raises(ValueError, match="schedule id"):
        Schedule.from_id("idx-m16n128")


def test_smem_matches_kernel_formula():
    s = Schedule("indexed", 64, 128, 4, 4, 1)
    # 4 stages x (8 tiles x 512 B weights + 8 x 64 B scales + 64 rows x 128 B activations)
    assert s.smem_bytes == 4 * (8 * 512 + 8 * 64 + 64 * 128)


def test_profile_has_every_deployment_and_family():
    pf = load_profile_file("h200")
    assert set(pf.deployments) == {"ep8-decode", "ep8-prefill", "tp8", "ep16-decode", "ep16-prefill", "ep32-decode",
                                   "ep32-prefill"}
    assert set(pf.profile("ep8-decode").rules) >= {"indexed", "grouped_masked"}
    assert set(pf.profile("ep8-prefill").rules) >= {"indexed", "grouped_contiguous"}
    assert "indexed" in pf.profile("tp8").rules
    assert len(pf.all_schedules()) >= 8


@pytest.mark.parametrize("tok_e,bm,loop", [(1, 8, "mma"), (4, 8, "mma"), (12, 16, "mma"), (32, 32, "wgmma"),
                                          (64, 64, "wgmma"), (128, 128, "wgmma"), (256, 256, "wgmma"), (512, 256, "wgmma")])
def test_block_m_follows_rows_per_expert(tok_e, bm, loop):
    p = Problem("indexed", 48, 4096, 7168, rows=48 * tok_e, top_k=8)
    dep = "ep8-decode" if tok_e <= 32 else "ep8-prefill"
    s = select(f"h200:{dep}", p)
    assert (s.block_m, s.mainloop) == (bm, loop)


def test_k_bounded_rules_give_down_its_own_schedule(tmp_path):
    prof = {"gpu": "t", "deployments": {"d": {"families": {"indexed": [
        {"max_rows_per_expert": 8, "k_max": 2048, "block_m": 8, "block_n": 64, "warps": 4, "stages": 6},
        {"max_rows_per_expert": 8, "block_m": 8, "block_n": 256, "warps": 4, "stages": 8},
        {"max_rows_per_expert": None, "block_m": 64, "block_n": 128, "warps": 4, "stages": 4}]}}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(prof))
    p = load_profile_file(str(path)).profile("d")
    down = select(p, Problem("indexed", 48, 7168, 2048, rows=48))
    gate = select(p, Problem("indexed", 48, 4096, 7168, rows=48))
    assert (down.block_n, down.stages) == (64, 6) and (gate.block_n, gate.stages) == (256, 8)
    assert [r[2].block_n for r in schedule_table(p, "indexed", 48, 7168, 2048)] == [64, 128]
    assert [r[2].block_n for r in schedule_table(p, "indexed", 48, 4096, 7168)] == [256, 128]
    bad = dict(prof)
    bad["deployments"] = {"d": {"families": {"indexed": prof["deployments"]["d"]["families"]["indexed"][:2]}}}
    path2 = tmp_path / "bad2.json"
    path2.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="unconditional"):
        load_profile_file(str(path2))


def test_block_n_fits_n():
    # TP8 down has N = 7168 = 56 * 128; gate_up N = 512
    for n in (512, 7168, 4096, 2048, 256):
        s = select("h200:tp8", Problem("indexed", 384, n, 7168, rows=8, top_k=8))
        assert n % s.block_n == 0


def test_selection_is_memoized_and_explained():
    p = Problem("grouped_masked", 48, 4096, 7168, rows=48 * 4)
    d = explain("h200:ep8-decode", p)
    assert d.schedule is select("h200:ep8-decode", p)
    assert "rows/expert" in d.reason and d.schedule.id in d.reason
    assert d.schedule in d.candidates


def test_schedule_table_covers_all_rows():
    rows = schedule_table("h200:ep8-prefill", "indexed", 48, 4096, 7168)
    assert rows[0][0] == 0 and rows[-1][1] == 2**31 - 1
    for (lo, hi, _), (lo2, _, _) in zip(rows, rows[1:]):
        assert hi == lo2 and lo < hi
    # the table agrees with select() inside each band
    for lo, hi, s in rows:
        r = min(hi, 10**6)
        assert select("h200:ep8-prefill", Problem("indexed", 48, 4096, 7168, rows=r)).block_m == s.block_m


def test_default_deployment():
    assert default_deployment(384, 512, 7168) == "tp8"
    assert default_deployment(48, 4096, 7168) == "ep8-prefill"
    assert default_deployment(48, 4096, 7168, decode=True) == "ep8-decode"


def test_profile_errors(tmp_path):
    with pytest.raises(ValueError, match="deployment"):
        load_profile("h200:ep4")
    with pytest.raises(ValueError, match="not found"):
        load_profile("nosuchgpu:tp8")
    with pytest.raises(TypeError, match="profile"):
        load_profile(3)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpu": "x", "deployments": {"d": {"families": {"indexed": [
        {"max_rows_per_expert": 8, "block_m": 8, "block_n": 128}]}}}}))
    with pytest.raises(ValueError, match="null"):
        load_profile_file(str(bad))


@pytest.mark.parametrize("field,val", [("num_experts", 0), ("n", -1), ("k", 0), ("rows", -1), ("family", "x")])
def test_problem_validation(field, val):
    kw = dict(family="indexed", num_experts=48, n=4096, k=7168, rows=8)
    kw[field] = val
    with pytest.raises(ValueError):
        Problem(**kw)


# ---- the knob table (one definition per knob) and the wgmma main loop -------------------------


def test_every_knob_round_trips_through_the_id():
    from chord.schedule import KNOBS

    s = Schedule("indexed", 128, 256, 16, 5, 1, split_k=2, mainloop="wgmma", wgmma_wait=0, raster=8)
    assert s.id == "idx-m128n256k64-w16-s5-c1-sk2-wgmma-wait0-r8"
    assert Schedule.from_id(s.id) == s
    assert set(s.knobs()) == {k.name for k in KNOBS}
    for k in KNOBS:  # optional knobs at their default leave no trace in the id (old ids still parse)
        if not k.always:
            assert f"-{k.token}{k.default}" not in Schedule("indexed", 16, 128).id


@pytest.mark.parametrize("kw, word", [
    (dict(warps=16), "warps must be one of \\[8, 4\\]"),
    (dict(block_n=96, warps=6), "block_n must be a multiple of 64 in \\[64, 512\\]"),
    (dict(block_n=576, warps=8), "block_n must be a multiple of 64"),
    (dict(block_n=320, warps=5), "block_n=320 has no wgmma warp layout"),
    (dict(block_n=512, warps=4), "warps must be one of \\[16, 8\\]"),
    (dict(block_m=192, block_n=256, warps=8, group_steps=4), "group_steps=4 needs about 192 accumulator"),
    (dict(block_m=64, block_n=512, warps=8, group_steps=3), "group_steps must be one of"),
    (dict(stages=2), "stages must be >= 3"),
    (dict(block_m=256, block_n=256, warps=16), "register"),
    (dict(block_m=264), "block_m"),
    (dict(raster=3), "raster"),
])
def test_wgmma_schedule_rejects_bad_knobs(kw, word):
    args = dict(family="indexed", block_m=64, block_n=128, warps=8, stages=4, mainloop="wgmma")
    args.update(kw)
    with pytest.raises(ValueError, match=word):
        Schedule(**args)


def test_wide_warp_tiles():
    """2 or 4 weight tiles per warp: warps = block_n / 16 / ntw, whole warpgroups, and the register
    estimate counts ntw x block_m/2 accumulators and two sets of group_steps x ntw A fragments."""
    s = Schedule("indexed", 32, 512, 8, 8, 1, mainloop="wgmma", group_steps=1)
    assert s.ntw == 4 and s.threads == 256 and s.id == "idx-m32n512k64-w8-s8-c1-wgmma-gs1"
    assert Schedule.from_id(s.id) == s
    assert Schedule.from_id("idx-m192n256k64-w8-s4-c1-wgmma-gs1-r8").ntw == 2
    assert Schedule("indexed", 64, 128, 8, 4, 1, mainloop="wgmma").ntw == 1  # one tile per warp, the default
    assert Schedule.from_id("idx-m32n256k64-w4-s8-c2-wgmma-gs2").threads == 128
    # stage: 32 token rows + 32 weight tiles (512 B of words + 64 B of scales each), 1024-aligned
    assert s.smem_bytes == 8 * -(-(32 * 128 + 32 * 576) // 1024) * 1024 + 1008
    # a profile rule's wide tile keeps its tiles per warp when N takes a narrower block_n
    from chord.schedule import _fit_schedule
    fit = _fit_schedule("indexed", dict(block_m=32, block_n=512, warps=8, stages=8, mainloop="wgmma",
                                        group_steps=1), 256)
    assert (fit.block_n, fit.warps, fit.ntw) == (128, 4, 2)
    # a wgmma producer rule keeps its producer where the N block takes one, and where its narrower
    # fit has too few consumer warps to take the producer's registers runs the multistage twin
    ws = dict(block_m=64, block_n=512, warps=8, stages=4, mainloop="wgmma", group_steps=2, raster=8, producer=1)
    assert _fit_schedule("indexed", ws, 7168).id == "idx-m64n512k64-w8-s4-c1-wgmma-ws1-gs2-r8"
    narrow = _fit_schedule("indexed", ws, 256)
    assert (narrow.block_n, narrow.warps, narrow.producer) == (128, 4, 0)
    with pytest.raises(ValueError, match="no registers to hand over"):
        Schedule("indexed", 64, 128, 4, 4, 1, mainloop="wgmma", group_steps=2, producer=1)
    with pytest.raises(ValueError, match="group_steps applies to mainloop wgmma only"):
        Schedule("indexed", 16, 128, 4, 4, 1, group_steps=2)


def test_mma_schedule_rejects_wgmma_only_knobs():
    with pytest.raises(ValueError, match="wgmma_wait"):
        Schedule("indexed", 16, 128, 4, 4, 1, wgmma_wait=0)
    with pytest.raises(ValueError, match="mainloop"):
        Schedule("indexed", 16, 128, mainloop="hgmma")
    with pytest.raises(ValueError, match="unknown part"):
        Schedule.from_id("idx-m16n128k64-w4-s4-c1-zz9")


def test_wgmma_smem_formula():
    s = Schedule("indexed", 128, 256, 16, 4, 1, mainloop="wgmma")
    stage = -(-(128 * 128 + 16 * 512 + 16 * 64) // 1024) * 1024
    assert s.smem_bytes == max(4 * stage, 128 * 264 * 2) + 1008


def test_n_tiles_knob():
    s = Schedule("indexed", 8, 128, 4, 6, 1, n_tiles=4)
    assert s.id == "idx-m8n128k64-w4-s6-c1-nt4" and Schedule.from_id(s.id) == s
    assert s.block_n_cta == 512 and s.grid_n(7168) == 14
    # several tiles per CTA: the ring and the epilogue tile side by side (one tile: the larger)
    ring = 6 * (8 * 128 + 8 * 512 + 8 * 64)
    assert s.smem_bytes == ring + 8 * 136 * 2
    assert Schedule("indexed", 8, 128, 4, 6, 1).smem_bytes == max(ring, 8 * 136 * 2)
    wg = Schedule("indexed", 128, 128, 8, 3, 2, mainloop="wgmma", n_tiles=2)
    stage = -(-(128 * 128 + 8 * 512 + 8 * 64) // 1024) * 1024
    assert wg.smem_bytes == 3 * stage + 128 * 136 * 2 + 1008
    with pytest.raises(ValueError, match="n_tiles=2 needs split_k=1"):
        Schedule("indexed", 8, 64, 4, 8, 1, split_k=4, n_tiles=2)
    with pytest.raises(ValueError, match="n_tiles=2 needs split_k=1 and producer=0"):
        Schedule("indexed", 64, 128, 8, 4, 1, mainloop="wgmma", producer=1, n_tiles=2)
    with pytest.raises(ValueError, match="n_tiles must be one of"):
        Schedule("indexed", 8, 128, 4, 6, 1, n_tiles=3)


def test_n_tiles_is_fitted_to_n():
    from chord.schedule import _fit_schedule

    knobs = dict(block_m=8, block_n=128, warps=4, stages=6, n_tiles=4)
    assert _fit_schedule("indexed", knobs, 7168).n_tiles == 4   # 56 N blocks
    assert _fit_schedule("indexed", knobs, 384).n_tiles == 1    # 3 N blocks
    assert _fit_schedule("indexed", knobs, 768).n_tiles == 2    # 6 N blocks
    wg = dict(block_m=128, block_n=128, warps=8, stages=3, mainloop="wgmma", n_tiles=4)
    assert _fit_schedule("indexed", wg, 512).n_tiles == 4


def test_profile_rules_carry_every_knob(tmp_path, monkeypatch):
    import json

    from chord.schedule import load_profile_file

    data = {"gpu": "t", "deployments": {"ep8-prefill": {"families": {"indexed": [
        {"max_rows_per_expert": 32, "block_m": 32, "block_n": 128},
        {"max_rows_per_expert": None, "block_m": 128, "block_n": 256, "mainloop": "wgmma", "stages": 5, "raster": 8},
    ]}}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    prof = load_profile_file(str(path)).profile("ep8-prefill")
    big = select(prof, Problem("indexed", 48, 4096, 7168, 48 * 256, 8))
    assert big.id == "idx-m128n256k64-w16-s5-c1-wgmma-r8"
    narrow = select(prof, Problem("indexed", 48, 192, 7168, 48 * 256, 8))  # block_n fitted to N=192
    assert (narrow.block_n, narrow.warps, narrow.mainloop) == (64, 4, "wgmma")


# ---- profile files: every problem is named with the file -------------------------------------


@pytest.mark.parametrize("text, word", [
    ("{not json", "not valid JSON"),
    ('{"gpu": "t"}', "deployments"),
    ('{"gpu": "t", "deployments": {"d": {}}}', "families"),
    ('{"gpu": "t", "deployments": {"d": {"families": {"dense": [{"max_rows_per_expert": null, "block_m": 8}]}}}}',
     "family must be one of"),
    ('{"gpu": "t", "deployments": {"d": {"families": {"indexed": [{"block_m": 8}]}}}}', "max_rows_per_expert"),
    ('{"gpu": "t", "deployments": {"d": {"families": {"indexed": [{"max_rows_per_expert": null, "block_m": 8, '
     '"blocks": 3}]}}}}', "unknown rule fields"),
    ('{"gpu": "t", "deployments": {"d": {"families": {"indexed": [{"max_rows_per_expert": null, "block_m": 12}]}}}}',
     "rule 0: block_m"),
    ('{"gpu": "t", "deployments": {"d": {"families": {"indexed": [{"max_rows_per_expert": 4, "block_m": 8}]}}}}',
     "unconditional"),
])
def test_bad_profile_files_name_the_file(tmp_path, text, word):
    from chord.schedule import load_profile_file

    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_profile_file(str(path))
    assert word in str(err.value) and str(path) in str(err.value)


def test_profile_dir_and_missing_profiles(tmp_path, monkeypatch):
    from chord.schedule import load_profile_file

    load_profile_file.cache_clear()
    monkeypatch.setenv("CHORD_PROFILE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="CHORD_PROFILE_DIR"):
        load_profile_file("h200")
    monkeypatch.delenv("CHORD_PROFILE_DIR")
    with pytest.raises(ValueError, match="does not exist"):
        load_profile_file(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="not found"):
        load_profile_file("no-such-gpu")
    load_profile_file.cache_clear()


def test_bulk_copy_and_cta_pair_knobs():
    s = Schedule.from_id("gcon-m256n128k64-w8-s4-c1-wgmma-r8-bw1-tx1-cn2")
    assert (s.bulk_w, s.tma_x, s.cluster_n) == (1, 1, 2) and Schedule.from_id(s.id) == s
    assert s.smem_bytes == Schedule.from_id("gcon-m256n128k64-w8-s4-c1-wgmma-r8").smem_bytes  # same ring
    assert Schedule.from_id("idx-m24n128k64-w4-s4-c1-r4-cn2").cluster_n == 2  # CTA pairs on the mma loop too
    with pytest.raises(ValueError, match="tma_x=1 needs a grouped family"):
        Schedule.from_id("idx-m64n128k64-w8-s4-c1-wgmma-tx1")
    with pytest.raises(ValueError, match="tma_x=1 needs mainloop wgmma with producer=0 and persistent=0"):
        Schedule.from_id("gcon-m64n128k64-w8-s4-c1-wgmma-ws1-tx1")
    with pytest.raises(ValueError, match="bulk_w=1 needs mainloop wgmma with producer=0 and persistent=0"):
        Schedule.from_id("gcon-m64n128k64-w8-s4-c1-wgmma-r8-nt4-ps1-bw1")
    with pytest.raises(ValueError, match="bulk_w=1 copies whole groups of 8 weight tiles"):
        Schedule.from_id("gmsk-m64n192k64-w12-s4-c1-wgmma-bw1")
    with pytest.raises(ValueError, match="cluster_n=2 pairs the launched grid's CTAs, so it needs persistent=0"):
        Schedule.from_id("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-ps1-cn2")
    with pytest.raises(ValueError, match="cluster_n must be one of 1, 2"):
        Schedule.from_id("idx-m24n128k64-w4-s4-c1-cn4")
    # a profile rule's CTA pairs and bulk weights are dropped where the GEMM's N does not allow them
    from chord.schedule import _fit_schedule
    knobs = dict(block_m=64, block_n=512, warps=8, stages=4, mainloop="wgmma", group_steps=2, cluster_n=2, bulk_w=1)
    assert _fit_schedule("indexed", knobs, 1024).id == "idx-m64n512k64-w8-s4-c1-wgmma-gs2-bw1-cn2"
    assert _fit_schedule("indexed", knobs, 512).id == "idx-m64n512k64-w8-s4-c1-wgmma-gs2-bw1"  # one N block
    assert _fit_schedule("indexed", knobs, 192).id == "idx-m64n64k64-w4-s4-c1-wgmma-gs2"  # 3 blocks of 64


def test_l2_hint_knob():
    s = Schedule.from_id("idx-m96n256k64-w8-s5-c1-wgmma-gs2-r8-l21")
    assert s.l2_hint == 1 and Schedule.from_id(s.id) == s
    assert s.smem_bytes == Schedule.from_id("idx-m96n256k64-w8-s5-c1-wgmma-gs2-r8").smem_bytes  # same ring
    assert Schedule.from_id("gmsk-m48n128k64-w8-s4-c1-wgmma-r4-l22").l2_hint == 2  # every family
    for bad, what in (("idx-m8n128k64-w4-s4-c1-l21", "mainloop=mma"),
                      ("idx-m64n128k64-w8-s4-c1-wgmma-ws1-l21", "producer=1"),
                      ("idx-m64n512k64-w8-s4-c1-wgmma-gs2-r8-bw1-l21", "bulk_w=1"),
                      ("gcon-m256n128k64-w8-s4-c1-wgmma-r8-tx1-l22", "tma_x=1")):
        with pytest.raises(ValueError, match=f"l2_hint=.* needs mainloop wgmma with producer=0, bulk_w=0 and "
                                             f"tma_x=0, got .*{what}"):
            Schedule.from_id(bad)
    with pytest.raises(ValueError, match="l2_hint must be one of 0, 1, 2, got 3"):
        Schedule.from_id("idx-m96n256k64-w8-s5-c1-wgmma-gs2-r8-l23")


def test_bulk_weights_need_the_default_tile_group():
    from chord import jit
    s = Schedule.from_id("gcon-m256n128k64-w8-s4-c1-wgmma-r8-bw1")
    with pytest.raises(jit.JitError, match="bulk_w=1 copies whole groups of 8 weight tiles.*cap 4"):
        jit.build_schedule(s, tile_group_cap=4)  # refused before nvcc runs


def test_tensor_map_arguments_are_checked_before_the_driver():
    from chord import jit
    for args, msg in [((8, 64, 512, 1024, 128, 64), "16-byte aligned"),
                      ((256, 64, 512, 1000, 128, 64), "multiple of 16 bytes"),
                      ((256, 0, 512, 1024, 128, 64), "rows and cols"),
                      ((256, 64, 512, 1024, 512, 64), "box of 512 x 64"),
                      ((256, 64, 512, 1024, 128, 128), "box of 128 x 128")]:
        with pytest.raises(jit.JitError, match=msg):
            jit.encode_tensor_map_2d(*args)


def test_stmatrix_and_persistent_knobs():
    s = Schedule.from_id("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-ps1")
    assert s.persistent == 1 and s.stmatrix == 1 and s.n_tiles == 4
    assert Schedule.from_id("idx-m8n64k64-w4-s8-c1-stm0").stmatrix == 0
    with pytest.raises(ValueError, match="stmatrix applies to unsplit tiles only"):
        Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk4-stm0")
    with pytest.raises(ValueError, match="stmatrix applies to the swapped layout only"):
        Schedule.from_id("idx-m16n64k64-w4-s8-c1-swap0-stm0")
    with pytest.raises(ValueError, match="persistent=1 needs mainloop wgmma with producer=0 and split_k=1"):
        Schedule.from_id("idx-m64n128k64-w8-s4-c1-wgmma-ws1-ps1")
    # three row buffers of static shared memory count against the CTA's limit
    assert s.static_smem_bytes == 16 * 96 * 3 + 256


def test_queue_knob():
    s = Schedule.from_id("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-ps1-dq1")
    assert s.queue == 1 and s.persistent == 1 and Schedule.from_id(s.id) == s
    assert Schedule.from_id("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-ps1").queue == 0  # the static walk by default
    with pytest.raises(ValueError, match="queue=1 hands persistent CTAs their items, so it needs persistent=1"):
        Schedule.from_id("idx-m64n128k64-w8-s4-c1-wgmma-dq1")
    with pytest.raises(ValueError, match="queue must be one of 0, 1"):
        Schedule("indexed", 64, 128, 8, 4, 1, mainloop="wgmma", persistent=1, queue=2)


def test_stream_k_knob():
    s = Schedule.from_id("idx-m8n64k64-w4-s8-c1-stk1-pd1")
    assert s.stream_k == 1 and s.pdl == 1 and s.id == "idx-m8n64k64-w4-s8-c1-pd1-stk1"
    assert Schedule.from_id(s.id) == s
    # the ring and the epilogue tile both (the ring keeps loading while a segment is stored), and
    # two token blocks' output rows of static shared memory
    plain = Schedule.from_id("idx-m8n64k64-w4-s8-c1")
    assert s.smem_bytes == plain.smem_bytes + 8 * (64 + 8) * 2
    assert s.static_smem_bytes == 16 * 8 * 2 + 256
    for bad, what in (("gmsk-m8n64k64-w4-s8-c1-stk1", "family=grouped_masked"),
                      ("gcon-m8n64k64-w4-s8-c1-stk1", "family=grouped_contiguous"),
                      ("idx-m64n128k64-w8-s4-c1-wgmma-stk1", "mainloop=wgmma"),
                      ("idx-m8n64k64-w4-s8-c1-sk8-stk1", "split_k=8"),
                      ("idx-m8n64k64-w4-s8-c1-nt2-stk1", "n_tiles=2"),
                      ("idx-m8n64k64-w4-s8-c1-r4-stk1", "raster=4"),
                      ("idx-m8n64k64-w4-s8-c1-cn2-stk1", "cluster_n=2")):
        with pytest.raises(ValueError, match=f"stream_k=1 needs the indexed family.*{what}"):
            Schedule.from_id(bad)
    assert Schedule.from_id("idx-m16n64k64-w4-s8-c1-swap0-stk1").swap == 0  # the swap's ablation applies
    on, off = jit.render(s), jit.render(Schedule.from_id("idx-m8n64k64-w4-s8-c1-pd1"))
    assert "static constexpr bool kStreamK = true;" in on and "static constexpr bool kStreamK = false;" in off
    assert "static constexpr bool kPdl = true;" in on and "static constexpr bool kPdl = true;" in off


def test_fold_knob_id_and_refusals():
    """fold (folded group scales) belongs to the mma loop with the operand swap; named when misused."""
    s = Schedule.from_id("idx-m8n256k64-w4-s8-c1-fo1")
    assert s.fold == 1 and s.id == "idx-m8n256k64-w4-s8-c1-fo1"
    assert Schedule.from_id("idx-m8n256k64-w4-s8-c1").fold == 0  # off leaves no trace in the id
    assert Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk8-fo1").split_k == 8
    with pytest.raises(ValueError, match="fold=1 needs mainloop mma"):
        Schedule("indexed", 16, 128, 8, 4, 1, mainloop="wgmma", fold=1)
    with pytest.raises(ValueError, match="fold=1 needs mainloop mma with the operand swap"):
        Schedule("indexed", 16, 128, 4, 4, 1, swap=0, fold=1)
    with pytest.raises(ValueError, match="fold must be one of 0, 1"):
        Schedule("indexed", 8, 128, 4, 4, 1, fold=2)
