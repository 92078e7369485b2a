"""Load-time repack: native Humming uint4 tensors -> Chord's ``swap16g`` kernel layout.

:func:`prepare_and_transform_humming_tensors` is called once per layer (w13 and w2 of each MoE
layer) by vLLM after the checkpoint tensors were converted to the native Humming schema. It

* checks that the layer is W4A16 as Chord serves it (else :class:`ChordUnsupportedError`);
* pads N and K to vLLM's multiples (256 and 128 for MoE), and further to the layout's 16/64
  if a caller asks for less, with zero weights and zero scales, so the unpadded part of every
  result is exact;
* expands the scales to Chord's group of 32 (a group that is a multiple of 32 repeats its
  scale; a per-channel scale repeats along K: both exact), rounds fp16/fp32 scales to bf16;
* repacks with chord.formats on the weights' device and returns the ``LayerConfig`` plus
  ``{"weight": qweight int32 [E, N/16/G, K/64, G, 32, 4], "weight_scale": bf16 [E, N/16/G, K/64, G, 8, 2, 2]}``
  (``G = chord.formats.tile_group(N)``)
  (a dense layer is packed as one expert).
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from humming import _chord, dtypes
from humming.config import LayerConfig, WeightScaleType
from humming.errors import ChordUnsupportedError
from humming.schema.base import BaseInputSchema, BaseWeightSchema
from humming.schema.humming import KERNEL_GROUP, HummingInputSchema, HummingWeightSchema, check_param_dtype

__all__ = ["prepare_and_transform_humming_tensors", "prepare_layer_config", "transform_humming_tensors"]

LAYOUT_N, LAYOUT_K = 16, 64
_ZERO_WORD = -0x77777778  # 0x88888888: eight nibbles of code 8, i.e. q = 0


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _as_humming_schemas(weight_schema: Any, input_schema: Any, tensors: dict, shape_n: int, shape_k: int,
                        num_experts: int | None, torch_dtype: torch.dtype):
    if not isinstance(weight_schema, HummingWeightSchema):
        if not isinstance(weight_schema, BaseWeightSchema):
            raise TypeError(f"weight_schema must be a humming weight schema, got {type(weight_schema).__name__}")
        weight_schema, tensors = weight_schema.convert_humming(tensors, [shape_n], [shape_k], torch_dtype,
                                                               num_experts=num_experts)
    if input_schema is None:
        input_schema = HummingInputSchema()
    elif not isinstance(input_schema, HummingInputSchema):
        if not isinstance(input_schema, BaseInputSchema):
            raise TypeError(f"input_schema must be a humming input schema, got {type(input_schema).__name__}")
        input_schema = input_schema.to_humming_schema(torch_dtype)
    return weight_schema, input_schema, tensors


def prepare_layer_config(shape_n: int, shape_k: int, weight_schema: HummingWeightSchema,
                         input_schema: HummingInputSchema | None = None, num_experts: int | None = None,
                         pad_n_to_multiple: int = 1, pad_k_to_multiple: int = 1, has_bias: bool = False,
                         torch_dtype: torch.dtype | None = None, device: Any = None, **_: Any) -> LayerConfig:
    """The LayerConfig of a layer (no tensors touched)."""
    torch_dtype = torch.bfloat16 if torch_dtype is None else torch_dtype
    check_param_dtype(torch_dtype)
    if has_bias:
        raise ChordUnsupportedError("A layer with bias (e.g. gpt-oss expert bias)")
    for name, v in (("shape_n", shape_n), ("shape_k", shape_k)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"prepare_and_transform_humming_tensors: {name} must be a positive int, got {v!r}")
    for name, v in (("pad_n_to_multiple", pad_n_to_multiple), ("pad_k_to_multiple", pad_k_to_multiple)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"prepare_and_transform_humming_tensors: {name} must be a positive int, got {v!r}")
    group = weight_schema.group_size_for(shape_k)
    if weight_schema.weight_scale_type is WeightScaleType.GROUP and shape_k % group:
        raise ValueError(f"prepare_and_transform_humming_tensors: shape_k={shape_k} is not a multiple of the "
                         f"scale group size {group}")
    kn = _round_up(shape_n, _lcm(pad_n_to_multiple, LAYOUT_N))
    kk = _round_up(shape_k, _lcm(pad_k_to_multiple, LAYOUT_K))
    return LayerConfig(
        shape_n=kn, shape_k=kk, pad_shape_n=kn - shape_n, pad_shape_k=kk - shape_k, num_experts=num_experts or 0,
        a_dtype=(input_schema.a_dtype if input_schema is not None and input_schema.a_dtype else dtypes.bfloat16),
        c_dtype=dtypes.DataType.from_torch_dtype(torch_dtype), bs_dtype=dtypes.bfloat16,
        input_quant_mode=input_schema.input_quant_mode if input_schema is not None else None,
        checkpoint_group_size=group if weight_schema.weight_scale_type is WeightScaleType.GROUP else 0,
    )


def _bf16_scales(scale: torch.Tensor) -> torch.Tensor:
    if scale.dtype == torch.bfloat16:
        return scale
    if scale.dtype not in (torch.float16, torch.float32):
        raise ChordUnsupportedError(f"Weight scales of dtype {scale.dtype}")
    out = scale.to(torch.bfloat16)
    if scale.numel() and not bool((out.to(scale.dtype) == scale).all()):
        rel = ((out.float() - scale.float()).abs() / scale.float().abs().clamp_min(1e-30)).max()
        warnings.warn(f"humming: {scale.dtype} weight scales rounded to bf16 for Chord's kernels (max relative "
                      f"change {float(rel):.2e})", stacklevel=4)
    return out


def transform_humming_tensors(config: LayerConfig, tensors: dict[str, torch.Tensor],
                              device: Any = None, **_: Any) -> dict[str, torch.Tensor]:
    """Native uint4 tensors of one layer -> Chord's swap16g tensors for `config`."""
    for name in ("zero_point", "weight_scale_2", "bias", "input_scale", "input_scale_2"):
        if name in tensors and tensors[name] is not None:
            raise ChordUnsupportedError(f"A layer with a {name!r} tensor")
    if "weight" not in tensors or "weight_scale" not in tensors:
        raise ValueError(f"prepare_and_transform_humming_tensors: tensors must hold 'weight' and 'weight_scale', "
                         f"got {sorted(tensors)}")
    n, k, e = config.n, config.k, config.kernel_experts
    words, scale = tensors["weight"], tensors["weight_scale"]
    if device is not None:
        words, scale = words.to(device), scale.to(device)
    if words.dtype != torch.int32:
        raise TypeError(f"weight must be int32 packed uint4 words, got {words.dtype}")
    want_rank = 3 if config.num_experts else 2
    if words.dim() != want_rank or scale.dim() != want_rank:
        raise ValueError(f"weight and weight_scale must be {want_rank}-D ({'[E, N, ...]' if config.num_experts else '[N, ...]'}), "
                         f"got {tuple(words.shape)} and {tuple(scale.shape)}")
    if want_rank == 2:
        words, scale = words.unsqueeze(0), scale.unsqueeze(0)
    if tuple(words.shape) != (e, n, -(-k // 8)):
        raise ValueError(f"weight must have shape {(e, n, -(-k // 8))} (experts, N, K/8), got {tuple(words.shape)}")
    g = config.checkpoint_group_size  # 0: per channel
    want_groups = 1 if g == 0 else k // g
    if tuple(scale.shape) != (e, n, want_groups):
        raise ValueError(f"weight_scale must have shape {(e, n, want_groups)} for "
                         f"{'per-channel scales' if g == 0 else f'group size {g}'} and K={k}, got {tuple(scale.shape)}")

    kn, kk = config.shape_n, config.shape_k
    scale = _bf16_scales(scale)
    # scales -> one per 32 K-elements of the padded K (padding weights are q = 0, so any scale is exact there)
    if g == 0:
        s32 = scale.expand(e, n, kk // KERNEL_GROUP)
    else:
        s32 = scale.repeat_interleave(g // KERNEL_GROUP, dim=-1)
        if kk > k:
            s32 = torch.nn.functional.pad(s32, (0, (kk - k) // KERNEL_GROUP))
    if kn > n:
        s32 = torch.nn.functional.pad(s32, (0, 0, 0, kn - n))
    s32 = s32.contiguous()

    if k % 8 == 0:
        if (kn, kk) != (n, k):
            padded = torch.full((e, kn, kk // 8), _ZERO_WORD, dtype=torch.int32, device=words.device)
            padded[:, :n, : k // 8] = words
            words = padded
        qweight, scales = _chord.pack_from_compressed(words.contiguous(), s32, kn, kk)
    else:  # K not a multiple of 8: the last word has filler nibbles, go through int8 codes
        q = torch.zeros((e, kn, kk), dtype=torch.int8, device=words.device)
        q[:, :n, :k] = _chord.unpack_words(words, k)
        qweight, scales = _chord.pack_codes(q, s32)
    return {"weight": qweight, "weight_scale": scales}


def prepare_and_transform_humming_tensors(
    tensors: dict[str, torch.Tensor],
    shape_n: int,
    shape_k: int,
    weight_schema: HummingWeightSchema,
    input_schema: HummingInputSchema | None = None,
    num_experts: int | None = None,
    pad_n_to_multiple: int = 1,
    pad_k_to_multiple: int = 1,
    has_bias: bool = False,
    torch_dtype: torch.dtype | None = None,
    device: Any = None,
    allow_inplace: bool = False,
) -> tuple[LayerConfig, dict[str, torch.Tensor]]:
    """(LayerConfig, kernel tensors) for one layer; see the module docstring."""
    torch_dtype = torch.bfloat16 if torch_dtype is None else torch_dtype
    check_param_dtype(torch_dtype)
    tensors = {k: v for k, v in dict(tensors).items() if v is not None}
    weight_schema, input_schema, tensors = _as_humming_schemas(weight_schema, input_schema, tensors, shape_n, shape_k,
                                                               num_experts, torch_dtype)
    config = prepare_layer_config(shape_n, shape_k, weight_schema, input_schema, num_experts, pad_n_to_multiple,
                                  pad_k_to_multiple, has_bias or "bias" in tensors, torch_dtype, device)
    return config, transform_humming_tensors(config, tensors, device=device)
