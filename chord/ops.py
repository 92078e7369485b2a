"""Chord's operators: torch.library custom ops (namespace ``chord``) and their Python wrappers.

Raw ops (what the ``humming`` shim and torch.compile see) take plain tensors and a schedule id,
write into a caller-given ``out`` and return nothing::

    torch.ops.chord.gemm_indexed(x, qweight, scales, sorted_ids, expert_ids,
                                 num_tokens_post_padded, out, top_k, block_m, schedule)
    torch.ops.chord.gemm_contiguous(x, qweight, scales, expert_offsets, out, schedule)
    torch.ops.chord.gemm_masked(x, qweight, scales, expert_num_tokens, out, schedule)

Every argument is checked on the host (dtype, device, shape, contiguity: a ValueError/TypeError
naming the argument) before any launch; device tensors are never read on the host, so the ops
are CUDA-graph capturable. The wrappers (:func:`gemm_indexed`, :func:`gemm_contiguous`,
:func:`gemm_masked`) take a :class:`chord.formats.PackedExperts` and pick the schedule with
:func:`chord.schedule.select` when none is given. :func:`fused_moe` composes a whole MoE layer.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Optional

import torch

from chord import checks, formats, jit, launch, routing
from chord import routing as R
from chord._env import flag
from chord.profiling import nvtx_range
from chord.schedule import K_BLOCK, Problem, Schedule, load_profile, override, pairs_fit, profile_for, select

if TYPE_CHECKING:  # pragma: no cover
    from chord.formats import PackedExperts

__all__ = ["gemm_indexed", "gemm_contiguous", "gemm_masked", "gemm_indexed_raw", "gemm_contiguous_raw",
           "gemm_masked_raw", "fused_moe", "silu_and_mul", "check_cuda_sm90", "reserve_workspace"]


# ---------------------------------------------------------------------------------------------
# argument checks (host only)


def _tensor(fn: str, name: str, t, dtype=None, ndim=None, device=None, contiguous=True, aligned=True) -> None:
    """A kernel operand: chord.checks.tensor, contiguous and 16-byte aligned unless told otherwise
    (`aligned` as in chord.checks.tensor: True is 16 bytes, an int that many)."""
    checks.tensor(fn, name, t, dtype=dtype, ndim=ndim, device=device, contiguous=contiguous, aligned=aligned)


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors on one device intersects. Only tensors with
    memory to compare are compared (checks.has_memory: plain tensors, parameters and other
    subclasses with storage); a FakeTensor of torch.compile tracing or opcheck, and a meta
    tensor, have none, so they never count as overlapping."""
    if not (checks.has_memory(a) and checks.has_memory(b)) or a.device != b.device:
        return False
    if not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


_OVERLAP_MSG = ("{fn}: out must not overlap {name} (the kernels read {name} while they write out); give out its own "
                "buffer")

# Host time per call (issue 6): a launch validates each argument's metadata (dtype, rank, shape,
# strides, device) the first time it sees that combination with those scalars and schedule, and
# afterwards only what depends on the pointers (out overlapping any input). The memo is keyed by
# the metadata itself (16-byte alignment of each pointer included), so a call whose arguments
# differ in any checked property is validated again.
_VALIDATED: dict = {}
_VALIDATED_MAX = 4096
_ALIGN_MASK = checks.ALIGN_BYTES - 1


def _memo_validate(tag: str, scalars: tuple, tensors: tuple, validate):
    """(validate(), pointers): validate() for this (tag, scalars, tensor metadata) signature, run
    once and remembered; plain tensors and parameters only (any other subclass is validated on
    every call). `pointers`: each tensor's data_ptr(), 0 for one without memory (the aliasing
    check's input, read once here)."""
    if all(map(checks.plain, tensors)):
        ptrs = tuple(t.data_ptr() for t in tensors)
        key = (tag, tuple((type(v), v) for v in scalars),
               tuple((t.dtype, t.device, t.shape, t.stride(), p & _ALIGN_MASK) for t, p in zip(tensors, ptrs)))
        hit = _VALIDATED.get(key)
        if hit is not None:
            return hit, ptrs
        result = validate()
        if len(_VALIDATED) >= _VALIDATED_MAX:
            _VALIDATED.clear()
        _VALIDATED[key] = result
        return result, ptrs
    return validate(), tuple(t.data_ptr() if checks.has_memory(t) else 0 for t in tensors)


def _extents(tensors: tuple) -> tuple:
    """Bytes of each (contiguous, validated) operand for the aliasing check; 0: nothing to compare
    (no memory, or empty)."""
    return tuple(t.nbytes if checks.has_memory(t) else 0 for t in tensors)


def _check_aliasing(fn: str, names: tuple, ptrs: tuple, extents: tuple) -> None:
    """out (the last operand) must not overlap any other operand: the kernels read every input
    (x, the weights, the scales, the routing buffers) while they write out. Every call: the
    pointers change, the extents are the validated signature's."""
    o0 = ptrs[-1]
    o1 = o0 + extents[-1]
    if o1 == o0:
        return
    for p, nb, name in zip(ptrs, extents, names):  # `names` leaves out out: zip stops before it
        if nb and p < o1 and o0 < p + nb:
            raise ValueError(_OVERLAP_MSG.format(fn=fn, name=name))


# the inputs of each family in signature order (out, the last operand, left out)
_INDEXED_NAMES = ("x", "qweight", "scales", "sorted_ids", "expert_ids", "num_tokens_post_padded")
_CONTIGUOUS_NAMES = ("x", "qweight", "scales", "expert_offsets")
_MASKED_NAMES = ("x", "qweight", "scales", "expert_num_tokens")


def _check_weights(fn: str, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, out: torch.Tensor
                   ) -> tuple[int, int, int]:
    _tensor(fn, "x", x, torch.bfloat16, (2, 3))
    dev = x.device
    _tensor(fn, "qweight", qweight, torch.int32, 6, dev)
    _tensor(fn, "scales", scales, torch.bfloat16, 7, dev)
    _tensor(fn, "out", out, torch.bfloat16, (2, 3), dev)
    e, ng, kb, g, lanes, words = qweight.shape
    n, k = ng * g * 16, kb * 64
    if lanes != 32 or words != 4 or g not in formats.TILE_GROUPS or min(e, ng, kb) < 1:
        raise ValueError(f"{fn}: qweight must have the swap16g layout [E, N/16/G, K/64, G, 32, 4] with E, N/16/G "
                         f"and K/64 >= 1 and the tile group G in {formats.TILE_GROUPS}, got {tuple(qweight.shape)}")
    if tuple(scales.shape) != (e, ng, kb, g, 8, 2, 2):
        raise ValueError(f"{fn}: scales must have shape {(e, ng, kb, g, 8, 2, 2)} to match qweight, got {tuple(scales.shape)}")
    if _overlaps(out, x):  # before the shape checks: an aliased out is the mistake to name (every call: _check_aliasing)
        raise ValueError(_OVERLAP_MSG.format(fn=fn, name="x"))
    if x.shape[-1] != k:
        raise ValueError(f"{fn}: x must have K={k} columns (qweight's K), got {x.shape[-1]}")
    if out.shape[-1] != n:
        raise ValueError(f"{fn}: out must have N={n} columns (qweight's N), got {out.shape[-1]}")
    return e, n, k


