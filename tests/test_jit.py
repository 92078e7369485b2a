"""The JIT layer on a machine without a GPU: rendering, cache keys, and compiling every kernel
the default profile can select (nvcc builds sm_90a code without a GPU, so a template error fails
CI here)."""
import errno
import hashlib
import os
import re
import shutil

import pytest

from chord import jit
from chord.schedule import KNOBS, Schedule, load_profile_file

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("CHORD_NVCC") and not os.environ.get("CI"),
    reason="nvcc not installed (CI always has it and never skips this)")


def _cfg(src: str) -> dict:
    """The rendered configuration struct's constants by name."""
    body = src[src.index("struct ChordCfg {"):src.index("};", src.index("struct ChordCfg {"))]
    return dict(re.findall(r"static constexpr \S+ (k\w+) = ([^;]+);", body))


def test_render_composes_family_mainloop_and_knobs():
    s = Schedule("grouped_masked", 16, 128, 4, 6, 2)
    src = jit.render(s)
    assert '#include "sm90_w4a16_moe.cuh"' in src
    assert "using ChordKernel = chord::MoeKernel<ChordCfg>;" in src
    cfg = _cfg(src)
    # one named constant per knob, in the table's order, plus the family
    assert list(cfg) == ["kFamily"] + [k.cxx for k in KNOBS]
    assert cfg["kFamily"] == "chord::Family::kMasked" and cfg["kMainloop"] == "chord::Mainloop::kMma"
    assert (cfg["kBlockM"], cfg["kBlockN"], cfg["kWarps"], cfg["kStages"], cfg["kCtasPerSm"]) == ("16", "128", "4", "6", "2")
    assert (cfg["kSwap"], cfg["kFold"], cfg["kStmatrix"], cfg["kPdl"]) == ("true", "false", "true", "false")
    assert _cfg(jit.render(Schedule("indexed", 8, 64, 4, 8, 1, 4)))["kSplitK"] == "4"
    assert _cfg(jit.render(Schedule("indexed", 8, 128, 4, 6, 1, n_tiles=4)))["kNTilesPerCta"] == "4"
    assert _cfg(jit.render(Schedule("indexed", 16, 256, 4, 8, 1, swap=0)))["kSwap"] == "false"
    assert _cfg(jit.render(Schedule("indexed", 8, 256, 4, 8, 1, fold=1)))["kFold"] == "true"
    assert "__launch_bounds__(ChordKernel::kThreads, ChordCfg::kCtasPerSm)" in src and s.id in src
    assert _cfg(jit.render(Schedule("grouped_masked", 16, 128, 4, 6, 2, stmatrix=0)))["kStmatrix"] == "false"
    # persistent CTAs and the work queue: two knobs, two names (MoeKernel combines them)
    ps = Schedule("indexed", 96, 128, 8, 5, 1, mainloop="wgmma", raster=8, n_tiles=4, persistent=1)
    assert ps.id == "idx-m96n128k64-w8-s5-c1-wgmma-r8-nt4-ps1"
    cfg = _cfg(jit.render(ps))
    assert (cfg["kPersistent"], cfg["kQueue"], cfg["kRaster"], cfg["kMainloop"]) == (
        "true", "false", "8", "chord::Mainloop::kWgmma")
    assert _cfg(jit.render(Schedule.from_id(ps.id + "-dq1")))["kQueue"] == "true"
    wg = Schedule("indexed", 128, 256, 16, 4, 1, mainloop="wgmma", wgmma_wait=0, raster=8)
    src = jit.render(wg)
    assert _cfg(src)["kWgmmaWait"] == "false" and "TmaDescriptor" not in src
    wide = Schedule("indexed", 32, 512, 8, 8, 1, mainloop="wgmma", group_steps=1)
    assert _cfg(jit.render(wide))["kGroupSteps"] == "1"
    # bulk copies; a TMA_X kernel takes the tensor map as a second parameter
    bulk = Schedule("grouped_contiguous", 256, 128, 8, 5, 1, mainloop="wgmma", raster=8, bulk_w=1, tma_x=1)
    assert bulk.id == "gcon-m256n128k64-w8-s5-c1-wgmma-r8-bw1-tx1" and Schedule.from_id(bulk.id) == bulk
    src = jit.render(bulk)
    assert (_cfg(src)["kBulkW"], _cfg(src)["kTmaX"]) == ("true", "true")
    assert "const __grid_constant__ chord::TmaDescriptor xmap" in src and "ChordKernel::run(p, &xmap);" in src
    src = jit.render(Schedule("indexed", 128, 256, 8, 4, 1, mainloop="wgmma", group_steps=2, bulk_w=1))
    assert (_cfg(src)["kBulkW"], _cfg(src)["kTmaX"]) == ("true", "false") and "TmaDescriptor" not in src
    # CTA pairs: the compile-time cluster shape reads the same name
    cl = Schedule("grouped_masked", 32, 256, 4, 8, 2, mainloop="wgmma", group_steps=2, tma_x=1, cluster_n=2)
    assert cl.id == "gmsk-m32n256k64-w4-s8-c2-wgmma-gs2-tx1-cn2"
    src = jit.render(cl)
    assert _cfg(src)["kClusterN"] == "2"
    assert "__cluster_dims__(1, ChordCfg::kClusterN, 1) __launch_bounds__(ChordKernel::kThreads, ChordCfg::kCtasPerSm)" in src
    assert "__cluster_dims__" not in jit.render(bulk)
    assert _cfg(jit.render(Schedule.from_id(cl.id + "-pd1")))["kPdl"] == "true"
    assert _cfg(jit.render(Schedule.from_id("idx-m8n128k64-w4-s6-c1-stk1")))["kStreamK"] == "true"
    # split-K through a cluster: the tile's split_k CTAs are one cluster along z; it needs no
    # workspace, and its shared memory holds the fp32 partial where that is larger than the ring
    sc = Schedule.from_id("idx-m8n64k64-w4-s8-c2-sk8-skc1")
    src = jit.render(sc)
    assert _cfg(src)["kSplitCluster"] == "true" and _cfg(src)["kSplitK"] == "8"
    assert "__cluster_dims__(1, 1, ChordCfg::kSplitK) __launch_bounds__" in src
    assert "__cluster_dims__" not in jit.render(Schedule.from_id("idx-m8n64k64-w4-s8-c2-sk8"))
    wide = Schedule("indexed", 128, 256, 8, 3, 1, mainloop="wgmma", group_steps=2, split_k=2, split_cluster=1)
    assert wide.smem_bytes == 128 * 256 * 4 + 1024 - 16 > Schedule.from_id(wide.id.replace("-skc1", "")).smem_bytes


