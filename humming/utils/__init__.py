"""Helpers vLLM imports from ``humming.utils`` (only ``humming.utils.weight.quantize_weight``)."""
