"""Quantization schemas by checkpoint ``quant_method`` (``humming.schema``).

Served (W4A16): ``compressed-tensors`` pack-quantized int4 and the native ``humming`` uint4
schema, with unquantized bf16 inputs. Every other name vLLM 0.33 imports is here too and
raises :class:`humming.errors.ChordUnsupportedError` when a checkpoint tries to create it.
"""
from __future__ import annotations

from humming.schema.base import BaseInputSchema, BaseWeightSchema, RefusedSchema, refused_input_schema, \
    refused_weight_schema
from humming.schema.compressed_tensors import CompressedTensorsInputSchema, CompressedTensorsWeightSchema
from humming.schema.fp8 import Fp8InputSchema, Fp8WeightSchema
from humming.schema.humming import HummingInputSchema, HummingWeightSchema, is_humming_schema_compatible
from humming.schema.modelopt import ModeloptInputSchema, ModeloptWeightSchema

AWQWeightSchema = refused_weight_schema(
    "AWQWeightSchema", "awq", "AWQ checkpoints (quant_method 'awq', K-first packing, usually zero points)",
    module=__name__)
GPTQWeightSchema = refused_weight_schema(
    "GPTQWeightSchema", "gptq", "GPTQ checkpoints (quant_method 'gptq', K-first packing)", module=__name__)
AutoRoundWeightSchema = refused_weight_schema(
    "AutoRoundWeightSchema", "auto-round", "AutoRound checkpoints (quant_method 'auto-round')", module=__name__)
BitnetWeightSchema = refused_weight_schema(
    "BitnetWeightSchema", "bitnet", "BitNet ternary weights (quant_method 'bitnet')", module=__name__)
Mxfp4WeightSchema = refused_weight_schema(
    "Mxfp4WeightSchema", "mxfp4", "MXFP4 weights (quant_method 'mxfp4')", module=__name__)
GptOssMxfp4WeightSchema = refused_weight_schema(
    "GptOssMxfp4WeightSchema", "gpt_oss_mxfp4", "gpt-oss MXFP4 weights (quant_method 'gpt_oss_mxfp4')",
    module=__name__)
QuarkWeightSchema = refused_weight_schema(
    "QuarkWeightSchema", "quark", "AMD Quark weights (quant_method 'quark')", module=__name__)
QuarkInputSchema = refused_input_schema(
    "QuarkInputSchema", "quark", "AMD Quark activation quantization", module=__name__)

WEIGHT_SCHEMA_MAP: dict[str, type[BaseWeightSchema]] = {
    "auto-round": AutoRoundWeightSchema,
    "auto_round": AutoRoundWeightSchema,
    "awq": AWQWeightSchema,
    "bitnet": BitnetWeightSchema,
    "compressed-tensors": CompressedTensorsWeightSchema,
    "fp8": Fp8WeightSchema,
    "gptq": GPTQWeightSchema,
    "humming": HummingWeightSchema,
    "modelopt": ModeloptWeightSchema,
    "mxfp4": Mxfp4WeightSchema,
    "gpt_oss_mxfp4": GptOssMxfp4WeightSchema,
    "quark": QuarkWeightSchema,
}

# vLLM asks `quant_method in INPUT_SCHEMA_MAP` to decide whether a checkpoint quantizes its
# inputs: every method that can is listed, so none is silently ignored.
INPUT_SCHEMA_MAP: dict[str, type[BaseInputSchema]] = {
    "compressed-tensors": CompressedTensorsInputSchema,
    "fp8": Fp8InputSchema,
    "humming": HummingInputSchema,
    "modelopt": ModeloptInputSchema,
    "quark": QuarkInputSchema,
}

BaseWeightSchema.WEIGHT_SCHEMA_MAP = WEIGHT_SCHEMA_MAP
BaseInputSchema.INPUT_SCHEMA_MAP = INPUT_SCHEMA_MAP

__all__ = [
    "BaseInputSchema", "BaseWeightSchema", "HummingInputSchema", "HummingWeightSchema",
    "CompressedTensorsInputSchema", "CompressedTensorsWeightSchema", "AWQWeightSchema", "GPTQWeightSchema",
    "AutoRoundWeightSchema", "BitnetWeightSchema", "Mxfp4WeightSchema", "GptOssMxfp4WeightSchema",
    "Fp8InputSchema", "Fp8WeightSchema", "QuarkWeightSchema", "QuarkInputSchema", "RefusedSchema",
    "WEIGHT_SCHEMA_MAP", "INPUT_SCHEMA_MAP", "is_humming_schema_compatible",
]
