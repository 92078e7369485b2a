"""chord.reference: each reference op against dense per-expert float32 matmuls (CPU)."""

import pytest
import torch
import torch.nn.functional as Fn

from chord import formats as F
from chord import reference as ref
from chord import routing as R


def make_weights(e, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return F.quantize_int4_g32(torch.randn(e, n, k, generator=g) * 0.05)


def routing_ids(m, e, k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).int()


def test_gemm_ref():
    x, w = torch.randn(5, 64).bfloat16(), torch.randn(24, 64)
    out = ref.gemm_ref(x, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x.double().matmul(w.double().t()).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,e,k,bm,mode", [(1, 8, 2, 8, "none"), (13, 16, 4, 16, "none"), (40, 12, 3, 32, "map"), (9, 6, 2, 8, "map_ignore")])
def test_indexed_ref_equals_dense_per_expert(m, e, k, bm, mode):
    n_out, kdim = 32, 64
    qe = make_weights(e, n_out, kdim, seed=m + e)
    dense = qe.dequantize()
    topk = routing_ids(m, e, k, seed=m)
    emap = None
    if mode != "none":
        emap = torch.tensor([i // 2 if i % 2 == 0 else -1 for i in range(e)], dtype=torch.int32)
    ignore = mode == "map_ignore"
    # with an expert_map, expert_ids are local ids: the kernel holds only the local experts
    # (global expert 2i is local i, so dense[global] is still the expected weight)
    w_used = F.QuantizedExperts(qe.q[::2].contiguous(), qe.scales[::2].contiguous()) if emap is not None else qe
    x = torch.randn(m, kdim).bfloat16()
    r = R.align_block_size(topk, bm, e, emap, ignore_invalid_experts=ignore)
    out = ref.indexed_gemm_ref(x, w_used.q, w_used.scales, r, top_k=k)
    assert out.shape == (m * k, n_out) and out.dtype == torch.float32
    for t in range(m):
        for j in range(k):
            ge = int(topk[t, j])
            row = out[t * k + j]
            if emap is not None and int(emap[ge]) < 0:
                assert bool(row.isnan().all()), "non-local route must stay unwritten"
            else:
                torch.testing.assert_close(row, x[t].float() @ dense[ge].t(), rtol=1e-5, atol=1e-5)
    # QuantizedExperts form, and garbage past num_tokens_post_padded is never read
    total = int(r.num_tokens_post_padded)
    poisoned = R.IndexedRouting(
        sorted_ids=torch.where(torch.arange(r.sorted_ids.numel()) >= total, 0, r.sorted_ids),
        expert_ids=torch.where(torch.arange(r.expert_ids.numel()) * bm >= total, 0, r.expert_ids),
        num_tokens_post_padded=r.num_tokens_post_padded,
        block_m=bm,
        top_k=k,
        num_rows=m * k,
    )
    out2 = ref.indexed_gemm_ref(x, w_used, None, poisoned, top_k=k)
    assert torch.equal(out.isnan(), out2.isnan()) and torch.equal(out.nan_to_num(), out2.nan_to_num())


def test_indexed_ref_down_call_top_k_1():
    m, e, k, inter, hidden = 6, 8, 2, 64, 32
    w2 = make_weights(e, hidden, inter, seed=5)
    topk = routing_ids(m, e, k, seed=6)
    r = R.align_block_size(topk, 16, e)
    act = torch.randn(m * k, inter).bfloat16()
    out = ref.indexed_gemm_ref(act, w2.q, w2.scales, r, top_k=1)
    dense = w2.dequantize()
    for i in range(m * k):
        torch.testing.assert_close(out[i], act[i].float() @ dense[int(topk.flatten()[i])].t(), rtol=1e-5, atol=1e-5)
    bigger = ref.indexed_gemm_ref(act, w2, None, r, top_k=1, n_out_rows=m * k + 3)
    assert bool(bigger[m * k :].isnan().all())


def test_contiguous_and_masked_refs():
    m, e, k, n_out, kdim = 11, 6, 2, 32, 64
    qe = make_weights(e, n_out, kdim, seed=9)
    dense = qe.dequantize()
    topk = routing_ids(m, e, k, seed=10)
    x = torch.randn(m, kdim).bfloat16()
    lay = R.contiguous_layout(x, topk, e, alignment=4, static_rows=True)
    out = ref.contiguous_gemm_ref(lay.x, qe.q, qe.scales, lay.expert_offsets)
    off = lay.expert_offsets.tolist()
    for ex in range(e):
        torch.testing.assert_close(out[off[ex] : off[ex + 1]], lay.x[off[ex] : off[ex + 1]].float() @ dense[ex].t())
    assert bool(out[off[-1] :].isnan().all())

    mlay = R.masked_layout(x, topk, e, max_rows=8)
    mout = ref.masked_gemm_ref(mlay.x, qe, None, mlay.expert_num_tokens)
    for ex, c in enumerate(mlay.expert_num_tokens.tolist()):
        torch.testing.assert_close(mout[ex, :c], mlay.x[ex, :c].float() @ dense[ex].t())
        assert bool(mout[ex, c:].isnan().all())


def test_silu_and_mul_ref_layout():
    x = torch.randn(3, 10).bfloat16()
    out = ref.silu_and_mul_ref(x)
    assert out.shape == (3, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out, Fn.silu(x[:, :5].float()) * x[:, 5:].float())


def moe_loop(x, w13, w2, topk_weights, topk_ids, expert_map=None):
    d13, d2 = w13.dequantize().double(), w2.dequantize().double()
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if expert_map is not None:
                e = int(expert_map[e]) if e >= 0 else -1
            if e < 0:
                continue
            h = d13[e] @ x[t].double()
            inter = h.shape[0] // 2
            a = Fn.silu(h[:inter]) * h[inter:]
            out[t] += float(topk_weights[t, j]) * (d2[e] @ a)
    return out.float()


@pytest.mark.parametrize("use_map", [False, True])
def test_moe_ref_against_loop_and_composed_paths(use_map):
    m, e, k, hidden, inter = 9, 8, 3, 64, 32
    n_local = e // 2 if use_map else e
    w13 = make_weights(n_local, 2 * inter, hidden, seed=21)
    w2 = make_weights(n_local, hidden, inter, seed=22)
    topk = routing_ids(m, e, k, seed=23)
    emap = torch.tensor([i // 2 if i % 2 == 0 else -1 for i in range(e)], dtype=torch.int32) if use_map else None
    tw = torch.rand(m, k)
    x = torch.randn(m, hidden).bfloat16()
    out = ref.moe_ref(x, w13, w2, tw, topk, emap)
    assert out.dtype == torch.float32 and out.shape == (m, hidden)
    torch.testing.assert_close(out, moe_loop(x, w13, w2, tw, topk, emap), rtol=1e-5, atol=1e-6)

    # the indexed pipeline of chord.ops.fused_moe, built from references
    r = R.align_block_size(topk, 16, e, emap, ignore_invalid_experts=True)
    h = ref.indexed_gemm_ref(x, w13, None, r, top_k=k)
    act = ref.silu_and_mul_ref(h.nan_to_num())  # non-local rows are NaN; they get weight 0 below
    y = ref.indexed_gemm_ref(act, w2, None, r, top_k=1)
    ids = topk.long() if emap is None else emap.long()[topk.long()]
    y = torch.where((ids.reshape(-1, 1) >= 0), y, 0.0).view(m, k, hidden)
    torch.testing.assert_close((y * tw.unsqueeze(-1)).sum(1), out, rtol=1e-5, atol=1e-6)

    # grouped contiguous + unpermute
    lay = R.contiguous_layout(x, topk, e, emap, alignment=8)
    hc = ref.contiguous_gemm_ref(lay.x, w13, None, lay.expert_offsets)
    yc = ref.contiguous_gemm_ref(ref.silu_and_mul_ref(hc), w2, None, lay.expert_offsets)
    torch.testing.assert_close(R.unpermute_contiguous(yc, lay, tw, m), out, rtol=1e-5, atol=1e-6)

    # grouped masked + unpermute
    ml = R.masked_layout(x, topk, e, expert_map=emap)
    hm = ref.masked_gemm_ref(ml.x, w13, None, ml.expert_num_tokens)
    ym = ref.masked_gemm_ref(ref.silu_and_mul_ref(hm).nan_to_num(), w2, None, ml.expert_num_tokens)
    torch.testing.assert_close(R.unpermute_masked(ym, ml, tw, m), out, rtol=1e-5, atol=1e-6)

    # bf16 intermediates stay close to the float32 layer
    outb = ref.moe_ref(x, w13, w2, tw, topk, emap, bf16_intermediates=True)
    rel = (outb - out).norm() / out.norm()
    assert 0 < float(rel) < 1e-2


_qe = make_weights(2, 32, 64, seed=1)
_ids = torch.tensor([[0, 1]], dtype=torch.int32)
_r = R.align_block_size(_ids, 8, 2)
_x = torch.randn(1, 64)

ERRORS = [
    ("gemm x", lambda: ref.gemm_ref(_x.int(), torch.randn(4, 64)), TypeError, "'x'"),
    ("gemm K", lambda: ref.gemm_ref(_x, torch.randn(4, 32)), ValueError, "'w'"),
    ("indexed routing", lambda: ref.indexed_gemm_ref(_x, _qe, None, (1, 2), top_k=2), TypeError, "'routing'"),
    ("indexed top_k", lambda: ref.indexed_gemm_ref(_x, _qe, None, _r, top_k=0), ValueError, "'top_k'"),
    ("indexed K", lambda: ref.indexed_gemm_ref(torch.randn(1, 32), _qe, None, _r, top_k=2), ValueError, "'x'"),
    ("indexed out rows", lambda: ref.indexed_gemm_ref(_x, _qe, None, _r, top_k=2, n_out_rows=1), ValueError, "'n_out_rows'"),
    ("indexed scales", lambda: ref.indexed_gemm_ref(_x, _qe.q, None, _r, top_k=2), TypeError, "'scales'"),
    ("indexed both", lambda: ref.indexed_gemm_ref(_x, _qe, _qe.scales, _r, top_k=2), ValueError, "'scales'"),
    ("contiguous offsets dtype", lambda: ref.contiguous_gemm_ref(_x, _qe, None, torch.tensor([0, 1, 1], dtype=torch.int32)), TypeError, "'expert_offsets'"),
    ("contiguous offsets", lambda: ref.contiguous_gemm_ref(_x, _qe, None, torch.tensor([0, 2, 1])), ValueError, "'expert_offsets'"),
    ("masked counts", lambda: ref.masked_gemm_ref(torch.randn(2, 3, 64), _qe, None, torch.tensor([4, 0], dtype=torch.int32)), ValueError, "'expert_num_tokens'"),
    ("masked x", lambda: ref.masked_gemm_ref(torch.randn(3, 3, 64), _qe, None, torch.tensor([1, 0], dtype=torch.int32)), ValueError, "'x'"),
    ("silu odd", lambda: ref.silu_and_mul_ref(torch.randn(2, 5)), ValueError, "'x'"),
    ("moe w types", lambda: ref.moe_ref(_x, _qe.q, _qe, torch.ones(1, 2), _ids), TypeError, "'w13'"),
    ("moe w2 shape", lambda: ref.moe_ref(_x, make_weights(2, 64, 64, 2), _qe, torch.ones(1, 2), _ids), ValueError, "'w2'"),
    ("moe ids range", lambda: ref.moe_ref(_x, make_weights(2, 64, 64, 2), make_weights(2, 64, 32, 3), torch.ones(1, 2), _ids + 5), ValueError, "'topk_ids'"),
    ("moe weights shape", lambda: ref.moe_ref(_x, make_weights(2, 64, 64, 2), make_weights(2, 64, 32, 3), torch.ones(1, 3), _ids), ValueError, "'topk_weights'"),
]


@pytest.mark.parametrize("call,exc,needle", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(call, exc, needle):
    with pytest.raises(exc) as info:
        call()
    # "'name'": the argument the message must name, in chord.checks' form "<function>: <name> ..."
    want = f": {needle[1:-1]}" if needle.startswith("'") and needle.endswith("'") else needle
    assert want in str(info.value), (want, str(info.value))
