"""Routing contracts: from ``topk_ids [M, top_k]`` to what each kernel family consumes.

* ``align_block_size``  -> ``IndexedRouting``   (vLLM ``moe_align_block_size`` contract)
* ``contiguous_layout`` -> ``ContiguousLayout`` (rows of each expert contiguous, int64 offsets)
* ``masked_layout``     -> ``MaskedLayout``     (``[E, max_rows, K]`` + int32 counts)

plus the inverse gathers (``unpermute_contiguous`` / ``unpermute_masked``) and the routings of
the benchmark suite (``balanced_topk_ids`` for EP8, ``random_topk_ids`` for TP8).

Everything is vectorised torch (sort + scatter_add + cumsum + searchsorted), with no Python
loop over tokens or experts, and runs on the device of ``topk_ids``. ``align_block_size``
needs no host synchronisation except the optional id-range check (``check_ids``), which is
skipped automatically while a CUDA graph is being captured. ``contiguous_layout`` and
``masked_layout`` read one device scalar to size their outputs unless told the size.

Expert ids and ``expert_map``
-----------------------------
``num_experts`` is always the *global* expert count (the length of ``expert_map``).
``expert_map`` (int ``[num_experts]``) maps a global id to a local id in ``[0, E_local)`` or
to -1 for experts that live on another rank. In ``topk_ids``, ids must lie in
``[0, num_experts)``; the value -1 is accepted only when ``expert_map`` is given, and such a
route is treated like a route to a non-local expert (dropped everywhere). This is Chord's
choice: vLLM's CUDA op has no defined behaviour for -1 ids.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from chord import checks

__all__ = [
    "IndexedRouting",
    "ContiguousLayout",
    "MaskedLayout",
    "sorted_ids_capacity",
    "align_block_size",
    "contiguous_layout",
    "masked_layout",
    "unpermute_contiguous",
    "unpermute_masked",
    "balanced_topk_ids",
    "random_topk_ids",
]

_INT_IDS = (torch.int32, torch.int64)
_MAX_BLOCK_M = 1024  # align_block_size; chord's kernels use block_m <= 256
# masked_layout: a max_rows above the routes (M * top_k, what one expert can receive at most)
# only adds padding rows; up to this many per expert are allowed for a fixed-shape buffer
_MAX_SPARE_ROWS = 4096
# contiguous_layout: the largest per-expert alignment (padding rows) accepted
_MAX_ALIGNMENT = 4096
_BALANCED_SWAP_ROUNDS = 16


# --------------------------------------------------------------------------------------
# result types
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class IndexedRouting:
    """vLLM ``moe_align_block_size`` output (what the indexed kernels consume).

    * ``sorted_ids`` int32 ``[max_num_tokens_padded]``: flat route ids ``token * top_k + j``
      grouped by expert in expert order, each expert padded to a multiple of ``block_m`` with
      the sentinel ``num_rows``; every entry at or past ``num_tokens_post_padded`` is the
      sentinel too. Within an expert, routes are in increasing flat id (vLLM's CUDA op leaves
      that order unspecified; kernels must not depend on it).
    * ``expert_ids`` int32 ``[ceil(max_num_tokens_padded / block_m)]``: expert of each block;
      -1 = skip (a non-local expert, and every block at or past ``num_tokens_post_padded``).
    * ``num_tokens_post_padded`` int32 ``[1]`` on the device: used length of ``sorted_ids``.
    * ``num_rows`` = ``M * top_k``: the number of routed rows, which is also the sentinel and
      the row count of the gate_up output / down input.
    * ``all_routes``: every route id in ``[0, num_rows)`` is in ``sorted_ids`` (no route dropped
      on purpose: ``align_block_size`` without ``expert_map``). The checked launch
      (``chord.ops.gemm_indexed``) then also refuses routing missing one (a route replaced by
      the sentinel leaves its output row unwritten). False: some routes may be dropped (routes
      to non-local experts, -1 ids), or unknown.
    """

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    block_m: int
    top_k: int
    num_rows: int
    all_routes: bool = False

    def __post_init__(self) -> None:
        fn = "IndexedRouting"
        for name in ("sorted_ids", "expert_ids", "num_tokens_post_padded"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
                raise TypeError(f"{checks.where(fn, name)} must be an int32 torch.Tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if self.sorted_ids.dim() != 1 or self.expert_ids.dim() != 1:
            raise ValueError(f"{fn}: arguments 'sorted_ids' and 'expert_ids' must be 1-D")
        if self.num_tokens_post_padded.numel() != 1:
            raise ValueError(
                f"{checks.where(fn, 'num_tokens_post_padded')} must hold one element, got shape {tuple(self.num_tokens_post_padded.shape)}"
            )
        if not (self.sorted_ids.device == self.expert_ids.device == self.num_tokens_post_padded.device):
            raise ValueError(f"{fn}: 'sorted_ids', 'expert_ids' and 'num_tokens_post_padded' must be on one device")
        for name in ("block_m", "top_k"):
            v = getattr(self, name)
            if not checks.is_int(v) or v < 1:
                raise ValueError(f"{checks.where(fn, name)} must be a positive int, got {v!r}")
        if not checks.is_int(self.num_rows) or self.num_rows < 0 or self.num_rows % self.top_k:
            raise ValueError(f"{checks.where(fn, 'num_rows')} must be M * top_k (a non-negative multiple of {self.top_k}), got {self.num_rows!r}")
        checks.boolean(fn, "all_routes", self.all_routes)
        if self.expert_ids.shape[0] * self.block_m < self.sorted_ids.shape[0]:
            raise ValueError(
                f"{checks.where(fn, 'expert_ids')} has {self.expert_ids.shape[0]} blocks, fewer than "
                f"ceil({self.sorted_ids.shape[0]} / block_m={self.block_m}) for sorted_ids"
            )

    @property
    def num_tokens(self) -> int:
        """M, the number of tokens (rows of the gate_up input)."""
        return self.num_rows // self.top_k

    @property
    def sentinel(self) -> int:
        """Padding value of ``sorted_ids`` (= ``num_rows`` = ``M * top_k``)."""
        return self.num_rows

    @property
    def max_num_tokens_padded(self) -> int:
        return int(self.sorted_ids.shape[0])

    @property
    def max_num_blocks(self) -> int:
        return int(self.expert_ids.shape[0])

    @property
    def device(self) -> torch.device:
        return self.sorted_ids.device


@dataclasses.dataclass(frozen=True, eq=False)
class ContiguousLayout:
    """Routed rows permuted so each local expert's rows are contiguous, in expert order.

    ``x`` ``[rows, K]`` (padding rows zero); rows of expert ``e`` are
    ``[expert_offsets[e], expert_offsets[e+1])`` (int64 ``[E_local + 1]``), each expert's
    block padded to a multiple of ``alignment``. ``src_token`` / ``src_slot`` (int64
    ``[rows]``) give the token index and flat route index ``token * top_k + j`` of each row,
    -1 for padding rows (and for the spare rows past ``expert_offsets[-1]`` when
    ``static_rows=True``).
    """

    x: torch.Tensor
    expert_offsets: torch.Tensor
    src_token: torch.Tensor
    src_slot: torch.Tensor
    alignment: int

    @property
    def num_experts(self) -> int:
        return int(self.expert_offsets.shape[0]) - 1

    @property
    def num_rows(self) -> int:
        return int(self.x.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class MaskedLayout:
    """Routed rows per local expert in a padded batch.

    ``x`` ``[E_local, max_rows, K]`` (rows past the count are zero; kernels must not rely on
    that), ``expert_num_tokens`` int32 ``[E_local]``, ``src_slot`` int64
    ``[E_local, max_rows]`` = flat route index ``token * top_k + j`` of each row, -1 past the
    count.
    """

    x: torch.Tensor
    expert_num_tokens: torch.Tensor
    src_slot: torch.Tensor

    @property
    def num_experts(self) -> int:
        return int(self.x.shape[0])

    @property
    def max_rows(self) -> int:
        return int(self.x.shape[1])


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _check_topk_ids(fn: str, topk_ids: Any) -> None:
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"{checks.where(fn, 'topk_ids')} must be a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype not in _INT_IDS:
        raise TypeError(f"{checks.where(fn, 'topk_ids')} must have dtype torch.int32 or torch.int64, got {topk_ids.dtype}")
    if topk_ids.dim() != 2:
        raise ValueError(f"{checks.where(fn, 'topk_ids')} must be 2-D [M, top_k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[1] < 1:
        raise ValueError(f"{checks.where(fn, 'topk_ids')} must have top_k >= 1 columns, got shape {tuple(topk_ids.shape)}")
    if topk_ids.numel() > checks.MAX_INT32:
        raise ValueError(f"{checks.where(fn, 'topk_ids')} must hold at most 2^31 - 1 routes (route ids are int32 in "
                         f"vLLM's routing), got shape {tuple(topk_ids.shape)}")


def _check_num_experts(fn: str, num_experts: Any) -> None:
    if not checks.is_int(num_experts) or num_experts < 1:
        raise ValueError(f"{checks.where(fn, 'num_experts')} must be a positive int, got {num_experts!r}")
    if num_experts > checks.MAX_EXPERTS:
        raise ValueError(f"{checks.where(fn, 'num_experts')} must be <= {checks.MAX_EXPERTS} (chord.checks.MAX_EXPERTS: "
                         f"the routing allocates per expert), got {num_experts}")


def _check_expert_map(fn: str, expert_map: Any, num_experts: int, device: torch.device) -> None:
    if expert_map is None:
        return
    if not isinstance(expert_map, torch.Tensor):
        raise TypeError(f"{checks.where(fn, 'expert_map')} must be a torch.Tensor or None, got {type(expert_map).__name__}")
    if expert_map.dtype not in _INT_IDS:
        raise TypeError(f"{checks.where(fn, 'expert_map')} must have dtype torch.int32 or torch.int64, got {expert_map.dtype}")
    if tuple(expert_map.shape) != (num_experts,):
        raise ValueError(
            f"{checks.where(fn, 'expert_map')} must have shape [num_experts] = [{num_experts}] (global -> local id, "
            f"-1 = not local), got {tuple(expert_map.shape)}"
        )
    if expert_map.device != device:
        raise ValueError(
            f"{checks.where(fn, 'expert_map')} must be on the device of topk_ids ({device}), got {expert_map.device}"
        )


def _map_duplicates(expert_map: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Per local id in [0, num_experts): whether two or more global experts map to it (device op)."""
    em = expert_map.long()
    local = torch.where((em >= 0) & (em < num_experts), em, num_experts)
    return torch.bincount(local, minlength=num_experts + 1)[:num_experts] > 1


