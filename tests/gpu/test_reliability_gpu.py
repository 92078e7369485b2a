"""Reliability on the H200 (issue 7): CUDA graphs replayed 1,000 times with routing rewritten in
place, split-K on two streams at once, determinism of every profile schedule, and numerical
health (large inputs, zero and denormal scales, NaN/Inf confined to their rows).

Outputs are poisoned with NaN before every launch or replay; rows a kernel must skip are checked
to stay NaN, every other row against the float32 reference.
"""
from __future__ import annotations

import pytest
import torch

from chord import formats, ops, reference, routing
from chord.lab.bench.timing import capture_graph
from chord.schedule import Schedule
from chord.testing import (BF16_TOL, cached_random_experts, check_rows, poisoned, profile_rule_schedules, rel_err,
                           same_bits)

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

experts = cached_random_experts
REPLAYS = 1000
# gate_up on the mma loop, down on the wgmma loop: both main loops in every graph
GATE_UP = dict(block_m=16, block_n=128, warps=4, stages=4, ctas_per_sm=2)
DOWN = dict(block_m=32, block_n=128, warps=8, stages=4, ctas_per_sm=1, mainloop="wgmma")


def _sched(family, knobs):
    return Schedule(family, **knobs)


def test_indexed_graph_1000_replays_with_fresh_routing():
    e, m_cap, top_k = 12, 96, 4
    qa, wa = experts(e, 512, 256, seed=1)
    qb, wb = experts(e, 256, 256, seed=2)
    s1 = _sched("indexed", GATE_UP)
    s2 = _sched("indexed", dict(DOWN, block_m=16))  # one routing (one block size) for both GEMMs
    cap = routing.sorted_ids_capacity(m_cap * top_k, s1.block_m, e)
    g = torch.Generator(device="cpu").manual_seed(7)

    def route(m, seed):
        # m <= m_cap tokens inside the captured sizes: the padding sentinel stays the captured
        # M * top_k (what the graph's launch was given), as when vLLM pads a batch to its graph
        ids = routing.random_topk_ids(m, e, top_k, seed=seed, device="cuda")
        r = routing.align_block_size(ids, s1.block_m, e, max_num_tokens_padded=cap)
        r.sorted_ids[r.sorted_ids >= m * top_k] = m_cap * top_k
        return r

    r = route(m_cap, 0)
    x1 = torch.randn(m_cap, 256, device="cuda").bfloat16()
    x2 = torch.randn(m_cap * top_k, 256, device="cuda").bfloat16()
    o1, o2 = poisoned(m_cap * top_k, 512), poisoned(m_cap * top_k, 256)

    def calls():
        ops.gemm_indexed(x1, wa, r, top_k=top_k, out=o1, schedule=s1, check_routing=False)
        ops.gemm_indexed(x2, wb, r, top_k=1, out=o2, schedule=s2, check_routing=False)

    graph = capture_graph(calls)
    for i in range(REPLAYS):
        m = int(torch.randint(0, m_cap + 1, (1,), generator=g))  # tok_e changes every replay (0 included)
        new = route(m, 1000 + i)
        r.sorted_ids.copy_(new.sorted_ids)
        r.expert_ids.copy_(new.expert_ids)
        r.num_tokens_post_padded.copy_(new.num_tokens_post_padded)
        o1.fill_(float("nan"))
        o2.fill_(float("nan"))
        graph.replay()
        valid = torch.zeros(m_cap * top_k, dtype=torch.bool, device="cuda")
        valid[: m * top_k] = True
        ref1 = reference.indexed_gemm_ref(x1, qa, None, new, top_k)
        ref2 = reference.indexed_gemm_ref(x2, qb, None, new, 1)
        check_rows(o1, ref1, valid, f"replay {i} gate_up m={m}")
        check_rows(o2, ref2, valid, f"replay {i} down m={m}")


