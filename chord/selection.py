"""Selection: how a problem becomes a schedule under a policy.

``select(profile, problem)`` is a pure function of host integers (it never reads a device
tensor, so it never syncs and is safe under CUDA-graph capture), memoized per (profile,
problem, policy). The policy (``CHORD_POLICY``) is ``profile`` (the profile's rules,
:mod:`chord.profiles`), ``heuristic`` (the selection rules of :data:`POLICY_RULES` alone: block_m
from rows per expert, wave-aware BN, the split-K gate, the touched-experts estimate, raster on
wgmma tiles, buffered-K for grouped decode, ...; each can be switched off for its ablation) or
``batch_invariant`` (one schedule per layer). ``schedule_table`` gives a layer's decisions as
row ranges (vLLM's tuning rows).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Sequence

from chord import _env
from chord._env import flag
from chord.knobs import (K_BLOCK, KNOB, WGMMA_BLOCK_MS, WGMMA_BUILT_OTHER_REGS, Problem, Schedule, _check_family,
                         pairs_fit, wgmma_operand_regs)
from chord.profiles import Decision, Profile, _fit_n_tiles, _fit_schedule, _rule_for, load_profile


@lru_cache(maxsize=4096)
def _explain(profile: Profile, problem: Problem, policy: "Policy | None" = None) -> Decision:
    dec = _explain_rules(profile, problem, policy)
    return replace(dec, deployment=profile.deployment_name or profile.deployment, role=profile.role)


def _explain_rules(profile: Profile, problem: Problem, policy: "Policy | None") -> Decision:
    if policy is None and profile.deployment_name == "custom":  # no profile covers the layer
        policy = Policy("heuristic")
    if policy is not None and policy.source != "profile":
        dec = (_heuristic_decision(profile, problem, policy) if policy.source == "heuristic"
               else _batch_invariant_decision(profile, problem))
        if flag("CHORD_PRINT_SCHEDULES"):
            print(f"[chord] {dec.profile} {problem}: {dec.reason}")
        return dec
    rules = profile.rules.get(problem.family)
    if not rules:
        raise ValueError(f"profile {profile.name} has no rules for family {problem.family!r}")
    rpe = problem.rows_per_expert
    chosen = _rule_for(rules, rpe, problem.k)
    cands = tuple(_fit_schedule(problem.family, r.schedule, problem.n) for r in rules
                  if r.k_min <= problem.k <= r.k_max)
    sched = _fit_schedule(problem.family, chosen.schedule, problem.n)
    bound = "inf" if math.isinf(chosen.max_rows_per_expert) else f"{chosen.max_rows_per_expert:g}"
    reason = (f"{rpe:.2f} rows/expert <= {bound} -> {sched.id}"
              + (f" ({chosen.why})" if chosen.why else ""))
    dec = Decision(problem, sched, profile.name, cands, reason)
    if flag("CHORD_PRINT_SCHEDULES"):
        print(f"[chord] {profile.name} {problem}: {reason}")
    return dec


def explain(profile: Profile | str, problem: Problem, policy: "Policy | str | None" = None) -> Decision:
    """What `select` chose for `problem`, the candidates it considered and why."""
    pol = current_policy() if policy is None else parse_policy(policy)
    return _explain(load_profile(profile), problem, None if pol.source == "profile" else pol)


def select(profile: Profile | str, problem: Problem, policy: "Policy | str | None" = None) -> Schedule:
    """The schedule for `problem` under `profile`: pure function of host integers, memoized.

    `policy` (default: $CHORD_POLICY, see :func:`parse_policy`): ``"profile"`` uses the tuned
    profile's rules; ``"heuristic"`` the selection rules of :func:`_heuristic_decision` alone (no
    profile row), each of which can be switched off (``"heuristic,-wave_aware_bn"``)."""
    return explain(profile, problem, policy).schedule


def schedule_table(profile: Profile | str, family: str, num_experts: int, n: int, k: int,
                   top_k: int = 1, policy: "Policy | str | None" = None) -> list[tuple[int, int, Schedule]]:
    """The profile as `(min_rows, max_rows, schedule)` rows over routed rows (exclusive lower,
    inclusive upper bound), e.g. for vLLM's tuning-config rows. The last max is 2**31-1. Under
    the heuristic policy, the heuristic's own step function (the same decisions `select` makes)."""
    prof = load_profile(profile)
    pol = current_policy() if policy is None else parse_policy(policy)
    if pol.source == "profile" and prof.deployment_name == "custom":  # no profile covers the layer
        pol = Policy("heuristic")
    if pol.source == "heuristic":
        return _heuristic_table(prof, _check_family(family), num_experts, n, k, top_k, pol)
    if pol.source == "batch_invariant":
        return [(0, 2**31 - 1, _explain(prof, Problem(_check_family(family), num_experts, n, k, 1, top_k), pol).schedule)]
    rules = prof.rules.get(_check_family(family))
    if not rules:
        raise ValueError(f"profile {prof.name} has no rules for family {family!r}")
    out = []
    lo = 0
    for r in rules:
        if not r.k_min <= k <= r.k_max:
            continue
        hi = 2**31 - 1 if math.isinf(r.max_rows_per_expert) else int(math.floor(r.max_rows_per_expert * num_experts))
        if hi > lo:
            out.append((lo, hi, _fit_schedule(family, r.schedule, n)))
            lo = hi
    return out



