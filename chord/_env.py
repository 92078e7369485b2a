"""Chord's environment variables: one registry that defines, parses and documents them all.

Every ``CHORD_*`` variable Chord reads has one entry in :data:`VARS`: its name, its kind (``flag``,
``int``, ``choice``, ``path`` or ``str``), its default, when it is read (``per call``: each time it
matters; ``at load``: once, when the layer or module that uses it is set up; ``at import``: once,
when its module is imported) and a line of documentation. The README's table is generated from it
(``python -m chord._env --write README.md``; ``--check`` says whether the file is current). No
other module reads ``os.environ`` for a ``CHORD_*`` name: they call :func:`get` (or :func:`flag`,
:func:`tile_group_max`), which parse and validate, so a bad value raises a ``ValueError`` naming
the variable and what was expected.

A boolean switch (kind ``flag``) is on for ``1``, ``true``, ``yes`` or ``on`` and off when empty,
``0``, ``false``, ``no`` or ``off`` (any case, surrounding spaces ignored); unset, it takes its
default (on for ``CHORD_CHECK_ROUTING`` and ``CHORD_FAST_LAUNCH``, off for the others). Any other
value raises, so a typo never silently switches a feature on or off.

Code that wants a value for part of a run uses :func:`override` (a context manager), the one
sanctioned way: ``with chord._env.override(CHORD_POLICY="heuristic"): ...``. Its values win over
the process environment for every reader in this process (all threads) until the block ends;
the process environment itself is never written. A subprocess that must see them gets
:func:`environ` as its ``env=``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
TILE_GROUPS = (1, 2, 4, 8)  # legal tile groups G of the weight layout (chord.formats)
KINDS = ("flag", "int", "choice", "path", "str")
WHEN = ("per call", "at load", "at import")


@dataclass(frozen=True)
class Var:
    """One environment variable: `default` is the parsed value when unset (None: no value, the
    reader falls back as `default_doc` says); `choices` are the legal values of a ``choice`` or
    an ``int`` that has them; `doc` is the README row's text."""
    name: str
    kind: str
    default: object
    when: str
    doc: str
    choices: tuple = ()
    example: str = ""  # the README shows `NAME=example` (a switch's on value)

    def __post_init__(self):
        if not self.name.startswith("CHORD_") or self.kind not in KINDS or self.when not in WHEN:
            raise ValueError(f"bad registry entry {self.name}: kind {self.kind!r}, when {self.when!r}")


