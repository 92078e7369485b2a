"""The kernel cache cannot crash the process (chord.jit, "cache files"; docs/reliability.md).

Every artifact kind of the cache, each damaged the ways a full disk, a killed build or a stray
edit leave it (cut short, zeroed, its checksum file missing, garbled or disagreeing), is rebuilt
with a warning naming it and never loaded, and what is rebuilt verifies:

* a cubin and its build log (a fake nvcc and cuobjdump: fast, and runs everywhere);
* the C launch module of chord.launch (built for real with the system C compiler; every load of a
  damaged one runs in a child process, so a regression is a failed test, not a crashed pytest).

Also: entries of caches written before this change stay valid (not rebuilt); a cache that cannot
be written (a path under a file, a full disk, a read-only file system: simulated, since tests run
as root) falls back to a private folder with one warning, or gives an error naming the cache and
CHORD_CACHE_DIR, and never holds a half-written entry; a read-only cache that holds its kernels is
used as is; a process killed in the middle of a build (in nvcc, or between the renames that
publish an entry) leaves nothing that is loaded, does not block the next process, and the next
process rebuilds cleanly and removes the staged files it left.
"""
from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from chord import jit, launch

ROOT = Path(__file__).resolve().parents[1]

_FAKE_NVCC = '''
import os, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("Cuda compilation tools, release 13.0, V13.0.0 (fake)")
    sys.exit(0)
src = args[-1]
with open(os.environ["FAKE_NVCC_CALLS"], "a") as f:
    f.write(os.path.basename(src) + "\\n")
hang = os.environ.get("FAKE_NVCC_HANG")
if hang:
    open(hang, "w").close()
    time.sleep(120)
with open(args[args.index("-o") + 1], "wb") as f:
    f.write(b"\\x7fELF fake cubin\\n" + open(src, "rb").read() * 64)
print("ptxas info    : Used 40 registers")
'''

