"""The host path is a pipe: one eager call of ``humming_forward`` or of a ``chord.ops`` wrapper
walks entry -> layer decision (memoized) -> launch plan -> on a miss chord.ops' checked Python
path (checks -> kernel from chord.jit, built on a miss -> launch record -> chord.launch.run), each
step called once and returning to its caller, never calling back into a module it came from.

On CPU: the C launcher (csrc/host/launch.c) is built with the system compiler and configured with
a recording stand-in for cuLaunchKernel, chord.jit's kernel lookup runs for real with the build
and load of the cubin replaced by a stand-in kernel, and the device pieces (stream, SM count,
workspaces, the sm_90 check) are stubbed. Each call is traced with ``sys.setprofile``:

* module stack: the Python frames of ``chord`` and ``humming`` modules, as a stack of modules
  (consecutive frames of one module are one entry). Value helpers every step reads are left out:
  ``chord.knobs`` (Schedule's properties), ``chord.params`` (the GemmParams packing), ``chord.formats``, ``chord.checks`` (the check helpers
  humming's and chord's argument checks share), ``chord.profiling``, ``chord._env``,
  ``humming.config`` and ``humming.errors``;
* lookups: the layer decision memo (``humming.forward._DECISIONS.get``) and the launch plans
  (the C module's ``launch(PLANS, ...)``), counted per call.
"""
from __future__ import annotations

import ctypes
import json
import sys
from dataclasses import dataclass, field

import pytest
import torch

from chord import formats, jit, launch, ops
from chord.schedule import Schedule

BF16 = torch.bfloat16
SCON = Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id
TRACKED = ("chord", "humming")
VALUES = {"chord.knobs", "chord.params", "chord.formats", "chord.checks", "chord.profiling", "chord._env", "humming.config",
          "humming.errors"}
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))


class StandInKernel:
    """What chord.jit's kernel lookup returns here (no cubin to load): records its launches."""

    smem_bytes = 4096

    def __init__(self):
        self.launches = []

    def launch(self, grid, block, params, dev, stream, tensor_map=None, pdl=False):
        self.launches.append(grid)

    def function(self, dev):
        return ctypes.c_void_p(0xF00D)

    def ctas_per_sm(self, dev, threads):
        return 1


