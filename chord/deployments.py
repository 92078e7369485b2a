"""Deployments and roles: which tuned rules decide a layer's calls, fixed when the layer loads.

A profile file (``profiles/<gpu>.json``) names each deployment it was tuned for and the shapes it
covers. An entry of its ``deployments`` object is one role of one deployment::

    "ep16-decode": {
      "deployment": "EP16",              # the deployment this entry belongs to
      "role": "decode",                  # decode | prefill | both
      "covers": {"experts": [24], "gemms": [[4096, 7168], [7168, 2048]]},
      "split_rows_per_expert": 45.255,   # optional: where `both` switches from decode to prefill rules
      "families": {...}                  # the rules (chord.profiles)
    }

**Which deployment.** A layer is fixed at load by its weight shape ``(experts, N, K)``: the
deployment whose ``covers`` lists that expert count and that (N, K) pair (``gemms`` absent: any
N, K). An explicit setting wins: ``CHORD_DEPLOYMENT`` (a deployment name of the profile such as
``EP16``, or ``custom``), or the argument ``deployment=`` of :func:`profile_for`. A shape that no
deployment covers is ``custom``: it runs the heuristic policy (``chord.selection``'s rules without
a profile row), and says so once in the log with the command that tunes it. Nothing is inferred
from "fewer than 256 experts" any more.

**Which role.** In prefill/decode-disaggregated serving a prefill instance and a decode instance
load the same weights but see different batches. ``CHORD_ROLE`` (``decode``, ``prefill`` or
``both``, the default) fixes it for the process; the ``humming`` root also takes it from the
layer config's ``chord_role``. ``decode`` uses the decode entry's rules for every batch,
``prefill`` the prefill entry's, ``both`` the decode rules up to ``split_rows_per_expert`` rows
per expert and the prefill rules above (one entry of role ``both``, like TP8, is used as it is).
The role is part of every ``Decision`` (``chord.selection.explain``) and of ``chord info``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import lru_cache

from chord import _env
from chord.knobs import FAMILIES, _check_family
from chord.profiles import (CUSTOM, DEFAULT_SPLIT_ROWS_PER_EXPERT, ROLES, Profile, Rule, check_role,  # noqa: F401
                            gpu_profile_name, load_profile_file, parse_covers, parse_entry_meta)

log = logging.getLogger("chord")


@dataclass(frozen=True)
class Deployment:
    """One deployment of a profile file: its roles' entries and the shapes it covers."""

    name: str  # e.g. "EP16"
    entries: tuple  # ((role, entry name), ...)
    experts: tuple  # local expert counts covered
    gemms: tuple  # ((n, k), ...) covered; () = any
    split_rows_per_expert: float = DEFAULT_SPLIT_ROWS_PER_EXPERT

    def covers(self, num_experts: int, n: int, k: int) -> bool:
        return num_experts in self.experts and (not self.gemms or (n, k) in self.gemms)

    def entry(self, role: str) -> str | None:
        return dict(self.entries).get(role)


def current_role() -> str:
    """``CHORD_ROLE`` (default ``both``): the serving instance's role, fixed for the process."""
    return _env.get("CHORD_ROLE")  # checked against ROLES by the registry


def explicit_deployment() -> str | None:
    """``CHORD_DEPLOYMENT`` when set (a deployment name of the profile, or ``custom``), else None."""
    text = (_env.get("CHORD_DEPLOYMENT") or "").strip()
    return text or None


@lru_cache(maxsize=16)
def deployments(profile_name: str) -> dict:
    """{deployment name: Deployment} of a profile file (entries that cover shapes only)."""
    pf = load_profile_file(profile_name)
    groups: dict = {}
    for entry, prof in pf.deployments.items():
        if not prof.covers_experts:
            continue
        g = groups.setdefault(prof.deployment_name, {"entries": [], "experts": set(), "gemms": set(), "split": None})
        if prof.role in dict(g["entries"]):
            raise ValueError(f"{pf.path}: deployment {prof.deployment_name} has two entries of role {prof.role!r}")
        g["entries"].append((prof.role, entry))
        g["experts"].update(prof.covers_experts)
        g["gemms"].update(prof.covers_gemms)
        g["split"] = prof.split_rows_per_expert if g["split"] is None else min(g["split"], prof.split_rows_per_expert)
    out = {}
    for name, g in groups.items():
        roles = dict(g["entries"])
        if "both" in roles and len(roles) > 1:
            raise ValueError(f"{pf.path}: deployment {name} has an entry of role 'both' beside others "
                             f"({sorted(roles)}): give either one 'both' entry or 'decode' / 'prefill' entries")
        out[name] = Deployment(name, tuple(sorted(g["entries"])), tuple(sorted(g["experts"])),
                               tuple(sorted(g["gemms"])), g["split"])
    # one shape, one deployment: overlapping covers would make the choice depend on file order
    names = sorted(out)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            da, db = out[a], out[b]
            shared = set(da.experts) & set(db.experts)
            if shared and (not da.gemms or not db.gemms or set(da.gemms) & set(db.gemms)):
                raise ValueError(f"{pf.path}: deployments {a} and {b} both cover {sorted(shared)} experts "
                                 "with the same N, K: a shape must belong to one deployment")
    return out