def test_contiguous_graph_1000_replays_with_fresh_offsets():
    e, rows_cap = 10, 400
    qa, wa = experts(e, 512, 256, seed=3)
    qb, wb = experts(e, 256, 256, seed=4)
    s1, s2 = _sched("grouped_contiguous", GATE_UP), _sched("grouped_contiguous", DOWN)
    x1 = torch.randn(rows_cap, 256, device="cuda").bfloat16()
    x2 = torch.randn(rows_cap, 256, device="cuda").bfloat16()
    offsets = torch.zeros(e + 1, dtype=torch.int64, device="cuda")
    o1, o2 = poisoned(rows_cap, 512), poisoned(rows_cap, 256)
    g = torch.Generator(device="cpu").manual_seed(9)

    def calls():
        ops.gemm_contiguous(x1, wa, offsets, out=o1, schedule=s1, check_routing=False)
        ops.gemm_contiguous(x2, wb, offsets, out=o2, schedule=s2, check_routing=False)

    graph = capture_graph(calls)
    for i in range(REPLAYS):
        counts = torch.randint(0, 2 * rows_cap // e, (e,), generator=g)
        counts[torch.randint(0, e, (1,), generator=g)] = 0  # an empty expert
        while counts.sum() > rows_cap:
            counts = counts // 2
        off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        offsets.copy_(off)
        o1.fill_(float("nan"))
        o2.fill_(float("nan"))
        graph.replay()
        rows = int(off[-1])
        valid = torch.arange(rows_cap, device="cuda") < rows
        check_rows(o1, reference.contiguous_gemm_ref(x1, qa, None, offsets), valid, f"replay {i} gate_up")
        check_rows(o2, reference.contiguous_gemm_ref(x2, qb, None, offsets), valid, f"replay {i} down")


def test_masked_graph_1000_replays_with_fresh_counts():
    e, max_rows = 8, 40
    qa, wa = experts(e, 512, 256, seed=5)
    qb, wb = experts(e, 256, 256, seed=6)
    s1, s2 = _sched("grouped_masked", GATE_UP), _sched("grouped_masked", DOWN)
    x1 = torch.randn(e, max_rows, 256, device="cuda").bfloat16()
    x2 = torch.randn(e, max_rows, 256, device="cuda").bfloat16()
    counts = torch.zeros(e, dtype=torch.int32, device="cuda")
    o1, o2 = poisoned(e, max_rows, 512), poisoned(e, max_rows, 256)
    g = torch.Generator(device="cpu").manual_seed(11)

    def calls():
        ops.gemm_masked(x1, wa, counts, out=o1, schedule=s1, check_routing=False)
        ops.gemm_masked(x2, wb, counts, out=o2, schedule=s2, check_routing=False)

    graph = capture_graph(calls)
    for i in range(REPLAYS):
        c = torch.randint(0, max_rows + 1, (e,), generator=g, dtype=torch.int32)
        counts.copy_(c)
        o1.fill_(float("nan"))
        o2.fill_(float("nan"))
        graph.replay()
        valid = torch.arange(max_rows, device="cuda")[None, :] < counts[:, None]
        r1 = reference.masked_gemm_ref(x1, qa, None, counts)
        r2 = reference.masked_gemm_ref(x2, qb, None, counts)
        check_rows(o1, r1, valid, f"replay {i} gate_up")
        check_rows(o2, r2, valid, f"replay {i} down")


def test_split_k_on_two_streams_at_once():
    """Two split-K GEMMs interleaved on two streams without a sync between them: each stream has
    its own workspace and counters (chord.ops keys them by (device, stream))."""
    e, top_k = 8, 2
    qa, wa = experts(e, 512, 2048, seed=7)
    qb, wb = experts(e, 1024, 1024, seed=8)
    sa = Schedule("indexed", 8, 64, 4, 8, 2, split_k=8)
    sb = Schedule("indexed", 8, 128, 4, 6, 1, split_k=4)
    ra = routing.align_block_size(routing.random_topk_ids(3, e, top_k, seed=1, device="cuda"), 8, e)
    rb = routing.align_block_size(routing.random_topk_ids(5, e, top_k, seed=2, device="cuda"), 8, e)
    xa = torch.randn(3, 2048, device="cuda").bfloat16()
    xb = torch.randn(5, 1024, device="cuda").bfloat16()
    refa = reference.indexed_gemm_ref(xa, qa, None, ra, top_k)
    refb = reference.indexed_gemm_ref(xb, qb, None, rb, top_k)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    outs = [[poisoned(3 * top_k, 512) for _ in range(20)], [poisoned(5 * top_k, 1024) for _ in range(20)]]
    torch.cuda.synchronize()
    for i in range(20):
        with torch.cuda.stream(streams[0]):
            ops.gemm_indexed(xa, wa, ra, top_k=top_k, out=outs[0][i], schedule=sa, check_routing=False)
        with torch.cuda.stream(streams[1]):
            ops.gemm_indexed(xb, wb, rb, top_k=top_k, out=outs[1][i], schedule=sb, check_routing=False)
    torch.cuda.synchronize()
    keys = {k for k in ops._split_ws if k[1] in (streams[0].cuda_stream, streams[1].cuda_stream)}
    assert len(keys) == 2, "each stream has its own split-K workspace"
    for i in range(20):
        assert rel_err(outs[0][i], refa) < BF16_TOL and rel_err(outs[1][i], refb) < BF16_TOL, i
        assert same_bits(outs[0][i], outs[0][0]) and same_bits(outs[1][i], outs[1][0]), i


def test_a_reserved_workspace_serves_every_call_of_its_range():
    """ops.reserve_workspace (what humming's tuning rows call at layer init) allocates the split-K
    buffers of the largest call of its range up front: calls up to that size on the stream make
    no buffer of their own, and compute right."""
    e, top_k = 16, 2
    q, w = experts(e, 512, 2048, seed=9)
    s = Schedule("indexed", 8, 64, 4, 8, 2, split_k=8)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        assert ops.reserve_workspace(s, 512, 12 * top_k, e) > 0
        key = (torch.cuda.current_device(), stream.cuda_stream)
        ws, cnt = ops._split_ws[key]
        for m in (1, 5, 12):
            r = routing.align_block_size(routing.random_topk_ids(m, e, top_k, seed=m, device="cuda"), 8, e)
            x = torch.randn(m, 2048, device="cuda").bfloat16()
            out = poisoned(m * top_k, 512)
            ops.gemm_indexed(x, w, r, top_k=top_k, out=out, schedule=s, check_routing=False)
            assert ops._split_ws[key][0] is ws and ops._split_ws[key][1] is cnt, m
            assert rel_err(out, reference.indexed_gemm_ref(x, q, None, r, top_k)) < BF16_TOL, m
    stream.synchronize()


@pytest.mark.parametrize("sched", profile_rule_schedules(), ids=lambda s: s.id)
def test_every_profile_schedule_is_deterministic(sched):
    """Same inputs, same bits, run after run (split-K included: its fix-up sums in z order)."""
    from test_optimizations_gpu import run_family

    qe, pw = experts(6, 512, 2048)
    first, ref, _ = run_family(sched, qe, pw, seed=4)
    assert rel_err(first, ref) < BF16_TOL
    for _ in range(3):
        again, _, _ = run_family(sched, qe, pw, seed=4)
        assert same_bits(again, first), sched.id


HEALTH = [Schedule("grouped_contiguous", 16, 128, 4, 4, 1), Schedule("grouped_contiguous", 64, 128, 8, 4, 1,
                                                                      mainloop="wgmma"),
          Schedule("grouped_contiguous", 16, 128, 4, 4, 1, split_k=4)]


def _health_case(s: Schedule, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, counts: list[int]):
    pw = formats.pack_experts(formats.QuantizedExperts(q, scales))
    off = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int64, device="cuda")
    out = poisoned(x.shape[0], q.shape[1])
    ops.gemm_contiguous(x, pw, off, out=out, schedule=s)
    return out, reference.contiguous_gemm_ref(x, formats.QuantizedExperts(q, scales), None, off)


