"""The cases `tools/sanitize.sh` runs under compute-sanitizer (memcheck, racecheck, synccheck).

Every family x main loop (mma, mma with the producer warp, wgmma multistage, wgmma with the producer warp, split-K,
n_tiles, unswapped, bulk weight copies, the TMA activation box, CTA pairs, the PDL weight prefetch) over: ordinary routing, tok_e 0 (no rows), single-row experts, M = 1,
over-allocated buffers, -1 blocks, and trusted bad routing values (contiguous offsets past the
input, masked counts past max_rows, indexed ids past the sentinel and unknown experts). Each
case proves its kernel ran: rows the routing names must have been written (no NaN left) and
match the float32 reference; rows it does not name stay NaN. Exits 1 on any failed proof, so a
zero exit code under the sanitizer means the kernels ran and no tool reported an error.

Then the trusted paths (TRUSTED_CASES): every family x main loop (mma, wgmma) x bad routing value
x trusted path, where nothing reads the routing values before the launch:

* paths: ``unchecked`` (chord.ops with ``check_routing=False``, the Python launch path),
  ``plan`` (a launch plan of chord.launch, the C path of a repeated call: the call runs once with
  good routing, the routing is then overwritten in place, as vLLM does between steps, and the
  repeated call launches from C), ``humming`` (the `humming` root's ``humming_forward``, twice:
  its Python path, then its own fast path through the plan);
* bad values: indexed ``expert_id_99`` (a block's expert), ``sorted_id_1e6`` (a route id),
  ``padded_count_1e6`` (``num_tokens_post_padded``); grouped_contiguous ``offsets_past_input``
  and ``offsets_not_monotonic``; grouped_masked ``counts_over_max_rows``.

Each such case prints its schedule id and its launches (Python path and plan path counted
separately; a case whose path did not launch fails), and proves the rows the contract defines:
indexed, every route of the blocks with an expert in [0, E) (the bad block and the bad id stay
unwritten), and with the padded count past the buffers, the same rows as the true count (the
grid is bounded by the buffers); contiguous, each offset clamped to [0, rows] and an expert's
end to at least its start (rows two experts claim are not defined; every other row is);
masked, each count clamped to [0, max_rows].

    python tools/sanitize_cases.py [--quick | --bulk-and-pairs | --trusted | --schedules ID[,ID...]]
    python tools/sanitize_cases.py --list    # the schedules and cases, on any machine (no GPU)

``--bulk-and-pairs`` runs only the bulk-copy / TMA / CTA-pair / L2-policy variants (BULK_AND_PAIRS);
``--trusted`` only the trusted-path cases; ``--schedules`` only the ordinary cases of the named
schedule ids (each on its own family), for a sanitizer pass over one new variant.
"""
from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a script: this checkout's chord and humming, not an installed copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from chord import ops, reference, routing  # noqa: E402
from chord.schedule import Schedule  # noqa: E402
from chord.testing import check_rows, poisoned, random_experts  # noqa: E402

E, N, K = 6, 256, 256


def schedules(family: str, quick: bool) -> list[Schedule]:
    """The schedules of a family's ordinary cases; the first two (mma, wgmma) also run the trusted-path
    cases (trusted_schedule), so tools/device_cache.py, which collects these, builds every kernel here."""
    out = [Schedule(family, 16, 128, 4, 3, 1), Schedule(family, 32, 128, 8, 3, 1, mainloop="wgmma")]
    if not quick:
        out += [Schedule(family, 32, 128, 8, 3, 1, mainloop="wgmma", producer=1),
                Schedule(family, 8, 64, 4, 3, 1, split_k=2), Schedule(family, 8, 64, 4, 3, 1, split_k=2, split_cluster=1),
                Schedule(family, 16, 64, 4, 3, 1, n_tiles=2),
                Schedule(family, 16, 128, 4, 3, 1, swap=0), Schedule(family, 8, 128, 4, 3, 1, producer=1),
                # the weight prefetch before the PDL wait guesses from the (here bad) routing values
                Schedule(family, 8, 64, 4, 3, 1, split_k=2, pdl=1, pdl_prefetch=1),
                Schedule(family, 32, 128, 8, 3, 1, mainloop="wgmma", raster=2, pdl=1, pdl_prefetch=1),
                # warp-private rings: the warps' own rings and their partials in shared memory
                Schedule(family, 8, 64, 8, 3, 1, split_k=2, direct=1), Schedule(family, 16, 32, 4, 4, 1, direct=1),
                Schedule(family, 8, 64, 4, 3, 1, pdl=1, pdl_prefetch=1, direct=1)]
        out += [Schedule.from_id(i) for i in BULK_AND_PAIRS[family]]
    return out