def deployment_for(num_experts: int, n: int, k: int, *, deployment: str | None = None,
                   profile_name: str | None = None) -> str:
    """The deployment of a weight shape: `deployment` or ``CHORD_DEPLOYMENT`` when given (checked
    against the profile), else the profile's deployment that covers (experts, N, K), else
    ``custom``."""
    name = profile_name or gpu_profile_name()
    deps = deployments(name)
    want = deployment if deployment is not None else explicit_deployment()
    if want is not None:
        if not isinstance(want, str):
            raise TypeError(f"deployment must be a str such as 'EP16' or 'custom', got {type(want).__name__}")
        if want.lower() == CUSTOM:
            return CUSTOM
        match = [d for d in deps if d.lower() == want.lower()]
        if not match:
            src = "deployment" if deployment is not None else "CHORD_DEPLOYMENT"
            raise ValueError(f"{src}={want!r}: profile {name!r} has deployments {sorted(deps)} (or 'custom' for "
                             "the heuristic policy)")
        return match[0]
    for d in deps.values():
        if d.covers(num_experts, n, k):
            return d.name
    return CUSTOM


def tune_command(num_experts: int) -> str:
    """The `chord tune` command that tunes a layer of `num_experts` experts (its shapes to fill in)."""
    return (f"chord tune --experts {num_experts} --n-gate-up <gate_up N> --k-gate-up <gate_up K> "
            f"--n-down <down N> --k-down <down K> --tok-e 1,4,12,32,64,128,256 --deployment NAME")


_said: set = set()


def _say_custom_once(name: str, num_experts: int, n: int, k: int) -> None:
    key = (name, num_experts, n, k)
    if key in _said:
        return
    _said.add(key)
    log.warning("chord: no deployment of profile %r covers %d experts with N=%d, K=%d: this GEMM runs the "
                "heuristic policy (untuned). To tune its layer: %s, then export CHORD_PROFILE_DIR=<its --out>",
                name, num_experts, n, k, tune_command(num_experts))


def profile_for(family: str, num_experts: int, n: int, k: int, *, deployment: str | None = None,
                role: str | None = None, profile_name: str | None = None):
    """The chord.profiles.Profile a layer's calls are decided by (see the module docstring), in
    the profile file `profile_name` (default ``CHORD_PROFILE`` or h200).

    A custom shape gets a profile without rules, which `chord.selection.explain` decides by the
    heuristic policy."""
    _check_family(family)
    name = profile_name or gpu_profile_name()
    role = current_role() if role is None else check_role(role)
    dep = deployment_for(num_experts, n, k, deployment=deployment, profile_name=name)
    if dep == CUSTOM:
        _say_custom_once(name, num_experts, n, k)
    return _role_profile(name, dep, role)


@lru_cache(maxsize=64)
def _role_profile(name: str, dep: str, role: str):
    pf = load_profile_file(name)
    if dep == CUSTOM:
        return Profile(pf.gpu, CUSTOM, {}, pf.path, deployment_name=CUSTOM, role=role)
    d = deployments(name)[dep]
    roles = dict(d.entries)
    if role in roles:
        return replace(pf.profile(roles[role]), role=role)
    if len(roles) == 1:  # one entry (TP8's 'both', or a deployment tuned for one role): its rules for every batch
        (only, entry), = roles.items()
        if only != "both" and role != "both":  # the other role's rules, said so
            log.warning("chord: deployment %s of profile %r has no %s rules; using its %s rules", dep, name, role, only)
        return replace(pf.profile(entry), role=role)
    if role != "both":  # cannot happen: two entries are decode and prefill
        raise ValueError(f"deployment {dep} of profile {name!r} has no {role} entry ({sorted(roles)})")
    dec, pre = pf.profile(roles["decode"]), pf.profile(roles["prefill"])
    t = d.split_rows_per_expert
    rules = {}
    for family in FAMILIES:
        lo_rules, hi_rules = dec.rules.get(family), pre.rules.get(family)
        if not lo_rules or not hi_rules:
            if lo_rules or hi_rules:
                rules[family] = lo_rules or hi_rules
            continue
        low = [r for r in lo_rules if r.max_rows_per_expert < t]
        # the decode rules that reach past t end at t (one per K range), then the prefill rules
        low += [Rule(t, r.schedule, r.why, r.k_min, r.k_max) for r in lo_rules if r.max_rows_per_expert >= t]
        rules[family] = tuple(low) + tuple(r for r in hi_rules if r.max_rows_per_expert > t)
    return Profile(pf.gpu, dep.lower(), rules, pf.path, deployment_name=dep, role="both",
                   covers_experts=d.experts, covers_gemms=d.gemms, split_rows_per_expert=t)


def clear_caches() -> None:
    """Forget every memoized profile, deployment and decision (after a profile file changed on disk,
    or CHORD_PROFILE_DIR moved): the next call reads the files again."""
    from chord.selection import _explain  # selection sits above this module

    load_profile_file.cache_clear()
    deployments.cache_clear()
    _role_profile.cache_clear()
    _explain.cache_clear()
    _said.clear()


def describe(profile_name: str | None = None) -> list[dict]:
    """One row per deployment of the profile (what `chord info` prints)."""
    name = profile_name or gpu_profile_name()
    return [{"deployment": d.name, "roles": [r for r, _ in d.entries], "experts": list(d.experts),
             "gemms": [list(g) for g in d.gemms], "split_rows_per_expert": d.split_rows_per_expert}
            for d in deployments(name).values()]


def default_deployment(num_experts: int, n: int, k: int, decode: bool = False) -> str:
    """The profile entry a weight shape's calls use under role decode (`decode`) or prefill: its
    deployment (chord.deployments.deployment_for: the profile's `covers`, or CHORD_DEPLOYMENT)
    and that role's entry; "custom" when no deployment covers the shape."""
    dep = deployment_for(num_experts, n, k)
    if dep == CUSTOM:
        return CUSTOM
    d = deployments(gpu_profile_name())[dep]
    return d.entry("decode" if decode else "prefill") or d.entry("both") or d.entries[0][1]
