"""Eight ranks, one cache (CPU, compile only): what eight tensor-parallel ranks starting at once on
one host do to one empty kernel cache (chord.jit, "cache files"; docs/reliability.md).

Eight processes are released at the same instant against an empty cache; each builds and loads
three mma kernels (each rank in another order, so builds of different kernels overlap and ranks
queue on the same one) and the C launch module. The real nvcc and C compiler run behind wrappers
that log every compile. Meanwhile this process polls the cache for any file under its final name
whose bytes do not match its checksum file (a partial file a rank could load). Checked: each
kernel and the module compiled exactly once, all eight ranks loaded byte-identical artifacts
(each checked its image against the build's digest when it loaded it), no partial file ever
visible, no staged file left.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chord import jit

ROOT = Path(__file__).resolve().parents[1]
RANKS = 8
KERNELS = ["idx-m8n128k64-w4-s8-c1", "gmsk-m8n128k64-w4-s8-c1", "gcon-m16n128k64-w4-s4-c1"]

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("CHORD_NVCC") and not os.environ.get("CI"),
    reason="nvcc not installed (CI always has it and never skips this)")

_WRAPPER = '''#!{python}
import os, sys
if {marker!r} in sys.argv[1:]:
    with open({calls!r}, "a") as f:
        f.write(os.path.basename(sys.argv[-1] if {marker!r} == "-cubin" else sys.argv[sys.argv.index("-o") + 1]) + "\\n")
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
'''

_RANK = r'''
import hashlib, json, os, sys, time
from pathlib import Path
from chord import jit, launch
from chord.schedule import Schedule
ready, go, rank, ids = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
(ready / str(rank)).touch()
while not go.exists():
    time.sleep(0.002)
out = {}
for sid in ids[rank % len(ids):] + ids[:rank % len(ids)]:
    kernel = jit.kernel_for_schedule(Schedule.from_id(sid))  # loads only bytes its build checked
    out[sid] = hashlib.sha256(kernel._image).hexdigest()
mod = launch.build_module()
assert mod.plan_bytes() == launch.PLAN.size
out["module"] = hashlib.sha256(Path(mod.__file__).read_bytes()).hexdigest()
print(json.dumps(out))
'''


def _wrapper(path: Path, real: str, calls: Path, marker: str) -> str:
    path.write_text(_WRAPPER.format(python=sys.executable, real=real, calls=str(calls), marker=marker))
    path.chmod(0o755)
    return str(path)


class Watcher(threading.Thread):
    """Polls the cache: every file under its final name (a cubin, a log, the module) must match
    the sha256 its checksum file lists for it, at every moment."""

    def __init__(self, cache: Path) -> None:
        super().__init__(daemon=True)
        self.cache, self.stop, self.bad, self.seen, self.polls = cache, threading.Event(), [], set(), 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.polls += 1
            time.sleep(0.002)
        self.poll()

    def poll(self) -> None:
        for folder in (self.cache / "cubin", self.cache / "host"):
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue
            for name in names:
                if name.startswith(".") or name.endswith(".sha256"):
                    continue
                path = folder / name
                try:
                    data = path.read_bytes()
                except FileNotFoundError:  # pragma: no cover - nothing is removed in this test
                    continue
                self.seen.add(name)
                sums_file = path.with_suffix(".sha256")
                try:
                    parsed = jit._parse_sums(sums_file.read_text(), name)
                except FileNotFoundError:
                    parsed = None
                if parsed is None or parsed[0].get(name) != hashlib.sha256(data).hexdigest():
                    self.bad.append(f"{name}: {len(data)} bytes, checksum file {'missing' if parsed is None else parsed[0]}")


@needs_nvcc
def test_eight_ranks_build_each_kernel_once_and_load_identical_bytes(tmp_path):
    cache, ready, go = tmp_path / "cache", tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    calls = tmp_path / "compiles"
    tools = tmp_path / "bin"
    tools.mkdir()
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (the launch module's)"
    env = {**os.environ, "CHORD_CACHE_DIR": str(cache),
           "CHORD_NVCC": _wrapper(tools / "nvcc", jit.nvcc_path(), calls, "-cubin"),
           "CC": _wrapper(tools / "cc", cc, calls, "-shared")}
    for var in ("CHORD_PTXAS_CHECK", "CHORD_DUMP_SASS", "CHORD_RECORD_KERNELS"):
        env.pop(var, None)
    if jit._cuobjdump():  # found next to the real nvcc: the same one behind the wrapper
        env["CHORD_CUOBJDUMP"] = jit._cuobjdump()
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(ready), str(go), str(r), *KERNELS], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(RANKS)]
    watcher = Watcher(cache)
    try:
        deadline = time.time() + 60
        while len(os.listdir(ready)) < RANKS and time.time() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.01)
        assert len(os.listdir(ready)) == RANKS, "not every rank started"
        assert not cache.exists()  # empty until they go
        watcher.start()
        t = time.time()
        go.touch()  # all eight at once
        results = [p.communicate(timeout=240) for p in procs]
        took = time.time() - t
    finally:
        watcher.stop.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    watcher.join()
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, f"a rank exited with {p.returncode}:\n{out}\n{err}"
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    # each kernel (by its source file) and the module (by its output) compiled exactly once
    compiled = sorted(calls.read_text().splitlines())
    assert compiled == sorted([f"{sid}.cu" for sid in KERNELS] + [next((cache / "host").glob("*.so")).name]), \
        compiled
    # every rank loaded the same bytes, and those are what the cache holds, whole
    for key in [*KERNELS, "module"]:
        assert len({r[key] for r in reports}) == 1, (key, [r[key] for r in reports])
    for sid in KERNELS:
        (cubin,) = (cache / "cubin").glob(f"{sid}-*.cubin")
        assert jit._intact(cubin) and hashlib.sha256(cubin.read_bytes()).hexdigest() == reports[0][sid]
    (so,) = (cache / "host").glob("*.so")
    assert jit._read_entry(so)[0] is not None and hashlib.sha256(so.read_bytes()).hexdigest() == reports[0]["module"]
    # no rank could ever have seen a partial file; none was left staged; nobody warned
    assert watcher.polls > 10 and len(watcher.seen) == 2 * len(KERNELS) + 1, (watcher.polls, watcher.seen)
    assert watcher.bad == []
    assert [p.name for d in ("cubin", "host") for p in (cache / d).glob(".*")] == []
    assert not [err for _, err in results if "damaged" in err or "cannot be written" in err], [e for _, e in results]
    print(f"8 ranks, {len(KERNELS)} kernels + the launch module: {took:.1f} s, {watcher.polls} polls")