def _refuse_shared_local(fn: str, expert_map: torch.Tensor, local: int) -> None:
    shared = (expert_map == local).nonzero().flatten().tolist()
    raise ValueError(
        f"{checks.where(fn, 'expert_map')} must map each local expert from one global expert (injective: two global "
        f"experts on one local expert would share its weights and its rows), got local id {local} for global "
        f"experts {shared}"
    )


def _check_id_values(fn: str, topk_ids: torch.Tensor, num_experts: int, expert_map: torch.Tensor | None) -> None:
    """Range checks (and an injective expert_map) with a few device ops and one read back (none
    for CPU tensors); skipped during graph capture."""
    if _capturing(topk_ids):
        return
    parts = [topk_ids.min().long(), topk_ids.max().long()] if topk_ids.numel() else []
    if expert_map is not None:
        dup = _map_duplicates(expert_map, num_experts)
        idx = torch.arange(num_experts, device=dup.device)
        parts += [expert_map.min().long(), expert_map.max().long(), torch.where(dup, idx, num_experts).amin()]
    if not parts:
        return
    stats = torch.stack(parts).tolist()
    if topk_ids.numel():
        lo, hi = stats[:2]
        stats = stats[2:]
        low_ok = -1 if expert_map is not None else 0
        if lo < low_ok or hi >= num_experts:
            allowed = f"[0, {num_experts})" + (" or -1" if expert_map is not None else "")
            raise ValueError(
                f"{checks.where(fn, 'topk_ids')} holds expert ids in [{lo}, {hi}], expected {allowed}"
                + ("" if expert_map is not None else " (-1 is only accepted together with expert_map)")
            )
    if expert_map is not None:
        lo, hi, shared = stats
        if lo < -1 or hi >= num_experts:
            raise ValueError(
                f"{checks.where(fn, 'expert_map')} holds values in [{lo}, {hi}], expected local ids in [0, {num_experts}) or -1"
            )
        if shared < num_experts:
            _refuse_shared_local(fn, expert_map, shared)


