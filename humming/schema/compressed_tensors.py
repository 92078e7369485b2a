"""compressed-tensors checkpoints (``quant_method: compressed-tensors``): Kimi K2.x INT4.

Served: ``format: pack-quantized``, ``type: int``, ``num_bits: 4``, ``symmetric: true``,
``strategy: group`` with ``group_size`` a multiple of 32 (Kimi K2.x: 32), or
``strategy: channel``. Per checkpoint module: ``weight_packed`` int32 ``[N, K/8]``,
``weight_scale`` ``[N, K/group]`` (bf16 for Kimi), ``weight_shape`` int64 ``[2]``. The packed
words are already in the native Humming uint4 bit layout, so conversion is a rename.

Input-activation quantization of compressed-tensors (``CompressedTensorsInputSchema``) is not
served: creating that schema raises.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from humming import dtypes
from humming.config import WeightScaleType
from humming.errors import ChordUnsupportedError
from humming.schema.base import BaseWeightSchema, add_expert_dim, refused_input_schema
from humming.schema.humming import KERNEL_GROUP, HummingWeightSchema

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _value(v: Any) -> Any:
    return getattr(v, "value", v)  # QuantizationArgs enums (type, strategy, actorder) or plain strings


@dataclasses.dataclass(kw_only=True)
class CompressedTensorsWeightSchema(BaseWeightSchema):
    quant_method: str = "compressed-tensors"
    format: str = "pack-quantized"
    type: str = "int"
    num_bits: int = 4
    strategy: str = "group"
    symmetric: bool = True
    group_size: int | None = None
    block_structure: Any = None
    actorder: Any = None
    dynamic: Any = False

    def __post_init__(self) -> None:
        self.format = str(_value(self.format))
        self.type = str(_value(self.type))
        self.strategy = str(_value(self.strategy))
        self.actorder = _value(self.actorder)
        fmt = f"compressed-tensors format {self.format!r}"
        if self.format in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
            raise ChordUnsupportedError(f"{fmt} (FP4 weights)")
        if self.format in ("float-quantized", "int-quantized", "naive-quantized"):
            raise ChordUnsupportedError(f"{fmt} ({self.type}{self.num_bits} weights, e.g. FP8/INT8)")
        if self.format != "pack-quantized":
            raise ChordUnsupportedError(fmt)
        if self.type != "int" or self.num_bits != 4:
            raise ChordUnsupportedError(f"compressed-tensors pack-quantized {self.type}{self.num_bits} weights")
        if not self.symmetric:
            raise ChordUnsupportedError("compressed-tensors asymmetric int4 weights (weight_zero_point)")
        if self.dynamic not in (False, None):
            raise ChordUnsupportedError(f"compressed-tensors dynamic weight quantization (dynamic={self.dynamic!r})")
        if self.actorder not in (None, "weight", "static"):
            raise ChordUnsupportedError(f"compressed-tensors activation ordering actorder={self.actorder!r} "
                                        "(a weight_g_idx permutation)")
        if self.strategy == "group":
            g = self.group_size
            if not isinstance(g, int) or g <= 0 or g % KERNEL_GROUP:
                raise ChordUnsupportedError(f"compressed-tensors int4 group size {g!r}")
        elif self.strategy != "channel":
            raise ChordUnsupportedError(f"compressed-tensors int4 with strategy {self.strategy!r}")

    @property
    def weight_key(self) -> str:
        return "weight_packed"

    def get_tensors_attrs(self, shape_n: int, shape_k: int, param_dtype: "torch.dtype",
                          num_experts: int | None = None, has_bias: bool = False,
                          stack_size: int = 1) -> dict[str, dict[str, Any]]:
        import torch

        attrs: dict[str, dict[str, Any]] = {
            "weight_packed": {"shape": (shape_n, -(-shape_k // 8)), "dtype": torch.int32,
                              "extra_attrs": {"input_dim": 1, "output_dim": 0}},
        }
        if self.strategy == "group":
            attrs["weight_scale"] = {"shape": (shape_n, shape_k // self.group_size), "dtype": param_dtype,
                                     "extra_attrs": {"input_dim": 1, "output_dim": 0, "scale_type": "group"}}
        else:
            attrs["weight_scale"] = {"shape": (shape_n, 1), "dtype": param_dtype,
                                     "extra_attrs": {"output_dim": 0, "scale_type": "channel"}}
        attrs["weight_shape"] = {"shape": (2,), "dtype": torch.int64, "extra_attrs": {}}
        if has_bias:
            attrs["bias"] = {"shape": (shape_n,), "dtype": param_dtype, "extra_attrs": {"output_dim": 0}}
        return add_expert_dim(attrs, num_experts)

    def infer_shape(self, tensors: dict[str, "torch.Tensor"]) -> tuple[int, int, int | None, bool]:
        weight = tensors["weight_packed"]
        return int(weight.shape[-2]), int(weight.shape[-1]) * 8, None, "bias" in tensors

    def to_humming_schema(self, param_dtype: "torch.dtype") -> HummingWeightSchema:
        group = self.group_size if self.strategy == "group" else 0
        return HummingWeightSchema(
            b_dtype=dtypes.uint4,
            bs_dtype=dtypes.DataType.from_torch_dtype(param_dtype),
            weight_scale_group_size=group,
            weight_scale_type=WeightScaleType.GROUP if group else WeightScaleType.CHANNEL,
        )

    def _convert_humming(self, tensors, shape_n_stacks, shape_k_stacks, param_dtype, num_experts):
        import torch

        for name in ("weight_zero_point", "weight_g_idx", "weight_global_scale"):
            if name in tensors:
                raise ChordUnsupportedError(f"A compressed-tensors int4 checkpoint with a {name!r} tensor")
        scale = tensors["weight_scale"]
        if scale.dtype == torch.float32:
            scale = scale.to(param_dtype)
        schema = self.to_humming_schema(param_dtype)
        schema.bs_dtype = dtypes.DataType.from_torch_dtype(scale.dtype)
        out = {"weight": tensors["weight_packed"].view(torch.int32), "weight_scale": scale}
        if "bias" in tensors:
            out["bias"] = tensors["bias"]
        return schema, out


CompressedTensorsInputSchema = refused_input_schema(
    "CompressedTensorsInputSchema", "compressed-tensors",
    "compressed-tensors input-activation quantization (W4A8/W8A8 activations)", module=__name__)
