"""The one error type of Chord's ``humming`` shim, and the sentence that says what is served.

Every refusal (a checkpoint scheme, an environment setting, a runtime argument Chord has no
kernel for) raises :class:`ChordUnsupportedError` at load time, naming what was asked for and
what Chord serves, so nothing silently runs on a wrong kernel.
"""
from __future__ import annotations

SUPPORTED = (
    "Chord serves W4A16 only: 4-bit symmetric integer weights (compressed-tensors 'pack-quantized' "
    "int4, e.g. Kimi K2.x INT4, or the native Humming uint4 schema) with bf16/fp16 scales in groups "
    "of 32 along K (multiples of 32 and per-channel scales are expanded to 32 at load), bf16 "
    "activations and output, no zero points, no bias, no input quantization, no Hadamard rotation"
)


class ChordUnsupportedError(ValueError, NotImplementedError):
    """A quantization scheme, setting or argument that Chord's humming backend does not serve."""

    def __init__(self, what: str, hint: str = "") -> None:
        self.what = what
        self.hint = hint
        msg = f"{what} is not supported by Chord's humming backend. {SUPPORTED}."
        if hint:
            msg += f" {hint}"
        super().__init__(msg)


OTHER_BACKEND_HINT = (
    "Serve this checkpoint with another vLLM MoE backend (e.g. --moe-backend marlin or triton), "
    "or uninstall chord-moe."
)
