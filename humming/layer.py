"""``humming.layer``: a W4A16 layer in Chord's layout as a ``torch.nn.Module`` (outside vLLM).

vLLM 0.33 does not use this module; it exists for scripts that drive the shim directly
(tests, notebooks): build from checkpoint tensors with :meth:`HummingLayer.from_tensors`,
call it like :func:`humming.forward.humming_forward` without the weight arguments.
"""
from __future__ import annotations

from typing import Any

import torch

from humming.config import GemmType, LayerConfig
from humming.forward import check_layer_tensors, humming_forward
from humming.schema import BaseWeightSchema, HummingInputSchema
from humming.transform import prepare_and_transform_humming_tensors

__all__ = ["HummingLayer"]


class HummingLayer(torch.nn.Module):
    def __init__(self, config: LayerConfig, weight: torch.Tensor, weight_scale: torch.Tensor) -> None:
        super().__init__()
        check_layer_tensors(config, weight, weight_scale, fn="HummingLayer")
        self.config = config
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.weight_scale = torch.nn.Parameter(weight_scale, requires_grad=False)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], shape_n: int, shape_k: int,
                     weight_schema: BaseWeightSchema, num_experts: int | None = None, pad_n_to_multiple: int = 256,
                     pad_k_to_multiple: int = 128, device: Any = None) -> "HummingLayer":
        """Checkpoint tensors (of `weight_schema`) -> a layer in Chord's kernel layout."""
        config, out = prepare_and_transform_humming_tensors(
            tensors, shape_n, shape_k, weight_schema, HummingInputSchema(), num_experts=num_experts,
            pad_n_to_multiple=pad_n_to_multiple, pad_k_to_multiple=pad_k_to_multiple, torch_dtype=torch.bfloat16,
            device=device)
        return cls(config, out["weight"], out["weight_scale"])

    def forward(self, inputs: torch.Tensor, gemm_type: GemmType | str | None = None, **kwargs: Any) -> torch.Tensor:
        if gemm_type is None:
            gemm_type = GemmType.INDEXED if self.config.num_experts else GemmType.DENSE
        gemm_type = getattr(gemm_type, "value", gemm_type)
        kwargs.setdefault("compute_config", {"gemm_type": gemm_type})
        return humming_forward(self.config, inputs, self.weight, self.weight_scale, **kwargs)

    def extra_repr(self) -> str:
        c = self.config
        return (f"experts={c.num_experts}, n={c.n}, k={c.k} (padded {c.shape_n}x{c.shape_k}), "
                f"group={c.checkpoint_group_size or 'channel'}, layout={c.layout}")
