"""Folded group scales (`fold`: 1, mma loop with the operand swap) on the H200.

Every family against the float32 reference with poisoned outputs, next to the same schedule
unfolded (the folded sums are exact fp32 partials, so they must be at least about as close to the
reference as bf16(q * scale) pairs); split-K, n_tiles, stream-K and 2 CTAs/SM variants; run to
run the same bits; a CUDA graph replayed with fresh routing.
"""
from __future__ import annotations

import pytest
import torch

from chord import ops, reference, routing
from chord.schedule import Schedule, override
from chord.testing import (BF16_TOL, cached_random_experts, check_indexed_graph_replay, check_rows, poisoned,
                           rel_err, same_bits)
from test_mainloops_gpu import check_contiguous  # tests/gpu is on sys.path (pytest rootdir-relative "prepend" imports)

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

experts = cached_random_experts

# the decode / TP8 tiles of the profile, a taller token tile, and the split / multi-tile / stream-K forms
INDEXED = ("idx-m8n256k64-w4-s8-c1-fo1", "idx-m8n128k64-w4-s8-c2-fo1", "idx-m16n256k64-w4-s6-c1-fo1",
           "idx-m32n128k64-w4-s4-c2-fo1", "idx-m8n64k64-w4-s8-c1-sk8-fo1", "idx-m8n128k64-w4-s6-c1-nt2-fo1",
           "idx-m8n64k64-w4-s8-c1-stk1-fo1", "idx-m64n128k64-w8-s3-c1-fo1")


def _unfolded(s: Schedule) -> Schedule:
    return override(s, fold=0)


def _indexed(s: Schedule, n: int, k: int, e: int = 12, m: int = 157, top_k: int = 4, seed: int = 0):
    qe, pw = experts(e, n, k)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=seed + k, device="cuda"), s.block_m, e)
    x = torch.randn(m, k, device="cuda").bfloat16()

    def run(sched):
        out = poisoned(m * top_k, n)
        ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=sched)
        return out

    return run, reference.indexed_gemm_ref(x, qe, None, r, top_k)


# 1, 11 (odd) and 32 K blocks; a split needs at least as many K blocks as parts
CASES = [(sid, k) for sid in INDEXED for k in (64, 704, 2048) if k // 64 >= Schedule.from_id(sid).split_k]


@pytest.mark.parametrize("sid,k", CASES)
def test_folded_indexed_matches_reference(sid, k):
    s = Schedule.from_id(sid)
    assert s.fold == 1
    n = 512
    run, ref = _indexed(s, n, k)
    out = run(s)
    err = rel_err(out, ref)
    base = rel_err(run(_unfolded(s)), ref)
    assert err < BF16_TOL, (sid, err)
    assert err <= 1.25 * base + 1e-4, (sid, err, base)  # exact fp32 group partials: no worse than bf16 pairs
    assert same_bits(out, run(s)), f"{sid}: not the same bits run to run"


@pytest.mark.parametrize("sid", ("gmsk-m8n256k64-w4-s8-c1-fo1", "gmsk-m8n128k64-w4-s8-c2-fo1",
                                 "gmsk-m16n256k64-w4-s6-c1-fo1"))
@pytest.mark.parametrize("max_rows", [1, 4, 13])
def test_folded_masked_matches_reference(sid, max_rows):
    s = Schedule.from_id(sid)
    e, n, k = 20, 1024, 768
    qe, pw = experts(e, n, k)
    counts = torch.randint(0, max_rows + 1, (e,), device="cuda", dtype=torch.int32)
    counts[0], counts[1] = 0, max_rows
    x = torch.randn(e, max_rows, k, device="cuda").bfloat16()
    ref = reference.masked_gemm_ref(x, qe, None, counts)
    outs = []
    for sched in (s, _unfolded(s)):
        out = poisoned(e, max_rows, n)
        ops.gemm_masked(x, pw, counts, out=out, schedule=sched)
        outs.append(check_rows(out, ref, what=f"masked {sched.id} max_rows={max_rows}"))
    assert outs[0] <= 1.25 * outs[1] + 1e-4, (sid, outs)


@pytest.mark.parametrize("sid", ("gcon-m16n128k64-w4-s4-c1-fo1", "gcon-m64n128k64-w8-s3-c1-fo1"))
@pytest.mark.parametrize("alignment", [1, 128])
def test_folded_contiguous_matches_reference(sid, alignment):
    check_contiguous(Schedule.from_id(sid), alignment)  # an empty expert, rows past the offsets stay NaN


def test_folded_kimi_decode_shapes():
    """The real EP8 decode / TP8 GEMM shapes (gate_up N 4096 / 512, K 7168; down N 7168, K 2048 / 256)."""
    for sid, e, n, k, m, top_k in (("idx-m8n256k64-w4-s8-c1-fo1", 48, 4096, 7168, 6, 8),
                                   ("idx-m8n128k64-w4-s8-c1-fo1", 48, 7168, 2048, 6, 8),
                                   ("idx-m8n64k64-w4-s8-c1-sk8-fo1", 384, 512, 7168, 1, 8),
                                   ("idx-m8n64k64-w4-s8-c1-fo1", 384, 7168, 256, 1, 8)):
        s = Schedule.from_id(sid)
        run, ref = _indexed(s, n, k, e=e, m=m, top_k=top_k, seed=1)
        out = run(s)
        err, base = rel_err(out, ref), rel_err(run(_unfolded(s)), ref)
        assert err < BF16_TOL and err <= 1.25 * base + 1e-4, (sid, err, base)


def test_folded_cuda_graph_replay_with_new_routing():
    check_indexed_graph_replay(Schedule.from_id("idx-m8n256k64-w4-s8-c1-fo1"), 16, 512, 1024, 40, 4)
    check_indexed_graph_replay(Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk8-fo1"), 16, 512, 1024, 3, 4)
