"""The WGMMA main loop (and the tile raster) against the float32 reference, on every family.

Outputs are poisoned with NaN before each launch; rows a kernel must skip are checked to stay
NaN. Bit-exact properties: `wgmma_wait` 1 vs 0 and every `raster` give the same bits as the
same schedule without them (same MMAs in the same order); split-K with wgmma is deterministic.
"""
from __future__ import annotations

import pytest
import torch

from chord import ops, reference, routing
from chord.schedule import Schedule, override
from chord.testing import (BF16_TOL, cached_random_experts, check_indexed_graph_replay, check_rows, poisoned,
                           random_expert_map, rel_err, same_bits)

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

experts = cached_random_experts


WG_TILES = [(8, 64), (16, 128), (32, 256), (64, 128), (64, 256), (128, 128), (128, 256), (192, 128), (256, 128)]


def wg(family, bm, bn, stages=4, **kw):
    return Schedule(family, bm, bn, bn // 16, stages, 1, mainloop="wgmma", **kw)


def run_indexed(s, x, pw, r, top_k, rows):
    out = poisoned(rows, pw.n)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    return out


def valid_tiles(tiles, family):
    """(block_m, block_n, producer) of `tiles` x both producers that are valid schedules (a
    producer warpgroup has registers to hand over only up to BN=192)."""
    out = []
    for bm, bn in tiles:
        for producer in (0, 1):
            try:
                wg(family, bm, bn, producer=producer)
            except ValueError:
                continue
            out.append((bm, bn, producer))
    return out


def tile_id(t):
    return f"m{t[0]}n{t[1]}" + ("-ws" if t[2] else "")


@pytest.mark.parametrize("tile", valid_tiles(WG_TILES, "indexed"), ids=tile_id)
@pytest.mark.parametrize("k", [64, 704, 2048])  # 1, 11 (odd) and 32 K blocks
def test_wgmma_indexed_matches_reference(tile, k):
    bm, bn, producer = tile
    s = wg("indexed", bm, bn, producer=producer)
    e, n, m, top_k = 12, 512, 157, 4
    qe, pw = experts(e, n, k)
    ids = routing.random_topk_ids(m, e, top_k, seed=bm + k, device="cuda")
    r = routing.align_block_size(ids, bm, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = run_indexed(s, x, pw, r, top_k, m * top_k)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    assert rel_err(out, ref) < BF16_TOL
    # down-style call (top_k = 1) on the flat routed rows
    x2 = torch.randn(m * top_k, k, device="cuda").bfloat16()
    out2 = run_indexed(s, x2, pw, r, 1, m * top_k)
    assert rel_err(out2, reference.indexed_gemm_ref(x2, qe, None, r, 1)) < BF16_TOL


def check_contiguous(s, alignment):
    """`s` on a contiguous layout with an empty expert and 7 rows past expert_offsets[E] (must stay NaN)."""
    e, n, k, m, top_k = 24, 1024, 1024, 150, 8
    qe, pw = experts(e, n, k)
    ids = routing.random_topk_ids(m, e - 1, top_k, seed=alignment, device="cuda")
    ids = torch.where(ids >= 5, ids + 1, ids)  # expert 5 gets no rows
    x = torch.randn(m, k, device="cuda").bfloat16()
    lay = routing.contiguous_layout(x, ids, e, alignment=alignment)
    xin = torch.cat([lay.x, torch.randn(7, k, device="cuda").bfloat16()])
    out = poisoned(xin.shape[0], n)
    ops.gemm_contiguous(xin, pw, lay.expert_offsets, out=out, schedule=s)
    rows = int(lay.expert_offsets[-1])
    assert torch.isnan(out[rows:]).all(), "rows past expert_offsets[E] were written"
    ref = reference.contiguous_gemm_ref(xin, qe, None, lay.expert_offsets)
    assert rel_err(out[:rows], ref[:rows]) < BF16_TOL, s.id


def check_masked(s, max_rows):
    """`s` on a masked layout with random counts (one expert empty, one full)."""
    e, n, k = 20, 1024, 768
    qe, pw = experts(e, n, k)
    counts = torch.randint(0, max_rows + 1, (e,), device="cuda", dtype=torch.int32)
    counts[0], counts[1] = 0, max_rows
    x = torch.randn(e, max_rows, k, device="cuda").bfloat16()
    out = poisoned(e, max_rows, n)
    ops.gemm_masked(x, pw, counts, out=out, schedule=s)
    check_rows(out, reference.masked_gemm_ref(x, qe, None, counts), what=f"masked {s.id} max_rows={max_rows}")


@pytest.mark.parametrize("tile", valid_tiles([(16, 128), (128, 128), (256, 128)], "grouped_contiguous"), ids=tile_id)
@pytest.mark.parametrize("alignment", [1, 128])
def test_wgmma_contiguous_matches_reference(tile, alignment):
    bm, bn, producer = tile
    check_contiguous(wg("grouped_contiguous", bm, bn, producer=producer), alignment)


@pytest.mark.parametrize("tile", valid_tiles([(8, 128), (32, 256), (64, 128)], "grouped_masked"), ids=tile_id)
@pytest.mark.parametrize("max_rows", [1, 13, 64])
def test_wgmma_masked_matches_reference(tile, max_rows):
    bm, bn, producer = tile
    check_masked(wg("grouped_masked", bm, bn, producer=producer), max_rows)


@pytest.mark.parametrize("tile", [(64, 128), (128, 256), (256, 128)], ids=lambda t: f"m{t[0]}n{t[1]}")
def test_wgmma_wait0_and_raster_are_bit_identical(tile):
    """Batched wait_group 1 vs 0 and every raster group issue the same MMAs in the same order."""
    bm, bn = tile
    e, n, k, m, top_k = 16, 1024, 1536, 300, 8
    qe, pw = experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=3, device="cuda"), bm, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    base = wg("indexed", bm, bn)
    first = run_indexed(base, x, pw, r, top_k, m * top_k)
    assert rel_err(first, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < BF16_TOL
    variants = [override(base, wgmma_wait=0), override(base, raster=4), override(base, raster=16),
                override(base, stages=3)]
    if bn == 128:  # a producer warpgroup has registers to give only up to BN=192
        variants += [override(base, producer=1), override(base, producer=1, wgmma_wait=0, stages=5)]
    for s in variants:
        assert same_bits(run_indexed(s, x, pw, r, top_k, m * top_k), first), s.id


def test_mma_raster_is_bit_identical():
    e, n, k, m, top_k = 16, 1024, 1024, 200, 8
    qe, pw = experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=4, device="cuda"), 64, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    base = Schedule("indexed", 64, 128, 4, 4, 1)
    first = run_indexed(base, x, pw, r, top_k, m * top_k)
    assert rel_err(first, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < BF16_TOL
    assert same_bits(run_indexed(override(base, raster=8), x, pw, r, top_k, m * top_k), first)


@pytest.mark.parametrize("producer", [0, 1], ids=["multistage", "ws"])
@pytest.mark.parametrize("split", [2, 4])
def test_wgmma_split_k_deterministic(split, producer):
    e, n, k, m, top_k = 32, 512, 7168, 9, 8
    qe, pw = experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=split, device="cuda"), 16, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    s = wg("indexed", 16, 128, split_k=split, producer=producer)
    first = run_indexed(s, x, pw, r, top_k, m * top_k)
    assert rel_err(first, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < BF16_TOL
    assert same_bits(run_indexed(s, x, pw, r, top_k, m * top_k), first), "split-K is not deterministic"


def test_wgmma_overallocated_and_skip_blocks():
    e_global, e_local, n, k, m, top_k = 32, 16, 512, 1024, 77, 6
    qe, pw = experts(e_local, n, k)
    ids = routing.random_topk_ids(m, e_global, top_k, seed=3, device="cuda")
    emap = random_expert_map(e_global, e_local)
    bm = 64
    cap = routing.sorted_ids_capacity(m * top_k, bm, e_global) + bm * 10
    r = routing.align_block_size(ids, bm, e_global, expert_map=emap, max_num_tokens_padded=cap)
    assert (r.expert_ids == -1).any()
    used = int(r.num_tokens_post_padded[0])
    r.sorted_ids[used:] = 0
    r.expert_ids[(used + bm - 1) // bm:] = 0
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = run_indexed(wg("indexed", bm, 128, raster=8, producer=1), x, pw, r, top_k, m * top_k)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    written = ~torch.isnan(ref[:, 0])
    assert torch.equal(~torch.isnan(out[:, 0]), written), "kernel wrote rows it must skip, or missed rows"
    assert rel_err(out[written], ref[written]) < BF16_TOL


def test_wgmma_kimi_ep8_prefill_shapes():
    """EP8 gate_up and down at 256 rows/expert, the tiles the profile uses for prefill."""
    for (n, k) in ((4096, 7168), (7168, 2048)):
        e, tok_e = 48, 256
        qe, pw = experts(e, n, k, seed=n)
        m = tok_e * e // 8
        ids = routing.balanced_topk_ids(m, e, 8, tok_e, seed=2).cuda()
        x = torch.randn(m, k, device="cuda").bfloat16()
        lay = routing.contiguous_layout(x, ids, e)
        out = poisoned(lay.x.shape[0], n)
        s = wg("grouped_contiguous", 256, 128, producer=1, raster=8)
        ops.gemm_contiguous(lay.x, pw, lay.expert_offsets, out=out, schedule=s)
        # the reference on a sample of experts (the full float32 product is large)
        ref = reference.contiguous_gemm_ref(lay.x, qe, None, lay.expert_offsets)
        assert rel_err(out, ref) < BF16_TOL


@pytest.mark.parametrize("producer", [0, 1], ids=["multistage", "ws"])
def test_wgmma_cuda_graph_replay_with_new_routing(producer):
    check_indexed_graph_replay(wg("indexed", 64, 128, producer=producer), e=16, n=512, k=1024, m=40, top_k=4)

# Wide warp tiles: 2 or 4 16-feature weight tiles per warp (block_n / 16 / warps), with one, two or
# four k16 steps per wgmma group (group_steps). The ids the profile and the heuristic use, plus the
# extremes: 4 warps x 4 tiles, the 192-row tile at 255 registers, the producer warpgroup.
WIDE = ["idx-m32n512k64-w8-s8-c1-wgmma-gs1", "idx-m32n512k64-w8-s8-c1-wgmma-gs2", "idx-m32n256k64-w4-s8-c2-wgmma-gs2",
        "idx-m64n512k64-w8-s5-c1-wgmma-gs2", "idx-m128n256k64-w8-s5-c1-wgmma-gs2", "idx-m176n256k64-w8-s5-c1-wgmma-gs2",
        "idx-m192n256k64-w8-s5-c1-wgmma-gs1", "idx-m16n128k64-w4-s8-c1-wgmma", "idx-m64n256k64-w8-s5-c1-wgmma-ws1-gs1"]


def wide(family, sid, **kw):
    """The WIDE schedule `sid` for `family`, with `kw` knobs changed."""
    return override(Schedule.from_id(sid), family=family, **kw)


def test_wide_ids_are_wide():
    for sid in WIDE:
        s = wide("indexed", sid)
        assert s.ntw > 1, sid
        assert Schedule.from_id(s.id) == s


@pytest.mark.parametrize("sid", WIDE)
@pytest.mark.parametrize("k", [64, 704, 2048])  # 1, 11 (odd) and 32 K blocks
def test_wide_tiles_indexed_match_reference(sid, k):
    check_indexed(wide("indexed", sid), 512, k)


def check_indexed(s, n, k, e=12, m=157, top_k=4):
    """`s` on random routing (seeded by K) against the float32 reference; returns its output and
    a function that runs another schedule on the same inputs."""
    qe, pw = experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=k, device="cuda"), s.block_m, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = run_indexed(s, x, pw, r, top_k, m * top_k)
    assert rel_err(out, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < BF16_TOL, s.id
    return out, lambda other: run_indexed(other, x, pw, r, top_k, m * top_k)


@pytest.mark.parametrize("sid", [WIDE[0], WIDE[3], WIDE[6], WIDE[8]])
def test_wide_tiles_contiguous_match_reference(sid):
    check_contiguous(wide("grouped_contiguous", sid, raster=8), 1)


@pytest.mark.parametrize("sid", [WIDE[0], WIDE[2]])
@pytest.mark.parametrize("max_rows", [1, 13, 32])
def test_wide_tiles_masked_match_reference(sid, max_rows):
    check_masked(wide("grouped_masked", sid), max_rows)


@pytest.mark.parametrize("sid", [WIDE[0], WIDE[3], WIDE[4]])
def test_wide_tiles_group_steps_wait_and_width_are_bit_identical(sid):
    """wait_group 1 vs 0, raster, ring depth, group_steps 1/2/4 and one vs 2-4 weight tiles per
    warp: the same MMAs in the same order per output element, so the same bits."""
    base = wide("indexed", sid)
    e, n, k, m, top_k = 16, 1024, 1536, 300, 8
    qe, pw = experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=5, device="cuda"), base.block_m, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    first = run_indexed(base, x, pw, r, top_k, m * top_k)
    assert rel_err(first, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < BF16_TOL
    variants = [override(base, wgmma_wait=0), override(base, raster=8), override(base, stages=4),
                Schedule("indexed", base.block_m, 128, 8, 4, 1, mainloop="wgmma")]  # one tile per warp
    for gs in (1, 2, 4):
        try:
            variants.append(override(base, group_steps=gs))
        except ValueError:  # four steps per group do not fit every tile's registers
            pass
    for s in variants:
        assert same_bits(run_indexed(s, x, pw, r, top_k, m * top_k), first), s.id


def test_wide_tiles_cuda_graph_replay_with_new_routing():
    check_indexed_graph_replay(wide("indexed", WIDE[0]), e=16, n=512, k=1024, m=40, top_k=4)


# Persistent CTAs (persistent=1): about one wave of CTAs walks every (token tile, n_tiles N
# blocks) item through one ring. Each pair: the persistent schedule and the same schedule with
# one CTA per item, which must give the same bits (the same MMAs per tile in the same order).
PERSISTENT = [("idx-m32n128k64-w8-s4-c1-wgmma-ps1", "idx-m32n128k64-w8-s4-c1-wgmma"),
              ("idx-m16n128k64-w4-s5-c1-wgmma-r4-ps1", "idx-m16n128k64-w4-s5-c1-wgmma-r4"),
              ("idx-m64n256k64-w8-s4-c1-wgmma-gs2-r8-nt2-ps1", "idx-m64n256k64-w8-s4-c1-wgmma-gs2-r8-nt2"),
              ("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-ps1", "idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4"),
              ("idx-m128n256k64-w8-s4-c1-wgmma-gs2-r8-nt4-ps1", "idx-m128n256k64-w8-s4-c1-wgmma-gs2-r8-nt4"),
              ("idx-m32n256k64-w4-s6-c2-wgmma-gs2-ps1", "idx-m32n256k64-w4-s6-c2-wgmma-gs2")]


@pytest.mark.parametrize("pair", PERSISTENT, ids=lambda p: p[0])
@pytest.mark.parametrize("k", [256, 704, 2048])  # 4 (TP8 down), 11 and 32 K blocks
def test_persistent_indexed_matches_reference_and_one_cta_per_tile(pair, k):
    s, one = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    assert s.persistent == 1 and override(s, persistent=0) == one
    out, rerun = check_indexed(s, 1024, k)
    assert same_bits(out, rerun(one)), s.id


@pytest.mark.parametrize("pair", [PERSISTENT[0], PERSISTENT[2], PERSISTENT[4]], ids=lambda p: p[0])
def test_persistent_contiguous_matches_reference(pair):
    check_contiguous(override(Schedule.from_id(pair[0]), family="grouped_contiguous"), 1)


@pytest.mark.parametrize("pair", [PERSISTENT[1], PERSISTENT[5]], ids=lambda p: p[0])
@pytest.mark.parametrize("max_rows", [1, 13, 40])
def test_persistent_masked_matches_reference(pair, max_rows):
    check_masked(override(Schedule.from_id(pair[0]), family="grouped_masked"), max_rows)


def test_persistent_cuda_graph_replay_with_new_routing():
    """The grid is fixed at capture (SMs x CTAs per SM); the tiles follow each replay's routing."""
    check_indexed_graph_replay(Schedule.from_id(PERSISTENT[0][0]), e=16, n=512, k=1024, m=40, top_k=4)


# The work queue (queue=1): the same persistent walk with every item after a CTA's first claimed
# from an atomic counter. Same tiles, same per-tile MMAs: the same bits as the static walk, on
# every launch (the grid's last CTA resets the queue), the counters left at zero.
def _queue_counters(dev: int = 0) -> torch.Tensor:
    from chord import ops

    return ops._split_ws[(dev, ops._raw_stream(dev))][1][:2]


@pytest.mark.parametrize("pair", PERSISTENT, ids=lambda p: p[0])
@pytest.mark.parametrize("k", [256, 2048])
def test_queue_indexed_matches_the_static_walk_every_launch(pair, k):
    static = Schedule.from_id(pair[0])
    dyn = Schedule.from_id(pair[0] + "-dq1")
    assert dyn.queue == 1 and override(dyn, queue=0) == static
    out, rerun = check_indexed(dyn, 1024, k)
    ref = rerun(static)
    assert same_bits(out, ref), dyn.id
    for _ in range(3):  # the queue starts from zero again at each launch
        assert same_bits(rerun(dyn), ref), dyn.id
    torch.cuda.synchronize()
    assert _queue_counters().tolist() == [0, 0]


@pytest.mark.parametrize("pair", [PERSISTENT[0], PERSISTENT[2], PERSISTENT[4]], ids=lambda p: p[0])
def test_queue_contiguous_matches_reference(pair):
    for _ in range(2):
        check_contiguous(override(Schedule.from_id(pair[0] + "-dq1"), family="grouped_contiguous"), 1)


@pytest.mark.parametrize("pair", [PERSISTENT[1], PERSISTENT[5]], ids=lambda p: p[0])
@pytest.mark.parametrize("max_rows", [1, 13, 40])
def test_queue_masked_matches_reference(pair, max_rows):
    check_masked(override(Schedule.from_id(pair[0] + "-dq1"), family="grouped_masked"), max_rows)


def test_queue_cuda_graph_replay_with_new_routing():
    check_indexed_graph_replay(Schedule.from_id(PERSISTENT[0][0] + "-dq1"), e=16, n=512, k=1024, m=40, top_k=4)
    torch.cuda.synchronize()
    assert _queue_counters().tolist() == [0, 0]


def test_persistent_refuses_a_ring_deeper_than_one_tile():
    """K / 64 < stages - 2: the ring would run two tiles ahead; refused by name before a launch."""
    s = Schedule.from_id(PERSISTENT[3][0])  # 5 stages: needs at least 3 K blocks
    e, n, m, top_k = 4, 512, 9, 2
    _, pw = experts(e, n, 128)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=1, device="cuda"), s.block_m, e)
    x = torch.randn(m, 128, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="persistent=1 keeps the ring at most one tile ahead"):
        run_indexed(s, x, pw, r, top_k, m * top_k)


# --- the mma tile fed by a producer warp (producer=1, mainloop mma: csrc/mainloop/mma_producer.cuh) ---

MMA_PRODUCER_TILES = [(8, 128, 4, 6, {}), (8, 256, 4, 6, {"fold": 1}), (16, 256, 4, 4, {}),
                      (32, 128, 2, 3, {"swap": 0}), (8, 128, 4, 2, {"split_k": 3}), (64, 256, 8, 4, {})]


@pytest.mark.parametrize("tile", MMA_PRODUCER_TILES, ids=lambda t: f"m{t[0]}n{t[1]}w{t[2]}s{t[3]}" + "".join(
    f"-{k}{v}" for k, v in t[4].items()))
@pytest.mark.parametrize("k", [64, 704, 7168])  # 1, 11 (odd, fewer than some rings) and 112 K blocks
def test_mma_producer_is_bit_identical_to_the_multistage_loop(tile, k):
    """The same stage layout and the same compute_stage: the same bits as producer=0 on the indexed
    family (gate_up and down style), with the float32 reference, padding rows and skipped blocks."""
    bm, bn, warps, stages, kw = tile
    base = Schedule("indexed", bm, bn, warps, stages, 1, **kw)
    s = override(base, producer=1)
    assert s.threads == warps * 32 + 32
    e, n, m, top_k = 12, 512, 37, 4
    qe, pw = experts(e, n, k)
    ids = routing.random_topk_ids(m, e - 2, top_k, seed=bm + k, device="cuda")  # two experts without rows
    r = routing.align_block_size(ids, bm, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = run_indexed(s, x, pw, r, top_k, m * top_k)
    assert rel_err(out, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < BF16_TOL, s.id
    assert same_bits(out, run_indexed(base, x, pw, r, top_k, m * top_k)), s.id
    x2 = torch.randn(m * top_k, k, device="cuda").bfloat16()
    out2 = run_indexed(s, x2, pw, r, 1, m * top_k)
    assert same_bits(out2, run_indexed(base, x2, pw, r, 1, m * top_k)), s.id


@pytest.mark.parametrize("family", ["grouped_contiguous", "grouped_masked"])
def test_mma_producer_grouped_families(family):
    s = Schedule(family, 8, 256, 4, 6, 2, producer=1, fold=1)
    if family == "grouped_contiguous":
        check_contiguous(s, 1)
    else:
        check_masked(s, 13)


# --- the wgmma producer loop's second form (producer=1 where block_n % 128 == 0: copy-engine weights
# and scales, gathers on the slot's mbarrier; csrc/mainloop/wgmma_warp_specialized.cuh): each ws1 schedule
# docs/optimizations.md times against its multistage twin, on the indexed family against the float32
# reference and bit for bit against producer=0; contiguous ids also on their own family (reference only) ---

WS_WIDE = ["idx-m64n512k64-w8-s4-c1-wgmma-ws1-gs2-r8", "idx-m64n512k64-w8-s5-c1-wgmma-ws1-gs2-r8",
           "gcon-m64n512k64-w8-s4-c1-wgmma-ws1-gs2-r8", "idx-m128n256k64-w8-s5-c1-wgmma-ws1-gs2-r8",
           "idx-m128n256k64-w8-s6-c1-wgmma-ws1-gs2-r8", "gcon-m128n256k64-w8-s5-c1-wgmma-ws1-gs2-r8",
           "gcon-m256n128k64-w8-s4-c1-wgmma-ws1-r2-cn2", "idx-m32n512k64-w8-s8-c1-wgmma-ws1-gs1-cn2",
           "idx-m32n512k64-w8-s8-c1-wgmma-ws1-gs1", "idx-m96n256k64-w8-s5-c1-wgmma-ws1-gs2-r8",
           "idx-m256n128k64-w8-s5-c1-wgmma-ws1-r8", "idx-m256n128k64-w8-s4-c1-wgmma-ws1"]


@pytest.mark.parametrize("sid", WS_WIDE)
def test_wgmma_producer_second_form_matches_the_multistage_loop(sid):
    s = Schedule.from_id(sid)
    assert s.producer == 1 and s.mainloop == "wgmma" and s.block_n % 128 == 0, sid
    if s.family == "grouped_contiguous":
        check_contiguous(s, 1)
        s = override(s, family="indexed")
    for k in (704, 2048):  # 11 (odd) and 32 K blocks: past every ring here (4-8 stages)
        out, run_other = check_indexed(s, 1024, k)
        assert same_bits(run_other(override(s, producer=0)), out), (sid, k)