@pytest.mark.parametrize("s", HEALTH, ids=lambda s: s.id)
def test_numerical_health(s):
    e, n, k, counts = 4, 256, 1024, [30, 0, 17, 33]
    rows = sum(counts)
    qe, _ = experts(e, n, k, seed=9)
    q, sc = qe.q, qe.scales
    # inputs of large magnitude (+-1e4): fp32 accumulation keeps the bf16 answer
    big = (torch.randn(rows, k, device="cuda") * 1e4).bfloat16()
    out, ref = _health_case(s, big, q, sc, counts)
    assert torch.isfinite(out).all() and rel_err(out, ref) < BF16_TOL
    # all-zero scales of expert 2 -> its rows are exactly 0; denormal scales of expert 3 -> finite
    sc2 = sc.clone()
    sc2[2] = 0
    sc2[3] = torch.tensor(1e-39, dtype=torch.float32).to(torch.bfloat16)  # bf16 subnormal
    assert sc2[3].float().abs().max() < torch.finfo(torch.bfloat16).tiny
    x = torch.randn(rows, k, device="cuda").bfloat16()
    out, ref = _health_case(s, x, q, sc2, counts)
    lo2, hi2 = counts[0] + counts[1], counts[0] + counts[1] + counts[2]
    assert (out[lo2:hi2] == 0).all(), "zero scales must give exact zeros"
    assert torch.isfinite(out).all() and rel_err(out[:lo2], ref[:lo2]) < BF16_TOL
    # NaN / Inf in one row stay in that row: every other row keeps its bits
    clean, _ = _health_case(s, x, q, sc, counts)
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[5, 77] = bad
        xb[40, 3] = -bad if bad == float("inf") else bad
        out, _ = _health_case(s, xb, q, sc, counts)
        hit = torch.zeros(rows, dtype=torch.bool, device="cuda")
        hit[[5, 40]] = True
        assert (~torch.isfinite(out[hit])).any(dim=1).all(), f"{bad} in a row must reach that row's outputs"
        assert same_bits(out[~hit], clean[~hit]), f"{bad} leaked into other rows or experts"


