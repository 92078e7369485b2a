"""What `chord precompile` builds into the kernel cache, and the archive it packs to carry.

``nvcc`` is all a build needs, not a GPU: a machine without one builds every kernel a GPU
machine's run can launch and carries the cache there as one file (``--out ARCHIVE``)::

    chord precompile --tests --out device.tar.xz [--tune --scenarios ep8-decode-tok32,tp8-m1024]
    # on the GPU machine: mkdir -p $CHORD_CACHE_DIR && tar -xf device.tar.xz -C $CHORD_CACHE_DIR

What it collects (deduplicated):

* always: every schedule the profile can select (``chord.schedule.load_profile_file(...).all_schedules()``);
* ``ablations``: every schedule a profile rule gives, fitted to each N of the suite and of the GPU
  tests, each with its `chord.optimizations` ablations; the decision for every GEMM of every
  packaged suite under the profile, the heuristic, each heuristic rule off and the
  batch-invariant policy (what `chord bench --policy`, the notebooks' ablations and vLLM's tuning
  rows select); the schedules named in the committed notebook tables (``chord/data/notebooks``);
* ``tests`` (a source checkout's): the above, the fuzz pools of ``tests/gpu/test_fuzz_gpu.py``, the
  sanitizer's cases (``tools/sanitize_cases.py``), every schedule id written in ``tests/gpu`` and
  ``tools``, and the committed record ``tools/device_kernels.txt``;
* ``tune``: every candidate `chord tune` would time on the selection;
* every kernel of a record (``--record FILE``): the "<schedule id> <tile group cap>" lines a GPU
  run writes with ``CHORD_RECORD_KERNELS=FILE`` set (`chord.jit`). Most GPU tests build their
  schedules in code (overrides of a base tile, split-K and n_tiles variants, the layout
  ablation's G = 1 kernels), which only a record of a run names.

Cubins are built into $CHORD_CACHE_DIR; a cached one is reused. Only the collected kernels'
cubins are packed, so stale ones (built from other headers) stay home.
"""
from __future__ import annotations

import csv
import os
import re
import sys
import tarfile
from pathlib import Path
from typing import Iterable

#: the folder that holds the ``chord`` package: a source checkout's root in an editable install
CHECKOUT = Path(__file__).resolve().parents[2]
TEST_NS = (256, 512, 2048, 4096, 7168)  # N of the GPU tests and of the suite's GEMMs
_ID = re.compile(r"['\"]((?:idx|gcon|gmsk)-m\d+n\d+k64(?:-[a-z]+\d*)*)['\"]")
#: the record of the kernels a GPU run of the tests built, committed in a checkout
DEFAULT_RECORD = CHECKOUT / "tools" / "device_kernels.txt"
ARCHIVE_SUFFIX = ".tar.xz"


def checkout_missing(root: Path = CHECKOUT) -> str | None:
    """Why `tests` cannot be collected here (None when it can): it reads a source checkout's
    ``tests/gpu`` and ``tools`` folders, which an installed wheel does not have."""
    missing = [d for d in ("tests/gpu", "tools") if not (root / d).is_dir()]
    return (f"the GPU tests' schedules come from a source checkout of Chord, and {', '.join(missing)} "
            f"is not next to the chord package ({root})") if missing else None


def read_record(path: str | os.PathLike) -> list[tuple[str, int]]:
    """The (schedule id, tile group cap) pairs of a CHORD_RECORD_KERNELS file, in order, once each;
    a malformed line is refused (ValueError) with its number."""
    from chord.jit import TILE_GROUPS
    from chord.schedule import Schedule

    out: dict = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        try:
            sid, cap = parts[0], int(parts[1]) if len(parts) > 1 else 8
            if len(parts) > 2 or cap not in TILE_GROUPS:
                raise ValueError(f"expected '<schedule id> <tile group cap in {TILE_GROUPS}>'")
            Schedule.from_id(sid)
        except (ValueError, IndexError) as exc:
            raise ValueError(f"{path}:{i}: {line!r}: {exc}") from None
        out.setdefault((sid, cap), None)
    return list(out)


