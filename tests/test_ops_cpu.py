"""Argument checking of the chord ops, on CPU: every bad input gets a clear error naming the
argument before any launch, and the fake (meta) implementations trace under FakeTensorMode."""
import pytest
import torch

from chord import formats as F
from torch._subclasses.fake_tensor import FakeTensorMode

import chord.ops  # noqa: F401  (registers torch.ops.chord.*)
from chord import ops
from chord.schedule import Schedule

E, N, K = 3, 256, 512


def weights(e=E, n=N, k=K):
    return (torch.zeros(F.packed_shapes(e, n, k)[0], dtype=torch.int32),
            torch.ones(F.packed_shapes(e, n, k)[1], dtype=torch.bfloat16))


def indexed_args(**over):
    qw, sc = weights()
    m, top_k, bm = 5, 2, 8
    # consistent routing: the 10 routes in expert 0's two blocks (the second padded), then padding
    sorted_ids = torch.full((64,), m * top_k, dtype=torch.int32)
    sorted_ids[:m * top_k] = torch.arange(m * top_k, dtype=torch.int32)
    a = dict(x=torch.randn(m, K).bfloat16(), qweight=qw, scales=sc, sorted_ids=sorted_ids,
             expert_ids=torch.zeros(8, dtype=torch.int32),
             num_tokens_post_padded=torch.tensor([16], dtype=torch.int32),
             out=torch.empty(m * top_k, N, dtype=torch.bfloat16), top_k=top_k, block_m=bm,
             schedule=Schedule("indexed", bm, 128, 4, 4, 1).id)
    a.update(over)
    return a


def call_indexed(a):
    torch.ops.chord.gemm_indexed(a["x"], a["qweight"], a["scales"], a["sorted_ids"], a["expert_ids"],
                                 a["num_tokens_post_padded"], a["out"], a["top_k"], a["block_m"], a["schedule"])


