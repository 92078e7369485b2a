"""Enums and the per-layer configuration (``humming.config``) as vLLM 0.33 reads them.

:class:`LayerConfig` is built once per layer at load time by
:func:`humming.transform.prepare_and_transform_humming_tensors`. vLLM reads ``shape_n``,
``shape_k`` (padded kernel sizes), ``pad_shape_n``, ``pad_shape_k`` (how much of them is
padding), ``num_experts``, ``a_dtype``, ``c_dtype`` and ``input_quant_mode``; Chord's forward
reads the same fields. It is frozen and hashable (tuning rows are memoized per config).
"""
from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from humming import dtypes
from humming.errors import ChordUnsupportedError

__all__ = [
    "InputQuantizationMode", "MmaType", "WeightScaleType", "WeightScale2Type", "GemmType",
    "ActivationType", "ProcessInputLayoutType", "LayerConfig",
]


class InputQuantizationMode(str, enum.Enum):
    """How activations are quantized before the GEMM. Chord serves only ``Disabled``."""

    Disabled = "none"
    StaticTensor = "static_tensor"
    DynamicToken = "dynamic_token"
    DynamicGroup = "dynamic_group"
    StaticTensorDynamicGroup = "static_tensor_dynamic_group"
    DynamicGroupToken = "dynamic_group_token"

    @property
    def should_quantize(self) -> bool:
        return self is not InputQuantizationMode.Disabled

    @property
    def has_tensor_scale(self) -> bool:
        return self in (InputQuantizationMode.StaticTensor, InputQuantizationMode.StaticTensorDynamicGroup)

    @property
    def has_token_scale(self) -> bool:
        return self in (InputQuantizationMode.DynamicToken, InputQuantizationMode.DynamicGroupToken)

    @property
    def has_group_scale(self) -> bool:
        return self in (InputQuantizationMode.DynamicGroup, InputQuantizationMode.StaticTensorDynamicGroup,
                        InputQuantizationMode.DynamicGroupToken)

    @property
    def has_dynamic_scale(self) -> bool:
        return self.has_token_scale or self.has_group_scale

    @property
    def has_secondary_scale(self) -> bool:
        """A group scale plus a per-tensor or per-token scale (two scales per input)."""
        return self.has_group_scale and (self.has_tensor_scale or self.has_token_scale)

    @property
    def dynamic_scale_mode(self) -> str | None:
        if self.has_token_scale:
            return "group_token" if self.has_group_scale else "token"
        return "group" if self.has_group_scale else None


class MmaType(enum.Enum):
    MMA = "mma"
    WGMMA = "wgmma"
    UMMA = "umma"
    MXMMA = "mxmma"


class WeightScaleType(enum.Enum):
    GROUP = "group"
    BLOCK = "block"
    CHANNEL = "channel"
    TENSOR = "tensor"


class WeightScale2Type(enum.Enum):
    NONE = "none"
    CHANNEL = "channel"
    TENSOR = "tensor"


class GemmType(enum.Enum):
    DENSE = "dense"
    INDEXED = "indexed"
    GROUPED_CONTIGUOUS = "grouped_contiguous"
    GROUPED_MASKED = "grouped_masked"


class ActivationType(str, enum.Enum):
    None_ = "none"
    Unary = "unary"
    BinarySplit = "binary_split"
    BinaryInterleaved = "binary_interleaved"

    @property
    def is_unary(self) -> bool:
        return self is ActivationType.Unary

    @property
    def is_binary(self) -> bool:
        return self in (ActivationType.BinarySplit, ActivationType.BinaryInterleaved)


class ProcessInputLayoutType(str, enum.Enum):
    Normal = "normal"
    GroupedMask = "grouped_mask"
    Scatter = "scatter"


def _as_dtype(value: Any) -> dtypes.DataType | None:
    if value is None or isinstance(value, dtypes.DataType):
        return value
    return dtypes.DataType.from_any(value)


