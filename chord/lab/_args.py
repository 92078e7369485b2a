"""Checks of command-line flags and environment values, run before a command does anything.

Every check raises :class:`UsageError` (a ``ValueError``) whose message names the flag or the
environment variable, the bad value and the valid choices; ``chord.cli`` prints it after the
command's name and exits 2. The checks read files and the environment only: none needs a GPU,
so a mistake is reported the same way on any machine. Each takes the flag's name as its first
argument, so a new flag reuses them (``check_choice("--gemm", args.gemm, ("gate_up", "down"))``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence


class UsageError(ValueError):
    """A flag or environment value the command cannot use."""


def _listing(choices: Iterable) -> str:
    return ", ".join(str(c) for c in choices)


def _named(name: str, value) -> str:
    """``--flag 'value'`` or ``environment variable NAME='value'``."""
    return f"{name}={value!r}" if name.startswith("environment variable ") else f"{name} {value!r}"


def split_list(value: str | None) -> list[str] | None:
    """A comma-separated flag value as a list of non-empty items (None when unset)."""
    if value is None:
        return None
    return [x.strip() for x in str(value).split(",") if x.strip()]


def check_choice(name: str, value, choices: Sequence):
    """`value` itself when it is one of `choices`."""
    if value not in choices:
        raise UsageError(f"{_named(name, value)} is not a valid choice; valid: {_listing(choices)}")
    return value


def check_choices(name: str, value: str | None, choices: Sequence, what: str = "value") -> list[str] | None:
    """A comma-separated list whose every item is one of `choices` (None when `value` is None);
    an empty list is refused."""
    items = split_list(value)
    if items is None:
        return None
    if not items:
        raise UsageError(f"{name} is empty; give one or more of: {_listing(choices)}")
    bad = [x for x in items if x not in choices]
    if bad:
        raise UsageError(f"{name}: unknown {what}{'s' if len(bad) > 1 else ''} {_listing(repr(b) for b in bad)}; "
                         f"valid: {_listing(choices)}")
    return items


def check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return value


def packaged_suites() -> list[str]:
    from chord.lab.bench.suite import SUITES_DIR

    return sorted(p.stem for p in SUITES_DIR.glob("*.json"))


def check_suite(name: str, value: str | None):
    """The loaded suite (chord.lab.bench.suite.Suite): a packaged suite's name or a suite JSON path."""
    from chord.lab.bench.suite import load_suite

    try:
        return load_suite(value)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        import json

        why = (f"no {exc} key" if isinstance(exc, KeyError) else
               f"not valid JSON ({exc})" if isinstance(exc, json.JSONDecodeError) else str(exc))
        if "packaged suites" not in why:
            why += f"; packaged suites: {_listing(packaged_suites())}"
        raise UsageError(f"{_named(name, value)}: {why}") from None


def check_selection(suite, scenarios: str | None, families: str | None, *, scenarios_flag: str = "--scenarios",
                    families_flag: str = "--families"):
    """The suite's selection ``[(scenario, families)]`` for comma-separated scenario ids and
    families, each name checked against the suite; a selection left empty is refused."""
    from chord.lab.bench.suite import FAMILIES

    ids = check_choices(scenarios_flag, scenarios, suite.ids, "scenario")
    fams = check_choices(families_flag, families, FAMILIES, "family")
    selected = suite.select(ids, fams)
    if not selected:
        runs = sorted({f for sc in suite.scenarios if ids is None or sc.id in ids for f in sc.families})
        raise UsageError(f"{scenarios_flag} / {families_flag}: no scenario of suite {suite.name!r} runs "
                         f"{_listing(fams or [])}; these scenarios run: {_listing(runs)}")
    return selected


def known_profiles() -> list[str]:
    """Profile names found in $CHORD_PROFILE_DIR (when set) and the packaged profiles folder."""
    from chord._resources import profiles_dir

    from chord import _env

    roots = [Path(_env.get("CHORD_PROFILE_DIR"))] if _env.get("CHORD_PROFILE_DIR") else []
    try:
        roots.append(profiles_dir())
    except FileNotFoundError:
        pass
    return sorted({p.stem for r in roots if r.is_dir() for p in r.glob("*.json")})


def check_profile(name: str, value: str) -> str:
    """`value` when it names a readable, valid profile (a name in the profile folders or a path to
    a .json file). `name` is the flag or variable it came from (``--profile``, ``CHORD_PROFILE``)."""
    from chord.schedule import load_profile_file

    try:
        load_profile_file(value)
    except (ValueError, TypeError, OSError) as exc:
        raise UsageError(f"{_named(name, value)}: {exc}; profiles: {_listing(known_profiles()) or 'none found'}") from None
    return value


def policy_help() -> str:
    from chord.schedule import POLICY_RULES

    return ("profile, batch_invariant, or heuristic[,-rule...] with rules "
            f"{_listing(sorted(POLICY_RULES))}")


def check_policy(name: str, value: str) -> str:
    """The policy's canonical name (chord.schedule.Policy.name) for its text."""
    from chord.schedule import parse_policy

    try:
        return parse_policy(value).name
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{_named(name, value)}: {exc}; valid: {policy_help()}") from None


def check_out_dir(name: str, value: str | os.PathLike) -> Path:
    """A folder the command may create and write into: an existing writable folder, or a path
    whose nearest existing parent is a writable folder (nothing is created here)."""
    p = Path(value).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{_named(name, str(value))} is a file, not a folder")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UsageError(f"{_named(name, str(value))}: the folder is not writable")
        return p
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{_named(name, str(value))} cannot be created: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{_named(name, str(value))} cannot be created: {parent} is not writable")
    return p


def check_out_file(name: str, value: str | os.PathLike, suffix: str) -> Path:
    """A file the command may write: its name ends in `suffix`, it is not a folder, and its folder
    exists writable or can be created (nothing is created here)."""
    p = Path(value).expanduser()
    if not p.name.endswith(suffix):
        raise UsageError(f"{_named(name, str(value))} must name a {suffix} file")
    if p.is_dir():
        raise UsageError(f"{_named(name, str(value))} is a folder; give a {suffix} file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{_named(name, str(value))}: the file is not writable")
    check_out_dir(name, p.absolute().parent)
    return p


def check_humming_dir(name: str, value: str | os.PathLike) -> Path:
    """An install folder of upstream humming-kernels (it holds ``humming/__init__.py``)."""
    from chord.lab.bench.humming_baseline import UPSTREAM_VERSION

    p = Path(value).expanduser()
    how = f"install upstream there with: pip install --no-deps --target {value} humming-kernels=={UPSTREAM_VERSION}"
    if not p.is_dir():
        raise UsageError(f"{_named(name, str(value))} is not a folder; {how}")
    if not (p / "humming" / "__init__.py").is_file():
        raise UsageError(f"{_named(name, str(value))} holds no 'humming' package; {how}")
    return p


def check_environment() -> None:
    """The CHORD_* variables every command reads: boolean switches, the tile group, the profile
    folder, the profile and the policy in use."""
    from chord import _env

    try:
        _env.check()  # every registered variable parses: switches, the tile group, the role, ...
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    folder = _env.get("CHORD_PROFILE_DIR")
    if folder and not Path(folder).is_dir():
        raise UsageError(f"environment variable CHORD_PROFILE_DIR={folder!r} is not a folder")
    if _env.is_set("CHORD_PROFILE"):
        check_profile("environment variable CHORD_PROFILE", _env.raw("CHORD_PROFILE"))
    if _env.is_set("CHORD_POLICY"):
        check_policy("environment variable CHORD_POLICY", _env.raw("CHORD_POLICY"))