def _check_hidden(fn: str, hidden_states: Any, topk_ids: torch.Tensor) -> None:
    if not isinstance(hidden_states, torch.Tensor):
        raise TypeError(f"{checks.where(fn, 'hidden_states')} must be a torch.Tensor, got {type(hidden_states).__name__}")
    if not hidden_states.dtype.is_floating_point:
        raise TypeError(f"{checks.where(fn, 'hidden_states')} must be a floating-point tensor, got {hidden_states.dtype}")
    if hidden_states.dim() != 2:
        raise ValueError(f"{checks.where(fn, 'hidden_states')} must be 2-D [M, K], got shape {tuple(hidden_states.shape)}")
    if hidden_states.shape[0] != topk_ids.shape[0]:
        raise ValueError(
            f"{checks.where(fn, 'hidden_states')} has {hidden_states.shape[0]} rows but topk_ids has {topk_ids.shape[0]} tokens"
        )
    if hidden_states.device != topk_ids.device:
        raise ValueError(
            f"{fn}: arguments 'hidden_states' ({hidden_states.device}) and 'topk_ids' ({topk_ids.device}) "
            "must be on the same device"
        )


# --------------------------------------------------------------------------------------
# shared core: bucket key per route + stable grouping
# --------------------------------------------------------------------------------------


