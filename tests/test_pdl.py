"""Programmatic dependent launch (`pdl`, id token `pd1`) on the host: the knob, the rendered kernel,
the cuLaunchKernelEx structures against cuda.h, the launch path, and the SASS of a built kernel."""
import ctypes
import re
import subprocess
from pathlib import Path

import pytest

from chord import jit, optimizations
from chord.schedule import KNOB, Schedule


def _toolkit_file(name: str) -> str:
    """A file of the CUDA toolkit the JIT compiles with (nvcc is a dependency: jit.nvcc_path names
    it when missing): the JIT's own cuobjdump, or the path nvcc resolves `#include <name>` to."""
    nvcc = jit.nvcc_path()
    if name == "cuobjdump":
        found = jit._cuobjdump()
        assert found, f"cuobjdump not found on PATH or beside {nvcc} (the JIT's SASS check needs it too)"
        return found
    deps = subprocess.run([nvcc, "-M", "-x", "cu", "-"], input=f"#include <{name}>\n", capture_output=True, text=True,
                          check=True).stdout
    hits = [w for w in deps.replace("\\\n", " ").split() if w.endswith("/" + name)]
    assert hits, f"nvcc did not resolve <{name}>"
    return hits[0]


def test_knob_id_round_trip_and_off_side():
    s = Schedule.from_id("idx-m8n256k64-w4-s8-c1-pd1")
    assert s.pdl == 1 and s.id == "idx-m8n256k64-w4-s8-c1-pd1"
    assert Schedule("indexed", 8, 256, 4, 8, 1).id == "idx-m8n256k64-w4-s8-c1"  # off: ids of older profiles unchanged
    assert Schedule.from_id("gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2-pd1").cluster_n == 2
    o = optimizations.BY_NAME["programmatic dependent launch"]
    assert o.knob == "pdl" and KNOB["pdl"].off == 0 and o.switch_off(s) == Schedule.from_id("idx-m8n256k64-w4-s8-c1")
    with pytest.raises(ValueError, match="pdl must be one of 0, 1"):
        Schedule("indexed", 8, 256, 4, 8, 1, pdl=2)


def test_prefetch_knob_needs_a_pdl_launch_of_one_item_per_cta():
    s = Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk8-pd1-pf1")
    assert s.pdl == 1 and s.pdl_prefetch == 1 and s.id == "idx-m8n64k64-w4-s8-c1-sk8-pd1-pf1"
    pf, pdl = optimizations.BY_NAME["PDL weight prefetch"], optimizations.BY_NAME["programmatic dependent launch"]
    assert pf.is_on(s) and pf.switch_off(s) == Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk8-pd1")
    assert pdl.switch_off(s) == Schedule.from_id("idx-m8n64k64-w4-s8-c1-sk8")  # the prefetch goes off with it
    assert set(optimizations.ablations(s)) >= {"PDL weight prefetch", "programmatic dependent launch"}
    for bad in ("idx-m8n64k64-w4-s8-c1-pf1", "idx-m64n128k64-w8-s4-c1-wgmma-ps1-pd1-pf1",
                "idx-m8n64k64-w4-s8-c1-pd1-pf1-stk1"):
        with pytest.raises(ValueError, match="pdl_prefetch=1 .* needs pdl=1, persistent=0 and stream_k=0"):
            Schedule.from_id(bad)
    on = jit.render(Schedule.from_id("gmsk-m8n128k64-w4-s8-c1-pd1-pf1"))
    assert "static constexpr bool kPdlPrefetch = true;" in on
    assert "static constexpr bool kPdlPrefetch = false;" in jit.render(Schedule.from_id("gmsk-m8n128k64-w4-s8-c1-pd1"))


def test_render_passes_pdl_to_the_kernel_template():
    on = jit.render(Schedule.from_id("gmsk-m8n128k64-w4-s8-c1-pd1"))
    off = jit.render(Schedule.from_id("gmsk-m8n128k64-w4-s8-c1"))
    assert "static constexpr bool kPdl = true;" in on and "static constexpr bool kPdl = false;" in off


