"""Build, on a machine without a GPU, the kernel cache a GPU machine needs, and pack it to carry.

The GPU machine compiles a missing kernel itself, but its minutes are scarce, so a run
builds here (same nvcc) every kernel its runs can launch and carries the cache as one file:

    python tools/device_cache.py --out .cache/device.tar.xz [--tune ep8-decode-tok32,tp8-m1024]
    # on the GPU machine: mkdir -p $CHORD_CACHE_DIR && tar -xf .cache/device.tar.xz -C $CHORD_CACHE_DIR

What it collects (deduplicated, each with its `chord.optimizations` ablations where the GPU tests
or notebooks switch knobs off):

* every schedule a profile rule gives, fitted to each N of the suite and of the GPU tests;
* the decision for every GEMM of every packaged suite under the profile, the heuristic, each heuristic rule off
  and the batch-invariant policy (what `chord bench --policy`, the notebooks' ablations and
  vLLM's tuning rows select);
* the schedules named in the committed notebook tables (`chord/data/notebooks/*.csv`);
* with ``--tests`` (default on): the fuzz pools of `tests/gpu/test_fuzz_gpu.py`, the sanitizer's
  cases (`tools/sanitize_cases.py`) and every schedule id written in `tests/gpu` and `tools`;
* with ``--tune SCENARIOS``: every candidate `chord tune` would time there;
* every kernel of a record (``--record FILE``, default `tools/device_kernels.txt` when it
  exists): the "<schedule id> <tile group cap>" lines a GPU run writes with
  ``CHORD_RECORD_KERNELS=FILE`` set (`chord.jit`). Most GPU tests build their schedules in code
  (overrides of a base tile, split-K and n_tiles variants, the layout ablation's G = 1 kernels),
  which only a record of a run names; a GPU run of the tests with the variable set that
  commits the file as `tools/device_kernels.txt` lets the next one build all of them here.

Cubins are built into $CHORD_CACHE_DIR (or ``--cache-dir``); a cached one is reused (and its SASS
check recorded if it lacked one). Only the collected schedules' cubins are packed, so stale ones
(other headers) stay home. ``--list`` prints the schedule ids and builds nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_NS = (256, 512, 2048, 4096, 7168)  # N of the GPU tests and of the suite's GEMMs
_ID = re.compile(r"['\"]((?:idx|gcon|gmsk)-m\d+n\d+k64(?:-[a-z]+\d*)*)['\"]")


DEFAULT_RECORD = ROOT / "tools" / "device_kernels.txt"


def read_record(path: Path) -> list[tuple[str, int]]:
    """The (schedule id, tile group cap) pairs of a CHORD_RECORD_KERNELS file, in order, once each;
    a malformed line is refused with its number."""
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


def collect(tests: bool = True, tune_scenarios: str | None = None, profile: str | None = None,
            tune_suite: str | None = None, max_candidates: int | None = 24) -> dict:
    """{schedule id: Schedule} of everything listed in the module docstring except the record
    (profile: the profile file's name, default chord.schedule.gpu_profile_name())."""
    from chord import optimizations
    from chord.bench.suite import load_suite
    from chord.schedule import POLICY_RULES, Schedule, gpu_profile_name, select
    from chord.testing import profile_rule_schedules

    profile = profile or gpu_profile_name()
    out: dict = {}

    def add(s, with_ablations: bool = True) -> None:
        if s is None:
            return
        out.setdefault(s.id, s)
        if with_ablations:
            for off in optimizations.ablations(s).values():
                out.setdefault(off.id, off)

    for s in profile_rule_schedules(TEST_NS, profile_file=profile):
        add(s)
    policies = ["profile", "heuristic", "batch_invariant"] + [f"heuristic,-{r}" for r in POLICY_RULES]
    from chord.bench.suite import SUITES_DIR

    for sc in (sc for f in sorted(SUITES_DIR.glob("*.json")) for sc in load_suite(f).scenarios):
        for fam in sc.families:
            for gemm in ("gate_up", "down"):
                _, _, prob = sc.gemm_problem(fam, gemm)
                for pol in policies:
                    add(select(sc.profile(profile, fam), prob, pol))
    from chord.workbench.data import DATA_DIR

    tables = sorted(DATA_DIR.glob("*.csv"))
    if not tables:
        raise FileNotFoundError(f"no notebook tables in {DATA_DIR}")
    for f in tables:
        rows = (line for line in f.read_text().splitlines() if not line.startswith("#"))
        for row in csv.DictReader(rows):
            if row.get("schedule"):
                add(Schedule.from_id(row["schedule"]), with_ablations=False)
    if tests:
        sys.path[:0] = [str(ROOT / "tests" / "gpu"), str(ROOT / "tools")]
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
        for f in sorted([*(ROOT / "tests" / "gpu").glob("*.py"), *(ROOT / "tools").glob("*.py")]):
            for sid in _ID.findall(f.read_text()):
                add(Schedule.from_id(sid), with_ablations=False)
    if tune_scenarios:
        from chord import tune

        for s in tune.tune_schedules(tune_suite, None if tune_scenarios == "all" else tune_scenarios,
                                     profile_file=profile, max_candidates=max_candidates):
            add(s, with_ablations=False)
    return out


def pack(cubins, out: Path) -> int:
    """Writes `out` (tar.xz) with these cubins and their build logs and digests, under the cache's
    `cubin/` folder; returns the number of cubins in it. Stale cubins of the same cache (built
    from other headers) stay out."""
    cubins = sorted({Path(c) for c in cubins})
    if not cubins:
        raise SystemExit("device_cache: nothing to pack (no kernel was built)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:xz") as tar:
        for c in cubins:
            for p in (c, c.with_suffix(".log"), c.with_suffix(".sha256")):
                if p.exists():
                    tar.add(p, arcname=f"cubin/{p.name}")
    return len(cubins)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "device.tar.xz",
                    help="the packed cache to carry (default .cache/device.tar.xz)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="kernel cache to build into (default $CHORD_CACHE_DIR)")
    ap.add_argument("--no-tests", action="store_true", help="leave out the GPU tests' fuzz and sanitizer schedules")
    ap.add_argument("--tune", default=None, metavar="SCENARIOS",
                    help="also every candidate chord tune times on these comma-separated scenarios")
    ap.add_argument("--tune-suite", default=None, metavar="SUITE",
                    help="with --tune: the suite its scenarios come from (default kimi_k2_h200; 'all' in --tune "
                         "takes every scenario)")
    ap.add_argument("--max-candidates", type=int, default=24, help="with --tune: as chord tune's (default 24)")
    ap.add_argument("--record", type=Path, action="append", default=None,
                    help="a CHORD_RECORD_KERNELS file of a GPU run (repeatable; default tools/device_kernels.txt "
                         "when it exists)")
    ap.add_argument("--profile", default=None, help="profile file (default $CHORD_PROFILE or h200)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    ap.add_argument("--list", action="store_true", help="print the schedule ids and build nothing")
    a = ap.parse_args(argv)
    if a.jobs is not None and a.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {a.jobs}")
    from chord import _env

    # --cache-dir: chord.jit builds into it (an override every thread of the build sees)
    cache = _env.override(CHORD_CACHE_DIR=a.cache_dir) if a.cache_dir is not None else contextlib.nullcontext()
    with cache:
        return _build(a, ap)


def _build(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    records = a.record if a.record is not None else ([DEFAULT_RECORD] if DEFAULT_RECORD.exists() else [])
    try:
        scheds = collect(tests=not a.no_tests, tune_scenarios=a.tune, profile=a.profile, tune_suite=a.tune_suite,
                         max_candidates=a.max_candidates)
        pairs = [(sid, cap) for r in records for sid, cap in read_record(r)]
    except (ValueError, FileNotFoundError) as exc:  # an unknown scenario or profile, a bad record
        ap.error(str(exc))
    from chord.schedule import Schedule

    extra = [(Schedule.from_id(sid), cap) for sid, cap in dict.fromkeys(pairs)
             if cap != 8 or sid not in scheds]
    if a.list:  # one line per kernel: the schedule id, and the tile group cap when it is not 8
        print("\n".join(sorted(set(scheds) | {s.id if cap == 8 else f"{s.id} {cap}" for s, cap in extra})))
        return 0
    from concurrent.futures import ThreadPoolExecutor

    from chord import jit

    t = time.time()
    res = jit.precompile(list(scheds.values()), progress=False, jobs=a.jobs)
    with ThreadPoolExecutor(max_workers=a.jobs or os.cpu_count() or 1) as pool:
        res += list(pool.map(lambda sc: jit.build_schedule(*sc), extra))
    spills = [r for r in res if r.spill_bytes]
    n = pack([r.cubin for r in res], a.out)
    print(f"device_cache: {len(res)} schedules built or found in {time.time() - t:.0f} s ({len(spills)} with "
          f"register spills); "
          f"{n} cubins packed into {a.out} ({a.out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