def _check_schedule(fn: str, schedule: str, family: str, n: int, k: int | None = None) -> Schedule:
    if not isinstance(schedule, str):
        raise TypeError(f"{fn}: schedule must be a schedule id string, got {type(schedule).__name__}")
    s = Schedule.from_id(schedule)
    if s.family != family:
        raise ValueError(f"{fn}: schedule {schedule} is for family {s.family}, not {family}")
    if n % s.block_n_cta:
        what = f"block_n={s.block_n}" + (f" x n_tiles={s.n_tiles}" if s.n_tiles > 1 else "")
        raise ValueError(f"{fn}: schedule {schedule}: {what} does not divide N={n}")
    if s.cluster_n > 1 and not pairs_fit(n, s.block_n_cta):
        raise ValueError(f"{fn}: schedule {schedule}: cluster_n={s.cluster_n} pairs neighbouring N blocks, so N / "
                         f"block_n = {n // s.block_n_cta} must be a multiple of {s.cluster_n}")
    if s.persistent and k is not None and k // K_BLOCK < s.stages - 2:
        raise ValueError(f"{fn}: schedule {schedule}: persistent=1 keeps the ring at most one tile ahead, so it "
                         f"needs K/64 >= stages-2 = {s.stages - 2} K blocks, got K={k}")
    if s.stream_k and k is not None and (n // s.block_n) * (k // K_BLOCK) < s.stages:
        raise ValueError(f"{fn}: schedule {schedule}: stream_k=1 keeps two token blocks' rows while the ring runs "
                         f"ahead, so a token block's units (N/block_n x K/64 = {(n // s.block_n) * (k // K_BLOCK)}) "
                         f"must be at least stages={s.stages}")
    return s


# Routing values live on the device. By default the chord API reads them before each launch and
# raises on a bad one (expert ids, sorted ids, padded count, offsets, counts) or on indexed
# routing that is in range but inconsistent (a route twice, padding inside an expert's run or
# alone in a block, routing padded for another block_m; with all_routes, a route missing): one
# device->host copy per call. It is skipped while the current stream captures a CUDA graph (a read would
# break the capture), and by the `humming` root, which trusts vLLM's routing as upstream Humming
# does (check_routing=False on the raw entry points). CHORD_CHECK_ROUTING=0 (or
# check_routing(False)) trusts every caller. Whatever the values, the kernels stay in bounds:
# expert id outside [0, E) or -1 skips the block, sorted ids outside [0, M*top_k) are padding,
# masked counts are clamped to [0, max_rows], contiguous offsets to [0, x.shape[0]] (a bad value
# costs that call's answer, never memory safety).
_check_routing = flag("CHORD_CHECK_ROUTING", default=True)


def check_routing(on: bool = True) -> None:
    """Switch the host-side check of device routing values (see CHORD_CHECK_ROUTING)."""
    global _check_routing
    if not isinstance(on, bool):
        raise TypeError(f"check_routing(on): on must be a bool, got {type(on).__name__}")
    _check_routing = on


def _check_arg(code: int, all_routes_ok: bool = False) -> tuple[bool | None, bool]:
    """The custom ops' int form of check_routing -> (check, all_routes). -1: the global switch,
    0: trust, 1: check; for gemm_indexed also 2 / -2: check (-2: under the switch) and require
    every route id below M*top_k in sorted_ids (chord.routing.IndexedRouting.all_routes)."""
    codes = (-2, -1, 0, 1, 2) if all_routes_ok else (-1, 0, 1)
    if isinstance(code, bool) or code not in codes:
        raise ValueError(f"check_routing must be -1 (the CHORD_CHECK_ROUTING switch), 0 or 1"
                         f"{' (2 / -2: also every route present)' if all_routes_ok else ''}, got {code!r}")
    return (None if code < 0 else code != 0), abs(code) == 2


def _check_code(check: bool | None, all_routes: bool = False) -> int:
    if check is not None and not isinstance(check, bool):
        raise TypeError(f"check_routing must be None or a bool, got {type(check).__name__}")
    code = -1 if check is None else int(check)
    return code * 2 if all_routes else code


def _checks_routing(check: bool | None, t: torch.Tensor) -> bool:
    """Whether this call reads its routing values: `check` (None: the global switch), never while
    the current stream captures a CUDA graph."""
    if check is not None and not isinstance(check, bool):
        raise TypeError(f"check_routing must be None or a bool, got {type(check).__name__}")
    if not (_check_routing if check is None else check) or t.device.type == "meta":
        return False  # off, or no values to read (a meta tensor: the device check refuses the call)
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


# The checked path reads the routing values with one device->host copy per call: a few torch ops
# where the values live (for CPU tensors no sync at all) reduce them to a handful of numbers, read
# back together. Only when one says the routing is bad are the tensors copied to the host and
# looked at in detail for the message.
_KEPT: dict = {}


def _kept(kind: str, n: int, device: torch.device) -> torch.Tensor:
    """int32 arange(n) ("positions") or ones(n) ("ones") on `device`, kept for the next call of the
    same size (the checked read runs once per call)."""
    key = (kind, n, device)
    t = _KEPT.get(key)
    if t is None:
        if len(_KEPT) >= 64:
            _KEPT.clear()
        make = torch.arange if kind == "positions" else torch.ones
        t = _KEPT[key] = make(n, dtype=torch.int32, device=device)
    return t


def _check_indexed_values(fn, sorted_ids, expert_ids, num_tokens_post_padded, num_experts, block_m, num_valid,
                          all_routes=False):
    """Range and consistency of vLLM's moe_align routing below num_tokens_post_padded: the padded
    count a multiple of block_m inside the buffers; expert ids in [-1, E); sorted ids in
    [0, M*top_k] (M*top_k: the padding sentinel); each route id at most once (two tiles would race
    on its output row); and the layout of routing padded for this block_m: in every block the
    routes come before the padding, padding only in the last block of an expert's run (the next
    block is another expert's), and no block of padding alone. Routing aligned for another
    block_m, or with a route replaced by the sentinel, breaks one of those. `all_routes`: every
    route id in [0, M*top_k) must also be present (routing that drops none on purpose).

    About twenty small torch ops (no host sync among them) and one read back."""
    blocks = min(sorted_ids.numel() // block_m, expert_ids.numel())
    cap = blocks * block_m
    used = num_tokens_post_padded.reshape(-1)[:1]
    if cap == 0:
        if int(used[0]) != 0:
            _indexed_violation(fn, sorted_ids, expert_ids, num_tokens_post_padded, num_experts, block_m, num_valid,
                               all_routes)
        return
    live = _kept("positions", cap, sorted_ids.device) < used  # positions below the padded count
    v = torch.where(live, sorted_ids[:cap], num_valid)  # live ids; padding elsewhere
    b = torch.where(live[::block_m], expert_ids[:blocks], -1)  # live blocks' experts; -1 elsewhere
    pad = (v == num_valid).view(blocks, block_m)
    # (index_add_, not bincount: bincount reads its input's max on the host to size its output)
    counts = torch.zeros(num_valid + 1, dtype=torch.int32, device=v.device).index_add_(
        0, v.clamp(0, num_valid), _kept("ones", cap, v.device))[:num_valid]
    parts = [used[0], *v.aminmax(), *b.aminmax(),
             (pad[:, :-1] > pad[:, 1:]).any() | (pad[:, 0] & live[::block_m]).any()]  # route after padding; padding alone
    if blocks > 1:  # a padded block continued by its expert
        parts.append((pad[:-1, -1] & (b[1:] == b[:-1]) & (b[1:] >= 0)).any())
    if num_valid:
        parts += list(counts.aminmax())
    stats = torch.stack(parts).tolist()
    u, vmin, vmax, bmin, bmax, layout = stats[:6]
    ok = 0 <= u <= cap and not u % block_m and vmin >= 0 and vmax <= num_valid and bmin >= -1 and bmax < num_experts
    ok = ok and not any(stats[6:6 + (blocks > 1)] + [layout])
    if num_valid:
        cmin, cmax = stats[-2:]
        ok = ok and cmax <= 1 and (cmin >= 1 or not all_routes)
    if not ok:
        _indexed_violation(fn, sorted_ids, expert_ids, num_tokens_post_padded, num_experts, block_m, num_valid,
                           all_routes)


def _indexed_violation(fn, sorted_ids, expert_ids, num_tokens_post_padded, num_experts, block_m, num_valid,
                       all_routes) -> None:
    """The first rule of _check_indexed_values the routing breaks, as a ValueError (on host copies)."""
    sorted_ids, expert_ids = sorted_ids.cpu().long(), expert_ids.cpu().long()
    used = int(num_tokens_post_padded.reshape(-1)[0])
    blocks = min(sorted_ids.numel() // block_m, expert_ids.numel())
    cap = blocks * block_m
    if used < 0 or used % block_m or used > cap:
        raise ValueError(f"{fn}: num_tokens_post_padded={used} must be a multiple of block_m={block_m} in [0, {cap}]")
    eids = expert_ids[: used // block_m]
    if eids.numel() and (int(eids.min()) < -1 or int(eids.max()) >= num_experts):
        raise ValueError(f"{fn}: expert_ids must lie in [-1, {num_experts}) below num_tokens_post_padded, "
                         f"got [{int(eids.min())}, {int(eids.max())}]")
    ids = sorted_ids[:used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > num_valid):
        raise ValueError(f"{fn}: sorted_ids must lie in [0, {num_valid}] (sentinel {num_valid} = padding) below "
                         f"num_tokens_post_padded, got [{int(ids.min())}, {int(ids.max())}]")
    real = ids[ids < num_valid]
    counts = torch.bincount(real, minlength=num_valid)
    if num_valid and int(counts.max()) > 1:
        dup = int(counts.argmax())
        raise ValueError(f"{fn}: sorted_ids must hold each route id at most once below num_tokens_post_padded (two "
                         f"tiles would write its output row at once), got route {dup} {int(counts[dup])} times, at "
                         f"positions {(ids == dup).nonzero().flatten().tolist()[:8]}")
    pad = (ids == num_valid).view(-1, block_m)
    for blk in range(pad.shape[0]):
        row = pad[blk]
        what = None
        if bool(row.all()):
            what = "padding only"
        elif bool((row[:-1] & ~row[1:]).any()):
            what = "a route after the padding"
        elif bool(row[-1]) and blk + 1 < pad.shape[0] and int(eids[blk + 1]) == int(eids[blk]) >= 0:
            what = f"padding, but block {blk + 1} continues expert {int(eids[blk])}"
        if what:
            raise ValueError(f"{fn}: sorted_ids must be padded for block_m={block_m} (each expert's routes first, the "
                             f"sentinel {num_valid} only at the end of its last block), but block {blk} holds {what}: "
                             "routing aligned for another block_m, or a route replaced by the sentinel")
    missing = (counts == 0).nonzero().flatten()
    if all_routes and missing.numel():
        raise ValueError(f"{fn}: sorted_ids must hold every route id in [0, {num_valid}) (the routing drops none), "
                         f"but {missing.numel()} are missing, the first {int(missing[0])}: a route replaced by the "
                         "sentinel leaves its output row unwritten")
    raise AssertionError(f"{fn}: the routing check found a problem its explanation does not")  # pragma: no cover


def _check_offsets_values(fn, expert_offsets, rows):
    off = expert_offsets.cpu()
    if int(off[0]) < 0 or bool((off[1:] < off[:-1]).any()) or int(off[-1]) > rows:
        raise ValueError(f"{fn}: expert_offsets must rise from >= 0 to at most x.shape[0]={rows}, got {off.tolist()}")


def _check_counts_values(fn, expert_num_tokens, max_rows):
    if not expert_num_tokens.numel():
        return
    lo, hi = torch.stack([expert_num_tokens.min(), expert_num_tokens.max()]).tolist()
    if lo < 0 or hi > max_rows:
        raise ValueError(f"{fn}: expert_num_tokens must lie in [0, max_rows={max_rows}], got [{lo}, {hi}]")


def check_cuda_sm90(t: torch.Tensor, name: str = "x") -> None:
    """Chord's kernels run on CUDA devices of compute capability 9.0 (sm_90a) only."""
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor (Chord's kernels need an sm_90a GPU), got device {t.device}; "
                         "use chord.reference for the float32 reference on CPU")
    cap = _capability(t.device.index if t.device.index is not None else torch.cuda.current_device())
    if cap != (9, 0):
        raise ValueError(f"{name} is on a GPU of compute capability {cap[0]}.{cap[1]}; Chord's kernels need 9.0 (Hopper, sm_90a)")


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


# split-K fix-up buffers, per device: fp32 partial tiles + per-tile arrival counters. The kernel
# leaves every counter at 0 when it finishes, so the buffers are reused by every launch and by
# CUDA-graph replays. Buffers only grow; old ones stay referenced (a captured graph may use them).
# One workspace and counter array per (device, stream): split-K kernels on two streams at once
# never share partials or counters; on one stream they run one after the other.
_SPLIT_WS_LIMIT = 256 << 20
_split_ws: dict = {}
_split_ws_old: list = []


#
# A stream that is capturing a CUDA graph (torch captures on a stream of its own) gets a spare
# pair made outside the capture: zeroing new counters there would record a memset node into the
# graph, run at every replay (it cost the TP8 one-token pair 0.55 us). Every eager allocation
# keeps one zeroed spare of its size (up to _SPARE_LIMIT bytes) per device for that; a capture
# that finds none zeroes its counters inside the graph (correct, slower).
_SPARE_LIMIT = 64 << 20
_split_spares: dict = {}  # device -> [(ws, cnt), ...], zeroed, not yet given to a stream


def _split_buffers(device: torch.device, floats: int, tiles: int) -> tuple[int, int]:
    dev = device.index if device.index is not None else torch.cuda.current_device()
    key = (dev, _raw_stream(dev))
    ws, cnt = _split_ws.get(key, (None, None))
    if ws is None or ws.numel() < floats or cnt.numel() < tiles:
        if ws is not None:
            _split_ws_old.append((ws, cnt))
        nf, nt = max(floats, 1 << 16), max(tiles, 1 << 12)
        spares = _split_spares.setdefault(dev, [])
        if torch.cuda.is_current_stream_capturing():
            fit = next((i for i, p in enumerate(spares) if p[0].numel() >= nf and p[1].numel() >= nt), None)
            if fit is not None:
                ws, cnt = spares.pop(fit)  # by position: tensors do not compare as list items
            else:
                ws, cnt = _new_split_pair(device, nf, nt)
        else:
            ws, cnt = _new_split_pair(device, nf, nt)
            if (nf + nt) * 4 <= _SPARE_LIMIT and not any(p[0].numel() >= nf and p[1].numel() >= nt for p in spares):
                spares.append(_new_split_pair(device, nf, nt))
        _split_ws[key] = (ws, cnt)
    return ws.data_ptr(), cnt.data_ptr()


def _new_split_pair(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(floats, dtype=torch.float32, device=device),
            torch.zeros(tiles, dtype=torch.int32, device=device))


def _uses_stream_buffers(s: Schedule) -> bool:
    """Whether a launch of `s` writes this stream's split-K / stream-K workspace or work-queue
    counters (a cluster split sums in shared memory and needs neither)."""
    return (s.split_k > 1 and not s.split_cluster) or bool(s.stream_k) or bool(s.queue)


def _split_need(s: Schedule, grid_x: int, grid_y: int, ctas: int = 0) -> tuple[int, int] | None:
    """(fp32 partials, counters) a launch of `s` over a grid_x x grid_y tile grid needs, or None
    (no split): split-K [tiles, split_k] partial tiles, stream-K `ctas` CTAs x 2 partial tiles
    (csrc/moe/stream_k.cuh: bounded by the grid, not the batch), one counter per tile; a
    work-queue kernel (queue=1) its two queue words and no partials; split_cluster=1 nothing (its
    partials meet in the cluster's shared memory)."""
    if not _uses_stream_buffers(s):
        return None
    if s.queue:  # the work queue's two counters (csrc/moe/rows.cuh, TileWalker DYNAMIC)
        return 0, 2
    tiles = grid_x * grid_y
    floats = (ctas * 2 if s.stream_k else tiles * s.split_k) * s.block_m * s.block_n
    if floats * 4 > _SPLIT_WS_LIMIT:
        raise ValueError(f"schedule {s.id}: split-K over {tiles} tiles needs {floats * 4 >> 20} MiB of workspace "
                         f"(limit {_SPLIT_WS_LIMIT >> 20} MiB); use split_k=1 for grids this large")
    return floats, tiles


def _split_args(s: Schedule, x: torch.Tensor, grid_x: int, grid_y: int, ctas: int = 0,
                out: tuple | None = None) -> dict:
    """Workspace and counters of a split-K, stream-K or work-queue kernel (_split_need). `out`:
    (address, bytes, function) of the call's output, which must not overlap them (the kernel
    writes both while it writes out)."""
    need = _split_need(s, grid_x, grid_y, ctas)
    if need is None:
        return {}
    w, c = _split_buffers(x.device, *need)
    if out is not None and out[1]:  # the kernel writes need[0] partial floats and need[1] counters
        o0, ob, fn = out
        for p, nb, name in ((w, need[0] * 4, "workspace"), (c, need[1] * 4, "counters")):
            if p < o0 + ob and o0 < p + nb:
                raise ValueError(f"{fn}: out must not overlap chord's split-K {name} (schedule {s.id} writes partial "
                                 "tiles and arrival counts there while it writes out); give out its own buffer")
    return {"workspace": w, "counters": c}


def _grid_bound(s: Schedule, rows: int, num_experts: int, routed_experts: int) -> int:
    """The largest grid_x a call of up to `rows` rows launches (the ops below): indexed, the
    blocks of vLLM's sorted_ids for `rows` routes (chord.routing.sorted_ids_capacity, which grows
    with the routes); contiguous, the per-expert tile bound; masked, every expert's tiles of
    `rows` rows each."""
    bm = s.block_m
    if s.family == "indexed":
        return routing.sorted_ids_capacity(rows, bm, routed_experts) // bm
    if s.family == "grouped_contiguous":
        return -(-rows // bm) + num_experts
    return num_experts * -(-rows // bm)


def reserve_workspace(schedule: "str | Schedule", n: int, rows: int, num_experts: int, *,
                      routed_experts: int | None = None, device=None) -> int:
    """Allocate, ahead of the calls, the split-K / stream-K / work-queue workspace that calls of
    `schedule` (its family's grid) with up to `rows` rows need on `device` (default: the current CUDA device), for
    the current stream and as the zeroed spare a CUDA-graph capture takes, so that no call up to
    that size allocates (or records a memset into a graph). `rows`: routed rows (indexed: token
    rows x top_k, vLLM's valid_shape_m; contiguous: all rows; masked: rows per expert);
    `routed_experts`: the experts vLLM's routing pads for (indexed; default num_experts).
    Returns the bytes reserved (0 for a schedule without a split). Bounded: a need above
    256 MiB is refused here, as the call itself would refuse it. Larger calls still grow the
    buffers on first need."""
    fn = "reserve_workspace"
    s = Schedule.from_id(schedule) if isinstance(schedule, str) else schedule
    if not isinstance(s, Schedule):
        checks.fail(fn, "schedule", "be a schedule id or a Schedule", type(schedule).__name__, TypeError)
    checks.integer(fn, "n", n, min=1)
    checks.integer(fn, "rows", rows, min=0)
    checks.integer(fn, "num_experts", num_experts, min=1)
    routed = num_experts if routed_experts is None else checks.integer(fn, "routed_experts", routed_experts, min=1)
    try:
        dev = None if device is None else torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
        checks.fail(fn, "device", "be a CUDA device", repr(device))
    if dev is not None and dev.type != "cuda":
        checks.fail(fn, "device", "be a CUDA device", repr(device))
    if _split_need(s, 1, 1, 1) is None or rows == 0:  # no split: nothing to reserve, no device touched
        return 0
    index = torch.cuda.current_device() if dev is None or dev.index is None else dev.index
    dev = torch.device("cuda", index)
    need = _split_need(s, _grid_bound(s, rows, num_experts, routed), s.grid_n(n), _sm_count(index) * s.ctas_per_sm)
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("reserve_workspace: called while the current stream captures a CUDA graph; reserve "
                           "before capturing (at load)")
    _split_buffers(dev, *need)
    return sum(need) * 4


# torch.cuda.current_stream(dev).cuda_stream without building the Stream object (~2 us a call);
# the public path where this torch build lacks the raw accessor.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(dev: int) -> int:
    if _RAW_STREAM is not None:
        return _RAW_STREAM(dev)
    return torch.cuda.current_stream(dev).cuda_stream


def _tile_group_cap(qweight: torch.Tensor, n: int) -> int:
    """The kernel variant for these weights' tile group G (qweight dim 3): the default kernels
    (cap 8) serve every G that N alone implies; weights packed with a lower cap (the layout's
    ablation, CHORD_TILE_GROUP) get kernels built for that cap."""
    return _cap_for(qweight.shape[3], n)


@functools.lru_cache(maxsize=1024)
def _cap_for(g: int, n: int) -> int:
    return 8 if g == formats.tile_group(n, 8) else g


@functools.lru_cache(maxsize=None)
def _sm_count(dev: int) -> int:
    return torch.cuda.get_device_properties(dev).multi_processor_count


def _resident_ctas(sched: Schedule, kernel: "jit.Kernel", dev: int) -> int:
    """A stream-K grid: SMs x the schedule's ctas_per_sm, capped by what the driver says one SM
    holds of this kernel (cached per kernel). ctas_per_sm is the schedule's knob here: more CTAs
    stream in parallel, fewer split each tile into fewer partials."""
    return _sm_count(dev) * min(sched.ctas_per_sm, kernel.ctas_per_sm(dev, sched.threads))


@functools.lru_cache(maxsize=256)
def _x_tensor_map(address: int, rows: int, k: int, block_m: int) -> bytes:
    """The tensor map of activations [rows, k] (bf16, contiguous) for a tma_x kernel: boxes of
    block_m rows x one 64-wide K block, 128-byte swizzle (csrc/mainloop/wgmma_tile.cuh). Cached
    per (address, shape, box): vLLM and CUDA graphs call again on the same buffers."""
    return jit.encode_tensor_map_2d(address, rows, k, k * 2, block_m, K_BLOCK)


# The launch records of the three families (chord.launch.Record): each family's signature items,
# and where each item's data pointer goes in the GemmParams block (None: a scalar).
_OFF = launch.gemm_params_offsets()
_INDEXED_SLOTS = (None, None, None, _OFF["x"], _OFF["qweight"], _OFF["scales"], _OFF["sorted_ids"],
                  _OFF["expert_ids"], _OFF["num_tokens_post_padded"], _OFF["out"])
_GROUPED_SLOTS = (None, _OFF["x"], _OFF["qweight"], _OFF["scales"], _OFF["expert_layout"], _OFF["out"])


def _span_bytes(t) -> int:
    """Bytes a tensor's elements span in memory (0 for a scalar item or an empty tensor)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _record(items: tuple, slots: tuple) -> launch.Record:
    """The call's launch record: its items, their pointer slots, the output's item index (the last
    item) and every item's byte span, so a call from the plan made of it whose out overlaps x, the
    weights, the scales or a routing buffer misses the plan (the Python path raises naming both)."""
    return launch.Record(items, slots, len(items) - 1, tuple(_span_bytes(t) for t in items))


def _remember_noop(schedule_id: str, record: launch.Record) -> None:
    """A call with nothing to launch (no rows): its plan says so."""
    if launch.MODULE is not None:
        launch.remember(schedule_id, record.items, record.slots, out_item=record.out_item, extents=record.extents,
                        noop=True)


def _kernel(sched: Schedule, qweight: torch.Tensor, n: int) -> "jit.Kernel":
    """The kernel step: the schedule's kernel for these weights' tile group (chord.jit; built and
    loaded on a miss, one memo lookup after)."""
    hook = jit.STAMP_HOOK
    if hook is not None:  # chord.lab.stamps: the build whose CTAs record their phases
        kernel = jit.kernel_for_schedule(sched, _tile_group_cap(qweight, n), True)
        hook(sched, kernel)
        return kernel
    return jit.kernel_for_schedule(sched, _tile_group_cap(qweight, n))


def _launch(sched: Schedule, kernel: "jit.Kernel", grid: tuple[int, int, int], x: torch.Tensor, fields: dict,
            op: str, schedule_id: str, record: launch.Record) -> None:
    """The launch step: the device, the current stream, a persistent kernel's wave and a tma_x
    kernel's tensor map, then chord.launch.run (packs the parameter block, launches, keeps the plan)."""
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if sched.persistent:  # about one wave of CTAs walks the grid's tiles (csrc/moe/rows.cuh, TileWalker)
        grid = (min(grid[0] * grid[1], _sm_count(dev) * kernel.ctas_per_sm(dev, sched.threads)), 1, 1)
    tmap = None
    if sched.tma_x:  # the grouped families' x: [rows, K] or [E, max_rows, K], contiguous
        k = x.shape[-1]
        tmap = _x_tensor_map(x.data_ptr(), x.numel() // k, k, sched.block_m)
    launch.run(kernel, grid, (sched.threads, 1, 1), fields, record, device=dev, stream=_raw_stream(dev),
               schedule=schedule_id, op=op, pdl=sched.pdl == 1, tensor_map=tmap,
               bound=_uses_stream_buffers(sched))  # counters of this stream


# ---------------------------------------------------------------------------------------------
# indexed


def _validate_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k, block_m, schedule):
    fn = "gemm_indexed"
    e, n, k = _check_weights(fn, x, qweight, scales, out)
    dev = x.device
    if x.dim() != 2 or out.dim() != 2:
        raise ValueError(f"{fn}: x and out must be 2-D, got {tuple(x.shape)} and {tuple(out.shape)}")
    # routing tensors: the row sources (csrc/moe/rows.cuh) read them one element at a time, so
    # they need their element's alignment, not the 16 bytes of the vector operands
    _tensor(fn, "sorted_ids", sorted_ids, torch.int32, 1, dev, aligned=4)
    _tensor(fn, "expert_ids", expert_ids, torch.int32, 1, dev, aligned=4)
    _tensor(fn, "num_tokens_post_padded", num_tokens_post_padded, torch.int32, 1, dev, aligned=4)
    if num_tokens_post_padded.numel() < 1:
        raise ValueError(f"{fn}: num_tokens_post_padded must hold one element")
    checks.top_k(fn, top_k)
    if isinstance(block_m, bool) or not isinstance(block_m, int):
        raise ValueError(f"{fn}: block_m must be an int (the routing's block size), got {block_m!r}")
    s = _check_schedule(fn, schedule, "indexed", n, k)
    if block_m != s.block_m:
        raise ValueError(f"{fn}: block_m={block_m} (the routing's block size) must equal the schedule's block_m={s.block_m}")
    if out.shape[0] < x.shape[0] * top_k:
        raise ValueError(f"{fn}: out must have at least x.shape[0]*top_k={x.shape[0] * top_k} rows, got {out.shape[0]}")
    if sorted_ids.numel() // block_m > expert_ids.numel():
        raise ValueError(f"{fn}: expert_ids must hold one entry per block of sorted_ids "
                         f"({sorted_ids.numel() // block_m}), got {expert_ids.numel()}")
    units = sorted_ids.numel() // block_m * (n // s.block_n) * (k // K_BLOCK)
    if s.stream_k and units >= 2**31:  # csrc/moe/stream_k.cuh plans in 32-bit units
        raise ValueError(f"{fn}: schedule {s.id}: stream_k=1 plans at most 2^31 - 1 units, but the routing buffers "
                         f"allow {sorted_ids.numel() // block_m} blocks x {n // s.block_n} N blocks x {k // K_BLOCK} "
                         f"K blocks = {units}; use stream_k=0 for buffers this large")
    return s, e, n, k, _extents((x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out))


def _gemm_indexed_impl(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k, block_m,
                       schedule, check=None, all_routes=False):
    """The Python path of gemm_indexed, one pass: checks (memoized by metadata), the routing
    values when read, the kernel (chord.jit), the launch record and the launch (chord.launch)."""
    (s, e, n, k, extents), ptrs = _memo_validate(
        "indexed", (top_k, block_m, schedule), (x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out),
        lambda: _validate_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k,
                                  block_m, schedule))
    _check_aliasing("gemm_indexed", _INDEXED_NAMES, ptrs, extents)
    if _checks_routing(check, sorted_ids):
        _check_indexed_values("gemm_indexed", sorted_ids, expert_ids, num_tokens_post_padded, e, block_m, x.shape[0] * top_k,
                              all_routes)
    check_cuda_sm90(x)
    record = _record((launch.INDEXED, top_k, block_m, x, qweight, scales, sorted_ids, expert_ids,
                      num_tokens_post_padded, out), _INDEXED_SLOTS)
    num_blocks = sorted_ids.numel() // block_m
    if num_blocks == 0 or x.shape[0] == 0:
        _remember_noop(schedule, record)
        return
    kernel = _kernel(s, qweight, n)
    grid, ctas = (num_blocks, s.grid_n(n), s.split_k), 0
    if s.stream_k:  # one wave of CTAs splits the valid units (csrc/moe/stream_k.cuh); its workspace fits it
        dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
        ctas = _resident_ctas(s, kernel, dev)
        grid = (ctas, 1, 1)
    fields = dict(
        x=x.data_ptr(), qweight=qweight.data_ptr(), scales=scales.data_ptr(), out=out.data_ptr(),
        sorted_ids=sorted_ids.data_ptr(), expert_ids=expert_ids.data_ptr(),
        num_tokens_post_padded=num_tokens_post_padded.data_ptr(), n=n, k=k, num_experts=e, top_k=top_k,
        num_valid_ids=x.shape[0] * top_k, num_blocks=num_blocks,
        **_split_args(s, x, num_blocks, s.grid_n(n), ctas, out=(ptrs[-1], extents[-1], "gemm_indexed")))
    _launch(s, kernel, grid, x, fields, "gemm_indexed", schedule, record)


@torch.library.custom_op("chord::gemm_indexed", mutates_args=("out",))
def _gemm_indexed_op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, sorted_ids: torch.Tensor,
                     expert_ids: torch.Tensor, num_tokens_post_padded: torch.Tensor, out: torch.Tensor, top_k: int,
                     block_m: int, schedule: str, check_routing: int = -1) -> None:
    _gemm_indexed_impl(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k, block_m,
                       schedule, *_check_arg(check_routing, all_routes_ok=True))


@_gemm_indexed_op.register_fake
def _(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k, block_m, schedule,
      check_routing=-1):
    _validate_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k, block_m, schedule)


# ---------------------------------------------------------------------------------------------
# grouped contiguous


def _validate_contiguous(x, qweight, scales, expert_offsets, out, schedule):
    fn = "gemm_contiguous"
    e, n, k = _check_weights(fn, x, qweight, scales, out)
    if x.dim() != 2 or out.dim() != 2:
        raise ValueError(f"{fn}: x and out must be 2-D, got {tuple(x.shape)} and {tuple(out.shape)}")
    _tensor(fn, "expert_offsets", expert_offsets, torch.int64, 1, x.device, aligned=8)  # int64 loads (rows.cuh)
    if expert_offsets.numel() != e + 1:
        raise ValueError(f"{fn}: expert_offsets must have E+1={e + 1} entries, got {expert_offsets.numel()}")
    if out.shape[0] < x.shape[0]:
        raise ValueError(f"{fn}: out must have at least as many rows as x ({x.shape[0]}), got {out.shape[0]}")
    return (_check_schedule(fn, schedule, "grouped_contiguous", n, k), e, n, k,
            _extents((x, qweight, scales, expert_offsets, out)))


def _gemm_contiguous_impl(x, qweight, scales, expert_offsets, out, schedule, check=None):
    """The Python path of gemm_contiguous, one pass (as _gemm_indexed_impl)."""
    (s, e, n, k, extents), ptrs = _memo_validate(
        "contiguous", (schedule,), (x, qweight, scales, expert_offsets, out),
        lambda: _validate_contiguous(x, qweight, scales, expert_offsets, out, schedule))
    _check_aliasing("gemm_contiguous", _CONTIGUOUS_NAMES, ptrs, extents)
    if _checks_routing(check, expert_offsets):
        _check_offsets_values("gemm_contiguous", expert_offsets, x.shape[0])
    check_cuda_sm90(x)
    record = _record((launch.CONTIGUOUS, x, qweight, scales, expert_offsets, out), _GROUPED_SLOTS)
    rows = x.shape[0]
    if rows == 0:
        _remember_noop(schedule, record)
        return
    kernel = _kernel(s, qweight, n)
    grid_x = (rows + s.block_m - 1) // s.block_m + e  # upper bound on per-expert tiles
    fields = dict(x=x.data_ptr(), qweight=qweight.data_ptr(), scales=scales.data_ptr(), out=out.data_ptr(),
                  expert_layout=expert_offsets.data_ptr(), n=n, k=k, num_experts=e, rows=rows,
                  **_split_args(s, x, grid_x, s.grid_n(n), out=(ptrs[-1], extents[-1], "gemm_contiguous")))
    _launch(s, kernel, (grid_x, s.grid_n(n), s.split_k), x, fields, "gemm_contiguous", schedule, record)


@torch.library.custom_op("chord::gemm_contiguous", mutates_args=("out",))
def _gemm_contiguous_op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, expert_offsets: torch.Tensor,
                        out: torch.Tensor, schedule: str, check_routing: int = -1) -> None:
    _gemm_contiguous_impl(x, qweight, scales, expert_offsets, out, schedule, _check_arg(check_routing)[0])


@_gemm_contiguous_op.register_fake
def _(x, qweight, scales, expert_offsets, out, schedule, check_routing=-1):
    _validate_contiguous(x, qweight, scales, expert_offsets, out, schedule)


# ---------------------------------------------------------------------------------------------
# grouped masked


def _validate_masked(x, qweight, scales, expert_num_tokens, out, schedule):
    fn = "gemm_masked"
    e, n, k = _check_weights(fn, x, qweight, scales, out)
    _tensor(fn, "expert_num_tokens", expert_num_tokens, torch.int32, 1, x.device, aligned=4)  # int32 loads (rows.cuh)
    if expert_num_tokens.numel() != e:
        raise ValueError(f"{fn}: expert_num_tokens must have E={e} entries, got {expert_num_tokens.numel()}")
    if x.dim() == 3:
        if x.shape[0] != e:
            raise ValueError(f"{fn}: x must be [E={e}, max_rows, K], got {tuple(x.shape)}")
        max_rows = x.shape[1]
    else:
        if x.shape[0] % e:
            raise ValueError(f"{fn}: 2-D x must have E*max_rows rows (a multiple of E={e}), got {x.shape[0]}")
        max_rows = x.shape[0] // e
    if out.numel() // n != e * max_rows:
        raise ValueError(f"{fn}: out must hold E*max_rows={e * max_rows} rows of N={n}, got {tuple(out.shape)}")
    return (_check_schedule(fn, schedule, "grouped_masked", n, k), e, n, k, max_rows,
            _extents((x, qweight, scales, expert_num_tokens, out)))


def _gemm_masked_impl(x, qweight, scales, expert_num_tokens, out, schedule, check=None):
    """The Python path of gemm_masked, one pass (as _gemm_indexed_impl)."""
    (s, e, n, k, max_rows, extents), ptrs = _memo_validate(
        "masked", (schedule,), (x, qweight, scales, expert_num_tokens, out),
        lambda: _validate_masked(x, qweight, scales, expert_num_tokens, out, schedule))
    _check_aliasing("gemm_masked", _MASKED_NAMES, ptrs, extents)
    if _checks_routing(check, expert_num_tokens):
        _check_counts_values("gemm_masked", expert_num_tokens, max_rows)
    check_cuda_sm90(x)
    record = _record((launch.MASKED, x, qweight, scales, expert_num_tokens, out), _GROUPED_SLOTS)
    if max_rows == 0:
        _remember_noop(schedule, record)
        return
    kernel = _kernel(s, qweight, n)
    tiles = (max_rows + s.block_m - 1) // s.block_m
    fields = dict(x=x.data_ptr(), qweight=qweight.data_ptr(), scales=scales.data_ptr(), out=out.data_ptr(),
                  expert_layout=expert_num_tokens.data_ptr(), n=n, k=k, num_experts=e, max_rows=max_rows,
                  **_split_args(s, x, e * tiles, s.grid_n(n), out=(ptrs[-1], extents[-1], "gemm_masked")))
    _launch(s, kernel, (e * tiles, s.grid_n(n), s.split_k), x, fields, "gemm_masked", schedule, record)


@torch.library.custom_op("chord::gemm_masked", mutates_args=("out",))
def _gemm_masked_op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, expert_num_tokens: torch.Tensor,
                    out: torch.Tensor, schedule: str, check_routing: int = -1) -> None:
    _gemm_masked_impl(x, qweight, scales, expert_num_tokens, out, schedule, _check_arg(check_routing)[0])


@_gemm_masked_op.register_fake
def _(x, qweight, scales, expert_num_tokens, out, schedule, check_routing=-1):
    _validate_masked(x, qweight, scales, expert_num_tokens, out, schedule)


# ---------------------------------------------------------------------------------------------
# raw entry points: through torch.ops while torch.compile traces, straight to the same checked
# implementation in eager mode (the dispatcher round trip of a Python custom op costs ~30 us of
# host time per call, more than a whole TP8 decode kernel).


def _eager() -> bool:
    return not torch.compiler.is_compiling()


def _trusted(check: bool | None) -> bool:
    """Whether a call reads no routing values (check_routing False, or None with the switch off):
    only such a call may take a launch plan (chord.launch), which checks nothing but metadata."""
    return check is False or (check is None and not _check_routing)


def gemm_indexed_raw(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k: int,
                     block_m: int, schedule: str, *, check_routing: bool | None = None,
                     all_routes: bool = False) -> None:
    """`torch.ops.chord.gemm_indexed` with the eager fast path (same checks, same kernel).
    check_routing: read and check the routing values first (None: the CHORD_CHECK_ROUTING switch;
    never while a CUDA graph is being captured). all_routes: the checked read also requires every
    route id below x.shape[0] * top_k in sorted_ids (routing that drops no route on purpose; see
    chord.routing.IndexedRouting.all_routes)."""
    if _eager():
        if _trusted(check_routing) and launch.try_launch(schedule, launch.INDEXED, top_k, block_m, x, qweight, scales,
                                                         sorted_ids, expert_ids, num_tokens_post_padded, out):
            return
        if all_routes is not False:
            checks.boolean("gemm_indexed", "all_routes", all_routes)
        _gemm_indexed_impl(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k, block_m,
                           schedule, check_routing, all_routes)
    else:
        torch.ops.chord.gemm_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k,
                                     block_m, schedule, _check_code(check_routing, all_routes is True))


