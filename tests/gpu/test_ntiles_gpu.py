"""CTAs that walk several N blocks (`n_tiles`) on every family and both main loops.

The knob changes which CTA computes a tile and keeps the ring loading across tile boundaries;
each tile's MMAs are the same in the same order, so the output must be bit-identical to the
same schedule with n_tiles=1 (and match the float32 reference). Outputs are poisoned with NaN;
rows a kernel must skip stay NaN. K covers one K block, fewer K blocks than ring stages, an odd
count and the TP8 down shape (4 blocks, 56 N blocks of 128).
"""
from __future__ import annotations

import pytest
import torch

from chord import ops, reference, routing
from chord.schedule import Schedule, override
from chord.testing import BF16_TOL, cached_random_experts, check_indexed_graph_replay, poisoned, rel_err, same_bits

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

experts = cached_random_experts


def base_schedule(family: str, mainloop: str, bm: int, bn: int, stages: int) -> Schedule:
    if mainloop == "wgmma":
        return Schedule(family, bm, bn, bn // 16, max(stages, 3), 1, mainloop="wgmma")
    return Schedule(family, bm, bn, 4, stages, 1)


# (mainloop, block_m, block_n, stages)
TILES = [("mma", 8, 128, 6), ("mma", 32, 256, 3), ("wgmma", 16, 128, 4), ("wgmma", 128, 128, 3)]


def tile_id(t):
    return f"{t[0]}-m{t[1]}n{t[2]}s{t[3]}"


@pytest.mark.parametrize("tile", TILES, ids=tile_id)
@pytest.mark.parametrize("k", [64, 192, 256, 704])  # 1, 3, 4 (TP8 down) and 11 K blocks
@pytest.mark.parametrize("n_tiles", [2, 4])
def test_n_tiles_indexed_bit_identical(tile, k, n_tiles):
    mainloop, bm, bn, stages = tile
    e, n, m, top_k = 12, 1024, 70, 6
    qe, pw = experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=k, device="cuda"), bm, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    base = base_schedule("indexed", mainloop, bm, bn, stages)
    outs = []
    for s in (base, override(base, n_tiles=n_tiles), override(base, n_tiles=n_tiles, raster=4)):
        out = poisoned(m * top_k, n)
        ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
        outs.append(out)
    assert rel_err(outs[0], reference.indexed_gemm_ref(x, qe, None, r, top_k)) < BF16_TOL
    assert same_bits(outs[1], outs[0]), f"n_tiles={n_tiles} changed the bits"
    assert same_bits(outs[2], outs[0]), f"n_tiles={n_tiles} with raster=4 changed the bits"


@pytest.mark.parametrize("tile", TILES, ids=tile_id)
def test_n_tiles_contiguous(tile):
    mainloop, bm, bn, stages = tile
    e, n, k, m, top_k = 10, 1024, 256, 90, 4
    qe, pw = experts(e, n, k)
    ids = routing.random_topk_ids(m, e - 1, top_k, seed=5, device="cuda")
    ids = torch.where(ids >= 3, ids + 1, ids)  # expert 3 gets no rows
    x = torch.randn(m, k, device="cuda").bfloat16()
    lay = routing.contiguous_layout(x, ids, e, alignment=1)
    xin = torch.cat([lay.x, torch.randn(5, k, device="cuda").bfloat16()])
    rows = int(lay.expert_offsets[-1])
    base = base_schedule("grouped_contiguous", mainloop, bm, bn, stages)
    outs = []
    for s in (base, override(base, n_tiles=4)):
        out = poisoned(xin.shape[0], n)
        ops.gemm_contiguous(xin, pw, lay.expert_offsets, out=out, schedule=s)
        assert torch.isnan(out[rows:]).all(), f"{s.id}: rows past expert_offsets[E] were written"
        outs.append(out)
    ref = reference.contiguous_gemm_ref(xin, qe, None, lay.expert_offsets)
    assert rel_err(outs[0][:rows], ref[:rows]) < BF16_TOL
    assert same_bits(outs[1], outs[0])


@pytest.mark.parametrize("tile", TILES, ids=tile_id)
def test_n_tiles_masked(tile):
    mainloop, bm, bn, stages = tile
    e, n, k, max_rows = 9, 1024, 192, 37
    qe, pw = experts(e, n, k)
    g = torch.Generator(device="cuda").manual_seed(bm * 1000 + bn + stages)  # per tile, whatever ran before
    counts = torch.randint(0, max_rows + 1, (e,), device="cuda", dtype=torch.int32, generator=g)
    counts[0], counts[1] = 0, max_rows
    x = torch.randn(e, max_rows, k, device="cuda").bfloat16()
    base = base_schedule("grouped_masked", mainloop, bm, bn, stages)
    outs = []
    for s in (base, override(base, n_tiles=2)):
        out = poisoned(e, max_rows, n)
        ops.gemm_masked(x, pw, counts, out=out, schedule=s)
        outs.append(out)
    ref = reference.masked_gemm_ref(x, qe, None, counts)
    valid = ~torch.isnan(ref[..., 0])
    assert torch.isnan(outs[1][~valid]).all(), "rows past an expert's count were written"
    assert rel_err(outs[0][valid], ref[valid]) < BF16_TOL
    assert same_bits(outs[1], outs[0])


def test_n_tiles_tp8_down_shape_and_graph_replay():
    """The shape n_tiles is for (TP8 down: 384 experts, N=7168, K=256), under CUDA-graph replay
    with new routing values in the captured buffers."""
    check_indexed_graph_replay(Schedule("indexed", 8, 128, 4, 6, 1, n_tiles=4), e=384, n=7168, k=256, m=300, top_k=1)

