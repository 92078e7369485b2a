"""Randomized differential testing on the H200 (issue 7): seeded random shapes, expert counts,
routing skews (uniform, Zipf, every token to one expert, empty experts) and schedules drawn from
the profile, its ablations and a seeded sample of the whole knob space, against the float32
reference, outputs poisoned with NaN first.

$CHORD_FUZZ_CASES (default 500) cases per family, each run even when an earlier one failed (until
a CUDA error loses the context); the summary line of each family's test says how many ran and
passed, and the test fails naming every failed case and its schedule. The schedule pool is `fuzz_pool(family)`, so a kernel cache can be built for
it ahead (`chord precompile` does not know these schedules).
"""
from __future__ import annotations

import random

import pytest
import torch

from chord import ops, optimizations, reference, routing
from chord import _env
from chord.schedule import FAMILIES, WGMMA_BLOCK_MS, Schedule, override
from chord.testing import check_rows, poisoned, profile_rule_schedules, random_experts, run_cases

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]

CASES = _env.get("CHORD_FUZZ_CASES")  # default 500
SKEWS = ("uniform", "zipf", "one_expert", "empty_experts")
SAMPLED = 40  # knob-space schedules per family
# (block_m, block_n, warps, stages, other knobs) of the direct loop's cases in every family's pool
DIRECT_CASES = ((8, 32, 8, 8, {}), (8, 64, 8, 4, {"split_k": 2}), (8, 128, 4, 2, {}), (8, 16, 4, 6, {}),
                (16, 64, 2, 3, {}), (24, 32, 1, 4, {}), (32, 128, 8, 2, {"split_k": 3}),
                (8, 64, 8, 4, {"split_k": 2, "split_cluster": 1}), (8, 128, 4, 2, {"pdl": 1}),
                (16, 128, 8, 3, {"stmatrix": 0}), (8, 64, 8, 4, {"fold": 1}), (16, 32, 4, 3, {"fold": 1, "split_k": 2}),
                (8, 128, 4, 3, {"pdl": 1, "pdl_prefetch": 1}))


def _sample(family: str, rng: random.Random) -> Schedule | None:
    wg = rng.random() < 0.5
    kw: dict = {}
    if wg:
        bm, bn = rng.choice(WGMMA_BLOCK_MS), rng.choice((64, 128, 192, 256))
        kw.update(mainloop="wgmma", wgmma_wait=rng.choice((0, 1)), producer=rng.choice((0, 0, 1)))
        warps, stages = bn // 16, rng.randint(3, 6)
    else:
        bm, bn = rng.choice(range(8, 129, 8)), rng.choice((64, 128, 256))
        warps, stages = rng.choice((1, 2, 4, 4, 8)), rng.randint(2, 8)
        if bm % 16 == 0:
            kw["swap"] = rng.choice((1, 1, 0))
        if bn % 128 == 0:  # the tile fed by a producer warp (bulk copies of whole tile groups)
            kw["producer"] = rng.choice((0, 0, 1))
    c = rng.choice((1, 2))
    split = rng.choice((1, 1, 1, 2, 3, 4))
    nt = rng.choice((1, 1, 2, 4)) if split == 1 and not kw.get("producer") else 1
    if wg and split == 1 and not kw.get("producer"):
        kw["persistent"] = rng.choice((0, 0, 0, 1))
    if wg and not kw.get("producer") and not kw.get("persistent"):  # bulk copies: the multistage ring
        kw["bulk_w"] = rng.choice((0, 0, 1)) if bn % 128 == 0 else 0
        kw["tma_x"] = rng.choice((0, 0, 1)) if family != "indexed" else 0
    raster = rng.choice((0, 0, 4))
    if (not wg and family == "indexed" and split == 1 and nt == 1 and kw.get("swap", 1) and not kw.get("producer")
            and rng.random() < 0.3):
        kw["stream_k"], raster = 1, 0  # stream-K splits the tile grid itself (no raster, no pairs)
    if not kw.get("persistent") and not kw.get("stream_k"):
        kw["cluster_n"] = rng.choice((1, 1, 1, 2))
    try:
        return Schedule(family, bm, bn, warps, stages, c if not (wg and kw.get("producer")) else 1, split_k=split,
                        raster=raster, n_tiles=nt, **kw)
    except ValueError:
        return None