_VARS = (
    Var("CHORD_CACHE_DIR", "path", None, "per call",
        "kernel cache: cubins and the C launch module (default `$XDG_CACHE_HOME/chord` or `~/.cache/chord`); "
        "each file is checked against its `.sha256` before use and rebuilt when damaged; one that cannot be "
        "written (read-only, full) gets what it lacks built into a private temporary folder per process, "
        "with a warning (docs/reliability.md)"),
    Var("CHORD_NVCC", "path", None, "per call", "nvcc to use (default: `nvcc` on PATH, `$CUDA_HOME/bin/nvcc`)"),
    Var("CHORD_CUOBJDUMP", "path", None, "per call",
        "cuobjdump to use for the SASS checks (default: on PATH, beside nvcc, under `$CUDA_HOME`, or the "
        "`nvidia-cuda-cuobjdump` wheel's)"),
    Var("CHORD_PRINT_SCHEDULES", "flag", False, "per call", "print every schedule decision with its reason",
        example="1"),
    Var("CHORD_DUMP_SASS", "flag", False, "per call", "write `cuobjdump --dump-sass` next to each new cubin",
        example="1"),
    Var("CHORD_PTXAS_CHECK", "flag", False, "per call",
        "fail a build whose ptxas report shows register spills or serialized wgmma instructions (every build, "
        "whatever this says, reads the new cubin's SASS and rebuilds without L2 cache hints a kernel that ptxas "
        "gave an odd-register memory descriptor, a miscompile that traps: docs/reliability.md)", example="1"),
    Var("CHORD_PROFILE", "str", "h200", "per call",
        "GPU profile file used by ops, bench and the `humming` shim (default `h200`)"),
    Var("CHORD_PROFILE_DIR", "path", None, "per call",
        "extra folder searched first for `<gpu>.json` profiles (where `chord tune --out` wrote yours)"),
    Var("CHORD_ROLE", "choice", "both", "at load",
        "the serving instance's role: `decode`, `prefill` or `both` (default); selects that role's rules of "
        "the layer's deployment, fixed at load (docs/serving.md, section 5)", choices=("decode", "prefill", "both")),
    Var("CHORD_DEPLOYMENT", "str", None, "at load",
        "the profile deployment every layer uses (`EP8`, `EP16`, `EP32`, `TP8`, a tuned one, or `custom` for "
        "the heuristic); default: the deployment whose `covers` holds the layer's shape"),
    Var("CHORD_HUMMING_CPU_REFERENCE", "flag", False, "at import",
        "tests only: the `humming` shim runs its GEMMs on `chord.reference` (refused when a CUDA device exists)",
        example="1"),
    Var("CHORD_CHECK_ROUTING", "flag", True, "at import",
        "on by default: the `chord` API reads the routing values (expert ids, sorted ids, padded count, offsets, "
        "counts) before each launch and raises on a bad one (one host sync per call, skipped while a CUDA graph "
        "is captured; `check_routing=False` per call, or `CHORD_CHECK_ROUTING=0`, trusts them; the `humming` "
        "root trusts vLLM's routing). The kernels stay in bounds either way: see docs/reliability.md"),
    Var("CHORD_ACTIVATION_PDL", "flag", False, "per call",
        "the `humming` root's activation kernel is launched with programmatic dependent launch: it waits for the "
        "GEMM before it in the kernel and lets the next kernel launch at once, so its launch overlaps gate_up's "
        "tail and a `pdl_prefetch` down GEMM requests its weights while it runs (docs/optimizations.md)",
        example="1"),
    Var("CHORD_NVTX", "flag", False, "at import",
        "emit NVTX ranges `chord/<op>[<schedule id>]` in the `chord` domain", example="1"),
    Var("CHORD_POLICY", "str", "profile", "per call",
        "selection policy of every `select`: `profile` (default, the tuned rules), `heuristic[,-rule...]` (no "
        "profile row; rules `tok_e_block_m`, `wave_aware_bn`, `split_k_gate`, `touched_estimate`, "
        "`wgmma_raster`, `wide_warp_tiles`, `grouped_tma_pairs`, `buffered_k` can be switched off) or "
        "`batch_invariant` (one schedule per layer; what the `humming` root uses under "
        "`VLLM_BATCH_INVARIANT=1`). `chord bench --policy` sets it for a run"),
    Var("CHORD_HUMMING_DIR", "path", None, "per call",
        "install dir of upstream humming-kernels 0.1.20 for `chord bench` and the notebooks' live comparison"),
    Var("CHORD_NOTEBOOK_DATA_OUT", "path", None, "per call",
        "a folder: notebooks measuring live write their tables there as CSV (what `chord/data/notebooks/` holds)"),
    Var("CHORD_RECORD_KERNELS", "path", None, "per call",
        "a file: every kernel built or loaded is appended to it as `<schedule id> <tile group cap>`, once per "
        "process; `chord precompile --record FILE` (or `--tests`, with the committed `tools/device_kernels.txt`) builds "
        "that list ahead for the next GPU run"),
    Var("CHORD_FUZZ_CASES", "int", 500, "at import",
        "GPU tests: random cases per family of `tests/gpu/test_fuzz_gpu.py` (default 500)"),
    Var("CHORD_FAST_LAUNCH", "flag", True, "at load",
        "on by default: an eager call that trusts its routing (the `humming` root, `check_routing=False`) "
        "launches from C (`csrc/host/launch.c` through `chord.launch`) once an earlier call with the same "
        "argument metadata, scalars and schedule made its launch plan; `0` keeps every call on the Python launch "
        "path (the ablation; `chord.launch.fast_launch(False)` per process). `chord.launch.status()` says whether "
        "it is on, or why it is unavailable (no C compiler or `Python.h`, no CUDA driver)"),
    Var("CHORD_TILE_GROUP", "int", 8, "per call",
        "1, 2, 4 or 8 (default): cap of the weight layout's tile group when `chord.formats` packs; lower only for "
        "the layout's ablation (`chord bench --layout-ablation`); the weights carry their G and the ops launch the "
        "kernel built for it", choices=TILE_GROUPS),
    Var("CHORD_COMMIT", "str", None, "per call",
        "the commit recorded with results where the tree has no `.git` (a copied checkout); default: the "
        "checkout's commit"),
)
#: every CHORD_* variable Chord reads, by name
VARS: dict[str, Var] = {v.name: v for v in _VARS}
#: the boolean switches Chord reads (``chord.cli`` checks them all before a command runs)
SWITCHES = tuple(v.name for v in _VARS if v.kind == "flag")

_overrides: dict[str, str | None] = {}
_lock = threading.Lock()


def _var(name: str) -> Var:
    try:
        return VARS[name]
    except KeyError:
        raise KeyError(f"{name} is not a Chord environment variable (chord._env.VARS)") from None


def raw(name: str) -> str | None:
    """The text of `name`: an active :func:`override`, else the process environment (None: unset)."""
    _var(name)
    with _lock:
        if name in _overrides:
            return _overrides[name]
    return os.environ.get(name)


def parse_flag(name: str, value: str | None) -> bool:
    """The boolean meaning of `value` for the environment variable `name` (None: off)."""
    if value is None:
        return False
    v = value.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise ValueError(f"environment variable {name}={value!r}: expected one of "
                     f"{', '.join(_ON)} (on) or {', '.join(repr(x) for x in _OFF)} (off)")