# the bulk-copy, CTA-pair, L2-policy and wgmma-producer variants (bulk_w, tma_x, cluster_n,
# l2_hint, producer), the profile's own among them; N = 256 gives the pairs their even count of
# 128-feature blocks. The producer's two register budgets of the profile's prefill tiles (40 for
# 64-token tiles, 48 for 128: chord.knobs.wgmma_producer_regs) each have a case.
BULK_AND_PAIRS = {
    "indexed": ("idx-m40n128k64-w8-s4-c1-wgmma-bw1", "idx-m32n128k64-w8-s8-c1-wgmma-cn2", "idx-m16n128k64-w4-s3-c1-cn2",
                "idx-m40n128k64-w8-s4-c1-wgmma-l21", "idx-m64n128k64-w8-s4-c1-wgmma-ws1-r8"),
    "grouped_contiguous": ("gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2", "gcon-m40n128k64-w8-s4-c1-wgmma-bw1-tx1",
                           "gcon-m128n128k64-w8-s5-c1-wgmma-ws1-r8"),
    "grouped_masked": ("gmsk-m48n128k64-w8-s4-c1-wgmma-r4-bw1-tx1-cn2", "gmsk-m32n128k64-w8-s8-c1-wgmma-cn2"),
}

FAMILIES = ("indexed", "grouped_contiguous", "grouped_masked")
MAINLOOPS = ("mma", "wgmma")
TRUSTED_PATHS = ("unchecked", "plan", "humming")
BAD_VALUES = {
    "indexed": ("expert_id_99", "sorted_id_1e6", "padded_count_1e6"),
    "grouped_contiguous": ("offsets_past_input", "offsets_not_monotonic"),
    "grouped_masked": ("counts_over_max_rows",),
}


@dataclass(frozen=True)
class TrustedCase:
    family: str
    mainloop: str
    value: str
    path: str

    @property
    def schedule(self) -> Schedule:
        return trusted_schedule(self.family, self.mainloop)

    @property
    def name(self) -> str:
        return f"{self.family} {self.mainloop} {self.value} {self.path}"


def trusted_schedule(family: str, mainloop: str) -> Schedule:
    """The schedule of a family's trusted-path cases on one main loop: schedules()'s first two (no
    TMA map, so a launch plan is recorded for it)."""
    return schedules(family, True)[MAINLOOPS.index(mainloop)]


TRUSTED_CASES = tuple(TrustedCase(f, m, v, p) for f in FAMILIES for m in MAINLOOPS for v in BAD_VALUES[f]
                      for p in TRUSTED_PATHS)


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


# ---- the trusted paths ---------------------------------------------------------------------

LAUNCHES = {"python": 0, "plan": 0}  # kernel launches of the Python path and of launch plans (C)


@contextlib.contextmanager
def counting_launches():
    """Count every GEMM launch by path while inside: chord.ops' Python launch (ops._launch) and a
    launch plan taken from C (chord.launch.try_launch, for chord.ops and for humming_forward's
    fast path); the originals are put back on the way out."""
    from chord import launch

    from humming import _chord

    _chord.load_ops()
    saved = (ops._launch, launch.try_launch, _chord._PLANNED)
    py_launch, try_launch = saved[0], saved[1]

    def python_launch(*a, **k):
        LAUNCHES["python"] += 1
        return py_launch(*a, **k)

    def plan_launch(*a):
        hit = try_launch(*a)
        LAUNCHES["plan"] += bool(hit)
        return hit

    ops._launch, launch.try_launch, _chord._PLANNED = python_launch, plan_launch, plan_launch
    try:
        yield
    finally:
        ops._launch, launch.try_launch, _chord._PLANNED = saved


