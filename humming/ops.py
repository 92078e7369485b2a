"""``humming.ops.process_input``: the input processing vLLM runs before a Humming GEMM.

For Chord that is only the activation between gate_up and down (plus the row scatter and the
valid-row bounds that come with it); input quantization and Hadamard rotation are refused.
The work is one custom op, ``torch.ops.chord.humming_process_input`` (a fake implementation
makes it traceable by torch.compile; eager calls skip the dispatcher): on CUDA tensors it launches the compiled elementwise
kernel of :mod:`humming.activation`, on CPU tensors it evaluates the same expression with torch.
"""
from __future__ import annotations

from typing import Optional

import torch

from chord import checks

from humming import activation
from humming.errors import ChordUnsupportedError

__all__ = ["process_input"]

_BACKENDS = ("auto", "cuda", "torch")


def _process_input_impl(inputs: torch.Tensor, outputs: torch.Tensor, scatter_idx: Optional[torch.Tensor],
                        expert_tokens: Optional[torch.Tensor], num_valid_tokens: Optional[torch.Tensor],
                        activation_type: str, activation_impl: str, layout: str, zero_invalid: bool,
                        backend: str) -> None:
    kwargs = dict(activation_type=activation_type, activation_impl=activation_impl, layout=layout,
                  scatter_idx=scatter_idx, expert_tokens=expert_tokens, num_valid_tokens=num_valid_tokens,
                  zero_invalid=zero_invalid)
    use_kernel = backend == "cuda" or (backend == "auto" and inputs.is_cuda)
    if use_kernel:
        activation.launch(inputs, outputs, **kwargs)
    else:
        activation.reference(inputs, outputs, **kwargs)


@torch.library.custom_op("chord::humming_process_input", mutates_args=("outputs",))
def _process_input_op(inputs: torch.Tensor, outputs: torch.Tensor, scatter_idx: Optional[torch.Tensor],
                      expert_tokens: Optional[torch.Tensor], num_valid_tokens: Optional[torch.Tensor],
                      activation_type: str, activation_impl: str, layout: str, zero_invalid: bool,
                      backend: str) -> None:
    _process_input_impl(inputs, outputs, scatter_idx, expert_tokens, num_valid_tokens, activation_type,
                        activation_impl, layout, zero_invalid, backend)


@_process_input_op.register_fake
def _(inputs, outputs, scatter_idx, expert_tokens, num_valid_tokens, activation_type, activation_impl, layout,
      zero_invalid, backend) -> None:
    return None


def _check_index(name: str, t: Optional[torch.Tensor], device: int, dtypes: tuple) -> None:
    # per-call hot path: an int device compare here; the message is chord.checks' (one form)
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or t.get_device() != device or not t.is_contiguous():
        checks.tensor("process_input", name, t, dtype=dtypes, contiguous=True)
        checks.fail("process_input", name, "be on the device of inputs", t.device)


