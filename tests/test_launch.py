"""chord.launch and csrc/host/launch.c on CPU: the C module is built with the system compiler and
driven with a recording stand-in for cuLaunchKernel(Ex), so every decision of the fast path is
checked without a GPU:

* the signature covers each property the Python validation reads (dtype, device, shape,
  strides, 16-byte alignment, exact int scalars) and refuses what it cannot judge (tensor
  subclasses, bools, too many items);
* a plan launches with the call's own data pointers in their slots, its grid, block, shared
  memory and the current stream; overlap of out and x, another stream for a workspace-bound
  plan and a missing plan are misses; a no-op plan launches nothing; a failed launch is a miss;
* through chord.ops (kernel and device stubbed): the parameter block the C module builds for a
  second call equals the one the Python path packs for that call (chord.launch.run, from the
  call's launch record), for all three families, with split-K workspaces and PDL.
"""
from __future__ import annotations

import ctypes

import pytest
import torch

from chord import formats as F
from chord import jit, launch, ops, profiling
from chord.schedule import Schedule

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))


class LaunchCfg(ctypes.Structure):  # cuda.h CUlaunchConfig, as csrc/host/launch.c declares it
    _fields_ = [("g", ctypes.c_uint * 3), ("b", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(LaunchCfg), ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))


class Recorder:
    """Stand-ins for the driver's launch entry points and torch's raw stream accessor."""

    def __init__(self):
        self.calls, self.stream, self.rc = [], 0x77, 0

        def plain(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            self.calls.append(dict(fn=fn, grid=(gx, gy, gz), block=(bx, by, bz), smem=smem, stream=stream or 0,
                                   params=ctypes.string_at(params[0], 256), pdl=False))
            return self.rc

        def ex(cfg, fn, params, extra):
            c = cfg.contents
            attr = ctypes.string_at(c.attrs, 72)
            self.calls.append(dict(fn=fn, grid=tuple(c.g), block=tuple(c.b), smem=c.smem, stream=c.stream or 0,
                                   params=ctypes.string_at(params[0], 256), pdl=True, num_attrs=c.num_attrs,
                                   attr_id=int.from_bytes(attr[:4], "little"),
                                   attr_value=int.from_bytes(attr[8:12], "little")))
            return self.rc

        self._plain, self._ex = LAUNCH(plain), LAUNCH_EX(ex)  # kept alive with the recorder

    def configure(self, mod):
        mod.configure(ctypes.cast(self._plain, ctypes.c_void_p).value, ctypes.cast(self._ex, ctypes.c_void_p).value,
                      lambda dev: self.stream, (torch.Tensor, torch.nn.Parameter))


@pytest.fixture
def fast(tmp_path, monkeypatch):
    """The C module, built into a temporary cache and configured with a Recorder; chord.launch
    uses it for the test (plans cleared before and after)."""
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    mod = launch.build_module()
    rec = Recorder()
    rec.configure(mod)
    monkeypatch.setattr(launch, "MODULE", mod)
    monkeypatch.setattr(launch, "_loaded", True)
    launch.clear()
    yield mod, rec
    launch.clear()


def t(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype)


def test_module_is_built_once_and_matches_the_plan_layout(fast, tmp_path):
    mod, _ = fast
    assert mod.plan_bytes() == launch.PLAN.size == 464
    built = sorted((tmp_path / "host").glob("_chord_launch-*"))
    assert [p.suffix for p in built] == [".sha256", ".so"]  # the module and its checksum file
    again = launch.build_module()  # cached: no second file
    assert sorted((tmp_path / "host").glob("_chord_launch-*")) == built and again.plan_bytes() == 464


def test_signature_covers_every_checked_property(fast):
    mod, _ = fast
    x = t(4, 64)
    base = mod.signature("s", 1, 2, x)
    assert base is not None and base == mod.signature("s", 1, 2, t(4, 64))  # same metadata, other memory
    differs = {
        "schedule": mod.signature("s2", 1, 2, x),
        "scalar": mod.signature("s", 1, 3, x),
        "dtype": mod.signature("s", 1, 2, t(4, 64, dtype=torch.float16)),
        "shape": mod.signature("s", 1, 2, t(4, 32)),
        "rank": mod.signature("s", 1, 2, t(4, 64, 1)),
        "strides": mod.signature("s", 1, 2, t(64, 4).t()),
        "alignment": mod.signature("s", 1, 2, t(4 * 64 + 1)[1:].view(4, 64)),
        "order": mod.signature("s", 2, 1, x),
    }
    for what, key in differs.items():
        assert key is not None and key != base, what
    # the device: get_device() and is_cuda; a plan is only made for CUDA tensors (chord.ops checks
    # them first), so a CPU or meta tensor (is_cuda 0, device -1) never meets one
    words = memoryview(base[1]).cast("q").tolist()
    assert words[4:8] == [2, id(torch.bfloat16), -1, 0]  # tensor tag, dtype, device, is_cuda
    assert mod.signature("s", True, 2, x) is None  # a bool is not an exact int
    assert mod.signature("s", 1 << 70, x) is None  # beyond int64
    assert mod.signature("s", 1.0, x) is None

    class Sub(torch.Tensor):
        pass

    assert mod.signature("s", 1, x.as_subclass(Sub)) is None
    assert mod.signature("s", *([1] * 13)) is None  # more items than a plan has slots
    assert mod.signature(b"s", 1) is None  # the schedule must be a str
    p = torch.nn.Parameter(t(4, 64), requires_grad=False)
    assert mod.signature("s", p) is not None


def _plan(x, out, **kw):
    args = dict(func=0xABC, device=0, grid=(5, 6, 7), block=(128, 1, 1), smem=4096, params=bytes(range(144)),
                overlap=(2, 1), extents=(out.numel() * 2, x.numel() * 2))
    args.update(kw)
    launch.remember("sch", (9, x, out), (None, 0, 24), **args)


def test_plan_launches_with_the_calls_pointers(fast):
    mod, rec = fast
    x, out = t(4, 64), t(8, 32)
    _plan(x, out)
    x2, out2 = t(4, 64), t(8, 32)
    assert launch.try_launch("sch", 9, x2, out2)
    c = rec.calls[-1]
    assert (c["fn"], c["grid"], c["block"], c["smem"], c["stream"], c["pdl"]) == (0xABC, (5, 6, 7), (128, 1, 1),
                                                                                   4096, 0x77, False)
    want = bytearray(range(144))
    want[0:8] = x2.data_ptr().to_bytes(8, "little")
    want[24:32] = out2.data_ptr().to_bytes(8, "little")
    assert c["params"][:144] == bytes(want)
    assert not launch.try_launch("sch", 9, t(4, 65), out2)  # no plan for that signature
    assert not launch.try_launch("other", 9, x2, out2)
    assert len(rec.calls) == 1


def test_overlap_stream_and_noop(fast):
    mod, rec = fast
    buf = t(1024)
    x, out = buf[:256].view(4, 64), buf[256:512].view(8, 32)
    _plan(x, out)
    assert launch.try_launch("sch", 9, x, out)  # adjacent, not overlapping
    same = buf[:256].view(8, 32)
    assert not launch.try_launch("sch", 9, x, same)  # out over x: the Python path raises
    assert not launch.try_launch("sch", 9, x, buf[128:384].view(8, 32))  # partial overlap
    n = len(rec.calls)
    launch.clear()
    _plan(x, out, stream=0x55)
    assert not launch.try_launch("sch", 9, x, out)  # bound to stream 0x55, current is 0x77
    rec.stream = 0x55
    assert launch.try_launch("sch", 9, x, out) and rec.calls[-1]["stream"] == 0x55
    launch.clear()
    launch.remember("sch", (9, x, out), (None, 0, 24), overlap=(2, 1), extents=(512, 512), noop=True)
    assert launch.try_launch("sch", 9, t(4, 64), t(8, 32))
    assert len(rec.calls) == n + 1  # nothing launched for the no-op plan


def test_a_plan_checks_out_against_every_tensor_item(fast):
    """A plan made with every item's byte span (chord.ops' plans) misses whenever out overlaps any
    other tensor item of the call (weights, scales, routing buffers), not only x; scalars and
    tensors out does not touch launch."""
    mod, rec = fast
    buf = t(4096)
    x, w, s, r, out = (buf[i * 512:(i + 1) * 512].view(8, 64) for i in range(5))
    items = (9, x, w, s, r, out)
    launch.remember("sch", items, (None, 0, 8, 16, 24, 32), func=0xABC, device=0, grid=(1, 1, 1),
                    block=(128, 1, 1), smem=0, params=bytes(64), out_item=5,
                    extents=(0, *(v.numel() * 2 for v in items[1:])))
    n = len(rec.calls)
    assert launch.try_launch("sch", *items) and len(rec.calls) == n + 1
    for i, name in ((1, "x"), (2, "weights"), (3, "scales"), (4, "routing")):
        bad = buf[(i - 1) * 512 + 64:(i - 1) * 512 + 576].view(8, 64)  # out straddling item i (and the next)
        call = list(items)
        call[5] = bad
        assert not launch.try_launch("sch", *call), name
    assert len(rec.calls) == n + 1
    with pytest.raises(ValueError, match="one byte count per item"):
        launch.remember("sch", items, (None, 0, 8, 16, 24, 32), out_item=5, extents=(0, 1), noop=True)


def test_ops_launch_records_hold_the_span_of_every_item():
    from chord import ops

    x, w = torch.empty(4, 64, dtype=torch.bfloat16), torch.empty(2, 8, dtype=torch.int32)
    out = torch.empty(4, 32, dtype=torch.bfloat16)
    record = ops._record((1, 2, x, w, out), (None, None, 0, 8, 16))
    assert isinstance(record, launch.Record) and record.items == (1, 2, x, w, out)
    assert record.slots == (None, None, 0, 8, 16)
    assert record.out_item == 4 and record.extents == (0, 0, 512, 64, 256)
    assert ops._span_bytes(torch.empty(64, 4, dtype=torch.bfloat16).t()) == 512  # strided: the span, not numel
    assert ops._span_bytes(torch.empty(0, 4)) == 0


def test_pdl_plan_goes_through_launch_ex(fast):
    mod, rec = fast
    x, out = t(4, 64), t(8, 32)
    _plan(x, out, pdl=True)
    assert launch.try_launch("sch", 9, x, out)
    c = rec.calls[-1]
    assert c["pdl"] and c["num_attrs"] == 1 and c["attr_id"] == 6 and c["attr_value"] == 1
    assert (c["grid"], c["block"], c["smem"], c["stream"]) == ((5, 6, 7), (128, 1, 1), 4096, 0x77)


def test_failed_launch_is_a_miss(fast):
    mod, rec = fast
    x, out = t(4, 64), t(8, 32)
    _plan(x, out)
    rec.rc = 700
    assert mod.launch(launch.PLANS, "sch", 9, x, out) == 700
    assert not launch.try_launch("sch", 9, x, out)


def test_nothing_is_remembered_or_used_with_nvtx_on(fast, monkeypatch):
    mod, rec = fast
    x, out = t(4, 64), t(8, 32)
    monkeypatch.setattr(profiling, "_enabled", True)
    _plan(x, out)
    assert not launch.PLANS
    monkeypatch.setattr(profiling, "_enabled", False)
    _plan(x, out)
    monkeypatch.setattr(profiling, "_enabled", True)
    assert not launch.try_launch("sch", 9, x, out)


def test_switch_and_status(monkeypatch):
    monkeypatch.setattr(launch, "_status", launch._status)
    monkeypatch.setattr(launch, "_loaded", False)
    monkeypatch.setattr(launch, "MODULE", None)
    monkeypatch.setenv("CHORD_FAST_LAUNCH", "0")
    assert launch.status() == "off (CHORD_FAST_LAUNCH=0)"
    with pytest.raises(TypeError, match="on must be a bool"):
        launch.fast_launch(1)
    launch.fast_launch(False)
    assert launch.status() == "off (fast_launch(False))" and launch.MODULE is None
    monkeypatch.setenv("CHORD_FAST_LAUNCH", "maybe")
    monkeypatch.setattr(launch, "_loaded", False)
    with pytest.raises(ValueError, match="CHORD_FAST_LAUNCH"):
        launch.status()
    monkeypatch.setattr(launch, "_loaded", False)
    monkeypatch.delenv("CHORD_FAST_LAUNCH")
    if not torch.cuda.is_available():  # this machine: no driver, every call takes the Python path
        assert launch.status().startswith("unavailable: ")
        assert launch.MODULE is None and not launch.try_launch("s", 1)


def test_a_damaged_cached_module_is_rebuilt(fast, tmp_path):
    """A cached module without its checksum file is built again, never imported (every kind of
    damage, each loaded in a child process: tests/test_cache.py). (Another cache dir: the fixture's
    module is mapped into this process.)"""
    name = next((tmp_path / "host").glob("_chord_launch-*.so")).name
    other = tmp_path / "other"
    (other / "host").mkdir(parents=True)
    (other / "host" / name).write_bytes(b"not an ELF file")
    with pytest.warns(RuntimeWarning, match=f"cached C launch module .*{name} is damaged"):
        mod = launch.build_module(cache=other)
    assert mod.plan_bytes() == launch.PLAN.size and (other / "host" / name).read_bytes()[:4] == b"\x7fELF"


def test_an_unloadable_module_leaves_the_python_path(monkeypatch):
    """A module that cannot be imported makes the fast path unavailable (status says why); every
    call then takes the Python path instead of failing."""
    from types import SimpleNamespace

    from chord import jit as J

    monkeypatch.setattr(launch, "_loaded", False)
    monkeypatch.setattr(launch, "MODULE", None)
    monkeypatch.setattr(launch, "_status", launch._status)
    monkeypatch.delenv("CHORD_FAST_LAUNCH", raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0, raising=False)
    monkeypatch.setattr(J, "driver", lambda: SimpleNamespace(lib=None))

    def broken(*a, **k):
        raise ImportError("undefined symbol: PyFoo")

    monkeypatch.setattr(launch, "build_module", broken)
    launch._load(force=True)
    assert launch.MODULE is None
    assert launch.status() == "unavailable: undefined symbol: PyFoo" and not launch.try_launch("s", 1)


def test_build_failure_names_the_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises((RuntimeError, OSError), match="no-such-cc"):
        launch.build_module()


# --------------------------------------------------------------------------------------------
# through chord.ops: the C module's parameter block is the one the Python path packs


class FakeKernel:
    smem_bytes = 9000

    def __init__(self):
        self.launches = []

    def launch(self, grid, block, params, dev, stream, tensor_map=None, pdl=False):
        self.launches.append(dict(grid=tuple(grid), block=tuple(block), params=params, stream=stream, pdl=pdl))

    def function(self, dev):
        return ctypes.c_void_p(0xF00D)

    def ctas_per_sm(self, dev, threads):
        return 2


@pytest.fixture
def ops_stubbed(fast, monkeypatch):
    """chord.ops on CPU tensors: the sm_90 check, the kernel and the device pieces stubbed."""
    mod, rec = fast
    kern = FakeKernel()
    monkeypatch.setattr(ops, "check_cuda_sm90", lambda *a, **k: None)
    monkeypatch.setattr(jit, "kernel_for_schedule", lambda s, cap=8: kern)
    monkeypatch.setattr(ops, "_raw_stream", lambda dev: rec.stream)
    monkeypatch.setattr(ops, "_split_buffers", lambda dev, floats, tiles: (0x1000000, 0x2000000))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ops, "_sm_count", lambda dev: 132)
    return mod, rec, kern