@pytest.fixture
def pipe(tmp_path, monkeypatch):
    """The C launcher with a recording cuLaunchKernel; chord.jit.kernel_for_schedule real (its cache
    emptied) with the build replaced by StandInKernel; the device pieces stubbed."""
    from humming import _chord

    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    mod = launch.build_module()
    c_launches = []

    def recorded(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        c_launches.append((gx, gy, gz))
        return 0

    cfunc = LAUNCH(recorded)
    mod.configure(ctypes.cast(cfunc, ctypes.c_void_p).value, 0, lambda dev: 0x77, (torch.Tensor, torch.nn.Parameter))
    monkeypatch.setattr(launch, "MODULE", mod)
    monkeypatch.setattr(launch, "_loaded", True)
    kernel = StandInKernel()
    built = []
    monkeypatch.setattr(jit, "_load_checked", lambda build, name, smem: built.append(name) or kernel)
    monkeypatch.setattr(ops, "check_cuda_sm90", lambda *a, **k: None)
    monkeypatch.setattr(ops, "_raw_stream", lambda dev: 0x77)
    monkeypatch.setattr(ops, "_split_buffers", lambda dev, floats, tiles: (0x1000000, 0x2000000))
    monkeypatch.setattr(ops, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_chord, "_use_reference", lambda x: False)
    _chord.load_ops()
    jit.kernel_for_schedule.cache_clear()
    launch.clear()
    yield dict(module=mod, kernel=kernel, built=built, c_launches=c_launches, cfunc=cfunc)
    launch.clear()
    jit.kernel_for_schedule.cache_clear()  # no stand-in kernel outlives the test


@dataclass
class Trace:
    entries: list = field(default_factory=list)  # (module, function, module stack below it)
    calls: list = field(default_factory=list)  # (module, function) of every tracked frame
    callbacks: list = field(default_factory=list)  # entries into a module already on the stack
    decision_lookups: int = 0
    plan_lookups: int = 0
    stack_at_plan: list = field(default_factory=list)  # tracked frames (module, function) at each plan lookup

    def entered(self, module: str) -> list:
        return [e for e in self.entries if e[0] == module]


def trace(fn, c_launch) -> Trace:
    """Run fn() under sys.setprofile and return its Trace (c_launch: the C module's launch function)."""
    from humming import forward

    t = Trace()
    frames: list = []  # (module or None, function) of every Python frame below fn()

    def modules_on_stack():
        mods = []
        for m, _ in frames:
            if m is not None and (not mods or mods[-1] != m):
                mods.append(m)
        return mods

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            mod = name if name.split(".")[0] in TRACKED and name not in VALUES else None
            if mod is not None:
                t.calls.append((mod, frame.f_code.co_name))
                below = modules_on_stack()
                if not below or below[-1] != mod:
                    t.entries.append((mod, frame.f_code.co_name, tuple(below)))
                    if mod in below:
                        t.callbacks.append((mod, frame.f_code.co_name, tuple(below)))
            frames.append((mod, frame.f_code.co_name))
        elif event == "return":
            if frames:
                frames.pop()
        elif event == "c_call":
            if arg is c_launch:
                t.plan_lookups += 1
                t.stack_at_plan.append([f for f in frames if f[0] is not None])
            elif getattr(arg, "__self__", None) is forward._DECISIONS and arg.__name__ == "get":
                t.decision_lookups += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return t


# --------------------------------------------------------------------------------------------
# humming_forward


def _layer(e=4, n=256, k=128):
    from humming.schema import HummingWeightSchema
    from humming.transform import prepare_and_transform_humming_tensors

    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (e, n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(e, n, k // 32, generator=g) * 0.02 + 0.001).to(BF16)
    native = {"weight": formats.pack_compressed_tensors(q), "weight_scale": scale}
    return prepare_and_transform_humming_tensors(native, n, k, HummingWeightSchema(weight_scale_group_size=32),
                                                 num_experts=e, pad_n_to_multiple=256, pad_k_to_multiple=128)


def _humming_call(rows=12):
    from humming import tune
    from humming.forward import humming_forward

    cfg, w = _layer()
    compute = json.dumps({"gemm_type": "grouped_contiguous"})
    tuning = json.dumps(tune.get_heuristics_config(cfg, gemm_type="grouped_contiguous"))
    layout = torch.tensor([0, 3, 6, 9, rows], dtype=torch.int64)

    def call():
        x = torch.randn(rows, cfg.k).to(BF16)
        out = torch.empty(rows, cfg.n, dtype=BF16)
        humming_forward(cfg, x, w["weight"], w["weight_scale"], outputs=out, expert_layout=layout,
                        valid_shape_m=rows, compute_config=compute, tuning_config=tuning)

    return call


def _assert_pipe(t: Trace, *, ops_calls: int, jit_calls: int, launch_calls: int) -> None:
    assert not t.callbacks, f"a module called back into one below it: {t.callbacks}"
    assert len(t.entered("chord.ops")) == ops_calls, t.entered("chord.ops")
    assert len(t.entered("chord.jit")) == jit_calls, t.entered("chord.jit")
    assert len(t.entered("chord.launch")) == launch_calls, t.entered("chord.launch")
    # the core steps return to chord.ops' driver: none of them is entered from another step
    for mod in ("chord.jit", "chord.launch"):
        for _, fn, below in t.entered(mod):
            assert below[-1] in ("chord.ops", "humming._chord"), (mod, fn, below)


def test_humming_forward_first_call_is_one_pass(pipe):
    """First call: the decision memo is looked up once and misses, the decision is made once
    (humming.tune's rows, no second lookup), the call is offered to a launch plan once (no plan
    yet), then chord.ops runs its checked path once: the kernel from chord.jit (built: a miss) and
    chord.launch.run, which launches and keeps the plan. No module calls back into one below it."""
    call = _humming_call()
    t = trace(call, pipe["module"].launch)
    assert t.decision_lookups == 1 and t.plan_lookups == 1
    assert t.calls.count(("humming.forward", "_decide")) == 1  # made once
    assert ("humming.forward", "_decision") not in t.calls  # (the lookup-and-make form: not a second lookup)
    assert pipe["built"] == ["chord_w4a16_kernel"] and len(pipe["kernel"].launches) == 1
    _assert_pipe(t, ops_calls=1, jit_calls=1, launch_calls=2)
    assert [fn for _, fn, _ in t.entered("chord.launch")] == ["try_launch", "run"]  # offered, then launched
    # the decision's helpers (humming.tune's rows, humming._chord's schedule family) and the call
    # into chord are each called from humming.forward and return to it
    for mod in ("humming.tune", "humming._chord"):
        assert t.entered(mod) and all(below == ("humming.forward",) for _, _, below in t.entered(mod)), t.entered(mod)
    assert [m for m, _, _ in t.entries if m not in ("humming.tune", "humming._chord")] == [
        "humming.forward", "chord.ops", "chord.launch", "chord.jit", "chord.launch"]
    assert not pipe["c_launches"] and len(launch.PLANS) == 1


def test_humming_forward_warm_call_is_four_frames_deep(pipe):
    """The repeated call: one decision lookup (a hit), one plan lookup (a hit) from
    humming_forward -> _launched -> try_planned_grouped -> try_launch, the C module launches;
    nothing else of chord or humming runs (no checks, no decision, no jit, no chord.ops)."""
    call = _humming_call()
    call()
    t = trace(call, pipe["module"].launch)
    assert t.decision_lookups == 1 and t.plan_lookups == 1
    assert t.stack_at_plan == [[("humming.forward", "humming_forward"), ("humming.forward", "_launched"),
                                ("humming._chord", "try_planned_grouped"), ("chord.launch", "try_launch")]]
    assert [(m, fn) for m, fn, _ in t.entries] == [("humming.forward", "humming_forward"),
                                                    ("humming._chord", "try_planned_grouped"),
                                                    ("chord.launch", "try_launch")]
    assert len(pipe["c_launches"]) == 1 and len(pipe["kernel"].launches) == 1  # launched from C


def test_humming_forward_plan_miss_is_offered_once(pipe):
    """A call whose decision is made but whose plan is gone (another signature, or plans
    cleared): one decision lookup, one plan lookup (the fast path's), then straight to chord.ops'
    checked path, which launches through chord.launch.run and keeps the plan again; the kernel is
    chord.jit's memo hit (no build, no jit frame)."""
    call = _humming_call()
    call()
    launch.clear()
    t = trace(call, pipe["module"].launch)
    assert t.decision_lookups == 1 and t.plan_lookups == 1
    assert ("humming.forward", "_decide") not in t.calls
    _assert_pipe(t, ops_calls=1, jit_calls=0, launch_calls=2)
    assert [fn for _, fn, _ in t.entered("chord.launch")] == ["try_launch", "run"]
    assert pipe["built"] == ["chord_w4a16_kernel"] and len(pipe["kernel"].launches) == 2 and not pipe["c_launches"]
    assert len(launch.PLANS) == 1


# --------------------------------------------------------------------------------------------
# a chord.ops wrapper


def _ops_call(rows=40):
    qs, ss = formats.packed_shapes(3, 256, 512)
    w = formats.PackedExperts(torch.zeros(qs, dtype=torch.int32), torch.ones(ss, dtype=BF16), 3, 256, 512)
    offsets = torch.tensor([0, 10, 10, rows], dtype=torch.int64)

    def call():
        x = torch.zeros(rows, 512, dtype=BF16)
        ops.gemm_contiguous(x, w, offsets, out=torch.empty(rows, 256, dtype=BF16), schedule=SCON,
                            check_routing=False)

    return call


def test_ops_wrapper_first_call_is_one_pass(pipe):
    """chord.ops.gemm_contiguous, first call: offered to a plan once (none), then one pass through
    the checked path: chord.jit once (built), chord.launch.run once, no callback."""
    call = _ops_call()
    t = trace(call, pipe["module"].launch)
    assert t.plan_lookups == 1 and t.decision_lookups == 0
    _assert_pipe(t, ops_calls=1, jit_calls=1, launch_calls=2)
    assert [fn for _, fn, _ in t.entered("chord.launch")] == ["try_launch", "run"]
    assert [fn for _, fn, _ in t.entered("chord.jit")] == ["kernel_for_schedule"]
    assert len(pipe["kernel"].launches) == 1 and not pipe["c_launches"]


def test_ops_wrapper_warm_call_is_three_frames_deep(pipe):
    """The repeated wrapper call: gemm_contiguous -> gemm_contiguous_raw -> try_launch, one plan
    lookup, launched from C; no checks, no jit."""
    call = _ops_call()
    call()
    t = trace(call, pipe["module"].launch)
    assert t.plan_lookups == 1
    assert t.stack_at_plan == [[("chord.ops", "gemm_contiguous"), ("chord.ops", "gemm_contiguous_raw"),
                                ("chord.launch", "try_launch")]]
    assert [(m, fn) for m, fn, _ in t.entries] == [("chord.ops", "gemm_contiguous"), ("chord.launch", "try_launch")]
    assert len(pipe["c_launches"]) == 1 and len(pipe["kernel"].launches) == 1


def test_the_tracer_sees_a_callback():
    """The trace's callback rule is live: a chord.ops -> chord.launch -> chord.ops chain is one."""
    def in_module(module: str, body: str, **names):
        """A function whose frames count as `module`'s (its globals name it)."""
        ns = {"__name__": module, **names}
        exec(compile(f"def f():\n    {body}\n", f"<{module}>", "exec"), ns)
        return ns["f"]

    back_into_ops = in_module("chord.launch", "_span_bytes(0)", _span_bytes=ops._span_bytes)
    t = trace(in_module("chord.ops", "_step()", _step=back_into_ops), None)
    assert t.callbacks == [("chord.ops", "_span_bytes", ("chord.ops", "chord.launch"))]
    returns = in_module("chord.ops", "_a(); _b()", _a=in_module("chord.launch", "0"), _b=in_module("chord.jit", "0"))
    assert not trace(returns, None).callbacks  # steps that return to the driver are no callback
