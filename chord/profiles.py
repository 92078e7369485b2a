"""Profile files: the tuned rules each deployment's calls are decided by, and their fitting.

A profile (``profiles/<gpu>.json``, or ``$CHORD_PROFILE_DIR``) holds one entry per deployment
(``ep8-prefill``, ``ep8-decode``, ``tp8``), each a list of rules per family ordered by
``max_rows_per_expert``; the first rule whose bound covers a problem's expected rows per expert
gives the schedule, which is then fitted to N (block_n must divide N). Loading checks every
rule: a problem raises a ValueError naming the file and the rule.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from chord import _env
from chord._resources import profiles_dir
from chord.knobs import FAMILIES, KNOB, KNOBS, Knob, Problem, Schedule, pairs_fit


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
    user = _env.get("CHORD_PROFILE_DIR")
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


def gpu_profile_name() -> str:
    """The profile file in use: $CHORD_PROFILE (default `h200`)."""
    return _env.get("CHORD_PROFILE")


#: EP8's rows per expert up to which role `both` takes the decode rules (kept for callers of the
#: name; each profile entry may set its own `split_rows_per_expert`)
EP8_DECODE_MAX_ROWS_PER_EXPERT = 45.255

#: the roles a profile entry (and a serving instance, CHORD_ROLE) can have (chord.deployments)
ROLES = ("both", "decode", "prefill")
CUSTOM = "custom"  # the deployment of a shape no profile entry covers
#: EP rows per expert up to which a deployment's decode rules apply under role ``both``, above
#: which its prefill rules: the geometric midpoint of the suite's largest decode point (32) and
#: smallest prefill point (64), where `chord tune` puts its own rule bounds. A profile entry's
#: ``split_rows_per_expert`` overrides it.
DEFAULT_SPLIT_ROWS_PER_EXPERT = 45.255


def check_role(role, where: str = "role") -> str:
    if role not in ROLES:
        raise ValueError(f"{where} must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def parse_covers(path: str, entry: str, body: dict) -> tuple[tuple, tuple]:
    """(experts, gemms) of an entry's ``covers`` object, checked; ((), ()) without one."""
    cov = body.get("covers")
    if cov is None:
        return (), ()
    where = f"{path}: {entry}: covers"
    if not isinstance(cov, dict) or set(cov) - {"experts", "gemms"} or "experts" not in cov:
        raise ValueError(f"{where} must be an object with 'experts' (a list of ints) and optional 'gemms' "
                         f"(a list of [n, k] pairs), got {cov!r}")
    experts = cov["experts"]
    if not isinstance(experts, list) or not experts or \
            any(isinstance(e, bool) or not isinstance(e, int) or e <= 0 for e in experts):
        raise ValueError(f"{where}.experts must be a non-empty list of positive ints, got {experts!r}")
    gemms = cov.get("gemms", [])
    if not isinstance(gemms, list) or any(
            not isinstance(g, list) or len(g) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                                                          for v in g) for g in gemms):
        raise ValueError(f"{where}.gemms must be a list of [n, k] pairs of positive ints, got {gemms!r}")
    return tuple(experts), tuple(tuple(g) for g in gemms)


def parse_entry_meta(path: str, entry: str, body: dict) -> tuple[str, str, float]:
    """(deployment, role, split_rows_per_expert) of a profile entry, checked. An entry without
    ``deployment`` is its own deployment (named after the entry) of role ``both``."""
    dep = body.get("deployment", entry)
    if not isinstance(dep, str) or not dep or dep.lower() == CUSTOM:
        raise ValueError(f"{path}: {entry}: 'deployment' must be a non-empty name other than 'custom', got {dep!r}")
    role = check_role(body.get("role", "both"), f"{path}: {entry}: 'role'")
    split = body.get("split_rows_per_expert", DEFAULT_SPLIT_ROWS_PER_EXPERT)
    if isinstance(split, bool) or not isinstance(split, (int, float)) or not math.isfinite(split) or split <= 0:
        raise ValueError(f"{path}: {entry}: 'split_rows_per_expert' must be a positive number, got {split!r}")
    return dep, role, float(split)


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
    elif vals["direct"]:  # warp-private rings: the warps split K, so only block_n follows N
        while n % bn:
            bn //= 2
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
    if vals["mainloop"] == "wgmma" and vals["producer"] and bn != knobs.get("block_n", 128):
        # a wgmma producer rule fitted to a narrower N block: with fewer consumer warps the producer
        # warpgroup may have no registers to hand over; its multistage twin computes the same bits
        try:
            return Schedule(family, **vals)
        except ValueError:
            vals["producer"] = 0
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



def iter_schedules(profile_file: str = "h200") -> Iterable[Schedule]:
    return load_profile_file(profile_file).all_schedules()