# ---- the trusted paths: bad routing values that nothing reads before the launch (issue 27) ----


def _sanitize_cases():
    """tools/sanitize_cases.py, imported as `sanitize_cases` (the cases tools/sanitize.sh runs under
    compute-sanitizer memcheck)."""
    import sys
    from pathlib import Path

    tools = str(Path(__file__).resolve().parents[2] / "tools")
    sys.path.insert(0, tools)
    try:
        import sanitize_cases
    finally:
        sys.path.remove(tools)
    return sanitize_cases


_SC = _sanitize_cases()


@pytest.mark.parametrize("case", _SC.TRUSTED_CASES, ids=lambda c: c.name.replace(" ", "-"))
def test_trusted_paths_survive_bad_routing_values(case):
    """Each family x main loop x bad value x trusted path of tools/sanitize_cases.py, without the
    sanitizer: no CUDA error, the kernel launched on the path the case names (a plan case from
    its launch plan), and every row the contract defines is written and right, every row it
    skips still NaN."""
    qe, pw = experts(_SC.E, _SC.N, _SC.K, seed=1)
    ran, fails = _SC.run_trusted(case, qe, pw)
    torch.cuda.synchronize()  # an asynchronous fault surfaces here, against this case
    assert not fails, fails
    assert sum(ran.values()) >= 1, ran
    if case.path in ("plan", "humming"):
        assert ran["plan"] >= 1, ran
