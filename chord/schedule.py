"""Schedules (every kernel knob), problems (host-known shape integers) and the selection policy.

This is the one place where a shape becomes a kernel choice. ``select(profile, problem)`` is a
pure function of host integers (it never reads a device tensor, so it never syncs and is safe
under CUDA-graph capture), memoized per (profile, problem).

Profiles (``profiles/<gpu>.json``) hold one entry per deployment (``ep8-prefill``,
``ep8-decode``, ``tp8``), each a list of rules per family ordered by
``max_rows_per_expert``; the first rule whose bound covers the problem's expected rows per
expert gives the schedule, which is then fitted to N (block_n must divide N).

Without profile rows (``CHORD_POLICY=heuristic``, or ``select(..., policy="heuristic")``) the
heuristic's selection rules decide alone (block_m from rows per expert, wave-aware BN, the
split-K gate, the touched-experts estimate, raster on wgmma tiles, buffered-K for grouped
decode; ``POLICY_RULES``), each of which can be switched off for its ablation.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from chord._env import flag
from chord._resources import profiles_dir

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
WGMMA_PRODUCER_REGS = 88  # setmaxnreg of the producer warpgroup (WgmmaSwap64::kProducerRegs)
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
    optimization). ``slot`` names the template parameter of ``csrc/`` the value lands in.
    """

    name: str
    token: str
    default: object
    legal: tuple
    slot: str
    doc: str
    always: bool = False
    off: object = None
    requires: tuple = ()  # (knob, value) pairs under which this knob applies at all


MAINLOOPS = ("mma", "wgmma")

