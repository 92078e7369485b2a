"""The native Humming schemas: uint4 weights (``HummingWeightSchema``) and unquantized inputs.

Native Humming uint4 tensors (what every supported checkpoint converts to before the kernel
repack):

* ``weight``: int32 ``[(E,) N, K/8]``; element ``k`` of a row sits in nibble ``k % 8`` (least
  significant first) of word ``k // 8`` as the offset-binary code ``q + 8`` (``q`` in [-8, 7]),
  i.e. the same bits as compressed-tensors ``pack-quantized`` int4;
* ``weight_scale``: ``[(E,) N, K/group]`` (``[.., N, 1]`` per channel), bf16 or fp16;
* no zero point, no secondary scale, no bias.

Only that is accepted; every other setting raises :class:`~humming.errors.ChordUnsupportedError`
when the schema is created.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from humming import dtypes
from humming.config import InputQuantizationMode, WeightScale2Type, WeightScaleType
from humming.errors import ChordUnsupportedError
from humming.schema.base import BaseInputSchema, BaseWeightSchema, add_expert_dim

if TYPE_CHECKING:  # pragma: no cover
    import torch

KERNEL_GROUP = 32


def _torch_scale_dtype(bs_dtype: dtypes.DataType | None, param_dtype: "torch.dtype") -> "torch.dtype":
    return param_dtype if bs_dtype is None else bs_dtype.to_torch_dtype()


def check_param_dtype(param_dtype: Any) -> None:
    """Chord computes with bf16 activations and output."""
    import torch

    if param_dtype is not None and param_dtype != torch.bfloat16:
        raise ChordUnsupportedError(f"Model dtype {param_dtype}", "Serve the model with --dtype bfloat16.")


@dataclasses.dataclass(kw_only=True)
class HummingWeightSchema(BaseWeightSchema):
    quant_method: str = "humming"
    b_dtype: dtypes.DataType | str = dtypes.uint4
    bs_dtype: dtypes.DataType | str | None = None
    weight_scale_group_size: int = 0
    weight_scale_group_size_n: int = 0
    weight_scale_type: WeightScaleType | str | None = None
    weight_scale_2_type: WeightScale2Type | str | None = None
    has_zero_point: bool = False
    is_fp_zero_point: bool = False
    hadamard_block_size: int = 0

    KWARGS_ALIAS: ClassVar[dict[str, list[str]]] = {
        "b_dtype": ["weight_dtype", "dtype"],
        "bs_dtype": ["weight_scale_dtype", "scale_dtype"],
        "weight_scale_group_size": ["group_size"],
        "weight_scale_group_size_n": ["group_size_n"],
        "weight_scale_type": ["scale_type"],
        "weight_scale_2_type": ["scale_2_type"],
    }

    def __post_init__(self) -> None:
        if self.quant_method != "humming":
            raise ValueError(f"HummingWeightSchema.quant_method must be 'humming', got {self.quant_method!r}")
        self.b_dtype = dtypes.DataType.from_any(self.b_dtype)
        if isinstance(self.b_dtype, dtypes.IntegerType) and self.b_dtype.is_signed and self.b_dtype.num_bits <= 8:
            # a signed source type is stored with offset-binary codes, like Humming does
            self.b_dtype = dtypes.DataType.from_str(f"uint{self.b_dtype.num_bits}")
        if self.bs_dtype is not None:
            self.bs_dtype = dtypes.DataType.from_any(self.bs_dtype)
        if isinstance(self.weight_scale_type, str):
            self.weight_scale_type = WeightScaleType(self.weight_scale_type)
        if self.weight_scale_type is None:
            if self.weight_scale_group_size_n > 1:
                self.weight_scale_type = WeightScaleType.BLOCK
            elif self.weight_scale_group_size > 0:
                self.weight_scale_type = WeightScaleType.GROUP
            else:
                self.weight_scale_type = WeightScaleType.CHANNEL
        if isinstance(self.weight_scale_2_type, str):
            self.weight_scale_2_type = WeightScale2Type(self.weight_scale_2_type)
        if self.weight_scale_2_type is None:
            self.weight_scale_2_type = WeightScale2Type.NONE
        self._check_supported()

    def _check_supported(self) -> None:
        label = f"Humming {self.b_dtype} weights"
        if self.b_dtype != dtypes.uint4:
            raise ChordUnsupportedError(f"{label} (weight dtype {self.b_dtype})")
        if self.has_zero_point:
            raise ChordUnsupportedError(f"{label} with zero points (asymmetric quantization)")
        if self.hadamard_block_size not in (0, 1):
            raise ChordUnsupportedError(f"Hadamard rotation (hadamard_block_size={self.hadamard_block_size})")
        if self.weight_scale_2_type is not WeightScale2Type.NONE:
            raise ChordUnsupportedError(f"{label} with a secondary {self.weight_scale_2_type.value} scale")
        if self.weight_scale_type is WeightScaleType.GROUP:
            g = self.weight_scale_group_size
            if g <= 0 or g % KERNEL_GROUP:
                raise ChordUnsupportedError(f"{label} with scale group size {g}")
        elif self.weight_scale_type is not WeightScaleType.CHANNEL:
            raise ChordUnsupportedError(f"{label} with {self.weight_scale_type.value} scales (group "
                                        f"{self.weight_scale_group_size_n}x{self.weight_scale_group_size})")
        if self.weight_scale_group_size_n not in (0, 1):
            raise ChordUnsupportedError(f"{label} with scale blocks of {self.weight_scale_group_size_n} rows")
        if self.bs_dtype not in (None, dtypes.bfloat16, dtypes.float16, dtypes.float32):
            raise ChordUnsupportedError(f"{label} with {self.bs_dtype} scales")

    # --- what the kernels need ----------------------------------------------------------------
    @property
    def has_tensor_weight_scale(self) -> bool:
        return False

    def group_size_for(self, shape_k: int) -> int:
        """The checkpoint's group along K (the whole K per channel)."""
        return self.weight_scale_group_size if self.weight_scale_type is WeightScaleType.GROUP else shape_k

    # --- parameters ---------------------------------------------------------------------------
    def get_tensors_attrs(self, shape_n: int, shape_k: int, param_dtype: "torch.dtype",
                          num_experts: int | None = None, has_bias: bool = False,
                          stack_size: int = 1) -> dict[str, dict[str, Any]]:
        import torch

        attrs: dict[str, dict[str, Any]] = {
            "weight": {"shape": (shape_n, -(-shape_k // 8)), "dtype": torch.int32,
                       "extra_attrs": {"input_dim": 1, "output_dim": 0, "packed_dim": 1, "packed_factor": 8}},
        }
        scale_dtype = _torch_scale_dtype(self.bs_dtype, param_dtype)
        if self.weight_scale_type is WeightScaleType.GROUP:
            attrs["weight_scale"] = {"shape": (shape_n, shape_k // self.weight_scale_group_size), "dtype": scale_dtype,
                                     "extra_attrs": {"input_dim": 1, "output_dim": 0, "scale_type": "group"}}
        else:
            attrs["weight_scale"] = {"shape": (shape_n, 1), "dtype": scale_dtype,
                                     "extra_attrs": {"output_dim": 0, "scale_type": "channel"}}
        if has_bias:
            attrs["bias"] = {"shape": (shape_n,), "dtype": param_dtype, "extra_attrs": {"output_dim": 0}}
        return add_expert_dim(attrs, num_experts)

    def infer_shape(self, tensors: dict[str, "torch.Tensor"]) -> tuple[int, int, int | None, bool]:
        weight = tensors["weight"]
        return int(weight.shape[-2]), int(weight.shape[-1]) * 8, None, "bias" in tensors

    # --- conversion ---------------------------------------------------------------------------
    def to_humming_schema(self, param_dtype: "torch.dtype") -> "HummingWeightSchema":
        return dataclasses.replace(self)

    def _convert_humming(self, tensors, shape_n_stacks, shape_k_stacks, param_dtype, num_experts):
        import torch

        for name in ("zero_point", "weight_scale_2"):
            if name in tensors:
                raise ChordUnsupportedError(f"A native Humming checkpoint with a {name!r} tensor")
        out = {"weight": tensors["weight"].view(torch.int32), "weight_scale": tensors["weight_scale"]}
        schema = dataclasses.replace(self)
        if out["weight_scale"].dtype == torch.float32:
            out["weight_scale"] = out["weight_scale"].to(param_dtype)
            schema.bs_dtype = dtypes.DataType.from_torch_dtype(param_dtype)
        if "bias" in tensors:
            out["bias"] = tensors["bias"]
        return schema, out

    def convert_symmetric_integer_weight(self, tensors: dict[str, "torch.Tensor"], allow_inplace: bool = False):
        return self, tensors

    # --- (re)quantization: online quantization from bf16 weights --------------------------------
    @classmethod
    def quant_tensor(cls, tensor: "torch.Tensor", schema: "HummingWeightSchema", param_dtype: "torch.dtype", *,
                     allow_negative_scale: bool = True) -> dict[str, "torch.Tensor"]:
        """bf16/fp32 weight [(E,) N, K] -> {'weight', 'weight_scale'} of `schema` (group 32 only)."""
        from humming import _chord

        if schema.weight_scale_type is not WeightScaleType.GROUP or schema.weight_scale_group_size != KERNEL_GROUP:
            raise ChordUnsupportedError(
                f"Online quantization to {schema.weight_scale_type.value} scales of group "
                f"{schema.weight_scale_group_size}", "Use group_size 32 for online quantization.")
        q, scales = _chord.quantize_g32(tensor)
        words = _chord.pack_words(q)
        if tensor.dim() == 2:
            words, scales = words[0], scales[0]
        return {"weight": words, "weight_scale": scales.to(_torch_scale_dtype(schema.bs_dtype, param_dtype))}

    def dequant_tensors(self, tensors: dict[str, "torch.Tensor"]) -> "torch.Tensor":
        """float32 weight [(E,) N, K] of native tensors (exact)."""
        from humming import _chord

        words, scale = tensors["weight"], tensors["weight_scale"]
        k = words.shape[-1] * 8
        q = _chord.unpack_words(words, k).float()
        group = k // scale.shape[-1]
        return q * scale.float().repeat_interleave(group, dim=-1)

    def requant_tensors(self, tensors: dict[str, "torch.Tensor"], target_weight_schema: "HummingWeightSchema",
                        param_dtype: "torch.dtype") -> dict[str, "torch.Tensor"]:
        return target_weight_schema.quant_tensor(self.dequant_tensors(tensors), target_weight_schema, param_dtype)

    def is_compatible_with(self, input_schema: "HummingInputSchema", param_dtype: "torch.dtype | None" = None) -> bool:
        return input_schema.is_compatible_with(self, param_dtype)


@dataclasses.dataclass(kw_only=True)
class HummingInputSchema(BaseInputSchema):
    """Activations as the GEMM reads them. Chord reads bf16 activations, unquantized."""

    quant_method: str = "humming"
    a_dtype: dtypes.DataType | str | None = None
    input_scale_group_size: int = 0
    input_scale_dtype: dtypes.DataType | str | None = None
    input_quant_mode: InputQuantizationMode | str | None = None

    KWARGS_ALIAS: ClassVar[dict[str, list[str]]] = {
        "a_dtype": ["input_dtype", "dtype"],
        "input_scale_group_size": ["group_size"],
        "input_scale_dtype": ["scale_dtype"],
        "input_quant_mode": ["quant_mode", "quantization_mode"],
    }

    def __post_init__(self) -> None:
        if self.a_dtype is not None:
            self.a_dtype = dtypes.DataType.from_any(self.a_dtype)
        if self.input_scale_dtype is not None:
            self.input_scale_dtype = dtypes.DataType.from_any(self.input_scale_dtype)
        if isinstance(self.input_quant_mode, str):
            self.input_quant_mode = InputQuantizationMode(self.input_quant_mode)
        mode = self.input_quant_mode
        quantizing = mode is not None and mode.should_quantize
        if quantizing or (self.a_dtype is not None and self.a_dtype.num_bits < 16) or self.input_scale_group_size:
            raise ChordUnsupportedError(
                f"Input quantization (a_dtype={self.a_dtype}, mode={getattr(mode, 'value', mode)}, "
                f"group={self.input_scale_group_size})",
                "Unset VLLM_HUMMING_INPUT_QUANT_CONFIG and serve a checkpoint without input_activations quantization.")
        if self.a_dtype is not None and self.a_dtype != dtypes.bfloat16:
            raise ChordUnsupportedError(f"{self.a_dtype} activations", "Serve the model with --dtype bfloat16.")

    def get_activation_bits(self) -> int:
        return 16

    @property
    def static_tensor_scale_name(self) -> str | None:
        return None

    def to_humming_schema(self, param_dtype: "torch.dtype") -> "HummingInputSchema":
        return dataclasses.replace(self)

    def is_compatible_with(self, weight_schema: BaseWeightSchema, param_dtype: "torch.dtype | None" = None) -> bool:
        """True for every weight schema Chord serves; raises for a non-bf16 model (not a fallback case)."""
        check_param_dtype(param_dtype)
        return isinstance(weight_schema, HummingWeightSchema) or hasattr(weight_schema, "to_humming_schema")


def is_humming_schema_compatible(input_schema: HummingInputSchema, weight_schema: HummingWeightSchema,
                                 param_dtype: "torch.dtype | None" = None) -> bool:
    return input_schema.is_compatible_with(weight_schema, param_dtype)