_FAKE_CUOBJDUMP = '''
import sys
print("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R28.64] ;")
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake nvcc that logs each compile (and hangs when FAKE_NVCC_HANG names a marker file), a
    fake cuobjdump with clean SASS, a fresh cache and a fresh per-process memo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("nvcc", _FAKE_NVCC), ("cuobjdump", _FAKE_CUOBJDUMP)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "nvcc.calls"
    monkeypatch.setenv("CHORD_NVCC", str(bin_dir / "nvcc"))
    monkeypatch.setenv("CHORD_CUOBJDUMP", str(bin_dir / "cuobjdump"))
    monkeypatch.setenv("FAKE_NVCC_CALLS", str(calls))
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("CHORD_PTXAS_CHECK", "CHORD_DUMP_SASS", "FAKE_NVCC_HANG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(jit, "_sass_rechecked", set())
    monkeypatch.setattr(jit, "_private_roots", {})

    class Fake:
        cache = tmp_path / "cache"

        @staticmethod
        def compiles() -> int:
            return len(calls.read_text().splitlines()) if calls.exists() else 0

    return Fake


SRC = 'extern "C" __global__ void k(int* p) { p[threadIdx.x] = 1; }\n'


def entry_of(res) -> tuple[Path, Path, Path]:
    """(cubin, log, checksum file) of a build result."""
    return res.cubin, res.cubin.with_suffix(".log"), res.cubin.with_suffix(".sha256")


def staged_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*")) if folder.exists() else []


def damage(path: Path, sums: Path, how: str) -> None:
    """Damage `path` (or its checksum file `sums`) one way."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "zeroed":
        path.write_bytes(b"\0" * len(data))
    elif how == "missing":
        path.unlink()
    elif how == "no checksum file":
        sums.unlink()
    elif how == "checksum disagrees":
        lines = sums.read_text().splitlines()
        other = hashlib.sha256(b"something else").hexdigest()
        sums.write_text("".join(other + line[64:] + "\n" if line.endswith(path.name) else line + "\n"
                                for line in lines))
    elif how == "checksum file zeroed":
        sums.write_bytes(b"\0" * len(sums.read_bytes()))
    else:  # pragma: no cover
        raise AssertionError(how)


def check_rebuilt(fake, res, before: int) -> None:
    """The build after the damage: a fresh one that verifies and loads; the next is cached."""
    assert not res.cached and fake.compiles() == before + 1
    cubin, log, sums = entry_of(res)
    assert jit._intact(cubin)
    lines = sums.read_text().splitlines()
    assert [line[66:] for line in lines] == [cubin.name, log.name]  # sha256sum's format, both files
    assert lines[0][:64] == res.sha256 == hashlib.sha256(cubin.read_bytes()).hexdigest()
    assert jit.Kernel(cubin, sha256=res.sha256)._image == cubin.read_bytes()
    again = jit.build(SRC, name="k")
    assert again.cached and again.sha256 == res.sha256 and fake.compiles() == before + 1
    assert staged_files(cubin.parent) == []


# ---- cubins and their build logs ----------------------------------------------------------


def test_a_fresh_entry_is_whole_and_listed_in_its_checksum_file(fake):
    res = jit.build(SRC, name="k")
    cubin, log, sums = entry_of(res)
    assert not res.cached and fake.compiles() == 1 and res.registers == 40
    assert sums.read_text() == (f"{hashlib.sha256(cubin.read_bytes()).hexdigest()}  {cubin.name}\n"
                                f"{hashlib.sha256(log.read_bytes()).hexdigest()}  {log.name}\n")
    assert jit._SASS_CHECKED in log.read_text() and staged_files(cubin.parent) == []
    assert (fake.cache / "locks" / f"{cubin.name}.lock").exists()
    # sha256sum -c accepts the checksum file as it is
    ok = subprocess.run(["sha256sum", "-c", sums.name], cwd=cubin.parent, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    again = jit.build(SRC, name="k")
    assert again.cached and again.sha256 == res.sha256 and fake.compiles() == 1


_CUBIN_DAMAGE = ["truncated", "empty", "zeroed", "missing", "no checksum file", "checksum disagrees",
                 "checksum file zeroed"]
_LOG_DAMAGE = ["truncated", "empty", "zeroed", "missing", "checksum disagrees"]  # one checksum file for both


@pytest.mark.parametrize("kind,how", [("cubin", h) for h in _CUBIN_DAMAGE] + [("log", h) for h in _LOG_DAMAGE])
def test_a_damaged_cubin_or_log_is_rebuilt_never_loaded(fake, kind, how):
    first = jit.build(SRC, name="k")
    cubin, log, sums = entry_of(first)
    damage(cubin if kind == "cubin" else log, sums, how)
    if how == "missing" and kind == "cubin":  # no entry at all: built without a warning
        res = jit.build(SRC, name="k")
    else:
        with pytest.warns(RuntimeWarning, match=rf"cached kernel {cubin} is damaged \(.*"
                                                 rf"({cubin.name}|{log.name}|{sums.name}).*; rebuilding it"):
            res = jit.build(SRC, name="k")
    assert res.cubin == first.cubin
    check_rebuilt(fake, res, 1)


def test_a_kernel_loads_only_the_bytes_its_build_checked(fake):
    """Kernel(sha256=...) refuses other bytes; the loader builds once more when the file changed
    between the check and the load (the cache's kernels are loaded that way)."""
    res = jit.build(SRC, name="k")
    with pytest.raises(jit.JitError, match="changed after it was checked"):
        jit.Kernel(res.cubin, sha256=hashlib.sha256(b"other").hexdigest())
    results = []

    def build_then_damage():
        got = jit.build(SRC, name="k")
        if not results:
            got.cubin.write_bytes(b"\x7fELF cut sh")
        results.append(got)
        return got

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k = jit._load_checked(build_then_damage, "k", 0)
    said = [str(w.message) for w in seen]
    assert len(said) == 2 and "changed after it was checked" in said[0] and said[0].endswith("rebuilding it"), said
    assert f"cached kernel {results[0].cubin} is damaged" in said[1], said
    assert len(results) == 2 and not results[1].cached and fake.compiles() == 2
    assert hashlib.sha256(k._image).hexdigest() == results[1].sha256 and jit._intact(results[1].cubin)


def test_entries_of_the_old_checksum_form_stay_valid(fake):
    """A cache written before checksummed logs: a cubin, its log and a checksum file of one bare
    line (the cubin's sha256). It is used as it is, not rebuilt; a damaged cubin of that form
    still is."""
    res = jit.build(SRC, name="k")
    cubin, log, sums = entry_of(res)
    sums.write_text(hashlib.sha256(cubin.read_bytes()).hexdigest() + "\n")
    log.write_text(log.read_text() + "anything: the old form does not check the log\n")
    again = jit.build(SRC, name="k")
    assert again.cached and fake.compiles() == 1 and again.registers == 40 and jit._intact(cubin)
    log.unlink()
    assert jit.build(SRC, name="k").cached and fake.compiles() == 1
    cubin.write_bytes(cubin.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match="its bytes differ from the sha256"):
        res = jit.build(SRC, name="k")
    check_rebuilt(fake, res, 1)


def test_an_old_entry_without_the_sass_record_gets_it_and_a_new_checksum_file(fake):
    """The SASS record (chord: SASS checked) is added to the log of an old entry with a checksum
    file that lists both files, so the entry's log is checked from then on."""
    res = jit.build(SRC, name="k")
    cubin, log, sums = entry_of(res)
    log.write_text("ptxas info    : Used 40 registers\n")
    sums.write_text(hashlib.sha256(cubin.read_bytes()).hexdigest() + "\n")
    jit._sass_rechecked.clear()
    again = jit.build(SRC, name="k")
    assert again.cached and jit._SASS_CHECKED in again.log and jit._SASS_CHECKED in log.read_text()
    assert len(sums.read_text().splitlines()) == 2 and jit._intact(cubin) and fake.compiles() == 1
    assert staged_files(cubin.parent) == []


# ---- a cache that cannot be written -------------------------------------------------------


def _under(path: Path, root: Path) -> bool:
    return str(path).startswith(str(root) + os.sep) or str(path) == str(root)


def test_a_cache_under_a_file_falls_back_to_a_private_folder(fake, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    bad = tmp_path / "file" / "cache"
    monkeypatch.setenv("CHORD_CACHE_DIR", str(bad))
    with pytest.warns(RuntimeWarning, match=rf"kernel cache {bad} cannot be written \(Not a directory\).*"
                                             r"CHORD_CACHE_DIR"):
        res = jit.build(SRC, name="k")
    assert not res.cached and not _under(res.cubin, bad) and jit._intact(res.cubin)
    assert jit.Kernel(res.cubin, sha256=res.sha256)._image == res.cubin.read_bytes()
    again = jit.build(SRC, name="k")  # found in the private folder: no second compile
    assert again.cached and again.cubin == res.cubin and fake.compiles() == 1
    other = jit.build(SRC.replace("1;", "2;"), name="k2")  # said once per process
    assert not other.cached and other.cubin.parent == res.cubin.parent


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_leaves_no_entry_and_falls_back(fake, monkeypatch, err):
    """The disk of the cache fills while an entry is written (fsync reports it): nothing is
    published there, no staged file is left, and the process uses a private folder."""
    real_fsync = os.fsync

    def fsync(fd):
        if _under(Path(os.readlink(f"/proc/self/fd/{fd}")), fake.cache):
            raise OSError(err, os.strerror(err))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.warns(RuntimeWarning, match=rf"kernel cache {fake.cache} cannot be written \({os.strerror(err)}\)"):
        res = jit.build(SRC, name="k")
    assert not _under(res.cubin, fake.cache) and jit._intact(res.cubin) and fake.compiles() == 1
    assert not list((fake.cache / "cubin").iterdir())
    monkeypatch.setattr(os, "fsync", real_fsync)  # space again: the next process fills the cache
    monkeypatch.setattr(jit, "_private_roots", {})
    fresh = jit.build(SRC, name="k")
    assert _under(fresh.cubin, fake.cache) and jit._intact(fresh.cubin)


def test_no_room_anywhere_is_an_error_naming_the_cache_and_the_variable(fake, monkeypatch):
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        with pytest.raises(jit.JitError, match=rf"kernel cache {fake.cache} cannot be written \(No space left on "
                                               r"device\), nor a private folder .*CHORD_CACHE_DIR"):
            jit.build(SRC, name="k")
    assert not list((fake.cache / "cubin").iterdir())


def test_precompile_refuses_a_cache_it_cannot_fill(fake, tmp_path, monkeypatch):
    """precompile exists to fill the cache: no private folder for it. A cache that is not a folder
    is refused before any compile; a disk that fills meanwhile, after, naming how many kernels."""
    from chord.schedule import Schedule

    scheds = [Schedule.from_id("idx-m8n128k64-w4-s8-c1"), Schedule.from_id("gmsk-m8n128k64-w4-s8-c1")]
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path / "file" / "c"))
    with pytest.raises(jit.JitError, match=r"kernel cache .*/file/c cannot be written \(Not a directory\); "
                                            r"set CHORD_CACHE_DIR"):
        jit.precompile(scheds, progress=False)
    assert fake.compiles() == 0
    monkeypatch.setenv("CHORD_CACHE_DIR", str(fake.cache))
    real_fsync = os.fsync

    def fsync(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if _under(path, fake.cache) and path.name.startswith(".gmsk"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)  # the disk fills after the first kernel
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        with pytest.raises(jit.JitError, match=r"1 of 2 kernels were built into a temporary folder .*CHORD_CACHE_DIR"):
            jit.precompile(scheds, progress=False, jobs=1)
    assert [p.name.split("-")[0] for p in (fake.cache / "cubin").glob("*.cubin")] == ["idx"]


def _read_only(monkeypatch, root: Path) -> None:
    """Every write under `root` fails with EROFS, as on a read-only mount (root ignores chmod)."""
    def refuse(path):
        if _under(Path(os.fspath(path)).absolute(), root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

    real_open, real_replace, real_mkdir = os.open, os.replace, os.mkdir

    def open_(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_open(path, flags, *a, **k)

    def replace(src, dst, *a, **k):
        refuse(dst)
        return real_replace(src, dst, *a, **k)

    def mkdir(path, *a, **k):
        if not os.path.isdir(path):
            refuse(path)
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "mkdir", mkdir)


def test_a_read_only_cache_is_used_as_is_and_what_it_lacks_built_privately(fake, monkeypatch):
    held = jit.build(SRC, name="k")
    before = sorted(p.name for p in (fake.cache / "cubin").iterdir())
    with pytest.MonkeyPatch.context() as mp:
        _read_only(mp, fake.cache)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = jit.build(SRC, name="k")  # a kernel it holds: read, no lock, no write, no warning
        assert got.cached and got.cubin == held.cubin and fake.compiles() == 1
        with pytest.warns(RuntimeWarning, match=rf"{fake.cache} cannot be written \(Read-only file system\)"):
            new = jit.build(SRC.replace("1;", "3;"), name="k3")
    assert not new.cached and not _under(new.cubin, fake.cache) and jit._intact(new.cubin)
    assert sorted(p.name for p in (fake.cache / "cubin").iterdir()) == before
    # a damaged entry of a read-only cache: said, rebuilt privately, never loaded
    (fake.cache / "cubin" / held.cubin.name).write_bytes(b"\0" * 64)  # (as root: the mount stands in)
    before = sorted(p.name for p in (fake.cache / "cubin").iterdir())
    with pytest.MonkeyPatch.context() as mp:
        _read_only(mp, fake.cache)
        with pytest.warns(RuntimeWarning, match=rf"cached kernel {held.cubin} is damaged"):
            fixed = jit.build(SRC, name="k")
    assert not _under(fixed.cubin, fake.cache) and jit._intact(fixed.cubin)
    assert sorted(p.name for p in (fake.cache / "cubin").iterdir()) == before


def test_a_rename_refused_midway_publishes_nothing_loadable(fake, monkeypatch):
    """EROFS on the second rename (the checksum file is in place, the log and cubin are not):
    nothing under the cubin's name, staged files removed, the process falls back."""
    real = os.replace
    seen = []

    def replace(src, dst, *a, **k):
        seen.append(dst)
        if len(seen) == 2:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        res = jit.build(SRC, name="k")
    monkeypatch.setattr(os, "replace", real)
    name = res.cubin.name
    assert not (fake.cache / "cubin" / name).exists() and staged_files(fake.cache / "cubin") == []
    assert jit._intact(res.cubin)
    monkeypatch.setattr(jit, "_private_roots", {})
    res2 = jit.build(SRC, name="k")  # a checksum file alone is no entry: built without a warning
    assert res2.cubin == fake.cache / "cubin" / name and jit._intact(res2.cubin)


# ---- the C launch module (real compiler; damaged loads in a child process) -------------------

_CHILD = r'''
import os, signal, sys, warnings
from pathlib import Path
kill_at = int(os.environ.get("KILL_AT_REPLACE", "-1"))
if kill_at >= 0:  # die (SIGKILL) at the n-th rename of the build: a build killed midway
    real, n = os.replace, [0]
    def replace(src, dst, *a, **k):
        if n[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        n[0] += 1
        return real(src, dst, *a, **k)
    os.replace = replace
warnings.simplefilter("always")
from chord import jit, launch
if sys.argv[1] == "module":
    mod = launch.build_module(Path(sys.argv[2]))
    print("loaded", mod.plan_bytes(), mod.__file__)
else:
    res = jit.build(sys.argv[2], name="k")
    jit.Kernel(res.cubin, sha256=res.sha256)
    print("loaded", res.cached, res.cubin)
'''


def child(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CHILD, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def loaded(proc: subprocess.CompletedProcess) -> str:
    """stdout of a child that must have loaded its artifact; a signal shows as the failure."""
    assert proc.returncode == 0, (f"child exited with {proc.returncode}"
                                  f"{' (signal ' + signal.Signals(-proc.returncode).name + ')' if proc.returncode < 0 else ''}"
                                  f":\n{proc.stdout}{proc.stderr}")
    assert proc.stdout.startswith("loaded "), proc.stdout
    return proc.stdout


@pytest.fixture(scope="module")
def built_module(tmp_path_factory):
    """One launch module built for real (in a child: this process never maps it), its bytes and
    its checksum file's, to copy into each test's cache."""
    cache = tmp_path_factory.mktemp("so")
    out = loaded(child("module", str(cache)))
    so = Path(out.split()[-1])
    return so.name, so.read_bytes(), so.with_suffix(".sha256").read_bytes()


def _module_cache(tmp_path, built_module) -> tuple[Path, Path, Path]:
    name, data, sums = built_module
    cache = tmp_path / "c"
    (cache / "host").mkdir(parents=True)
    so = cache / "host" / name
    so.write_bytes(data)
    so.with_suffix(".sha256").write_bytes(sums)
    return cache, so, so.with_suffix(".sha256")


def test_the_launch_module_has_a_checksum_file(tmp_path, built_module):
    cache, so, sums = _module_cache(tmp_path, built_module)
    assert sums.read_text() == f"{hashlib.sha256(so.read_bytes()).hexdigest()}  {so.name}\n"
    proc = child("module", str(cache))
    loaded(proc)
    assert "damaged" not in proc.stderr and so.read_bytes() == built_module[1]  # used as it is


@pytest.mark.parametrize("how", ["truncated", "empty", "zeroed", "no checksum file", "checksum disagrees",
                                 "checksum file zeroed"])
def test_a_damaged_launch_module_is_rebuilt_never_loaded(tmp_path, built_module, how):
    """Loaded unchecked, a cut-short module kills the process (SIGBUS) and a zeroed one can too."""
    cache, so, sums = _module_cache(tmp_path, built_module)
    damage(so, sums, how)
    proc = child("module", str(cache))
    loaded(proc)
    assert f"cached C launch module {so} is damaged" in proc.stderr and "rebuilding it" in proc.stderr
    files, why = jit._read_entry(so)
    assert files is not None and why is None and len(files[so.name]) > 1000
    assert staged_files(so.parent) == []


def test_a_launch_module_cache_under_a_file_falls_back(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(jit, "_private_roots", {})
    with pytest.warns(RuntimeWarning, match=r"kernel cache .*/file/c cannot be written .*CHORD_CACHE_DIR"):
        mod = launch.build_module(tmp_path / "file" / "c")
    assert mod.plan_bytes() == launch.PLAN.size
    assert jit._read_entry(Path(mod.__file__))[0] is not None


# ---- a build killed midway ------------------------------------------------------------------


@pytest.mark.parametrize("kill_at", [0, 1, 2])
def test_a_build_killed_between_its_renames_is_redone_cleanly(fake, kill_at):
    """SIGKILL at the n-th rename that publishes an entry (0: every file staged, none renamed; 1:
    the checksum file renamed; 2: the checksum file and the log): nothing under the cubin's name
    is loadable, and the next process builds it without a warning and removes what was staged."""
    proc = child("cubin", SRC, env={"KILL_AT_REPLACE": str(kill_at)})
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    folder = fake.cache / "cubin"
    assert len(staged_files(folder)) == 3 - kill_at  # left behind by the killed process
    assert not list(folder.glob("*.cubin"))
    out = loaded(child("cubin", SRC))
    assert "loaded False" in out and "damaged" not in out and fake.compiles() == 2
    cubin = Path(out.split()[-1])
    assert jit._intact(cubin) and staged_files(folder) == []


def test_a_rebuild_killed_midway_over_a_damaged_entry_is_redone(fake):
    first = jit.build(SRC, name="k")
    first.cubin.write_bytes(b"\0" * 100)
    proc = child("cubin", SRC, env={"KILL_AT_REPLACE": "1"})  # the new checksum file, then killed
    assert proc.returncode == -signal.SIGKILL
    proc = child("cubin", SRC)
    out = loaded(proc)
    assert f"cached kernel {first.cubin} is damaged" in proc.stderr and fake.compiles() == 3
    assert jit._intact(first.cubin) and staged_files(first.cubin.parent) == []


def test_a_build_killed_in_the_compiler_does_not_block_the_next(fake, tmp_path):
    """The killed builder held the entry's lock (flock): the kernel releases it, so the next
    process does not wait for it, and builds the kernel."""
    marker = tmp_path / "in-nvcc"
    p = subprocess.Popen([sys.executable, "-c", _CHILD, "cubin", SRC], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ, "FAKE_NVCC_HANG": str(marker)},
                         start_new_session=True)
    try:
        deadline = time.time() + 60
        while not marker.exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the child never reached nvcc"
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the child and its fake nvcc
        p.communicate()
    assert p.returncode == -signal.SIGKILL
    t = time.time()
    out = loaded(child("cubin", SRC, timeout=60))
    assert time.time() - t < 30 and fake.compiles() == 2
    assert jit._intact(Path(out.split()[-1])) and staged_files(fake.cache / "cubin") == []


@pytest.mark.parametrize("kill_at", [0, 1])
def test_a_launch_module_build_killed_midway_is_redone(tmp_path, kill_at):
    cache = tmp_path / "c"
    proc = child("module", str(cache), env={"KILL_AT_REPLACE": str(kill_at)})
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert not list((cache / "host").glob("*.so")) and len(staged_files(cache / "host")) == 2 - kill_at
    out = loaded(child("module", str(cache)))
    so = Path(out.split()[-1])
    assert jit._read_entry(so)[0] is not None and staged_files(cache / "host") == []