def test_render_states_python_facts_for_the_compiler():
    """Python's shared-memory size, thread count and GemmParams offsets are static_asserted."""
    s = Schedule("indexed", 64, 128, 8, 5, 1, mainloop="wgmma")
    src = jit.render(s)
    assert f"ChordKernel::kSmemBytes == {s.smem_bytes}" in src
    assert "ChordKernel::kThreads == 256" in src
    offs = jit.gemm_params_offsets()
    assert offs["counters"] == 136 and len(offs) * 8 == jit.pack_gemm_params(
        x=0, qweight=0, scales=0, out=0, n=0, k=0, num_experts=0).__len__()
    for name, off in offs.items():
        assert f"offsetof(chord::GemmParams, {name}) == {off}" in src
    ws = jit.render(Schedule.from_id("idx-m64n512k64-w8-s4-c1-wgmma-ws1-gs2-r8"))
    assert "WgmmaWarpSpecialized<ChordCfg>::kProducerRegs == 40" in ws and "kProducerRegs" not in src


def test_generated_wgmma_header_is_current():
    """csrc/common/wgmma_ops.cuh is exactly what csrc/common/wgmma_gen.py writes."""
    import importlib.util

    from chord._resources import csrc_dir

    spec = importlib.util.spec_from_file_location("wgmma_gen", csrc_dir() / "common" / "wgmma_gen.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (csrc_dir() / "common" / "wgmma_ops.cuh").read_text() == gen.render()


def test_params_block_layout():
    b = jit.pack_gemm_params(x=1, qweight=2, scales=3, out=4, n=5, k=6, num_experts=7, top_k=8)
    assert len(b) == 144  # 8 pointers + 8 int64 + 2 pointers, matches chord::GemmParams


@needs_nvcc
def test_cache_key_changes_with_source_and_flags():
    nvcc = jit.nvcc_path()
    a = jit.cache_key("a", ["-O3"], nvcc)
    assert a == jit.cache_key("a", ["-O3"], nvcc)
    assert a != jit.cache_key("b", ["-O3"], nvcc)
    assert a != jit.cache_key("a", ["-O2"], nvcc)


@needs_nvcc
def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    with pytest.raises(jit.JitError, match="nvcc failed"):
        jit.build("this is not C++", name="broken")


@needs_nvcc
def test_precompile_default_profile(tmp_path, monkeypatch):
    """Every kernel instantiation of profiles/h200.json compiles for sm_90a without spills."""
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CHORD_PTXAS_CHECK", "1")
    schedules = load_profile_file("h200").all_schedules()
    results = jit.precompile(schedules, progress=False)
    assert len(results) == len(schedules)
    for s, r in zip(schedules, results):
        assert r.cubin.exists() and r.cubin.stat().st_size > 1000, s.id
        assert r.spill_bytes == 0, s.id
        assert r.registers is not None and r.registers <= 255, s.id
    # a second call finds everything in the cache
    again = jit.precompile(schedules, progress=False)
    assert all(r.cached for r in again)


@needs_nvcc
def test_the_wgmma_producer_keeps_few_enough_registers_for_the_consumers(tmp_path, monkeypatch):
    """The 64-token wide producer tile (4 weight tiles per warp: 128 accumulators and 64 A registers
    a consumer thread) builds with its wgmmas unserialized and no spill once the producer keeps 40
    registers (at 88 its consumers got 208 and ptxas serialized them, C7512); the 128- and
    256-token twins keep 48 and 88 without a spill in the producer."""
    from chord.knobs import wgmma_producer_regs
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    assert [wgmma_producer_regs(m) for m in (16, 64, 96, 128, 192, 256)] == [40, 40, 48, 48, 88, 88]
    for sid in ("idx-m64n512k64-w8-s4-c1-wgmma-ws1-gs2-r8", "idx-m128n256k64-w8-s5-c1-wgmma-ws1-gs2-r8",
                "idx-m256n128k64-w8-s4-c1-wgmma-ws1"):
        r = jit.build_schedule(Schedule.from_id(sid))
        assert r.spill_bytes == 0 and not r.wgmma_serialized, (sid, r.log)


def test_a_serialized_wgmma_build_is_seen_in_its_log(tmp_path):
    r = jit.BuildResult(tmp_path / "k.cubin", False, 168, 0,
                        "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
                        "serialized due to insufficient register resources for the function 'chord_w4a16_kernel'")
    assert r.wgmma_serialized
    assert not jit.BuildResult(tmp_path / "k.cubin", False, 168, 0, "ptxas info    : Used 168 registers").wgmma_serialized


@needs_nvcc
def test_bad_ptxas_check_value_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CHORD_PTXAS_CHECK", "maybe")
    with pytest.raises(ValueError, match="CHORD_PTXAS_CHECK"):
        jit.build_schedule(Schedule("indexed", 8, 64, 4, 4, 1))


@needs_nvcc
@pytest.mark.parametrize("damage", ["truncate", "overwrite", "digest"])
def test_a_damaged_cache_entry_is_rebuilt(tmp_path, monkeypatch, damage):
    """A truncated or overwritten cubin (disk full, a killed copy, a stray edit) is rebuilt, with
    a warning, instead of failing in cuModuleLoadData at the first launch."""
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    src = "extern \"C\" __global__ void k(int* p) { p[threadIdx.x] = 1; }\n"
    first = jit.build(src, name="tiny")
    good = first.cubin.read_bytes()
    assert not first.cached and good[:4] == b"\x7fELF"
    assert jit.build(src, name="tiny").cached
    if damage == "truncate":
        first.cubin.write_bytes(good[: len(good) // 2])
    elif damage == "overwrite":
        first.cubin.write_bytes(b"\0" * len(good))
    else:
        first.cubin.with_suffix(".sha256").write_text("0" * 64 + "\n")
    with pytest.warns(RuntimeWarning, match="damaged"):
        again = jit.build(src, name="tiny")
    assert not again.cached and jit._intact(again.cubin) and len(again.cubin.read_bytes()) == len(good)
    assert jit.build(src, name="tiny").cached


@needs_nvcc
def test_concurrent_builders_of_one_kernel_all_get_an_intact_cubin(tmp_path, monkeypatch):
    """Threads (and processes: the publish is a rename) racing to build the same key."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    src = "extern \"C\" __global__ void k2(float* p) { p[threadIdx.x] *= 2.f; }\n"
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: jit.build(src, name="race"), range(4)))
    assert len({r.cubin for r in results}) == 1
    assert jit._intact(results[0].cubin)
    assert not list((tmp_path / "cubin").glob(".*")), "staged files left behind"


def test_build_schedule_refuses_a_bad_tile_group_cap():
    with pytest.raises(ValueError, match="tile_group_cap must be 1, 2, 4 or 8, got 3"):
        jit.build_schedule(Schedule("indexed", 8, 128, 4, 4, 1), 3)


# ---- cached cubins built without the SASS check (fake nvcc and cuobjdump: runs everywhere) ---

_FAKE_NVCC = '''
import sys
args = sys.argv[1:]
if "--version" in args:
    print("Cuda compilation tools, release 13.0, V13.0.0 (fake)")
    sys.exit(0)
src = open(args[-1]).read()
odd = "ALWAYS_ODD" in src or ("MISCOMPILE" in src and "-DCHORD_NO_L2_HINT" not in args)
sass = "LDGSTS.E.BYPASS.128 [R1], desc[UR%d][R28.64] ;" % (1 if odd else 4)
with open(args[args.index("-o") + 1], "wb") as f:
    f.write(b"\\x7fELF" + sass.encode() + b"\\n" + src.encode())
print("ptxas info    : Used 40 registers")
'''

_FAKE_CUOBJDUMP = '''
import sys
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(sys.argv[-1] + "\\n")
sys.stdout.write(open(sys.argv[-1], "rb").read()[4:].decode(errors="replace"))
'''


@pytest.fixture
def fake_toolchain(tmp_path, monkeypatch):
    """A fake nvcc whose cubins hold their 'SASS' (desc[UR1] for a source saying MISCOMPILE, unless
    built with CHORD_NO_L2_HINT), a fake cuobjdump that prints it and counts its calls, a fresh
    cache and a fresh per-process memo. `use_cuobjdump(False)` makes cuobjdump missing."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("nvcc", _FAKE_NVCC), ("cuobjdump", _FAKE_CUOBJDUMP)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("CHORD_NVCC", str(bin_dir / "nvcc"))
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CHORD_PTXAS_CHECK", raising=False)
    monkeypatch.delenv("CHORD_DUMP_SASS", raising=False)
    monkeypatch.setattr(jit, "_sass_rechecked", set())
    monkeypatch.setattr(jit, "_sass_no_tool_warned", False)
    calls = bin_dir / "cuobjdump.calls"

    class Tools:
        @staticmethod
        def use_cuobjdump(on: bool) -> None:
            monkeypatch.setattr(jit, "_cuobjdump", lambda: str(bin_dir / "cuobjdump") if on else None)

        @staticmethod
        def calls() -> int:
            return len(calls.read_text().splitlines()) if calls.exists() else 0

        @staticmethod
        def new_process() -> None:
            jit._sass_rechecked.clear()
            jit._sass_no_tool_warned = False
            jit._sass_record_warned = False

    return Tools


def _unchecked_build(tools, src, name):
    """What a cache from before the SASS check (or from a machine without cuobjdump) holds."""
    tools.use_cuobjdump(False)
    with pytest.warns(RuntimeWarning, match="could not read the SASS"):
        res = jit.build(src, name=name)
    assert not res.cached and jit._SASS_CHECKED not in res.log
    tools.new_process()
    tools.use_cuobjdump(True)
    return res


def test_a_fresh_build_records_its_sass_check(fake_toolchain):
    tools = fake_toolchain
    tools.use_cuobjdump(True)
    res = jit.build("ok\n", name="fresh")
    assert jit._SASS_CHECKED in res.log and jit._SASS_CHECKED in res.cubin.with_suffix(".log").read_text()
    assert tools.calls() == 1 and res.registers == 40
    tools.new_process()
    assert jit.build("ok\n", name="fresh").cached and tools.calls() == 1  # the record: no second read


def test_a_fresh_miscompile_is_rebuilt_without_l2_hints_and_a_persistent_one_refused(fake_toolchain):
    """ptxas 13.0 once put the L2 cache-policy operand of one cp.async (the mma m56 x 256 tile at 2
    stages, csrc of 05c29c3; docs/reliability.md) in the odd, never-written uniform register UR1:
    `desc[UR1]` in the SASS, a trap on the H200. Today's sources no longer trigger it, so the fake
    nvcc stands in (its SASS line has the real instruction's form). A fresh build that finds one is
    rebuilt with CHORD_NO_L2_HINT, says so in its log and is cached that way; a kernel whose SASS
    still names an odd descriptor without the hints is refused before it is cached."""
    tools = fake_toolchain
    tools.use_cuobjdump(True)
    res = jit.build("MISCOMPILE\n", name="m56")
    assert jit.NO_L2_HINT_FLAG in res.log and "UR1" in res.log and jit._SASS_CHECKED in res.log
    assert jit._odd_descriptors(res.cubin) == [] and b"desc[UR4]" in res.cubin.read_bytes()
    assert jit.NO_L2_HINT_FLAG not in jit.build("fine\n", name="m56-s3").log  # no odd register: no rebuild
    tools.new_process()
    again = jit.build("MISCOMPILE\n", name="m56")
    assert again.cached and jit.NO_L2_HINT_FLAG in again.log  # the note is kept with the cached kernel
    with pytest.raises(jit.JitError, match="names UR1 as a 64-bit memory descriptor even without L2 cache hints"):
        jit.build("ALWAYS_ODD\n", name="hopeless")
    assert not list((jit.cache_dir() / "cubin").glob("hopeless-*.cubin"))


def test_a_cached_miscompile_built_without_the_check_is_rebuilt_when_loaded(fake_toolchain):
    """A cubin cached before the check existed (or built where cuobjdump was missing) carries no
    record of it: its SASS is read when it is loaded, and the odd descriptor gets the same rebuild
    as a fresh build, under the same cache name (the key never changes)."""
    tools = fake_toolchain
    src = "MISCOMPILE\n"
    old = _unchecked_build(tools, src, "bad")
    assert b"desc[UR1]" in old.cubin.read_bytes()
    with pytest.warns(RuntimeWarning, match="built without the SASS check and names UR1"):
        new = jit.build(src, name="bad")
    assert not new.cached and new.cubin == old.cubin and b"desc[UR1]" not in new.cubin.read_bytes()
    assert jit.NO_L2_HINT_FLAG in new.log and jit._SASS_CHECKED in new.log and jit._intact(new.cubin)
    seen = tools.calls()
    tools.new_process()
    again = jit.build(src, name="bad")
    assert again.cached and jit.NO_L2_HINT_FLAG in again.log and tools.calls() == seen


def test_a_clean_unchecked_cubin_is_checked_once_and_the_check_recorded(fake_toolchain, monkeypatch):
    tools = fake_toolchain
    old = _unchecked_build(tools, "clean\n", "clean")
    log_path = old.cubin.with_suffix(".log")
    res = jit.build("clean\n", name="clean")
    assert res.cached and res.cubin == old.cubin and tools.calls() == 1
    assert jit._SASS_CHECKED in res.log and jit._SASS_CHECKED in log_path.read_text()
    assert res.registers == 40  # the ptxas lines of the log are kept
    assert jit.build("clean\n", name="clean").cached and tools.calls() == 1  # once per process
    tools.new_process()
    assert jit.build("clean\n", name="clean").cached and tools.calls() == 1  # and recorded for the next
    # a cache the record cannot be written into (read-only): the process memo still reads it once.
    # The entry as caches written before checksummed logs hold it: the log, and a checksum file of
    # one bare line (the cubin's sha256)
    log_path.write_text(old.log)
    old.cubin.with_suffix(".sha256").write_text(hashlib.sha256(old.cubin.read_bytes()).hexdigest() + "\n")
    tools.new_process()
    monkeypatch.setattr(jit, "_record_sass_check", lambda cubin, digest, log: log)
    jit.build("clean\n", name="clean")
    jit.build("clean\n", name="clean")
    assert tools.calls() == 2


def test_a_cache_that_cannot_take_the_record_says_so_once(fake_toolchain, monkeypatch):
    import contextlib
    import warnings

    tools = fake_toolchain
    _unchecked_build(tools, "ro-a\n", "ro_a")
    _unchecked_build(tools, "ro-b\n", "ro_b")
    tools.new_process()

    @contextlib.contextmanager
    def read_only(root, name):
        raise jit._Unwritable(root / "locks", OSError(errno.EROFS, os.strerror(errno.EROFS)))
        yield

    monkeypatch.setattr(jit, "_entry_lock", read_only)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a, b = jit.build("ro-a\n", name="ro_a"), jit.build("ro-b\n", name="ro_b")
    assert a.cached and b.cached and jit._SASS_CHECKED in a.log
    said = [str(w.message) for w in seen if "cannot record SASS checks" in str(w.message)]
    assert len(said) == 1 and "tools/device_cache.py" in said[0], [str(w.message) for w in seen]
    assert jit._SASS_CHECKED not in a.cubin.with_suffix(".log").read_text()


def test_without_cuobjdump_unchecked_cubins_are_used_with_one_warning(fake_toolchain):
    import warnings

    tools = fake_toolchain
    a = _unchecked_build(tools, "a\n", "a")
    _unchecked_build(tools, "b\n", "b")
    tools.use_cuobjdump(False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert jit.build("a\n", name="a").cubin == a.cubin
        assert jit.build("b\n", name="b").cached and jit.build("a\n", name="a").cached
    assert [str(w.message) for w in seen if "cuobjdump not found" in str(w.message)] and len(seen) == 1, \
        [str(w.message) for w in seen]