def gemm_contiguous_raw(x, qweight, scales, expert_offsets, out, schedule: str, *,
                        check_routing: bool | None = None) -> None:
    """`torch.ops.chord.gemm_contiguous` with the eager fast path (check_routing: as gemm_indexed_raw)."""
    if _eager():
        if _trusted(check_routing) and launch.try_launch(schedule, launch.CONTIGUOUS, x, qweight, scales,
                                                         expert_offsets, out):
            return
        _gemm_contiguous_impl(x, qweight, scales, expert_offsets, out, schedule, check_routing)
    else:
        torch.ops.chord.gemm_contiguous(x, qweight, scales, expert_offsets, out, schedule, _check_code(check_routing))


def gemm_masked_raw(x, qweight, scales, expert_num_tokens, out, schedule: str, *,
                    check_routing: bool | None = None) -> None:
    """`torch.ops.chord.gemm_masked` with the eager fast path (check_routing: as gemm_indexed_raw)."""
    if _eager():
        if _trusted(check_routing) and launch.try_launch(schedule, launch.MASKED, x, qweight, scales,
                                                         expert_num_tokens, out):
            return
        _gemm_masked_impl(x, qweight, scales, expert_num_tokens, out, schedule, check_routing)
    else:
        torch.ops.chord.gemm_masked(x, qweight, scales, expert_num_tokens, out, schedule, _check_code(check_routing))


