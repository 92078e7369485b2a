"""Programmatic dependent launch (`pdl` knob, id token `pd1`) and its weight prefetch before the
wait (`pdl_prefetch`, `pf1`) on the H200.

* every family and main loop (mma, wgmma multistage and with the producer, split-K, n_tiles,
  persistent, TMA + CTA pairs): the same bits as the schedule without it, and the reference;
* a chain in which each GEMM reads the previous one's output and overwrites the buffer the one
  before it read (read-after-write and write-after-read on the stream), with a torch kernel
  between the pairs (a primary that never triggers): bit-identical to the chain without PDL,
  eager and as a CUDA graph replayed with new inputs;
* pf1: the same bits as pd1 alone on every family and main loop, also where the kernel just
  before it rewrites the routing the prefetch guesses from (moe_align's kernels for the indexed
  family, the expert counts for the masked one), and in the chain above.
"""
from __future__ import annotations

import pytest
import torch

from chord import ops, optimizations, reference, routing
from chord.schedule import Schedule
from chord.testing import BF16_TOL, cached_random_experts, rel_err

from test_optimizations_gpu import check_same_bits  # tests/gpu is on sys.path (pytest rootdir-relative "prepend" imports)

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

PDL = optimizations.BY_NAME["programmatic dependent launch"]
PF = optimizations.BY_NAME["PDL weight prefetch"]

PDL_PAIRS = [  # (pdl on, off), written out so tools/device_cache.py finds every id
    ("idx-m8n256k64-w4-s8-c1-pd1", "idx-m8n256k64-w4-s8-c1"),
    ("idx-m8n64k64-w4-s6-c1-sk4-pd1", "idx-m8n64k64-w4-s6-c1-sk4"),
    ("idx-m32n128k64-w8-s8-c1-wgmma-pd1", "idx-m32n128k64-w8-s8-c1-wgmma"),
    ("idx-m64n128k64-w8-s4-c1-wgmma-ws1-pd1", "idx-m64n128k64-w8-s4-c1-wgmma-ws1"),
    ("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-pd1", "idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4"),
    ("idx-m64n128k64-w8-s4-c1-wgmma-ps1-pd1", "idx-m64n128k64-w8-s4-c1-wgmma-ps1"),
    ("gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2-pd1", "gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2"),
    ("gcon-m16n128k64-w4-s4-c1-pd1", "gcon-m16n128k64-w4-s4-c1"),
    ("gcon-m64n256k64-w8-s4-c1-sk3-wgmma-gs2-pd1", "gcon-m64n256k64-w8-s4-c1-sk3-wgmma-gs2"),
    ("gmsk-m8n128k64-w4-s8-c1-pd1", "gmsk-m8n128k64-w4-s8-c1"),
    ("gmsk-m32n128k64-w8-s8-c1-wgmma-cn2-pd1", "gmsk-m32n128k64-w8-s8-c1-wgmma-cn2"),
    ("gmsk-m48n128k64-w8-s4-c1-wgmma-r4-bw1-tx1-cn2-pd1", "gmsk-m48n128k64-w8-s4-c1-wgmma-r4-bw1-tx1-cn2"),
]


PF_PAIRS = [  # (prefetch on, pd1 alone)
    ("idx-m8n64k64-w4-s8-c1-pd1-pf1", "idx-m8n64k64-w4-s8-c1-pd1"),
    ("idx-m8n64k64-w4-s8-c1-sk8-pd1-pf1", "idx-m8n64k64-w4-s8-c1-sk8-pd1"),
    ("idx-m8n256k64-w4-s6-c1-pd1-pf1", "idx-m8n256k64-w4-s6-c1-pd1"),
    ("idx-m8n128k64-w4-s8-c1-ws1-pd1-pf1", "idx-m8n128k64-w4-s8-c1-ws1-pd1"),
    ("idx-m32n128k64-w8-s8-c1-wgmma-pd1-pf1", "idx-m32n128k64-w8-s8-c1-wgmma-pd1"),
    ("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-pd1-pf1", "idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-pd1"),
    ("gcon-m16n128k64-w4-s4-c1-pd1-pf1", "gcon-m16n128k64-w4-s4-c1-pd1"),
    ("gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2-pd1-pf1", "gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2-pd1"),
    ("gmsk-m8n128k64-w4-s8-c1-pd1-pf1", "gmsk-m8n128k64-w4-s8-c1-pd1"),
    ("gmsk-m8n64k64-w4-s8-c2-sk4-pd1-pf1", "gmsk-m8n64k64-w4-s8-c2-sk4-pd1"),
    ("gmsk-m48n128k64-w8-s4-c1-wgmma-r4-bw1-tx1-cn2-pd1-pf1", "gmsk-m48n128k64-w8-s4-c1-wgmma-r4-bw1-tx1-cn2-pd1"),
    # warp-private rings: each warp copies its first stages into shared memory before the wait
    ("idx-m8n128k64-w4-s2-c1-pd1-pf1-dr1", "idx-m8n128k64-w4-s2-c1-pd1-dr1"),
    ("idx-m8n32k64-w8-s8-c1-pd1-pf1-fo1-dr1", "idx-m8n32k64-w8-s8-c1-pd1-fo1-dr1"),
    ("gcon-m16n32k64-w4-s3-c1-pd1-pf1-dr1", "gcon-m16n32k64-w4-s3-c1-pd1-dr1"),
    ("gmsk-m8n64k64-w8-s4-c1-sk2-pd1-pf1-dr1", "gmsk-m8n64k64-w8-s4-c1-sk2-pd1-dr1"),
]