def _local_keys(topk_ids: torch.Tensor, num_buckets: int, expert_map: torch.Tensor | None, drop_nonlocal: bool) -> torch.Tensor:
    """int64 [T]: bucket of each flat route; ``num_buckets`` marks a dropped route."""
    flat = topk_ids.reshape(-1).long()
    if expert_map is None:
        return flat
    if drop_nonlocal:
        mapped = expert_map.long()[flat.clamp(min=0)]
        return torch.where((flat >= 0) & (mapped >= 0), mapped, num_buckets)
    return torch.where(flat >= 0, flat, num_buckets)


def _group(key: torch.Tensor, num_buckets: int):
    """Stable grouping of routes by bucket.

    Returns (order [T]: flat route ids sorted by bucket, key_sorted [T], counts [num_buckets],
    rank [T]: position of each sorted route inside its bucket).
    """
    t = key.shape[0]
    counts = torch.zeros(num_buckets + 1, dtype=torch.int64, device=key.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    order = torch.argsort(key, stable=True)
    key_sorted = key[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(t, device=key.device) - first[key_sorted]
    return order, key_sorted, counts[:num_buckets], rank


def _num_local_experts(fn: str, expert_map: torch.Tensor | None, num_experts: int) -> int:
    """The local experts of expert_map, which must map them one to one onto 0..n_local-1 (one read back)."""
    if expert_map is None:
        return num_experts
    dup = _map_duplicates(expert_map, num_experts)
    idx = torch.arange(num_experts, device=dup.device)
    n_local, top, shared = torch.stack([(expert_map >= 0).sum(), expert_map.max().long(),
                                        torch.where(dup, idx, num_experts).amin()]).tolist()
    if shared < num_experts:
        _refuse_shared_local(fn, expert_map, shared)
    if n_local and top != n_local - 1:
        raise ValueError(
            f"{checks.where(fn, 'expert_map')} must map its {n_local} local experts onto 0..{n_local - 1}, "
            f"got max {top}"
        )
    return n_local


# --------------------------------------------------------------------------------------
# indexed (vLLM moe_align_block_size)
# --------------------------------------------------------------------------------------


def sorted_ids_capacity(num_routes: int, block_m: int, num_experts: int) -> int:
    """vLLM's ``sorted_ids`` length: ``T + E * (block_m - 1)``, capped at ``T * block_m`` when
    there are fewer routes ``T = M * top_k`` than experts (without ``pad_sorted_ids``)."""
    n = num_routes + num_experts * (block_m - 1)
    if num_routes < num_experts:
        n = min(num_routes * block_m, n)
    return n


def align_block_size(
    topk_ids: torch.Tensor,
    block_m: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    max_num_tokens_padded: int | None = None,
    *,
    ignore_invalid_experts: bool = False,
    check_ids: bool = True,
) -> IndexedRouting:
    """vLLM 0.33 ``moe_align_block_size(topk_ids, block_m, num_experts, expert_map,
    ignore_invalid_experts=...)`` as an ``IndexedRouting``.

    Counting: every route ``topk_ids[t, j] = e`` lands in the bucket of ``e``; each bucket's
    run in ``sorted_ids`` is padded to a multiple of ``block_m`` with the sentinel ``M*top_k``.

    With ``expert_map`` and ``ignore_invalid_experts=False`` (vLLM's default) buckets are the
    *global* experts: routes to non-local experts still get blocks, whose ``expert_ids`` are
    then mapped through ``expert_map`` (so they read -1 = skip). With
    ``ignore_invalid_experts=True`` (what vLLM's Humming backend uses) buckets are the *local*
    experts: non-local routes are dropped and ``expert_ids`` hold local ids, never -1 below
    ``num_tokens_post_padded``.

    ``max_num_tokens_padded`` defaults to vLLM's formula (``sorted_ids_capacity()``); a
    larger value over-allocates (e.g. a fixed CUDA-graph buffer), a smaller one is refused.
    ``check_ids`` verifies id ranges with one device reduction (skipped during graph capture).
    """
    fn = "align_block_size"
    _check_topk_ids(fn, topk_ids)
    if not checks.is_int(block_m) or block_m <= 0 or block_m % 8 != 0 or block_m > _MAX_BLOCK_M:
        raise ValueError(f"{checks.where(fn, 'block_m')} must be a positive multiple of 8 up to {_MAX_BLOCK_M} (the "
                         f"kernels' tiles have at most 256 rows), got {block_m!r}")
    _check_num_experts(fn, num_experts)
    _check_expert_map(fn, expert_map, num_experts, topk_ids.device)
    num_rows = topk_ids.numel()
    top_k = int(topk_ids.shape[1])
    need = sorted_ids_capacity(num_rows, block_m, num_experts)
    if max_num_tokens_padded is None:
        length = need
    elif not checks.is_int(max_num_tokens_padded) or max_num_tokens_padded < need:
        raise ValueError(
            f"{checks.where(fn, 'max_num_tokens_padded')} must be an int >= {need} (vLLM's bound for "
            f"{num_rows} routes, {num_experts} experts, block_m={block_m}), got {max_num_tokens_padded!r}"
        )
    else:
        length = max_num_tokens_padded
    if length > checks.MAX_INT32:
        raise ValueError(
            f"{checks.where(fn, 'max_num_tokens_padded')} must be <= 2^31 - 1 (sorted ids and the padded count are "
            f"int32), got {length}" + ("" if max_num_tokens_padded is not None else
                                       f" (vLLM's bound for {num_rows} routes, {num_experts} experts, block_m={block_m})")
        )
    if check_ids:
        _check_id_values(fn, topk_ids, num_experts, expert_map)

    dev = topk_ids.device
    key = _local_keys(topk_ids, num_experts, expert_map, drop_nonlocal=ignore_invalid_experts)
    order, key_sorted, counts, rank = _group(key, num_experts)
    padded = (counts + (block_m - 1)) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = torch.cat((ends - padded, ends.new_full((1,), length)))  # bucket E -> dump slot
    total = ends[-1:]

    dest = torch.where(key_sorted < num_experts, starts[key_sorted] + rank, length)
    sorted_ids = torch.full((length + 1,), num_rows, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    sorted_ids = sorted_ids[:length]

    num_blocks = -(-length // block_m)
    block_start = torch.arange(num_blocks, dtype=torch.int64, device=dev) * block_m
    bucket = torch.searchsorted(ends, block_start, right=True)
    live = block_start < total
    if expert_map is not None and not ignore_invalid_experts:
        bucket = expert_map.long()[bucket.clamp(max=num_experts - 1)]
    expert_ids = torch.where(live, bucket, -1).to(torch.int32)

    return IndexedRouting(
        sorted_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=total.to(torch.int32),
        block_m=block_m,
        top_k=top_k,
        num_rows=num_rows,
        all_routes=expert_map is None,
    )


# --------------------------------------------------------------------------------------
# grouped layouts
# --------------------------------------------------------------------------------------


def contiguous_layout(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    alignment: int = 1,
    *,
    static_rows: bool = False,
    check_ids: bool = True,
) -> ContiguousLayout:
    """Permute routed rows so each local expert's rows are contiguous (grouped_contiguous input).

    Row order: experts in local id order; inside an expert, routes by increasing flat id.
    ``alignment=1`` gives unaligned offsets (as vLLM's ``moe_prepare_scatter``); a larger
    alignment pads every expert's block (padding rows zero, ``src_*`` -1). Non-local routes
    (``expert_map`` -1) are dropped. The row count is read back from the device once; with
    ``static_rows=True`` ``x`` instead has the host-known upper bound
    ``M*top_k + E_local*(alignment-1)`` rows and nothing is read back except, with an
    ``expert_map``, its local expert count.
    """
    fn = "contiguous_layout"
    _check_topk_ids(fn, topk_ids)
    _check_hidden(fn, hidden_states, topk_ids)
    _check_num_experts(fn, num_experts)
    if not checks.is_int(alignment) or alignment < 1 or alignment > _MAX_ALIGNMENT:
        raise ValueError(f"{checks.where(fn, 'alignment')} must be a positive int up to {_MAX_ALIGNMENT} (each expert "
                         f"gets up to alignment - 1 padding rows), got {alignment!r}")
    _check_expert_map(fn, expert_map, num_experts, topk_ids.device)
    if check_ids:
        _check_id_values(fn, topk_ids, num_experts, expert_map)
    n_local = _num_local_experts(fn, expert_map, num_experts)
    dev, top_k, t = topk_ids.device, int(topk_ids.shape[1]), topk_ids.numel()

    key = _local_keys(topk_ids, n_local, expert_map, drop_nonlocal=True)
    order, key_sorted, counts, rank = _group(key, n_local)
    padded = (counts + (alignment - 1)) // alignment * alignment
    offsets = torch.zeros(n_local + 1, dtype=torch.int64, device=dev)
    torch.cumsum(padded, 0, out=offsets[1:])
    rows = t + n_local * (alignment - 1) if static_rows else int(offsets[-1])

    starts = torch.cat((offsets[:-1], offsets.new_full((1,), rows)))
    dest = torch.where(key_sorted < n_local, starts[key_sorted] + rank, rows)
    src_slot = torch.full((rows + 1,), -1, dtype=torch.int64, device=dev)
    src_slot.scatter_(0, dest, order)
    src_slot = src_slot[:rows]
    src_token = torch.where(src_slot >= 0, src_slot // top_k, -1)
    x = hidden_states.new_zeros((rows + 1, hidden_states.shape[1]))
    x.index_copy_(0, dest, hidden_states[order // top_k])  # dropped routes land on the spare row
    x = x[:rows]
    return ContiguousLayout(x=x, expert_offsets=offsets, src_token=src_token, src_slot=src_slot, alignment=alignment)


def masked_layout(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    max_rows: int | None = None,
    expert_map: torch.Tensor | None = None,
    *,
    check_ids: bool = True,
) -> MaskedLayout:
    """Scatter routed rows into ``[E_local, max_rows, K]`` (grouped_masked input).

    ``max_rows`` defaults to the largest per-expert count (at least 1; read back from the
    device). A given ``max_rows`` smaller than some expert's count raises ``ValueError``
    (checked with one device reduction unless ``check_ids=False`` or during graph capture;
    unchecked overflow rows are dropped, never written into another expert).
    """
    fn = "masked_layout"
    _check_topk_ids(fn, topk_ids)
    _check_hidden(fn, hidden_states, topk_ids)
    _check_num_experts(fn, num_experts)
    if max_rows is not None and (not checks.is_int(max_rows) or max_rows < 1):
        raise ValueError(f"{checks.where(fn, 'max_rows')} must be a positive int or None, got {max_rows!r}")
    if max_rows is not None and max_rows > max(topk_ids.numel(), _MAX_SPARE_ROWS):
        raise ValueError(
            f"{checks.where(fn, 'max_rows')} must be <= max(M * top_k, {_MAX_SPARE_ROWS}) = "
            f"{max(topk_ids.numel(), _MAX_SPARE_ROWS)} (an expert receives at most the M * top_k = {topk_ids.numel()} "
            f"routes; up to {_MAX_SPARE_ROWS} rows are allowed for a fixed-shape buffer), got {max_rows}"
        )
    _check_expert_map(fn, expert_map, num_experts, topk_ids.device)
    if check_ids:
        _check_id_values(fn, topk_ids, num_experts, expert_map)
    n_local = _num_local_experts(fn, expert_map, num_experts)
    dev, top_k, k = topk_ids.device, int(topk_ids.shape[1]), int(hidden_states.shape[1])

    key = _local_keys(topk_ids, n_local, expert_map, drop_nonlocal=True)
    order, key_sorted, counts, rank = _group(key, n_local)
    largest = int(counts.max()) if (max_rows is None or (check_ids and not _capturing(counts))) and n_local else 0
    if max_rows is None:
        max_rows = max(1, largest)
    elif largest > max_rows:
        raise ValueError(f"{checks.where(fn, 'max_rows')} = {max_rows} is smaller than the largest expert count {largest}")

    cap = n_local * max_rows
    ok = (key_sorted < n_local) & (rank < max_rows)
    dest = torch.where(ok, key_sorted * max_rows + rank, cap)
    src_slot = torch.full((cap + 1,), -1, dtype=torch.int64, device=dev)
    src_slot.scatter_(0, dest, order)
    src_slot = src_slot[:cap].view(n_local, max_rows)
    x = hidden_states.new_zeros((cap + 1, k))
    x.index_copy_(0, dest, hidden_states[order // top_k])  # dropped routes land on the spare row
    x = x[:cap].view(n_local, max_rows, k)
    return MaskedLayout(x=x, expert_num_tokens=counts.clamp(max=max_rows).to(torch.int32), src_slot=src_slot)


# --------------------------------------------------------------------------------------
# gather back
# --------------------------------------------------------------------------------------


def _unpermute(fn: str, out_rows: torch.Tensor, src_slot: torch.Tensor, topk_weights: Any, num_tokens: Any) -> torch.Tensor:
    if not isinstance(topk_weights, torch.Tensor) or not topk_weights.dtype.is_floating_point:
        raise TypeError(f"{checks.where(fn, 'topk_weights')} must be a floating-point torch.Tensor")
    if topk_weights.dim() != 2:
        raise ValueError(f"{checks.where(fn, 'topk_weights')} must be 2-D [M, top_k], got shape {tuple(topk_weights.shape)}")
    if not checks.is_int(num_tokens) or num_tokens != topk_weights.shape[0]:
        raise ValueError(
            f"{checks.where(fn, 'num_tokens')} must equal topk_weights.shape[0] = {topk_weights.shape[0]}, got {num_tokens!r}"
        )
    if out_rows.device != src_slot.device or topk_weights.device != src_slot.device:
        raise ValueError(f"{fn}: 'out_rows', 'layout' and 'topk_weights' must be on the same device")
    top_k = int(topk_weights.shape[1])
    t = num_tokens * top_k
    n = out_rows.shape[-1]
    rows = out_rows.reshape(-1, n)
    slots = src_slot.reshape(-1)
    if rows.shape[0] != slots.shape[0]:
        raise ValueError(f"{checks.where(fn, 'out_rows')} has {rows.shape[0]} rows, the layout has {slots.shape[0]}")
    # inverse permutation: row of each flat route (-1 = not routed here)
    inv = torch.full((t + 1,), -1, dtype=torch.int64, device=slots.device)
    inv.scatter_(0, torch.where(slots >= 0, slots, t), torch.arange(slots.shape[0], device=slots.device))
    inv = inv[:t].view(num_tokens, top_k)
    if rows.shape[0] == 0:
        return torch.zeros(num_tokens, n, dtype=torch.float32, device=rows.device)
    gathered = rows[inv.clamp(min=0)].float()  # [M, top_k, N]
    w = torch.where(inv >= 0, topk_weights.float(), 0.0).unsqueeze(-1)
    gathered = torch.where(inv.unsqueeze(-1) >= 0, gathered * w, 0.0)
    out = torch.zeros(num_tokens, n, dtype=torch.float32, device=rows.device)
    for j in range(top_k):  # fixed summation order j = 0..top_k-1 (deterministic)
        out += gathered[:, j]
    return out


def unpermute_contiguous(
    out_rows: torch.Tensor, layout: ContiguousLayout, topk_weights: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """float32 ``[num_tokens, N]``: ``sum_j topk_weights[t, j] * out_rows[row of (t, j)]``.

    ``out_rows`` ``[rows, N]`` is the kernel output over ``layout``'s rows; padding rows and
    non-local routes contribute nothing (their values, NaN included, are never read into the sum).
    """
    fn = "unpermute_contiguous"
    if not isinstance(layout, ContiguousLayout):
        raise TypeError(f"{checks.where(fn, 'layout')} must be a ContiguousLayout, got {type(layout).__name__}")
    if not isinstance(out_rows, torch.Tensor) or out_rows.dim() != 2:
        raise ValueError(f"{checks.where(fn, 'out_rows')} must be a 2-D tensor [rows, N]")
    return _unpermute(fn, out_rows, layout.src_slot, topk_weights, num_tokens)


def unpermute_masked(
    out: torch.Tensor, layout: MaskedLayout, topk_weights: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """float32 ``[num_tokens, N]`` weighted top-k sum from a masked output ``[E_local, max_rows, N]``."""
    fn = "unpermute_masked"
    if not isinstance(layout, MaskedLayout):
        raise TypeError(f"{checks.where(fn, 'layout')} must be a MaskedLayout, got {type(layout).__name__}")
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(layout.src_slot.shape):
        raise ValueError(
            f"{checks.where(fn, 'out')} must be a 3-D tensor [{layout.num_experts}, {layout.max_rows}, N]"
        )
    return _unpermute(fn, out, layout.src_slot, topk_weights, num_tokens)


# --------------------------------------------------------------------------------------
# suite routings
# --------------------------------------------------------------------------------------


def balanced_topk_ids(
    num_tokens: int, num_experts: int, top_k: int, tok_e: int, seed: int = 0, *, device: Any = None
) -> torch.Tensor:
    """int32 ``[num_tokens, top_k]``: distinct experts per token, every expert exactly ``tok_e`` rows.

    Needs ``num_tokens * top_k == num_experts * tok_e`` (the suite's EP8 rule
    ``M = tok_e * 48 / 8``) and ``top_k <= num_experts``. Construction: the ``E * tok_e``
    routes, grouped in runs per expert (experts in random order), are dealt round-robin over
    the tokens (route ``i`` to token ``i % M``); every run has ``tok_e <= M`` routes, so no
    token gets an expert twice. Then 16 rounds of random count- and distinctness-preserving
    expert swaps between disjoint token pairs decorrelate the experts of a token, and each
    token's slot order is shuffled. All draws come from a CPU ``torch.Generator`` seeded by
    ``seed``, so the routing is identical on every machine.
    """
    fn = "balanced_topk_ids"
    for name, v in (("num_tokens", num_tokens), ("num_experts", num_experts), ("top_k", top_k), ("tok_e", tok_e)):
        if not checks.is_int(v) or v < 1:
            raise ValueError(f"{checks.where(fn, name)} must be a positive int, got {v!r}")
    if top_k > num_experts:
        raise ValueError(f"{checks.where(fn, 'top_k')} = {top_k} exceeds num_experts = {num_experts}")
    _check_num_experts(fn, num_experts)
    if num_tokens * top_k > checks.MAX_INT32:
        raise ValueError(f"{checks.where(fn, 'num_tokens')} * top_k must be <= 2^31 - 1 (route ids are int32), got "
                         f"{num_tokens} * {top_k}")
    if num_tokens * top_k != num_experts * tok_e:
        raise ValueError(
            f"{checks.where(fn, 'num_tokens')}: num_tokens * top_k ({num_tokens * top_k}) must equal "
            f"num_experts * tok_e ({num_experts * tok_e})"
        )
    g = torch.Generator().manual_seed(int(seed))
    experts = torch.randperm(num_experts, generator=g).repeat_interleave(tok_e)  # expert runs
    ids = experts.view(top_k, num_tokens).t().contiguous()  # route i -> token i % M, slot i // M
    # Decorrelate: rounds of random expert swaps between disjoint token pairs; a swap is kept
    # only when neither token already holds the incoming expert (counts and distinctness stay).
    half = num_tokens // 2
    for _ in range(_BALANCED_SWAP_ROUNDS if half else 0):
        perm = torch.randperm(num_tokens, generator=g)
        a, b = perm[:half], perm[half : 2 * half]
        sa = torch.randint(top_k, (half,), generator=g)
        sb = torch.randint(top_k, (half,), generator=g)
        ea, eb = ids[a, sa], ids[b, sb]
        ok = ~((ids[a] == eb[:, None]).any(1) | (ids[b] == ea[:, None]).any(1))
        ids[a[ok], sa[ok]] = eb[ok]
        ids[b[ok], sb[ok]] = ea[ok]
    slot_perm = torch.argsort(torch.rand(num_tokens, top_k, generator=g), dim=1)
    ids = torch.gather(ids, 1, slot_perm)
    return ids.to(torch.int32).to(device) if device is not None else ids.to(torch.int32)


def random_topk_ids(
    num_tokens: int, num_experts: int, top_k: int, seed: int | None = None, *, device: Any = None
) -> torch.Tensor:
    """int32 ``[num_tokens, top_k]``: top-k of i.i.d. standard-normal scores per token (TP8 rule).

    ``seed`` defaults to ``num_tokens`` (the suite seeds by M). Scores are drawn on the CPU
    from a ``torch.Generator`` so the routing is identical on every machine.
    """
    fn = "random_topk_ids"
    for name, v in (("num_tokens", num_tokens), ("num_experts", num_experts), ("top_k", top_k)):
        if not checks.is_int(v) or v < (0 if name == "num_tokens" else 1):
            raise ValueError(f"{checks.where(fn, name)} must be a {'non-negative' if name == 'num_tokens' else 'positive'} int, got {v!r}")
    if top_k > num_experts:
        raise ValueError(f"{checks.where(fn, 'top_k')} = {top_k} exceeds num_experts = {num_experts}")
    _check_num_experts(fn, num_experts)
    if num_tokens * top_k > checks.MAX_INT32:
        raise ValueError(f"{checks.where(fn, 'num_tokens')} * top_k must be <= 2^31 - 1 (route ids are int32), got "
                         f"{num_tokens} * {top_k}")
    g = torch.Generator().manual_seed(int(num_tokens if seed is None else seed))
    scores = torch.randn(num_tokens, num_experts, generator=g)
    ids = torch.topk(scores, top_k, dim=1).indices.to(torch.int32)
    return ids.to(device) if device is not None else ids