def python_path(mod, fn) -> None:
    """fn() with the fast path off (the Python path launches), the plans kept for afterwards."""
    saved = dict(launch.PLANS)
    launch.fast_launch(False)
    try:
        fn()
    finally:
        launch.MODULE = mod
        launch.PLANS.update(saved)


def _weights(e, n, k):
    qs, ss = F.packed_shapes(e, n, k)
    return torch.zeros(qs, dtype=torch.int32), torch.ones(ss, dtype=torch.bfloat16)


def _indexed_call(sid, m=5, top_k=2, bm=None):
    bm = bm or Schedule.from_id(sid).block_m
    qw, sc = _weights(3, 256, 512)
    a = (t(m, 512), qw, sc, torch.zeros(64, dtype=torch.int32), torch.zeros(8, dtype=torch.int32),
         torch.tensor([8], dtype=torch.int32), t(m * top_k, 256))
    return lambda *over: ops.gemm_indexed_raw(*(over or a), top_k, bm, sid, check_routing=False), a


@pytest.mark.parametrize("sid", ["idx-m8n128k64-w4-s4-c1", "idx-m8n64k64-w4-s4-c1-sk4", "idx-m8n128k64-w4-s4-c1-pd1",
                                 "idx-m64n128k64-w8-s4-c1-wgmma-ps1", "idx-m8n64k64-w4-s8-c1-stk1",
                                 "idx-m64n128k64-w8-s4-c1-wgmma-ps1-dq1"])