def collect(profile: str, *, ablations: bool = False, tests: bool = False, tune: Iterable = (),
            root: Path = CHECKOUT) -> dict:
    """{schedule id: Schedule} of what the module docstring lists (the records aside) for the
    profile file `profile`; `tune`: schedules `chord tune` would time, added as they are."""
    from chord import optimizations
    from chord.schedule import load_profile_file

    out: dict = {}

    def add(s, with_ablations: bool = True) -> None:
        if s is None:
            return
        out.setdefault(s.id, s)
        if with_ablations:
            for off in optimizations.ablations(s).values():
                out.setdefault(off.id, off)

    for s in load_profile_file(profile).all_schedules():
        add(s, with_ablations=False)
    if ablations or tests:
        _collect_ablations(profile, add)
    if tests:
        _collect_tests(root, add)
    for s in tune:
        add(s, with_ablations=False)
    return out


def _collect_ablations(profile: str, add) -> None:
    from chord.lab.bench.suite import SUITES_DIR, load_suite
    from chord.schedule import POLICY_RULES, Schedule, select
    from chord.testing import profile_rule_schedules
    from chord.lab.workbench.data import DATA_DIR

    for s in profile_rule_schedules(TEST_NS, profile_file=profile):
        add(s)
    policies = ["profile", "heuristic", "batch_invariant"] + [f"heuristic,-{r}" for r in POLICY_RULES]
    for sc in (sc for f in sorted(SUITES_DIR.glob("*.json")) for sc in load_suite(f).scenarios):
        for fam in sc.families:
            for gemm in ("gate_up", "down"):
                _, _, prob = sc.gemm_problem(fam, gemm)
                for pol in policies:
                    add(select(sc.profile(profile, fam), prob, pol))
    tables = sorted(DATA_DIR.glob("*.csv"))
    if not tables:
        raise FileNotFoundError(f"no notebook tables in {DATA_DIR}")
    for f in tables:
        rows = (line for line in f.read_text().splitlines() if not line.startswith("#"))
        for row in csv.DictReader(rows):
            if row.get("schedule"):
                add(Schedule.from_id(row["schedule"]), with_ablations=False)


def _collect_tests(root: Path, add) -> None:
    from chord.schedule import Schedule

    why = checkout_missing(root)
    if why:
        raise FileNotFoundError(why)
    sys.path[:0] = [str(root / "tests" / "gpu"), str(root / "tools")]
    try:
        import sanitize_cases
        from test_fuzz_gpu import fuzz_pool
    finally:
        del sys.path[:2]
    for fam in ("indexed", "grouped_contiguous", "grouped_masked"):
        for s in fuzz_pool(fam):
            add(s, with_ablations=False)
        for s in sanitize_cases.schedules(fam, False):
            add(s, with_ablations=False)
    for f in sorted([*(root / "tests" / "gpu").glob("*.py"), *(root / "tools").glob("*.py")]):
        for sid in _ID.findall(f.read_text()):
            add(Schedule.from_id(sid), with_ablations=False)


def extra_kernels(records: Iterable[str | os.PathLike], scheds: dict) -> list:
    """[(Schedule, tile group cap)] of the records' kernels that `scheds` does not build already
    (every one with a cap other than 8, and the ids it lacks)."""
    from chord.schedule import Schedule

    pairs = [(sid, cap) for r in records for sid, cap in read_record(r)]
    return [(Schedule.from_id(sid), cap) for sid, cap in dict.fromkeys(pairs) if cap != 8 or sid not in scheds]


def listing(scheds: dict, extra: list) -> list[str]:
    """One line per kernel, sorted: the schedule id, and the tile group cap when it is not 8."""
    return sorted(set(scheds) | {s.id if cap == 8 else f"{s.id} {cap}" for s, cap in extra})


def build(scheds: dict, extra: list, *, jobs: int | None = None, progress: bool = True) -> list:
    """Builds (or finds in the cache) every kernel: chord.jit BuildResults."""
    from concurrent.futures import ThreadPoolExecutor

    from chord import jit

    res = jit.precompile(list(scheds.values()), progress=progress, jobs=jobs)
    if extra:
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            res += list(pool.map(lambda sc: jit.build_schedule(*sc), extra))
    return res


def pack(cubins, out: str | os.PathLike) -> int:
    """Writes `out` (tar.xz) with these cubins and their build logs and digests, under the cache's
    `cubin/` folder; returns the number of cubins in it. Stale cubins of the same cache (built
    from other headers) stay out. Nothing to pack is a ValueError."""
    cubins = sorted({Path(c) for c in cubins})
    if not cubins:
        raise ValueError("nothing to pack (no kernel was built)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:xz") as tar:
        for c in cubins:
            for p in (c, c.with_suffix(".log"), c.with_suffix(".sha256")):
                if p.exists():
                    tar.add(p, arcname=f"cubin/{p.name}")
    return len(cubins)
