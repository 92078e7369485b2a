"""Every optimization of `chord.optimizations` switched off still gives the right answer.

Two parts:
* the swap knob's off side (tokens on the MMA M side in 16-row tiles, `swap=0`) on every family,
  against the float32 reference and the swapped kernel, with poisoned outputs;
* the table walk: each schedule the H200 profile can select (fitted to a small GEMM), and each
  of its ablations (`optimizations.ablations`: the same schedule with one knob off), on the
  family the rule is for, against the reference.
"""
from __future__ import annotations

import pytest
import torch

from chord import jit, ops, optimizations, reference, routing
from chord.schedule import Schedule
from chord.testing import BF16_TOL, cached_random_experts, poisoned, profile_rule_schedules, rel_err

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

experts = cached_random_experts


def run_family(s: Schedule, qe, pw, seed: int = 0):
    """One call of `s` on its family with random routing (an empty expert included), returning
    (output, reference, rows the kernel must write)."""
    e, k, n = pw.num_experts, pw.k, pw.n
    g = torch.Generator(device="cuda").manual_seed(seed)
    if s.family == "indexed":
        m, top_k = 37, 4
        ids = routing.random_topk_ids(m, e, top_k, seed=seed, device="cuda")
        r = routing.align_block_size(ids, s.block_m, e)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        out = poisoned(m * top_k, n)
        ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
        return out, reference.indexed_gemm_ref(x, qe, None, r, top_k), m * top_k
    if s.family == "grouped_contiguous":
        m, top_k = 45, 3
        ids = routing.random_topk_ids(m, e - 1, top_k, seed=seed, device="cuda")
        ids = torch.where(ids >= 2, ids + 1, ids)  # expert 2 gets no rows
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        lay = routing.contiguous_layout(x, ids, e, alignment=1)
        rows = int(lay.expert_offsets[-1])
        out = poisoned(rows + 3, n)
        xin = torch.cat([lay.x, torch.randn(3, k, device="cuda", generator=g).bfloat16()])
        ops.gemm_contiguous(xin, pw, lay.expert_offsets, out=out, schedule=s)
        assert torch.isnan(out[rows:]).all(), f"{s.id}: rows past expert_offsets[E] were written"
        return out[:rows], reference.contiguous_gemm_ref(xin, qe, None, lay.expert_offsets)[:rows], rows
    max_rows = 24
    counts = torch.randint(0, max_rows + 1, (e,), device="cuda", generator=g, dtype=torch.int32)
    counts[1] = 0
    x = torch.randn(e, max_rows, k, device="cuda", generator=g).bfloat16()
    out = torch.full((e, max_rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    ops.gemm_masked(x, pw, counts, out=out, schedule=s)
    ref = reference.masked_gemm_ref(x, qe, None, counts)
    valid = torch.arange(max_rows, device="cuda")[None, :] < counts[:, None]
    assert torch.isnan(out[~valid]).all(), f"{s.id}: rows past the masked counts were written"
    return out[valid], ref[valid], int(counts.sum())


def check_same_bits(on: Schedule, off: Schedule, k: int = 704, seed: int = 5) -> None:
    """`on` and `off` (one knob apart) give the same output bits on their family, and the
    reference's answer."""
    qe, pw = experts(6, 512, k)
    got_on, ref, rows = run_family(on, qe, pw, seed=seed)
    got_off, _, _ = run_family(off, qe, pw, seed=seed)
    assert rows > 0
    assert torch.equal(got_on.view(torch.int16), got_off.view(torch.int16)), (on.id, off.id)
    assert rel_err(got_on, ref) < BF16_TOL, on.id


@pytest.mark.parametrize("family", ["indexed", "grouped_contiguous", "grouped_masked"])
@pytest.mark.parametrize("tile", [(16, 256, 8), (32, 128, 4), (64, 128, 3), (128, 64, 3)], ids=lambda t: f"m{t[0]}n{t[1]}")
@pytest.mark.parametrize("k", [64, 704])  # 1 and 11 K blocks
def test_swap_off_matches_reference(family, tile, k):
    bm, bn, stages = tile
    qe, pw = experts(6, 512, k)
    on = Schedule(family, bm, bn, 4, stages, 1)
    off = optimizations.BY_NAME["decode operand swap"].switch_off(on)
    assert off.swap == 0 and off.block_m == bm
    got_off, ref, _ = run_family(off, qe, pw, seed=k)
    got_on, _, _ = run_family(on, qe, pw, seed=k)
    assert rel_err(got_off, ref) < BF16_TOL, off.id
    assert rel_err(got_off, got_on) < BF16_TOL, (off.id, on.id)


@pytest.mark.parametrize("extra", [dict(split_k=3), dict(n_tiles=4), dict(raster=4), dict(ctas_per_sm=2)],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_swap_off_with_other_knobs(extra):
    qe, pw = experts(6, 512, 704)
    s = Schedule("indexed", 16, 128, 4, 4, **{"ctas_per_sm": 1, **extra}, swap=0)
    got, ref, _ = run_family(s, qe, pw, seed=3)
    assert rel_err(got, ref) < BF16_TOL, s.id


@pytest.mark.parametrize("sched", profile_rule_schedules(), ids=lambda s: s.id)
def test_every_optimization_switched_off_matches_reference(sched):
    qe, pw = experts(6, 512, 512)
    cases = {"(profile)": sched, **optimizations.ablations(sched)}
    for name, s in cases.items():
        got, ref, rows = run_family(s, qe, pw, seed=11)
        assert rows > 0
        assert rel_err(got, ref) < BF16_TOL, f"{name}: {s.id}"


# The stmatrix epilogue against one 16-bit store per value: an odd number of 8-token groups
# (the x2 tail), 1-4 weight tiles per warp, both main loops, n_tiles, every family: the same
# bits, and the reference. (Split-K tiles stage through the fix-up; the knob does not apply.)
STMATRIX_PAIRS = [  # (stmatrix on, off) on every family
    ("idx-m8n64k64-w4-s8-c1", "idx-m8n64k64-w4-s8-c1-stm0"),
    ("idx-m24n128k64-w4-s4-c1", "idx-m24n128k64-w4-s4-c1-stm0"),
    ("idx-m40n128k64-w8-s4-c1-wgmma", "idx-m40n128k64-w8-s4-c1-wgmma-stm0"),
    ("idx-m192n256k64-w8-s4-c1-wgmma-gs1-r8", "idx-m192n256k64-w8-s4-c1-wgmma-gs1-r8-stm0"),
    ("idx-m32n512k64-w8-s4-c1-wgmma-gs1", "idx-m32n512k64-w8-s4-c1-wgmma-gs1-stm0"),
    ("idx-m96n128k64-w8-s4-c1-wgmma-r8-nt4", "idx-m96n128k64-w8-s4-c1-wgmma-r8-nt4-stm0"),
    ("gcon-m8n64k64-w4-s8-c1", "gcon-m8n64k64-w4-s8-c1-stm0"),
    ("gcon-m24n128k64-w4-s4-c1", "gcon-m24n128k64-w4-s4-c1-stm0"),
    ("gcon-m40n128k64-w8-s4-c1-wgmma", "gcon-m40n128k64-w8-s4-c1-wgmma-stm0"),
    ("gcon-m192n256k64-w8-s4-c1-wgmma-gs1-r8", "gcon-m192n256k64-w8-s4-c1-wgmma-gs1-r8-stm0"),
    ("gcon-m32n512k64-w8-s4-c1-wgmma-gs1", "gcon-m32n512k64-w8-s4-c1-wgmma-gs1-stm0"),
    ("gcon-m96n128k64-w8-s4-c1-wgmma-r8-nt4", "gcon-m96n128k64-w8-s4-c1-wgmma-r8-nt4-stm0"),
    ("gmsk-m8n64k64-w4-s8-c1", "gmsk-m8n64k64-w4-s8-c1-stm0"),
    ("gmsk-m24n128k64-w4-s4-c1", "gmsk-m24n128k64-w4-s4-c1-stm0"),
    ("gmsk-m40n128k64-w8-s4-c1-wgmma", "gmsk-m40n128k64-w8-s4-c1-wgmma-stm0"),
    ("gmsk-m192n256k64-w8-s4-c1-wgmma-gs1-r8", "gmsk-m192n256k64-w8-s4-c1-wgmma-gs1-r8-stm0"),
    ("gmsk-m32n512k64-w8-s4-c1-wgmma-gs1", "gmsk-m32n512k64-w8-s4-c1-wgmma-gs1-stm0"),
    ("gmsk-m96n128k64-w8-s4-c1-wgmma-r8-nt4", "gmsk-m96n128k64-w8-s4-c1-wgmma-r8-nt4-stm0"),
]


@pytest.mark.parametrize("pair", STMATRIX_PAIRS, ids=lambda p: p[0])
def test_stmatrix_epilogue_same_bits(pair):
    on, off = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    assert optimizations.BY_NAME["stmatrix epilogue"].switch_off(on) == off and off.stmatrix == 0
    check_same_bits(on, off)


# Bulk copies against every thread's cp.async: weights and scales by cp.async.bulk (bw1, every
# family), the activation box by one TMA tensor copy (tx1, grouped families: tile rows past x's
# end arrive as zeros, rows of the next expert feed only unstored columns), both; 1-4 tile groups
# per N block, odd token tiles (40, 24 rows: a box past the masked max_rows and the expert's end),
# split-K (the K coordinate starts at the split's first block), n_tiles, wait_group 0, 2 CTAs/SM,
# and CTA pairs launched as 2-CTA clusters: the same bits, and the reference.
BULK_PAIRS = [  # (bulk on, off)
    ("idx-m40n128k64-w8-s4-c1-wgmma-bw1", "idx-m40n128k64-w8-s4-c1-wgmma"),
    ("idx-m64n512k64-w8-s4-c1-wgmma-gs2-r8-bw1", "idx-m64n512k64-w8-s4-c1-wgmma-gs2-r8"),
    ("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-bw1", "idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4"),
    ("idx-m128n256k64-w8-s4-c1-wgmma-sk3-gs2-bw1", "idx-m128n256k64-w8-s4-c1-wgmma-sk3-gs2"),
    ("gcon-m40n128k64-w8-s4-c1-wgmma-tx1", "gcon-m40n128k64-w8-s4-c1-wgmma"),
    ("gcon-m40n128k64-w8-s4-c1-wgmma-bw1-tx1", "gcon-m40n128k64-w8-s4-c1-wgmma"),
    ("gcon-m24n256k64-w8-s6-c2-wgmma-gs2-bw1-tx1", "gcon-m24n256k64-w8-s6-c2-wgmma-gs2"),
    ("gcon-m64n512k64-w8-s4-c1-wgmma-gs2-r8-bw1-tx1", "gcon-m64n512k64-w8-s4-c1-wgmma-gs2-r8"),
    ("gcon-m256n128k64-w8-s4-c1-wgmma-r8-bw1", "gcon-m256n128k64-w8-s4-c1-wgmma-r8"),
    ("gcon-m256n128k64-w8-s4-c1-wgmma-r8-tx1", "gcon-m256n128k64-w8-s4-c1-wgmma-r8"),
    ("gcon-m256n128k64-w8-s4-c1-wgmma-r8-bw1-tx1", "gcon-m256n128k64-w8-s4-c1-wgmma-r8"),
    ("gcon-m96n128k64-w8-s5-c1-wgmma-wait0-r8-nt4-bw1-tx1", "gcon-m96n128k64-w8-s5-c1-wgmma-wait0-r8-nt4"),
    ("gcon-m64n256k64-w8-s4-c1-wgmma-sk3-gs2-bw1-tx1", "gcon-m64n256k64-w8-s4-c1-wgmma-sk3-gs2"),
    ("gmsk-m40n128k64-w8-s4-c1-wgmma-bw1-tx1", "gmsk-m40n128k64-w8-s4-c1-wgmma"),
    ("gmsk-m32n512k64-w8-s8-c1-wgmma-gs1-tx1", "gmsk-m32n512k64-w8-s8-c1-wgmma-gs1"),
    ("gmsk-m32n512k64-w8-s8-c1-wgmma-gs1-bw1-tx1", "gmsk-m32n512k64-w8-s8-c1-wgmma-gs1"),
    ("gmsk-m192n256k64-w8-s4-c1-wgmma-gs1-r8-bw1-tx1", "gmsk-m192n256k64-w8-s4-c1-wgmma-gs1-r8"),
    # CTA pairs (clusters of two on neighbouring N blocks; the raster walks the pairs), with and
    # without bulk copies, the mma loop too
    ("gcon-m256n128k64-w8-s4-c1-wgmma-r8-tx1-cn2", "gcon-m256n128k64-w8-s4-c1-wgmma-r8"),
    ("gcon-m64n256k64-w8-s4-c1-wgmma-gs2-tx1-cn2", "gcon-m64n256k64-w8-s4-c1-wgmma-gs2"),
    ("gcon-m96n128k64-w8-s5-c1-wgmma-r8-nt2-tx1-cn2", "gcon-m96n128k64-w8-s5-c1-wgmma-r8-nt2"),
    ("gcon-m64n128k64-w8-s4-c1-wgmma-sk3-tx1-cn2", "gcon-m64n128k64-w8-s4-c1-wgmma-sk3"),
    ("gmsk-m32n256k64-w4-s8-c2-wgmma-gs2-tx1-cn2", "gmsk-m32n256k64-w4-s8-c2-wgmma-gs2"),
    ("gmsk-m48n128k64-w8-s4-c1-wgmma-r4-bw1-tx1-cn2", "gmsk-m48n128k64-w8-s4-c1-wgmma-r4"),
    ("gcon-m256n128k64-w8-s4-c1-wgmma-r8-cn2", "gcon-m256n128k64-w8-s4-c1-wgmma-r8"),
    ("idx-m128n256k64-w8-s4-c1-wgmma-gs2-r8-cn2", "idx-m128n256k64-w8-s4-c1-wgmma-gs2-r8"),
    ("idx-m24n128k64-w4-s4-c1-r4-cn2", "idx-m24n128k64-w4-s4-c1-r4"),
    ("gmsk-m16n64k64-w4-s6-c1-sk2-cn2", "gmsk-m16n64k64-w4-s6-c1-sk2"),
]


# Split-K through a cluster (the tile's split_k CTAs sum their partials through distributed
# shared memory) against the workspace fix-up: both main loops, every family, 2-8 CTAs a cluster,
# 1-4 weight tiles per warp, folded scales, 2 CTAs/SM, PDL, at 3 and 11 K blocks where every CTA
# of a tile owns at least one (the splits the selection and `chord tune` make): the same bits, and
# the reference.
SPLIT_CLUSTER_PAIRS = [  # (cluster on, off)
    ("idx-m8n64k64-w4-s8-c2-sk8-skc1", "idx-m8n64k64-w4-s8-c2-sk8"),
    ("idx-m8n256k64-w4-s6-c2-sk2-skc1", "idx-m8n256k64-w4-s6-c2-sk2"),
    ("idx-m8n128k64-w4-s8-c1-sk4-skc1-fo1", "idx-m8n128k64-w4-s8-c1-sk4-fo1"),
    ("idx-m24n128k64-w4-s4-c1-sk3-skc1", "idx-m24n128k64-w4-s4-c1-sk3"),
    ("idx-m16n256k64-w4-s4-c1-sk2-skc1-wgmma-gs2", "idx-m16n256k64-w4-s4-c1-sk2-wgmma-gs2"),
    ("idx-m64n128k64-w8-s4-c2-sk6-skc1-wgmma", "idx-m64n128k64-w8-s4-c2-sk6-wgmma"),
    ("gcon-m16n64k64-w4-s6-c1-sk4-skc1-pd1", "gcon-m16n64k64-w4-s6-c1-sk4-pd1"),
    ("gcon-m64n256k64-w8-s4-c1-sk3-skc1-wgmma-gs2-bw1-tx1", "gcon-m64n256k64-w8-s4-c1-sk3-wgmma-gs2-bw1-tx1"),
    ("gmsk-m8n256k64-w4-s6-c2-sk2-skc1-fo1", "gmsk-m8n256k64-w4-s6-c2-sk2-fo1"),
    ("gmsk-m32n128k64-w8-s6-c1-sk8-skc1-wgmma", "gmsk-m32n128k64-w8-s6-c1-sk8-wgmma"),
]


SPLIT_CLUSTER_CASES = [(p, k) for p in SPLIT_CLUSTER_PAIRS for k in (192, 704)
                       if k // 64 >= Schedule.from_id(p[0]).split_k]


@pytest.mark.parametrize("pair,k", SPLIT_CLUSTER_CASES, ids=lambda v: v[0] if isinstance(v, tuple) else f"k{v}")
def test_split_cluster_same_bits(pair, k):
    on, off = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    o = optimizations.BY_NAME["split-K through a cluster"]
    assert o.is_on(on) and o.switch_off(on) == off and not o.is_on(off)
    check_same_bits(on, off, k=k, seed=13)


# L2 policies (l2_hint: the activation rows evict-last, at 1 the weights and scales evict-first)
# against no hint: the profile's TP8 m4096 gate_up tile and its m1024 wide tile, split-K,
# n_tiles, 2 CTAs/SM and CTA pairs, every family: the same bits, and the reference. (A kernel
# ptxas miscompiles with a hint is rebuilt without one by chord.jit, which would make a pair
# trivially equal: the test reads each on-side kernel's build log for that. The persistent
# idx-m40n128k64-w8-s4-c1-wgmma-ps1-l21 is such a kernel with nvcc 13.0, so it is not here.)
L2_PAIRS = [  # (hint on, off)
    ("idx-m96n256k64-w8-s5-c1-wgmma-gs2-r8-l21", "idx-m96n256k64-w8-s5-c1-wgmma-gs2-r8"),
    ("idx-m96n256k64-w8-s5-c1-wgmma-gs2-r8-l22", "idx-m96n256k64-w8-s5-c1-wgmma-gs2-r8"),
    ("idx-m32n512k64-w8-s8-c1-wgmma-gs1-l21", "idx-m32n512k64-w8-s8-c1-wgmma-gs1"),
    ("idx-m64n128k64-w8-s4-c2-sk3-wgmma-l21", "idx-m64n128k64-w8-s4-c2-sk3-wgmma"),
    ("idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-l21", "idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4"),
    ("idx-m128n256k64-w8-s4-c1-wgmma-gs2-r8-l21-cn2", "idx-m128n256k64-w8-s4-c1-wgmma-gs2-r8-cn2"),
    ("gcon-m64n256k64-w8-s4-c1-wgmma-gs2-l21", "gcon-m64n256k64-w8-s4-c1-wgmma-gs2"),
    ("gmsk-m48n128k64-w8-s4-c1-wgmma-r4-l22", "gmsk-m48n128k64-w8-s4-c1-wgmma-r4"),
]


@pytest.mark.parametrize("pair", L2_PAIRS, ids=lambda p: p[0])
@pytest.mark.parametrize("k", [192, 704])
def test_l2_policies_same_bits(pair, k):
    on, off = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    o = optimizations.BY_NAME["L2 policies for gathered rows"]
    assert o.is_on(on) and o.switch_off(on) == off and not o.is_on(off)
    log = jit.build_schedule(on).log
    assert jit.NO_L2_HINT_FLAG not in log, f"{on.id}: built without L2 hints (ptxas miscompile fallback)"
    check_same_bits(on, off, k=k, seed=7)


@pytest.mark.parametrize("pair", BULK_PAIRS, ids=lambda p: p[0])
@pytest.mark.parametrize("k", [192, 704])  # 3 and 11 K blocks (the ring wraps, split-K splits unevenly)
def test_bulk_copies_same_bits(pair, k):
    on, off = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    for name in ("bulk weight copies", "TMA activation copies", "CTA pairs"):
        o = optimizations.BY_NAME[name]
        if o.is_on(on):
            assert not o.is_on(o.switch_off(on)) and o.switch_off(on) != on
    assert off == Schedule.from_id(pair[0].replace("-bw1", "").replace("-tx1", "").replace("-cn2", ""))
    qe, pw = experts(6, 512, k)
    got_on, ref, rows = run_family(on, qe, pw, seed=7)
    got_off, _, _ = run_family(off, qe, pw, seed=7)
    assert rows > 0
    assert torch.equal(got_on.view(torch.int16), got_off.view(torch.int16)), (on.id, off.id)
    assert rel_err(got_on, ref) < BF16_TOL, on.id


# Warp-private rings (direct=1): the CTA's warps split K and sum their partials in warp order, so
# the bits are not the CTA ring's; each case is checked against the float32 reference (poisoned
# outputs), against its CTA-ring side (switch_off) within the same tolerance, and for the same bits
# on a second call. The TP8 one-token candidates (gate_up N 512, down K 256 shapes below), split-K
# through the workspace and a cluster, PDL, folded group scales, 1-8 warps, every family.
DIRECT_PAIRS = [  # (direct, its CTA-ring side: optimizations' switch_off)
    ("idx-m8n32k64-w8-s8-c1-dr1", "idx-m8n32k64-w2-s8-c1"),
    ("idx-m8n64k64-w8-s4-c1-sk2-dr1", "idx-m8n64k64-w4-s4-c1-sk2"),
    ("idx-m8n64k64-w8-s4-c1-sk2-skc1-dr1", "idx-m8n64k64-w4-s4-c1-sk2-skc1"),
    ("idx-m8n128k64-w4-s2-c1-dr1", "idx-m8n128k64-w4-s2-c1"),
    ("idx-m8n64k64-w4-s2-c1-pd1-dr1", "idx-m8n64k64-w4-s2-c1-pd1"),
    ("idx-m16n16k64-w1-s3-c1-dr1", "idx-m16n16k64-w1-s3-c1"),
    ("idx-m32n128k64-w8-s2-c1-sk3-dr1", "idx-m32n128k64-w8-s2-c1-sk3"),
    ("gcon-m16n128k64-w4-s3-c1-dr1", "gcon-m16n128k64-w4-s3-c1"),
    ("gcon-m8n32k64-w2-s5-c1-sk2-skc1-dr1", "gcon-m8n32k64-w2-s5-c1-sk2-skc1"),
    ("gmsk-m8n64k64-w8-s4-c1-dr1", "gmsk-m8n64k64-w4-s4-c1"),
    ("gmsk-m24n64k64-w4-s3-c1-sk2-dr1", "gmsk-m24n64k64-w4-s3-c1-sk2"),
    ("idx-m8n32k64-w8-s8-c1-fo1-dr1", "idx-m8n32k64-w2-s8-c1-fo1"),
    ("gmsk-m16n64k64-w4-s3-c1-sk2-fo1-dr1", "gmsk-m16n64k64-w4-s3-c1-sk2-fo1"),
]


@pytest.mark.parametrize("pair", DIRECT_PAIRS, ids=lambda p: p[0])
@pytest.mark.parametrize("k", [64, 448, 1408])  # 1, 7 and 22 K blocks: warps with none, one, several
def test_direct_rings_match_reference(pair, k):
    sid = pair[0]
    on, off = Schedule.from_id(pair[0]), Schedule.from_id(pair[1])
    o = optimizations.BY_NAME["warp-private rings"]
    assert o.is_on(on) and o.switch_off(on) == off and not o.is_on(off)
    qe, pw = experts(6, 512, k)
    got, ref, rows = run_family(on, qe, pw, seed=21)
    again, _, _ = run_family(on, qe, pw, seed=21)
    got_off, _, _ = run_family(off, qe, pw, seed=21)
    assert rows > 0
    assert rel_err(got, ref) < BF16_TOL, sid
    assert rel_err(got_off, ref) < BF16_TOL, off.id
    assert torch.equal(got.view(torch.int16), again.view(torch.int16)), f"{sid}: two calls gave different bits"


@pytest.mark.parametrize("sid,n,k", [("idx-m8n32k64-w8-s8-c1-dr1", 512, 7168),
                                     ("idx-m8n64k64-w8-s4-c1-sk2-dr1", 512, 7168),
                                     ("idx-m8n32k64-w8-s8-c1-fo1-dr1", 512, 7168),
                                     ("idx-m8n128k64-w4-s2-c1-dr1", 7168, 256),
                                     ("idx-m8n64k64-w4-s2-c1-dr1", 7168, 256)])
def test_direct_rings_tp8_one_token(sid, n, k):
    """TP8 one token: one row, routed to 8 of 48 experts (1 row each), at the layer's N and K."""
    s = Schedule.from_id(sid)
    qe, pw = experts(48, n, k, seed=3)
    ids = routing.random_topk_ids(1, 48, 8, seed=4, device="cuda")
    r = routing.align_block_size(ids, s.block_m, 48)
    x = torch.randn(1, k, device="cuda").bfloat16()
    out = poisoned(8, n)
    ops.gemm_indexed(x, pw, r, top_k=8, out=out, schedule=s)
    assert rel_err(out, reference.indexed_gemm_ref(x, qe, None, r, 8)) < BF16_TOL, sid
