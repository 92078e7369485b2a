"""The three raw GEMM contracts on chord.reference, for CPU-only CI runs, and raw swap16g tensors
as chord.formats objects.

Reached through :mod:`humming._chord` (``cpu_reference_backend()`` on a machine without a CUDA
device, ``packed_experts`` / ``quantized_experts``); this module imports nothing of ``humming``,
so the two never import each other. The GEMMs take the same arguments and make the same writes
as ``torch.ops.chord.gemm_*`` (chord's float32 reference of each op, rounded to bf16; rows the
op must not write are left untouched), so the vLLM call sequence can be checked end to end
before the GPU run. Unlike the kernels they read routing tensors on the host, which is fine on
CPU and is why they never run on a GPU machine.
"""
from __future__ import annotations

import torch


def packed_experts(qweight, scales):
    """Wrap raw swap16g tensors as a chord.formats.PackedExperts."""
    from chord.formats import PackedExperts

    e, ng, kb, g = (int(d) for d in qweight.shape[:4])
    return PackedExperts(qweight, scales, e, ng * g * 16, kb * 64)


def quantized_experts(qweight, scales):
    """chord.formats.QuantizedExperts (int8 codes + bf16 group-32 scales) of raw swap16g tensors."""
    from chord.formats import unpack_experts

    return unpack_experts(packed_experts(qweight, scales))


# chord.reference (float32 oracle; rows an op must not write come back NaN)


def reference_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, top_k: int, block_m: int,
                      n_out_rows: int):
    from chord.reference import indexed_gemm_ref
    from chord.routing import IndexedRouting

    routing = IndexedRouting(sorted_ids, expert_ids, num_tokens_post_padded.reshape(1), block_m, top_k,
                             num_rows=x.shape[0] * top_k)
    return indexed_gemm_ref(x, quantized_experts(qweight, scales), None, routing, top_k, n_out_rows=n_out_rows)


def reference_contiguous(x, qweight, scales, expert_offsets):
    from chord.reference import contiguous_gemm_ref

    return contiguous_gemm_ref(x, quantized_experts(qweight, scales), None, expert_offsets)


def reference_masked(x3, qweight, scales, expert_num_tokens):
    from chord.reference import masked_gemm_ref

    return masked_gemm_ref(x3, quantized_experts(qweight, scales), None, expert_num_tokens)


def _write(out: torch.Tensor, ref: torch.Tensor) -> None:
    written = ~torch.isnan(ref).all(dim=-1)
    out[written] = ref[written].to(out.dtype)


def gemm_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k: int,
                 block_m: int) -> None:
    ref = reference_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, top_k, block_m,
                            n_out_rows=out.shape[0])
    _write(out, ref)


def gemm_contiguous(x, qweight, scales, expert_offsets, out) -> None:
    _write(out[: x.shape[0]], reference_contiguous(x, qweight, scales, expert_offsets))


def gemm_masked(x, qweight, scales, expert_num_tokens, out) -> None:
    e = qweight.shape[0]
    x3 = x.reshape(e, -1, x.shape[-1])
    _write(out.view(e, x3.shape[1], -1), reference_masked(x3, qweight, scales, expert_num_tokens))