KNOBS: tuple[Knob, ...] = (
    Knob("block_m", "m", None, tuple(range(8, 257, 8)), "BT", "token rows per CTA tile (indexed: moe_align block size)",
         always=True),
    Knob("block_n", "n", None, tuple(range(16, 1025, 16)), "BN", "output features per CTA tile", always=True),
    Knob("warps", "w", 4, (1, 2, 4, 8, 12, 16), "WARPS",
         "warps per CTA; each owns block_n/16/warps 16-feature weight tiles (wgmma: 1, 2 or 4, whole warpgroups)",
         always=True),
    Knob("stages", "s", 4, tuple(range(2, 13)), "STAGES", "K blocks of 64 in the cp.async ring", always=True),
    Knob("ctas_per_sm", "c", 1, (1, 2, 3, 4), "__launch_bounds__ min blocks",
         "CTAs per SM the register budget is sized for", always=True, off=1),
    Knob("split_k", "sk", 1, (1, 2, 3, 4, 6, 8, 12, 16), "SPLIT",
         "CTAs sharing one output tile along K (fp32 partials, deterministic fix-up)", off=1),
    Knob("mainloop", "", "mma", MAINLOOPS, "Mainloop",
         "mma: cp.async + mma.sync.m16n8k16; wgmma: cp.async + wgmma.m64nBTk16, weights in registers", off="mma"),
    Knob("wgmma_wait", "wait", 1, (0, 1), "WAIT",
         "wgmma groups left in flight while the next K block is dequantized (batched wait_group 1)", off=0,
         requires=(("mainloop", "wgmma"),)),
    Knob("producer", "ws", 0, (0, 1), "PRODUCER",
         "wgmma: 1 = one producer warp feeds the ring through mbarriers (warp-specialized), 0 = every thread "
         "copies and a CTA barrier per K block publishes it", off=0, requires=(("mainloop", "wgmma"),)),
    Knob("group_steps", "gs", 4, (1, 2, 4), "GS",
         "wgmma: k16 steps per committed wgmma group (4: one group per K block; 1-2: 4/GS groups per block, "
         "two register sets of GS steps, for tiles whose accumulators leave no room for four steps)",
         requires=(("mainloop", "wgmma"),)),
    Knob("raster", "r", 0, (0, 2, 4, 8, 16, 32, 64), "RASTER",
         "token tiles per raster group walked over all N blocks (0: launch order)", off=0),
    Knob("swap", "swap", 1, (0, 1), "SWAP",
         "mma: 1 = operand swap (weights on the MMA M side, tokens on N in 8-token tiles), 0 = tokens on M in "
         "16-row tiles and weights on N (the swap's off side)", off=0, requires=(("mainloop", "mma"),)),
    Knob("n_tiles", "nt", 1, (1, 2, 4, 8), "NTILES",
         "consecutive N blocks one CTA walks through one continuous ring (the next tile loads while a "
         "tile's epilogue runs; for short K, where a one-tile CTA mostly fills and drains its ring)", off=1),
    Knob("persistent", "ps", 0, (0, 1), "PERSISTENT",
         "wgmma multistage: 1 = about one wave of CTAs walks every (token tile, n_tiles N blocks) item, one "
         "continuous ring across items (indexed: up to the device's num_tokens_post_padded), 0 = one CTA per "
         "item", off=0, requires=(("mainloop", "wgmma"),)),
    Knob("stmatrix", "stm", 1, (0, 1), "STMATRIX",
         "epilogue: 1 = fragments to the staged bf16 tile with stmatrix.trans (one instruction per 2 x 64 values "
         "of a warp), 0 = one 16-bit shared store per value (same output bits); split-K tiles stage through "
         "the fix-up instead", off=0, requires=(("swap", 1), ("split_k", 1))),
    Knob("bulk_w", "bw", 0, (0, 1), "BULK_W",
         "wgmma multistage: 1 = thread 0 moves each stage's swap16 words and scales with the copy engine "
         "(cp.async.bulk: one 4 KB and one 512-byte run per 128 features, completing on the slot's mbarrier), "
         "0 = every thread's 16-byte cp.async copies", off=0, requires=(("mainloop", "wgmma"),)),
    Knob("tma_x", "tx", 0, (0, 1), "TMA_X",
         "wgmma multistage, grouped families: 1 = the stage's block_m x 64 activation box in one TMA copy "
         "(cp.async.bulk.tensor through a tensor map of x), 0 = every thread's 16-byte cp.async copies",
         off=0, requires=(("mainloop", "wgmma"),)),
    Knob("cluster_n", "cn", 1, (1, 2), "CLUSTER_N",
         "2 = CTA pairs: the kernel is launched in clusters of two CTAs that take neighbouring N blocks of one "
         "token tile, so the hardware runs the pair at the same time on one GPC and its token rows are read "
         "from L2 by both together (no data is exchanged); 1 = CTAs in grid order", off=1),
    Knob("pdl", "pd", 0, (0, 1), "PDL",
         "1 = programmatic dependent launch: launched with programmatic stream serialization, the kernel waits "
         "for the previous grid on the stream (griddepcontrol.wait) before its first global access and then "
         "lets the next grid launch, so back-to-back GEMMs overlap one's tail with the next one's launch and "
         "CTA start; 0 = plain stream order", off=0),
    Knob("stream_k", "stk", 0, (0, 1), "STREAMK",
         "mma, indexed: 1 = stream-K: about one wave of CTAs splits the (token block, N block, K block) units "
         "of the device's valid blocks (up to num_tokens_post_padded, so work and bytes follow the active "
         "experts) into equal contiguous ranges walked through one continuous ring; a tile shared by several "
         "CTAs meets as fp32 partials in a bounded workspace (two tiles per CTA) and the last CTA to arrive "
         "sums them in CTA order (deterministic) in the same pass; 0 = one CTA per tile (or split_k)", off=0,
         requires=(("mainloop", "mma"),)),
    Knob("queue", "dq", 0, (0, 1), "PERSISTENT",
         "persistent=1: 0 = semi-static token slicing: each CTA's items are fixed by the schedule and the "
         "device's routing (item blockIdx.x, then a stride of gridDim.x); 1 = a dynamic work queue: the first "
         "item is blockIdx.x, every later one is claimed with an atomic counter (p.counters, reset by the "
         "grid's last CTA), so CTAs that finish early take the remaining items", off=1,
         requires=(("persistent", 1),)),
    Knob("fold", "fo", 0, (0, 1), "FOLD",
         "mma, operand swap: 1 = the int4 code bias and the group scale are applied to fp32 partial sums, once "
         "per 32-K group and output element: the weights enter the MMA as the exact bf16 codes 128 + u, each "
         "group's partial starts from -136 * sum(x) (one MMA per token tile shared by the warp's weight tiles) "
         "and acc += scale * partial; 0 = bias and scale applied to every dequantized bf16 pair (HSUB2 + HMUL2)",
         off=0, requires=(("mainloop", "mma"), ("swap", 1))),
)
KNOB = {k.name: k for k in KNOBS}


