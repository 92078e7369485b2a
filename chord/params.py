"""The GemmParams block (csrc/common/params.cuh) every kernel takes by value: its layout, once.

Kept apart from chord.jit (which static_asserts these offsets and this size in every rendered
kernel) and chord.launch (whose plans keep the packed block and the offsets of the pointers a
repeated call rewrites), so that neither imports the other for it. Imports nothing of chord.
"""
from __future__ import annotations

import struct

# 8 pointers, 8 int64, 2 pointers
GEMM_PARAMS = struct.Struct("<8Q8q2Q")
_GEMM_FIELDS = ("x", "qweight", "scales", "out", "sorted_ids", "expert_ids", "num_tokens_post_padded",
                "expert_layout", "n", "k", "num_experts", "top_k", "num_valid_ids", "num_blocks", "max_rows",
                "rows", "workspace", "counters")


def gemm_params_offsets() -> dict:
    """Byte offset of every GemmParams field in the packed block (8-byte fields, in order)."""
    return {name: 8 * i for i, name in enumerate(_GEMM_FIELDS)}


def pack_gemm_params(*, x: int, qweight: int, scales: int, out: int, sorted_ids: int = 0, expert_ids: int = 0,
                     num_tokens_post_padded: int = 0, expert_layout: int = 0, n: int, k: int, num_experts: int,
                     top_k: int = 1, num_valid_ids: int = 0, num_blocks: int = 0, max_rows: int = 0,
                     rows: int = 0, workspace: int = 0, counters: int = 0) -> bytes:
    return GEMM_PARAMS.pack(x, qweight, scales, out, sorted_ids, expert_ids, num_tokens_post_padded, expert_layout,
                            n, k, num_experts, top_k, num_valid_ids, num_blocks, max_rows, rows, workspace, counters)
