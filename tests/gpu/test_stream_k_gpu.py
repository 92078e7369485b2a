"""Stream-K (issue 6, item 3; csrc/moe/stream_k.cuh) on the H200: against the float32 reference
with poisoned outputs over plans where tiles are split between CTAs, whole, shared by many CTAs
(fewer units than CTAs), with blocks of non-local experts (-1) and over-allocated routing
buffers; deterministic run to run (same bits), as a CUDA graph replayed with fresh routing, and
leaving its counters at zero (a second launch on the same workspace gives the same bits)."""
from __future__ import annotations

import pytest
import torch

from chord import ops, reference, routing
from chord.schedule import Schedule
from chord.testing import (BF16_TOL, cached_random_experts, check_indexed_graph_replay, check_rows, poisoned,
                           random_expert_map, rel_err, same_bits)

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

STK = ("idx-m8n64k64-w4-s8-c1-stk1", "idx-m8n128k64-w4-s6-c2-stk1", "idx-m16n128k64-w4-s4-c2-stk1",
       "idx-m8n64k64-w4-s8-c1-stk1-pd1")
# (experts, N, K, tokens, top_k): TP8 one token (8 of 384 experts, the real shapes), a split tile
# per CTA boundary, tiles whole in a CTA (short K, many N blocks), fewer units than CTAs, and a
# batch whose blocks span several per CTA
SHAPES = ((384, 512, 7168, 1, 8), (384, 7168, 256, 1, 8), (16, 256, 1024, 3, 4), (4, 128, 512, 1, 2),
          (32, 512, 2048, 40, 8), (8, 1024, 256, 130, 2))


def _fits(sid: str, shape: tuple) -> bool:
    s, (_, n, k, _, _) = Schedule.from_id(sid), shape
    return n % s.block_n == 0 and (n // s.block_n) * (k // 64) >= s.stages


CASES = [(sid, shape) for sid in STK for shape in SHAPES if _fits(sid, shape)]


def _run(s: Schedule, x, pw, r, top_k, n):
    out = poisoned(x.shape[0] * top_k, n)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    return out


@pytest.mark.parametrize("sid,shape", CASES, ids=[f"{i}-E{t[0]}-N{t[1]}-K{t[2]}-M{t[3]}-k{t[4]}" for i, t in CASES])
def test_stream_k_matches_reference_and_repeats_bit_for_bit(sid, shape):
    e, n, k, m, top_k = shape
    s = Schedule.from_id(sid)
    qe, pw = cached_random_experts(e, n, k, seed=n + k)
    ids = routing.random_topk_ids(m, e, top_k, seed=m + e, device="cuda")
    # over-allocated buffers: blocks past num_tokens_post_padded must cost nothing and stay unread
    cap = routing.sorted_ids_capacity(m * top_k, s.block_m, e) + 5 * s.block_m
    r = routing.align_block_size(ids, s.block_m, e, max_num_tokens_padded=cap)
    x = torch.randn(m, k, device="cuda").bfloat16()
    a = _run(s, x, pw, r, top_k, n)
    check_rows(a, reference.indexed_gemm_ref(x, qe, None, r, top_k), None, f"{sid} {shape}")
    b = _run(s, x, pw, r, top_k, n)  # the counters were left at zero: the same plan, the same bits
    c = _run(s, x, pw, r, top_k, n)
    assert same_bits(a, b) and same_bits(a, c), f"{sid} {shape}: stream-K is not deterministic run to run"


@pytest.mark.parametrize("sid", STK[:2])
def test_stream_k_skips_blocks_of_non_local_experts(sid):
    """EP routing with vLLM's default expert_map path: blocks of non-local experts read -1; their
    rows stay poisoned (nothing stored), every other row matches the reference."""
    s = Schedule.from_id(sid)
    e_global, e_local, m, top_k, n, k = 32, 8, 24, 4, 512, 1024
    qe, pw = cached_random_experts(e_local, n, k, seed=5)
    emap = random_expert_map(e_global, e_local)
    ids = routing.random_topk_ids(m, e_global, top_k, seed=9, device="cuda")
    r = routing.align_block_size(ids, s.block_m, e_global, expert_map=emap)
    assert bool((r.expert_ids[: int(r.num_tokens_post_padded[0]) // s.block_m] < 0).any()), "no -1 block to skip"
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = _run(s, x, pw, r, top_k, n)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    local = emap[ids.long()].reshape(-1) >= 0
    check_rows(out, ref, local, f"{sid} EP")
    assert bool(torch.isnan(out[~local]).all()), f"{sid}: rows of non-local experts were written"


@pytest.mark.parametrize("sid", STK[:3])
def test_stream_k_graph_replay_follows_fresh_routing(sid):
    """The plan follows num_tokens_post_padded on the device: one captured launch, replayed with
    routing (and so the number of valid blocks) rewritten in place."""
    check_indexed_graph_replay(Schedule.from_id(sid), e=64, n=512, k=1024, m=5, top_k=8, seeds=(2, 3, 4))


def test_stream_k_against_the_one_tile_kernel():
    """The same tile without stream-K: both close to the reference (their K sums are split
    differently, so not the same bits) and to each other."""
    e, n, k, m, top_k = 384, 512, 7168, 1, 8
    on = Schedule.from_id("idx-m8n64k64-w4-s8-c1-stk1")
    off = Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk8")
    qe, pw = cached_random_experts(e, n, k, seed=n + k)
    ids = routing.random_topk_ids(m, e, top_k, seed=11, device="cuda")
    r = routing.align_block_size(ids, 8, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    a, b = _run(on, x, pw, r, top_k, n), _run(off, x, pw, r, top_k, n)
    check_rows(a, ref, None, "stream-K")
    check_rows(b, ref, None, "split-K 8")
    assert rel_err(a, b) < BF16_TOL, "stream-K and split-K answers differ by more than bf16 rounding"
