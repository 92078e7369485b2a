"""Every optimization of Chord's kernels and selection as data (docs/optimizations.md): what it
does and how to switch it off.

An entry is either a **knob** of :data:`chord.schedule.KNOBS` (switching it off is the same
schedule with that knob at its ``off`` value: one kernel template, never a second kernel) or a
**policy** rule of schedule selection (switching it off changes which schedule a shape gets).
Entries whose code does not exist yet say so (``status``) and name the issue that builds them;
they cannot be switched off, so notebooks show them as planned rather than measure them.

Notebooks and tests walk :data:`OPTIMIZATIONS`; docs/optimizations.md holds each measured
ablation.
"""
from __future__ import annotations

from dataclasses import dataclass

from chord.schedule import KNOB, Schedule, override

IMPLEMENTED = "implemented"
PLANNED = "planned"


@dataclass(frozen=True)
class Optimization:
    name: str
    what: str
    kind: str  # "knob" | "policy"
    knob: str | None  # the Schedule knob (kind == "knob")
    status: str  # IMPLEMENTED | PLANNED
    notebook: str  # the notebook that shows it
    issue: int | None = None  # where a planned one is being built
    rule: str | None = None  # a policy entry's rule of chord.schedule.POLICY_RULES (the heuristic's)

    @property
    def policy_off(self) -> str:
        """The selection policy with this rule switched off (policy entries with a heuristic rule):
        ``select(profile, problem, policy=o.policy_off)``; its "on" side is ``"heuristic"``."""
        if self.kind != "policy" or self.rule is None:
            raise ValueError(f"optimization {self.name!r} is not a rule of the heuristic policy")
        return f"heuristic,-{self.rule}"

    @property
    def off_value(self):
        """The knob value that switches this optimization off (knobs only)."""
        if self.kind != "knob" or self.knob is None:
            raise ValueError(f"optimization {self.name!r} is a {self.kind}, not a schedule knob")
        return KNOB[self.knob].off

    def is_on(self, schedule: Schedule) -> bool:
        """Whether `schedule` uses this optimization (knobs only; a knob that does not apply to the
        schedule's main loop is off)."""
        off = self.off_value
        if not KNOB[self.knob].applies(lambda k: getattr(schedule, k)):
            return False
        return getattr(schedule, self.knob) != off

    def switch_off(self, schedule: Schedule) -> Schedule:
        """The same schedule with this optimization off (knobs only; an implemented one)."""
        if self.status != IMPLEMENTED:
            raise ValueError(f"optimization {self.name!r} is {self.status} (issue {self.issue}): nothing to switch off")
        off = self.off_value
        if getattr(schedule, self.knob) == off:
            return schedule
        if self.knob == "mainloop":
            # mma.sync: 4 warps (block_n is a multiple of 64 for wgmma), the wgmma-only knobs at
            # their defaults, and block_m at most 128 (the mma tile's limit: a 256-row wgmma
            # tile becomes a 128-row mma tile, so an indexed call needs routing for that size)
            return override(schedule, mainloop=off, warps=4, wgmma_wait=KNOB["wgmma_wait"].default,
                            producer=KNOB["producer"].default, group_steps=KNOB["group_steps"].default,
                            persistent=KNOB["persistent"].default, queue=KNOB["queue"].default,
                            bulk_w=KNOB["bulk_w"].default,
                            tma_x=KNOB["tma_x"].default, l2_hint=KNOB["l2_hint"].default,
                            block_m=min(schedule.block_m, 128))
        if self.knob == "direct":  # the CTA ring's warps each own block_n / 16 / warps tiles: at most block_n / 16
            return override(schedule, direct=off, warps=min(schedule.warps, schedule.block_n // 16))
        if self.knob == "persistent":  # the work queue hands persistent CTAs their items: off with them
            return override(schedule, persistent=off, queue=KNOB["queue"].default)
        if self.knob == "split_k":  # one CTA per tile has nothing to sum through a cluster: off with it
            return override(schedule, split_k=off, split_cluster=KNOB["split_cluster"].default)
        if self.knob == "pdl":  # the prefetch before the wait needs the PDL launch: off with it
            return override(schedule, pdl=off, pdl_prefetch=KNOB["pdl_prefetch"].default)
        if self.knob == "swap":
            # tokens on the M side come in 16-row MMA tiles: an 8-row tile becomes a 16-row one (an
            # indexed call then needs routing for that block size)
            # (folded scales and warp-private rings need the swap: they go off with it)
            return override(schedule, swap=off, block_m=-(-schedule.block_m // 16) * 16, fold=KNOB["fold"].default,
                            direct=KNOB["direct"].default,
                            warps=min(schedule.warps, schedule.block_n // 16) if schedule.direct else schedule.warps)
        return override(schedule, **{self.knob: off})


OPTIMIZATIONS: tuple[Optimization, ...] = (
    Optimization("wgmma main loop",
                 "dequantized int4 weights in registers are the A operand of wgmma.m64n{BT}k16, tokens the B "
                 "operand from the swizzled cp.async ring; off: mma.sync.m16n8k16 (same weight layout)",
                 "knob", "mainloop", IMPLEMENTED, "02_wgmma_pipelining"),
    Optimization("batched wgmma.wait_group 1",
                 "one wgmma group stays in flight while the next K block is dequantized into the other register "
                 "set; off: wait_group 0 after every group (bit-identical)",
                 "knob", "wgmma_wait", IMPLEMENTED, "02_wgmma_pipelining"),
    Optimization("warp-specialized producer",
                 "producers fill the ring and publish each stage on an mbarrier, the MMA warps wait only for data: "
                 "on the mma loop one producer warp moves a stage's weights and scales with the copy engine "
                 "(cp.async.bulk) and gathers its activation rows; on the wgmma loop a producer warpgroup gives its "
                 "registers to the consumers (setmaxnreg), keeping only what its gather needs (40 / 48 / 88 by token "
                 "tile). Off: every thread copies, one CTA barrier per K block (bit-identical). The profile's 64- and "
                 "128-token prefill rules use the wgmma side (measured 1.3-4.4 % faster per pair on an H100, "
                 "docs/optimizations.md)",
                 "knob", "producer", IMPLEMENTED, "02_wgmma_pipelining"),
    Optimization("tile raster",
                 "groups of token tiles walk every N block before the next group, so an expert's weights are read "
                 "from HBM once per group; off: launch order",
                 "knob", "raster", IMPLEMENTED, "04_wave_aware_bn"),
    Optimization("split-K",
                 "CTAs share an output tile along K with a deterministic fp32 fix-up (TP8 one token); off: one CTA "
                 "per tile",
                 "knob", "split_k", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("split-K through a cluster",
                 "the split_k CTAs of one output tile are launched as one 1 x 1 x split_k thread-block cluster: "
                 "each leaves its fp32 partial in its own shared memory, and after a cluster barrier each sums its "
                 "share of the tile's 16-byte output chunks from every partial through distributed shared memory "
                 "(ld.shared::cluster, in z order) and stores them, so no partial, counter or fence goes through "
                 "L2 (the workspace fix-up's store, fence, atomic and reload are one L2 round trip each on the "
                 "last CTA's path). In the profile's EP32 decode split rules (1.8-2.3 % per pair, H200); 1.5 % "
                 "slower on TP8 one token's split-8 tile, which keeps the workspace; off: the workspace fix-up "
                 "(same bits)",
                 "knob", "split_cluster", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("multi-tile CTAs",
                 "one CTA walks n_tiles consecutive N blocks of its (expert, token tile) through one ring that keeps "
                 "loading across tile boundaries, so at short K (TP8 down: 4 K blocks) the ring stays full instead "
                 "of filling and draining per tile; off: one N block per CTA",
                 "knob", "n_tiles", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("persistent tile scheduling",
                 "a grid of about one wave (SMs x CTAs per SM) walks every (token tile, n_tiles N blocks) item "
                 "through one continuous ring; the tile list comes from the device's routing (indexed: the padded "
                 "blocks up to num_tokens_post_padded, never read on the host), and an item's routing loads are "
                 "issued one item ahead. Measured 1-25 % slower than n_tiles on TP8 down and the masked decode "
                 "tile (docs/optimizations.md), so no profile rule uses it; off: one CTA per item (the launched "
                 "grid)",
                 "knob", "persistent", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("stmatrix epilogue",
                 "each warp moves its fp32 accumulators to the staged bf16 output tile with stmatrix.trans, one "
                 "instruction per two 8-token groups of a 16-feature tile (the fragment of a group is two 8x8 "
                 "matrices, features x tokens, stored as token rows); off: one 16-bit shared store per value. "
                 "Same output bits; it counts where the epilogue is a large part of a tile's life (short K: TP8 "
                 "down)",
                 "knob", "stmatrix", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("bulk weight copies",
                 "thread 0 moves each stage's swap16 words and scales with the copy engine: a 128-feature tile "
                 "group's K block is one 4 KB run of words and one 512-byte run of scales in the swap16g layout, "
                 "so a stage is 2 x block_n / 128 cp.async.bulk copies completing on the slot's mbarrier instead "
                 "of block_n / 16 + 1 16-byte cp.async per thread; off: every thread's cp.async (same bits)",
                 "knob", "bulk_w", IMPLEMENTED, "02_wgmma_pipelining"),
    Optimization("TMA activation copies",
                 "grouped families (a tile's rows are consecutive rows of x): the stage's block_m x 64 activation "
                 "box is one cp.async.bulk.tensor through a tensor map of x, written with the 128-byte swizzle "
                 "the wgmma descriptor reads; off: block_m / 32 16-byte cp.async per thread of 8 warps (same bits)",
                 "knob", "tma_x", IMPLEMENTED, "05_grouped_contiguous_masked"),
    Optimization("L2 policies for gathered rows",
                 "wgmma multistage: the activation rows are copied with an evict-last L2 policy (l2_hint 1: and the "
                 "weights and scales evict-first; 2: weights without a hint), asking L2 to keep a token row that "
                 "the next expert it is routed to, or the next N block, gathers again while the weights stream "
                 "past (measured: no time gained, docs/optimizations.md); off: no hint (same bits)",
                 "knob", "l2_hint", IMPLEMENTED, "04_wave_aware_bn"),
    Optimization("CTA pairs",
                 "the kernel is launched in clusters of two CTAs on neighbouring N blocks of one token tile (a "
                 "compile-time cluster shape; the raster walks the pairs), so the hardware starts both at once on "
                 "one GPC and they read the tile's token rows from L2 together; nothing is exchanged between them "
                 "(multicasting the activation box between the pair measured slower: docs/optimizations.md); off: "
                 "CTAs in grid order (same bits)",
                 "knob", "cluster_n", IMPLEMENTED, "05_grouped_contiguous_masked"),
    Optimization("programmatic dependent launch",
                 "the kernel is launched with programmatic stream serialization (cuLaunchKernelEx) and waits for "
                 "the previous grid on the stream (griddepcontrol.wait) before its first global access, then "
                 "lets the next grid launch (griddepcontrol.launch_dependents): back to back, the next GEMM's "
                 "CTAs are launched and resident while this one's last wave runs, so the launch and CTA start "
                 "leave the critical path (the point at TP8 one token, whose kernels run a few microseconds); "
                 "off: plain stream order (same bits)",
                 "knob", "pdl", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("PDL weight prefetch",
                 "with programmatic dependent launch, the weights are the one input no kernel before writes, so "
                 "before griddepcontrol.wait warp 0 of about the first wave of CTAs (SMs x ctas_per_sm) guesses "
                 "from the routing as it reads then which expert each of the grid's first CTAs will work on and "
                 "asks L2 for their first ring of weight and scale K blocks (cp.async.bulk.prefetch.L2, at most "
                 "24 MB for the grid; grouped_contiguous: each CTA its own tile): the weight stream starts while "
                 "the previous kernel's tail runs (TP8 one token: down's 7.3 MB while gate_up ends). On the "
                 "direct loop every warp instead guesses its own CTA's expert and copies its ring's first stages "
                 "into shared memory, kept when the routing read after the wait agrees. Nothing is decided "
                 "before the wait, so a wrong guess costs bytes, not bits; off: pdl=1 alone (same bits)",
                 "knob", "pdl_prefetch", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("stream-K",
                 "indexed family on the mma loop: about one wave of CTAs splits the (token block, N block, K block) "
                 "units of the device's valid blocks (up to num_tokens_post_padded, so work and bytes follow the "
                 "active experts) into equal contiguous ranges, each walked through one continuous ring across "
                 "tiles and experts; a tile shared by CTAs meets as fp32 partials in a workspace of two tiles per "
                 "CTA, summed by its last contributor in CTA order (deterministic) in the same pass (TP8 one "
                 "token: 8 of 384 experts); off: one CTA per tile (or split_k)",
                 "knob", "stream_k", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("warp-private rings",
                 "mma loop, operand swap (direct=1): the CTA's warps split its K range, each walking its share of "
                 "every tile of the N block through its own cp.async ring and waiting only for its own copy groups "
                 "(no CTA barrier in the K loop); the warps' fp32 partials are summed once, in warp order, before "
                 "the epilogue, so a one-token GEMM can give every SM several independent streams without split-K "
                 "CTAs (TP8 one token). Not yet measured on a GPU, in no profile rule; off: one ring per CTA, a CTA "
                 "barrier per K block, at most block_n / 16 warps",
                 "knob", "direct", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("bounded 2-CTA/SM window",
                 "register budget for two resident CTAs per SM on mid-size tiles, to hide cp.async latency; off: "
                 "one CTA per SM",
                 "knob", "ctas_per_sm", IMPLEMENTED, "06_split_and_stream_k"),
    Optimization("tok_e block-M rule",
                 "block_m follows rows per expert: the profile's rules (tuned per suite point by `chord tune`) and, "
                 "without a profile row, the heuristic's rule: the smallest token tile that covers an expert's "
                 "rows (above the largest tile: the fewest tiles, then the least padding); off: 16 rows (mma) / "
                 "128 rows (wgmma) for every batch",
                 "policy", None, IMPLEMENTED, "01_tokens_per_expert", rule="tok_e_block_m"),
    Optimization("decode operand swap",
                 "dequantized weights are the MMA M operand (16 features per m16n8k16) and tokens the N side in "
                 "8-token tiles; off: tokens on M in 16-row tiles (an 8-row tile grows to 16) and the same weight "
                 "registers as two n8 B operands",
                 "knob", "swap", IMPLEMENTED, "03_decode_operand_swap"),
    Optimization("folded group scales",
                 "mma loop, operand swap: the weights enter the MMA as their exact bf16 codes 128 + u; each 32-K "
                 "group's fp32 partial sum starts from -136 * sum(x) (one MMA of a constant per token tile, "
                 "shared by the warp's weight tiles) and is scaled once per output element (FFMA), instead of "
                 "HSUB2 + HMUL2 on every dequantized bf16 pair (decode loop body: 332 -> 268 SASS instructions "
                 "per K block at 8 x 256); off: bias and scale on the bf16 pairs",
                 "knob", "fold", IMPLEMENTED, "03_decode_operand_swap"),
    Optimization("wave-aware BN",
                 "BN=256 only when its tiles fill whole waves of the SMs (at least one wave and >= 90 % of the "
                 "last), else 128; off: BN=128",
                 "policy", None, IMPLEMENTED, "04_wave_aware_bn", rule="wave_aware_bn"),
    Optimization("split-K gate",
                 "split-K only when the tile grid fills less than half the CTA slots and K has >= 32 blocks (TP8 "
                 "one token): the largest split that fits; off: never split",
                 "policy", None, IMPLEMENTED, "06_split_and_stream_k", rule="split_k_gate"),
    Optimization("shape-aware stream-K gate",
                 "a selection rule giving stream-K to the shapes whose tile grid does not fill the GPU; waits for a "
                 "stream-K schedule that measures faster somewhere: at TP8 one token (the gate's shape) every "
                 "stream-K candidate was 1.16-1.45x slower than the profile's split-K / one-tile schedules on the "
                 "H200 (docs/optimizations.md, \"Stream-K\"), so a gate now would only pick slower kernels",
                 "policy", None, PLANNED, "06_split_and_stream_k", issue=6),
    Optimization("semi-static token slicing",
                 "persistent CTAs walk a static plan fixed by the schedule and the device's routing (item "
                 "blockIdx.x, then a stride of gridDim.x; the launched grid of a non-persistent schedule is static "
                 "too) instead of claiming items from a work queue; off: the dynamic queue (queue=1: an atomic "
                 "counter hands out every item after the first, reset by the grid's last CTA)",
                 "knob", "queue", IMPLEMENTED, "03_decode_operand_swap"),
    Optimization("latency-tuned buffered-K",
                 "grouped decode on the mma loop keeps about 512 K elements in flight per CTA (a ring of 8 stages "
                 "of 64) at the most CTAs per SM whose ring fits in shared memory: the depth the heuristic chose "
                 "before, made a switchable rule. Measured on the H200: 768 for 32-row masked blocks 11-12 % "
                 "slower (not used); against 4 stages within 3.3 % either way, 4 ahead on 6 of 8 GEMMs by 1-2.4 %; "
                 "off: the default ring of 4 stages",
                 "policy", None, IMPLEMENTED, "05_grouped_contiguous_masked", rule="buffered_k"),
    Optimization("uniform touched-experts estimate",
                 "the heuristic sizes the tile grid from the experts a batch touches when its routes fall "
                 "uniformly at random, E (1 - (1 - 1/E)^rows) (TP8 64 tokens: 283 of 384), so the wave and "
                 "split-K rules see the tiles that launch; off: min(E, rows), as if routing were balanced",
                 "policy", None, IMPLEMENTED, "04_wave_aware_bn", rule="touched_estimate"),
    Optimization("wide warp tiles",
                 "2 or 4 16-feature weight tiles per warp on the wgmma loop (block_n 256 or 512 on 8 warps; the "
                 "schedule's warps and group_steps knobs), with one or two k16 steps per wgmma group so the 2-4x "
                 "accumulators fit: each token row is read by fewer CTAs and each barrier covers more MACs. The "
                 "profile uses them from 32 to 192 rows per expert at long K; the heuristic's rule from 16 rows "
                 "per touched expert (32-row tiles) at K > 512; off: wgmma above 40 rows per touched expert, one "
                 "weight tile per warp",
                 "policy", None, IMPLEMENTED, "02_wgmma_pipelining", rule="wide_warp_tiles"),
    Optimization("TMA and CTA pairs on tall grouped tiles",
                 "the heuristic gives grouped-family wgmma schedules of 192+ token rows the TMA activation copy and "
                 "CTA pairs (tma_x, cluster_n 2 where the N-block count is even): measured 2-4 % faster on the "
                 "256-row tile at tok256 / tok512 contiguous, neutral to slower on smaller tiles; off: the cp.async "
                 "gather, CTAs in grid order",
                 "policy", None, IMPLEMENTED, "05_grouped_contiguous_masked", rule="grouped_tma_pairs"),
    Optimization("decode streaming tile",
                 "the heuristic gives mma decode tiles (at most 16 token rows) at K >= 4096 where N has 8 or more "
                 "256-feature blocks BN 256 on 4 warps with a 6-stage ring (~55 KB of weights in flight per "
                 "CTA), whatever the waves: with 12 and 24 local experts (EP32 / EP16) the wave-aware 128-wide "
                 "tile streamed 8-19 % slower at 1-4 rows per expert (chord tune of the large-EP suite, H200 2026-12-03); off: the "
                 "wave-aware BN and buffered-K rules decide",
                 "policy", None, IMPLEMENTED, "04_wave_aware_bn", rule="decode_stream_tile"),
    Optimization("split-K to fill the wave",
                 "the heuristic splits K in two where an mma tile grid fills more than half but at most 3/4 of "
                 "one wave and K >= 4096, so the one wave is full (EP32 decode gate_up: 64 vs 69 us at 2 rows "
                 "per expert, H200 2026-12-03); off: the split-K gate alone",
                 "policy", None, IMPLEMENTED, "06_split_and_stream_k", rule="split_k_fill"),
    Optimization("raster on every wgmma tile",
                 "the heuristic gives every wgmma schedule with more than one token tile raster 8 (8 token "
                 "tiles, of one expert or of several, walk the N blocks together); off: launch order",
                 "policy", None, IMPLEMENTED, "05_grouped_contiguous_masked", rule="wgmma_raster"),
)

BY_NAME = {o.name: o for o in OPTIMIZATIONS}


def implemented_knobs() -> tuple[Optimization, ...]:
    return tuple(o for o in OPTIMIZATIONS if o.kind == "knob" and o.status == IMPLEMENTED)


def ablations(schedule: Schedule) -> dict[str, Schedule]:
    """For each implemented knob `schedule` uses: the same schedule with only that one switched off."""
    out = {}
    for o in implemented_knobs():
        if o.is_on(schedule):
            out[o.name] = o.switch_off(schedule)
    return out
