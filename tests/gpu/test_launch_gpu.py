"""The C launch path (chord.launch, csrc/host/launch.c) on the H200.

* the module builds and is on (`launch.status()`), on this machine's compiler and Python;
* every family and launch kind (mma, split-K, stream-K, wgmma multistage and warp-specialized,
  persistent with PDL, n_tiles, CTA pairs): a plan made by one call launches the next calls on
  other buffers of the same shapes, whose outputs are bit-identical to the Python path's on
  the same inputs and match the float32 reference, with poisoned outputs (rows the kernel must
  not write stay NaN);
* a split-K plan is bound to its stream: on another stream the call takes the Python path
  (that stream's workspace) and stays correct;
* CUDA graphs: trusted calls captured after their plans exist, replayed with new inputs.
"""
from __future__ import annotations

import pytest
import torch

from chord import launch, ops, reference, routing
from chord.schedule import Schedule
from chord.testing import BF16_TOL, cached_random_experts, poisoned, rel_err

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

SCHEDULES = [
    "idx-m8n256k64-w4-s8-c1",
    "idx-m8n64k64-w4-s6-c1-sk4",
    "idx-m8n64k64-w4-s8-c1-stk1",
    "idx-m32n128k64-w8-s8-c1-wgmma",
    "idx-m64n128k64-w8-s4-c1-wgmma-ws1",
    "idx-m64n128k64-w8-s4-c1-wgmma-ps1-pd1",
    "idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4",
    "gcon-m16n128k64-w4-s4-c1",
    "gcon-m16n64k64-w4-s6-c1-sk4-pd1",
    "gcon-m64n256k64-w8-s4-c1-sk3-wgmma-gs2",
    "gmsk-m8n128k64-w4-s8-c1",
    "gmsk-m32n128k64-w8-s8-c1-wgmma-cn2",
    "idx-m32n128k64-w8-s4-c1-wgmma-ps1-dq1",
]


def test_the_fast_path_is_on():
    assert launch.status() == "on", launch.status()


