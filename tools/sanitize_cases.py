"""The cases `tools/sanitize.sh` runs under compute-sanitizer (memcheck, racecheck, synccheck).

Every family x main loop (mma, wgmma multistage, wgmma with the producer warp, split-K,
n_tiles, unswapped, bulk weight copies, the TMA activation box, CTA pairs) over: ordinary routing, tok_e 0 (no rows), single-row experts, M = 1,
over-allocated buffers, -1 blocks, and trusted bad routing values (contiguous offsets past the
input, masked counts past max_rows, indexed ids past the sentinel and unknown experts). Each
case proves its kernel ran: rows the routing names must have been written (no NaN left) and
match the float32 reference; rows it does not name stay NaN. Exits 1 on any failed proof, so a
zero exit code under the sanitizer means the kernels ran and no tool reported an error.

    python tools/sanitize_cases.py [--quick | --bulk-and-pairs]

``--bulk-and-pairs`` runs only the bulk-copy / TMA / CTA-pair variants (BULK_AND_PAIRS).
"""
from __future__ import annotations

import sys

import torch

from chord import ops, reference, routing
from chord.schedule import Schedule
from chord.testing import check_rows, poisoned, random_experts

E, N, K = 6, 256, 256


def schedules(family: str, quick: bool) -> list[Schedule]:
    out = [Schedule(family, 16, 128, 4, 3, 1), Schedule(family, 32, 128, 8, 3, 1, mainloop="wgmma")]
    if not quick:
        out += [Schedule(family, 32, 128, 8, 3, 1, mainloop="wgmma", producer=1),
                Schedule(family, 8, 64, 4, 3, 1, split_k=2), Schedule(family, 16, 64, 4, 3, 1, n_tiles=2),
                Schedule(family, 16, 128, 4, 3, 1, swap=0)]
        out += [Schedule.from_id(i) for i in BULK_AND_PAIRS[family]]
    return out


# the bulk-copy and CTA-pair variants (bulk_w, tma_x, cluster_n), the profile's own among them;
# N = 256 gives the pairs their even count of 128-feature blocks
BULK_AND_PAIRS = {
    "indexed": ("idx-m40n128k64-w8-s4-c1-wgmma-bw1", "idx-m32n128k64-w8-s8-c1-wgmma-cn2", "idx-m16n128k64-w4-s3-c1-cn2"),
    "grouped_contiguous": ("gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2", "gcon-m40n128k64-w8-s4-c1-wgmma-bw1-tx1"),
    "grouped_masked": ("gmsk-m48n128k64-w8-s4-c1-wgmma-r4-bw1-tx1-cn2", "gmsk-m32n128k64-w8-s8-c1-wgmma-cn2"),
}


FAILS: list[str] = []


def prove(what: str, out: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor) -> None:
    """chord.testing.check_rows, its failure recorded in FAILS instead of raised."""
    torch.cuda.synchronize()
    try:
        check_rows(out, ref, valid, what)
    except AssertionError as exc:
        FAILS.append(str(exc))