# ---------------------------------------------------------------------------------------------
# selection policy: the tuned profile, or the heuristic's rules (each can be switched off)

#: the heuristic's rules, each a selection-policy entry of chord.optimizations
POLICY_RULES = {
    "tok_e_block_m": "block_m from rows per touched expert: the smallest legal tile that covers them (above the "
                     "largest tile: the fewest tiles, then the least padding); off: 16 rows (mma) / 128 rows "
                     "(wgmma) whatever the batch",
    "wave_aware_bn": "BN = 256 only when its tiles fill whole waves of the SMs (at least one wave, >= 90 % of "
                     "the last one used), else 128; off: BN = 128",
    "split_k_gate": "split-K only when the tile grid fills less than half the CTA slots and K is long (>= 32 "
                    "K blocks): the largest split that fits the slots; off: never split",
    "touched_estimate": "the experts a batch touches are estimated for routes spread uniformly at random, "
                        "E (1 - (1 - 1/E)^rows) (TP8 64 tokens: 283 of 384 experts), which sizes the tile grid "
                        "the wave and split-K rules see; off: min(E, rows), every expert touched once there are "
                        "as many rows as experts (balanced routing)",
    "wgmma_raster": "raster 8 on every wgmma schedule with more than one token tile: 8 token tiles (of one or "
                    "several experts) walk the N blocks together, so their activations and weights are read "
                    "from L2 once per group; off: launch order",
    "wide_warp_tiles": "at K > 512, wgmma from 32-row token tiles (more than 16 rows per touched expert) with several 16-feature "
                       "weight tiles per warp: 4 per warp (block_n 512 on 8 warps, or 256 on 4 where N has no "
                       "512 blocks) up to 64-row tiles, 2 per warp (block_n 256 on 8 warps) up to 192; one wgmma "
                       "group per k16 step up to 32 rows (else two steps where the registers allow) and a "
                       "512-K ring up to 32 rows; off: wgmma above 40 rows per touched expert, one weight tile "
                       "per warp (block_n 128 or 256 by wave_aware_bn)",
    "grouped_tma_pairs": "grouped families, wgmma token tiles of 192 rows or more: the activation box by one TMA "
                         "copy (tma_x) and CTA pairs on neighbouring N blocks (cluster_n 2, where the N-block count "
                         "is even), measured 2-4 % faster on the 256-row tile at tok256 / tok512 contiguous and "
                         "neutral to slower on 32-128-row tiles; off: the cp.async gather, CTAs in grid order",
    "decode_stream_tile": "mma token tiles of at most 16 rows (decode) at K >= 4096 where N has 8+ 256-feature blocks: "
                          "BN 256 on 4 warps with a 6-stage ring (~55 KB of weights in flight per CTA) whatever "
                          "the waves: timed 8-19 % faster than the wave-aware 128-wide, 8-stage tile at 1-4 rows "
                          "per expert with 12 and 24 local experts (EP32 / EP16 gate_up, H200 2026-12-03, "
                          "chord tune of the large-EP suite); off: wave_aware_bn and buffered_k decide",
    "split_k_fill": "mma tiles whose grid fills more than half but at most 3/4 of one wave of CTA slots, K "
                    "long (>= 64 K blocks): split-K 2 so the last wave is full (EP32 decode gate_up: 64 vs 69 us "
                    "at 2 rows per expert, 72 vs 112 us at 12 on the 256-wide tile, H200 2026-12-03); off: split_k_gate alone",
    "buffered_k": "grouped decode on the mma loop keeps about 512 K elements in flight per CTA (a ring of 8 "
                  "stages of 64) at the most CTAs per SM whose ring fits in shared memory: the depth the "
                  "heuristic already chose, now a switchable rule (768 measured 11-12 % slower on 32-row masked "
                  "blocks; 4 stages within 3 % either way); off: the knob default ring, 4 stages (256 K)",
}
BUFFERED_K_ELEMS = 512  # K elements in flight per CTA for grouped decode (the buffered_k rule)
DECODE_STREAM_MIN_K_BLOCKS = 64  # decode_stream_tile: from K = 4096 (gate_up; EP down has K = 2048)
DECODE_STREAM_STAGES = 6  # decode_stream_tile's ring: 6 x 64 K of a 256-feature tile
DECODE_STREAM_MIN_N = 2048  # ... where N has at least 8 such blocks (measured at N = 4096; TP8's N = 512 is not)
SPLIT_FILL_MAX = 0.75  # split_k_fill: a grid of at most this fraction of one wave (and more than half)
SPLIT_FILL_MIN_K_BLOCKS = 64
SMS_H200 = 132
SMEM_PER_SM = 228 * 1024
WGMMA_MIN_ROWS_PER_EXPERT = 40  # rows per touched expert above which the heuristic takes wgmma (wide_warp_tiles off)
WIDE_WGMMA_MIN_ROWS_PER_EXPERT = 16  # ... with wide_warp_tiles on: 32-row tiles, 4 weight tiles per warp
SHORT_K_BLOCKS = 8  # at most this many K blocks of 64 (TP8 down): n_tiles instead of wide warp tiles
GROUPED_TMA_MIN_BLOCK_M = 192  # grouped_tma_pairs: token tiles from which TMA + CTA pairs pay (measured at 256)
WIDE_TILE_MAX_BLOCK_M = 192  # wide_warp_tiles: 2 weight tiles per warp up to this token tile (256 has no registers)


