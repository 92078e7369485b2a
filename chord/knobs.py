"""Knobs, schedules and problems: the kernel library's vocabulary.

:data:`KNOBS` defines every kernel knob once (its schedule-id token, default, legal values, the
name of the constant the rendered kernel reads, the optimization it stands for); a
:class:`Schedule` (whose fields are generated from the table) holds one value per knob, checks them against the table and against the rules between knobs, and has a stable,
readable id (``Schedule.from_id`` parses it back). A :class:`Problem` is the host-known integers
of one GEMM call. The shared-memory and register arithmetic the checks need lives here too.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from functools import cached_property, lru_cache

FAMILIES = ("indexed", "grouped_contiguous", "grouped_masked")
_FAMILY_TAG = {"indexed": "idx", "grouped_contiguous": "gcon", "grouped_masked": "gmsk"}
_TAG_FAMILY = {v: k for k, v in _FAMILY_TAG.items()}
K_BLOCK = 64  # K elements per pipeline stage (fixed by the swap16 layout)
MAX_SMEM_PER_CTA = 227 * 1024
WGMMA_OTHER_REGS = 16  # registers a wgmma thread needs at least besides accumulators and A operands (ptxas -v)
# ... and what ptxas 13.0 used besides them on the wide tiles built (176 x 256 group_steps 1: 246 - 176 - 16 = 54):
# the heuristic gives a tile two k16 steps per group only where they fit with this much room
WGMMA_BUILT_OTHER_REGS = 56


def pairs_fit(n: int, block_n_cta: int) -> bool:
    """Whether CTA pairs (cluster_n 2: two CTAs on neighbouring N blocks) tile a GEMM of `n` output
    features in blocks of `block_n_cta` (block_n x n_tiles): an even N-block count. The one place
    chord.ops, the profile fit, the heuristic and `chord tune` ask."""
    return (n // block_n_cta) % 2 == 0


def wgmma_operand_regs(block_m: int, ntw: int, group_steps: int) -> int:
    """Accumulator and A-operand registers per thread of a wgmma tile: ntw x block_m/2 fp32
    accumulators and two register sets of group_steps x ntw A fragments (4 registers each)."""
    return ntw * block_m // 2 + 2 * group_steps * ntw * 4


def wgmma_producer_regs(block_m: int) -> int:
    """setmaxnreg of the wgmma producer warpgroup (WgmmaWarpSpecialized::kProducerRegs): what its
    activation copy plan needs (ceil(block_m / 16) row sources per thread), 40 / 48 / 88 registers
    for block_m <= 64 / <= 128 / larger; the consumers get the rest."""
    iters = (block_m * 8 + 127) // 128
    return 40 if iters <= 4 else 48 if iters <= 8 else 88


WGMMA_BLOCK_MS = (16, 32, 48, 64, 96, 128, 192, 256)  # wgmma token tiles worth building (N = 8..256)


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return family


@dataclass(frozen=True)
class Knob:
    """One kernel knob, defined once: the schedule id, profile parsing, ``chord tune``'s
    candidates and the JIT render all read this table (:data:`KNOBS`).

    ``token`` is its part of the schedule id; ``always`` knobs always appear there, the others
    only when they differ from ``default`` (so ids of older profiles still parse). ``off`` is the
    value that switches the optimization it stands for off (None: a shape knob, not an
    optimization). ``cxx`` names the ``static constexpr`` member of the configuration struct that
    ``chord.jit.render`` emits for a schedule (``struct ChordCfg { static constexpr int kBlockM = 8;
    ... }``) and that the kernel parts of ``csrc/`` read by name: a value of (0, 1) becomes a ``bool``,
    a text value an enumerator (``chord::Mainloop::kWgmma``), any other an ``int``.
    """

    name: str
    token: str
    default: object
    legal: tuple
    cxx: str
    doc: str
    always: bool = False
    off: object = None
    requires: tuple = ()  # (knob, value) pairs under which this knob applies at all
    above: tuple = ()  # (knob, value) pairs: it applies only where that knob is above the value

    def applies(self, values) -> bool:
        """Whether this knob applies to a schedule or profile rule whose knob values `values(name)`
        gives (its ``requires`` and ``above`` conditions hold)."""
        return (all(values(k) == v for k, v in self.requires) and all(values(k) > v for k, v in self.above))


MAINLOOPS = ("mma", "wgmma")

KNOBS: tuple[Knob, ...] = (
    Knob("block_m", "m", None, tuple(range(8, 257, 8)), "kBlockM", "token rows per CTA tile (indexed: moe_align block size)",
         always=True),
    Knob("block_n", "n", None, tuple(range(16, 1025, 16)), "kBlockN", "output features per CTA tile", always=True),
    Knob("warps", "w", 4, (1, 2, 4, 8, 12, 16), "kWarps",
         "warps per CTA; each owns block_n/16/warps 16-feature weight tiles (wgmma: 1, 2 or 4, whole warpgroups)",
         always=True),
    Knob("stages", "s", 4, tuple(range(2, 13)), "kStages", "K blocks of 64 in the cp.async ring", always=True),
    Knob("ctas_per_sm", "c", 1, (1, 2, 3, 4), "kCtasPerSm",
         "CTAs per SM the register budget is sized for", always=True, off=1),
    Knob("split_k", "sk", 1, (1, 2, 3, 4, 6, 8, 12, 16), "kSplitK",
         "CTAs sharing one output tile along K (fp32 partials, deterministic fix-up)", off=1),
    Knob("split_cluster", "skc", 0, (0, 1), "kSplitCluster",
         "split_k > 1: 1 = the split_k CTAs of one output tile are launched as one thread-block cluster (1 x 1 x "
         "split_k): each leaves its fp32 partial in its own shared memory, and after a cluster barrier each CTA "
         "sums its share of the tile's 16-byte output chunks from every partial through distributed shared memory "
         "(in z order: the same bits as 0) and stores them; no workspace, no counter, no global round trip; "
         "0 = partials meet in a global workspace and the last CTA to arrive (an atomic counter) sums them", off=0,
         requires=(("producer", 0), ("cluster_n", 1)), above=(("split_k", 1),)),
    Knob("mainloop", "", "mma", MAINLOOPS, "kMainloop",
         "mma: cp.async + mma.sync.m16n8k16; wgmma: cp.async + wgmma.m64nBTk16, weights in registers", off="mma"),
    Knob("wgmma_wait", "wait", 1, (0, 1), "kWgmmaWait",
         "wgmma groups left in flight while the next K block is dequantized (batched wait_group 1)", off=0,
         requires=(("mainloop", "wgmma"),)),
    Knob("producer", "ws", 0, (0, 1), "kProducer",
         "1 = warp-specialized: producer warps fill the ring and publish each stage on an mbarrier, the MMA warps "
         "wait only for data and hand each slot back on another (mma: one producer warp moving a stage's weights "
         "and scales with the copy engine, cp.async.bulk of 4 KB + 512 B per 128 features, and its activation "
         "rows with cp.async; wgmma: a producer warpgroup that gives its registers to the consumers, its thread 0 "
         "moving the weights and scales with the copy engine where block_n is a multiple of 128 and its 128 "
         "threads gathering the activation rows with cp.async that arrive on the slot's mbarrier as they land); "
         "0 = every thread copies and a CTA barrier per K block publishes a stage", off=0),
    Knob("group_steps", "gs", 4, (1, 2, 4), "kGroupSteps",
         "wgmma: k16 steps per committed wgmma group (4: one group per K block; 1-2: 4/GS groups per block, "
         "two register sets of GS steps, for tiles whose accumulators leave no room for four steps)",
         requires=(("mainloop", "wgmma"),)),
    Knob("raster", "r", 0, (0, 2, 4, 8, 16, 32, 64), "kRaster",
         "token tiles per raster group walked over all N blocks (0: launch order)", off=0),
    Knob("swap", "swap", 1, (0, 1), "kSwap",
         "mma: 1 = operand swap (weights on the MMA M side, tokens on N in 8-token tiles), 0 = tokens on M in "
         "16-row tiles and weights on N (the swap's off side)", off=0, requires=(("mainloop", "mma"),)),
    Knob("n_tiles", "nt", 1, (1, 2, 4, 8), "kNTilesPerCta",
         "consecutive N blocks one CTA walks through one continuous ring (the next tile loads while a "
         "tile's epilogue runs; for short K, where a one-tile CTA mostly fills and drains its ring)", off=1),
    Knob("persistent", "ps", 0, (0, 1), "kPersistent",
         "wgmma multistage: 1 = about one wave of CTAs walks every (token tile, n_tiles N blocks) item, one "
         "continuous ring across items (indexed: up to the device's num_tokens_post_padded), 0 = one CTA per "
         "item", off=0, requires=(("mainloop", "wgmma"),)),
    Knob("stmatrix", "stm", 1, (0, 1), "kStmatrix",
         "epilogue: 1 = fragments to the staged bf16 tile with stmatrix.trans (one instruction per 2 x 64 values "
         "of a warp), 0 = one 16-bit shared store per value (same output bits); split-K tiles stage through "
         "the fix-up instead", off=0, requires=(("swap", 1), ("split_k", 1))),
    Knob("bulk_w", "bw", 0, (0, 1), "kBulkW",
         "wgmma multistage: 1 = thread 0 moves each stage's swap16 words and scales with the copy engine "
         "(cp.async.bulk: one 4 KB and one 512-byte run per 128 features, completing on the slot's mbarrier), "
         "0 = every thread's 16-byte cp.async copies", off=0, requires=(("mainloop", "wgmma"),)),
    Knob("tma_x", "tx", 0, (0, 1), "kTmaX",
         "wgmma multistage, grouped families: 1 = the stage's block_m x 64 activation box in one TMA copy "
         "(cp.async.bulk.tensor through a tensor map of x), 0 = every thread's 16-byte cp.async copies",
         off=0, requires=(("mainloop", "wgmma"),)),
    Knob("l2_hint", "l2", 0, (0, 1, 2), "kL2Hint",
         "wgmma multistage, the threads' cp.async copies: 1 = the activation rows read with an evict-last L2 "
         "policy and the weights and scales evict-first, 2 = the activation rows evict-last and the weights "
         "without a hint (a gathered token row is read again by each expert it is routed to, in every N "
         "block, and the weights stream past it), 0 = no L2 hint", off=0, requires=(("mainloop", "wgmma"),)),
    Knob("cluster_n", "cn", 1, (1, 2), "kClusterN",
         "2 = CTA pairs: the kernel is launched in clusters of two CTAs that take neighbouring N blocks of one "
         "token tile, so the hardware runs the pair at the same time on one GPC and its token rows are read "
         "from L2 by both together (no data is exchanged); 1 = CTAs in grid order", off=1),
    Knob("pdl", "pd", 0, (0, 1), "kPdl",
         "1 = programmatic dependent launch: launched with programmatic stream serialization, the kernel waits "
         "for the previous grid on the stream (griddepcontrol.wait) before its first global access and then "
         "lets the next grid launch, so back-to-back GEMMs overlap one's tail with the next one's launch and "
         "CTA start; 0 = plain stream order", off=0),
    Knob("pdl_prefetch", "pf", 0, (0, 1), "kPdlPrefetch",
         "pdl=1: 1 = before griddepcontrol.wait, warp 0 of about the first wave of CTAs guesses from the routing "
         "as it reads then which expert each of the grid's first CTAs will work on and asks L2 for their first "
         "ring of weight and scale K blocks (cp.async.bulk.prefetch.L2, at most 24 MB; grouped_contiguous: each "
         "CTA its own tile), so the weight stream starts while the previous kernel ends; nothing decided before "
         "the wait (a wrong guess costs bytes, not bits); with direct=1 each warp of every CTA guesses its own "
         "CTA's expert and copies its ring's first stages - 1 K blocks of words and scales into shared memory, kept "
         "when the routing read after the wait agrees (else drained and copied again); 0 = nothing before the "
         "wait", off=0,
         requires=(("pdl", 1), ("persistent", 0), ("stream_k", 0))),
    Knob("stream_k", "stk", 0, (0, 1), "kStreamK",
         "mma, indexed: 1 = stream-K: about one wave of CTAs splits the (token block, N block, K block) units "
         "of the device's valid blocks (up to num_tokens_post_padded, so work and bytes follow the active "
         "experts) into equal contiguous ranges walked through one continuous ring; a tile shared by several "
         "CTAs meets as fp32 partials in a bounded workspace (two tiles per CTA) and the last CTA to arrive "
         "sums them in CTA order (deterministic) in the same pass; 0 = one CTA per tile (or split_k)", off=0,
         requires=(("mainloop", "mma"),)),
    Knob("queue", "dq", 0, (0, 1), "kQueue",
         "persistent=1: 0 = semi-static token slicing: each CTA's items are fixed by the schedule and the "
         "device's routing (item blockIdx.x, then a stride of gridDim.x); 1 = a dynamic work queue: the first "
         "item is blockIdx.x, every later one is claimed with an atomic counter (p.counters, reset by the "
         "grid's last CTA), so CTAs that finish early take the remaining items", off=1,
         requires=(("persistent", 1),)),
    Knob("fold", "fo", 0, (0, 1), "kFold",
         "mma, operand swap: 1 = the int4 code bias and the group scale are applied to fp32 partial sums, once "
         "per 32-K group and output element: the weights enter the MMA as the exact bf16 codes 128 + u, each "
         "group's partial starts from -136 * sum(x) (one MMA per token tile shared by the warp's weight tiles) "
         "and acc += scale * partial; 0 = bias and scale applied to every dequantized bf16 pair (HSUB2 + HMUL2)",
         off=0, requires=(("mainloop", "mma"), ("swap", 1))),
    Knob("direct", "dr", 0, (0, 1), "kDirect",
         "mma, operand swap: 1 = warp-private rings: the CTA's warps split its K range, each walking its share "
         "of every tile of the N block (block_n 16-128) through its own stages-deep cp.async ring, waiting only "
         "for its own copy groups (no CTA barrier in the K loop), and the warps' fp32 partials are summed once, "
         "in warp order, before the epilogue; for the few-row GEMMs whose CTA ring mostly fills and drains "
         "(TP8 one token); 0 = one ring per CTA, a CTA barrier per K block",
         off=0, requires=(("mainloop", "mma"), ("swap", 1))),
)
KNOB = {k.name: k for k in KNOBS}
DIRECT_BLOCK_NS = (16, 32, 64, 128)  # the direct loop's N blocks: every warp holds all BN/16 tiles' partials


def _illegal_value(knob: Knob, value) -> str:
    """The error for a value outside `knob.legal`: the legal values as a range where they are one."""
    legal = knob.legal
    if isinstance(knob.default, str):
        return f"{knob.name} must be one of {legal}, got {value!r}"
    step = legal[1] - legal[0] if len(legal) > 8 else 0
    if step and legal[0] % step == 0 and legal == tuple(range(legal[0], legal[-1] + 1, step)):
        what = (f"in [{legal[0]}, {legal[-1]}]" if step == 1 else
                f"a multiple of {step} in [{legal[0]}, {legal[-1]}]")
    else:
        what = "one of " + ", ".join(map(str, legal))
    return f"{knob.name} must be {what}, got {value}"


def _knob_fields(cls):
    """Makes `cls` a frozen dataclass with one field per row of :data:`KNOBS` after its own
    (``family``), in the table's order, each with the row's default (None: required)."""
    notes = dict(cls.__dict__.get("__annotations__", {}))
    for knob in KNOBS:
        notes[knob.name] = "str" if isinstance(knob.default, str) else "int"
        if knob.default is not None:
            setattr(cls, knob.name, knob.default)
    cls.__annotations__ = notes
    return dataclass(frozen=True)(cls)


@_knob_fields
class Schedule:
    """Every knob of one kernel instantiation: ``family`` and one field per row of :data:`KNOBS`
    (``block_m``, ``block_n``, ``warps``, ``stages``, ``ctas_per_sm``, ``split_k``, ``mainloop``, ...
    in the table's order, with its defaults). ``id`` is stable and readable."""

    family: str

    def __post_init__(self) -> None:
        _check_family(self.family)
        for knob in KNOBS:
            v = getattr(self, knob.name)
            want = str if isinstance(knob.default, str) else int
            if isinstance(v, bool) or not isinstance(v, want):
                raise TypeError(f"Schedule.{knob.name} must be {'a str' if want is str else 'an int'}, got {v!r} "
                                f"({type(v).__name__})")
        for knob in (KNOB["mainloop"], KNOB["ctas_per_sm"]):  # the tile checks below branch on / divide by these
            if getattr(self, knob.name) not in knob.legal:
                raise ValueError(_illegal_value(knob, getattr(self, knob.name)))
        wg = self.mainloop == "wgmma"
        top = 256 if wg else 128
        if self.block_m % 8 or not 8 <= self.block_m <= top:
            raise ValueError(f"block_m must be a multiple of 8 in [8, {top}] for mainloop {self.mainloop}, "
                             f"got {self.block_m}")
        if wg:
            self._check_wgmma_tile()
        else:
            self._check_mma_tile()
        self._check_combinations()
        for knob in KNOBS:  # every knob's value against its row of the table
            v = getattr(self, knob.name)
            if v not in knob.legal:
                raise ValueError(_illegal_value(knob, v))
        if self.smem_bytes + self.static_smem_bytes > MAX_SMEM_PER_CTA:
            raise ValueError(f"schedule {self.id} needs {self.smem_bytes} B of dynamic + up to {self.static_smem_bytes} B "
                             f"of static shared memory (> {MAX_SMEM_PER_CTA} a CTA may use)")

    def _check_wgmma_tile(self) -> None:
        """The warp layout, ring depth and register budget of a wgmma tile."""
        if self.block_n % 64 or not 64 <= self.block_n <= 512:
            raise ValueError(f"block_n must be a multiple of 64 in [64, 512] for mainloop wgmma, got {self.block_n}")
        legal_warps = [w for w in (self.block_n // 16, self.block_n // 32, self.block_n // 64)
                       if w % 4 == 0 and 4 <= w <= 16]
        if not legal_warps:
            raise ValueError(f"block_n={self.block_n} has no wgmma warp layout: it needs whole warpgroups (4-16 "
                             f"warps) of 1, 2 or 4 16-feature weight tiles each (block_n in 64..512 with "
                             f"block_n/16 = 4, 8, 12 or 16 warps x 1, 2 or 4)")
        if self.warps not in legal_warps:
            raise ValueError(f"warps must be one of {legal_warps} for mainloop wgmma with block_n={self.block_n} "
                             f"(whole warpgroups, each warp 1, 2 or 4 16-feature weight tiles), got {self.warps}")
        if self.stages < 3:
            raise ValueError(f"stages must be >= 3 for mainloop wgmma, got {self.stages}")
        if self.swap != 1:
            raise ValueError(f"swap applies to mainloop mma only (wgmma always has the weights on M), got swap={self.swap}")
        if self.producer and self.ctas_per_sm != 1:
            raise ValueError(f"producer=1 (setmaxnreg) needs ctas_per_sm=1, got {self.ctas_per_sm}")
        if self.producer:  # setmaxnreg: consumers get what the producer warpgroup gives back
            entry = min(256, 65536 // self.threads // 8 * 8)
            cap = min(256, (entry + 128 * (entry - wgmma_producer_regs(self.block_m)) // (self.warps * 32)) // 8 * 8)
            if cap <= entry:
                raise ValueError(f"producer=1 with block_n={self.block_n}, warps={self.warps}, block_m={self.block_m}: "
                                 f"the producer warpgroup has no registers to hand over ({self.threads} threads start "
                                 f"with {entry}, the producer keeps {wgmma_producer_regs(self.block_m)}); use 8 or "
                                 f"12 consumer warps")
        else:
            cap = min(255, 65536 // (self.threads * self.ctas_per_sm) // 8 * 8)
        acc = self.ntw * self.block_m // 2
        a_regs = wgmma_operand_regs(self.block_m, self.ntw, self.group_steps) - acc
        if acc + a_regs + WGMMA_OTHER_REGS > cap:
            raise ValueError(f"mainloop wgmma with block_m={self.block_m}, {self.ntw} weight tiles per warp and "
                             f"group_steps={self.group_steps} needs about {acc} accumulator + {a_regs} A + "
                             f"{WGMMA_OTHER_REGS} other registers per thread, over the budget of {cap} for "
                             f"{self.threads} threads x {self.ctas_per_sm} CTAs/SM")

    def _check_mma_tile(self) -> None:
        """The warp layout and operand layout of an mma tile."""
        if self.warps not in (1, 2, 4, 8):
            raise ValueError(f"warps must be 1, 2, 4 or 8, got {self.warps}")
        if self.direct:
            self._check_direct_tile()
        elif self.block_n <= 0 or self.block_n % (16 * self.warps):
            raise ValueError(f"block_n must be a positive multiple of 16*warps={16 * self.warps}, "
                             f"got {self.block_n}")
        for name in ("wgmma_wait", "group_steps"):
            if getattr(self, name) != KNOB[name].default:
                raise ValueError(f"{name} applies to mainloop wgmma only, got {getattr(self, name)} with mma")
        if self.producer and self.block_n % 128:
            raise ValueError(f"producer=1 with mainloop mma copies whole groups of 8 weight tiles (128 features) "
                             f"with the copy engine, so it needs block_n a multiple of 128, got {self.block_n}")
        if self.producer and self.stream_k:
            raise ValueError("producer=1 with mainloop mma walks one tile per CTA; stream_k=1 needs producer=0")
        if self.swap == 0 and self.stmatrix != KNOB["stmatrix"].default:
            raise ValueError(f"stmatrix applies to the swapped layout only (swap=1), got stmatrix={self.stmatrix} "
                             f"with swap=0")
        if self.swap == 0 and self.block_m % 16:
            raise ValueError(f"swap=0 (tokens on the MMA M side) needs block_m a multiple of 16, got {self.block_m}")

    def _check_direct_tile(self) -> None:
        """The direct loop (direct=1): its warps split K, each walking every tile of the N block."""
        if self.block_n not in DIRECT_BLOCK_NS:
            raise ValueError(f"direct=1 keeps a partial of every tile of the N block in each warp, so block_n must be "
                             f"one of {DIRECT_BLOCK_NS}, got {self.block_n}")
        if self.block_m > 32:
            raise ValueError(f"direct=1 copies every token row into each warp's ring slot, so block_m must be "
                             f"at most 32, got {self.block_m}")
        clash = {k: getattr(self, k) for k in ("producer", "stream_k", "n_tiles")
                 if getattr(self, k) != KNOB[k].default}
        if self.swap != 1:
            clash = {"swap": self.swap, **clash}
        if clash:
            raise ValueError("direct=1 needs swap=1 and the default producer / stream_k / n_tiles (one N block per "
                             "CTA, each warp filling its own ring: no producer or stream-K walk), got "
                             + ", ".join(f"{k}={v}" for k, v in clash.items()))

    def _check_combinations(self) -> None:
        """The rules between knobs (which knobs apply together)."""
        wg = self.mainloop == "wgmma"
        if self.split_k > 1 and self.stmatrix != KNOB["stmatrix"].default:
            raise ValueError(f"stmatrix applies to unsplit tiles only (split-K tiles stage through the fix-up), got "
                             f"stmatrix={self.stmatrix} with split_k={self.split_k}")
        if self.split_cluster and (self.split_k > 8 or not KNOB["split_cluster"].applies(lambda k: getattr(self, k))):
            raise ValueError(f"split_cluster=1 launches a tile's split_k CTAs as one cluster of at most 8 (the portable "
                             f"cluster size) whose every thread meets at cluster barriers, so it needs split_k in 2..8, "
                             f"producer=0 and cluster_n=1, got split_k={self.split_k}, producer={self.producer}, "
                             f"cluster_n={self.cluster_n}")
        if self.persistent and (not wg or self.producer or self.split_k != 1):
            raise ValueError(f"persistent=1 needs mainloop wgmma with producer=0 and split_k=1 (the multistage ring "
                             f"walks the CTA's tiles), got mainloop={self.mainloop}, producer={self.producer}, "
                             f"split_k={self.split_k}")
        if self.queue and not self.persistent:
            raise ValueError(f"queue={self.queue} hands persistent CTAs their items, so it needs persistent=1, got "
                             f"persistent={self.persistent}")
        if self.n_tiles > 1 and (self.split_k != 1 or self.producer):
            raise ValueError(f"n_tiles={self.n_tiles} needs split_k=1 and producer=0 (one output tile per split-K CTA; "
                             f"the producer loop walks one tile), got split_k={self.split_k}, producer={self.producer}")
        for name in ("bulk_w", "tma_x"):
            v = getattr(self, name)
            if v and (not wg or self.producer or self.persistent):
                raise ValueError(f"{name}=1 needs mainloop wgmma with producer=0 and persistent=0 (the multistage ring, "
                                 f"one item per CTA), got mainloop={self.mainloop}, producer={self.producer}, "
                                 f"persistent={self.persistent}")
        if self.l2_hint and (not wg or self.producer or self.bulk_w or self.tma_x):
            raise ValueError(f"l2_hint={self.l2_hint} hints the multistage wgmma loop's cp.async copies, so it needs "
                             f"mainloop wgmma with producer=0, bulk_w=0 and tma_x=0, got mainloop={self.mainloop}, "
                             f"producer={self.producer}, bulk_w={self.bulk_w}, tma_x={self.tma_x}")
        if self.bulk_w and self.block_n % 128:
            raise ValueError(f"bulk_w=1 copies whole groups of 8 weight tiles (128 features), so it needs block_n a "
                             f"multiple of 128, got block_n={self.block_n}")
        if self.cluster_n > 1 and self.persistent:
            raise ValueError(f"cluster_n={self.cluster_n} pairs the launched grid's CTAs, so it needs persistent=0")
        if self.stream_k:
            clash = {k: getattr(self, k) for k in ("split_k", "n_tiles", "persistent", "raster", "cluster_n")
                     if getattr(self, k) != KNOB[k].default}
            if self.mainloop != "mma" or self.family != "indexed" or clash:
                raise ValueError(f"stream_k=1 needs the indexed family on mainloop mma and the default split_k / "
                                 f"n_tiles / persistent / raster / cluster_n (stream-K splits the tile grid itself), "
                                 f"got family={self.family}, mainloop={self.mainloop}"
                                 + "".join(f", {k}={v}" for k, v in clash.items()))
        if self.pdl_prefetch and (not self.pdl or self.persistent or self.stream_k):
            raise ValueError(f"pdl_prefetch=1 prefetches before the PDL wait for the launched grid's tiles, so it needs "
                             f"pdl=1, persistent=0 and stream_k=0, got pdl={self.pdl}, persistent={self.persistent}, "
                             f"stream_k={self.stream_k}")
        if self.tma_x and self.family == "indexed":
            raise ValueError("tma_x=1 needs a grouped family (consecutive rows of x per tile); the indexed family "
                             "gathers its rows")
        if self.direct and wg:
            raise ValueError("direct=1 is a form of the mma loop (mainloop mma: each warp's own cp.async ring feeding "
                             "mma.sync); the wgmma loops share one ring per CTA, got mainloop=wgmma")
        if self.fold and (wg or self.swap != 1):
            raise ValueError(f"fold=1 needs mainloop mma with the operand swap (swap=1), got mainloop={self.mainloop}, "
                             f"swap={self.swap}")

    @cached_property  # the id string is built once per Schedule (the launch path reads it per call)
    def id(self) -> str:
        head = (f"{_FAMILY_TAG[self.family]}-m{self.block_m}n{self.block_n}k{K_BLOCK}"
                f"-w{self.warps}-s{self.stages}-c{self.ctas_per_sm}")
        tail = "".join(f"-{k.token}{getattr(self, k.name)}" for k in KNOBS
                       if not k.always and getattr(self, k.name) != k.default)
        return head + tail

    @property
    def ntw(self) -> int:
        """16-feature weight tiles per warp (wgmma: one wgmma per tile and k16 step; NTW in csrc)."""
        return self.block_n // 16 // self.warps

    @property
    def threads(self) -> int:
        """Threads per CTA: the MMA warps, plus the producers of a warp-specialized loop (wgmma: a
        warpgroup; mma: one warp)."""
        return self.warps * 32 + ((128 if self.mainloop == "wgmma" else 32) if self.producer else 0)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: one tile per CTA, the pipeline or the epilogue tile, whichever is
        larger (the epilogue reuses the drained ring); several (n_tiles > 1, persistent, stream_k), both
        (the ring keeps loading during an epilogue); direct=1, the largest of the warps' rings, their fp32
        partials and the epilogue tile, which use it one after the other; plus the base-alignment slack of
        the wgmma ring (mirrors
        ``MoeKernel::kSmemBytes`` in csrc, which every rendered kernel static_asserts against this
        number)."""
        tiles16 = self.block_n // 16
        epilogue = self.block_m * (self.block_n + 8) * 2
        if self.direct:  # the warps' rings, then their fp32 partials, then the epilogue's tile (mma_direct.cuh)
            rings = self.warps * self.stages * (tiles16 * 512 + tiles16 * 64 + self.block_m * (K_BLOCK * 2 + 16))
            partials = self.warps * tiles16 * (self.block_m // 8) * 512 if self.warps > 1 else 0
            if self.split_cluster:
                epilogue = max(epilogue, self.block_m * self.block_n * 4)
            return max(rings, partials, epilogue)
        stage = self.block_m * K_BLOCK * 2 + tiles16 * 512 + tiles16 * 64
        slack = 0
        if self.mainloop == "wgmma":
            stage = -(-stage // 1024) * 1024
            slack = 1024 - 16
        ring = self.stages * stage
        if self.split_cluster:  # the CTA's fp32 partial, read by its cluster (csrc/moe/epilogue.cuh)
            epilogue = max(epilogue, self.block_m * self.block_n * 4)
        both = self.n_tiles > 1 or self.persistent or self.stream_k
        return (ring + epilogue if both else max(ring, epilogue)) + slack

    @property
    def static_smem_bytes(self) -> int:
        """Upper bound of the kernel's static shared memory: the tile's input and output row
        indices (2 x 8 B per token row; persistent: three tiles' worth; stream_k: two blocks' output
        rows besides) plus the scalars and mbarriers (ptxas -v: 16 x block_m + 128 at most on every schedule built); it counts against the same
        227 KB as the ring."""
        return 16 * self.block_m * (3 if self.persistent else 2 if self.stream_k else 1) + 256

    @property
    def block_n_cta(self) -> int:
        """Output features one CTA computes (block_n x n_tiles)."""
        return self.block_n * self.n_tiles

    def grid_n(self, n: int) -> int:
        """CTAs along N for a GEMM with `n` output features (a multiple of cluster_n)."""
        return n // self.block_n_cta

    def knobs(self) -> dict:
        """The knob values by name (what a profile rule holds)."""
        return {k.name: getattr(self, k.name) for k in KNOBS}

    @classmethod
    def from_id(cls, text: str) -> "Schedule":
        return _parse_id(text)

    def __str__(self) -> str:
        return self.id


_ID_RE = re.compile(r"^(idx|gcon|gmsk)-m(\d+)n(\d+)k64-w(\d+)-s(\d+)-c(\d+)((?:-[a-z]+\d*)*)$")


def _id_part(knob: Knob, value) -> str:
    return value if isinstance(knob.default, str) else f"{knob.token}{value}"


# What a schedule id looks like, from the table: the head, then each optional knob's part.
_ID_FORM = "idx-m16n128k64-w4-s4-c1" + "".join(
    f"[-{k.legal[-1] if isinstance(k.default, str) else k.token + str(next(v for v in reversed(k.legal) if v != k.default))}]"
    for k in KNOBS if not k.always)


@lru_cache(maxsize=512)
def _parse_id(text: str) -> Schedule:
    m = _ID_RE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"schedule id {text!r} is not of the form {_ID_FORM}")
    tag, bm, bn, w, s, c, tail = m.groups()
    extra: dict = {}
    for part in filter(None, tail.split("-")):
        for knob in KNOBS:
            if knob.always:
                continue
            if isinstance(knob.default, str):
                hit = part in knob.legal
            else:
                hit = part.startswith(knob.token) and part[len(knob.token):].isdigit()
            if not hit:
                continue
            if knob.name in extra:
                raise ValueError(f"schedule id {text!r}: {knob.name} given twice ({part!r} after "
                                 f"{_id_part(knob, extra[knob.name])!r}); each part may appear once")
            extra[knob.name] = part if isinstance(knob.default, str) else int(part[len(knob.token):])
            break
        else:
            raise ValueError(f"schedule id {text!r}: unknown part {part!r}")
    return Schedule(_TAG_FAMILY[tag], int(bm), int(bn), int(w), int(s), int(c), **extra)


@dataclass(frozen=True)
class Problem:
    """Host-known integers of one GEMM call (never device values)."""

    family: str
    num_experts: int  # local experts in the weight tensor
    n: int
    k: int
    rows: int  # routed rows of this call (indexed: M*top_k; grouped: rows in the layout)
    top_k: int = 1

    def __post_init__(self) -> None:
        _check_family(self.family)
        for name in ("num_experts", "n", "k", "top_k"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Problem.{name} must be positive, got {getattr(self, name)}")
        if self.rows < 0:
            raise ValueError(f"Problem.rows must be >= 0, got {self.rows}")

    @property
    def rows_per_expert(self) -> float:
        """Expected rows per local expert (tok_e): what decides the schedule."""
        return self.rows / self.num_experts


def override(schedule: Schedule, **knobs) -> Schedule:
    """A copy with some knobs changed (what notebooks use to switch an optimization off)."""
    return replace(schedule, **knobs)


def as_dict(schedule: Schedule) -> dict:
    d = asdict(schedule)
    d["id"] = schedule.id
    return d