def indexed(s: Schedule, qe, pw) -> int:
    n = 0
    for m, top_k, skip in ((0, 2, False), (1, 1, False), (5, 1, False), (37, 3, False), (37, 3, True)):
        ids = routing.random_topk_ids(m, E, top_k, seed=m, device="cuda")
        extra = 64 if skip else 0  # over-allocated: a larger capacity, -1 blocks after the padded count
        cap = routing.sorted_ids_capacity(m * top_k, s.block_m, E) + extra
        r = routing.align_block_size(ids, s.block_m, E, max_num_tokens_padded=cap)
        if skip:
            r.expert_ids[1::2] = -1  # blocks of no local expert: skipped
        x = torch.randn(m, K, device="cuda").bfloat16()
        out = poisoned(m * top_k + 4, N)
        ops.gemm_indexed(x, pw, r, top_k=top_k, out=out[: m * top_k], schedule=s, check_routing=False)
        ref = reference.indexed_gemm_ref(x, qe, None, r, top_k)
        valid = torch.zeros(m * top_k + 4, dtype=torch.bool, device="cuda")
        valid[: m * top_k] = ~torch.isnan(ref[:, 0]) if m else valid[:0]
        full = torch.full((m * top_k + 4, N), float("nan"), device="cuda")
        full[: m * top_k] = ref
        prove(f"{s.id} indexed m={m} skip={skip}", out, full, valid)
        n += 1
    # bad values, trusted: ids past the sentinel and an unknown expert id
    ids = routing.random_topk_ids(9, E, 2, seed=3, device="cuda")
    r = routing.align_block_size(ids, s.block_m, E)
    r.sorted_ids[0] = 10**6
    r.expert_ids[0] = E + 5
    x = torch.randn(9, K, device="cuda").bfloat16()
    out = poisoned(18, N)
    ops.gemm_indexed(x, pw, r, top_k=2, out=out, schedule=s, check_routing=False)
    torch.cuda.synchronize()
    return n + 1


def contiguous(s: Schedule, qe, pw) -> int:
    n = 0
    for counts, extra in (([0] * E, 0), ([1] * E, 0), ([0, 9, 0, 20, 1, 3], 7)):
        rows = sum(counts)
        off = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int64, device="cuda")
        x = torch.randn(rows + extra, K, device="cuda").bfloat16()
        out = poisoned(rows + extra, N)
        ops.gemm_contiguous(x, pw, off, out=out, schedule=s, check_routing=False)
        ref = reference.contiguous_gemm_ref(x, qe, None, off)
        prove(f"{s.id} contiguous counts={counts}", out, ref, torch.arange(rows + extra, device="cuda") < rows)
        n += 1
    # bad: offsets past the input (clamped in the kernel)
    x = torch.randn(10, K, device="cuda").bfloat16()
    off = torch.tensor([0, 4, 8, 10**6, 10**6, 2**40, 2**40], dtype=torch.int64, device="cuda")
    ops.gemm_contiguous(x, pw, off, out=poisoned(10, N), schedule=s, check_routing=False)
    torch.cuda.synchronize()
    return n + 1


def masked(s: Schedule, qe, pw) -> int:
    n = 0
    for max_rows, counts in ((1, [0] * E), (1, [1] * E), (24, [0, 24, 3, 1, 0, 17])):
        c = torch.tensor(counts, dtype=torch.int32, device="cuda")
        x = torch.randn(E, max_rows, K, device="cuda").bfloat16()
        out = poisoned(E, max_rows, N)
        ops.gemm_masked(x, pw, c, out=out, schedule=s, check_routing=False)
        ref = reference.masked_gemm_ref(x, qe, None, c)
        prove(f"{s.id} masked counts={counts}", out, ref, torch.arange(max_rows, device="cuda")[None] < c[:, None])
        n += 1
    # bad: counts past max_rows (clamped)
    c = torch.tensor([100, 5, 10**6, 0, 2, 99], dtype=torch.int32, device="cuda")
    ops.gemm_masked(torch.randn(E, 8, K, device="cuda").bfloat16(), pw, c, out=poisoned(E, 8, N), schedule=s,
                    check_routing=False)
    torch.cuda.synchronize()
    return n + 1


def main() -> int:
    quick = "--quick" in sys.argv
    only_bulk = "--bulk-and-pairs" in sys.argv
    qe, pw = random_experts(E, N, K, seed=1)
    launches = 0
    for family, run in (("indexed", indexed), ("grouped_contiguous", contiguous), ("grouped_masked", masked)):
        todo = [Schedule.from_id(i) for i in BULK_AND_PAIRS[family]] if only_bulk else schedules(family, quick)
        for s in todo:
            print(f"[sanitize_cases] {s.id}", flush=True)  # so a tool's report can be told apart by kernel
            launches += run(s, qe, pw)
    print(f"sanitize_cases: {launches} launches, {len(FAILS)} failed proofs")
    for f in FAILS:
        print("  FAIL", f)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