@pytest.mark.parametrize("pair", PF_PAIRS, ids=lambda p: p[0])
def test_pdl_prefetch_same_bits(pair):
    on, off = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    assert PF.is_on(on) and PF.switch_off(on) == off and PDL.switch_off(on) == PDL.switch_off(off)
    check_same_bits(on, off, seed=10)


@pytest.mark.parametrize("pair", PDL_PAIRS, ids=lambda p: p[0])
def test_pdl_same_bits(pair):
    on, off = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    assert on.pdl == 1 and PDL.is_on(on) and PDL.switch_off(on) == off
    check_same_bits(on, off, seed=9)


def _chain(s1: Schedule, s2: Schedule, w1, w2, a, b, off, steps: int) -> None:
    """steps x (b = a @ w1; a = b @ w2; a /= max(|a|, 1)): each GEMM reads what the previous
    kernel wrote (RAW) and writes what the kernel before it read (WAR); the normalisation is two
    torch kernels between the pairs."""
    for _ in range(steps):
        ops.gemm_contiguous(a, w1, off, out=b, schedule=s1, check_routing=False)
        ops.gemm_contiguous(b, w2, off, out=a, schedule=s2, check_routing=False)
        a.div_(a.abs().amax().clamp(min=1.0))


@pytest.mark.parametrize("ids", [  # (first GEMM, second GEMM) of the chain, each with pd1 (and without)
    ("gcon-m16n128k64-w4-s4-c1-pd1", "gcon-m16n128k64-w4-s4-c1-pd1"),
    ("gcon-m16n128k64-w4-s4-c1-pd1-pf1", "gcon-m16n64k64-w4-s6-c1-sk4-pd1-pf1"),
    ("gcon-m64n128k64-w8-s4-c1-wgmma-tx1-cn2-pd1", "gcon-m32n128k64-w8-s8-c1-wgmma-pd1"),
    ("gcon-m16n64k64-w4-s6-c1-sk4-pd1", "gcon-m16n128k64-w4-s4-c1-nt2-pd1"),
    ("gcon-m16n32k64-w4-s3-c1-pd1-pf1-dr1", "gcon-m16n128k64-w4-s2-c1-pd1-pf1-dr1")], ids=lambda p: p[0])
def test_pdl_chain_raw_and_war_eager_and_graph(ids):
    e, d = 4, 512
    _, w1 = cached_random_experts(e, d, d, seed=1)
    _, w2 = cached_random_experts(e, d, d, seed=2)
    counts = [40, 0, 77, 11]
    off = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int64, device="cuda")
    rows = sum(counts)
    x0 = torch.randn(rows, d, device="cuda").bfloat16()
    with_pdl = [Schedule.from_id(i) for i in ids]
    base = [PDL.switch_off(s) for s in with_pdl]
    assert all(s.pdl == 1 for s in with_pdl) and all(s.pdl == 0 and s.pdl_prefetch == 0 for s in base)
    results = {}
    for name, (s1, s2) in (("off", base), ("on", with_pdl)):
        a, b = x0.clone(), torch.empty(rows, d, dtype=torch.bfloat16, device="cuda")
        _chain(s1, s2, w1, w2, a, b, off, steps=6)
        torch.cuda.synchronize()
        results[name] = a
    assert torch.isfinite(results["off"].float()).all() and results["off"].abs().amax() > 0.01
    assert torch.equal(results["on"].view(torch.int16), results["off"].view(torch.int16)), ids
    # the same chain captured once and replayed with new inputs: programmatic edges in the graph
    a, b = torch.empty_like(x0), torch.empty(rows, d, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        a.copy_(x0)
        _chain(*with_pdl, w1, w2, a, b, off, steps=2)  # warm: kernels loaded, tensor maps cached
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _chain(*with_pdl, w1, w2, a, b, off, steps=3)
    for seed in (3, 4):
        xs = torch.randn(rows, d, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)).bfloat16()
        a.copy_(xs)
        g.replay()
        ea, eb = xs.clone(), torch.empty_like(b)
        _chain(*base, w1, w2, ea, eb, off, steps=3)
        torch.cuda.synchronize()
        assert torch.equal(a.view(torch.int16), ea.view(torch.int16)), (ids, seed)


@pytest.mark.parametrize("on_id", ["idx-m8n256k64-w4-s8-c1-pd1", "idx-m8n256k64-w4-s8-c1-pd1-pf1",
                                   "idx-m8n64k64-w4-s8-c1-sk8-pd1-pf1", "idx-m8n64k64-w8-s4-c1-pd1-pf1-dr1",
                                   "idx-m8n32k64-w8-s8-c1-sk2-pd1-pf1-dr1"])
