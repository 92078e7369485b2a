"""Launch plans: the eager host path of a repeated call, in C (issue 6, host time per call).

A kernel call through ``chord.ops`` validates its arguments in Python and then launches. Most of
that work follows from the arguments' metadata alone (dtype, device, shape, strides, alignment,
the schedule and the scalars): the kernel, its grid and block, the shared memory, the parameter
block's scalars and split-K / stream-K workspaces. ``chord.ops`` hands that to :func:`run` with
the call's launch record (:class:`Record`: its items, pointer slots and spans), which launches and
keeps all of it as a **plan** under the call's signature (:func:`remember`). The next call is first offered
to the C module ``csrc/host/launch.c`` (:func:`try_launch`): it reads the signature of the
arguments (the same properties the Python validation reads), finds the plan, checks what depends
on the data pointers (``out`` must not overlap ``x``), writes the pointers into the parameter
block and calls ``cuLaunchKernel`` (``cuLaunchKernelEx`` for a PDL schedule). Whatever it cannot
decide is a miss, and the call takes the Python path unchanged: a first call, a new shape, a
tensor subclass (FakeTensor), a bool where an int belongs, overlapping buffers, a plan whose
workspace belongs to another stream, a schedule with a TMA tensor map (``tma_x``: its map
encodes x's address). Errors are therefore always raised by the Python path, with its messages.

Used only on the eager, trusted path (routing values not read on the host: the ``humming`` root
and ``check_routing=False``), and not while NVTX ranges are on (a launch inside a range is the
Python path's). ``CHORD_FAST_LAUNCH=0`` or :func:`fast_launch` (False) switches it off: the
ablation ``tools/host_time.py`` measures.

The module is compiled at first use with the system C compiler (``$CC``, else ``cc``) against
this Python's headers, into the kernel cache (``$CHORD_CACHE_DIR/host``), and needs no torch
headers. Like a cubin, it is written whole with a checksum file and imported only when its bytes
match it (chord.jit, "cache files"): a damaged file is rebuilt, never loaded. Where it cannot be built or the CUDA driver is missing, :func:`status` says why and
every call takes the Python path.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from typing import NamedTuple

from chord import profiling
from chord._env import flag

__all__ = ["fast_launch", "status", "try_launch", "remember", "clear", "PLAN", "build_module", "Record", "run",
           "pack_gemm_params", "gemm_params_offsets"]

# csrc/host/launch.c's Plan: func, stream, extent[12], grid[3], block[3], smem, flags, device,
# out, slot[12], params_len, params[256], pad
PLAN = struct.Struct("<QQ12Q3I3IIIii12iI256sI")
FLAG_PDL, FLAG_STREAM_BOUND, FLAG_NOOP = 1, 2, 4
MAX_ITEMS = 12
PARAM_BYTES = 256
_PLANS_MAX = 4096

# the family tag, the first item of every plan's signature
INDEXED, CONTIGUOUS, MASKED = 1, 2, 3

from chord.params import GEMM_PARAMS, gemm_params_offsets, pack_gemm_params  # noqa: E402,F401


class Record(NamedTuple):
    """One call as the launcher sees it (chord.ops builds it after validating the call): `items`,
    the call's signature items as :func:`try_launch` gets them (family tag, scalars, tensors);
    `slots`, for each item the byte offset of its data pointer in the GemmParams block, or None;
    `out_item`, the index of the output item; `extents`, the bytes each item spans (0 for a
    scalar). :func:`run` launches it and keeps what it launched as the plan of its signature."""

    items: tuple
    slots: tuple
    out_item: int
    extents: tuple

PLANS: dict = {}  # (schedule id, signature bytes) -> packed Plan
MODULE = None  # the configured C module while the fast path is on, else None
_status = "not loaded yet"
_lock = threading.Lock()
_loaded = False


def _source() -> Path:
    from chord.jit import csrc_dir

    return csrc_dir() / "host" / "launch.c"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return cc
    for cand in ("cc", "gcc", "clang"):
        found = shutil.which(cand)
        if found:
            return found
    return None


def build_module(cache: Path | None = None):
    """Compile (once per source, Python and compiler; cached) and import the C module, unconfigured.
    The cached file is an entry of the kernel cache (chord.jit, "cache files"): written whole,
    and imported only once its bytes match its checksum file (`<name>.sha256`); a damaged file
    (cut short, zeroed, overwritten, or without its checksum file) is built again, never imported.
    Raises RuntimeError with the compiler's output when it cannot be built."""
    from chord.jit import _obtain, cache_dir

    src = _source()
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC, or install cc / gcc)")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        raise RuntimeError(f"Python.h not found in {include} (install this Python's development headers)")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    h = hashlib.sha256(src.read_bytes())
    h.update(f"{sys.version}|{include}|{cc}|{suffix}".encode())
    name = f"_chord_launch-{h.hexdigest()[:16]}{suffix}"
    so, _, _ = _obtain(Path(cache) if cache is not None else cache_dir(), "host", name, (),
                       lambda: {name: _compile(cc, include, src, name)}, "cached C launch module")
    mod = _import(so)
    if mod.plan_bytes() != PLAN.size:
        raise RuntimeError(f"{src}: sizeof(Plan) = {mod.plan_bytes()}, but chord.launch packs {PLAN.size} bytes")
    return mod


def _compile(cc: str, include: str, src: Path, name: str) -> bytes:
    """The module's bytes, compiled in a private temporary folder."""
    with tempfile.TemporaryDirectory(prefix="chord-host-") as tmp:
        tmp_so = Path(tmp, name)
        cmd = [cc, "-O2", "-shared", "-fPIC", "-std=c11", "-Wall", "-Werror", f"-I{include}", str(src),
               "-o", str(tmp_so)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:  # $CC names no program, or one that cannot run
            raise RuntimeError(f"the C compiler {cc!r} (from $CC, else cc / gcc / clang on PATH) cannot be run: "
                               f"{exc.strerror or exc}; set CC to a working compiler") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return tmp_so.read_bytes()


def _import(so: Path):
    spec = importlib.util.spec_from_file_location("_chord_launch", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load(force: bool = False) -> None:
    """Build, import and configure the module once per process (MODULE stays None when off or
    unavailable; _status says why). `force`: whatever CHORD_FAST_LAUNCH says."""
    global MODULE, _status, _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
        if not force and not flag("CHORD_FAST_LAUNCH", default=True):
            _status = "off (CHORD_FAST_LAUNCH=0)"
            return
        try:
            import ctypes

            import torch

            from chord.jit import JitError, driver

            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if raw is None:
                _status = "unavailable: this torch has no torch._C._cuda_getCurrentRawStream"
                return
            try:
                lib = driver().lib
            except JitError as exc:
                _status = f"unavailable: {exc}"
                return
            mod = build_module()
            addr = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
            addr_ex = ctypes.cast(lib.cuLaunchKernelEx, ctypes.c_void_p).value or 0
            mod.configure(addr, addr_ex, raw, (torch.Tensor, torch.nn.Parameter))
        except (RuntimeError, OSError, ImportError) as exc:
            _status = f"unavailable: {exc}"
            return
        MODULE = mod
        _status = "on"


def status() -> str:
    """"on", "off (...)" or "unavailable: <why>" (loads the module if that has not happened yet)."""
    if not _loaded:
        _load()
    return _status


def fast_launch(on: bool = True) -> None:
    """Switch the C fast path on or off for this process (CHORD_FAST_LAUNCH sets the default)."""
    global MODULE, _status, _loaded
    if not isinstance(on, bool):
        raise TypeError(f"fast_launch(on): on must be a bool, got {type(on).__name__}")
    with _lock:
        if on and MODULE is not None:
            return
        PLANS.clear()
        MODULE, _loaded = None, not on
        if not on:
            _status = "off (fast_launch(False))"
    if on:
        _load(force=True)


def clear() -> None:
    """Forget every plan (the next call of each signature takes the Python path again)."""
    PLANS.clear()


def try_launch(schedule: str, *items) -> bool:
    """Launch through a plan of this exact call signature; False: no plan (or the fast path is
    off), take the Python path. A failed driver launch is a miss too: the Python path then runs
    the launch again and raises the driver's error with its message."""
    if not _loaded:
        _load()
    mod = MODULE
    return mod is not None and not profiling._enabled and mod.launch(PLANS, schedule, *items) is None


def remember(schedule: str, items: tuple, slots: tuple, *, func: int = 0, device: int = 0, grid=(0, 0, 0),
             block=(0, 0, 0), smem: int = 0, params: bytes = b"", pdl: bool = False, stream: int | None = None,
             overlap: tuple[int, int] | None = None, extents: tuple = (0, 0), noop: bool = False,
             out_item: int | None = None) -> None:
    """Record the plan of a launch that just ran the Python path (or of a call with nothing to
    launch: noop). `items`: the call's signature items as try_launch gets them; `slots`: for each
    item, the byte offset of its data pointer in `params`, or None; `stream`: the stream the plan
    is bound to (a workspace of that stream), None: any; `out_item`: the item index of the output
    and `extents` the bytes each item spans (0 for a scalar): a later call whose output overlaps
    any other tensor item misses (the Python path raises). The older form `overlap=(out, x)` with
    two `extents` checks out against x alone. Nothing is recorded while the fast path is off, for
    an item the C module does not take (a tensor subclass), or with NVTX ranges on."""
    mod = MODULE
    if mod is None or profiling._enabled or len(items) > MAX_ITEMS or len(params) > PARAM_BYTES:
        return
    key = mod.signature(schedule, *items)
    if key is None:
        return
    slot = [-1] * MAX_ITEMS
    for i, off in enumerate(slots):
        if off is not None:
            slot[i] = off
    flags = (FLAG_PDL if pdl else 0) | (FLAG_STREAM_BOUND if stream is not None else 0) | (FLAG_NOOP if noop else 0)
    ext = [0] * MAX_ITEMS
    if out_item is not None:
        if len(extents) != len(items):
            raise ValueError(f"remember: extents must give one byte count per item ({len(items)}), got {len(extents)}")
        ext[:len(extents)] = [int(e) for e in extents]
        out = out_item
    elif overlap is not None:
        out = overlap[0]
        ext[overlap[0]], ext[overlap[1]] = int(extents[0]), int(extents[1])
    else:
        out = -1
    plan = PLAN.pack(func, stream or 0, *ext, *grid, *block, smem, flags, device, out, *slot, len(params), params, 0)
    if len(PLANS) >= _PLANS_MAX:
        PLANS.clear()
    PLANS[key] = plan


def run(kernel, grid: tuple, block: tuple, fields: dict, record: Record, *, device: int, stream: int,
        schedule: str, op: str, pdl: bool = False, tensor_map: bytes | None = None, bound: bool = False) -> None:
    """The launch step of the Python path (chord.ops calls it once per call, after the checks and
    the kernel): packs the GemmParams block from `fields`, launches `kernel` (a chord.jit.Kernel)
    on `stream` (inside the NVTX range ``chord/<op>[<schedule>]`` while ranges are on) and keeps the
    launch as the plan of the record's signature, so the next call of that signature launches
    from C. Not planned: a launch with a tensor map (`tensor_map`: it encodes x's address), an
    empty grid, a launch inside an NVTX range. `bound`: the kernel uses this stream's split-K /
    stream-K workspace or work queue, so the plan is bound to `stream`."""
    params = pack_gemm_params(**fields)
    if profiling._enabled:
        with profiling.nvtx_range(op, schedule):
            kernel.launch(grid, block, params, device, stream, tensor_map=tensor_map, pdl=pdl)
        return
    kernel.launch(grid, block, params, device, stream, tensor_map=tensor_map, pdl=pdl)
    if tensor_map is None and MODULE is not None and min(grid) > 0:
        remember(schedule, record.items, record.slots, func=kernel.function(device).value, device=device, grid=grid,
                 block=block, smem=kernel.smem_bytes, params=params, pdl=pdl, stream=stream if bound else None,
                 out_item=record.out_item, extents=record.extents)