@pytest.mark.parametrize("over,exc,msg", [
    (dict(x=torch.randn(5, K)), TypeError, "x must have dtype bfloat16"),
    (dict(x=torch.randn(5, 256).bfloat16()), ValueError, "x must have K=512"),
    (dict(x=torch.randn(K, 5).bfloat16().t()), ValueError, "x must be contiguous"),
    (dict(qweight=torch.zeros(3, 2, 8, 8, 32, 2, dtype=torch.int32)), ValueError, "qweight must have the swap16g"),
    (dict(qweight=torch.zeros(3, 5, 8, 3, 32, 4, dtype=torch.int32)), ValueError, "qweight must have the swap16g"),
    (dict(qweight=torch.zeros(3, 4, 8, 4, 32, 4, dtype=torch.int32)), ValueError, "scales must have shape"),
    (dict(qweight=torch.zeros(3, 16, 8, 32, 4, dtype=torch.int32)), ValueError, "qweight must be 6-D"),
    (dict(qweight=torch.zeros(3, 2, 8, 8, 32, 4, dtype=torch.int64)), TypeError, "qweight must have dtype int32"),
    (dict(scales=torch.ones(3, 2, 8, 8, 8, 2, 2, dtype=torch.float16)), TypeError, "scales must have dtype bfloat16"),
    (dict(scales=torch.ones(3, 2, 4, 8, 8, 2, 2, dtype=torch.bfloat16)), ValueError, "scales must have shape"),
    (dict(out=torch.empty(10, 128, dtype=torch.bfloat16)), ValueError, "out must have N=256"),
    (dict(out=torch.empty(4, N, dtype=torch.bfloat16)), ValueError, "out must have at least"),
    (dict(sorted_ids=torch.zeros(64, dtype=torch.int64)), TypeError, "sorted_ids must have dtype int32"),
    (dict(expert_ids=torch.zeros(2, dtype=torch.int32)), ValueError, "expert_ids must hold one entry per block"),
    (dict(num_tokens_post_padded=torch.tensor(8, dtype=torch.int32)), ValueError, "num_tokens_post_padded must be 1-D"),
    (dict(top_k=0), ValueError, "top_k"),
    (dict(block_m=16), ValueError, "block_m=16"),
    (dict(schedule="gmsk-m8n128k64-w4-s4-c1"), ValueError, "for family grouped_masked"),
    (dict(schedule="idx-m8n512k64-w4-s4-c1"), ValueError, "does not divide N"),
    (dict(schedule="idx-m8n128k64-w4-s4-c1-nt4"), ValueError, "block_n=128 x n_tiles=4 does not divide N=256"),
    (dict(schedule="idx-m8n128k64-w4-s4-c1-nt3"), ValueError, "n_tiles must be one of"),
    (dict(schedule="idx-m8n64k64-w4-s8-c1-sk4-nt2"), ValueError, "n_tiles=2 needs split_k=1"),
    (dict(schedule="idx-m8n128k64-w4-s12-c1-wgmma-ps1"), ValueError, "persistent=1 keeps the ring at most one tile"),
    (dict(schedule="idx-m8n128k64-w4-s4-c1-ps1"), ValueError, "persistent=1 needs mainloop wgmma"),
    (dict(schedule="idx-m8n64k64-w4-s8-c1-sk4-stm0"), ValueError, "stmatrix applies to unsplit tiles only"),
    (dict(schedule="idx-m8n256k64-w4-s4-c1-cn2"), ValueError, "cluster_n=2 pairs neighbouring N blocks, so N / block_n = 1"),
    (dict(schedule="idx-m64n128k64-w8-s4-c1-wgmma-tx1"), ValueError, "tma_x=1 needs a grouped family"),
    (dict(schedule="idx-m64n64k64-w4-s4-c1-wgmma-bw1"), ValueError, "bulk_w=1 copies whole groups of 8 weight tiles"),
    (dict(schedule="idx-m8n128k64-w4-s4-c1-bw1"), ValueError, "bulk_w=1 needs mainloop wgmma"),
    (dict(schedule="idx-m8n256k64-w4-s12-c1-stk1"), ValueError, "stream_k=1 keeps two token blocks' rows"),
    (dict(schedule="idx-m8n128k64-w4-s4-c1-sk2-stk1"), ValueError, "stream_k=1 needs the indexed family on mainloop mma"),
    (dict(schedule="fast"), ValueError, "schedule id"),
])
def test_indexed_bad_input(over, exc, msg):
    with pytest.raises(exc, match=msg):
        call_indexed(indexed_args(**over))


def test_cpu_tensors_are_refused_clearly():
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        call_indexed(indexed_args())


def test_contiguous_and_masked_bad_input():
    qw, sc = weights()
    x = torch.randn(20, K).bfloat16()
    out = torch.empty(20, N, dtype=torch.bfloat16)
    s = Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id
    with pytest.raises(TypeError, match="expert_offsets must have dtype int64"):
        torch.ops.chord.gemm_contiguous(x, qw, sc, torch.zeros(E + 1, dtype=torch.int32), out, s)
    with pytest.raises(ValueError, match="expert_offsets must have E\\+1=4"):
        torch.ops.chord.gemm_contiguous(x, qw, sc, torch.zeros(E, dtype=torch.int64), out, s)
    m = Schedule("grouped_masked", 16, 128, 4, 4, 1).id
    xm = torch.randn(E, 7, K).bfloat16()
    om = torch.empty(E, 7, N, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="expert_num_tokens must have E=3"):
        torch.ops.chord.gemm_masked(xm, qw, sc, torch.zeros(4, dtype=torch.int32), om, m)
    with pytest.raises(ValueError, match="x must be \\[E=3"):
        torch.ops.chord.gemm_masked(torch.randn(2, 7, K).bfloat16(), qw, sc, torch.zeros(3, dtype=torch.int32), om, m)
    with pytest.raises(ValueError, match="out must hold"):
        torch.ops.chord.gemm_masked(xm, qw, sc, torch.zeros(3, dtype=torch.int32), om[:, :5].contiguous(), m)