def test_indexed_second_call_packs_what_python_packs(ops_stubbed, sid):
    mod, rec, kern = ops_stubbed
    call, a = _indexed_call(sid)
    call()
    assert len(kern.launches) == 1 and not rec.calls  # the first call: the Python path
    b = tuple(v.clone() for v in a)  # same metadata, other memory
    call(*b)
    assert len(kern.launches) == 1 and len(rec.calls) == 1  # the second: the C module
    s = Schedule.from_id(sid)
    call_fast = rec.calls[0]
    python_path(mod, lambda: call(*b))  # the Python path on the same arguments, for the bytes it packs
    py = kern.launches[-1]
    assert call_fast["params"][:len(py["params"])] == py["params"]
    assert call_fast["grid"] == py["grid"] and call_fast["block"] == py["block"] == (s.threads, 1, 1)
    assert call_fast["pdl"] == py["pdl"] == (s.pdl == 1) and call_fast["smem"] == FakeKernel.smem_bytes
    assert call_fast["fn"] == 0xF00D and call_fast["stream"] == rec.stream
    call(*b)
    assert len(rec.calls) == 2  # the plan is still there
    off = jit.gemm_params_offsets()["counters"]
    counters = int.from_bytes(py["params"][off:off + 8], "little")
    assert counters == (0x2000000 if s.split_k > 1 or s.stream_k or s.queue else 0)  # the queue's two words
    if s.split_k > 1 or s.stream_k or s.queue:  # the workspace is this stream's: another stream takes the Python path
        rec.stream = 0x99
        call(*b)
        assert len(rec.calls) == 2 and len(kern.launches) == 3


