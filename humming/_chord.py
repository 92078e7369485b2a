"""The one place where the ``humming`` shim calls into ``chord`` (a rename there is a fix here).

Everything humming needs from Chord goes through these functions: weight formats
(chord.formats), schedule rows (chord.schedule), the raw GEMM ops (torch.ops.chord, registered
by chord.ops) and the JIT for the activation kernel (chord.jit); the float32 reference
(chord.reference) and the wrapping of raw tensors as chord.formats objects sit one level lower,
in :mod:`humming._reference`, which imports nothing of ``humming`` (this module uses it, never
the other way round). Imports are lazy so that ``import humming`` stays light.

CPU reference backend
---------------------
:func:`cpu_reference_backend` switches the three GEMM entry points to a float32 torch
reference of the same contracts, so that vLLM's load -> tuning -> forward sequence can run in
CI. It exists only for machines without a CUDA device and refuses to switch on where one
exists: on a GPU machine the kernels always run.
"""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Iterator

from chord._env import flag

if TYPE_CHECKING:  # pragma: no cover
    import torch


# --------------------------------------------------------------------------------------------
# chord.formats


def pack_from_compressed(weight_packed, weight_scale, n: int, k: int):
    """compressed-tensors / Humming uint4 words [E, n, k/8] + bf16 scales [E, n, k/32] -> (qweight, scales)."""
    from chord.formats import pack_experts_from_compressed_tensors

    p = pack_experts_from_compressed_tensors(weight_packed, weight_scale, (n, k))
    return p.qweight, p.scales


def unpack_words(words, k: int):
    """compressed-tensors / Humming uint4 words [..., ceil(k/8)] -> int8 codes [..., k] in [-8, 7]."""
    from chord.formats import unpack_compressed_tensors

    return unpack_compressed_tensors(words, k)


def pack_words(q):
    """int8 codes [..., K] in [-8, 7] -> compressed-tensors / Humming uint4 words."""
    from chord.formats import pack_compressed_tensors

    return pack_compressed_tensors(q)


def pack_codes(q, scales):
    """int8 codes [E, N, K] + bf16 scales [E, N, K/32] -> (qweight, scales) in the swap16g layout."""
    from chord.formats import pack_experts

    p = pack_experts(q, scales)
    return p.qweight, p.scales


def packed_experts(qweight, scales):
    """Wrap raw swap16g tensors as a chord.formats.PackedExperts."""
    from humming._reference import packed_experts as _packed

    return _packed(qweight, scales)


def padding_scales_zero(scales, n: int) -> bool:
    """Whether the swap16g scales of the tiles past output feature n are all zero (chord.formats)."""
    from chord.formats import padding_scales_zero as _zero

    return _zero(scales, n)


def quantized_experts(qweight, scales):
    """chord.formats.QuantizedExperts (int8 codes + bf16 group-32 scales) of raw swap16g tensors."""
    from humming._reference import quantized_experts as _quantized

    return _quantized(qweight, scales)


def quantize_g32(w):
    """float [.., N, K] -> (int8 codes [E, N, K], bf16 scales [E, N, K/32]), symmetric, group 32."""
    from chord.formats import quantize_int4_g32

    qe = quantize_int4_g32(w)
    return qe.q, qe.scales


# --------------------------------------------------------------------------------------------
# chord.schedule


def _profile(family: str, num_experts: int, n: int, k: int, deployment: str | None = None, role: str | None = None):
    from chord.schedule import profile_for

    return profile_for(family, num_experts, n, k, deployment=deployment, role=role)


def policy_name() -> str:
    """chord's selection policy in force ($CHORD_POLICY): part of every cached tuning table's key."""
    from chord.schedule import current_policy

    return current_policy().name


def schedule_rows(family: str, num_experts: int, n: int, k: int, top_k: int = 1, *, policy: str | None = None,
                  deployment: str | None = None, role: str | None = None):
    """chord.schedule's table for this layer: [(min_rows (exclusive), max_rows, Schedule)]."""
    from chord.schedule import schedule_table

    return schedule_table(_profile(family, num_experts, n, k, deployment, role), family, num_experts, n, k, top_k,
                          policy)


def select_schedule(family: str, num_experts: int, n: int, k: int, rows: int, top_k: int = 1):
    from chord.schedule import Problem, select

    prob = Problem(family, num_experts, n, k, rows=max(0, int(rows)), top_k=top_k)
    return select(_profile(family, num_experts, n, k), prob)


def reserve_workspaces(rows, n: int, num_experts: int, device=None) -> int:
    """Load time: the split-K / stream-K workspace of each (schedule id, max routed rows) in
    `rows` (chord.ops.reserve_workspace), so no forward up to that size allocates or zeroes
    buffers (a CUDA-graph capture takes the zeroed spare). Without a CUDA device nothing is
    reserved. Returns the bytes reserved."""
    import torch

    from chord import ops

    if device is None:
        if not torch.cuda.is_available():
            return 0
    elif torch.device(device).type != "cuda":
        return 0
    return sum(ops.reserve_workspace(sid, n, max_rows, num_experts, device=device) for sid, max_rows in rows)


def schedule_as_dict(schedule) -> dict:
    from chord.schedule import as_dict

    return as_dict(schedule)


def schedule_family(schedule_id: str) -> str:
    """The kernel family of a schedule id (chord.schedule)."""
    from chord.schedule import Schedule

    return Schedule.from_id(schedule_id).family


# --------------------------------------------------------------------------------------------
# chord.jit (the activation kernel of humming.ops)


