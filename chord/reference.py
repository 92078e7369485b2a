"""float32 torch reference of every Chord op: the oracle of tests, benchmarks and notebooks.

Every function computes in float32 from the exact dequantized weight (``q * scale``) and
returns float32. Output rows that the op must not write are NaN, so a test can tell a row
a kernel wrote by mistake from a row it left alone (poison the kernel's output buffer, then
compare only where the reference is finite and check the rest kept the poison).

Weights are passed as ``q`` int8 ``[E, N, K]`` + ``scales`` bf16 ``[E, N, K/32]`` (or one
``QuantizedExperts`` for both); they are dequantized one expert at a time.
"""

from __future__ import annotations

from typing import Any

import torch

from chord import checks
import torch.nn.functional as F

from chord.formats import QuantizedExperts, dequantize
from chord.routing import IndexedRouting

__all__ = [
    "gemm_ref",
    "indexed_gemm_ref",
    "contiguous_gemm_ref",
    "masked_gemm_ref",
    "silu_and_mul_ref",
    "moe_ref",
]


def _weights(fn: str, q: Any, scales: Any) -> QuantizedExperts:
    if isinstance(q, QuantizedExperts):
        if scales is not None:
            raise ValueError(f"{checks.where(fn, 'scales')} must be None when q is a QuantizedExperts")
        return q
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"{checks.where(fn, 'q')} must be an int8 tensor or a QuantizedExperts, got {type(q).__name__}")
    if scales is None:
        raise TypeError(f"{checks.where(fn, 'scales')} is required when q is a tensor")
    return QuantizedExperts(q, scales)  # validates dtypes and shapes


def _check_x(fn: str, name: str, x: Any, ndim: int, k: int, device: torch.device) -> None:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"{checks.where(fn, name)} must be a floating-point torch.Tensor")
    if x.dim() != ndim or x.shape[-1] != k:
        raise ValueError(f"{checks.where(fn, name)} must be {ndim}-D with K = {k} in its last dim, got shape {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{checks.where(fn, name)} ({x.device}) and the weights ({device}) must be on the same device")