def test_launch_structures_match_cuda_h():
    # cuda.h (CUDA 12-13): CUlaunchAttribute = {CUlaunchAttributeID id; char pad[4]; 64-byte value
    # union}, CUlaunchConfig = {7 x unsigned, CUstream, CUlaunchAttribute *, unsigned}
    assert ctypes.sizeof(jit.LaunchAttribute) == 72 and jit.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(jit.LaunchConfig) == 56
    assert (jit.LaunchConfig.sharedMemBytes.offset, jit.LaunchConfig.hStream.offset, jit.LaunchConfig.attrs.offset,
            jit.LaunchConfig.numAttrs.offset) == (24, 32, 40, 48)
    cfg, attr = jit.pdl_launch_config()
    assert cfg.numAttrs == 1 and cfg.attrs.contents.id == 6 and cfg.attrs.contents.value[0] == 1
    assert ctypes.addressof(cfg.attrs.contents) == ctypes.addressof(attr)


def test_cuda_h_enum_value_of_the_compiler_s_toolkit():
    text = Path(_toolkit_file("cuda.h")).read_text()
    m = re.search(r"CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION\s*=\s*(\d+)", text)
    assert m and int(m.group(1)) == jit._CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def test_pdl_launch_goes_through_cuLaunchKernelEx_with_the_call_s_geometry(tmp_path, monkeypatch):
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\0" * 16)
    k = jit.Kernel(cubin, smem_bytes=4096)
    k._funcs[0] = ctypes.c_void_p(1234)
    seen = {}

    def fake_ex(cfg_ref, fn, args, extra):
        c = cfg_ref._obj
        seen["ex"] = ((c.gridDimX, c.gridDimY, c.gridDimZ), (c.blockDimX, c.blockDimY, c.blockDimZ), c.sharedMemBytes,
                      c.hStream, c.numAttrs, c.attrs.contents.id, fn.value, args[0] is not None)
        return 0

    def fake_plain(*a):
        seen["plain"] = a[1:4]
        return 0

    monkeypatch.setattr(jit, "_driver_launch_ex", fake_ex)
    monkeypatch.setattr(jit, "_driver_launch", fake_plain)
    k.launch((48, 16, 1), (128, 1, 1), b"\1" * 144, 0, 0xABC0, pdl=True)
    assert seen.pop("ex") == ((48, 16, 1), (128, 1, 1), 4096, 0xABC0, 1, 6, 1234, True)
    assert "plain" not in seen
    k.launch((3, 2, 1), (256, 1, 1), b"\1" * 144, 0, 0, tensor_map=b"\2" * jit.TENSOR_MAP_BYTES, pdl=True)
    assert seen.pop("ex")[:3] == ((3, 2, 1), (256, 1, 1), 4096)
    k.launch((5, 1, 1), (128, 1, 1), b"\1" * 144, 0, 0)
    assert seen == {"plain": (5, 1, 1)}


def test_a_failed_pdl_launch_names_it(tmp_path, monkeypatch):
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\0" * 16)
    k = jit.Kernel(cubin)
    k._funcs[0] = ctypes.c_void_p(1)

    class FakeDriver:
        def check(self, rc, what):
            raise jit.JitError(f"{what} failed: CUDA error {rc}")

    monkeypatch.setattr(jit, "_driver_launch_ex", lambda *a: 1)
    monkeypatch.setattr(jit, "driver", lambda: FakeDriver())
    with pytest.raises(jit.JitError, match="cuLaunchKernelEx.*programmatic stream serialization"):
        k.launch((1, 1, 1), (128, 1, 1), b"", 0, 0, pdl=True)


_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+([^;]*);")


def _sass(schedule_id: str, cache, monkeypatch) -> list[str]:
    monkeypatch.setenv("CHORD_CACHE_DIR", str(cache))
    res = jit.build_schedule(Schedule.from_id(schedule_id), 8)
    _toolkit_file("cuobjdump")  # fails, naming it, when there is none
    proc = jit.run_cuobjdump(res.cubin)
    assert proc.returncode == 0, f"cuobjdump --dump-sass failed: {proc.stderr[:300]}"
    # every instruction line: "/*<address>*/  <instruction> ;  /* <encoding> */" (any address width)
    return [m.group(1).strip() for m in map(_INSTRUCTION.match, proc.stdout.splitlines()) if m]


