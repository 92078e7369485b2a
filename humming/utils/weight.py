"""``humming.utils.weight.quantize_weight``: quantize a float weight the way Chord serves it.

Only symmetric 4-bit integer weights with bf16 scales in groups of 32 along K are produced
(chord.formats.quantize_int4_g32 does the work); other requests raise
:class:`humming.errors.ChordUnsupportedError`.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from humming import _chord, dtypes
from humming.errors import ChordUnsupportedError

__all__ = ["quantize_weight"]


def quantize_weight(
    weight: torch.Tensor,
    dtype: Any,
    scale_dtype: Any,
    group_size: int,
    group_size_n: Optional[int] = None,
    has_zero_point: bool = False,
    weight_scale_2_type: Optional[str] = None,
    is_fp_zero_point: bool = False,
    pack: bool = False,
    allow_negative_scale: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, None, None]:
    """float weight ``[(E,) N, K]`` -> ``(weight, weight_scale, None, None)``.

    ``weight``: with ``pack=True`` int32 ``[(E,) N, K/8]`` native Humming uint4 words (code q+8,
    least significant nibble first); otherwise int32 codes ``q + 8`` in [0, 15], ``[(E,) N, K]``.
    ``weight_scale``: ``[(E,) N, K/32]`` in ``scale_dtype`` (bf16 by default). The weight is
    ``(code - 8) * scale``.
    """
    b = dtypes.DataType.from_any(dtype)
    if b not in (dtypes.uint4, dtypes.int4):
        raise ChordUnsupportedError(f"Quantizing weights to {b}")
    if has_zero_point or is_fp_zero_point:
        raise ChordUnsupportedError("Quantizing weights with zero points")
    if weight_scale_2_type not in (None, "none"):
        raise ChordUnsupportedError(f"Quantizing weights with a secondary {weight_scale_2_type} scale")
    if group_size_n not in (None, 0, 1):
        raise ChordUnsupportedError(f"Quantizing weights with {group_size_n}-row scale blocks")
    if group_size != 32:
        raise ChordUnsupportedError(f"Quantizing weights with scale group size {group_size}",
                                    "Chord quantizes with group_size=32.")
    s_dtype = dtypes.bfloat16 if scale_dtype is None else dtypes.DataType.from_any(scale_dtype)
    if s_dtype not in (dtypes.bfloat16, dtypes.float16, dtypes.float32):
        raise ChordUnsupportedError(f"Quantizing weights with {s_dtype} scales")
    if weight.dim() not in (2, 3):
        raise ValueError(f"quantize_weight: weight must be [N, K] or [E, N, K], got {tuple(weight.shape)}")
    q, scales = _chord.quantize_g32(weight)
    codes = _chord.pack_words(q) if pack else (q.to(torch.int32) + 8)
    if weight.dim() == 2:
        codes, scales = codes[0], scales[0]
    return codes, scales.to(s_dtype.to_torch_dtype()), None, None
