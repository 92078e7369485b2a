"""Humming's data-type names (``humming.dtypes``), as vLLM 0.33 uses them.

vLLM builds lookup tables keyed by these objects at import, compares them with ``==``, reads
``.num_bits`` / ``.is_floating_point_type``, formats them with ``str()`` and parses them with
``DataType.from_str`` / ``from_any``. Chord computes with only a few of them (uint4 weights,
bf16 activations and scales); the rest exist so that vLLM's tables build, and are refused where
a layer would use them.

Two types are equal when their canonical names are equal (a name string compares equal too).
No torch import here: conversions to and from ``torch.dtype`` import it lazily.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DataType", "IntegerType", "FloatingPointType"]


@dataclass(frozen=True, eq=False, repr=False)
class DataType:
    num_bits: int
    is_signed: bool = True
    exponent_bits: int = 0
    mantissa_bits: int = 0
    dtype_str: str = field(default="", compare=False)

    is_integer_type = False
    is_floating_point_type = False

    def __post_init__(self) -> None:
        if type(self) is DataType:
            raise TypeError("DataType is abstract: use IntegerType, FloatingPointType or DataType.from_str")
        object.__setattr__(self, "dtype_str", self._name())

    # --- naming -------------------------------------------------------------------------
    def _name(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def to_str(self) -> str:
        return self.dtype_str

    def __str__(self) -> str:
        return self.dtype_str

    def __repr__(self) -> str:
        return self.dtype_str

    def __hash__(self) -> int:
        return hash(self.dtype_str)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DataType):
            return self.dtype_str == other.dtype_str
        if isinstance(other, str):
            try:
                return self.dtype_str == DataType.from_str(other).dtype_str
            except ValueError:
                return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    # --- parsing ------------------------------------------------------------------------
    @classmethod
    def from_str(cls, s: "str | DataType") -> "DataType":
        if isinstance(s, DataType):
            return s
        if not isinstance(s, str):
            raise ValueError(f"data type name must be a str, got {type(s).__name__}")
        text = s.strip().lower()
        if text.startswith("torch."):
            text = text[len("torch."):]
        if "int" in text:
            return IntegerType.from_str(text)
        if "float" in text or text == "half":
            return FloatingPointType.from_str(text)
        raise ValueError(f"unknown data type {s!r}")

    @classmethod
    def from_torch_dtype(cls, torch_dtype: Any) -> "DataType":
        name = str(torch_dtype).removeprefix("torch.")
        # float8_e4m3fn / float8_e5m2fnuz / float8_e8m0fnu: finite-only and nan flavours share a name here
        name = re.sub(r"(fnuz|fnu|fn)$", "", name)
        return cls.from_str(name)

    @classmethod
    def from_any(cls, dtype: Any) -> "DataType":
        if isinstance(dtype, DataType):
            return dtype
        if isinstance(dtype, str):
            return cls.from_str(dtype)
        if type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch":
            return cls.from_torch_dtype(dtype)
        raise ValueError(f"cannot make a humming data type from {dtype!r}")

    def to_torch_dtype(self):
        """The torch dtype that holds this type unpacked (raises for sub-byte and exotic types)."""
        import torch

        table = {
            "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32,
            "float8e4m3": torch.float8_e4m3fn, "float8e5m2": torch.float8_e5m2,
        }
        if self.dtype_str == "float8e8m0" and hasattr(torch, "float8_e8m0fnu"):
            return torch.float8_e8m0fnu
        try:
            return table[self.dtype_str]
        except KeyError:
            raise ValueError(f"{self} has no torch dtype") from None

    def id(self) -> int:
        """A stable integer code (kind, sign, bits, exponent, mantissa)."""
        kind = 1 if self.is_integer_type else 2
        return (kind * 10_000_000 + int(self.is_signed) * 1_000_000 + self.num_bits * 10_000
                + self.exponent_bits * 100 + self.mantissa_bits)


@dataclass(frozen=True, eq=False, repr=False)
class IntegerType(DataType):
    is_integer_type = True

    __hash__ = DataType.__hash__
    __eq__ = DataType.__eq__

    def _name(self) -> str:
        return f"{'' if self.is_signed else 'u'}int{self.num_bits}"

    @classmethod
    def from_str(cls, s: "str | DataType") -> "IntegerType":
        if isinstance(s, IntegerType):
            return s
        m = re.fullmatch(r"(u?)int(\d+)", str(s).strip().lower())
        if not m:
            raise ValueError(f"unknown integer data type {s!r}")
        return cls(num_bits=int(m.group(2)), is_signed=m.group(1) == "")


@dataclass(frozen=True, eq=False, repr=False)
class FloatingPointType(DataType):
    is_floating_point_type = True

    __hash__ = DataType.__hash__
    __eq__ = DataType.__eq__

    def __post_init__(self) -> None:
        sign_bits = self.num_bits - self.exponent_bits - self.mantissa_bits
        if sign_bits not in (0, 1):
            raise ValueError(f"float type with {self.num_bits} bits cannot have e{self.exponent_bits}m{self.mantissa_bits}")
        object.__setattr__(self, "is_signed", sign_bits == 1)
        super().__post_init__()

    @property
    def sign_bits(self) -> int:
        return self.num_bits - self.exponent_bits - self.mantissa_bits

    def _name(self) -> str:
        special = {(16, 5, 10): "float16", (16, 8, 7): "bfloat16", (32, 8, 23): "float32"}
        return special.get((self.num_bits, self.exponent_bits, self.mantissa_bits),
                           f"float{self.num_bits}e{self.exponent_bits}m{self.mantissa_bits}")

    @classmethod
    def from_str(cls, s: "str | DataType") -> "FloatingPointType":
        if isinstance(s, FloatingPointType):
            return s
        text = str(s).strip().lower()
        named = {"float16": (16, 5, 10), "half": (16, 5, 10), "bfloat16": (16, 8, 7), "float32": (32, 8, 23),
                 "float": (32, 8, 23)}
        if text in named:
            bits, e, m = named[text]
            return cls(num_bits=bits, exponent_bits=e, mantissa_bits=m)
        mt = re.fullmatch(r"float(\d+)_?e(\d+)m(\d+)", text)
        if not mt:
            raise ValueError(f"unknown floating-point data type {s!r}")
        return cls(num_bits=int(mt.group(1)), exponent_bits=int(mt.group(2)), mantissa_bits=int(mt.group(3)))


def _int(name: str) -> IntegerType:
    return IntegerType.from_str(name)


def _fp(name: str) -> FloatingPointType:
    return FloatingPointType.from_str(name)


# The names vLLM 0.33 reads (its dtype tables build from these at import when humming is present).
uint1, uint2, uint3, uint4, uint5, uint6, uint7, uint8 = (_int(f"uint{b}") for b in range(1, 9))
int2, int3, int4, int6, int8, int32 = (_int(f"int{b}") for b in (2, 3, 4, 6, 8, 32))

float2e0m1 = _fp("float2e0m1")
float3e0m2 = _fp("float3e0m2")
float4e0m3 = _fp("float4e0m3")
float5e0m4 = _fp("float5e0m4")
float6e0m5 = _fp("float6e0m5")
float7e0m6 = _fp("float7e0m6")
float8e0m7 = _fp("float8e0m7")
float4e2m1 = _fp("float4e2m1")
float6e2m3 = _fp("float6e2m3")
float6e3m2 = _fp("float6e3m2")
float8e3m4 = _fp("float8e3m4")
float8e4m3 = _fp("float8e4m3")
float8e5m2 = _fp("float8e5m2")
float8e5m3 = _fp("float8e5m3")
float8e8m0 = _fp("float8e8m0")

float16 = _fp("float16")
bfloat16 = _fp("bfloat16")
float32 = _fp("float32")


def __getattr__(name: str):
    # torch_dtype_map needs torch; build it on first access only.
    if name == "torch_dtype_map":
        import torch

        table = {int8: torch.int8, float8e4m3: torch.float8_e4m3fn, float8e5m2: torch.float8_e5m2,
                 float16: torch.float16, bfloat16: torch.bfloat16, float32: torch.float32}
        if hasattr(torch, "float8_e8m0fnu"):
            table[float8e8m0] = torch.float8_e8m0fnu
        globals()["torch_dtype_map"] = table
        return table
    raise AttributeError(f"module 'humming.dtypes' has no attribute {name!r}")
