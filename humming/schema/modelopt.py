"""NVIDIA ModelOpt checkpoints (NVFP4, MXFP8): not served by Chord (W4A16 only)."""
from __future__ import annotations

from humming.schema.base import refused_input_schema, refused_weight_schema

ModeloptWeightSchema = refused_weight_schema(
    "ModeloptWeightSchema", "modelopt", "ModelOpt quantized weights (quant_method 'modelopt')", module=__name__)
ModeloptNvfp4WeightSchema = refused_weight_schema(
    "ModeloptNvfp4WeightSchema", "modelopt", "ModelOpt NVFP4 weights", module=__name__)
ModeloptMxfp8WeightSchema = refused_weight_schema(
    "ModeloptMxfp8WeightSchema", "modelopt", "ModelOpt MXFP8 weights", module=__name__)
ModeloptInputSchema = refused_input_schema(
    "ModeloptInputSchema", "modelopt", "ModelOpt activation quantization", module=__name__)
ModeloptNvfp4InputSchema = refused_input_schema(
    "ModeloptNvfp4InputSchema", "modelopt", "ModelOpt NVFP4 activations", module=__name__)

__all__ = ["ModeloptWeightSchema", "ModeloptNvfp4WeightSchema", "ModeloptMxfp8WeightSchema",
           "ModeloptInputSchema", "ModeloptNvfp4InputSchema"]