def fuzz_pool(family: str) -> list[Schedule]:
    """The profile's schedules of `family` (fitted to N = 256 and 512), each with its ablations,
    and SAMPLED valid schedules of the knob space; deterministic, sorted by id."""
    pool: dict = {}
    for s in profile_rule_schedules((256, 512), family):
        pool[s.id] = s
        for off in optimizations.ablations(s).values():
            pool[off.id] = off
        if s.mainloop == "wgmma" and not s.producer and s.split_k == 1 and not s.persistent:
            try:  # the same tile as a persistent grid (no profile rule uses one)
                ps = override(s, persistent=1)
                pool[ps.id] = ps
                dq = override(ps, queue=1)  # the dynamic work queue's side of the same walk
                pool[dq.id] = dq
            except ValueError:  # its epilogue tile after the ring does not fit
                pass
            # the same tile with each bulk copy, as CTA pairs and with L2 policies (where the knob applies)
            for kw in ({"bulk_w": 1}, {"tma_x": 1}, {"bulk_w": 1, "tma_x": 1}, {"cluster_n": 2}, {"l2_hint": 1}):
                try:
                    v = override(s, **kw)
                except ValueError:
                    continue
                pool[v.id] = v
        if s.mainloop == "mma" and s.swap == 1 and s.block_m == 8:  # folded group scales (no rule uses them)
            fo = override(s, fold=1)
            pool[fo.id] = fo
        if s.mainloop == "mma" and family == "indexed":
            try:  # the same tile as a stream-K grid (split-K and n_tiles give way)
                v = override(s, stream_k=1, split_k=1, n_tiles=1, raster=0, cluster_n=1)
                pool[v.id] = v
            except ValueError:
                pass
    for s in list(pool.values())[:4]:  # programmatic dependent launch on a few (same kernels otherwise)
        v = override(s, pdl=1)
        pool[v.id] = v
    # and with the weight prefetch before the wait, on a few that launch one item per CTA
    for s in [s for s in pool.values() if not s.persistent and not s.stream_k and not s.pdl][:4]:
        v = override(s, pdl=1, pdl_prefetch=1)
        pool[v.id] = v
    # split-K through a cluster on the split tiles (the profile's and their ablations): the same
    # CTAs meeting in distributed shared memory instead of the workspace
    for s in [s for s in pool.values() if 2 <= s.split_k <= 8 and not s.producer and s.cluster_n == 1][:6]:
        v = override(s, split_cluster=1)
        pool[v.id] = v
    if not any(s.split_cluster for s in pool.values()):  # a family whose rules never split K (contiguous)
        made = 0
        for s in [s for s in pool.values() if s.split_k == 1 and not s.producer and s.cluster_n == 1
                  and not s.persistent and not s.stream_k and not s.pdl]:
            try:  # the same tile split in two, as a cluster
                v = override(s, split_k=2, split_cluster=1)
            except ValueError:
                continue
            pool[v.id] = v
            made += 1
            if made == 2:
                break
    # warp-private rings (direct=1; no rule uses them yet): every N block (16-128), token tiles of
    # 8-32 rows, 1-8 warps, 2-8 stages, split in two or three, through a cluster, PDL (and the
    # warps' first stages copied before its wait), plain stores, folded group scales
    for bm, bn, warps, stages, kw in DIRECT_CASES:
        v = Schedule(family, bm, bn, warps, stages, direct=1, **kw)
        pool[v.id] = v
    rng = random.Random(1234 + FAMILIES.index(family))
    sampled = 0
    for _ in range(20000):
        if sampled >= SAMPLED:
            break
        s = _sample(family, rng)
        if s is not None and s.id not in pool:
            pool[s.id] = s
            sampled += 1
    return sorted(pool.values(), key=lambda s: s.id)