POLICY_SOURCES = ("profile", "heuristic", "batch_invariant")
BATCH_INVARIANT_ROWS_PER_EXPERT = 64  # the batch the batch-invariant schedule of a layer is chosen for


@dataclass(frozen=True)
class Policy:
    """How `select` decides: ``source`` "profile" (the tuned rules), "heuristic" (the rules of
    POLICY_RULES alone, those in ``off`` switched off) or "batch_invariant" (one schedule per
    layer whatever the batch, without split-K, so a row's output bits do not depend on which
    other rows share its batch: vLLM's ``VLLM_BATCH_INVARIANT=1``)."""

    source: str = "profile"
    off: frozenset = frozenset()

    def __post_init__(self) -> None:
        if self.source not in POLICY_SOURCES:
            raise ValueError(f"policy source must be 'profile', 'heuristic' or 'batch_invariant', got {self.source!r}")
        bad = sorted(set(self.off) - set(POLICY_RULES))
        if bad:
            raise ValueError(f"policy: unknown rules {bad} (the heuristic's rules are {sorted(POLICY_RULES)})")
        if self.off and self.source != "heuristic":
            raise ValueError("policy: rules can be switched off only under the heuristic source")

    def on(self, rule: str) -> bool:
        return rule not in self.off

    @property
    def name(self) -> str:
        return ",".join([self.source, *(f"-{r}" for r in sorted(self.off))])


