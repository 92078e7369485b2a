"""FP8 checkpoints (``quant_method: fp8``): not served by Chord (W4A16 only)."""
from __future__ import annotations

from humming.schema.base import refused_input_schema, refused_weight_schema

Fp8WeightSchema = refused_weight_schema("Fp8WeightSchema", "fp8", "FP8 weights (quant_method 'fp8')",
                                        module=__name__)
Fp8InputSchema = refused_input_schema("Fp8InputSchema", "fp8", "FP8 activations (quant_method 'fp8')",
                                      module=__name__)

__all__ = ["Fp8WeightSchema", "Fp8InputSchema"]
