"""Schema base classes: a checkpoint's weight (or input) quantization format, as vLLM uses it.

vLLM 0.33 builds a schema from a checkpoint's quantization config
(``BaseWeightSchema.from_config``), asks it for the parameters to allocate
(``get_tensors_attrs`` / ``get_padded_tensors_attrs``), lets it touch loaded tensors
(``process_loaded_weight``) and converts the loaded tensors to the native Humming schema
(``convert_humming``), which :func:`humming.transform.prepare_and_transform_humming_tensors`
then repacks into Chord's kernel layout.

Schemes Chord does not serve subclass :class:`RefusedSchema`: their names import (vLLM imports
them), and creating one raises :class:`humming.errors.ChordUnsupportedError` naming the scheme.

This module knows no subclass: the package (``humming/schema/__init__.py``, which Python runs
before any of its modules) fills ``WEIGHT_SCHEMA_MAP`` / ``INPUT_SCHEMA_MAP`` once its subclass
modules are imported, and ``from_config`` looks the method up there. The conversions return
the native schemas of :mod:`humming.schema.humming` (annotated here by their base class).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from humming.errors import OTHER_BACKEND_HINT, ChordUnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m if m > 1 else x


def _kwargs_from_config(cls, config: dict[str, Any]) -> dict[str, Any]:
    """Pick the dataclass fields of `cls` out of a config dict (with the class's aliases)."""
    kwargs: dict[str, Any] = {}
    aliases = getattr(cls, "KWARGS_ALIAS", {})
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in config:
            kwargs[f.name] = config[f.name]
            continue
        for alias in aliases.get(f.name, ()):
            if alias in config:
                kwargs[f.name] = config[alias]
                break
    return kwargs


def add_expert_dim(tensors_attrs: dict[str, dict[str, Any]], num_experts: int | None) -> dict[str, dict[str, Any]]:
    """Prefix every shape with the expert count (and shift the *_dim attributes by one)."""
    if not num_experts:
        return tensors_attrs
    for attr in tensors_attrs.values():
        shape = tuple(attr["shape"])
        attr["shape"] = (num_experts,) if shape == (1,) else (num_experts, *shape)
        extra = attr.setdefault("extra_attrs", {})
        for key in list(extra):
            if key.endswith("_dim"):
                extra[key] = extra[key] + 1
    return tensors_attrs


@dataclasses.dataclass(kw_only=True)
class BaseWeightSchema:
    quant_method: str

    WEIGHT_SCHEMA_MAP: ClassVar[dict[str, type["BaseWeightSchema"]]] = {}
    KWARGS_ALIAS: ClassVar[dict[str, list[str]]] = {}

    may_add_expert_dim = staticmethod(add_expert_dim)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "BaseWeightSchema":
        if cls is BaseWeightSchema:  # the map is filled by the package humming.schema
            method = config.get("quant_method")
            schema_cls = cls.WEIGHT_SCHEMA_MAP.get(method)
            if schema_cls is None:
                raise ChordUnsupportedError(f"Weight quantization method {method!r}", OTHER_BACKEND_HINT)
            return schema_cls.from_config(config)
        return cls(**_kwargs_from_config(cls, config))

    # --- parameters vLLM allocates -----------------------------------------------------------
    def get_tensors_attrs(self, shape_n: int, shape_k: int, param_dtype: "torch.dtype",
                          num_experts: int | None = None, has_bias: bool = False,
                          stack_size: int = 1) -> dict[str, dict[str, Any]]:
        raise NotImplementedError

    def get_padded_tensors_attrs(self, shape_n: int, shape_k: int, param_dtype: "torch.dtype",
                                 num_experts: int | None = None, has_bias: bool = False,
                                 pad_n_to_multiple: int = 1, pad_k_to_multiple: int = 1,
                                 stack_size: int = 1) -> dict[str, dict[str, Any]]:
        attrs = self.get_tensors_attrs(shape_n=shape_n, shape_k=shape_k, param_dtype=param_dtype,
                                       num_experts=num_experts, has_bias=has_bias, stack_size=stack_size)
        pn, pk = _round_up(shape_n, pad_n_to_multiple), _round_up(shape_k, pad_k_to_multiple)
        if (pn, pk) == (shape_n, shape_k):
            return attrs
        padded = self.get_tensors_attrs(shape_n=pn, shape_k=pk, param_dtype=param_dtype, num_experts=num_experts,
                                        has_bias=has_bias, stack_size=stack_size)
        for name, attr in padded.items():
            attr.setdefault("extra_attrs", {})["pad_shape"] = tuple(
                b - a for a, b in zip(attrs[name]["shape"], attr["shape"], strict=True))
        return padded

    def validate_tensors(self, tensors: dict[str, "torch.Tensor"], shape_n: int, shape_k: int,
                         param_dtype: "torch.dtype", num_experts: int | None = None, has_bias: bool = False) -> None:
        want = self.get_tensors_attrs(shape_n=shape_n, shape_k=shape_k, param_dtype=param_dtype,
                                      num_experts=num_experts, has_bias=has_bias)
        for name, attr in want.items():
            if name not in tensors:
                raise ValueError(f"{self.quant_method}: tensor {name!r} is missing")
            t = tensors[name]
            if t.dtype != attr["dtype"] or tuple(t.shape) != tuple(attr["shape"]):
                raise ValueError(f"{self.quant_method}: tensor {name!r} must be {attr['dtype']} {tuple(attr['shape'])}, "
                                 f"got {t.dtype} {tuple(t.shape)}")

    def infer_shape(self, tensors: dict[str, "torch.Tensor"]) -> tuple[int, int, int | None, bool]:
        raise NotImplementedError

    # --- conversion ----------------------------------------------------------------------------
    def to_humming_schema(self, param_dtype: "torch.dtype") -> "BaseWeightSchema":
        raise NotImplementedError

    def process_loaded_weight(self, tensor: "torch.Tensor", name: str) -> "torch.Tensor":
        return tensor

    def convert_humming(self, tensors: dict[str, "torch.Tensor"], shape_n_stacks: list[int],
                        shape_k_stacks: list[int], param_dtype: "torch.dtype", num_experts: int | None = None,
                        device: Any = None, convert_symmetric_integer: bool = True,
                        allow_inplace: bool = False) -> tuple["BaseWeightSchema", dict[str, "torch.Tensor"]]:
        """Checkpoint tensors -> (native Humming uint4 schema, its tensors). No copy of the weight."""
        return self._convert_humming(dict(tensors), list(shape_n_stacks), list(shape_k_stacks), param_dtype,
                                     num_experts)

    def _convert_humming(self, tensors, shape_n_stacks, shape_k_stacks, param_dtype, num_experts):
        raise NotImplementedError


@dataclasses.dataclass(kw_only=True)
class BaseInputSchema:
    quant_method: str

    INPUT_SCHEMA_MAP: ClassVar[dict[str, type["BaseInputSchema"]]] = {}
    KWARGS_ALIAS: ClassVar[dict[str, list[str]]] = {}

    may_add_expert_dim = staticmethod(add_expert_dim)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "BaseInputSchema":
        if cls is BaseInputSchema:  # the map is filled by the package humming.schema
            method = config.get("quant_method")
            schema_cls = cls.INPUT_SCHEMA_MAP.get(method)
            if schema_cls is None:
                raise ChordUnsupportedError(f"Input quantization method {method!r}")
            return schema_cls.from_config(config)
        return cls(**_kwargs_from_config(cls, config))

    def get_activation_bits(self) -> int:
        raise NotImplementedError

    def get_tensors_attrs(self, shape_k: int, param_dtype: "torch.dtype", num_experts: int | None = None,
                          stack_size: int = 1) -> dict[str, dict[str, Any]]:
        return {}

    @property
    def static_tensor_scale_name(self) -> str | None:
        return None

    def to_humming_schema(self, param_dtype: "torch.dtype") -> "BaseInputSchema":
        raise NotImplementedError

    def convert_humming(self, tensors: dict[str, "torch.Tensor"], shape_n_stacks: list[int],
                        shape_k_stacks: list[int], param_dtype: "torch.dtype", num_experts: int | None = None,
                        device: Any = None,
                        allow_inplace: bool = False) -> tuple["BaseInputSchema", dict[str, "torch.Tensor"]]:
        return self.to_humming_schema(param_dtype), {}


class RefusedSchema:
    """Mixin of the schema classes Chord does not serve: importable, refused when created."""

    SCHEME: ClassVar[str] = "This quantization scheme"
    HINT: ClassVar[str] = OTHER_BACKEND_HINT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        detail = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k != "quant_method")
        what = self.SCHEME + (f" ({detail})" if detail else "")
        raise ChordUnsupportedError(what, self.HINT)

    @classmethod
    def from_config(cls, config: dict[str, Any]):
        return cls(**dict(config))


def _refused(base: type, name: str, quant_method: str, scheme: str, hint: str, module: str) -> type:
    return type(name, (RefusedSchema, base),
                {"SCHEME": scheme, "HINT": hint, "QUANT_METHOD": quant_method, "__module__": module,
                 "__qualname__": name,
                 "__doc__": f"{scheme}: not served by Chord (creating one raises ChordUnsupportedError)."})


def refused_weight_schema(name: str, quant_method: str, scheme: str, *, module: str,
                          hint: str = OTHER_BACKEND_HINT) -> type:
    return _refused(BaseWeightSchema, name, quant_method, scheme, hint, module)


def refused_input_schema(name: str, quant_method: str, scheme: str, *, module: str,
                         hint: str = "Chord computes with bf16 activations; serve without input quantization.") -> type:
    return _refused(BaseInputSchema, name, quant_method, scheme, hint, module)
