"""chord.routing against straightforward Python-loop implementations of the contracts (CPU)."""

import itertools

import pytest
import torch

from chord import routing as R
from conftest import requires_gpu

# ----------------------------------------------------------------------------------------
# loop oracles
# ----------------------------------------------------------------------------------------


def vllm_capacity(t, bm, e):
    cap = t + e * (bm - 1)
    return min(t * bm, cap) if t < e else cap


def align_loop(topk_ids, bm, num_experts, expert_map=None, ignore=False):
    """vLLM moe_align_block_size semantics, one route at a time (stable order inside an expert)."""
    flat = topk_ids.flatten().tolist()
    emap = None if expert_map is None else expert_map.tolist()
    t = len(flat)
    buckets = [[] for _ in range(num_experts)]
    for i, e in enumerate(flat):
        if e < 0:
            continue
        if emap is not None and ignore:
            if emap[e] < 0:
                continue
            buckets[emap[e]].append(i)
        else:
            buckets[e].append(i)
    sorted_ids, expert_ids = [], []
    for b, routes in enumerate(buckets):
        padded = -(-len(routes) // bm) * bm
        sorted_ids += routes + [t] * (padded - len(routes))
        expert_ids += [b] * (padded // bm)
    if emap is not None and not ignore:
        expert_ids = [emap[b] for b in expert_ids]
    total = len(sorted_ids)
    cap = vllm_capacity(t, bm, num_experts)
    assert total <= cap
    sorted_ids += [t] * (cap - total)
    expert_ids += [-1] * (-(-cap // bm) - len(expert_ids))
    return sorted_ids, expert_ids, total


def local_routes_loop(topk_ids, num_experts, expert_map=None):
    """Per local expert, the flat route ids routed to it, ascending."""
    flat = topk_ids.flatten().tolist()
    emap = list(range(num_experts)) if expert_map is None else expert_map.tolist()
    n_local = sum(1 for v in emap if v >= 0)
    per = [[] for _ in range(n_local)]
    for i, e in enumerate(flat):
        if e >= 0 and emap[e] >= 0:
            per[emap[e]].append(i)
    return per


def random_ids(m, e, k, gen, dtype=torch.int32):
    return torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)]).to(dtype) if m else torch.empty(0, k, dtype=dtype)


def half_local_map(e, gen):
    """Every other expert local (in a shuffled local order), the rest -1."""
    local = torch.randperm(e, generator=gen)[: e // 2]
    emap = torch.full((e,), -1, dtype=torch.int32)
    emap[local] = torch.arange(local.numel(), dtype=torch.int32)
    return emap


# ----------------------------------------------------------------------------------------
# align_block_size
# ----------------------------------------------------------------------------------------


def test_vllm_docstring_example():
    # vLLM's example (experts 1..4), block 4: sorted ids [3,6,9,12, 0,4,10,12, 1,7,11,12, 2,5,8,12]
    topk = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    r = R.align_block_size(topk, 8, 5)
    assert int(r.num_tokens_post_padded) == 32
    got = r.sorted_ids[:32].view(4, 8)[:, :4].flatten().tolist()
    assert got == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert r.expert_ids[:4].tolist() == [1, 2, 3, 4]


CASES = list(
    itertools.product(
        [1, 3, 17, 64],  # M
        [(4, 2), (16, 8), (48, 8), (9, 1)],  # (E, top_k)
        [8, 16, 64],  # block_m
        ["none", "map", "map_ignore"],
    )
)


@pytest.mark.parametrize("m,ek,bm,mode", CASES, ids=[f"m{c[0]}-e{c[1][0]}k{c[1][1]}-bm{c[2]}-{c[3]}" for c in CASES])
def test_align_matches_loop(m, ek, bm, mode):
    e, k = ek
    gen = torch.Generator().manual_seed(1000 * m + 10 * e + bm)
    topk = random_ids(m, e, k, gen, dtype=torch.int64 if m % 2 else torch.int32)
    emap = half_local_map(e, gen) if mode != "none" else None
    ignore = mode == "map_ignore"
    if emap is not None and m > 2:
        topk[1, 0] = -1  # a dropped route (accepted with expert_map)
    r = R.align_block_size(topk, bm, e, emap, ignore_invalid_experts=ignore)
    sorted_ids, expert_ids, total = align_loop(topk, bm, e, emap, ignore)
    assert r.sorted_ids.dtype == torch.int32 and r.expert_ids.dtype == torch.int32
    assert r.num_tokens_post_padded.dtype == torch.int32 and r.num_tokens_post_padded.shape == (1,)
    assert r.sorted_ids.tolist() == sorted_ids
    assert r.expert_ids.tolist() == expert_ids
    assert int(r.num_tokens_post_padded) == total
    assert (r.block_m, r.top_k, r.num_rows, r.num_tokens, r.sentinel) == (bm, k, m * k, m, m * k)
    assert r.max_num_tokens_padded == vllm_capacity(m * k, bm, e) == R.sorted_ids_capacity(m * k, bm, e)
    if ignore:
        assert -1 not in r.expert_ids[: total // bm].tolist()


def test_align_all_routes_to_one_expert_and_empty_experts():
    topk = torch.full((5, 1), 3, dtype=torch.int32)
    r = R.align_block_size(topk, 8, 48)
    assert int(r.num_tokens_post_padded) == 8
    assert r.sorted_ids[:8].tolist() == [0, 1, 2, 3, 4, 5, 5, 5]
    assert r.expert_ids.tolist()[0] == 3 and set(r.expert_ids.tolist()[1:]) == {-1}
    assert r.max_num_tokens_padded == 5 * 8  # fewer routes than experts: T * block_m


def test_align_zero_tokens():
    r = R.align_block_size(torch.empty(0, 8, dtype=torch.int32), 16, 48)
    assert r.sorted_ids.numel() == 0 and r.expert_ids.numel() == 0
    assert int(r.num_tokens_post_padded) == 0


def test_align_no_local_expert_hit():
    topk = torch.tensor([[0, 1]], dtype=torch.int32)
    emap = torch.tensor([-1, -1, 0, 1], dtype=torch.int32)
    r = R.align_block_size(topk, 8, 4, emap, ignore_invalid_experts=True)
    assert int(r.num_tokens_post_padded) == 0 and set(r.sorted_ids.tolist()) == {2}
    r2 = R.align_block_size(topk, 8, 4, emap)
    assert int(r2.num_tokens_post_padded) == 16 and r2.expert_ids[:2].tolist() == [-1, -1]


def test_align_over_allocated_buffer():
    topk = random_ids(10, 16, 4, torch.Generator().manual_seed(3))
    r = R.align_block_size(topk, 16, 16, max_num_tokens_padded=1000)
    base = R.align_block_size(topk, 16, 16)
    assert r.sorted_ids.shape == (1000,) and r.expert_ids.shape == (63,)
    n = base.max_num_tokens_padded
    assert torch.equal(r.sorted_ids[:n], base.sorted_ids) and set(r.sorted_ids[n:].tolist()) == {40}
    assert torch.equal(r.num_tokens_post_padded, base.num_tokens_post_padded)


def test_align_blocks_are_homogeneous():
    gen = torch.Generator().manual_seed(7)
    topk = random_ids(100, 48, 8, gen)
    r = R.align_block_size(topk, 32, 48)
    total = int(r.num_tokens_post_padded)
    flat = topk.flatten()
    for b in range(total // 32):
        ids = r.sorted_ids[b * 32 : (b + 1) * 32]
        ids = ids[ids < 800].long()
        assert bool((flat[ids] == r.expert_ids[b]).all())
    routed = r.sorted_ids[:total]
    assert sorted(routed[routed < 800].tolist()) == list(range(800))


# ----------------------------------------------------------------------------------------
# contiguous / masked layouts and unpermute
# ----------------------------------------------------------------------------------------

LAYOUT_CASES = [(1, 8, 2, "none"), (7, 16, 4, "none"), (33, 48, 8, "map"), (20, 6, 3, "map"), (5, 64, 8, "none")]


@pytest.mark.parametrize("alignment", [1, 4, 128])
@pytest.mark.parametrize("m,e,k,mode", LAYOUT_CASES)
def test_contiguous_layout_matches_loop(m, e, k, mode, alignment):
    gen = torch.Generator().manual_seed(m * e + k)
    topk = random_ids(m, e, k, gen)
    emap = half_local_map(e, gen) if mode == "map" else None
    if emap is not None:
        topk[0, -1] = -1
    x = torch.randn(m, 24, generator=gen).to(torch.bfloat16)
    lay = R.contiguous_layout(x, topk, e, emap, alignment=alignment)
    per = local_routes_loop(topk, e, emap)
    offsets, slots = [0], []
    for routes in per:
        padded = -(-len(routes) // alignment) * alignment
        slots += routes + [-1] * (padded - len(routes))
        offsets.append(len(slots))
    assert lay.expert_offsets.dtype == torch.int64 and lay.expert_offsets.tolist() == offsets
    assert lay.src_slot.tolist() == slots
    assert lay.src_token.tolist() == [s // k if s >= 0 else -1 for s in slots]
    assert lay.x.dtype == x.dtype and lay.x.shape == (len(slots), 24)
    for row, s in enumerate(slots):
        want = x[s // k] if s >= 0 else torch.zeros(24, dtype=x.dtype)
        assert torch.equal(lay.x[row], want)
    assert lay.alignment == alignment and lay.num_experts == len(per)

    static = R.contiguous_layout(x, topk, e, emap, alignment=alignment, static_rows=True)
    assert static.x.shape[0] == m * k + len(per) * (alignment - 1)
    n = len(slots)
    assert torch.equal(static.x[:n], lay.x) and torch.equal(static.src_slot[:n], lay.src_slot)
    assert set(static.src_slot[n:].tolist()) <= {-1} and bool((static.x[n:] == 0).all())

    # unpermute: out_rows = 2 * x (NaN on padding rows) -> sum_j w * 2 * x[t] over local routes
    out_rows = torch.where(lay.src_slot.unsqueeze(1) >= 0, lay.x.float() * 2, float("nan"))
    w = torch.rand(m, k, generator=gen)
    got = R.unpermute_contiguous(out_rows, lay, w, m)
    want = torch.zeros(m, 24)
    for routes in per:
        for s in routes:
            want[s // k] += w[s // k, s % k] * 2 * x[s // k].float()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m,e,k,mode", LAYOUT_CASES)
def test_masked_layout_matches_loop(m, e, k, mode):
    gen = torch.Generator().manual_seed(m * e + k + 1)
    topk = random_ids(m, e, k, gen)
    emap = half_local_map(e, gen) if mode == "map" else None
    x = torch.randn(m, 16, generator=gen)
    lay = R.masked_layout(x, topk, e, expert_map=emap)
    per = local_routes_loop(topk, e, emap)
    max_rows = max(1, max(len(r) for r in per))
    assert lay.x.shape == (len(per), max_rows, 16) and lay.max_rows == max_rows
    assert lay.expert_num_tokens.dtype == torch.int32
    assert lay.expert_num_tokens.tolist() == [len(r) for r in per]
    for le, routes in enumerate(per):
        assert lay.src_slot[le].tolist() == routes + [-1] * (max_rows - len(routes))
        for row, s in enumerate(routes):
            assert torch.equal(lay.x[le, row], x[s // k])
        assert bool((lay.x[le, len(routes) :] == 0).all())

    bigger = R.masked_layout(x, topk, e, max_rows=max_rows + 3, expert_map=emap)
    assert torch.equal(bigger.x[:, :max_rows], lay.x) and bigger.x.shape[1] == max_rows + 3

    out = torch.where(lay.src_slot.unsqueeze(-1) >= 0, lay.x * 3, float("nan"))
    w = torch.rand(m, k, generator=gen)
    got = R.unpermute_masked(out, lay, w, m)
    want = torch.zeros(m, 16)
    for routes in per:
        for s in routes:
            want[s // k] += w[s // k, s % k] * 3 * x[s // k]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_masked_layout_too_small():
    topk = torch.tensor([[0], [0], [0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="masked_layout: max_rows"):
        R.masked_layout(torch.randn(3, 8), topk, 2, max_rows=2)
    lay = R.masked_layout(torch.randn(3, 8), topk, 2, max_rows=2, check_ids=False)
    assert lay.expert_num_tokens.tolist() == [2, 0]  # overflow rows dropped, never spilled


# ----------------------------------------------------------------------------------------
# suite routings
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tok_e", [1, 4, 12, 32, 64, 512])
def test_balanced_topk_ids_suite(tok_e):
    e, k = 48, 8
    m = tok_e * e // k
    ids = R.balanced_topk_ids(m, e, k, tok_e, seed=tok_e)
    assert ids.shape == (m, k) and ids.dtype == torch.int32
    assert torch.bincount(ids.flatten().long(), minlength=e).tolist() == [tok_e] * e
    assert bool((ids.sort(dim=1).values.diff(dim=1) > 0).all())  # distinct per token
    assert torch.equal(ids, R.balanced_topk_ids(m, e, k, tok_e, seed=tok_e))
    if m > 1:
        assert not torch.equal(ids, R.balanced_topk_ids(m, e, k, tok_e, seed=tok_e + 1))


def test_random_topk_ids():
    ids = R.random_topk_ids(64, 384, 8)
    assert ids.shape == (64, 8) and ids.dtype == torch.int32
    assert bool((ids.sort(dim=1).values.diff(dim=1) > 0).all())
    assert torch.equal(ids, R.random_topk_ids(64, 384, 8, seed=64))  # seeded by M by default
    assert not torch.equal(ids, R.random_topk_ids(64, 384, 8, seed=65))
    g = torch.Generator().manual_seed(64)
    assert torch.equal(ids, torch.topk(torch.randn(64, 384, generator=g), 8, dim=1).indices.int())


# ----------------------------------------------------------------------------------------
# error paths
# ----------------------------------------------------------------------------------------

_ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
_x = torch.randn(2, 8)
_map = torch.tensor([0, -1, 1, -1], dtype=torch.int32)

ERRORS = [
    ("ids dtype", lambda: R.align_block_size(_ids.float(), 8, 4), TypeError, "'topk_ids'"),
    ("ids type", lambda: R.align_block_size(_ids.tolist(), 8, 4), TypeError, "'topk_ids'"),
    ("ids rank", lambda: R.align_block_size(_ids.flatten(), 8, 4), ValueError, "'topk_ids'"),
    ("ids high", lambda: R.align_block_size(_ids, 8, 3), ValueError, "'topk_ids'"),
    ("ids -1 without map", lambda: R.align_block_size(-_ids, 8, 4), ValueError, "'topk_ids'"),
    ("ids -2 with map", lambda: R.align_block_size(_ids - 2, 8, 4, _map), ValueError, "'topk_ids'"),
    ("block_m 0", lambda: R.align_block_size(_ids, 0, 4), ValueError, "'block_m'"),
    ("block_m 12", lambda: R.align_block_size(_ids, 12, 4), ValueError, "'block_m'"),
    ("block_m float", lambda: R.align_block_size(_ids, 16.0, 4), ValueError, "'block_m'"),
    ("num_experts", lambda: R.align_block_size(_ids, 8, 0), ValueError, "'num_experts'"),
    ("map dtype", lambda: R.align_block_size(_ids, 8, 4, _map.float()), TypeError, "'expert_map'"),
    ("map shape", lambda: R.align_block_size(_ids, 8, 4, _map[:3]), ValueError, "'expert_map'"),
    ("map values", lambda: R.align_block_size(_ids, 8, 4, _map * 9), ValueError, "'expert_map'"),
    ("map device", lambda: R.align_block_size(_ids, 8, 4, _map.to("meta")), ValueError, "'expert_map'"),
    ("capacity", lambda: R.align_block_size(_ids, 8, 4, max_num_tokens_padded=10), ValueError, "'max_num_tokens_padded'"),
    ("hidden dtype", lambda: R.contiguous_layout(_ids, _ids, 4), TypeError, "'hidden_states'"),
    ("hidden rows", lambda: R.contiguous_layout(_x[:1], _ids, 4), ValueError, "'hidden_states'"),
    ("hidden rank", lambda: R.masked_layout(_x[0], _ids, 4), ValueError, "'hidden_states'"),
    ("alignment", lambda: R.contiguous_layout(_x, _ids, 4, alignment=0), ValueError, "'alignment'"),
    ("contiguous ids", lambda: R.contiguous_layout(_x, _ids, 2), ValueError, "'topk_ids'"),
    ("masked max_rows", lambda: R.masked_layout(_x, _ids, 4, max_rows=0), ValueError, "'max_rows'"),
    ("masked ids dtype", lambda: R.masked_layout(_x, _ids.float(), 4), TypeError, "'topk_ids'"),
    ("map not dense", lambda: R.masked_layout(_x, _ids, 4, expert_map=torch.tensor([0, -1, 2, -1], dtype=torch.int32)), ValueError, "'expert_map'"),
    ("unpermute layout", lambda: R.unpermute_contiguous(_x, None, torch.ones(2, 2), 2), TypeError, "'layout'"),
    ("unpermute tokens", lambda: R.unpermute_contiguous(torch.zeros(4, 3), R.contiguous_layout(_x, _ids, 4), torch.ones(2, 2), 3), ValueError, "'num_tokens'"),
    ("unpermute weights", lambda: R.unpermute_contiguous(torch.zeros(4, 3), R.contiguous_layout(_x, _ids, 4), torch.ones(2, 2, dtype=torch.int32), 2), TypeError, "'topk_weights'"),
    ("unpermute rows", lambda: R.unpermute_contiguous(torch.zeros(5, 3), R.contiguous_layout(_x, _ids, 4), torch.ones(2, 2), 2), ValueError, "'out_rows'"),
    ("unpermute masked out", lambda: R.unpermute_masked(torch.zeros(4, 3), R.masked_layout(_x, _ids, 4), torch.ones(2, 2), 2), ValueError, "'out'"),
    ("balanced counts", lambda: R.balanced_topk_ids(5, 48, 8, 1), ValueError, "'num_tokens'"),
    ("balanced top_k", lambda: R.balanced_topk_ids(1, 4, 8, 2), ValueError, "'top_k'"),
    ("balanced tok_e", lambda: R.balanced_topk_ids(6, 48, 8, 0), ValueError, "'tok_e'"),
    ("random top_k", lambda: R.random_topk_ids(4, 4, 8), ValueError, "'top_k'"),
    ("random tokens", lambda: R.random_topk_ids(-1, 4, 2), ValueError, "'num_tokens'"),
]


@pytest.mark.parametrize("call,exc,needle", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(call, exc, needle):
    with pytest.raises(exc) as info:
        call()
    # "'name'": the argument the message must name, in chord.checks' form "<function>: <name> ..."
    want = f": {needle[1:-1]}" if needle.startswith("'") and needle.endswith("'") else needle
    assert want in str(info.value), (want, str(info.value))


@requires_gpu
@pytest.mark.gpu
def test_align_on_cuda_matches_cpu_without_sync():
    gen = torch.Generator().manual_seed(11)
    topk = random_ids(300, 384, 8, gen)
    emap = half_local_map(384, gen)
    ref = R.align_block_size(topk, 64, 384, emap, ignore_invalid_experts=True)
    topk_d, emap_d = topk.cuda(), emap.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        r = R.align_block_size(topk_d, 64, 384, emap_d, ignore_invalid_experts=True, check_ids=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(r.sorted_ids.cpu(), ref.sorted_ids)
    assert torch.equal(r.expert_ids.cpu(), ref.expert_ids)
    assert torch.equal(r.num_tokens_post_padded.cpu(), ref.num_tokens_post_padded)


def test_indexed_routing_validates():
    r = R.align_block_size(_ids, 8, 4)
    fields = dict(sorted_ids=r.sorted_ids, expert_ids=r.expert_ids, num_tokens_post_padded=r.num_tokens_post_padded, block_m=8, top_k=2, num_rows=4)
    R.IndexedRouting(**fields)
    bad = [
        (dict(sorted_ids=r.sorted_ids.long()), TypeError, ": sorted_ids"),
        (dict(num_tokens_post_padded=r.num_tokens_post_padded.repeat(2)), ValueError, ": num_tokens_post_padded"),
        (dict(block_m=0), ValueError, ": block_m"),
        (dict(num_rows=5), ValueError, ": num_rows"),
        (dict(expert_ids=r.expert_ids[:1]), ValueError, ": expert_ids"),
    ]
    for change, exc, needle in bad:
        with pytest.raises(exc, match=needle):
            R.IndexedRouting(**{**fields, **change})
