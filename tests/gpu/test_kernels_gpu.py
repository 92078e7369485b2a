"""Every kernel family against the float32 reference on the GPU (marker `gpu`).

Random non-zero data, fresh routing per seed, outputs poisoned with NaN before every launch so
an unwritten element fails, rows the kernel must not touch checked to stay NaN. Shapes: tiny M,
experts with zero rows, odd per-expert counts, over-allocated routing buffers, random -1 blocks,
Kimi K2 EP8 and TP8 shapes, and every schedule the default profile can select.
"""
from __future__ import annotations

import pytest
import torch

from chord import formats, ops, reference, routing
from chord.schedule import Problem, Schedule, load_profile_file, select
from chord.testing import check_indexed_graph_replay, check_rows, random_expert_map

pytestmark = pytest.mark.gpu

TOL = 1e-2  # relative Frobenius error for bf16 operands; measured ~2-3e-3


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


if not _sm90():  # pragma: no cover - CPU machines skip via the gpu marker already
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

_WEIGHTS: dict = {}


def weights(e: int, n: int, k: int, seed: int = 0):
    """Random non-zero int4 codes + scales (cached per shape: Kimi shapes are large)."""
    key = (e, n, k, seed)
    if key not in _WEIGHTS:
        g = torch.Generator(device="cuda").manual_seed(1000 + seed)
        q = torch.randint(-8, 8, (e, n, k), dtype=torch.int8, device="cuda", generator=g)
        q[q == 0] = 1
        s = (torch.rand(e, n, k // 32, device="cuda", generator=g) * 0.02 + 0.002).to(torch.bfloat16)
        qe = formats.QuantizedExperts(q, s)
        _WEIGHTS.clear() if len(_WEIGHTS) > 6 else None
        _WEIGHTS[key] = (qe, formats.pack_experts(qe))
    return _WEIGHTS[key]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(got).any(), "NaN in the kernel output (unwritten rows?)"
    return ((got.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def profile_schedules(family: str) -> list[Schedule]:
    return sorted({s for s in load_profile_file("h200").all_schedules() if s.family == family}, key=lambda s: s.id)


# ----------------------------------------------------------------------------------------------
# indexed


INDEXED_CASES = [
    # (E, N, K, M, top_k)
    (8, 256, 512, 1, 2),
    (8, 256, 512, 3, 8),
    (16, 512, 1024, 37, 4),
    (48, 4096, 7168, 6, 8),      # EP8 decode, tok_e = 1
    (48, 4096, 7168, 96, 8),     # EP8 decode, tok_e = 16
    (48, 7168, 2048, 384, 8),    # EP8 down, prefill tok_e = 64 (down input)
    (384, 512, 7168, 1, 8),      # TP8 gate_up, one token
    (384, 7168, 256, 16, 8),     # TP8 down
    (384, 512, 7168, 1024, 8),
]


@pytest.mark.parametrize("case", INDEXED_CASES, ids=lambda c: "E{}-N{}-K{}-M{}-k{}".format(*c))
@pytest.mark.parametrize("seed", [0, 1])
def test_indexed_matches_reference(case, seed):
    e, n, k, m, top_k = case
    qe, pw = weights(e, n, k)
    torch.manual_seed(seed)
    ids = routing.random_topk_ids(m, e, top_k, seed=seed, device="cuda")
    prob = Problem("indexed", e, n, k, rows=m * top_k, top_k=top_k)
    s = select("h200:tp8" if e >= 256 else "h200:ep8-prefill", prob)
    r = routing.align_block_size(ids, s.block_m, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.full((m * top_k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    assert rel_err(out, ref) < TOL


@pytest.mark.parametrize("sched", profile_schedules("indexed"), ids=lambda s: s.id)
def test_indexed_every_profile_schedule_down_proj(sched):
    """gate_up-style (top_k=8) and down-style (top_k=1) calls of every indexed schedule."""
    e, n, k = 12, 1024 if 1024 % sched.block_n == 0 else sched.block_n * 4, 640
    qe, pw = weights(e, n, k)
    m, top_k = 29, 4
    ids = routing.random_topk_ids(m, e, top_k, seed=7, device="cuda")
    r = routing.align_block_size(ids, sched.block_m, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.full((m * top_k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=sched)
    assert rel_err(out, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < TOL
    x2 = torch.randn(m * top_k, k, device="cuda").bfloat16()
    out2 = torch.full((m * top_k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_indexed(x2, pw, r, top_k=1, out=out2, schedule=sched)
    assert rel_err(out2, reference.indexed_gemm_ref(x2, qe, None, r, 1)) < TOL


def test_indexed_overallocated_buffers_and_skip_blocks():
    """expert_map with non-local experts -> -1 blocks; buffers longer than needed, garbage past
    num_tokens_post_padded; rows of non-local routes must stay untouched (NaN)."""
    e_global, e_local, n, k, m, top_k = 32, 16, 512, 1024, 53, 6
    qe, pw = weights(e_local, n, k)
    ids = routing.random_topk_ids(m, e_global, top_k, seed=3, device="cuda")
    emap = random_expert_map(e_global, e_local)
    s = Schedule("indexed", 16, 256, 4, 4, 1)
    cap = routing.sorted_ids_capacity(m * top_k, 16, e_global) + 16 * 40
    r = routing.align_block_size(ids, 16, e_global, expert_map=emap, max_num_tokens_padded=cap)
    assert (r.expert_ids == -1).any(), "the case must contain -1 blocks"
    # poison everything past the used length with valid-looking ids/experts
    used = int(r.num_tokens_post_padded[0])
    r.sorted_ids[used:] = 0
    r.expert_ids[(used + 15) // 16:] = 0
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.full((m * top_k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    written = ~torch.isnan(ref[:, 0])
    assert torch.equal(~torch.isnan(out[:, 0]), written), "kernel wrote rows it must skip, or missed rows"
    assert rel_err(out[written], ref[written]) < TOL


def test_indexed_large_m():
    e, n, k, m, top_k = 384, 512, 7168, 16384, 8
    qe, pw = weights(e, n, k)
    ids = routing.random_topk_ids(m, e, top_k, seed=11, device="cuda")
    s = select("h200:tp8", Problem("indexed", e, n, k, rows=m * top_k, top_k=top_k))
    r = routing.align_block_size(ids, s.block_m, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.full((m * top_k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    assert rel_err(out, ref) < TOL


# ----------------------------------------------------------------------------------------------
# grouped contiguous


@pytest.mark.parametrize("sched", profile_schedules("grouped_contiguous"), ids=lambda s: s.id)
@pytest.mark.parametrize("alignment", [1, 128])
def test_contiguous_matches_reference(sched, alignment):
    e, n, k, m, top_k = 24, 1024, 1024, 70, 8
    qe, pw = weights(e, n, k)
    # routes over E-1 experts, shifted so expert 5 gets no rows (distinct per token still)
    ids = routing.random_topk_ids(m, e - 1, top_k, seed=alignment, device="cuda")
    ids = torch.where(ids >= 5, ids + 1, ids)
    x = torch.randn(m, k, device="cuda").bfloat16()
    lay = routing.contiguous_layout(x, ids, e, alignment=alignment)
    spare = 9  # rows past expert_offsets[E] must not be written
    xin = torch.cat([lay.x, torch.randn(spare, k, device="cuda").bfloat16()])
    out = torch.full((xin.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_contiguous(xin, pw, lay.expert_offsets, out=out, schedule=sched)
    ref = reference.contiguous_gemm_ref(xin, qe, None, lay.expert_offsets)
    rows = int(lay.expert_offsets[-1])
    assert torch.isnan(out[rows:]).all(), "rows past expert_offsets[E] were written"
    assert rel_err(out[:rows], ref[:rows]) < TOL


def test_contiguous_kimi_ep8_prefill():
    e, n, k, tok_e = 48, 4096, 7168, 64
    qe, pw = weights(e, n, k)
    m = tok_e * e // 8
    ids = routing.balanced_topk_ids(m, e, 8, tok_e, seed=2).cuda()
    x = torch.randn(m, k, device="cuda").bfloat16()
    lay = routing.contiguous_layout(x, ids, e)
    out = torch.full((lay.x.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_contiguous(lay.x, pw, lay.expert_offsets, out=out, profile="h200:ep8-prefill")
    assert rel_err(out, reference.contiguous_gemm_ref(lay.x, qe, None, lay.expert_offsets)) < TOL


# ----------------------------------------------------------------------------------------------
# grouped masked


@pytest.mark.parametrize("sched", profile_schedules("grouped_masked"), ids=lambda s: s.id)
@pytest.mark.parametrize("max_rows", [1, 13, 64])
def test_masked_matches_reference(sched, max_rows):
    e, n, k = 20, 1024, 768
    qe, pw = weights(e, n, k)
    counts = torch.randint(0, max_rows + 1, (e,), device="cuda", dtype=torch.int32)
    counts[0] = 0
    counts[1] = max_rows
    x = torch.randn(e, max_rows, k, device="cuda").bfloat16()
    out = torch.full((e, max_rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_masked(x, pw, counts, out=out, schedule=sched)
    ref = reference.masked_gemm_ref(x, qe, None, counts)
    check_rows(out, ref, what=f"{sched.id} max_rows={max_rows}", tol=TOL)


def test_masked_kimi_decode_shape():
    e, n, k, tok_e = 48, 4096, 7168, 4
    qe, pw = weights(e, n, k)
    m = tok_e * e // 8
    ids = routing.balanced_topk_ids(m, e, 8, tok_e, seed=5).cuda()
    x = torch.randn(m, k, device="cuda").bfloat16()
    lay = routing.masked_layout(x, ids, e, max_rows=16)
    out = torch.full((e, 16, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_masked(lay.x, pw, lay.expert_num_tokens, out=out, profile="h200:ep8-decode", expected_rows=m * 8)
    ref = reference.masked_gemm_ref(lay.x, qe, None, lay.expert_num_tokens)
    check_rows(out, ref, what="masked Kimi decode shape", tol=TOL)


# ----------------------------------------------------------------------------------------------
# composite, torch.library, graphs, compile


@pytest.mark.parametrize("family", ["indexed", "grouped_contiguous", "grouped_masked"])
@pytest.mark.parametrize("m", [1, 7, 200])
def test_fused_moe_matches_reference(family, m):
    e, hidden, inter, top_k = 16, 1024, 256, 4
    w13q, w13 = weights(e, 2 * inter, hidden, seed=21)
    w2q, w2 = weights(e, hidden, inter, seed=22)
    x = torch.randn(m, hidden, device="cuda").bfloat16()
    ids = routing.random_topk_ids(m, e, top_k, seed=m, device="cuda")
    wts = torch.softmax(torch.randn(m, top_k, device="cuda"), dim=-1)
    out = ops.fused_moe(x, w13, w2, wts, ids, family=family, profile="h200:ep8-prefill")
    ref = reference.moe_ref(x, w13q, w2q, wts, ids, bf16_intermediates=True)
    assert out.dtype == torch.bfloat16 and out.shape == (m, hidden)
    assert rel_err(out, ref) < TOL


def test_opcheck_all_ops():
    e, n, k, m, top_k = 8, 256, 512, 9, 2
    qe, pw = weights(e, n, k)
    ids = routing.random_topk_ids(m, e, top_k, seed=1, device="cuda")
    s = Schedule("indexed", 8, 128, 4, 4, 1)
    r = routing.align_block_size(ids, 8, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.zeros(m * top_k, n, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.chord.gemm_indexed.default,
                          (x, pw.qweight, pw.scales, r.sorted_ids, r.expert_ids, r.num_tokens_post_padded, out,
                           top_k, 8, s.id))
    lay = routing.contiguous_layout(x, ids, e)
    oc = torch.zeros(lay.x.shape[0], n, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.chord.gemm_contiguous.default,
                          (lay.x, pw.qweight, pw.scales, lay.expert_offsets, oc, "gcon-m8n128k64-w4-s4-c1"))
    ml = routing.masked_layout(x, ids, e, max_rows=8)
    om = torch.zeros(e, 8, n, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.chord.gemm_masked.default,
                          (ml.x, pw.qweight, pw.scales, ml.expert_num_tokens, om, "gmsk-m8n128k64-w4-s4-c1"))


def test_cuda_graph_capture_and_replay_with_new_routing():
    """The indexed op never reads the routing on the host: capture once, change the routing
    buffers in place, replay, and get the new answer."""
    check_indexed_graph_replay(Schedule("indexed", 16, 128, 4, 4, 1), e=16, n=512, k=1024, m=24, top_k=4, seeds=(2,))


def test_torch_compile_fullgraph():
    e, n, k, m, top_k = 8, 256, 512, 5, 2
    qe, pw = weights(e, n, k)
    ids = routing.random_topk_ids(m, e, top_k, seed=4, device="cuda")
    r = routing.align_block_size(ids, 8, e)
    sid = "idx-m8n128k64-w4-s4-c1"

    def f(x, qweight, scales, sorted_ids, expert_ids, ntpp):
        out = torch.empty(x.shape[0] * top_k, n, device=x.device, dtype=torch.bfloat16)
        torch.ops.chord.gemm_indexed(x, qweight, scales, sorted_ids, expert_ids, ntpp, out, top_k, 8, sid)
        return out * 2

    cf = torch.compile(f, fullgraph=True)
    x = torch.randn(m, k, device="cuda").bfloat16()
    got = cf(x, pw.qweight, pw.scales, r.sorted_ids, r.expert_ids, r.num_tokens_post_padded)
    assert rel_err(got / 2, reference.indexed_gemm_ref(x, qe, None, r, top_k)) < TOL


# ----------------------------------------------------------------------------------------------
# split-K


@pytest.mark.parametrize("cluster", [0, 1], ids=["workspace", "cluster"])
@pytest.mark.parametrize("split", [2, 4, 8])
def test_split_k_indexed_tp8_one_token(split, cluster):
    """TP8 gate_up at one token, K split over CTAs (partials summed through a global workspace or
    through the cluster's shared memory): matches the reference, leaves untouched rows NaN, a second
    launch (counters reset by the kernel) gives bit-identical output, and the two fix-ups agree bit
    for bit."""
    e, n, k, m, top_k = 384, 512, 7168, 1, 8
    qe, pw = weights(e, n, k)
    s = Schedule("indexed", 8, 64, 4, 8, 1, split, split_cluster=cluster)
    ids = routing.random_topk_ids(m, e, top_k, seed=split, device="cuda")
    r = routing.align_block_size(ids, 8, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.full((m * top_k + 3, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k, n_out_rows=m * top_k + 3)
    assert torch.isnan(out[m * top_k:]).all()
    assert rel_err(out[: m * top_k], ref[: m * top_k]) < TOL
    first = out.clone()
    out.fill_(float("nan"))
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    assert torch.equal(out.view(torch.int16), first.view(torch.int16)), "split-K is not deterministic"
    if cluster:
        other = torch.full_like(out, float("nan"))
        ops.gemm_indexed(x, pw, r, top_k=top_k, out=other, schedule=Schedule("indexed", 8, 64, 4, 8, 1, split))
        assert torch.equal(out.view(torch.int16), other.view(torch.int16)), "cluster and workspace fix-ups differ"


@pytest.mark.parametrize("family", ["grouped_contiguous", "grouped_masked"])
def test_split_k_grouped(family):
    e, n, k = 16, 512, 2048
    qe, pw = weights(e, n, k)
    counts = torch.randint(0, 12, (e,), device="cuda", dtype=torch.int32)
    counts[3] = 0
    s = Schedule(family, 8, 128, 4, 6, 1, 4)
    if family == "grouped_masked":
        x = torch.randn(e, 12, k, device="cuda").bfloat16()
        out = torch.full((e, 12, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ops.gemm_masked(x, pw, counts, out=out, schedule=s)
        ref = reference.masked_gemm_ref(x, qe, None, counts)
    else:
        off = torch.zeros(e + 1, dtype=torch.int64, device="cuda")
        off[1:] = counts.long().cumsum(0)
        x = torch.randn(int(off[-1]) + 5, k, device="cuda").bfloat16()
        out = torch.full((x.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ops.gemm_contiguous(x, pw, off, out=out, schedule=s)
        ref = reference.contiguous_gemm_ref(x, qe, None, off)
    check_rows(out, ref, what=f"{s.id} {family}", tol=TOL)


@pytest.mark.parametrize("cluster", [0, 1], ids=["workspace", "cluster"])
def test_split_k_graph_replay(cluster):
    e, n, k, m, top_k = 64, 512, 4096, 3, 8
    qe, pw = weights(e, n, k)
    s = Schedule("indexed", 8, 64, 4, 8, 2, 8, split_cluster=cluster)
    r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=9, device="cuda"), 8, e)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.full((m * top_k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
    ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(out, ref) < TOL


# ----------------------------------------------------------------------------------------------
# memory safety whatever the routing says (issue 7): the default check raises, a trusted call
# (the humming root's) stays in bounds. Run under compute-sanitizer with
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 to see reads, not only writes (tools/sanitize.sh).


@pytest.mark.parametrize("sched", ["gcon-m16n128k64-w4-s4-c1", "gcon-m64n128k64-w8-s4-c1-wgmma"])
def test_contiguous_offsets_past_the_input_are_clamped(sched):
    e, n, k, m, guard = 4, 256, 512, 40, 8
    qe, pw = weights(e, n, k)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out_all = torch.full((m + guard, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out_all[:m]
    off = torch.tensor([0, 10, 25, 40, 4000], dtype=torch.int64, device="cuda")  # the last expert runs past x
    with pytest.raises(ValueError, match="at most x.shape\\[0\\]=40"):
        ops.gemm_contiguous_raw(x, pw.qweight, pw.scales, off, out, sched)
    ops.gemm_contiguous_raw(x, pw.qweight, pw.scales, off, out, sched, check_routing=False)
    torch.cuda.synchronize()
    assert torch.isnan(out_all[m:]).all(), "rows past the output were written"
    ref = reference.contiguous_gemm_ref(x, qe, None, torch.tensor([0, 10, 25, 40, 40], device="cuda"))
    assert rel_err(out, ref) < TOL
    bad = torch.tensor([-50, 10, 5, 30, 1 << 40], dtype=torch.int64, device="cuda")  # negative, falling, huge
    ops.gemm_contiguous_raw(x, pw.qweight, pw.scales, bad, out, sched, check_routing=False)
    torch.cuda.synchronize()  # no fault: the call's answer may be wrong, memory stays safe
    assert torch.isnan(out_all[m:]).all(), "rows past the output were written"


def test_masked_counts_past_max_rows_and_indexed_ids_out_of_range_stay_in_bounds():
    e, n, k, max_rows = 3, 256, 512, 7
    qe, pw = weights(e, n, k)
    x = torch.randn(e, max_rows, k, device="cuda").bfloat16()
    out = torch.full((e, max_rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    counts = torch.tensor([3, 100, -4], dtype=torch.int32, device="cuda")
    sched = "gmsk-m8n128k64-w4-s4-c1"
    with pytest.raises(ValueError, match="expert_num_tokens must lie in \\[0, max_rows=7\\]"):
        ops.gemm_masked_raw(x, pw.qweight, pw.scales, counts, out, sched)
    ops.gemm_masked_raw(x, pw.qweight, pw.scales, counts, out, sched, check_routing=False)
    torch.cuda.synchronize()
    ref = reference.masked_gemm_ref(x, qe, None, torch.tensor([3, 7, 0], dtype=torch.int32, device="cuda"))
    assert rel_err(out[0, :3], ref[0, :3]) < TOL and rel_err(out[1], ref[1]) < TOL
    assert torch.isnan(out[0, 3:]).all() and torch.isnan(out[2]).all()

    m, top_k, bm = 5, 2, 8
    xi = torch.randn(m, k, device="cuda").bfloat16()
    oi = torch.full((m * top_k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    sorted_ids = torch.tensor([0, 1, 10**6, -7, 3, 9, 2 ** 31 - 1, 4] + [m * top_k] * 8, dtype=torch.int32,
                              device="cuda")
    expert_ids = torch.tensor([1, 99], dtype=torch.int32, device="cuda")  # block 1: an expert that is not there
    ntp = torch.tensor([16], dtype=torch.int32, device="cuda")
    si = "idx-m8n128k64-w4-s4-c1"
    with pytest.raises(ValueError, match="must lie in"):
        ops.gemm_indexed_raw(xi, pw.qweight, pw.scales, sorted_ids, expert_ids, ntp, oi, top_k, bm, si)
    ops.gemm_indexed_raw(xi, pw.qweight, pw.scales, sorted_ids, expert_ids, ntp, oi, top_k, bm, si,
                         check_routing=False)
    torch.cuda.synchronize()
    written = [0, 1, 3, 9, 4]  # the in-range ids of block 0 (expert 1); the rest is padding or skipped
    rest = [r for r in range(m * top_k) if r not in written]
    assert torch.isnan(oi[rest]).all()
    ref = xi.float()[torch.tensor(written, device="cuda") // top_k] @ qe.dequantize()[1].t()
    assert rel_err(oi[written], ref) < TOL