# ---------------------------------------------------------------------------------------------
# wrappers


def _check_packed(fn: str, name: str, w) -> None:
    from chord.formats import PackedExperts

    if not isinstance(w, PackedExperts):
        checks.fail(fn, name, "be a chord.formats.PackedExperts (use chord.formats.pack_experts)", type(w).__name__,
                    TypeError)


def _profile_for(w: "PackedExperts", profile, family: str):
    if profile is not None:
        return load_profile(profile)
    return profile_for(family, w.num_experts, w.n, w.k)


def gemm_indexed(x: torch.Tensor, w: "PackedExperts", routing, *, top_k: Optional[int] = None,
                 out: Optional[torch.Tensor] = None, schedule: Schedule | str | None = None,
                 profile=None, check_routing: bool | None = None) -> torch.Tensor:
    """out[sorted_id] = x[sorted_id // top_k] @ W[expert]^T for every routed row of `routing`
    (a chord.routing.IndexedRouting built with the schedule's block_m). check_routing: read and
    check the routing values before the launch (None: CHORD_CHECK_ROUTING, on by default; never
    while a CUDA graph is captured); False trusts them (the kernel stays in bounds regardless)."""
    _check_packed("gemm_indexed", "w", w)
    if not isinstance(routing, R.IndexedRouting):
        checks.fail("gemm_indexed", "routing", "be a chord.routing.IndexedRouting (use chord.routing.align_block_size)",
                    type(routing).__name__, TypeError)
    top_k = checks.top_k("gemm_indexed", routing.top_k if top_k is None else top_k)
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] * top_k != routing.num_rows:
        raise ValueError(f"gemm_indexed: x.shape[0] * top_k = {x.shape[0]} * {top_k} must equal the routing's routed rows "
                         f"({routing.num_rows} = M * {routing.top_k}): gate_up takes the M token rows with the "
                         "routing's top_k, down the M * top_k routed rows with top_k=1")
    if schedule is None:
        prob = Problem("indexed", w.num_experts, w.n, w.k, rows=x.shape[0] * top_k, top_k=top_k)
        schedule = select(_profile_for(w, profile, "indexed"), prob)
        if schedule.block_m != routing.block_m:
            schedule = override(schedule, block_m=routing.block_m)
    sid = schedule.id if isinstance(schedule, Schedule) else schedule
    if out is None:
        out = torch.empty(x.shape[0] * top_k, w.n, dtype=torch.bfloat16, device=x.device)
    gemm_indexed_raw(x, w.qweight, w.scales, routing.sorted_ids, routing.expert_ids, routing.num_tokens_post_padded,
                     out, top_k, routing.block_m, sid, check_routing=check_routing, all_routes=routing.all_routes)
    return out