def _expert_ids(rng: random.Random, skew: str, m: int, e: int, top_k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if skew == "one_expert":  # every token routes to expert 0 (and top_k-1 others)
        rest = torch.stack([torch.randperm(e - 1, generator=g)[: top_k - 1] + 1 for _ in range(m)]) if m else \
            torch.zeros(0, top_k - 1, dtype=torch.int64)
        return torch.cat([torch.zeros(m, 1, dtype=torch.int64), rest], 1).to(torch.int32)
    if skew == "empty_experts":  # only half the experts get rows
        live = torch.randperm(e, generator=g)[: max(top_k, e // 2)]
        ids = [live[torch.randperm(len(live), generator=g)[:top_k]] for _ in range(m)]
        return (torch.stack(ids) if m else torch.zeros(0, top_k, dtype=torch.int64)).to(torch.int32)
    w = torch.ones(e) if skew == "uniform" else 1.0 / torch.arange(1, e + 1, dtype=torch.float32) ** 1.2
    if not m:
        return torch.zeros(0, top_k, dtype=torch.int32)
    return torch.multinomial(w.expand(m, e), top_k, replacement=False, generator=g).to(torch.int32)


def _case(family: str, i: int, pool: list[Schedule]) -> None:
    rng = random.Random(10007 * (FAMILIES.index(family) + 1) + i)
    s = pool[i % len(pool)]
    n = s.block_n_cta * s.cluster_n * rng.choice((1, 2, 3))  # CTA pairs need an even N-block count
    # a persistent ring runs at most one tile ahead: K / 64 >= stages - 2 (chord.ops refuses less)
    # ... and a stream-K one keeps two token blocks' rows: N/block_n x K/64 >= stages
    k = 64 * rng.choice([b for b in (1, 2, 3, 5, 8, 11, 16) if (not s.persistent or b >= s.stages - 2)
                         and (not s.stream_k or (n // s.block_n) * b >= s.stages)])
    e = rng.randint(2, 12)
    skew = rng.choice(SKEWS)
    qe, pw = random_experts(e, n, k, seed=rng.randrange(1 << 20))
    what = f"e={e} n={n} k={k} skew={skew}"  # run_cases names the case and its schedule
    if family == "indexed":
        m = rng.choice((0, 1, 2, rng.randint(1, 160)))
        top_k = rng.randint(1, min(4, e))
        ids = _expert_ids(rng, skew, m, e, top_k).cuda()
        r = routing.align_block_size(ids, s.block_m, e)
        x = torch.randn(m, k, device="cuda").bfloat16()
        out = poisoned(m * top_k, n)
        ops.gemm_indexed(x, pw, r, top_k=top_k, out=out, schedule=s)
        ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
        valid = torch.ones(m * top_k, dtype=torch.bool, device="cuda")
    elif family == "grouped_contiguous":
        m, top_k = rng.randint(0, 120), rng.randint(1, min(3, e))
        ids = _expert_ids(rng, skew, m, e, top_k).cuda()
        x = torch.randn(m, k, device="cuda").bfloat16()
        lay = routing.contiguous_layout(x, ids, e, alignment=rng.choice((1, 8)))
        extra = rng.randint(0, 9)
        xin = torch.cat([lay.x, torch.randn(extra, k, device="cuda").bfloat16()])
        out = poisoned(xin.shape[0], n)
        ops.gemm_contiguous(xin, pw, lay.expert_offsets, out=out, schedule=s)
        ref = reference.contiguous_gemm_ref(xin, qe, None, lay.expert_offsets)
        valid = ~torch.isnan(ref[:, 0])
    else:
        max_rows = rng.choice((1, 8, rng.randint(1, 80)))
        m, top_k = rng.randint(0, 100), rng.randint(1, min(3, e))
        ids = _expert_ids(rng, skew, m, e, top_k)
        counts = torch.bincount(ids.flatten().long(), minlength=e).clamp(max=max_rows).to(torch.int32).cuda()
        x = torch.randn(e, max_rows, k, device="cuda").bfloat16()
        out = poisoned(e, max_rows, n)
        ops.gemm_masked(x, pw, counts, out=out, schedule=s)
        ref = reference.masked_gemm_ref(x, qe, None, counts)
        valid = ~torch.isnan(ref[..., 0])
    check_rows(out, ref, valid, what)


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_against_the_reference(family, capsys):
    pool = fuzz_pool(family)
    assert len(pool) >= SAMPLED and all(s.family == family for s in pool)
    assert {s.mainloop for s in pool} == {"mma", "wgmma"} and any(s.split_k > 1 for s in pool)
    assert family != "indexed" or any(s.stream_k for s in pool)
    ran, failed = run_cases(lambda i: _case(family, i, pool), CASES,
                            name=lambda i: f"case {i} ({pool[i % len(pool)].id})", after=torch.cuda.synchronize)
    with capsys.disabled():
        print(f"\n[fuzz] {family}: {ran} of {CASES} cases ran, {ran - len(failed)} passed, over {len(pool)} schedules "
              f"({sum(s.mainloop == 'wgmma' for s in pool)} wgmma, {sum(s.split_k > 1 for s in pool)} split-K, "
              f"{sum(s.swap == 0 for s in pool)} unswapped)")
    # every case ran and passed; a failure names its case (run_cases stops early only on a failure)
    assert not failed, f"{family}: {len(failed)} of {ran} cases failed:\n" + "\n".join(failed[:20])