def gemm_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 ``x [rows, K] @ w[N, K]^T`` -> ``[rows, N]``."""
    fn = "gemm_ref"
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{checks.where(fn, name)} must be a floating-point torch.Tensor")
        if t.dim() != 2:
            raise ValueError(f"{checks.where(fn, name)} must be 2-D, got shape {tuple(t.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"{checks.where(fn, 'w')} must have K = {x.shape[1]} (x's last dim), got shape {tuple(w.shape)}")
    return x.float() @ w.float().t()


def indexed_gemm_ref(
    x: torch.Tensor,
    q: torch.Tensor | QuantizedExperts,
    scales: torch.Tensor | None,
    routing: IndexedRouting,
    top_k: int,
    n_out_rows: int | None = None,
) -> torch.Tensor:
    """The indexed op (``chord::gemm_indexed``) in float32.

    For every block ``b`` with ``b * block_m < num_tokens_post_padded`` and
    ``expert_ids[b] != -1``, and every id ``i = sorted_ids[b*block_m + r]`` with
    ``i < x.shape[0] * top_k`` (anything else is padding):
    ``out[i] = x[i // top_k] @ W[expert_ids[b]]^T``. gate_up passes the routing's top_k and
    ``x [M, K]``; down passes ``top_k=1`` and ``x [M*top_k, I]``. ``out`` has ``n_out_rows``
    rows (default ``x.shape[0] * top_k``); rows never written are NaN. Reads the routing's
    device scalars on the host (it is a reference, not a kernel).
    """
    fn = "indexed_gemm_ref"
    w = _weights(fn, q, scales)
    if not isinstance(routing, IndexedRouting):
        raise TypeError(f"{checks.where(fn, 'routing')} must be an IndexedRouting, got {type(routing).__name__}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"{checks.where(fn, 'top_k')} must be a positive int, got {top_k!r}")
    _check_x(fn, "x", x, 2, w.k, w.device)
    valid_limit = x.shape[0] * top_k
    if n_out_rows is None:
        n_out_rows = valid_limit
    if isinstance(n_out_rows, bool) or not isinstance(n_out_rows, int) or n_out_rows < valid_limit:
        raise ValueError(f"{checks.where(fn, 'n_out_rows')} must be an int >= x.shape[0] * top_k = {valid_limit}, got {n_out_rows!r}")
    if routing.sorted_ids.device != w.device:
        raise ValueError(f"{fn}: 'routing' ({routing.sorted_ids.device}) and the weights ({w.device}) must be on the same device")

    bm = routing.block_m
    used = int(routing.num_tokens_post_padded.reshape(-1)[0])
    nb = min(-(-used // bm), routing.expert_ids.shape[0])
    ids = routing.sorted_ids[: nb * bm].long()
    ids = torch.nn.functional.pad(ids, (0, nb * bm - ids.shape[0]), value=valid_limit).view(nb, bm)
    experts = routing.expert_ids[:nb].long().unsqueeze(1).expand(nb, bm)
    live = (ids >= 0) & (ids < valid_limit) & (experts >= 0)
    if bool((experts[live] >= w.num_experts).any()):
        raise ValueError(f"{checks.where(fn, 'routing')} has expert ids >= the weights' {w.num_experts} experts")
    rows, row_expert = ids[live], experts[live]

    out = torch.full((n_out_rows, w.n), float("nan"), dtype=torch.float32, device=w.device)
    for e in torch.unique(row_expert).tolist():
        sel = rows[row_expert == e]
        out[sel] = x[sel // top_k].float() @ dequantize(w.q[e], w.scales[e]).t()
    return out


def contiguous_gemm_ref(
    x: torch.Tensor,
    q: torch.Tensor | QuantizedExperts,
    scales: torch.Tensor | None,
    expert_offsets: torch.Tensor,
) -> torch.Tensor:
    """The grouped-contiguous op in float32: rows ``[off[e], off[e+1])`` of ``x [rows, K]`` use
    expert ``e``; output ``[rows, N]``, rows at or past ``off[E]`` NaN."""
    fn = "contiguous_gemm_ref"
    w = _weights(fn, q, scales)
    _check_x(fn, "x", x, 2, w.k, w.device)
    if not isinstance(expert_offsets, torch.Tensor) or expert_offsets.dtype != torch.int64:
        raise TypeError(f"{checks.where(fn, 'expert_offsets')} must be an int64 tensor [E+1]")
    if tuple(expert_offsets.shape) != (w.num_experts + 1,):
        raise ValueError(f"{checks.where(fn, 'expert_offsets')} must have shape [{w.num_experts + 1}], got {tuple(expert_offsets.shape)}")
    off = expert_offsets.tolist()
    if off[0] != 0 or any(b < a for a, b in zip(off, off[1:])) or off[-1] > x.shape[0]:
        raise ValueError(f"{checks.where(fn, 'expert_offsets')} must rise from 0 to at most {x.shape[0]}, got {off}")
    out = torch.full((x.shape[0], w.n), float("nan"), dtype=torch.float32, device=w.device)
    for e in range(w.num_experts):
        if off[e + 1] > off[e]:
            out[off[e] : off[e + 1]] = x[off[e] : off[e + 1]].float() @ dequantize(w.q[e], w.scales[e]).t()
    return out


def masked_gemm_ref(
    x: torch.Tensor,
    q: torch.Tensor | QuantizedExperts,
    scales: torch.Tensor | None,
    expert_num_tokens: torch.Tensor,
) -> torch.Tensor:
    """The grouped-masked op in float32: ``x [E, max_rows, K]`` -> ``[E, max_rows, N]`` where only
    the first ``expert_num_tokens[e]`` rows of expert ``e`` are computed; the rest are NaN."""
    fn = "masked_gemm_ref"
    w = _weights(fn, q, scales)
    _check_x(fn, "x", x, 3, w.k, w.device)
    if x.shape[0] != w.num_experts:
        raise ValueError(f"{checks.where(fn, 'x')} must have E = {w.num_experts} experts in dim 0, got shape {tuple(x.shape)}")
    if not isinstance(expert_num_tokens, torch.Tensor) or expert_num_tokens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{checks.where(fn, 'expert_num_tokens')} must be an int32 tensor [E]")
    if tuple(expert_num_tokens.shape) != (w.num_experts,):
        raise ValueError(f"{checks.where(fn, 'expert_num_tokens')} must have shape [{w.num_experts}], got {tuple(expert_num_tokens.shape)}")
    counts = expert_num_tokens.tolist()
    if any(c < 0 or c > x.shape[1] for c in counts):
        raise ValueError(f"{checks.where(fn, 'expert_num_tokens')} must lie in [0, max_rows = {x.shape[1]}], got {counts}")
    out = torch.full((*x.shape[:2], w.n), float("nan"), dtype=torch.float32, device=w.device)
    for e, c in enumerate(counts):
        if c:
            out[e, :c] = x[e, :c].float() @ dequantize(w.q[e], w.scales[e]).t()
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """vLLM's SiLU-GLU on a w13 output ``[..., 2I]``: first half gate, second half up;
    returns float32 ``silu(gate) * up`` ``[..., I]``."""
    fn = "silu_and_mul_ref"
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"{checks.where(fn, 'x')} must be a floating-point torch.Tensor")
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"{checks.where(fn, 'x')} must have an even last dim [..., 2I], got shape {tuple(x.shape)}")
    gate, up = x.float().chunk(2, dim=-1)
    return F.silu(gate) * up


def moe_ref(
    hidden_states: torch.Tensor,
    w13: QuantizedExperts,
    w2: QuantizedExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    *,
    bf16_intermediates: bool = False,
) -> torch.Tensor:
    """Full MoE layer in float32: ``out[t] = sum_j w[t,j] * W2[e] @ silu_and_mul(W13[e] @ x[t])``
    with ``e = topk_ids[t, j]`` (mapped through ``expert_map``; routes to -1 experts, and -1
    ids, contribute nothing). ``w13`` is ``[E_local, 2I, K]`` (gate rows then up rows), ``w2``
    ``[E_local, K, I]``. ``bf16_intermediates=True`` rounds the gate_up output and the
    activation to bf16 the way the kernel pipeline stores them. Returns ``[M, K]`` float32.
    """
    fn = "moe_ref"
    if not isinstance(w13, QuantizedExperts) or not isinstance(w2, QuantizedExperts):
        raise TypeError(f"{checks.where(fn, 'w13')} and w2 must be QuantizedExperts, got {type(w13).__name__} and {type(w2).__name__}")
    e_local, k = w13.num_experts, w13.k
    if w13.n % 2:
        raise ValueError(f"{checks.where(fn, 'w13')} must have an even N = 2I, got {w13.n}")
    if (w2.num_experts, w2.n, w2.k) != (e_local, k, w13.n // 2):
        raise ValueError(
            f"{checks.where(fn, 'w2')} must have shape [E, K, I] = {[e_local, k, w13.n // 2]}, got {[w2.num_experts, w2.n, w2.k]}"
        )
    _check_x(fn, "hidden_states", hidden_states, 2, k, w13.device)
    m = hidden_states.shape[0]
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{checks.where(fn, 'topk_ids')} must be an int32/int64 tensor [M, top_k]")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m:
        raise ValueError(f"{checks.where(fn, 'topk_ids')} must have shape [M={m}, top_k], got {tuple(topk_ids.shape)}")
    if not isinstance(topk_weights, torch.Tensor) or not topk_weights.dtype.is_floating_point:
        raise TypeError(f"{checks.where(fn, 'topk_weights')} must be a floating-point tensor [M, top_k]")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"{checks.where(fn, 'topk_weights')} must have shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}")

    ids = topk_ids.long()
    if expert_map is not None:
        if not isinstance(expert_map, torch.Tensor) or expert_map.dim() != 1:
            raise TypeError(f"{checks.where(fn, 'expert_map')} must be a 1-D int tensor or None")
        ids = torch.where(ids >= 0, expert_map.long()[ids.clamp(min=0)], -1)
    if ids.numel() and (int(ids.max()) >= e_local or int(ids.min()) < -1):
        raise ValueError(f"{checks.where(fn, 'topk_ids')} routes to experts outside [0, {e_local}) after expert_map")

    x = hidden_states.float()
    out = torch.zeros(m, k, dtype=torch.float32, device=x.device)
    flat = ids.reshape(-1)
    weights = topk_weights.float().reshape(-1)
    top_k = ids.shape[1]
    for e in torch.unique(flat[flat >= 0]).tolist():
        slots = torch.nonzero(flat == e).squeeze(1)
        tokens = slots // top_k
        h = x[tokens] @ dequantize(w13.q[e], w13.scales[e]).t()
        if bf16_intermediates:
            h = h.bfloat16().float()
        a = silu_and_mul_ref(h)
        if bf16_intermediates:
            a = a.bfloat16().float()
        y = a @ dequantize(w2.q[e], w2.scales[e]).t()
        out.index_add_(0, tokens, y * weights[slots].unsqueeze(1))
    return out