def test_indexed_bad_calls_still_raise(ops_stubbed):
    mod, rec, kern = ops_stubbed
    call, a = _indexed_call("idx-m8n128k64-w4-s4-c1")
    call()
    x = a[0]
    with pytest.raises(ValueError, match="out must not overlap x"):
        call(x, *a[1:6], x.view(-1)[: 10 * 256].view(10, 256))
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        ops.gemm_indexed_raw(*a, True, 8, "idx-m8n128k64-w4-s4-c1", check_routing=False)
    assert not rec.calls


def test_no_rows_is_a_noop_plan(ops_stubbed):
    mod, rec, kern = ops_stubbed
    qw, sc = _weights(3, 256, 512)
    sid = "gcon-m16n128k64-w4-s4-c1"
    off = torch.zeros(4, dtype=torch.int64)
    ops.gemm_contiguous_raw(t(0, 512), qw, sc, off, t(0, 256), sid, check_routing=False)
    ops.gemm_contiguous_raw(t(0, 512), qw, sc, off, t(0, 256), sid, check_routing=False)
    assert not kern.launches and not rec.calls and len(launch.PLANS) == 1


@pytest.mark.parametrize("family,sid", [("grouped_contiguous", "gcon-m16n128k64-w4-s4-c1"),
                                        ("grouped_contiguous", "gcon-m16n64k64-w4-s6-c1-sk4-pd1"),
                                        ("grouped_masked", "gmsk-m8n128k64-w4-s8-c1"),
                                        ("grouped_masked", "gmsk-m8n128k64-w4-s8-c1-sk2")])