def parse(name: str, value: str | None):
    """The value of variable `name` given its text `value` (None: unset), checked: a ValueError
    names the variable and what was expected."""
    v = _var(name)
    if v.kind == "flag":
        return v.default if value is None else parse_flag(name, value)
    if v.kind == "int":
        if value is None or value.strip() == "":
            return v.default
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or (v.choices and n not in v.choices) or (not v.choices and n < 1):
            want = f"one of {', '.join(map(str, v.choices))}" if v.choices else "a positive integer"
            raise ValueError(f"environment variable {name}={value!r}: expected {want}")
        return n
    if v.kind == "choice":
        text = (value or "").strip()
        if not text:
            return v.default
        if text.lower() not in v.choices:
            raise ValueError(f"environment variable {name}={text!r}: must be one of {', '.join(v.choices)}, "
                             f"got {text.lower()!r}")
        return text.lower()
    if v.kind == "path":
        return value or None  # empty: unset
    return v.default if value is None else value


def get(name: str):
    """The parsed value of the Chord environment variable `name` (its default when unset)."""
    return parse(name, raw(name))


def flag(name: str, default: bool | None = None) -> bool:
    """Whether the boolean switch `name` is on (`default` when unset; None: the registry's)."""
    if _var(name).kind != "flag":
        raise ValueError(f"{name} is not a boolean switch")
    value = raw(name)
    if value is None:
        return VARS[name].default if default is None else default
    return parse_flag(name, value)


def tile_group_max() -> int:
    """The cap of the weight layout's tile group, ``CHORD_TILE_GROUP`` (default 8)."""
    return get("CHORD_TILE_GROUP")


def is_set(name: str) -> bool:
    """Whether `name` has a value (an override or the environment; empty counts as set)."""
    return raw(name) is not None


def current() -> dict[str, str]:
    """Every CHORD_* variable that has a value now (unregistered ones included), by name."""
    return dict(sorted((k, v) for k, v in environ().items() if k.startswith("CHORD_")))


def check() -> None:
    """Parse every registered variable that is set; the first bad one raises its ValueError."""
    for name in VARS:
        get(name)


def environ(**extra: str) -> dict[str, str]:
    """A copy of the process environment with the active overrides (and `extra`) applied: the
    ``env=`` of a subprocess that must see what this process sees."""
    env = dict(os.environ)
    with _lock:
        _merge(env, _overrides, unset=None)
    env.update(extra)
    return env


def _merge(target: dict, changes: dict, unset) -> None:
    """Apply `changes` to `target`; a value that `is` `unset` removes its key."""
    for k, v in changes.items():
        if v is unset:
            target.pop(k, None)
        else:
            target[k] = v


@contextlib.contextmanager
def override(**values):
    """Give Chord environment variables a value for this process until the block ends: the one
    sanctioned way for code to pass a setting through the registry (never ``os.environ``). A value
    is a str (parsed as the variable's text would be, checked now), a bool or int (written as
    text), or None (the variable reads as unset). Overrides nest; they apply to every thread."""
    texts = {}
    for name, value in values.items():
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (int, Path)):
            value = str(value)
        elif value is not None and not isinstance(value, str):
            raise TypeError(f"override {name}: expected str, bool, int, Path or None, got {type(value).__name__}")
        parse(name, value)  # unknown names and bad values raise before anything changes
        texts[name] = value
    missing = object()
    with _lock:
        before = {k: _overrides.get(k, missing) for k in texts}
        _overrides.update(texts)
    try:
        yield
    finally:
        with _lock:
            _merge(_overrides, before, unset=missing)


# --------------------------------------------------------------------------------------------
# the README's table

BEGIN = "<!-- chord-env-table: generated by `python -m chord._env --write README.md`; edit chord/_env.py -->"
END = "<!-- /chord-env-table -->"


def table() -> str:
    """The README's table of environment variables, one row per registry entry."""
    rows = ["| variable | effect | read |", "|---|---|---|"]
    for v in _VARS:
        shown = f"{v.name}={v.example}" if v.example else v.name
        rows.append(f"| `{shown}` | {v.doc} | {v.when} |")
    return "\n".join(rows)


def render(text: str) -> str:
    """`text` (a README) with the block between the table's markers replaced by :func:`table`."""
    pat = re.compile(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END), re.S)
    if len(pat.findall(text)) != 1:
        raise ValueError("the file needs exactly one block between the chord-env-table markers")
    return pat.sub(lambda _m: f"{BEGIN}\n{table()}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chord._env",
                                 description="Print (or write into a README) the table of Chord's environment variables.")
    ap.add_argument("--write", metavar="FILE", help="replace the table between the markers in FILE")
    ap.add_argument("--check", metavar="FILE", help="exit 1 when FILE's table is not the one computed")
    a = ap.parse_args(argv)
    if a.write or a.check:
        path = Path(a.write or a.check)
        text = path.read_text()
        new = render(text)
        if a.check:
            if new != text:
                print(f"{path}: the environment table is stale; run python -m chord._env --write {path}",
                      file=sys.stderr)
                return 1
            return 0
        path.write_text(new)
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
