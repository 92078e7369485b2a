"""Weight formats: INT4 group-32 quantization, compressed-tensors import, kernel layouts.

Chord's weights are symmetric INT4 with one bf16 scale per 32 consecutive K elements::

    W[e, n, k] = q[e, n, k] * scales[e, n, k // 32],    q in [-8, 7]

Three representations live here, all bit-exact images of each other:

* ``QuantizedExperts``   q int8 ``[E, N, K]`` + scales bf16 ``[E, N, K/32]`` (the plain form,
  used by the reference and tests).
* compressed-tensors ``pack-quantized`` (what Kimi K2.x INT4 checkpoints store): per expert
  ``weight_packed`` int32 ``[N, ceil(K/8)]``, ``weight_scale`` ``[N, K/32]``, ``weight_shape``
  ``[2]`` = ``(N, K)``.
* ``PackedExperts`` in the kernel layout ``swap16g`` of docs/architecture.md (built once, at
  load time, on the device the weights are on).

compressed-tensors convention (checked against compressed-tensors 0.20.1 from PyPI:
``compressed_tensors.compressors.pack_quantized.helpers.pack_to_int32`` /
``unpack_from_int32`` and ``PackedQuantizationCompressor``):

* Packing is dense along the last (K) dimension: element ``k`` occupies bits
  ``4*(k % 8) .. 4*(k % 8) + 3`` of word ``k // 8`` (least significant nibble first).
  A row whose K is not a multiple of 8 is zero-padded (nibble 0) at the end.
* Each nibble stores the *offset-binary* code ``q + 8`` (0..15), not two's complement:
  the packer adds ``1 << (num_bits - 1)`` before packing, the unpacker subtracts it.
* ``weight_shape`` is an int64 tensor ``[2]`` holding ``(N, K)`` (vLLM registers it as a float
  parameter ``[E, 2]``; Chord accepts integral floats too); for a symmetric scheme no
  ``weight_zero_point`` is stored. ``weight_scale`` has the dtype of the original weight
  (bf16 for Kimi K2.x) and shape ``[N, K/group_size]``.
* Its own quantizer (memoryless min-max observer, symmetric INT group strategy) uses
  ``scale = absmax / 7.5`` (``bit_range / 2`` with ``bit_range = 7 - (-8)``), rounds the
  scale to the weight dtype, replaces zero scales by ``finfo(dtype).eps``, and quantizes
  ``clamp(round(w / scale), -8, 7)`` with the division done in the weight dtype. So real
  checkpoints do contain ``q = -8``. ``quantize_int4_g32`` defaults to ``absmax / 7``
  (every group's extreme maps to +-7); pass ``divisor=7.5`` to mimic the library's scale.
  The two quantizers may still differ in rare ties because the library divides in bf16.

The ``swap16g`` layout (docs/architecture.md, "The kernel weight layout"). The 16-row tiles
``nt`` of an expert are stored in groups of ``G = tile_group(N)`` consecutive tiles (the largest
power of two <= 8 that divides N/16); tile ``nt = ng*G + j`` is tile ``j`` of group ``ng``:

* ``qweight`` int32 ``[E, N/16/G, K/64, G, 32, 4]``: word ``[e, ng, kb, j, l, s]`` with lane
  ``l = 4*g + t`` holds in nibble ``p = kk*4 + kh*2 + rh`` (least significant first) the code
  ``q + 8`` of ``W[e, nt*16 + rh*8 + g, kb*64 + s*16 + kh*8 + 2*t + kk]``.
* ``scales`` bf16 ``[E, N/16/G, K/64, G, 8, 2, 2]``: ``[e, ng, kb, j, g, gi, rh]`` = scale of row
  ``nt*16 + rh*8 + g`` and group ``kb*2 + gi``.

So K block ``kb`` of a whole group is one contiguous run (``G * 512`` bytes of words, ``G * 64``
of scales): a kernel's pipeline stage reads runs of up to 4 KB, not 512-byte pieces 56 KB apart.

All packers and unpackers are vectorised torch ops (reshape / permute / shift / view) that
run on the device of their input. Words are assembled byte-wise (two nibbles per uint8, four
bytes viewed as one int32), so no signed-overflow shifts are involved. That byte view
assumes a little-endian memory order, which holds for CUDA devices and x86/ARM hosts; on a
big-endian host the CPU path flips the bytes.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from chord import checks
from chord._env import TILE_GROUPS, tile_group_max

__all__ = [
    "GROUP_SIZE",
    "QuantizedExperts",
    "PackedExperts",
    "quantize_int4_g32",
    "dequantize",
    "pack_compressed_tensors",
    "unpack_compressed_tensors",
    "from_compressed_tensors",
    "stack_compressed_tensors_experts",
    "pack_experts",
    "unpack_experts",
    "pack_experts_from_compressed_tensors",
    "tile_group",
    "packed_shapes",
    "TILE_GROUPS",
]

GROUP_SIZE = 32
_SWAP16_N = 16
_SWAP16_K = 64
# Elements handled per chunk by the load-time repackers (bounds their temporary memory).
_CHUNK_ELEMS = 1 << 28


# --------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------


def _require_group_size(fn: str, group_size: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size != GROUP_SIZE:
        raise ValueError(
            f"{checks.where(fn, 'group_size')} must be {GROUP_SIZE} (Chord is W4A16 group 32), "
            f"got {group_size!r}"
        )


def _check_scales_finite(fn: str, name: str, scales: torch.Tensor) -> None:
    """A NaN or Inf group scale (a damaged checkpoint) would turn every output row that touches
    its group into NaN/Inf without an error: refused at load, with the first bad [e, n, group]."""
    if scales.numel() == 0 or scales.device.type == "meta":
        return
    bad = ~torch.isfinite(scales)
    if bool(bad.any()):
        first = [int(i) for i in bad.nonzero()[0].tolist()]
        raise ValueError(f"{checks.where(fn, name)} holds {int(bad.sum())} non-finite group scales (NaN or Inf), "
                         f"the first at index {first}")


def _check_q_range(fn: str, name: str, q: torch.Tensor) -> None:
    """Raise if any code is outside [-8, 7] (one device reduction; load time only)."""
    if q.numel() == 0 or q.device.type == "meta":
        return
    bad = (q < -8) | (q > 7)
    if bool(bad.any()):
        lo, hi = int(q.min()), int(q.max())
        raise ValueError(
            f"{checks.where(fn, name)} must hold int4 codes in [-8, 7], found values in [{lo}, {hi}]"
        )


def _words_as_bytes(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., W, 4], byte 0 = least significant."""
    b = words.contiguous().view(torch.uint8).unflatten(-1, (-1, 4))
    if words.device.type == "cpu" and sys.byteorder == "big":  # pragma: no cover
        b = b.flip(-1)
    return b