def test_grouped_second_call_packs_what_python_packs(ops_stubbed, family, sid):
    mod, rec, kern = ops_stubbed
    qw, sc = _weights(3, 256, 512)
    if family == "grouped_contiguous":
        a = (t(40, 512), qw, sc, torch.tensor([0, 10, 10, 40], dtype=torch.int64), t(40, 256))
        raw = ops.gemm_contiguous_raw
    else:
        a = (t(3, 16, 512), qw, sc, torch.tensor([3, 0, 16], dtype=torch.int32), t(3, 16, 256))
        raw = ops.gemm_masked_raw
    raw(*a, sid, check_routing=False)
    b = tuple(v.clone() for v in a)
    raw(*b, sid, check_routing=False)
    assert len(kern.launches) == 1 and len(rec.calls) == 1
    python_path(mod, lambda: raw(*b, sid, check_routing=False))
    py = kern.launches[-1]
    assert rec.calls[0]["params"][:len(py["params"])] == py["params"] and rec.calls[0]["grid"] == py["grid"]
    assert rec.calls[0]["pdl"] == py["pdl"]


def test_checked_calls_and_tma_schedules_take_the_python_path(ops_stubbed, monkeypatch):
    mod, rec, kern = ops_stubbed
    call, a = _indexed_call("idx-m8n128k64-w4-s4-c1")
    call()
    monkeypatch.setattr(ops, "_check_indexed_values", lambda *args: None)  # the routing read, stubbed
    for _ in range(2):
        ops.gemm_indexed_raw(*a, 2, 8, "idx-m8n128k64-w4-s4-c1", check_routing=True)
    assert len(kern.launches) == 3 and not rec.calls
    monkeypatch.setattr(ops, "_x_tensor_map", lambda *args: bytes(128))
    qw, sc = _weights(3, 256, 512)
    sid = "gcon-m64n128k64-w8-s4-c1-wgmma-tx1"
    g = (t(40, 512), qw, sc, torch.tensor([0, 10, 10, 40], dtype=torch.int64), t(40, 256))
    for _ in range(2):
        ops.gemm_contiguous_raw(*g, sid, check_routing=False)
    assert len(kern.launches) == 5 and not rec.calls  # a tensor map encodes x's address: no plan


def test_a_missing_c_compiler_is_named_not_a_raw_file_error(monkeypatch, tmp_path):
    """CC naming no program: build_module raises a RuntimeError naming the compiler and $CC (it was a
    bare FileNotFoundError from subprocess), and launch.status() says why the fast path is off."""
    from chord import launch

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(RuntimeError, match=r"C compiler .*no-such-cc.*\$CC"):
        launch.build_module(tmp_path / "cache")
