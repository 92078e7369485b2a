"""Helpers shared by the tests, the benchmark and the tuner: random INT4 experts, poisoned
outputs, relative error and the bf16 tolerance.

Plain torch only (no kernels), so CPU tests import it too.
"""
from __future__ import annotations

import torch

from chord import formats

#: relative Frobenius error allowed for bf16 operands against the float32 reference; measured
#: ~2-3e-3 on every family and main loop.
BF16_TOL = 1e-2


def random_experts(e: int, n: int, k: int, seed: int = 0, device: str | torch.device = "cuda"
                   ) -> tuple[formats.QuantizedExperts, formats.PackedExperts]:
    """Random non-zero INT4 codes in [-8, 7] with bf16 group scales, and their packed form."""
    g = torch.Generator(device=device).manual_seed(1000 + seed)
    q = torch.randint(-8, 8, (e, n, k), dtype=torch.int8, device=device, generator=g)
    q[q == 0] = 1
    s = (torch.rand(e, n, k // 32, device=device, generator=g) * 0.02 + 0.002).to(torch.bfloat16)
    qe = formats.QuantizedExperts(q, s)
    return qe, formats.pack_experts(qe)


def poisoned(*shape: int, device: str | torch.device = "cuda") -> torch.Tensor:
    """A bf16 output buffer full of NaN: an element the kernel does not write stays NaN."""
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got − ref‖ / ‖ref‖ in float32; NaN in `got` (an unwritten element) fails at once."""
    if torch.isnan(got).any():
        raise AssertionError("NaN in the kernel output (unwritten rows?)")
    return ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical bf16 tensors (NaN patterns included)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))