def _bytes_as_words(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., W, 4] (byte 0 = least significant) -> int32 [..., W]."""
    if b.device.type == "cpu" and sys.byteorder == "big":  # pragma: no cover
        b = b.flip(-1)
    return b.contiguous().flatten(-2).view(torch.int32)


def _expert_chunks(num_experts: int, elems_per_expert: int):
    step = max(1, _CHUNK_ELEMS // max(1, elems_per_expert))
    for e0 in range(0, num_experts, step):
        yield e0, min(num_experts, e0 + step)


# --------------------------------------------------------------------------------------
# plain quantized form
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedExperts:
    """Symmetric INT4 group-32 weights of E experts in plain form.

    ``q`` int8 ``[E, N, K]`` with codes in [-8, 7] and ``scales`` bf16 ``[E, N, K/32]``;
    the represented weight is ``q * scales`` (``dequantize``). Construction checks dtypes,
    shapes and devices (not the code range, which would need a device reduction).
    """

    q: torch.Tensor
    scales: torch.Tensor

    def __post_init__(self) -> None:
        fn = "QuantizedExperts"
        checks.tensor(fn, "q", self.q, dtype=(torch.int8,))
        checks.tensor(fn, "scales", self.scales, dtype=(torch.bfloat16,))
        checks.tensor(fn, "q", self.q, ndim=(3,), what="3-D [E, N, K]")
        checks.tensor(fn, "scales", self.scales, ndim=(3,), what="3-D [E, N, K/32]")
        e, n, k = self.q.shape
        if k % GROUP_SIZE != 0:
            raise ValueError(f"{checks.where(fn, 'q')} must have K divisible by {GROUP_SIZE}, got K={k}")
        if tuple(self.scales.shape) != (e, n, k // GROUP_SIZE):
            raise ValueError(
                f"{checks.where(fn, 'scales')} must have shape {(e, n, k // GROUP_SIZE)} "
                f"([E, N, K/32] for q of shape {tuple(self.q.shape)}), got {tuple(self.scales.shape)}"
            )
        checks.same_device(fn, "q", self.q, "scales", self.scales)

    @property
    def num_experts(self) -> int:
        return int(self.q.shape[0])

    @property
    def n(self) -> int:
        return int(self.q.shape[1])

    @property
    def k(self) -> int:
        return int(self.q.shape[2])

    @property
    def group_size(self) -> int:
        return GROUP_SIZE

    @property
    def device(self) -> torch.device:
        return self.q.device

    def dequantize(self) -> torch.Tensor:
        """float32 ``[E, N, K]`` weight (exact)."""
        return dequantize(self.q, self.scales)

    def expert(self, e: int) -> "QuantizedExperts":
        """The single expert ``e`` as a one-expert ``QuantizedExperts`` (views, no copy)."""
        return QuantizedExperts(self.q[e : e + 1], self.scales[e : e + 1])

    def to(self, device: torch.device | str) -> "QuantizedExperts":
        return QuantizedExperts(self.q.to(device), self.scales.to(device))


def quantize_int4_g32(
    w: torch.Tensor, group_size: int = GROUP_SIZE, *, divisor: float = 7.0
) -> QuantizedExperts:
    """Quantize float weights ``[N, K]`` or ``[E, N, K]`` to symmetric INT4, group 32 along K.

    ``scale = bf16(absmax(group) / divisor)`` (a zero scale, i.e. an all-zero group, becomes
    1.0 so nothing divides by zero), ``q = clamp(round_half_even(w / scale), -8, 7)``,
    computed in float32 with the *bf16-rounded* scale, so ``dequantize(q, scales)`` is exactly
    the represented weight. A 2-D input gives a one-expert ``QuantizedExperts`` (E = 1).
    ``divisor=7.5`` reproduces the scale rule of compressed-tensors' own quantizer.
    """
    fn = "quantize_int4_g32"
    _require_group_size(fn, group_size)
    checks.tensor(fn, "w", w, dtype=(torch.bfloat16, torch.float16, torch.float32, torch.float64))
    checks.tensor(fn, "w", w, ndim=(2, 3), what="2-D [N, K] or 3-D [E, N, K]")
    if w.shape[-1] % group_size != 0:
        raise ValueError(
            f"{checks.where(fn, 'w')} must have K (last dim) divisible by {group_size}, got K={w.shape[-1]}"
        )
    if not (isinstance(divisor, (int, float)) and 0 < float(divisor) <= 8):
        raise ValueError(f"{checks.where(fn, 'divisor')} must be in (0, 8], got {divisor!r}")
    w3 = w if w.dim() == 3 else w.unsqueeze(0)
    wf = w3.float().unflatten(-1, (-1, group_size))  # [E, N, G, 32]
    if w.numel() and w.device.type != "meta" and not bool(torch.isfinite(wf).all()):
        raise ValueError(f"{checks.where(fn, 'w')} contains non-finite values")
    absmax = wf.abs().amax(dim=-1)
    scales = (absmax / float(divisor)).to(torch.bfloat16)
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    q = torch.round(wf / scales.float().unsqueeze(-1)).clamp_(-8, 7).to(torch.int8)
    return QuantizedExperts(q.flatten(-2).contiguous(), scales.contiguous())


def _codes_and_scales(fn: str, q: Any, scales: Any, scale_dtypes: tuple[torch.dtype, ...]):
    """(q, scales) from either a QuantizedExperts alone or two tensors, with dtypes checked."""
    if isinstance(q, QuantizedExperts):
        if scales is not None:
            raise ValueError(f"{checks.where(fn, 'scales')} must be None when q is a QuantizedExperts")
        q, scales = q.q, q.scales
    checks.tensor(fn, "q", q, dtype=(torch.int8,))
    if scales is None:
        raise TypeError(f"{checks.where(fn, 'scales')} is required ([..., N, K/32]) when q is a tensor")
    checks.tensor(fn, "scales", scales, dtype=scale_dtypes)
    return q, scales


def dequantize(q: torch.Tensor | QuantizedExperts, scales: torch.Tensor | None = None) -> torch.Tensor:
    """Exact float32 weight ``q * float(scale)`` for ``q [..., N, K]``, ``scales [..., N, K/32]``.

    Also accepts a ``QuantizedExperts`` as the only argument.
    """
    fn = "dequantize"
    q, scales = _codes_and_scales(fn, q, scales, (torch.bfloat16, torch.float16, torch.float32))
    if q.dim() < 1 or q.shape[-1] % GROUP_SIZE != 0:
        raise ValueError(f"{checks.where(fn, 'q')} must have K (last dim) divisible by {GROUP_SIZE}, got shape {tuple(q.shape)}")
    want = (*q.shape[:-1], q.shape[-1] // GROUP_SIZE)
    if tuple(scales.shape) != want:
        raise ValueError(f"{checks.where(fn, 'scales')} must have shape {want}, got {tuple(scales.shape)}")
    checks.same_device(fn, "q", q, "scales", scales)
    return (q.float().unflatten(-1, (-1, GROUP_SIZE)) * scales.float().unsqueeze(-1)).flatten(-2)


# --------------------------------------------------------------------------------------
# compressed-tensors pack-quantized
# --------------------------------------------------------------------------------------


def pack_compressed_tensors(q: torch.Tensor) -> torch.Tensor:
    """int8 codes ``[..., K]`` in [-8, 7] -> compressed-tensors words int32 ``[..., ceil(K/8)]``.

    Element ``k`` goes to nibble ``k % 8`` (least significant first) of word ``k // 8`` as the
    offset-binary code ``q + 8``; a K that is not a multiple of 8 is zero-padded, as the
    library does.
    """
    fn = "pack_compressed_tensors"
    checks.tensor(fn, "q", q, dtype=(torch.int8,))
    if q.dim() < 1:
        raise ValueError(f"{checks.where(fn, 'q')} must have at least 1 dimension, got a scalar")
    _check_q_range(fn, "q", q)
    k = q.shape[-1]
    u = (q + 8).view(torch.uint8)
    pad = (-k) % 8
    if pad:
        u = torch.nn.functional.pad(u, (0, pad))
    pairs = u.unflatten(-1, (-1, 2))  # [..., K/2, 2]
    b = pairs[..., 0] | (pairs[..., 1] << 4)  # [..., K/2]
    return _bytes_as_words(b.unflatten(-1, (-1, 4)))


def unpack_compressed_tensors(words: torch.Tensor, k: int) -> torch.Tensor:
    """compressed-tensors words int32 ``[..., ceil(k/8)]`` -> int8 codes ``[..., k]`` in [-8, 7]."""
    fn = "unpack_compressed_tensors"
    checks.tensor(fn, "words", words, dtype=(torch.int32,))
    if words.dim() < 1:
        raise ValueError(f"{checks.where(fn, 'words')} must have at least 1 dimension, got a scalar")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"{checks.where(fn, 'k')} must be a non-negative int, got {k!r}")
    if words.shape[-1] != -(-k // 8):
        raise ValueError(
            f"{checks.where(fn, 'words')} must have ceil(k/8) = {-(-k // 8)} words in its last dim "
            f"for k={k}, got {words.shape[-1]}"
        )
    b = _words_as_bytes(words).flatten(-2)  # [..., W*4]
    nib = torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)  # [..., W*8]
    return (nib[..., :k].view(torch.int8) - 8).contiguous()


def _shape_from_weight_shape(fn: str, weight_shape: Any) -> tuple[int, int]:
    """(N, K) from a weight_shape tensor [2] / [E, 2] or a sequence of two ints."""
    if isinstance(weight_shape, torch.Tensor):
        if weight_shape.dtype == torch.bool or weight_shape.is_complex():
            raise TypeError(f"{checks.where(fn, 'weight_shape')} must be an integer tensor, got {weight_shape.dtype}")
        ws = weight_shape.detach().cpu().reshape(-1, weight_shape.shape[-1] if weight_shape.dim() else 1)
        if ws.shape[-1] != 2 or weight_shape.dim() not in (1, 2):
            raise ValueError(
                f"{checks.where(fn, 'weight_shape')} must have shape [2] or [E, 2] (N, K), got {tuple(weight_shape.shape)}"
            )
        if ws.dtype.is_floating_point:  # vLLM registers weight_shape as a float parameter
            if not bool((ws == ws.round()).all()):
                raise TypeError(f"{checks.where(fn, 'weight_shape')} must hold integers, got {ws.tolist()}")
            ws = ws.long()
        if not bool((ws == ws[0]).all()):
            raise ValueError(f"{checks.where(fn, 'weight_shape')} differs between experts: {ws.tolist()}")
        n, k = (int(v) for v in ws[0])
    elif isinstance(weight_shape, Sequence) and len(weight_shape) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in weight_shape
    ):
        n, k = int(weight_shape[0]), int(weight_shape[1])
    else:
        raise TypeError(
            f"{checks.where(fn, 'weight_shape')} must be an int tensor [2] or a pair of ints (N, K), got {weight_shape!r}"
        )
    if n <= 0 or k <= 0:
        raise ValueError(f"{checks.where(fn, 'weight_shape')} must be positive (N, K), got {(n, k)}")
    return n, k


def _check_compressed(
    fn: str, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_shape: Any
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Validate compressed-tensors tensors; return (packed [E,N,W], scale bf16 [E,N,G], N, K)."""
    checks.tensor(fn, "weight_packed", weight_packed, dtype=(torch.int32,))
    checks.tensor(fn, "weight_scale", weight_scale, dtype=(torch.bfloat16, torch.float16))
    checks.tensor(fn, "weight_packed", weight_packed, ndim=(2, 3), what="[N, K/8] (one expert) or [E, N, K/8]")
    if weight_scale.dim() != weight_packed.dim():
        raise ValueError(
            f"{checks.where(fn, 'weight_scale')} must have the same rank as weight_packed "
            f"({weight_packed.dim()}), got shape {tuple(weight_scale.shape)}"
        )
    checks.same_device(fn, "weight_packed", weight_packed, "weight_scale", weight_scale)
    n, k = _shape_from_weight_shape(fn, weight_shape)
    packed = weight_packed if weight_packed.dim() == 3 else weight_packed.unsqueeze(0)
    scale = weight_scale if weight_scale.dim() == 3 else weight_scale.unsqueeze(0)
    if k % GROUP_SIZE != 0:
        raise ValueError(f"{checks.where(fn, 'weight_shape')} must have K divisible by {GROUP_SIZE}, got K={k}")
    if tuple(packed.shape[1:]) != (n, k // 8):
        raise ValueError(
            f"{checks.where(fn, 'weight_packed')} must have trailing shape {(n, k // 8)} for weight_shape "
            f"{(n, k)}, got {tuple(weight_packed.shape)}"
        )
    if scale.shape[0] != packed.shape[0] or scale.shape[1] != n:
        raise ValueError(
            f"{checks.where(fn, 'weight_scale')} must have shape {(*weight_packed.shape[:-1], k // GROUP_SIZE)}, "
            f"got {tuple(weight_scale.shape)}"
        )
    if scale.shape[2] != k // GROUP_SIZE:
        gs = k / scale.shape[2] if scale.shape[2] else float("nan")
        raise ValueError(
            f"{checks.where(fn, 'weight_scale')} implies group size {gs:g} (K={k} / {scale.shape[2]} scales); "
            f"Chord supports group size {GROUP_SIZE} only"
        )
    _check_scales_finite(fn, "weight_scale", scale)
    if scale.dtype == torch.float16:
        as_bf16 = scale.to(torch.bfloat16)
        if scale.numel() and not bool((as_bf16.to(torch.float16) == scale).all()):
            rel = ((as_bf16.float() - scale.float()).abs() / scale.float().abs().clamp_min(1e-30)).max()
            warnings.warn(
                f"{fn}: fp16 weight_scale rounded to bf16 (max relative change {float(rel):.2e}); "
                "the kernels use bf16 scales",
                stacklevel=3,
            )
        scale = as_bf16
    return packed, scale, n, k


def from_compressed_tensors(
    weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_shape: Any
) -> QuantizedExperts:
    """compressed-tensors pack-quantized tensors -> ``QuantizedExperts`` (one or stacked experts).

    ``weight_packed`` int32 ``[N, K/8]`` or ``[E, N, K/8]``; ``weight_scale`` bf16 / fp16
    ``[(E,) N, K/32]`` (fp16 is rounded to bf16, with a warning when that is inexact);
    ``weight_shape`` int tensor ``[2]`` / ``[E, 2]`` or a pair ``(N, K)``. One expert gives E = 1.
    """
    fn = "from_compressed_tensors"
    packed, scale, n, k = _check_compressed(fn, weight_packed, weight_scale, weight_shape)
    q = unpack_compressed_tensors(packed, k)
    return QuantizedExperts(q, scale.contiguous())


def stack_compressed_tensors_experts(
    experts: Sequence[Mapping[str, Any] | Sequence[Any]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack per-expert checkpoint tensors into ``(weight_packed [E,N,K/8], weight_scale [E,N,K/32],
    weight_shape [2])``.

    Each item is either a mapping with keys ``weight_packed``, ``weight_scale``, ``weight_shape``
    or a 3-tuple in that order. All experts must have the same shapes and dtypes.
    """
    fn = "stack_compressed_tensors_experts"
    if isinstance(experts, (Mapping, torch.Tensor)) or not isinstance(experts, Sequence) or len(experts) == 0:
        raise ValueError(f"{checks.where(fn, 'experts')} must be a non-empty list of (packed, scale, shape)")
    packs, scales, shape0 = [], [], None
    for i, item in enumerate(experts):
        if isinstance(item, Mapping):
            try:
                p, s, sh = item["weight_packed"], item["weight_scale"], item["weight_shape"]
            except KeyError as exc:
                raise ValueError(f"{checks.where(fn, 'experts')}[{i}] lacks key {exc}") from None
        elif isinstance(item, Sequence) and len(item) == 3:
            p, s, sh = item
        else:
            raise ValueError(f"{checks.where(fn, 'experts')}[{i}] must be a dict or a (packed, scale, shape) triple")
        checks.tensor(fn, f"experts[{i}].weight_packed", p, dtype=(torch.int32,))
        checks.tensor(fn, f"experts[{i}].weight_packed", p, ndim=(2,), what="2-D [N, K/8]")
        nk = _shape_from_weight_shape(fn, sh)
        if shape0 is None:
            shape0 = nk
        elif nk != shape0:
            raise ValueError(f"{checks.where(fn, 'experts')}[{i}] has weight_shape {nk}, expert 0 has {shape0}")
        packs.append(p)
        scales.append(s)
    for i, (p, s) in enumerate(zip(packs, scales)):
        checks.tensor(fn, f"experts[{i}].weight_scale", s)
        if p.shape != packs[0].shape or s.shape != scales[0].shape or s.dtype != scales[0].dtype:
            raise ValueError(
                f"{checks.where(fn, 'experts')}[{i}] has packed {tuple(p.shape)} / scale {tuple(s.shape)} {s.dtype}, "
                f"expert 0 has {tuple(packs[0].shape)} / {tuple(scales[0].shape)} {scales[0].dtype}"
            )
    assert shape0 is not None
    return torch.stack(packs), torch.stack(scales), torch.tensor(shape0, dtype=torch.int64)


# --------------------------------------------------------------------------------------
# kernel layout swap16g
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class PackedExperts:
    """INT4 group-32 expert weights in the kernel layout ``swap16g`` (docs/architecture.md).

    ``qweight`` int32 ``[E, N/16/G, K/64, G, 32, 4]``, ``scales`` bf16
    ``[E, N/16/G, K/64, G, 8, 2, 2]`` with ``G = tile_group(N)``, both contiguous and on one
    device. Exactly 0.5625 bytes per weight.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    num_experts: int
    n: int
    k: int
    group_size: int = GROUP_SIZE
    layout: str = "swap16g"

    def __post_init__(self) -> None:
        fn = "PackedExperts"
        _require_group_size(fn, self.group_size)
        if self.layout != "swap16g":
            raise ValueError(f"{checks.where(fn, 'layout')} must be 'swap16g' (the tile-grouped layout of this "
                             f"chord version; repack older 'swap16' weights with pack_experts), got {self.layout!r}")
        checks.tensor(fn, "qweight", self.qweight, dtype=(torch.int32,))
        checks.tensor(fn, "scales", self.scales, dtype=(torch.bfloat16,))
        e, n, k = self.num_experts, self.n, self.k
        for name, v in (("num_experts", e), ("n", n), ("k", k)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{checks.where(fn, name)} must be a positive int, got {v!r}")
        _check_swap16_nk(fn, "n", n, "k", k)
        # G comes from the weights themselves (qweight's dimension 3), not from the environment:
        # weights packed under any CHORD_TILE_GROUP cap stay valid wherever they are used
        g = self.qweight.shape[3] if self.qweight.dim() == 6 else None
        if g not in TILE_GROUPS or (n // _SWAP16_N) % g:
            raise ValueError(f"{checks.where(fn, 'qweight')} must be [E, N/16/G, K/64, G, 32, 4] with G in "
                             f"{TILE_GROUPS} dividing N/16={n // _SWAP16_N}, got {tuple(self.qweight.shape)}")
        want_q, want_s = packed_shapes(e, n, k, g)
        if tuple(self.qweight.shape) != want_q:
            raise ValueError(f"{checks.where(fn, 'qweight')} must have shape {want_q}, got {tuple(self.qweight.shape)}")
        if tuple(self.scales.shape) != want_s:
            raise ValueError(f"{checks.where(fn, 'scales')} must have shape {want_s}, got {tuple(self.scales.shape)}")
        if not self.qweight.is_contiguous():
            raise ValueError(f"{checks.where(fn, 'qweight')} must be contiguous")
        if not self.scales.is_contiguous():
            raise ValueError(f"{checks.where(fn, 'scales')} must be contiguous")
        checks.same_device(fn, "qweight", self.qweight, "scales", self.scales)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        """Bytes of qweight + scales (= 0.5625 * E * N * K)."""
        return self.qweight.numel() * 4 + self.scales.numel() * 2

    def to(self, device: torch.device | str) -> "PackedExperts":
        return dataclasses.replace(self, qweight=self.qweight.to(device), scales=self.scales.to(device))


def tile_group(n: int, cap: int | None = None) -> int:
    """G of the ``swap16g`` layout for N output features: the largest power of two <= `cap` that
    divides N/16 (csrc/common/params.cuh, ``Swap16Layout``, computes the same). `cap` defaults to
    ``CHORD_TILE_GROUP`` (8), lowered only to pack weights for the layout's ablation."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        checks.fail("tile_group", "n", "be a positive int (output features)", repr(n))
    _check_swap16_nk("tile_group", "n", n, "n", _SWAP16_K)
    nt = n // _SWAP16_N
    return min(tile_group_max() if cap is None else cap, nt & -nt)


def packed_shapes(num_experts: int, n: int, k: int, g: int | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of ``qweight`` (int32) and ``scales`` (bf16) of ``PackedExperts`` with these sizes
    and tile group `g` (default: ``tile_group(n)``, what the packers use now)."""
    g = tile_group(n) if g is None else g
    return (num_experts, n // 16 // g, k // 64, g, 32, 4), (num_experts, n // 16 // g, k // 64, g, 8, 2, 2)


def _grouped(t: torch.Tensor, g: int) -> torch.Tensor:
    """[E, NT, KB, ...] (tile-major) -> [E, NT/G, KB, G, ...] (the swap16g order)."""
    e, nt, kb = t.shape[:3]
    return t.reshape(e, nt // g, g, kb, *t.shape[3:]).transpose(2, 3).contiguous()


def _ungrouped(t: torch.Tensor) -> torch.Tensor:
    """[E, NT/G, KB, G, ...] -> [E, NT, KB, ...] (tile-major)."""
    e, ng, kb, g = t.shape[:4]
    return t.transpose(2, 3).reshape(e, ng * g, kb, *t.shape[4:])


def _check_swap16_nk(fn: str, n_name: str, n: int, k_name: str, k: int) -> None:
    if n % _SWAP16_N != 0:
        checks.fail(fn, n_name, f"have N (output features) divisible by {_SWAP16_N} (the swap16g layout)", f"N={n}")
    if k % _SWAP16_K != 0:
        checks.fail(fn, k_name, f"have K (reduction dim) divisible by {_SWAP16_K} (the swap16g layout)", f"K={k}")


def _swap16_scales(scales: torch.Tensor, group: int) -> torch.Tensor:
    """bf16 [E, N, K/32] -> [E, N/16/G, K/64, G, 8(g), 2(gi), 2(rh)] with G = `group`."""
    e, n, g = scales.shape
    s = scales.reshape(e, n // 16, 2, 8, g // 2, 2)  # e, nt, rh, g, kb, gi
    return _grouped(s.permute(0, 1, 4, 3, 5, 2), group)


def padding_scales_zero(scales: torch.Tensor, n: int) -> bool:
    """Whether every group scale of the 16-row tiles wholly at or past output feature `n` is zero,
    in swap16g scales ``[E, N/16/G, K/64, G, 8, 2, 2]``: the N padding of a layer packed from N = n
    features (zero scales, so the padding rows compute zeros). Reads those tiles only (views, no
    copy) with one device reduction."""
    e, ng, kb, g = scales.shape[:4]
    t0 = -(-n // 16)  # first tile with no real feature
    if t0 >= ng * g:
        return True
    q0, p0 = divmod(t0, g)
    partial = scales[:, q0, :, p0:]  # the rest of the group of tile t0
    rest = scales[:, q0 + 1:]  # every later group
    return not bool(torch.stack([partial.ne(0).any(), rest.ne(0).any()]).any())


def _swap16_scales_inverse(s: torch.Tensor) -> torch.Tensor:
    s = _ungrouped(s)
    e, nt, kb = s.shape[:3]
    return s.permute(0, 1, 5, 3, 2, 4).reshape(e, nt * 16, kb * 2).contiguous()


def pack_experts(
    q: torch.Tensor | QuantizedExperts, scales: torch.Tensor | None = None
) -> PackedExperts:
    """Plain INT4 codes + bf16 scales -> ``PackedExperts`` in the ``swap16g`` kernel layout.

    ``q`` int8 ``[E, N, K]`` (or ``[N, K]`` for one expert) with codes in [-8, 7] and ``scales``
    bf16 ``[E, N, K/32]``, or a ``QuantizedExperts`` alone. Needs N % 16 == 0 and K % 64 == 0.
    Runs on the device of ``q``; temporaries are bounded by processing experts in chunks.
    """
    fn = "pack_experts"
    q, scales = _codes_and_scales(fn, q, scales, (torch.bfloat16,))
    checks.tensor(fn, "q", q, ndim=(2, 3), what="2-D [N, K] or 3-D [E, N, K]")
    if scales.dim() != q.dim():
        raise ValueError(f"{checks.where(fn, 'scales')} must have the same rank as q ({q.dim()}), got shape {tuple(scales.shape)}")
    checks.same_device(fn, "q", q, "scales", scales)
    if q.dim() == 2:
        q, scales = q.unsqueeze(0), scales.unsqueeze(0)
    e, n, k = q.shape
    if e == 0:
        raise ValueError(f"{checks.where(fn, 'q')} must hold at least one expert, got shape {tuple(q.shape)}")
    _check_swap16_nk(fn, "q", n, "q", k)
    if tuple(scales.shape) != (e, n, k // GROUP_SIZE):
        raise ValueError(
            f"{checks.where(fn, 'scales')} must have shape {(e, n, k // GROUP_SIZE)} ([E, N, K/32]), got {tuple(scales.shape)}"
        )
    _check_q_range(fn, "q", q)
    _check_scales_finite(fn, "scales", scales)

    nt, kb, g = n // 16, k // 64, tile_group(n)
    qweight = torch.empty(packed_shapes(e, n, k, g)[0], dtype=torch.int32, device=q.device)
    for e0, e1 in _expert_chunks(e, n * k):
        u = (q[e0:e1] + 8).view(torch.uint8)
        # n = nt*16 + rh*8 + g ; k = kb*64 + s*16 + kh*8 + t*2 + kk
        u = u.reshape(e1 - e0, nt, 2, 8, kb, 4, 2, 4, 2)  # e nt rh g kb s kh t kk
        u = u.permute(0, 1, 4, 3, 7, 5, 8, 6, 2)  # e nt kb g t s kk kh rh
        b = u[..., 0] | (u[..., 1] << 4)  # byte (kk, kh): nibble pair rh=0 low, rh=1 high
        b = b.reshape(e1 - e0, nt, kb, 32, 4, 4)  # ... lane, s, byte = kk*2 + kh
        qweight[e0:e1] = _grouped(_bytes_as_words(b), g)
    return PackedExperts(qweight, _swap16_scales(scales, g), e, n, k)


def unpack_experts(p: PackedExperts) -> QuantizedExperts:
    """Invert ``pack_experts`` bit-exactly: ``PackedExperts`` -> ``QuantizedExperts``."""
    fn = "unpack_experts"
    if not isinstance(p, PackedExperts):
        raise TypeError(f"{checks.where(fn, 'p')} must be a PackedExperts, got {type(p).__name__}")
    e, n, k = p.num_experts, p.n, p.k
    nt, kb = n // 16, k // 64
    b = _words_as_bytes(_ungrouped(p.qweight))  # e nt kb lane s byte
    b = b.reshape(e, nt, kb, 8, 4, 4, 2, 2)  # e nt kb g t s kk kh
    u = torch.stack((b & 0xF, b >> 4), dim=-1)  # ... rh
    u = u.permute(0, 1, 8, 3, 2, 5, 7, 4, 6)  # e nt rh g kb s kh t kk
    q = u.reshape(e, n, k).view(torch.int8) - 8
    return QuantizedExperts(q.contiguous(), _swap16_scales_inverse(p.scales))


def pack_experts_from_compressed_tensors(
    weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_shape: Any
) -> PackedExperts:
    """compressed-tensors pack-quantized tensors straight to ``PackedExperts`` (``swap16g``).

    Same inputs as ``from_compressed_tensors``. Bytes are re-paired directly (two checkpoint
    bytes of rows ``n`` and ``n + 8`` give two kernel bytes), per chunk of experts, so no int8
    copy of the whole weight is ever materialised; temporaries are at most about the int4
    size of one chunk.
    """
    fn = "pack_experts_from_compressed_tensors"
    packed, scale, n, k = _check_compressed(fn, weight_packed, weight_scale, weight_shape)
    _check_swap16_nk(fn, "weight_shape", n, "weight_shape", k)
    e = packed.shape[0]
    if e == 0:
        raise ValueError(f"{checks.where(fn, 'weight_packed')} must hold at least one expert")
    nt, kb, g = n // 16, k // 64, tile_group(n)
    qweight = torch.empty(packed_shapes(e, n, k, g)[0], dtype=torch.int32, device=packed.device)
    for e0, e1 in _expert_chunks(e, n * k):
        # checkpoint byte j of row n holds k = 2j (low nibble) and 2j + 1 (high nibble), so
        # one byte covers (t, kk=0..1) of k = kb*64 + s*16 + kh*8 + t*2 + kk.
        cb = _words_as_bytes(packed[e0:e1]).reshape(e1 - e0, nt, 2, 8, kb, 4, 2, 4)  # e nt rh g kb s kh t
        lo_row, hi_row = cb[:, :, 0], cb[:, :, 1]  # rows rh=0 / rh=1: e nt g kb s kh t
        out = torch.stack(
            (
                (lo_row & 0xF) | (hi_row << 4),  # kk = 0: low nibbles of both rows
                (lo_row >> 4) | (hi_row & 0xF0),  # kk = 1: high nibbles of both rows
            ),
            dim=-1,
        )  # e nt g kb s kh t kk
        out = out.permute(0, 1, 3, 2, 6, 4, 7, 5)  # e nt kb g t s kk kh
        qweight[e0:e1] = _grouped(_bytes_as_words(out.reshape(e1 - e0, nt, kb, 32, 4, 4)), g)
    return PackedExperts(qweight, _swap16_scales(scale.contiguous(), g), e, n, k)
