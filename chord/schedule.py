"""Schedules (every kernel knob), problems (host-known shape integers) and the selection policy.

This is the one place where a shape becomes a kernel choice. ``select(profile, problem)`` is a
pure function of host integers (it never reads a device tensor, so it never syncs and is safe
under CUDA-graph capture), memoized per (profile, problem).

Profiles (``profiles/<gpu>.json``) hold one entry per deployment (``ep8-prefill``,
``ep8-decode``, ``tp8``), each a list of rules per family ordered by
``max_rows_per_expert``; the first rule whose bound covers the problem's expected rows per
expert gives the schedule, which is then fitted to N (block_n must divide N).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from chord._env import flag
from chord._resources import profiles_dir

FAMILIES = ("indexed", "grouped_contiguous", "grouped_masked")
_FAMILY_TAG = {"indexed": "idx", "grouped_contiguous": "gcon", "grouped_masked": "gmsk"}
_TAG_FAMILY = {v: k for k, v in _FAMILY_TAG.items()}
K_BLOCK = 64  # K elements per pipeline stage (fixed by the swap16 layout)
MAX_SMEM_PER_CTA = 227 * 1024
WGMMA_OTHER_REGS = 48  # registers a wgmma thread needs besides its block_m/2 accumulators (ptxas -v)
WGMMA_PRODUCER_REGS = 88  # setmaxnreg of the producer warpgroup (WgmmaSwap64::kProducerRegs)


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
    Knob("warps", "w", 4, (1, 2, 4, 8, 16), "WARPS", "warps per CTA (wgmma: one per 16 output features)", always=True),
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
    Knob("raster", "r", 0, (0, 2, 4, 8, 16, 32, 64), "RASTER",
         "token tiles per raster group walked over all N blocks (0: launch order)", off=0),
    Knob("n_tiles", "nt", 1, (1, 2, 4, 8), "NTILES",
         "consecutive N blocks one CTA walks through one continuous ring (the next tile loads while a "
         "tile's epilogue runs; for short K, where a one-tile CTA mostly fills and drains its ring)", off=1),
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
    raster: int = 0  # token tiles per raster group (0: launch order)
    n_tiles: int = 1  # consecutive N blocks per CTA, one continuous ring

    def __post_init__(self) -> None:
        _check_family(self.family)
        for knob in KNOBS:
            v = getattr(self, knob.name)
            if isinstance(v, bool) or (not isinstance(v, str) and not isinstance(v, int)):
                raise TypeError(f"Schedule.{knob.name} must be an int or str, got {type(v).__name__}")
        if self.mainloop not in MAINLOOPS:
            raise ValueError(f"mainloop must be one of {MAINLOOPS}, got {self.mainloop!r}")
        wg = self.mainloop == "wgmma"
        top = 256 if wg else 128
        if self.block_m % 8 or not 8 <= self.block_m <= top:
            raise ValueError(f"block_m must be a multiple of 8 in [8, {top}] for mainloop {self.mainloop}, "
                             f"got {self.block_m}")
        if wg:
            if self.block_n not in (64, 128, 192, 256):
                raise ValueError(f"block_n must be 64, 128, 192 or 256 for mainloop wgmma, got {self.block_n}")
            if self.warps != self.block_n // 16:
                raise ValueError(f"warps must be block_n/16={self.block_n // 16} for mainloop wgmma "
                                 f"(one warp per 16 output features), got {self.warps}")
            if self.stages < 3:
                raise ValueError(f"stages must be >= 3 for mainloop wgmma, got {self.stages}")
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
            if self.block_m // 2 + WGMMA_OTHER_REGS > cap:
                raise ValueError(f"mainloop wgmma with block_m={self.block_m} needs about {self.block_m // 2} "
                                 f"accumulator + {WGMMA_OTHER_REGS} other registers per thread, over the budget of "
                                 f"{cap} for {self.threads} threads x {self.ctas_per_sm} CTAs/SM")
        else:
            if self.warps not in (1, 2, 4, 8):
                raise ValueError(f"warps must be 1, 2, 4 or 8, got {self.warps}")
            if self.block_n <= 0 or self.block_n % (16 * self.warps):
                raise ValueError(f"block_n must be a positive multiple of 16*warps={16 * self.warps}, "
                                 f"got {self.block_n}")
            for name in ("wgmma_wait", "producer"):
                if getattr(self, name) != KNOB[name].default:
                    raise ValueError(f"{name} applies to mainloop wgmma only, got {getattr(self, name)} with mma")
        if not 2 <= self.stages <= 12:
            raise ValueError(f"stages must be in [2, 12], got {self.stages}")
        if self.n_tiles > 1 and (self.split_k != 1 or self.producer):
            raise ValueError(f"n_tiles={self.n_tiles} needs split_k=1 and producer=0 (one output tile per split-K CTA; "
                             f"the producer loop walks one tile), got split_k={self.split_k}, producer={self.producer}")
        for name in ("ctas_per_sm", "split_k", "wgmma_wait", "producer", "raster", "n_tiles"):
            knob = KNOB[name]
            if getattr(self, name) not in knob.legal:
                raise ValueError(f"{name} must be one of {', '.join(map(str, knob.legal))}, got {getattr(self, name)}")
        if self.smem_bytes > MAX_SMEM_PER_CTA:
            raise ValueError(f"schedule {self.id} needs {self.smem_bytes} B of shared memory (> {MAX_SMEM_PER_CTA})")

    @property
    def id(self) -> str:
        head = (f"{_FAMILY_TAG[self.family]}-m{self.block_m}n{self.block_n}k{K_BLOCK}"
                f"-w{self.warps}-s{self.stages}-c{self.ctas_per_sm}")
        tail = "".join(f"-{k.token}{getattr(self, k.name)}" for k in KNOBS
                       if not k.always and getattr(self, k.name) != k.default)
        return head + tail

    @property
    def threads(self) -> int:
        """Threads per CTA: the MMA warps, plus the producer warpgroup of a warp-specialized loop."""
        return self.warps * 32 + (128 if self.producer else 0)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: one tile per CTA, the pipeline or the epilogue tile, whichever is
        larger (the epilogue reuses the drained ring); several (n_tiles > 1), both (the ring keeps
        loading during an epilogue); plus the base-alignment slack of the wgmma ring (mirrors
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
        return (ring + epilogue if self.n_tiles > 1 else max(ring, epilogue)) + slack

    @property
    def block_n_cta(self) -> int:
        """Output features one CTA computes (block_n x n_tiles)."""
        return self.block_n * self.n_tiles

    def grid_n(self, n: int) -> int:
        """CTAs along N for a GEMM with `n` output features."""
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


@lru_cache(maxsize=512)
def _parse_id(text: str) -> Schedule:
    m = _ID_RE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"schedule id {text!r} is not of the form idx-m16n128k64-w4-s4-c1[-sk4][-wgmma][-wait0][-r8][-nt4]")
    tag, bm, bn, w, s, c, tail = m.groups()
    extra: dict = {}
    for part in filter(None, tail.split("-")):
        for knob in KNOBS:
            if knob.always or knob.name in extra:
                continue
            if isinstance(knob.default, str):
                if part in knob.legal:
                    extra[knob.name] = part
                    break
            elif part.startswith(knob.token) and part[len(knob.token):].isdigit():
                extra[knob.name] = int(part[len(knob.token):])
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
    gpu: str
    deployment: str
    rules: dict  # family -> tuple[Rule, ...]
    source: str = ""

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
    try:
        bound = float("inf") if r["max_rows_per_expert"] is None else float(r["max_rows_per_expert"])
        k_min = int(r.get("k_min", 0))
        k_max = float("inf") if r.get("k_max") is None else float(r["k_max"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {where}: bad bound in rule {r}: {exc}") from None
    return Rule(bound, {k: v for k, v in r.items() if k in KNOB}, str(r.get("why", "")), k_min, k_max)


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
    deployments = {}
    for dep, body in data["deployments"].items():
        if not isinstance(body, dict) or not isinstance(body.get("families"), dict) or not body["families"]:
            raise ValueError(f"{path}: deployment {dep!r} needs 'families' (a non-empty object)")
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
        deployments[dep] = Profile(data["gpu"], dep, rules, str(path))
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
    """The deployment a weight shape belongs to (fixed at load time)."""
    if num_experts >= 256:
        return "tp8"
    return "ep8-decode" if decode else "ep8-prefill"


def gpu_profile_name() -> str:
    """The profile file in use: $CHORD_PROFILE (default `h200`)."""
    return os.environ.get("CHORD_PROFILE", "h200")


#: EP8 rows per expert up to which the decode deployment's rules apply, above which the prefill
#: deployment's: the geometric midpoint of the suite's largest decode point (32) and smallest
#: prefill point (64), where `chord tune` puts its own rule bounds.
EP8_DECODE_MAX_ROWS_PER_EXPERT = 45.255


def profile_for(family: str, num_experts: int, n: int, k: int) -> Profile:
    """The profile a weight shape's calls are decided by, in the GPU profile `gpu_profile_name()`.

    The deployment is fixed at load time from the shape: 384 experts is TP8; otherwise EP8, whose
    calls see decode and prefill batch sizes alike, so EP8 uses one merged rule list per family:
    the `ep8-decode` rules up to EP8_DECODE_MAX_ROWS_PER_EXPERT rows per expert and the
    `ep8-prefill` rules above (a family only one of them has keeps that one's rules). The
    schedule of a shape is then the same whoever calls: `chord.ops`, the `humming` root or
    `chord bench` (which picks the deployment by its scenario: the rules agree on its shapes).
    """
    _check_family(family)
    name = gpu_profile_name()
    if num_experts >= 256:
        return load_profile(f"{name}:tp8")
    return _ep8_profile(name)


@lru_cache(maxsize=8)
def _ep8_profile(name: str) -> Profile:
    pf = load_profile_file(name)
    dec, pre = pf.profile("ep8-decode"), pf.profile("ep8-prefill")
    t = EP8_DECODE_MAX_ROWS_PER_EXPERT
    rules = {}
    for family in FAMILIES:
        d, p = dec.rules.get(family), pre.rules.get(family)
        if not d or not p:
            if d or p:
                rules[family] = d or p
            continue
        low = [r for r in d if r.max_rows_per_expert < t]
        # the decode rules that reach past t end at t (one per K range), then the prefill rules
        low += [Rule(t, r.schedule, r.why, r.k_min, r.k_max) for r in d if r.max_rows_per_expert >= t]
        rules[family] = tuple(low) + tuple(r for r in p if r.max_rows_per_expert > t)
    return Profile(pf.gpu, "ep8", rules, pf.path)


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
        warps = bn // 16
        vals["n_tiles"] = _fit_n_tiles(vals["n_tiles"], n // bn)
    else:
        while n % bn:
            bn //= 2
            if bn < 16 * warps:
                warps = max(1, warps // 2)
        while bn % (16 * warps):
            warps //= 2
        vals["n_tiles"] = _fit_n_tiles(vals["n_tiles"], n // bn)
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
def _explain(profile: Profile, problem: Problem) -> Decision:
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


def explain(profile: Profile | str, problem: Problem) -> Decision:
    return _explain(load_profile(profile), problem)


def select(profile: Profile | str, problem: Problem) -> Schedule:
    """The schedule for `problem` under `profile`: pure function of host integers, memoized."""
    return _explain(load_profile(profile), problem).schedule


def schedule_table(profile: Profile | str, family: str, num_experts: int, n: int, k: int,
                   top_k: int = 1) -> list[tuple[int, int, Schedule]]:
    """The profile as `(min_rows, max_rows, schedule)` rows over routed rows (exclusive lower,
    inclusive upper bound), e.g. for vLLM's tuning-config rows. The last max is 2**31-1."""
    prof = load_profile(profile)
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