class Case:
    """One family's inputs for schedule `s` (seeded), its trusted raw call and its reference."""

    def __init__(self, s: Schedule, qe, pw, seed: int):
        self.s, self.qe, self.pw = s, qe, pw
        e, k, n = pw.num_experts, pw.k, pw.n
        g = torch.Generator(device="cuda").manual_seed(seed)
        if s.family == "indexed":
            m, self.top_k = 37, 4
            ids = routing.random_topk_ids(m, e, self.top_k, seed=seed, device="cuda")
            self.r = routing.align_block_size(ids, s.block_m, e)
            self.x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
            self.out = poisoned(m * self.top_k, n)
            self.valid = torch.ones(m * self.top_k, dtype=torch.bool, device="cuda")
        elif s.family == "grouped_contiguous":
            m = 45
            ids = routing.random_topk_ids(m, e, 3, seed=seed, device="cuda")
            lay = routing.contiguous_layout(torch.randn(m, k, device="cuda", generator=g).bfloat16(), ids, e,
                                            alignment=1)
            self.off = lay.expert_offsets
            rows = int(self.off[-1])
            self.x = torch.cat([lay.x, torch.randn(3, k, device="cuda", generator=g).bfloat16()])
            self.out = poisoned(rows + 3, n)
            self.valid = torch.arange(rows + 3, device="cuda") < rows
        else:
            max_rows = 24
            self.counts = torch.randint(0, max_rows + 1, (e,), device="cuda", generator=g, dtype=torch.int32)
            self.counts[1] = 0
            self.x = torch.randn(e, max_rows, k, device="cuda", generator=g).bfloat16()
            self.out = torch.full((e, max_rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            self.valid = torch.arange(max_rows, device="cuda")[None, :] < self.counts[:, None]

    def items(self) -> tuple:
        """The call's signature items, as chord.ops offers them to chord.launch."""
        w = (self.pw.qweight, self.pw.scales)
        if self.s.family == "indexed":
            r = self.r
            return (launch.INDEXED, self.top_k, self.s.block_m, self.x, *w, r.sorted_ids, r.expert_ids,
                    r.num_tokens_post_padded, self.out)
        if self.s.family == "grouped_contiguous":
            return (launch.CONTIGUOUS, self.x, *w, self.off, self.out)
        return (launch.MASKED, self.x, *w, self.counts, self.out)

    def call(self, check: bool = False) -> None:
        """The trusted raw call (check: the routing values read first, which is the Python path)."""
        w, sid = (self.pw.qweight, self.pw.scales), self.s.id
        if self.s.family == "indexed":
            r = self.r
            ops.gemm_indexed_raw(self.x, *w, r.sorted_ids, r.expert_ids, r.num_tokens_post_padded, self.out,
                                 self.top_k, self.s.block_m, sid, check_routing=check)
        elif self.s.family == "grouped_contiguous":
            ops.gemm_contiguous_raw(self.x, *w, self.off, self.out, sid, check_routing=check)
        else:
            ops.gemm_masked_raw(self.x, *w, self.counts, self.out, sid, check_routing=check)

    def ref(self) -> torch.Tensor:
        if self.s.family == "indexed":
            return reference.indexed_gemm_ref(self.x, self.qe, None, self.r, self.top_k)
        if self.s.family == "grouped_contiguous":
            return reference.contiguous_gemm_ref(self.x, self.qe, None, self.off)
        return reference.masked_gemm_ref(self.x, self.qe, None, self.counts)

    def check(self, got: torch.Tensor) -> None:
        assert torch.isnan(got[~self.valid]).all(), f"{self.s.id}: rows the kernel must not write were written"
        assert rel_err(got[self.valid], self.ref()[self.valid]) < BF16_TOL, self.s.id


def fresh_case(sid: str, seed: int):
    """(schedule, experts, packed experts, a Case of it on `seed`) with the fast path on and no
    plan made yet."""
    s = Schedule.from_id(sid)
    qe, pw = cached_random_experts(6, 512, 704)
    launch.fast_launch(True)
    launch.clear()
    return s, qe, pw, Case(s, qe, pw, seed=seed)


@pytest.mark.parametrize("sid", SCHEDULES)
def test_plan_launches_match_the_python_path(sid):
    s, qe, pw, first = fresh_case(sid, seed=1)
    first.call()  # the Python path: makes the plan
    assert len(launch.PLANS) == 1
    torch.cuda.synchronize()
    first.check(first.out)
    for seed in (2, 3):  # other buffers and values, same shapes: the C module launches them
        c = Case(s, qe, pw, seed=seed)
        got = launch.MODULE.launch(launch.PLANS, sid, *c.items())
        assert got is None, (f"{sid}: a same-signature call did not launch from its plan: launch() -> {got!r}, "
                             f"signature planned: {launch.MODULE.signature(sid, *c.items()) in launch.PLANS}")
        torch.cuda.synchronize()
        fast = c.out.clone()
        c.out.fill_(float("nan"))
        c.call(check=True)  # the Python path on the same inputs (a checked call never takes a plan)
        torch.cuda.synchronize()
        assert torch.equal(fast.view(torch.int16), c.out.view(torch.int16)), sid
        c.check(fast)


def test_split_k_plan_is_bound_to_its_stream():
    s, qe, pw, first = fresh_case("idx-m8n64k64-w4-s6-c1-sk4", seed=1)
    first.call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c = Case(s, qe, pw, seed=4)
        assert not launch.try_launch(s.id, *c.items())  # the plan's workspace is the default stream's
        c.call()  # the Python path: this stream's workspace (and a plan bound to it)
        c2 = Case(s, qe, pw, seed=5)
        assert launch.try_launch(s.id, *c2.items())
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    c.check(c.out)
    c2.check(c2.out)


@pytest.mark.parametrize("sid", ["idx-m8n256k64-w4-s8-c1", "gcon-m16n64k64-w4-s6-c1-sk4-pd1",
                                 "gmsk-m32n128k64-w8-s8-c1-wgmma-cn2"])
def test_graph_capture_of_planned_calls(sid):
    s, qe, pw, c = fresh_case(sid, seed=6)
    c.call()
    c.call()  # planned
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c.call()  # warm-up on the capture stream (a split-K plan rebinds to it)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        c.call()
    for seed in (7, 8):
        fresh = Case(s, qe, pw, seed=seed)
        c.x.copy_(fresh.x)
        c.out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        c.check(c.out)


def test_a_captured_split_k_call_records_no_memset(monkeypatch):
    """A split-K call captured into a CUDA graph (torch captures on a stream of its own) takes
    the spare workspace zeroed outside the capture: no buffer is made (so no memset node is
    recorded, which ran at every replay: 0.55 us on the TP8 one-token pair), and it replays right."""
    monkeypatch.setattr(ops, "_split_ws", {})
    monkeypatch.setattr(ops, "_split_spares", {})
    s, qe, pw, c = fresh_case("idx-m8n64k64-w4-s6-c1-sk4", seed=9)  # no plan holds an earlier workspace
    c.call()  # eager, on the current stream: its workspace and one spare
    torch.cuda.synchronize()
    dev = torch.cuda.current_device()
    assert len(ops._split_spares[dev]) == 1
    spare = ops._split_spares[dev][0]
    made = []
    real = ops._new_split_pair
    monkeypatch.setattr(ops, "_new_split_pair", lambda *a: made.append(a) or real(*a))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c.call()
    assert not made and not ops._split_spares[dev]
    assert any(v[1] is spare[1] for v in ops._split_ws.values())  # the capture stream's pair is the spare
    fresh = Case(s, qe, pw, seed=10)
    c.x.copy_(fresh.x)
    c.out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    c.check(c.out)
