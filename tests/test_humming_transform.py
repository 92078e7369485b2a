"""Load-time repack of humming.transform: padding, scale-group expansion, dense layers, online quant.

Checked bit-exactly by unpacking the kernel tensors with chord.formats: the unpadded part holds
exactly the checkpoint's codes and (expanded) scales, the padding holds q = 0.
"""
from __future__ import annotations

import pytest
import torch

from chord import formats as F
from chord.formats import packed_shapes
from humming import _chord
from humming.schema import HummingInputSchema, HummingWeightSchema
from humming.transform import prepare_and_transform_humming_tensors

BF16 = torch.bfloat16


def _native(e, n, k, group, seed=0):
    """Native Humming uint4 tensors (same bits as compressed-tensors pack-quantized) + the int8 codes."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (e, n, k), generator=g, dtype=torch.int8)
    groups = 1 if group is None else k // group
    scale = (torch.rand(e, n, groups, generator=g) * 0.02 + 0.001).to(BF16)
    return {"weight": F.pack_compressed_tensors(q), "weight_scale": scale}, q


@pytest.mark.parametrize("e, n, k, group, pad_n, pad_k", [
    (3, 256, 256, 32, 256, 128),     # Kimi-like: nothing to pad
    (2, 192, 320, 32, 256, 128),     # N 192 -> 256, K 320 -> 384
    (2, 96, 256, 128, 256, 128),     # group 128 expanded to 32
    (2, 64, 96, None, 256, 128),     # per-channel scales
    (1, 48, 100, None, 1, 1),        # K not a multiple of 8 or 64; layout minimum 16/64 still applies
])
def test_repack_is_exact_on_the_unpadded_part(e, n, k, group, pad_n, pad_k):
    tensors, q = _native(e, n, k, group)
    ws = HummingWeightSchema(weight_scale_group_size=group or 0)
    cfg, out = prepare_and_transform_humming_tensors(tensors, n, k, ws, HummingInputSchema(), num_experts=e,
                                                     pad_n_to_multiple=pad_n, pad_k_to_multiple=pad_k,
                                                     torch_dtype=BF16)
    kn, kk = cfg.shape_n, cfg.shape_k
    assert kn % 16 == 0 and kk % 64 == 0 and kn % pad_n == 0 and kk % pad_k == 0
    assert (cfg.shape_n - cfg.pad_shape_n, cfg.shape_k - cfg.pad_shape_k) == (n, k)
    assert out["weight"].shape == packed_shapes(e, kn, kk)[0] and out["weight_scale"].dtype == BF16
    assert out["weight_scale"].shape == packed_shapes(e, kn, kk)[1]
    qe = _chord.quantized_experts(out["weight"], out["weight_scale"])
    assert torch.equal(qe.q[:, :n, :k], q)
    assert not qe.q[:, n:].any() and not qe.q[:, :, k:].any()  # padding weights are zero
    s = tensors["weight_scale"]
    want = s.repeat_interleave((group or 32) // 32, -1) if group else s.expand(e, n, kk // 32)
    assert torch.equal(qe.scales[:, :n, : want.shape[-1]], want[..., : qe.scales.shape[-1]])
    # and the dequantized weight is exactly the checkpoint's
    w_ck = q.float() * (s.float().repeat_interleave(group, -1) if group else s.float())
    assert torch.equal(qe.dequantize()[:, :n, :k], w_ck)


def test_dense_layer_runs_as_one_expert():
    from humming.layer import HummingLayer

    tensors, q = _native(1, 96, 128, 32)
    tensors = {k: v[0] for k, v in tensors.items()}  # a linear layer has no expert dim
    layer = HummingLayer.from_tensors(tensors, 96, 128, HummingWeightSchema(weight_scale_group_size=32))
    assert layer.config.num_experts == 0 and layer.weight.shape[0] == 1
    x = torch.randn(5, 128).to(BF16)
    w = q[0].float() * tensors["weight_scale"].float().repeat_interleave(32, -1)
    if torch.cuda.is_available():
        layer = layer.cuda()
        y = layer(x.cuda()).cpu()
    else:
        with _chord.cpu_reference_backend():
            y = layer(x)
    assert y.shape == (5, 96)
    ref = x.float() @ w.t()
    assert ((y.float() - ref).norm() / ref.norm()) < 1e-2


def test_fp16_and_fp32_scales_are_rounded_to_bf16_with_a_warning():
    tensors, _ = _native(1, 64, 64, 32)
    tensors["weight_scale"] = tensors["weight_scale"].float() * (1 + 2**-12)
    with pytest.warns(UserWarning, match="rounded to bf16"):
        prepare_and_transform_humming_tensors(tensors, 64, 64, HummingWeightSchema(weight_scale_group_size=32),
                                              num_experts=1)


def test_shape_mismatches_are_clear_errors():
    tensors, _ = _native(2, 64, 128, 32)
    ws = HummingWeightSchema(weight_scale_group_size=32)
    with pytest.raises(ValueError, match="weight must have shape"):
        prepare_and_transform_humming_tensors(tensors, 64, 256, ws, num_experts=2)
    with pytest.raises(ValueError, match="weight_scale must have shape"):
        prepare_and_transform_humming_tensors(tensors, 64, 128, HummingWeightSchema(weight_scale_group_size=64),
                                              num_experts=2)
    with pytest.raises(ValueError, match="multiple of the scale group"):
        prepare_and_transform_humming_tensors(tensors, 64, 96, HummingWeightSchema(weight_scale_group_size=64),
                                              num_experts=2)


def test_padded_parameter_attrs_for_vllm():
    attrs = HummingWeightSchema(weight_scale_group_size=32).get_padded_tensors_attrs(
        shape_n=200, shape_k=320, param_dtype=BF16, num_experts=4, pad_n_to_multiple=256, pad_k_to_multiple=128)
    assert attrs["weight"]["shape"] == (4, 256, 48) and attrs["weight"]["dtype"] == torch.int32
    assert attrs["weight_scale"]["shape"] == (4, 256, 12)
    assert attrs["weight"]["extra_attrs"]["pad_shape"] == (0, 56, 8)
    assert attrs["weight"]["extra_attrs"]["input_dim"] == 2 and attrs["weight"]["extra_attrs"]["output_dim"] == 1


def test_online_quantization_and_quantize_weight():
    from humming.utils.weight import quantize_weight

    w = torch.randn(2, 64, 128).to(BF16)
    # what VLLM_HUMMING_ONLINE_QUANT_CONFIG='{"dtype": "uint4", "group_size": 32}' builds
    ws = HummingWeightSchema.from_config({"quant_method": "humming", "dtype": "uint4", "group_size": 32})
    t = HummingWeightSchema.quant_tensor(w[0], ws, BF16)
    assert t["weight"].shape == (64, 16) and t["weight_scale"].shape == (64, 4)
    deq = ws.dequant_tensors(t)
    assert ((deq - w[0].float()).norm() / w[0].float().norm()) < 0.15  # int4 quantization error
    codes, scale, zp, s2 = quantize_weight(w, "uint4", "bfloat16", 32)
    assert codes.shape == (2, 64, 128) and int(codes.min()) >= 0 and int(codes.max()) <= 15
    assert zp is None and s2 is None
    packed, _, _, _ = quantize_weight(w, "uint4", None, 32, pack=True)
    assert torch.equal(F.unpack_compressed_tensors(packed, 128), (codes - 8).to(torch.int8))
    from humming.errors import ChordUnsupportedError

    with pytest.raises(ChordUnsupportedError):
        quantize_weight(w, "uint8", None, 32)
    with pytest.raises(ChordUnsupportedError):
        quantize_weight(w, "uint4", None, 128)