@dataclass
class Setup:
    """A family's good call and its bad-value variant: inputs, the routing tensors (overwritten in
    place with the bad values by `spoil`), the output's shape, and the reference of the rows the
    contract defines for the bad values (ref, valid; `skip`: rows no value is asserted for)."""

    x: torch.Tensor
    layout: tuple
    out_shape: tuple
    spoil: object
    ref: torch.Tensor
    valid: torch.Tensor
    skip: torch.Tensor | None = None
    top_k: int = 1
    good: tuple = ()


def _indexed_setup(s: Schedule, qe, value: str) -> Setup:
    dev = qe.q.device
    m, top_k = 9, 2
    ids = routing.random_topk_ids(m, E, top_k, seed=5, device=dev)
    cap = routing.sorted_ids_capacity(m * top_k, s.block_m, E) + 4 * s.block_m  # blocks past the padded count
    r = routing.align_block_size(ids, s.block_m, E, max_num_tokens_padded=cap)
    good = tuple(t.clone() for t in (r.sorted_ids, r.expert_ids, r.num_tokens_post_padded))
    x = torch.randn(m, K, device=dev).bfloat16()
    bad_ids, bad_experts, bad_count = (t.clone() for t in good)
    contract = bad_experts.clone()  # the experts as the kernel reads them: out of [0, E) skips the block
    if value == "expert_id_99":
        bad_experts[0] = 99
        contract[0] = -1
    elif value == "sorted_id_1e6":
        real = (bad_ids[: int(bad_count[0])] < m * top_k).nonzero().flatten()
        bad_ids[int(real[len(real) // 2])] = 10**6  # a route in the middle: padding to the kernel
    else:
        bad_count[0] = 10**6  # the grid stays bounded by the buffers' blocks
    view = routing.IndexedRouting(bad_ids, contract, good[2] if value == "padded_count_1e6" else bad_count, s.block_m,
                                  top_k, m * top_k)
    ref = reference.indexed_gemm_ref(x, qe, None, view, top_k)

    def spoil():
        r.sorted_ids.copy_(bad_ids)
        r.expert_ids.copy_(bad_experts)
        r.num_tokens_post_padded.copy_(bad_count)

    return Setup(x, (r.sorted_ids, r.expert_ids, r.num_tokens_post_padded), (m * top_k, N), spoil, ref,
                 ~torch.isnan(ref[:, 0]), top_k=top_k, good=good)


def _contiguous_setup(s: Schedule, qe, value: str) -> Setup:
    dev, rows = qe.q.device, 10
    x = torch.randn(rows, K, device=dev).bfloat16()
    good = [0, 2, 4, 5, 7, 10, 10]
    bad = [0, 4, 8, 10**6, 10**6, 2**40, 2**40] if value == "offsets_past_input" else [0, 6, 3, 9, 9, 10, 10]
    off = torch.tensor(good, dtype=torch.int64, device=dev)
    # the kernel's contract (csrc/moe/rows.cuh rows_contiguous): expert e covers
    # [clamp(off[e]), max(clamp(off[e]), clamp(off[e+1]))), offsets clamped to [0, rows]
    claims = [[] for _ in range(rows)]
    for e in range(E):
        lo = min(max(bad[e], 0), rows)
        hi = max(lo, min(max(bad[e + 1], 0), rows))
        for row in range(lo, hi):
            claims[row].append(e)
    dense = qe.dequantize().float()
    ref = torch.full((rows, N), float("nan"), device=dev)
    for row, es in enumerate(claims):
        if len(es) == 1:
            ref[row] = x[row].float() @ dense[es[0]].t()
    valid = torch.tensor([len(es) == 1 for es in claims], device=dev)
    skip = torch.tensor([len(es) > 1 for es in claims], device=dev)  # two experts race for these rows
    return Setup(x, (off,), (rows, N), lambda: off.copy_(torch.tensor(bad, dtype=torch.int64)), ref, valid, skip,
                 good=(off.clone(),))


def _masked_setup(s: Schedule, qe, value: str) -> Setup:
    dev, max_rows = qe.q.device, 8
    x = torch.randn(E, max_rows, K, device=dev).bfloat16()
    bad = [100, 5, 10**6, 0, 2, 99]
    c = torch.tensor([3, 0, 8, 1, 5, 2], dtype=torch.int32, device=dev)
    clamped = torch.tensor([min(max(v, 0), max_rows) for v in bad], dtype=torch.int32, device=dev)
    ref = reference.masked_gemm_ref(x, qe, None, clamped)
    valid = torch.arange(max_rows, device=dev)[None] < clamped[:, None]
    return Setup(x, (c,), (E, max_rows, N), lambda: c.copy_(torch.tensor(bad, dtype=torch.int32)), ref, valid,
                 good=(c.clone(),))


_SETUPS = {"indexed": _indexed_setup, "grouped_contiguous": _contiguous_setup, "grouped_masked": _masked_setup}


def _raw_call(case: TrustedCase, st: Setup, pw, out: torch.Tensor) -> None:
    sid = case.schedule.id
    if case.family == "indexed":
        ops.gemm_indexed_raw(st.x, pw.qweight, pw.scales, *st.layout, out, st.top_k, case.schedule.block_m, sid,
                             check_routing=False)
    elif case.family == "grouped_contiguous":
        ops.gemm_contiguous_raw(st.x, pw.qweight, pw.scales, *st.layout, out, sid, check_routing=False)
    else:
        ops.gemm_masked_raw(st.x, pw.qweight, pw.scales, *st.layout, out, sid, check_routing=False)


def _humming_call(case: TrustedCase, st: Setup, pw, out: torch.Tensor) -> None:
    from humming.config import LayerConfig
    from humming.forward import humming_forward

    s = case.schedule
    cfg = LayerConfig(shape_n=N, shape_k=K, num_experts=E)
    tuning = json.dumps([[-1, 2**31 - 1, {"schedule": s.id, "block_shape": [s.block_m, s.block_n, 64],
                                          "family": case.family}]])
    kw = dict(outputs=out, compute_config=json.dumps({"gemm_type": case.family}), tuning_config=tuning,
              valid_shape_m=out.numel() // N)
    if case.family == "indexed":
        kw.update(sorted_ids=st.layout[0], expert_ids=st.layout[1], num_tokens_padded=st.layout[2], top_k=st.top_k)
    else:
        kw["expert_layout"] = st.layout[0]
    humming_forward(cfg, st.x, pw.qweight, pw.scales, **kw)


def _prove_trusted(what: str, st: Setup, out: torch.Tensor) -> str | None:
    torch.cuda.synchronize()
    keep = ~st.skip if st.skip is not None else torch.ones(st.valid.shape, dtype=torch.bool, device=st.valid.device)
    try:
        check_rows(out[keep], st.ref[keep], st.valid[keep], what)
    except AssertionError as exc:
        return str(exc)
    return None


def run_trusted(case: TrustedCase, qe, pw) -> tuple[dict, list[str]]:
    """One trusted-path case: (its launches by path, its failed proofs). The routing is spoiled in
    place before the launches that must survive it."""
    with counting_launches():
        return _run_trusted(case, qe, pw)


def _run_trusted(case: TrustedCase, qe, pw) -> tuple[dict, list[str]]:
    from chord import launch

    launch.clear()  # every case starts on the Python path; its own calls record the plans it uses
    st = _SETUPS[case.family](case.schedule, qe, case.value)
    before = dict(LAUNCHES)
    fails = []
    what = f"{case.name} ({case.schedule.id})"
    if case.path == "unchecked":
        st.spoil()
        out = poisoned(*st.out_shape)
        _raw_call(case, st, pw, out)
        fails.append(_prove_trusted(what, st, out))
    elif case.path == "plan":
        _raw_call(case, st, pw, poisoned(*st.out_shape))  # good routing: the Python path records the plan
        torch.cuda.synchronize()
        st.spoil()  # overwritten in place, as between two steps of a server
        planned = LAUNCHES["plan"]
        out = poisoned(*st.out_shape)
        _raw_call(case, st, pw, out)
        if LAUNCHES["plan"] == planned:
            fails.append(f"{what}: the repeated call did not launch from its plan (chord.launch: {launch.status()})")
        fails.append(_prove_trusted(what, st, out))
    else:  # humming: its Python path, then its own fast path (the launch plan)
        st.spoil()
        for i in range(2):
            planned = LAUNCHES["plan"]
            out = poisoned(*st.out_shape)
            _humming_call(case, st, pw, out)
            if i == 1 and LAUNCHES["plan"] == planned:
                fails.append(f"{what}: humming_forward's repeated call did not launch from its plan "
                             f"(chord.launch: {launch.status()})")
            fails.append(_prove_trusted(f"{what} call {i + 1}", st, out))
    torch.cuda.synchronize()
    ran = {k: LAUNCHES[k] - before[k] for k in LAUNCHES}
    if not sum(ran.values()):
        fails.append(f"{what}: no kernel launched")
    return ran, [f for f in fails if f]


def list_cases(quick: bool = False) -> list[str]:
    """The lines --list prints: every schedule per family, then every trusted-path case."""
    lines = [f"schedule {family} {s.id}" for family in FAMILIES for s in schedules(family, quick)]
    lines += [f"trusted {c.name} {c.schedule.id}" for c in TRUSTED_CASES]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named: list[Schedule] = []
    if "--schedules" in argv:  # --schedules ID[,ID...]: these schedules' ordinary cases alone
        i = argv.index("--schedules")
        ids = argv[i + 1].split(",") if i + 1 < len(argv) else []
        argv = argv[:i] + argv[i + 2:]
        try:
            named = [Schedule.from_id(x) for x in ids if x]
        except ValueError as exc:
            print(f"sanitize_cases: --schedules: {exc}")
            return 2
        if not named:
            print("sanitize_cases: --schedules needs a comma-separated list of schedule ids")
            return 2
    unknown = [a for a in argv if a not in ("--quick", "--bulk-and-pairs", "--trusted", "--list")]
    if unknown:
        print(f"sanitize_cases: unknown option {unknown[0]} "
              "(use --quick, --bulk-and-pairs, --trusted, --schedules IDS or --list)")
        return 2
    quick = "--quick" in argv
    if "--list" in argv:
        print("\n".join(list_cases(quick)))
        return 0
    only_bulk = "--bulk-and-pairs" in argv
    only_trusted = "--trusted" in argv
    qe, pw = random_experts(E, N, K, seed=1)
    launches = 0
    if not only_trusted:
        for family, run in (("indexed", indexed), ("grouped_contiguous", contiguous), ("grouped_masked", masked)):
            if named:
                todo = [x for x in named if x.family == family]
            elif only_bulk:
                todo = [Schedule.from_id(i) for i in BULK_AND_PAIRS[family]]
            else:
                todo = schedules(family, quick)
            for s in todo:
                print(f"[sanitize_cases] {s.id}", flush=True)  # so a tool's report can be told apart by kernel
                launches += run(s, qe, pw)
    trusted = 0
    if not only_bulk and not named:
        for case in TRUSTED_CASES:
            ran, fails = run_trusted(case, qe, pw)
            trusted += sum(ran.values())
            print(f"[sanitize_cases] trusted {case.name}: {case.schedule.id}, {sum(ran.values())} launches "
                  f"({ran['python']} python, {ran['plan']} plan){' FAILED' if fails else ''}", flush=True)
            FAILS.extend(fails)
    print(f"sanitize_cases: {launches} launches, {len(TRUSTED_CASES) if not (only_bulk or named) else 0} trusted-path cases "
          f"({trusted} launches), {len(FAILS)} failed proofs")
    for f in FAILS:
        print("  FAIL", f)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