@lru_cache(maxsize=64)
def _parse_policy_text(text: str) -> Policy:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        return Policy()
    off = []
    for p in parts[1:]:
        if not p.startswith("-"):
            raise ValueError(f"policy {text!r}: after the source come rules to switch off, as '-<rule>', got {p!r}")
        off.append(p[1:])
    return Policy(parts[0], frozenset(off))


def parse_policy(policy: "Policy | str") -> Policy:
    """A Policy, or its text: ``profile`` | ``heuristic[,-rule...]`` (rules of POLICY_RULES)."""
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a Policy or a str like 'heuristic,-wave_aware_bn', got {type(policy).__name__}")
    return _parse_policy_text(policy)


def current_policy() -> Policy:
    """$CHORD_POLICY (default ``profile``): the policy every caller's `select` uses, so a shape
    gets one decision whoever calls (chord.ops, chord bench, the humming root)."""
    text = _env.get("CHORD_POLICY")
    try:
        return _parse_policy_text(text)
    except ValueError as exc:
        raise ValueError(f"CHORD_POLICY={text!r}: {exc}") from None


def touched_experts(num_experts: int, rows: int, uniform: bool = True) -> float:
    """Experts that `rows` routed rows touch: for routes spread uniformly at random the expected
    count E (1 - (1 - 1/E)^rows) (TP8 64 tokens = 512 routes: ~283 of 384); with ``uniform=False``
    balanced routing, min(E, rows). At least 1 for a non-empty batch."""
    if rows <= 0:
        return 0.0
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    if not uniform:
        return float(min(num_experts, rows))
    return max(1.0, num_experts * -math.expm1(rows * math.log1p(-1.0 / num_experts))) if num_experts > 1 else 1.0


def token_tiles(num_experts: int, rows: int, block_m: int, touched: float | None = None) -> int:
    """Token tiles of `rows` routed rows spread evenly over the experts they touch (`touched`,
    default min(E, rows): all of them, or one per row when there are fewer rows than experts)."""
    if rows <= 0:
        return 0
    active = touched if touched is not None else min(num_experts, rows)
    return math.ceil(active) * math.ceil(rows / active / block_m)