def test_sass_waits_for_the_previous_grid_before_the_first_global_load(tmp_path, monkeypatch):
    on = _sass("gcon-m16n64k64-w4-s3-c1-pd1", tmp_path, monkeypatch)
    off = _sass("gcon-m16n64k64-w4-s3-c1", tmp_path, monkeypatch)
    first_global = next(i for i, ins in enumerate(on) if ins.startswith(("LDG", "LDGSTS", "STG", "RED", "ATOM")))
    waits = [i for i, ins in enumerate(on) if ins.startswith("ACQBULK")]  # griddepcontrol.wait
    assert waits and waits[0] < first_global
    assert any(ins.startswith("PREEXIT") for ins in on)  # griddepcontrol.launch_dependents
    assert not any(ins.startswith(("ACQBULK", "PREEXIT")) for ins in off)


@pytest.mark.parametrize("schedule_id", ["idx-m8n64k64-w4-s8-c1-pd1-pf1", "gmsk-m8n256k64-w4-s6-c1-sk2-pd1-pf1",
                                         "gcon-m16n64k64-w4-s3-c1-pd1-pf1"])
def test_sass_prefetch_before_the_wait_touches_only_weights_and_relaxed_routing_reads(schedule_id, tmp_path,
                                                                                      monkeypatch):
    """pf1: before griddepcontrol.wait the kernel asks L2 for weights (UBLKPF: cp.async.bulk.prefetch.L2)
    and reads the routing only with relaxed GPU-scope loads (LDG.E.STRONG.GPU, never cached in L1),
    and writes nothing; pd1 alone has no prefetch."""
    on = _sass(schedule_id, tmp_path, monkeypatch)
    off = _sass(schedule_id.replace("-pf1", ""), tmp_path, monkeypatch)
    wait = next(i for i, ins in enumerate(on) if ins.startswith("ACQBULK"))
    before = [ins.split()[1] if ins.startswith("@") else ins.split()[0] for ins in on[:wait]]
    assert "UBLKPF.L2" in before, schedule_id
    memory = [op for op in before if op.startswith(("LD", "ST", "RED", "ATOM", "UBLK", "UTMA", "CCTL"))
              and not op.startswith(("LDC", "LDS", "STS"))]
    assert memory and all(op == "UBLKPF.L2" or (op.startswith("LDG.E") and ".STRONG.GPU" in op) for op in memory), \
        sorted(set(memory))
    assert not any("UBLKPF" in ins for ins in off)


@pytest.mark.parametrize("schedule_id", ["idx-m8n128k64-w4-s2-c1-pd1-pf1-dr1", "gmsk-m8n64k64-w8-s4-c1-sk2-pd1-pf1-dr1",
                                         "gcon-m16n32k64-w4-s3-c1-pd1-pf1-dr1"])
def test_sass_direct_rings_copy_only_weights_before_the_wait(schedule_id, tmp_path, monkeypatch):
    """pf1 with warp-private rings (direct=1): before griddepcontrol.wait each warp copies words and
    scales into its ring (LDGSTS without a zero-fill size: the activation rows, copied with one, wait)
    and reads the routing only with relaxed GPU-scope loads; it writes no global memory (its one
    shared store records the guess)."""
    on = _sass(schedule_id, tmp_path, monkeypatch)
    off = _sass(schedule_id.replace("-pf1", ""), tmp_path, monkeypatch)
    wait = next(i for i, ins in enumerate(on) if ins.startswith("ACQBULK"))
    before = [ins.split()[1] if ins.startswith("@") else ins.split()[0] for ins in on[:wait]]
    copies = [op for op in before if op.startswith("LDGSTS")]
    assert copies and not any("ZFILL" in op for op in copies), sorted(set(copies))
    memory = [op for op in before if op.startswith(("LD", "ST", "RED", "ATOM", "UBLK", "UTMA", "CCTL"))
              and not op.startswith(("LDC", "LDS", "STS", "LDGSTS", "LDGDEPBAR"))]
    assert memory and all(op.startswith("LDG.E") and ".STRONG.GPU" in op for op in memory), sorted(set(memory))
    off_wait = next(i for i, ins in enumerate(off) if ins.startswith("ACQBULK"))
    assert not any(ins.startswith("LDGSTS") for ins in off[:off_wait])  # pd1 alone copies nothing before it