def compile_source(source: str, kernel_name: str):
    """nvcc (sm_90a) into Chord's content-hashed cache, loaded through the driver API."""
    from chord.jit import compile_source as _compile

    return _compile(source, kernel_name)


def launch(kernel, grid: tuple[int, int, int], block: tuple[int, int, int], params: bytes, device_index: int,
           stream: int, pdl: bool = False) -> None:
    kernel.launch(grid, block, params, device_index, stream, pdl=pdl)


# --------------------------------------------------------------------------------------------
# the raw GEMM ops


_reference_enabled = flag("CHORD_HUMMING_CPU_REFERENCE")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def cpu_reference_backend() -> Iterator[None]:
    """Run humming_forward's GEMMs with chord's float32 torch reference (CPU-only machines).

    Refused where a CUDA device exists: there the kernels must run.
    """
    global _reference_enabled
    if _cuda_available():
        raise RuntimeError("humming's CPU reference backend is only for machines without a CUDA device; "
                           "this machine has one, so Chord's kernels run")
    old, _reference_enabled = _reference_enabled, True
    try:
        yield
    finally:
        _reference_enabled = old


def _use_reference(x) -> bool:
    if x.device.type == "cuda":
        return False
    if _reference_enabled and not _cuda_available():
        return True
    raise ValueError(f"Chord's kernels need CUDA tensors on an sm_90a GPU, got {x.device}. On a machine "
                     "without a GPU, tests may run the float32 reference with humming._chord.cpu_reference_backend()")


def load_ops() -> None:
    """Import chord.ops (registers torch.ops.chord.*) and bind its raw entry points: the custom ops
    under torch.compile, the checked implementation in eager mode (the dispatcher round trip alone
    costs ~30 us of host time per call), and chord.launch's plans for humming_forward's fast path
    (try_planned_*). Called when humming.forward is imported, not at `import humming`."""
    global _RAW, _PLANNED, _TAGS, _OPS
    if _RAW is None:
        from chord import launch, ops

        # vLLM builds the routing on the device: trusted as upstream Humming trusts it (no host
        # read per call; the kernels stay in bounds whatever the values, see chord.ops).
        _RAW = tuple(functools.partial(f, check_routing=False)
                     for f in (ops.gemm_indexed_raw, ops.gemm_contiguous_raw, ops.gemm_masked_raw))
        _PLANNED, _TAGS, _OPS = launch.try_launch, (launch.INDEXED, launch.CONTIGUOUS, launch.MASKED), ops


def _raw_ops():
    if _RAW is None:
        load_ops()
    return _RAW


_RAW = None
_OPS = None  # chord.ops once load_ops() ran: its checked Python path (_gemm_*_impl), for a call already offered to a plan


def try_planned_indexed(schedule: str, top_k: int, block_m: int, x, qweight, scales, sorted_ids, expert_ids,
                        num_tokens_post_padded, out) -> bool:
    """gemm_indexed through a launch plan of chord.ops (chord.launch: the C path of a repeated call
    with the same tensor metadata; routing trusted as in gemm_indexed). False: no plan, call
    gemm_indexed. Needs load_ops() first (humming.forward's import)."""
    return _PLANNED(schedule, _TAGS[0], top_k, block_m, x, qweight, scales, sorted_ids, expert_ids,
                    num_tokens_post_padded, out)


def try_planned_grouped(family: str, schedule: str, x, qweight, scales, expert_layout, out) -> bool:
    """gemm_contiguous / gemm_masked through a launch plan (as try_planned_indexed)."""
    return _PLANNED(schedule, _TAGS[2 if family == "grouped_masked" else 1], x, qweight, scales, expert_layout, out)


def _no_plan(*args) -> bool:
    return False


_PLANNED = _no_plan  # chord.launch.try_launch once load_ops() ran
_TAGS = (0, 0, 0)  # chord.launch's family tags: indexed, contiguous, masked


# The GEMMs with trusted routing. `planned`: humming_forward already offered these very tensors to
# a launch plan (try_planned_*) and missed, so the call goes straight to chord.ops' checked Python
# path (which makes the plan) instead of being offered again; otherwise the raw entry point offers
# it once. Eager calls only (inside torch.compile, humming_forward calls the chord::humming_gemm op).


def gemm_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k: int,
                 block_m: int, schedule: str, *, planned: bool = False) -> None:
    if not x.is_cuda and _use_reference(x):
        from humming import _reference

        _reference.gemm_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k,
                                block_m)
        return
    if planned:
        _OPS._gemm_indexed_impl(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k,
                                block_m, schedule, False)
        return
    _raw_ops()[0](x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k, block_m, schedule)


def gemm_contiguous(x, qweight, scales, expert_offsets, out, schedule: str, *, planned: bool = False) -> None:
    if not x.is_cuda and _use_reference(x):
        from humming import _reference

        _reference.gemm_contiguous(x, qweight, scales, expert_offsets, out)
        return
    if planned:
        _OPS._gemm_contiguous_impl(x, qweight, scales, expert_offsets, out, schedule, False)
        return
    _raw_ops()[1](x, qweight, scales, expert_offsets, out, schedule)


def gemm_masked(x, qweight, scales, expert_num_tokens, out, schedule: str, *, planned: bool = False) -> None:
    if not x.is_cuda and _use_reference(x):
        from humming import _reference

        _reference.gemm_masked(x, qweight, scales, expert_num_tokens, out)
        return
    if planned:
        _OPS._gemm_masked_impl(x, qweight, scales, expert_num_tokens, out, schedule, False)
        return
    _raw_ops()[2](x, qweight, scales, expert_num_tokens, out, schedule)