def waves(tiles: int, slots: int) -> tuple[int, float]:
    """(waves, fraction of the last wave's slots used) of `tiles` CTAs on `slots` CTA slots."""
    if tiles <= 0:
        return 0, 0.0
    w = -(-tiles // slots)
    return w, (tiles - (w - 1) * slots) / slots


def _fitted(family: str, mainloop: str, bm: int, bn: int, n: int, depth: int | None = None, ntw: int = 1,
            **kw) -> Schedule | None:
    """The heuristic's schedule for one tile: the most CTAs per SM (2 then 1) whose registers fit,
    then the deepest ring that fits their shared memory (mma up to 8 stages, wgmma up to 5), fitted
    to N; None when no such schedule is valid. With `depth`: first a ring of exactly `depth`
    stages at the most CTAs per SM that fit it, then the search above. `ntw`: 16-feature weight
    tiles per warp of a wgmma tile (warps = bn / 16 / ntw)."""
    plans: list[tuple[int, Sequence[int]]] = [(c, (depth,)) for c in (2, 1)] if depth else []
    plans += [(c, range(8 if mainloop == "mma" else 5, 2, -1)) for c in (2, 1)]
    for c, depths in plans:
        for stages in depths:
            knobs = dict(block_m=bm, block_n=bn, warps=bn // 16 // ntw if mainloop == "wgmma" else 4, stages=stages,
                         ctas_per_sm=c, mainloop=mainloop, **kw)
            try:
                sch = _fit_schedule(family, knobs, n)
            except ValueError:
                continue
            if c * (sch.smem_bytes + 1024) <= SMEM_PER_SM:
                return sch
    return None


def _wide_tile(p: Problem, bm: int) -> Schedule | None:
    """The wide_warp_tiles rule's wgmma tile for token tile `bm` (None: none applies). Measured on
    the H200 (docs/optimizations.md, "Wide warp tiles"): 4 weight tiles per warp up to 64 rows
    (block_n 512 on 8 warps: tok32 gate_up 306 vs 345 us, tok64 402 vs 447 us), 2 up to 192 (block_n
    256 on 8 warps: tp8-m16384 gate_up 1721 vs 1880 us); one group per k16 step at 32 rows (gs1 306
    vs gs2 320 us), two steps above where they fit the registers (tok64 gs2 402 vs gs1 418 us)."""
    if bm > WIDE_TILE_MAX_BLOCK_M:
        return None
    if bm <= 64:
        ntw, bn = 4, (512 if p.n % 512 == 0 else 256)
    else:
        ntw, bn = 2, 256
    if p.n % bn:
        return None
    gs = 2 if bm > 32 and wgmma_operand_regs(bm, ntw, 2) + WGMMA_BUILT_OTHER_REGS <= 255 else 1
    depth = BUFFERED_K_ELEMS // K_BLOCK if bm <= 32 else None
    return _fitted(p.family, "wgmma", bm, bn, p.n, depth, ntw=ntw, group_steps=gs)


def _refit(s: Schedule, extra: dict, why: list) -> Schedule:
    """`s` with `extra` knobs, at the deepest ring that still fits its CTAs per SM (n_tiles > 1 adds
    an epilogue tile after the ring); without n_tiles when no depth fits."""
    for attempt in (extra, {k: v for k, v in extra.items() if k != "n_tiles"}):
        for stages in range(s.stages, 2 if s.mainloop == "wgmma" else 1, -1):
            try:
                c = replace(s, stages=stages, **attempt)
            except ValueError:
                continue
            if c.ctas_per_sm * (c.smem_bytes + 1024) <= SMEM_PER_SM:
                return c
        if "n_tiles" in extra:
            why.append("n_tiles dropped: no ring depth fits its epilogue tile")
    return s


def _heuristic_decision(profile: Profile, problem: Problem, policy: Policy) -> Decision:
    """The schedule the heuristic's rules give `problem` (host integers only, no profile row)."""
    p, sms = problem, SMS_H200
    rows = _heuristic_rows(p.rows)
    kb = p.k // K_BLOCK
    et = touched_experts(p.num_experts, rows, uniform=policy.on("touched_estimate"))
    rt = rows / et  # rows per touched expert
    wide = policy.on("wide_warp_tiles") and kb > SHORT_K_BLOCKS  # short K (TP8 down): n_tiles, not wide tiles
    mainloop = "wgmma" if rt > (WIDE_WGMMA_MIN_ROWS_PER_EXPERT if wide else WGMMA_MIN_ROWS_PER_EXPERT) else "mma"
    how = "uniform routes" if policy.on("touched_estimate") else "touched_estimate off: min(E, rows)"
    why = [f"{rows} rows over ~{et:.0f} touched experts ({how}) = {rt:.1f} rows each -> {mainloop}"]
    top = 256 if mainloop == "wgmma" else 128
    cands = tuple(b for b in (WGMMA_BLOCK_MS if mainloop == "wgmma" else (8, 16, 32, 64, 128)) if b <= top)
    if policy.on("tok_e_block_m"):
        need = max(rt, 1.0)
        if need <= cands[-1]:  # one token tile per expert: the smallest that covers its rows
            bm = min(b for b in cands if b >= need)
        else:  # the fewest tiles, then the least padding
            t = math.ceil(need / cands[-1])
            bm = min(b for b in cands if math.ceil(need / b) == t)
        why.append(f"tok_e_block_m: block_m {bm} ({math.ceil(need / bm)} tile(s) of {rt:.1f} rows per expert, "
                   f"padded to {math.ceil(need / bm) * bm})")
    else:
        bm = 128 if mainloop == "wgmma" else 16
        why.append(f"tok_e_block_m off: block_m {bm}")
    m_tiles = max(1, token_tiles(p.num_experts, rows, bm, et))

    def tiles_of(s: Schedule) -> tuple[int, int]:
        return m_tiles * s.grid_n(p.n), sms * s.ctas_per_sm

    depth = None
    if mainloop == "mma" and p.family != "indexed":
        if policy.on("buffered_k"):
            depth = BUFFERED_K_ELEMS // K_BLOCK
            why.append(f"buffered_k: a ring of {depth} stages ({BUFFERED_K_ELEMS} K elements in flight) where it fits")
        else:
            depth = KNOB["stages"].default
            why.append(f"buffered_k off: a ring of {depth} stages ({depth * K_BLOCK} K elements in flight)")
    # BN = 256 needs (for wgmma) 16 warps whose registers hold block_m/2 accumulators each
    s128 = _fitted(p.family, mainloop, bm, 128, p.n, depth)
    s256 = _fitted(p.family, mainloop, bm, 256, p.n, depth) if p.n % 256 == 0 else None
    stream = (policy.on("decode_stream_tile") and mainloop == "mma" and bm <= 16 and kb >= DECODE_STREAM_MIN_K_BLOCKS
              and p.n % 256 == 0 and p.n >= DECODE_STREAM_MIN_N)
    if stream:
        s256 = _fitted(p.family, mainloop, bm, 256, p.n, DECODE_STREAM_STAGES) or s256
    if s128 is None and s256 is None:  # the widest legal tile for a tall block_m
        raise ValueError(f"heuristic: no legal schedule for {p} with block_m {bm}")
    chosen = s128 or s256
    swide = _wide_tile(p, bm) if mainloop == "wgmma" and wide else None
    if swide is not None:
        chosen = swide
        why.append(f"wide_warp_tiles: block_n {swide.block_n} on {swide.warps} warps ({swide.ntw} weight tiles per "
                   f"warp, {swide.group_steps} k16 step(s) per wgmma group, {swide.stages} stages)")
    elif mainloop == "wgmma" and not policy.on("wide_warp_tiles"):
        why.append("wide_warp_tiles off: one weight tile per warp")
    elif mainloop == "wgmma" and not wide:
        why.append(f"wide_warp_tiles: not at {kb} K blocks (short K: one weight tile per warp, n_tiles)")
    if swide is None and stream and s256 is not None:
        chosen = s256
        why.append(f"decode_stream_tile: BN 256, {s256.stages} stages ({kb} K blocks of a decode tile: bytes in flight "
                   "over waves)")
    elif swide is None and policy.on("wave_aware_bn") and s256 is not None:
        t256, slots256 = tiles_of(s256)
        w, last = waves(t256, slots256)
        if t256 >= slots256 and last >= 0.9 or s128 is None:
            chosen = s256
            why.append(f"wave_aware_bn: BN 256 ({t256} tiles = {w} waves of {slots256}, last {100 * last:.0f} % full)")
        else:
            why.append(f"wave_aware_bn: BN 128 (BN 256 would be {t256} tiles = {w} waves of {slots256}, "
                       f"last {100 * last:.0f} % full)")
    elif swide is None and s128 is not None:
        why.append("wave_aware_bn off: BN 128" if not policy.on("wave_aware_bn") else "BN 128 (N has no 256 blocks)")
    extra: dict = {}
    tiles, slots = tiles_of(chosen)
    if mainloop == "wgmma" and m_tiles > 1:
        if policy.on("wgmma_raster"):
            extra["raster"] = 8
            why.append(f"wgmma_raster: raster 8 ({m_tiles} token tiles walk the N blocks in groups of 8)")
        else:
            why.append("wgmma_raster off: launch order")
    if kb <= SHORT_K_BLOCKS and tiles >= 2 * slots:
        nt = 4 if tiles >= 4 * slots else 2
        extra["n_tiles"] = _fit_n_tiles(nt, p.n // chosen.block_n)
        why.append(f"n_tiles {extra['n_tiles']} ({kb} K blocks: one ring over several N blocks)")
    if mainloop == "wgmma" and p.family != "indexed" and chosen.block_m >= GROUPED_TMA_MIN_BLOCK_M:
        if policy.on("grouped_tma_pairs"):
            extra["tma_x"] = 1
            pairs = pairs_fit(p.n, chosen.block_n * extra.get("n_tiles", 1))
            if pairs:
                extra["cluster_n"] = 2
            why.append(f"grouped_tma_pairs: TMA activation box{', CTA pairs' if pairs else ''} "
                       f"({chosen.block_m}-row tiles)")
        else:
            why.append("grouped_tma_pairs off: cp.async gather, CTAs in grid order")
    if policy.on("split_k_gate") and tiles * 2 <= slots and kb >= 32:
        legal = [z for z in KNOB["split_k"].legal if z > 1 and tiles * z <= slots and kb // z >= 4]
        if legal:
            extra["split_k"] = max(legal)
            why.append(f"split_k_gate: split-K {extra['split_k']} ({tiles} tiles fill {slots} slots "
                       f"{100 * tiles / slots:.0f} %)")
    elif not policy.on("split_k_gate"):
        why.append("split_k_gate off: no split-K")
    elif (policy.on("split_k_fill") and mainloop == "mma" and slots < 2 * tiles <= 2 * SPLIT_FILL_MAX * slots
          and kb >= SPLIT_FILL_MIN_K_BLOCKS and 2 in KNOB["split_k"].legal):
        extra["split_k"] = 2
        why.append(f"split_k_fill: split-K 2 ({tiles} tiles fill {100 * tiles / slots:.0f} % of one wave of {slots})")
    if extra:
        chosen = _refit(chosen, extra, why)
    cands = tuple(s for s in (s128, s256, swide) if s is not None)
    return Decision(problem, chosen, f"{profile.gpu}:heuristic", cands,
                    f"heuristic ({policy.name}): " + "; ".join(why) + f" -> {chosen.id}")


_ROW_GRID = tuple(sorted({math.floor(2.0 ** (j / 64) + 1e-9) for j in range(0, 64 * 31 + 1)}))


def _batch_invariant_decision(profile: Profile, problem: Problem) -> Decision:
    """One schedule per layer (family, experts, N, K): the heuristic's for
    BATCH_INVARIANT_ROWS_PER_EXPERT rows per expert, without split-K (it changes the order of the
    K sum) and without the batch-dependent knobs, whatever `problem.rows` is."""
    p = problem
    ref = Problem(p.family, p.num_experts, p.n, p.k, BATCH_INVARIANT_ROWS_PER_EXPERT * p.num_experts, p.top_k)
    base = _heuristic_decision(profile, ref, Policy("heuristic")).schedule
    s = replace(base, split_k=1)
    return Decision(problem, s, f"{profile.gpu}:batch_invariant", (s,),
                    f"batch_invariant: one schedule for every batch of this layer (the heuristic's at "
                    f"{BATCH_INVARIANT_ROWS_PER_EXPERT} rows per expert, no split-K) -> {s.id}")


def _heuristic_rows(rows: int) -> int:
    """Routed rows as the heuristic sees them: snapped down to a grid of 64 points per octave
    (every count up to 92 exactly), so its decisions are a step function whose table
    (`schedule_table`) `select` matches exactly."""
    import bisect

    return _ROW_GRID[max(0, bisect.bisect_right(_ROW_GRID, max(rows, 1)) - 1)]


def _heuristic_table(profile: Profile, family: str, num_experts: int, n: int, k: int, top_k: int,
                     policy: Policy) -> list[tuple[int, int, Schedule]]:
    # rows in [g_i, g_i+1) are decided at grid point g_i: table rows (g_i - 1, g_i+1 - 1]
    out: list = []
    grid = [g for g in _ROW_GRID if g <= num_experts * 4096]
    for i, g in enumerate(grid):
        s = _explain(profile, Problem(family, num_experts, n, k, g, top_k), policy).schedule
        hi = grid[i + 1] - 1 if i + 1 < len(grid) else 2**31 - 1
        lo = 0 if i == 0 else g - 1
        if out and out[-1][2] == s:
            out[-1] = (out[-1][0], hi, s)
        else:
            out.append((lo, hi, s))
    out[-1] = (out[-1][0], 2**31 - 1, out[-1][2])
    return out