def gemm_contiguous(x: torch.Tensor, w: "PackedExperts", expert_offsets: torch.Tensor, *,
                    out: Optional[torch.Tensor] = None, schedule: Schedule | str | None = None,
                    profile=None, check_routing: bool | None = None) -> torch.Tensor:
    """Rows [off[e], off[e+1]) of x times expert e's weights; rows past off[E] are not written.
    check_routing: as gemm_indexed."""
    _check_packed("gemm_contiguous", "w", w)
    if schedule is None:
        prob = Problem("grouped_contiguous", w.num_experts, w.n, w.k, rows=x.shape[0])
        schedule = select(_profile_for(w, profile, "grouped_contiguous"), prob)
    sid = schedule.id if isinstance(schedule, Schedule) else schedule
    if out is None:
        out = torch.empty(x.shape[0], w.n, dtype=torch.bfloat16, device=x.device)
    gemm_contiguous_raw(x, w.qweight, w.scales, expert_offsets, out, sid, check_routing=check_routing)
    return out


def gemm_masked(x: torch.Tensor, w: "PackedExperts", expert_num_tokens: torch.Tensor, *,
                out: Optional[torch.Tensor] = None, schedule: Schedule | str | None = None,
                profile=None, expected_rows: Optional[int] = None,
                check_routing: bool | None = None) -> torch.Tensor:
    """x [E, max_rows, K]: the first expert_num_tokens[e] rows of expert e times its weights.
    `expected_rows` (host int, total valid rows expected) drives the schedule; default E*max_rows/4.
    check_routing: as gemm_indexed."""
    _check_packed("gemm_masked", "w", w)
    if schedule is None:
        max_rows = x.shape[1] if x.dim() == 3 else x.shape[0] // max(w.num_experts, 1)
        rows = expected_rows if expected_rows is not None else w.num_experts * max_rows
        prob = Problem("grouped_masked", w.num_experts, w.n, w.k, rows=rows)
        schedule = select(_profile_for(w, profile, "grouped_masked"), prob)
    sid = schedule.id if isinstance(schedule, Schedule) else schedule
    if out is None:
        out = torch.empty(*x.shape[:-1], w.n, dtype=torch.bfloat16, device=x.device)
    gemm_masked_raw(x, w.qweight, w.scales, expert_num_tokens, out, sid, check_routing=check_routing)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """vLLM's w13 layout (first half gate, second half up): silu(gate) * up in float32, as bf16.
    The composite's activation; the reference's function, rounded to what the next GEMM reads."""
    from chord.reference import silu_and_mul_ref

    return silu_and_mul_ref(x).to(torch.bfloat16)