def test_fake_impls_trace():
    with FakeTensorMode():
        a = indexed_args()
        a = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
        call_indexed(a)  # fake impl: validation only, no launch
        with pytest.raises(ValueError, match="block_m"):
            call_indexed(dict(a, block_m=16))


def _on_meta(a: dict) -> dict:
    return {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in a.items()}


def test_overlap_check_on_meta_tensors():
    """Meta tensors have no memory (data_ptr() is 0, or raises): they are never reported as
    overlapping. Before, two meta tensors both "started at 0" and every meta call was refused
    with "out must not overlap x"."""
    x, out = torch.empty(5, K, device="meta"), torch.empty(10, N, device="meta")
    assert not ops._overlaps(out, x) and not ops._overlaps(x, x)
    buf = torch.empty(64)
    assert ops._overlaps(buf[8:], buf[:16]) and not ops._overlaps(buf[16:], buf[:16])
    assert not ops._overlaps(buf[4:4], buf)  # an empty view writes nothing


@pytest.mark.parametrize("check", [None, True, False])
def test_meta_calls_validate_then_need_a_gpu(check, routing_check):
    """A call on meta tensors runs every argument check, reads no routing values (there are
    none) and ends in the clear device refusal; through the dispatcher the fake impl accepts it."""
    a = _on_meta(indexed_args())
    names = ("x", "qweight", "scales", "sorted_ids", "expert_ids", "num_tokens_post_padded", "out", "top_k",
             "block_m", "schedule")
    with pytest.raises(ValueError, match="^x must be a CUDA tensor .* got device meta"):
        ops.gemm_indexed_raw(*[a[k] for k in names], check_routing=check)
    call_indexed(a)  # the Meta kernel of the custom op is the fake impl: validation only
    with pytest.raises(ValueError, match="block_m"):
        call_indexed(dict(a, block_m=16))
    qw, sc = (t.to("meta") for t in weights())
    x, out = torch.empty(9, K, device="meta", dtype=torch.bfloat16), torch.empty(9, N, device="meta", dtype=torch.bfloat16)
    off = torch.tensor([0, 3, 3, 9]).to("meta")
    with pytest.raises(ValueError, match="^x must be a CUDA tensor"):
        ops.gemm_contiguous_raw(x, qw, sc, off, out, Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id,
                                check_routing=check)
    xm, om = torch.empty(E, 4, K, device="meta", dtype=torch.bfloat16), torch.empty(E, 4, N, device="meta",
                                                                                       dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^x must be a CUDA tensor"):
        ops.gemm_masked_raw(xm, qw, sc, torch.tensor([1, 0, 4], dtype=torch.int32).to("meta"), om,
                            Schedule("grouped_masked", 8, 128, 4, 4, 1).id, check_routing=check)


def test_routing_values_are_checked_by_default(monkeypatch):
    from chord._env import flag

    monkeypatch.delenv("CHORD_CHECK_ROUTING", raising=False)
    assert flag("CHORD_CHECK_ROUTING", default=True) is True
    monkeypatch.setenv("CHORD_CHECK_ROUTING", "off")
    assert flag("CHORD_CHECK_ROUTING", default=True) is False
    assert chord.ops._check_routing is True  # the suite runs with the switch unset


def test_trusted_calls_skip_the_routing_read(routing_check):
    """check_routing=False (the humming root's calls) goes straight to the launch checks."""
    a = indexed_args(expert_ids=torch.full((8,), 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="expert_ids must lie"):
        chord.ops.gemm_indexed_raw(*[a[k] for k in ("x", "qweight", "scales", "sorted_ids", "expert_ids",
                                                    "num_tokens_post_padded", "out", "top_k", "block_m",
                                                    "schedule")])
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        chord.ops.gemm_indexed_raw(*[a[k] for k in ("x", "qweight", "scales", "sorted_ids", "expert_ids",
                                                    "num_tokens_post_padded", "out", "top_k", "block_m",
                                                    "schedule")], check_routing=False)
    with pytest.raises(TypeError, match="check_routing must be None or a bool"):
        chord.ops.gemm_indexed_raw(*[a[k] for k in ("x", "qweight", "scales", "sorted_ids", "expert_ids",
                                                    "num_tokens_post_padded", "out", "top_k", "block_m",
                                                    "schedule")], check_routing=0)
    with pytest.raises(TypeError, match="on must be a bool"):
        chord.ops.check_routing("yes")


def test_the_humming_root_trusts_vllm_routing():
    from humming import _chord

    assert all(f.keywords == {"check_routing": False} for f in _chord._raw_ops())


@pytest.mark.parametrize("over,msg", [
    (dict(expert_ids=torch.full((8,), 3, dtype=torch.int32)), "expert_ids must lie in \\[-1, 3\\)"),
    (dict(num_tokens_post_padded=torch.tensor([12], dtype=torch.int32)), "multiple of block_m=8"),
    (dict(num_tokens_post_padded=torch.tensor([72], dtype=torch.int32)), "in \\[0, 64\\]"),
    (dict(sorted_ids=torch.full((64,), 11, dtype=torch.int32)), "sorted_ids must lie in \\[0, 10\\]"),
])
def test_routing_values_checked_on_request(routing_check, over, msg):
    """CHORD_CHECK_ROUTING (on by default): out-of-range device routing raises instead of leaving rows unwritten."""
    with pytest.raises(ValueError, match=msg):
        call_indexed(indexed_args(**over))


def test_routing_values_pass_reach_the_device_check(routing_check):
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        call_indexed(indexed_args())


def test_grouped_routing_values_checked_on_request(routing_check):
    qw, sc = weights()
    x = torch.randn(20, K).bfloat16()
    out = torch.empty(20, N, dtype=torch.bfloat16)
    s = Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id
    with pytest.raises(ValueError, match="expert_offsets must rise"):
        torch.ops.chord.gemm_contiguous(x, qw, sc, torch.tensor([0, 5, 3, 9]), out, s)
    with pytest.raises(ValueError, match="at most x.shape\\[0\\]=20"):
        torch.ops.chord.gemm_contiguous(x, qw, sc, torch.tensor([0, 5, 9, 21]), out, s)
    m = Schedule("grouped_masked", 16, 128, 4, 4, 1).id
    xm = torch.randn(E, 7, K).bfloat16()
    om = torch.empty(E, 7, N, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="expert_num_tokens must lie in \\[0, max_rows=7\\]"):
        torch.ops.chord.gemm_masked(xm, qw, sc, torch.tensor([1, 8, 0], dtype=torch.int32), om, m)


# ---- silent wrong answers that are now errors (issue 7) ---------------------------------------


def _small():
    from chord import formats, routing

    torch.manual_seed(0)
    q = torch.randint(-8, 8, (4, 128, 128), dtype=torch.int8)
    s = (torch.rand(4, 128, 4) * 0.01 + 0.001).to(torch.bfloat16)
    w = formats.pack_experts(formats.QuantizedExperts(q, s))
    ids = routing.random_topk_ids(6, 4, 2, seed=0)
    return w, routing.align_block_size(ids, 16, 4), ids


def test_indexed_top_k_must_match_the_routing():
    w, r, _ = _small()
    x = torch.randn(6, 128).bfloat16()
    with pytest.raises(ValueError, match="routed rows"):
        ops.gemm_indexed(x, w, r, top_k=3, out=torch.empty(18, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="routed rows"):  # down-style call with the token rows
        ops.gemm_indexed(x, w, r, top_k=1, out=torch.empty(12, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        ops.gemm_indexed(x, w, r, top_k=True)


@pytest.mark.parametrize("family", ["indexed", "grouped_contiguous"])
def test_out_aliasing_the_input_is_refused(family):
    w, r, ids = _small()
    buf = torch.randn(12, 128).bfloat16()
    if family == "indexed":
        with pytest.raises(ValueError, match="out must not overlap x"):
            ops.gemm_indexed(buf, w, r, top_k=1, out=buf, schedule=Schedule("indexed", 16, 128, 4, 4, 1))
    else:
        off = torch.tensor([0, 3, 6, 9, 12], dtype=torch.int64)
        with pytest.raises(ValueError, match="out must not overlap x"):
            ops.gemm_contiguous(buf, w, off, out=buf[2:], schedule=Schedule("grouped_contiguous", 16, 128, 4, 4, 1))


def test_fused_moe_needs_one_hidden_row_per_token():
    w13, _, ids = _small()
    from chord import formats

    q2 = torch.randint(-8, 8, (4, 128, 64), dtype=torch.int8)
    s2 = (torch.rand(4, 128, 2) * 0.01 + 0.001).to(torch.bfloat16)
    w2 = formats.pack_experts(formats.QuantizedExperts(q2, s2))
    with pytest.raises(ValueError, match="one row per topk_ids row"):
        ops.fused_moe(torch.randn(5, 128).bfloat16(), w13, w2, torch.rand(6, 2), ids)


def test_validation_memo_keeps_every_check():
    """The per-signature validation memo (host time, issue 6) never lets a call skip a check:
    metadata that differs is validated again, and aliasing (pointer-dependent) is checked on
    every call."""
    a = indexed_args()
    for _ in range(2):  # the second call hits the memo
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            call_indexed(a)
    m, top_k = a["x"].shape[0], a["top_k"]
    buf = torch.empty(m * top_k * N + m * K, dtype=torch.bfloat16)
    aliased = dict(a, x=buf[:m * K].view(m, K), out=buf[:m * top_k * N].view(m * top_k, N))
    with pytest.raises(ValueError, match="out must not overlap x"):
        call_indexed(aliased)
    strided = dict(a, x=torch.randn(m, 2 * K).bfloat16()[:, :K])
    with pytest.raises(ValueError, match="x must be contiguous"):
        call_indexed(strided)
    names = ("x", "qweight", "scales", "sorted_ids", "expert_ids", "num_tokens_post_padded", "out", "top_k",
             "block_m", "schedule")
    with pytest.raises(ValueError, match="top_k must be a positive int"):  # True == 1, but not for the memo
        chord.ops.gemm_indexed_raw(*[dict(a, top_k=True)[k] for k in names])


def test_weights_carry_their_tile_group(monkeypatch):
    """Weights packed with a lower tile-group cap (CHORD_TILE_GROUP, the layout's ablation) are valid
    and get the kernel built for their G; a G that is not a power of two <= 8 is refused."""
    from chord import formats

    q = torch.zeros(2, 256, 128, dtype=torch.int8)
    s = torch.ones(2, 256, 4, dtype=torch.bfloat16)
    assert formats.pack_experts(q, s).qweight.shape[3] == 8
    for cap in ("1", "2", "4"):
        monkeypatch.setenv("CHORD_TILE_GROUP", cap)
        p = formats.pack_experts(q, s)
        assert p.qweight.shape == (2, 16 // int(cap), 2, int(cap), 32, 4)
        assert ops._tile_group_cap(p.qweight, 256) == int(cap)
        assert torch.equal(formats.unpack_experts(p).q, q)
    monkeypatch.delenv("CHORD_TILE_GROUP")
    # N = 48: three tiles, G = 1 by N alone: the default kernels serve it
    p48 = formats.pack_experts(torch.zeros(1, 48, 64, dtype=torch.int8), torch.ones(1, 48, 2, dtype=torch.bfloat16))
    assert p48.qweight.shape[3] == 1 and ops._tile_group_cap(p48.qweight, 48) == 8
    monkeypatch.setenv("CHORD_TILE_GROUP", "3")
    with pytest.raises(ValueError, match="CHORD_TILE_GROUP='3'"):
        formats.pack_experts(q, s)
    monkeypatch.delenv("CHORD_TILE_GROUP")
    with pytest.raises(ValueError, match="qweight must have the swap16g layout"):
        call_indexed(indexed_args(qweight=torch.zeros(3, 16, 8, 1, 32, 4, dtype=torch.int32)[:, :5].repeat(1, 1, 1, 3, 1, 1)
                                  .contiguous()))


def test_stream_k_refuses_buffers_of_2_31_units_before_any_launch():
    """csrc/moe/stream_k.cuh plans in 32-bit units: routing buffers that allow 2^31 (blocks x N
    blocks x K blocks) are refused by name at validation (the fake impl too), not wrapped around."""
    blocks = 2**31 // ((N // 64) * (K // 64))  # exactly 2^31 units with block_n 64
    a = _on_meta(indexed_args(schedule="idx-m8n64k64-w4-s8-c1-stk1"))
    a.update(sorted_ids=torch.empty(blocks * 8, dtype=torch.int32, device="meta"),
             expert_ids=torch.empty(blocks, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="stream_k=1 plans at most 2\\^31 - 1 units"):
        call_indexed(a)
    a.update(sorted_ids=torch.empty((blocks - 1) * 8, dtype=torch.int32, device="meta"),
             expert_ids=torch.empty(blocks - 1, dtype=torch.int32, device="meta"))
    call_indexed(a)  # one block fewer: accepted (validation only on meta)


def test_a_capturing_stream_takes_a_spare_split_k_pair(monkeypatch):
    """Split-K counters must be zero before a kernel's first use. A stream capturing a CUDA graph
    gets a zeroed spare made by an earlier eager allocation (zeroing there would record a memset
    into the graph); without a spare it zeroes its own (inside the graph: correct, slower)."""
    capturing = {"on": False}
    stream = {"id": 11}
    monkeypatch.setattr(ops, "_split_ws", {})
    monkeypatch.setattr(ops, "_split_spares", {})
    monkeypatch.setattr(ops, "_split_ws_old", [])
    monkeypatch.setattr(ops, "_raw_stream", lambda dev: stream["id"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    cpu = torch.device("cpu")
    ops._split_buffers(cpu, 1000, 10)  # eager: its own pair and one spare of that size
    assert set(ops._split_ws) == {(0, 11)} and len(ops._split_spares[0]) == 1
    spare = ops._split_spares[0][0]
    assert spare[1].numel() >= 10 and not spare[1].any()
    ops._split_buffers(cpu, 1000, 10)  # the same stream again: nothing new
    assert len(ops._split_spares[0]) == 1
    stream["id"] = 12
    ops._split_buffers(cpu, 200000, 10)  # a larger request: a second spare, of its size
    assert len(ops._split_spares[0]) == 2
    big = ops._split_spares[0][1]
    capturing["on"], stream["id"] = True, 21
    ops._split_buffers(cpu, 200000, 10)  # the second spare is the one that fits
    got = ops._split_ws[(0, 21)]
    assert got[0] is big[0] and len(ops._split_spares[0]) == 1
    stream["id"] = 22
    ops._split_buffers(cpu, 1000, 10)
    got = ops._split_ws[(0, 22)]
    assert got[0] is spare[0] and got[1] is spare[1] and not ops._split_spares[0]  # no zeroing while capturing
    stream["id"] = 33
    ops._split_buffers(cpu, 1000, 10)  # no spare left: a pair of its own
    ws, cnt = ops._split_ws[(0, 33)]
    assert ws is not spare[0] and not cnt.any() and not ops._split_spares[0]
    capturing["on"], stream["id"] = False, 11
    ops._split_buffers(cpu, 1 << 30, 10)  # over the spare limit: grows, keeps no spare that large
    assert all(p[0].numel() < (1 << 30) for p in ops._split_spares[0])


def test_reserve_workspace_sizes_what_the_largest_call_of_its_range_asks_for(monkeypatch):
    """Load time (humming.tune.get_heuristics_config): the split-K buffers of a row up to its
    max rows are allocated ahead, as large as the largest call of the range asks for (the grid
    the op launches for vLLM's sorted_ids of that many routes), so no call in range allocates."""
    from chord import routing

    asked = []
    monkeypatch.setattr(ops, "_split_buffers", lambda dev, floats, tiles: asked.append((dev, floats, tiles)) or (1, 2))
    monkeypatch.setattr(ops, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    s = Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk8")
    e, n = 384, 512
    got = ops.reserve_workspace(s, n, 31, e, device="cuda:0")
    (dev, floats, tiles), = asked
    assert dev == torch.device("cuda:0") and got == (floats + tiles) * 4
    for routes in (1, 8, 16, 31):  # what the op asks for at each size of the range (its grid: sorted_ids // block_m)
        blocks = routing.sorted_ids_capacity(routes, 8, e) // 8
        need = ops._split_need(s, blocks, s.grid_n(n))
        assert need[0] <= floats and need[1] <= tiles, routes
    assert (floats, tiles) == ops._split_need(s, routing.sorted_ids_capacity(31, 8, e) // 8, s.grid_n(n))
    # contiguous: the per-expert tile bound; masked: every expert's tiles; stream-K: one wave of CTAs
    asked.clear()
    sc = Schedule("grouped_contiguous", 16, 128, 4, 4, 1, split_k=4)
    ops.reserve_workspace(sc, 1024, 100, 8, device="cuda:0")
    assert asked[-1][1:] == ops._split_need(sc, -(-100 // 16) + 8, 1024 // 128)
    sm = Schedule("grouped_masked", 16, 128, 4, 4, 1, split_k=2)
    ops.reserve_workspace(sm, 1024, 40, 8, device="cuda:0")
    assert asked[-1][1:] == ops._split_need(sm, 8 * 3, 1024 // 128)
    sk = Schedule.from_id("idx-m8n64k64-w4-s8-c1-stk1")
    ops.reserve_workspace(sk, n, 31, e, device="cuda:0")
    assert asked[-1][1] == 132 * sk.ctas_per_sm * 2 * 8 * 64
    # no split, no rows: nothing reserved, no device touched
    asked.clear()
    assert ops.reserve_workspace("idx-m8n64k64-w4-s8-c1", n, 31, e) == 0
    assert ops.reserve_workspace(s, n, 0, e) == 0 and not asked


def test_reserve_workspace_refuses_bad_arguments_by_name(monkeypatch):
    s = "idx-m8n64k64-w4-s8-c1-sk8"
    for kw, word in ((dict(schedule=3), "schedule"), (dict(n=0), "n"), (dict(rows=-1), "rows"),
                     (dict(rows=1.5), "rows"), (dict(num_experts=0), "num_experts"),
                     (dict(routed_experts=0), "routed_experts"), (dict(device="cpu"), "device")):
        args = dict(schedule=s, n=512, rows=8, num_experts=384)
        args.update(kw)
        with pytest.raises((ValueError, TypeError), match=word):
            ops.reserve_workspace(**args)
    with pytest.raises(ValueError, match="limit 256 MiB"):  # bounded, as the call itself is
        monkeypatch.setattr(ops, "_sm_count", lambda dev: 132)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        ops.reserve_workspace(s, 7168 * 8, 1 << 20, 384, device="cuda:0")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="captures a CUDA graph"):
        ops.reserve_workspace(s, 512, 8, 384, device="cuda:0")