def test_pdl_indexed_after_routing_kernels(on_id):
    """moe_align's kernels write the routing just before the pd1 GEMM reads it (RAW on a primary
    that never triggers; with pf1 the prefetch guesses from that routing while it is written),
    M = 1 .. 300, each against the same schedule without PDL."""
    qe, pw = cached_random_experts(8, 512, 704)
    on = Schedule.from_id(on_id)
    off = PDL.switch_off(on)
    for m in (1, 7, 300):
        ids = routing.random_topk_ids(m, 8, 2, seed=m, device="cuda")
        x = torch.randn(m, 704, device="cuda").bfloat16()
        outs = []
        for s in (on, off):
            r = routing.align_block_size(ids, s.block_m, 8)
            out = torch.full((m * 2, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
            ops.gemm_indexed(x, pw, r, top_k=2, out=out, schedule=s, check_routing=False)
            outs.append(out)
        torch.cuda.synchronize()
        assert not torch.isnan(outs[0].float()).any()
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), m


@pytest.mark.parametrize("on_id", ["gmsk-m8n128k64-w4-s8-c1-pd1-pf1", "gmsk-m8n64k64-w8-s4-c1-pd1-pf1-dr1"])
def test_pdl_prefetch_masked_after_the_counts_change(on_id):
    """The masked family's prefetch guesses from the expert counts: a torch kernel rewrites them
    just before each pf1 GEMM (a different set of experts every time), and every output equals
    the same schedule without PDL and the reference; rows past the counts stay poisoned. (With
    warp-private rings a wrong guess means copies of the wrong rows' tile to drain and redo.)"""
    e, max_rows, k, n = 8, 24, 704, 512
    qe, pw = cached_random_experts(e, n, k)
    on = Schedule.from_id(on_id)
    off = PDL.switch_off(on)
    g = torch.Generator(device="cuda").manual_seed(21)
    x = torch.randn(e, max_rows, k, device="cuda", generator=g).bfloat16()
    counts = torch.zeros(e, dtype=torch.int32, device="cuda")
    patterns = [[0, 5, 0, 24, 1, 0, 0, 9], [24, 0, 3, 0, 0, 17, 2, 0], [0, 0, 0, 0, 0, 0, 0, 1]]
    for want in [torch.tensor(c, dtype=torch.int32, device="cuda") for c in patterns]:
        outs = []
        for s in (on, off):
            out = torch.full((e, max_rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            counts.copy_(want)  # the kernel just before the GEMM writes what its prefetch reads
            ops.gemm_masked(x, pw, counts, out=out, schedule=s, check_routing=False)
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), want.tolist()
        valid = torch.arange(max_rows, device="cuda")[None, :] < want[:, None]
        assert torch.isnan(outs[0][~valid]).all(), want.tolist()
        ref = reference.masked_gemm_ref(x, qe, None, want)
        assert rel_err(outs[0][valid], ref[valid]) < BF16_TOL, want.tolist()


def test_activation_pdl_chain_same_bits_eager_and_graph():
    """vLLM's chain, gate_up -> the humming root's SiLU-and-mul -> down, with pd1 GEMMs, a pf1 down
    and the activation launched with PDL (CHORD_ACTIVATION_PDL=1): the same bits as the chain
    with none of them, eager and as a CUDA graph replayed with new inputs."""
    from chord import _env
    from humming.ops import process_input

    e, hidden, inter, m, top_k = 8, 512, 256, 5, 2
    _, w13 = cached_random_experts(e, 2 * inter, hidden, seed=3)
    _, w2 = cached_random_experts(e, hidden, inter, seed=4)
    ids = routing.random_topk_ids(m, e, top_k, seed=5, device="cuda")
    on = (Schedule.from_id("idx-m8n64k64-w4-s8-c1-pd1"), Schedule.from_id("idx-m8n64k64-w4-s8-c1-pd1-pf1"))
    off = tuple(PDL.switch_off(s) for s in on)
    r = routing.align_block_size(ids, 8, e)

    def chain(x, s13, s2, act_pdl):
        h = torch.empty(m * top_k, 2 * inter, dtype=torch.bfloat16, device="cuda")
        ops.gemm_indexed(x, w13, r, top_k=top_k, out=h, schedule=s13, check_routing=False)
        with _env.override(CHORD_ACTIVATION_PDL=act_pdl):
            a, _, _ = process_input(h, activation_type="binary_split",
                                    activation_impl="(a / (1.f + expf(-a))) * b", backend="cuda")
        y = torch.full((m * top_k, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        ops.gemm_indexed(a, w2, r, top_k=1, out=y, schedule=s2, check_routing=False)
        return y

    x0 = torch.randn(m, hidden, device="cuda").bfloat16()
    want = chain(x0, *off, False)
    got = chain(x0, *on, True)
    torch.cuda.synchronize()
    assert not torch.isnan(want.float()).any()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    x = x0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(x, *on, True)  # warm: kernels loaded
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = chain(x, *on, True)
    for seed in (6, 7):
        x.copy_(torch.randn(m, hidden, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        g.replay()
        ref = chain(x.clone(), *off, False)
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), seed
