"""The three raw GEMM contracts on chord.reference, for CPU-only CI runs.

Reached only through :func:`humming._chord.cpu_reference_backend` on a machine without a CUDA
device: same arguments and the same writes as ``torch.ops.chord.gemm_*`` (chord's float32
reference of each op, rounded to bf16; rows the op must not write are left untouched), so the
vLLM call sequence can be checked end to end before the GPU run. Unlike the kernels it reads
routing tensors on the host, which is fine on CPU and is why it never runs on a GPU machine.
"""
from __future__ import annotations

import torch

from humming import _chord


def _write(out: torch.Tensor, ref: torch.Tensor) -> None:
    written = ~torch.isnan(ref).all(dim=-1)
    out[written] = ref[written].to(out.dtype)


def gemm_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, out, top_k: int,
                 block_m: int) -> None:
    ref = _chord.reference_indexed(x, qweight, scales, sorted_ids, expert_ids, num_tokens_post_padded, top_k,
                                   block_m, n_out_rows=out.shape[0])
    _write(out, ref)


def gemm_contiguous(x, qweight, scales, expert_offsets, out) -> None:
    _write(out[: x.shape[0]], _chord.reference_contiguous(x, qweight, scales, expert_offsets))


def gemm_masked(x, qweight, scales, expert_num_tokens, out) -> None:
    e = qweight.shape[0]
    x3 = x.reshape(e, -1, x.shape[-1])
    _write(out.view(e, x3.shape[1], -1), _chord.reference_masked(x3, qweight, scales, expert_num_tokens))