@dataclass(frozen=True)
class Schedule:
    """Every knob of one kernel instantiation (see :data:`KNOBS`). ``id`` is stable and readable."""

    family: str
    block_m: int  # token rows per CTA tile (indexed: = moe_align block size)
    block_n: int  # output features per CTA
    warps: int = 4  # warps per CTA; each owns block_n / warps features
    stages: int = 4  # cp.async pipeline depth (K blocks of 64 in flight)
    ctas_per_sm: int = 1  # __launch_bounds__ min blocks per SM (register budget)
    split_k: int = 1  # CTAs sharing one output tile along K (fp32 partials, deterministic fix-up)
    mainloop: str = "mma"  # "mma" (mma.sync) or "wgmma" (warpgroup MMA, sm_90a)
    wgmma_wait: int = 1  # wgmma groups in flight while the next K block is dequantized
    producer: int = 0  # wgmma: 1 = a producer warp + mbarriers (warp-specialized)
    group_steps: int = 4  # wgmma: k16 steps per committed group (4: one per K block)
    raster: int = 0  # token tiles per raster group (0: launch order)
    swap: int = 1  # mma: 1 = weights on the MMA M side (operand swap), 0 = tokens on M (16-row tiles)
    n_tiles: int = 1  # consecutive N blocks per CTA, one continuous ring
    stmatrix: int = 1  # epilogue: stmatrix.trans fragment stores (0: one 16-bit store per value)
    persistent: int = 0  # wgmma multistage: ~one wave of CTAs walks every tile through one ring
    bulk_w: int = 0  # wgmma multistage: weights and scales by bulk copies (cp.async.bulk)
    tma_x: int = 0  # wgmma multistage, grouped families: the activation box by one TMA tensor copy
    cluster_n: int = 1  # CTA pairs: clusters of two CTAs on neighbouring N blocks of one token tile
    pdl: int = 0  # programmatic dependent launch (griddepcontrol; launched with programmatic serialization)
    stream_k: int = 0  # mma, indexed: ~one wave of CTAs splits the valid (tile, K block) units evenly
    queue: int = 0  # persistent: 0 = the static walk (semi-static slicing), 1 = items claimed from a work queue
    fold: int = 0  # mma, swap: bias and group scale applied to fp32 group partial sums (0: to every bf16 pair)

    def __post_init__(self) -> None:
        _check_family(self.family)
        for knob in KNOBS:
            v = getattr(self, knob.name)
            want = str if isinstance(knob.default, str) else int
            if isinstance(v, bool) or not isinstance(v, want):
                raise TypeError(f"Schedule.{knob.name} must be {'a str' if want is str else 'an int'}, got {v!r} "
                                f"({type(v).__name__})")
        if self.mainloop not in MAINLOOPS:
            raise ValueError(f"mainloop must be one of {MAINLOOPS}, got {self.mainloop!r}")
        wg = self.mainloop == "wgmma"
        top = 256 if wg else 128
        if self.block_m % 8 or not 8 <= self.block_m <= top:
            raise ValueError(f"block_m must be a multiple of 8 in [8, {top}] for mainloop {self.mainloop}, "
                             f"got {self.block_m}")
        if wg:
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
                cap = min(256, (entry + 128 * (entry - WGMMA_PRODUCER_REGS) // (self.warps * 32)) // 8 * 8)
                if cap <= entry:
                    raise ValueError(f"producer=1 with block_n={self.block_n}: the producer warpgroup has no registers "
                                     f"to hand over ({self.threads} threads start with {entry}); use block_n <= 192")
            else:
                cap = min(255, 65536 // (self.threads * self.ctas_per_sm) // 8 * 8)
            acc = self.ntw * self.block_m // 2
            a_regs = wgmma_operand_regs(self.block_m, self.ntw, self.group_steps) - acc
            if acc + a_regs + WGMMA_OTHER_REGS > cap:
                raise ValueError(f"mainloop wgmma with block_m={self.block_m}, {self.ntw} weight tiles per warp and "
                                 f"group_steps={self.group_steps} needs about {acc} accumulator + {a_regs} A + "
                                 f"{WGMMA_OTHER_REGS} other registers per thread, over the budget of {cap} for "
                                 f"{self.threads} threads x {self.ctas_per_sm} CTAs/SM")
        else:
            if self.warps not in (1, 2, 4, 8):
                raise ValueError(f"warps must be 1, 2, 4 or 8, got {self.warps}")
            if self.block_n <= 0 or self.block_n % (16 * self.warps):
                raise ValueError(f"block_n must be a positive multiple of 16*warps={16 * self.warps}, "
                                 f"got {self.block_n}")
            for name in ("wgmma_wait", "producer", "group_steps"):
                if getattr(self, name) != KNOB[name].default:
                    raise ValueError(f"{name} applies to mainloop wgmma only, got {getattr(self, name)} with mma")
            if self.swap == 0 and self.stmatrix != KNOB["stmatrix"].default:
                raise ValueError(f"stmatrix applies to the swapped layout only (swap=1), got stmatrix={self.stmatrix} "
                                 f"with swap=0")
            if self.swap == 0 and self.block_m % 16:
                raise ValueError(f"swap=0 (tokens on the MMA M side) needs block_m a multiple of 16, got {self.block_m}")
        if not 2 <= self.stages <= 12:
            raise ValueError(f"stages must be in [2, 12], got {self.stages}")
        if self.split_k > 1 and self.stmatrix != KNOB["stmatrix"].default:
            raise ValueError(f"stmatrix applies to unsplit tiles only (split-K tiles stage through the fix-up), got "
                             f"stmatrix={self.stmatrix} with split_k={self.split_k}")
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
        if self.tma_x and self.family == "indexed":
            raise ValueError("tma_x=1 needs a grouped family (consecutive rows of x per tile); the indexed family "
                             "gathers its rows")
        if self.fold and (wg or self.swap != 1):
            raise ValueError(f"fold=1 needs mainloop mma with the operand swap (swap=1), got mainloop={self.mainloop}, "
                             f"swap={self.swap}")
        for name in ("ctas_per_sm", "split_k", "wgmma_wait", "producer", "group_steps", "raster", "swap", "n_tiles",
                     "stmatrix", "persistent", "bulk_w", "tma_x", "cluster_n", "pdl", "stream_k", "queue", "fold"):
            knob = KNOB[name]
            if getattr(self, name) not in knob.legal:
                raise ValueError(f"{name} must be one of {', '.join(map(str, knob.legal))}, got {getattr(self, name)}")
        if self.smem_bytes + self.static_smem_bytes > MAX_SMEM_PER_CTA:
            raise ValueError(f"schedule {self.id} needs {self.smem_bytes} B of dynamic + up to {self.static_smem_bytes} B "
                             f"of static shared memory (> {MAX_SMEM_PER_CTA} a CTA may use)")

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
        """Threads per CTA: the MMA warps, plus the producer warpgroup of a warp-specialized loop."""
        return self.warps * 32 + (128 if self.producer else 0)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: one tile per CTA, the pipeline or the epilogue tile, whichever is
        larger (the epilogue reuses the drained ring); several (n_tiles > 1, persistent, stream_k), both
        (the ring keeps loading during an epilogue); plus the base-alignment slack of the wgmma ring (mirrors
        ``MoeKernel::kSmemBytes`` in csrc, which every rendered kernel static_asserts against this
        number)."""
        tiles16 = self.block_n // 16
        epilogue = self.block_m * (self.block_n + 8) * 2
        stage = self.block_m * K_BLOCK * 2 + tiles16 * 512 + tiles16 * 64
        slack = 0
        if self.mainloop == "wgmma":
            stage = -(-stage // 1024) * 1024
            slack = 1024 - 16
        ring = self.stages * stage
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


@lru_cache(maxsize=512)
def _parse_id(text: str) -> Schedule:
    m = _ID_RE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"schedule id {text!r} is not of the form idx-m16n128k64-w4-s4-c1[-sk4][-wgmma][-wait0][-ws1][-gs1][-r8][-swap0][-nt4][-ps1][-stm0][-bw1][-tx1][-cn2][-pd1][-stk1][-fo1]")
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


@dataclass(frozen=True, eq=False)
class Rule:
    """Applies when rows_per_expert <= max_rows_per_expert and k_min <= k <= k_max."""

    max_rows_per_expert: float
    schedule: dict
    why: str = ""
    k_min: int = 0
    k_max: float = float("inf")

    def matches(self, rows_per_expert: float, k: int) -> bool:
        return rows_per_expert <= self.max_rows_per_expert and self.k_min <= k <= self.k_max


@dataclass(frozen=True, eq=False)
class Profile:
    """The rules one call is decided by: an entry of a profile file (``deployment`` is the entry's
    name), or the rules of one deployment under one role (chord.deployments.profile_for)."""

    gpu: str
    deployment: str
    rules: dict  # family -> tuple[Rule, ...]
    source: str = ""
    deployment_name: str = ""  # the deployment the entry belongs to (EP8, TP8, EP16, ..., custom)
    role: str = "both"  # decode | prefill | both
    covers_experts: tuple = ()  # local expert counts the entry covers (chord.deployments)
    covers_gemms: tuple = ()  # (n, k) pairs it covers; () = any
    split_rows_per_expert: float = 45.255

    @property
    def name(self) -> str:
        return f"{self.gpu}:{self.deployment}"


@dataclass(frozen=True, eq=False)
class ProfileFile:
    gpu: str
    deployments: dict  # name -> Profile
    path: str = ""
    extra_n: tuple = field(default=(256, 512, 2048, 4096, 7168))

    def profile(self, deployment: str) -> Profile:
        try:
            return self.deployments[deployment]
        except KeyError:
            raise ValueError(f"deployment must be one of {sorted(self.deployments)} in {self.path}, got {deployment!r}") from None

    def all_schedules(self) -> list[Schedule]:
        """Every schedule any deployment can select for the Kimi K2 shapes (what precompile builds)."""
        out: dict[str, Schedule] = {}
        for prof in self.deployments.values():
            for family, rules in prof.rules.items():
                for rule in rules:
                    for n in self.extra_n:
                        s = _fit_schedule(family, rule.schedule, n)
                        out[s.id] = s
        return list(out.values())


@dataclass(frozen=True)
class Decision:
    """What select() chose, what it considered and why (what a notebook shows)."""

    problem: Problem
    schedule: Schedule
    profile: str
    candidates: tuple
    reason: str
    deployment: str = ""  # the layer's deployment (chord.deployments), "custom" when no profile covers it
    role: str = ""  # the serving instance's role the rules were taken for


def _profile_path(name_or_path: str) -> Path:
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"profile must be a profile name like 'h200' or a path to a .json file, got {name_or_path!r}")
    p = Path(name_or_path)
    if p.suffix == ".json":
        if not p.is_file():
            raise ValueError(f"profile file {p} does not exist")
        return p
    user = os.environ.get("CHORD_PROFILE_DIR")
    if user and not Path(user).is_dir():
        raise ValueError(f"CHORD_PROFILE_DIR={user!r} is not a directory")
    roots = ([Path(user)] if user else []) + [profiles_dir()]
    for root in roots:
        cand = root / f"{name_or_path}.json"
        if cand.exists():
            return cand
    raise ValueError(f"profile {name_or_path!r} not found (looked for {name_or_path}.json in "
                     f"{', '.join(str(r) for r in roots)})")


def _parse_rule(path: Path, where: str, r) -> Rule:
    if not isinstance(r, dict):
        raise ValueError(f"{path}: {where}: a rule must be a JSON object, got {type(r).__name__}")
    if "max_rows_per_expert" not in r or "block_m" not in r:
        raise ValueError(f"{path}: {where}: a rule needs 'max_rows_per_expert' (a number or null) and 'block_m'")
    unknown = sorted(set(r) - set(KNOB) - {"max_rows_per_expert", "why", "k_min", "k_max"})
    if unknown:
        raise ValueError(f"{path}: {where}: unknown rule fields {unknown} (knobs are {sorted(KNOB)})")
    for name in ("max_rows_per_expert", "k_min", "k_max"):
        v = r.get(name)
        if not (v is None or _is_number(v)) or (name == "k_min" and v is not None and v != int(v)):
            want = "an int" if name == "k_min" else "a number or null"
            raise ValueError(f"{path}: {where}: {name} must be {want}, got {v!r} ({type(v).__name__})")
    for name, v in r.items():
        knob = KNOB.get(name)
        if knob is None:
            continue
        if isinstance(knob.default, str):
            if not isinstance(v, str):
                raise ValueError(f"{path}: {where}: {name} must be a string, one of {', '.join(map(repr, knob.legal))}; "
                                 f"got {v!r} ({type(v).__name__})")
        elif not _is_number(v) or v != int(v):
            raise ValueError(f"{path}: {where}: {name} must be an int (one of {_legal_text(knob)}), got {v!r} "
                             f"({type(v).__name__})")
    bound = float("inf") if r["max_rows_per_expert"] is None else float(r["max_rows_per_expert"])
    k_min = int(r.get("k_min") or 0)
    k_max = float("inf") if r.get("k_max") is None else float(r["k_max"])
    return Rule(bound, {k: (v if isinstance(v, str) else int(v)) for k, v in r.items() if k in KNOB},
                str(r.get("why", "")), k_min, k_max)


def _is_number(v) -> bool:
    """A JSON number (not a bool, not NaN or infinite)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _legal_text(knob: Knob) -> str:
    legal = knob.legal
    if len(legal) > 8 and all(isinstance(v, int) for v in legal):
        step = legal[1] - legal[0]
        return f"{legal[0]}..{legal[-1]} in steps of {step}"
    return ", ".join(map(str, legal))


@lru_cache(maxsize=16)
def load_profile_file(name_or_path: str = "h200") -> ProfileFile:
    """A profile file (`profiles/<name>.json`, `$CHORD_PROFILE_DIR/<name>.json` or a path), checked:
    any problem raises a ValueError naming the file and the rule."""
    path = _profile_path(name_or_path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpu"), str) or \
            not isinstance(data.get("deployments"), dict) or not data["deployments"]:
        raise ValueError(f"{path}: a profile needs 'gpu' (a string) and 'deployments' (a non-empty object)")
    from chord.deployments import parse_covers, parse_entry_meta

    deployments = {}
    for dep, body in data["deployments"].items():
        if not isinstance(body, dict) or not isinstance(body.get("families"), dict) or not body["families"]:
            raise ValueError(f"{path}: deployment {dep!r} needs 'families' (a non-empty object)")
        unknown = sorted(set(body) - _ENTRY_FIELDS)
        if unknown:
            raise ValueError(f"{path}: deployment {dep!r}: unknown fields {unknown} (known: {sorted(_ENTRY_FIELDS)})")
        dep_name, role, split = parse_entry_meta(str(path), dep, body)
        experts, gemms = parse_covers(str(path), dep, body)
        rules = {}
        for family, items in body["families"].items():
            if family not in FAMILIES:
                raise ValueError(f"{path}: {dep}: family must be one of {FAMILIES}, got {family!r}")
            if not isinstance(items, list) or not items:
                raise ValueError(f"{path}: {dep}/{family}: rules must be a non-empty list")
            parsed = tuple(_parse_rule(path, f"{dep}/{family} rule {i}", r) for i, r in enumerate(items))
            bounds = [r.max_rows_per_expert for r in parsed]
            last = parsed[-1]
            if bounds != sorted(bounds) or last.max_rows_per_expert != float("inf") or last.k_min or last.k_max != float("inf"):
                raise ValueError(f"{path}: rules of {dep}/{family} must be sorted by max_rows_per_expert and end with "
                                 "an unconditional rule (max_rows_per_expert=null, no k_min/k_max)")
            for i, r in enumerate(parsed):
                try:
                    _fit_schedule(family, r.schedule, 4096)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{path}: {dep}/{family} rule {i}: {exc}") from None
            rules[family] = parsed
        deployments[dep] = Profile(data["gpu"], dep, rules, str(path), dep_name, role, experts, gemms, split)
    return ProfileFile(data["gpu"], deployments, str(path))


def load_profile(spec: str | Profile = "h200:ep8-prefill") -> Profile:
    """`"h200:tp8"` (file:deployment) or a Profile (returned as is)."""
    if isinstance(spec, Profile):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"profile must be a str like 'h200:tp8' or a Profile, got {type(spec).__name__}")
    file, _, dep = spec.partition(":")
    pf = load_profile_file(file or "h200")
    return pf.profile(dep or "ep8-prefill")


def default_deployment(num_experts: int, n: int, k: int, decode: bool = False) -> str:
    """The profile entry a weight shape's calls use under role decode (`decode`) or prefill: its
    deployment (chord.deployments.deployment_for: the profile's `covers`, or CHORD_DEPLOYMENT)
    and that role's entry; "custom" when no deployment covers the shape."""
    from chord.deployments import CUSTOM, deployment_for, deployments

    dep = deployment_for(num_experts, n, k)
    if dep == CUSTOM:
        return CUSTOM
    d = deployments(gpu_profile_name())[dep]
    return d.entry("decode" if decode else "prefill") or d.entry("both") or d.entries[0][1]


def gpu_profile_name() -> str:
    """The profile file in use: $CHORD_PROFILE (default `h200`)."""
    return os.environ.get("CHORD_PROFILE", "h200")


def profile_for(family: str, num_experts: int, n: int, k: int, *, deployment: str | None = None,
                role: str | None = None, profile_name: str | None = None) -> Profile:
    """The profile a weight shape's calls are decided by, in the GPU profile `gpu_profile_name()`:
    the deployment that covers the shape (or CHORD_DEPLOYMENT / `deployment`) under the process's
    role (CHORD_ROLE / `role`); see chord.deployments. The schedule of a shape is then the same
    whoever calls: `chord.ops`, the `humming` root or `chord bench`."""
    from chord.deployments import profile_for as _profile_for

    return _profile_for(family, num_experts, n, k, deployment=deployment, role=role, profile_name=profile_name)


#: EP8's rows per expert up to which role `both` takes the decode rules (kept for callers of the
#: name; each profile entry may set its own `split_rows_per_expert`)
EP8_DECODE_MAX_ROWS_PER_EXPERT = 45.255

#: fields of a profile file's deployment entry besides its rules (chord.deployments)
_ENTRY_FIELDS = frozenset({"about", "families", "deployment", "role", "covers", "split_rows_per_expert"})


def _fit_schedule(family: str, knobs: dict, n: int) -> Schedule:
    """Schedule from rule knobs, with block_n reduced until it divides n."""
    vals = {k.name: knobs.get(k.name, k.default) for k in KNOBS}
    vals["block_n"] = knobs.get("block_n", 128)
    vals = {k: (v if isinstance(v, str) else int(v)) for k, v in vals.items()}
    bn, warps = vals["block_n"], vals["warps"]
    if n % 16:
        raise ValueError(f"n must be a multiple of 16 for the swap16 layout, got {n}")
    if vals["mainloop"] == "wgmma":
        while n % bn and bn > 64:
            bn = 128 if bn > 128 else 64
        if n % bn:
            raise ValueError(f"mainloop wgmma needs N divisible by 64, got {n}")
        # weight tiles per warp (a rule without warps: one): kept while block_n shrinks
        ntw = max(1, vals["block_n"] // 16 // warps) if "warps" in knobs else 1
        warps = max(4, bn // 16 // ntw)
        vals["n_tiles"] = _fit_n_tiles(vals["n_tiles"], n // bn)
    else:
        while n % bn:
            bn //= 2
            if bn < 16 * warps:
                warps = max(1, warps // 2)
        while bn % (16 * warps):
            warps //= 2
        vals["n_tiles"] = _fit_n_tiles(vals["n_tiles"], n // bn)
    if vals["cluster_n"] > 1 and not pairs_fit(n, bn * vals["n_tiles"]):
        vals["cluster_n"] = 1
    if vals["bulk_w"] and bn % 128:  # bulk weight copies move whole groups of 8 weight tiles
        vals["bulk_w"] = 0
    vals.update(block_n=bn, warps=warps)
    return Schedule(family, **vals)


def _fit_n_tiles(n_tiles: int, n_blocks: int) -> int:
    """n_tiles halved until it divides the N blocks of the GEMM."""
    while n_tiles > 1 and n_blocks % n_tiles:
        n_tiles //= 2
    return n_tiles


def _rule_for(rules: tuple, rows_per_expert: float, k: int) -> Rule:
    for r in rules:
        if r.matches(rows_per_expert, k):
            return r
    return rules[-1]


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


def override(schedule: Schedule, **knobs) -> Schedule:
    """A copy with some knobs changed (what notebooks use to switch an optimization off)."""
    return replace(schedule, **knobs)


def as_dict(schedule: Schedule) -> dict:
    d = asdict(schedule)
    d["id"] = schedule.id
    return d


def iter_schedules(profile_file: str = "h200") -> Iterable[Schedule]:
    return load_profile_file(profile_file).all_schedules()


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
    text = os.environ.get("CHORD_POLICY", "profile")
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