def _as_enum(enum_cls, value):
    if value is None or isinstance(value, enum_cls):
        return value
    return enum_cls(value.value if isinstance(value, enum.Enum) else value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerConfig:
    """One Chord W4A16 layer as the kernels see it (sizes are the padded kernel sizes)."""

    # shapes: shape_* include the padding; pad_shape_* say how much of it is padding
    shape_n: int
    shape_k: int
    pad_shape_n: int = 0
    pad_shape_k: int = 0
    num_experts: int = 0  # 0: a dense (non-MoE) layer

    # data types
    b_dtype: dtypes.DataType = dtypes.uint4
    a_dtype: dtypes.DataType = dtypes.bfloat16
    c_dtype: dtypes.DataType = dtypes.bfloat16
    bs_dtype: dtypes.DataType | None = dtypes.bfloat16
    as_dtype: dtypes.DataType | None = None
    input_quant_mode: InputQuantizationMode | str | None = None

    # quantization parameters (of the kernel layout: Chord's kernels always see group 32)
    input_scale_group_size: int = 0
    weight_scale_group_size: int = 32
    weight_scale_group_size_n: int = 0
    weight_scale_type: WeightScaleType | str | None = WeightScaleType.GROUP
    weight_scale_2_type: WeightScale2Type | str | None = WeightScale2Type.NONE
    has_zero_point: bool = False
    is_fp_zero_point: bool = False
    has_bias: bool = False

    sm_version: int | None = 90
    # Chord's kernel weight layout (docs/architecture.md) and the checkpoint's own group size
    layout: str = "swap16g"
    checkpoint_group_size: int = 32
    # the serving instance's role and the layer's deployment (chord.deployments), fixed at load:
    # "" takes CHORD_ROLE (default both) and CHORD_DEPLOYMENT (default: by shape) when the config is made
    chord_role: str = ""
    chord_deployment: str = ""

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for name in ("b_dtype", "a_dtype", "c_dtype", "bs_dtype", "as_dtype"):
            put(name, _as_dtype(getattr(self, name)))
        mode = _as_enum(InputQuantizationMode, self.input_quant_mode)
        put("input_quant_mode", InputQuantizationMode.Disabled if mode is None else mode)
        put("weight_scale_type", _as_enum(WeightScaleType, self.weight_scale_type) or WeightScaleType.GROUP)
        put("weight_scale_2_type", _as_enum(WeightScale2Type, self.weight_scale_2_type) or WeightScale2Type.NONE)
        self._check_supported()
        self._fix_deployment(put)

    def _fix_deployment(self, put) -> None:
        """The role and deployment this layer is served under, resolved once, at load."""
        from chord import deployments as D

        if not isinstance(self.chord_role, str) or not isinstance(self.chord_deployment, str):
            raise TypeError(f"LayerConfig: chord_role and chord_deployment must be str, got "
                            f"{self.chord_role!r}, {self.chord_deployment!r}")
        put("chord_role", D.check_role(self.chord_role.lower(), "LayerConfig.chord_role")
            if self.chord_role else D.current_role())
        if self.num_experts > 0:
            put("chord_deployment", D.deployment_for(self.kernel_experts, self.shape_n, self.shape_k,
                                                     deployment=self.chord_deployment or None))

    def _check_supported(self) -> None:
        if self.input_quant_mode.should_quantize or (self.a_dtype is not None and self.a_dtype.num_bits < 16):
            raise ChordUnsupportedError(
                f"Input quantization (a_dtype={self.a_dtype}, mode={self.input_quant_mode.value})",
                "Unset VLLM_HUMMING_INPUT_QUANT_CONFIG and serve a checkpoint without input_activations quantization.")
        if self.a_dtype != dtypes.bfloat16 or self.c_dtype != dtypes.bfloat16:
            raise ChordUnsupportedError(f"Activation/output dtype {self.a_dtype}/{self.c_dtype}",
                                        "Serve the model with --dtype bfloat16.")
        if self.b_dtype not in (dtypes.uint4, dtypes.int4):
            raise ChordUnsupportedError(f"Weight dtype {self.b_dtype}")
        if self.has_zero_point:
            raise ChordUnsupportedError("Weights with zero points (asymmetric quantization)")
        if self.has_bias:
            raise ChordUnsupportedError("Expert/linear bias")
        if self.weight_scale_type is not WeightScaleType.GROUP or self.weight_scale_group_size != 32 \
                or self.weight_scale_group_size_n not in (0, 1):
            raise ChordUnsupportedError(
                f"A kernel scale layout of type {self.weight_scale_type.value}, group {self.weight_scale_group_size}"
                f"x{self.weight_scale_group_size_n}")
        if self.weight_scale_2_type is not WeightScale2Type.NONE:
            raise ChordUnsupportedError(f"A secondary weight scale ({self.weight_scale_2_type.value})")
        if self.bs_dtype not in (None, dtypes.bfloat16):
            raise ChordUnsupportedError(f"Kernel scale dtype {self.bs_dtype}")
        if self.layout != "swap16g":
            raise ChordUnsupportedError(f"Kernel weight layout {self.layout!r}")
        from chord.checks import is_int

        for name in ("shape_n", "shape_k", "pad_shape_n", "pad_shape_k", "num_experts"):
            v = getattr(self, name)
            if not is_int(v):
                raise ValueError(f"LayerConfig: {name} must be an int, got {v!r} ({type(v).__name__})")
        if self.shape_n % 16 or self.shape_k % 64 or self.shape_n <= 0 or self.shape_k <= 0:
            raise ValueError(f"LayerConfig: the swap16g layout needs shape_n % 16 == 0 and shape_k % 64 == 0 "
                             f"(padded sizes), got shape_n={self.shape_n}, shape_k={self.shape_k}")
        if not (0 <= self.pad_shape_n < self.shape_n and 0 <= self.pad_shape_k < self.shape_k):
            raise ValueError(f"LayerConfig: padding must be smaller than the padded size, got pad_shape_n="
                             f"{self.pad_shape_n} of {self.shape_n}, pad_shape_k={self.pad_shape_k} of {self.shape_k}")
        from chord.checks import MAX_EXPERTS

        if not 0 <= self.num_experts <= MAX_EXPERTS:
            raise ValueError(f"LayerConfig: num_experts must be an int in [0, {MAX_EXPERTS}] (0: a dense layer; "
                             f"chord.checks.MAX_EXPERTS), got {self.num_experts!r}")

    # --- what the forward needs -------------------------------------------------------------
    @property
    def n(self) -> int:
        """Output features of the checkpoint (without padding)."""
        return self.shape_n - self.pad_shape_n

    @property
    def k(self) -> int:
        """Reduction length of the checkpoint (without padding)."""
        return self.shape_k - self.pad_shape_k

    @property
    def kernel_experts(self) -> int:
        """Experts in the packed weight (a dense layer is packed as one expert)."""
        return self.num_experts or 1

    @property
    def problem_shape(self) -> tuple[int, int, int]:
        return (0, self.shape_n, self.shape_k)

    @property
    def pad_shape(self) -> tuple[int, int, int]:
        return (0, self.pad_shape_n, self.pad_shape_k)

    @property
    def param_dtype(self):
        return self.c_dtype.to_torch_dtype()

    # --- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, dtypes.DataType):
                v = str(v)
            elif isinstance(v, enum.Enum):
                v = v.value
            out[f.name] = v
        return out

    def to_str(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_str(cls, text: str) -> "LayerConfig":
        try:
            fields = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"LayerConfig.from_str: text must be a JSON object of LayerConfig fields (as to_str() "
                             f"writes); it is not valid JSON ({exc})") from None
        return cls.from_dict(fields, "LayerConfig.from_str: text")

    @classmethod
    def from_dict(cls, fields: Any, what: str = "LayerConfig.from_dict: fields") -> "LayerConfig":
        """A LayerConfig from a dict of its fields (unknown fields are refused by name)."""
        if not isinstance(fields, dict):
            raise ValueError(f"{what} must be a JSON object / dict of LayerConfig fields, got {type(fields).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"{what} has unknown LayerConfig fields {unknown} (fields are {sorted(known)})")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in fields and f.default is dataclasses.MISSING)
        if missing:
            raise ValueError(f"{what} lacks the LayerConfig fields {missing}")
        return cls(**fields)

    def check_device(self, device) -> None:
        """Chord's kernels run on sm_90a; CPU tensors are allowed (reference path, tests)."""
        import torch

        device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if device.type != "cuda":
            return
        cap = torch.cuda.get_device_capability(device)
        if cap != (9, 0):
            raise ChordUnsupportedError(f"A GPU of compute capability {cap[0]}.{cap[1]}",
                                        "Chord's kernels need compute capability 9.0 (Hopper, sm_90a).")