def fused_moe(hidden_states: torch.Tensor, w13: "PackedExperts", w2: "PackedExperts", topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, family: str = "indexed", expert_map: Optional[torch.Tensor] = None,
              profile=None) -> torch.Tensor:
    """A whole MoE layer: routing -> gate_up -> SiLU-GLU -> down -> top-k weighted sum (bf16 out).

    family: "indexed" (vLLM moe_align contract), "grouped_contiguous" or "grouped_masked".
    """
    fn = "fused_moe"
    from chord import routing as R

    _check_packed(fn, "w13", w13)
    _check_packed(fn, "w2", w2)
    _tensor(fn, "hidden_states", hidden_states, torch.bfloat16, 2)
    _tensor(fn, "topk_ids", topk_ids, (torch.int32, torch.int64), 2, hidden_states.device, aligned=False)
    _tensor(fn, "topk_weights", topk_weights, (torch.float32, torch.bfloat16, torch.float16), 2,
            hidden_states.device, contiguous=False, aligned=False)
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"{fn}: topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}")
    if w13.num_experts != w2.num_experts:
        raise ValueError(f"{fn}: w13 and w2 must have the same number of experts, got {w13.num_experts} and {w2.num_experts}")
    if w13.n != 2 * w2.k:
        raise ValueError(f"{fn}: w13 must have N = 2 * w2's K ({2 * w2.k}) for SiLU-GLU, got {w13.n}")
    if w2.n != hidden_states.shape[1] or w13.k != hidden_states.shape[1]:
        raise ValueError(f"{fn}: hidden_states must have K = w13.k = w2.n = {w13.k}, got {hidden_states.shape[1]}")
    m, top_k = topk_ids.shape
    if hidden_states.shape[0] != m:
        raise ValueError(f"{fn}: hidden_states must have one row per topk_ids row ({m}), "
                         f"got {hidden_states.shape[0]}")
    e = w13.num_experts
    n_route = expert_map.numel() if expert_map is not None else e  # ids index global experts
    rows = m * top_k
    if family not in ("indexed", "grouped_contiguous", "grouped_masked"):
        raise ValueError(f"{fn}: family must be one of indexed, grouped_contiguous, grouped_masked; got {family!r}")
    prof = _profile_for(w13, profile, family)

    with nvtx_range("fused_moe", family):
        if family == "indexed":
            s1 = select(prof, Problem("indexed", e, w13.n, w13.k, rows, top_k))
            s2 = select(prof, Problem("indexed", e, w2.n, w2.k, rows, 1))
            # vLLM's Humming path: local buckets, non-local routes dropped (ignore_invalid_experts)
            align = dict(expert_map=expert_map, ignore_invalid_experts=expert_map is not None)
            r1 = R.align_block_size(topk_ids, s1.block_m, n_route, **align)
            r2 = r1 if s2.block_m == s1.block_m else R.align_block_size(topk_ids, s2.block_m, n_route, **align)
            inter = torch.full((rows, w13.n), 0, dtype=torch.bfloat16, device=hidden_states.device)
            gemm_indexed(hidden_states, w13, r1, top_k=top_k, out=inter, schedule=s1, check_routing=False)
            act = silu_and_mul(inter)
            down = torch.zeros(rows, w2.n, dtype=torch.bfloat16, device=hidden_states.device)
            gemm_indexed(act, w2, r2, top_k=1, out=down, schedule=s2, check_routing=False)
            valid = _valid_slots(topk_ids, expert_map, n_route)
            wts = (topk_weights.float() * valid).view(m, top_k, 1)
            return (down.float().view(m, top_k, -1) * wts).sum(1).to(torch.bfloat16)
        if family == "grouped_contiguous":
            lay = R.contiguous_layout(hidden_states, topk_ids, n_route, expert_map=expert_map)
            inter = gemm_contiguous(lay.x, w13, lay.expert_offsets, profile=prof, check_routing=False)
            act = silu_and_mul(inter)
            down = gemm_contiguous(act, w2, lay.expert_offsets, profile=prof, check_routing=False)
            return R.unpermute_contiguous(down, lay, topk_weights, m).to(torch.bfloat16)
        if family == "grouped_masked":
            lay = R.masked_layout(hidden_states, topk_ids, n_route, expert_map=expert_map)
            inter = gemm_masked(lay.x, w13, lay.expert_num_tokens, profile=prof, expected_rows=rows,
                                    check_routing=False)
            act = silu_and_mul(inter)
            down = gemm_masked(act, w2, lay.expert_num_tokens, profile=prof, expected_rows=rows,
                                   check_routing=False)
            return R.unpermute_masked(down, lay, topk_weights, m).to(torch.bfloat16)
    raise ValueError(f"{fn}: family must be one of indexed, grouped_contiguous, grouped_masked; got {family!r}")


def _valid_slots(topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor], num_experts: int) -> torch.Tensor:
    if expert_map is None:
        return ((topk_ids >= 0) & (topk_ids < num_experts)).float()
    local = expert_map[topk_ids.clamp(min=0).long()]
    return ((topk_ids >= 0) & (local >= 0)).float()