def process_input(
    inputs: torch.Tensor,
    *,
    outputs: Optional[torch.Tensor] = None,
    quant_mode: str = "none",
    quant_dtype: Optional[str] = None,
    quant_group_size: Optional[int] = None,
    group_scales: Optional[torch.Tensor] = None,
    group_scale_dtype: Optional[str] = None,
    token_scales: Optional[torch.Tensor] = None,
    activation_type: str = "none",
    activation_impl: Optional[str] = None,
    hadamard_block_size: Optional[int] = None,
    layout: str = "normal",
    expert_tokens: Optional[torch.Tensor] = None,
    scatter_idx: Optional[torch.Tensor] = None,
    num_valid_tokens: Optional[torch.Tensor] = None,
    zero_invalid: bool = False,
    use_m_major_input_scale: bool = False,
    use_pdl: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, None, None]:
    """Apply the activation (and the row layout) to `inputs`, writing `outputs`.

    Returns ``(outputs, None, None)``: Chord never quantizes inputs, so there are no group or
    token scales. ``backend``: ``auto`` (CUDA kernel for CUDA tensors, torch for CPU tensors),
    ``cuda`` or ``torch`` (to compare the two).
    """
    if (quant_mode or "none") != "none" or quant_dtype is not None:
        raise ChordUnsupportedError(f"Input quantization in process_input (quant_mode={quant_mode!r}, "
                                    f"quant_dtype={quant_dtype!r})")
    if hadamard_block_size is not None and hadamard_block_size > 1:
        raise ChordUnsupportedError(f"Hadamard rotation (hadamard_block_size={hadamard_block_size})")
    if backend not in _BACKENDS:
        raise ValueError(f"process_input: backend must be one of {_BACKENDS}, got {backend!r}")
    if layout not in activation.LAYOUTS:
        raise ValueError(f"process_input: layout must be one of {tuple(activation.LAYOUTS)}, got {layout!r}")
    act_type, impl = activation.check_activation(activation_type, activation_impl)
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"process_input: inputs must be a tensor, got {type(inputs).__name__}")
    if inputs.dim() != 2:
        inputs = inputs.reshape(-1, inputs.shape[-1])
    if inputs.dtype != torch.bfloat16:
        raise ChordUnsupportedError(f"process_input on {inputs.dtype} inputs", "Serve the model with --dtype bfloat16.")
    if inputs.stride(-1) != 1:
        raise ValueError("process_input: inputs must have unit stride in the last dimension")
    dev = inputs.get_device()  # -1 on CPU; an int compare is much cheaper than torch.device objects
    cols = activation.out_cols(act_type, inputs.shape[-1]) if activation_type != "none" else inputs.shape[-1]

    _check_index("scatter_idx", scatter_idx, dev, (torch.int32,))
    _check_index("expert_tokens", expert_tokens, dev, (torch.int32,))
    _check_index("num_valid_tokens", num_valid_tokens, dev, (torch.int32, torch.int64))
    if num_valid_tokens is not None and num_valid_tokens.numel() < 1:
        raise ValueError("process_input: num_valid_tokens must hold one element")
    if layout == "scatter":
        if scatter_idx is None:
            raise ValueError("process_input: layout='scatter' needs scatter_idx")
        if scatter_idx.dim() not in (1, 2) or scatter_idx.shape[0] > inputs.shape[0]:
            raise ValueError(f"process_input: scatter_idx must be [R] or [R, C] with R <= inputs rows "
                             f"({inputs.shape[0]}), got {tuple(scatter_idx.shape)}")
        out_rows = scatter_idx.numel()
    elif layout == "grouped_mask":
        if expert_tokens is None or expert_tokens.dim() != 1 or expert_tokens.numel() == 0:
            raise ValueError("process_input: layout='grouped_mask' needs expert_tokens int32 [E]")
        if inputs.shape[0] % expert_tokens.numel():
            raise ValueError(f"process_input: grouped_mask inputs must have E*max_rows rows (E="
                             f"{expert_tokens.numel()}), got {inputs.shape[0]}")
        out_rows = inputs.shape[0]
    else:
        out_rows = inputs.shape[0]

    if outputs is None:
        outputs = torch.empty(out_rows, cols, dtype=inputs.dtype, device=inputs.device)
    else:
        if outputs.dim() != 2:
            outputs = outputs.view(-1, outputs.shape[-1])
        if outputs.dtype != inputs.dtype or outputs.get_device() != dev:
            raise ValueError(f"process_input: outputs must be {inputs.dtype} on {inputs.device}, got {outputs.dtype} "
                             f"on {outputs.device}")
        if outputs.shape[-1] != cols or outputs.stride(-1) != 1:
            raise ValueError(f"process_input: outputs must have {cols} unit-stride columns for activation "
                             f"{activation_type!r} of {inputs.shape[-1]} input columns, got {tuple(outputs.shape)}")
        if layout != "scatter" and outputs.shape[0] < inputs.shape[0]:
            raise ValueError(f"process_input: outputs must have at least {inputs.shape[0]} rows, got {outputs.shape[0]}")
    args = (inputs, outputs, scatter_idx, expert_tokens, num_valid_tokens, act_type, impl, layout, bool(zero_invalid),
            backend)
    if torch.compiler.is_compiling():
        torch.ops.chord.humming_process_input(*args)
    else:  # eager: skip the custom-op dispatcher round trip (tens of microseconds of host time)
        _process_input_impl(*args)
    return outputs, None, None
