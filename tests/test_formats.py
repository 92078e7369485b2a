"""chord.formats: quantization, compressed-tensors import and the swap16 kernel layout (CPU)."""

import struct
import warnings

import pytest
import torch

from chord import formats as F
from conftest import requires_gpu


def rand_q(*shape, gen=None):
    return torch.randint(-8, 8, shape, dtype=torch.int8, generator=gen)


def rand_scales(*shape):
    return (torch.rand(shape) * 0.1 + 1e-3).to(torch.bfloat16)


# ----------------------------------------------------------------------------------------
# independent decoders of the swap16g layout (plain Python loops, written from the spec)
# ----------------------------------------------------------------------------------------


def decode_swap16_spec(p):
    """Rebuild q / scales from qweight / scales with the formula of docs/architecture.md."""
    E, N, K = p.num_experts, p.n, p.k
    G = F.tile_group(N)
    words = p.qweight.tolist()
    sc = p.scales.float().tolist()
    q = [[[None] * K for _ in range(N)] for _ in range(E)]
    s = [[[None] * (K // 32) for _ in range(N)] for _ in range(E)]
    for e in range(E):
        for nt in range(N // 16):
            for kb in range(K // 64):
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    for st in range(4):
                        word = words[e][nt // G][kb][nt % G][lane][st] & 0xFFFFFFFF
                        for pos in range(8):
                            kk, kh, rh = pos // 4, (pos // 2) % 2, pos % 2
                            n = nt * 16 + rh * 8 + g
                            k = kb * 64 + st * 16 + kh * 8 + 2 * t + kk
                            assert q[e][n][k] is None, "two nibbles map to one weight"
                            q[e][n][k] = ((word >> (4 * pos)) & 0xF) - 8
                for g in range(8):
                    for gi in range(2):
                        for rh in range(2):
                            s[e][nt * 16 + rh * 8 + g][kb * 2 + gi] = sc[e][nt // G][kb][nt % G][g][gi][rh]
    return q, s


def bf16_bits_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def decode_swap16_ptx_fragment(p, e, nt, kb, st):
    """The 16x16 A tile that the 32 lanes hold for k16-step ``st``, decoded the way the kernel
    does it: register j = (word >> 4j) & 0x000F000F, OR 0x4300 (bf16 128.0) into both halves,
    read the halves as bf16 and subtract 136. Elements are placed with the PTX ISA m16n8k16
    A-fragment map: a_i at row groupID + 8*((i//2)%2), column 2*threadID_in_group + (i%2) + 8*(i//4).
    """
    tile = [[None] * 16 for _ in range(16)]
    for lane in range(32):
        group_id, tid = lane // 4, lane % 4
        G = F.tile_group(p.n)
        word = int(p.qweight[e, nt // G, kb, nt % G, lane, st]) & 0xFFFFFFFF
        for j in range(4):
            reg = ((word >> (4 * j)) & 0x000F000F) | 0x43004300
            for half in range(2):
                i = 2 * j + half
                value = bf16_bits_to_float((reg >> (16 * half)) & 0xFFFF) - 136.0
                row = group_id + 8 * ((i // 2) % 2)
                col = 2 * tid + (i % 2) + 8 * (i // 4)
                tile[row][col] = value
    return tile


# ----------------------------------------------------------------------------------------
# swap16
# ----------------------------------------------------------------------------------------

SHAPES = [(1, 16, 64), (3, 48, 192), (2, 80, 320), (5, 32, 128), (1, 256, 1024)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pack_unpack_roundtrip_bit_exact(shape):
    q, s = rand_q(*shape), rand_scales(shape[0], shape[1], shape[2] // 32)
    p = F.pack_experts(q, s)
    g = F.tile_group(shape[1])
    assert g == {16: 1, 48: 1, 80: 1, 32: 2, 256: 8}[shape[1]]
    assert p.qweight.shape == (shape[0], shape[1] // 16 // g, shape[2] // 64, g, 32, 4)
    assert p.scales.shape == (shape[0], shape[1] // 16 // g, shape[2] // 64, g, 8, 2, 2)
    assert (p.num_experts, p.n, p.k, p.group_size, p.layout) == (*shape, 32, "swap16g")
    assert p.nbytes == q.numel() * 9 // 16  # 0.5625 B / weight exactly
    u = F.unpack_experts(p)
    assert torch.equal(u.q, q) and torch.equal(u.scales, s)
    # the QuantizedExperts entry point gives the identical packing
    p2 = F.pack_experts(F.QuantizedExperts(q, s))
    assert torch.equal(p2.qweight, p.qweight) and torch.equal(p2.scales, p.scales)


def test_pack_extreme_codes():
    for v in (-8, 7, 0, -1):
        q = torch.full((2, 16, 64), v, dtype=torch.int8)
        p = F.pack_experts(q, rand_scales(2, 16, 2))
        assert torch.equal(F.unpack_experts(p).q, q)
    # all -8 -> every nibble 0; all 7 -> every nibble 0xF (word -1)
    assert int(F.pack_experts(torch.full((1, 16, 64), -8, dtype=torch.int8), rand_scales(1, 16, 2)).qweight.abs().max()) == 0
    assert bool((F.pack_experts(torch.full((1, 16, 64), 7, dtype=torch.int8), rand_scales(1, 16, 2)).qweight == -1).all())


def test_pack_2d_is_one_expert():
    q, s = rand_q(32, 128), rand_scales(32, 4)
    p = F.pack_experts(q, s)
    assert p.num_experts == 1
    assert torch.equal(F.unpack_experts(p).q[0], q)


@pytest.mark.parametrize("shape", [(2, 32, 128), (1, 48, 192)], ids=lambda s: "x".join(map(str, s)))
def test_swap16_matches_spec_formula(shape):
    q, s = rand_q(*shape), rand_scales(shape[0], shape[1], shape[2] // 32)
    p = F.pack_experts(q, s)
    dq, ds = decode_swap16_spec(p)
    assert dq == q.tolist()
    assert ds == s.float().tolist()


def test_swap16_registers_are_mma_a_fragments():
    q, s = rand_q(2, 32, 128), rand_scales(2, 32, 4)
    p = F.pack_experts(q, s)
    for e, nt, kb, st in [(0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 0, 2), (1, 0, 1, 1)]:
        tile = decode_swap16_ptx_fragment(p, e, nt, kb, st)
        want = q[e, nt * 16 : nt * 16 + 16, kb * 64 + st * 16 : kb * 64 + st * 16 + 16].float().tolist()
        assert tile == want


def test_packed_experts_validates():
    p = F.pack_experts(rand_q(1, 16, 64), rand_scales(1, 16, 2))
    with pytest.raises(ValueError, match="qweight"):
        F.PackedExperts(p.qweight[..., :2], p.scales, 1, 16, 64)
    with pytest.raises(ValueError, match="PackedExperts: k must have K"):
        F.PackedExperts(p.qweight, p.scales, 1, 16, 96)
    with pytest.raises(ValueError, match="layout"):
        F.PackedExperts(p.qweight, p.scales, 1, 16, 64, layout="marlin")
    with pytest.raises(ValueError, match="group_size"):
        F.PackedExperts(p.qweight, p.scales, 1, 16, 64, group_size=128)
    with pytest.raises(TypeError, match="scales"):
        F.PackedExperts(p.qweight, p.scales.float(), 1, 16, 64)
    with pytest.raises(ValueError, match="contiguous"):
        q2 = torch.cat([p.qweight, p.qweight], dim=-1)[..., ::2]
        F.PackedExperts(q2, p.scales, 1, 16, 64)


# ----------------------------------------------------------------------------------------
# quantization
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_dequantize_exact(dtype):
    w = (torch.randn(3, 32, 128) * 0.02).to(dtype)
    w[0, 0, :32] = 0  # an all-zero group
    w[1, 2, 32:64] = 1e-3
    qe = F.quantize_int4_g32(w)
    assert qe.q.dtype == torch.int8 and qe.scales.dtype == torch.bfloat16
    assert qe.scales.shape == (3, 32, 4) and (qe.num_experts, qe.n, qe.k, qe.group_size) == (3, 32, 128, 32)
    assert int(qe.q.min()) >= -7 and int(qe.q.max()) <= 7
    assert float(qe.scales[0, 0, 0]) == 1.0 and bool((qe.q[0, 0, :32] == 0).all())
    deq = F.dequantize(qe.q, qe.scales)
    assert deq.dtype == torch.float32 and bool(torch.isfinite(deq).all())
    # exact: q * float(scale), and the quantizer picked the nearest code for that scale
    s_full = qe.scales.float().repeat_interleave(32, -1)
    assert torch.equal(deq, qe.q.float() * s_full)
    assert torch.equal(F.dequantize(qe), deq) and torch.equal(qe.dequantize(), deq)
    assert bool(((w.float() - deq).abs() <= s_full / 2 + 1e-12).all())
    # re-quantizing the represented weight reproduces it (scale is the bf16-rounded one)
    again = F.quantize_int4_g32(deq)
    assert torch.equal(again.dequantize(), deq)


def test_quantize_2d_and_divisor():
    w = torch.randn(16, 64)
    qe = F.quantize_int4_g32(w)
    assert qe.q.shape == (1, 16, 64)
    q75 = F.quantize_int4_g32(w, divisor=7.5)
    assert int(q75.q.min()) >= -8 and int(q75.q.max()) <= 7
    assert torch.equal(q75.scales, (w.abs().unflatten(-1, (2, 32)).amax(-1) / 7.5).to(torch.bfloat16).unsqueeze(0))


# ----------------------------------------------------------------------------------------
# compressed-tensors
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ct():
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized import helpers

    return helpers


@pytest.mark.parametrize("shape", [(16, 64), (3, 48, 128), (5, 40), (2, 7, 36), (1, 3)])
def test_compressed_tensors_packer_bit_exact(ct, shape):
    q = rand_q(*shape)
    ours = F.pack_compressed_tensors(q)
    theirs = ct.pack_to_int32(q, 4)
    assert ours.dtype == torch.int32 and torch.equal(ours, theirs)
    k = shape[-1]
    assert torch.equal(F.unpack_compressed_tensors(theirs, k), q)
    assert torch.equal(ct.unpack_from_int32(ours, 4, torch.Size(shape)), q)


def test_compressed_tensors_nibble_convention():
    # element k -> nibble k % 8 (LSB first) of word k // 8, stored as q + 8
    q = torch.tensor([[-8, -7, -1, 0, 1, 2, 6, 7, 3]], dtype=torch.int8)
    w = F.pack_compressed_tensors(q)
    assert w.shape == (1, 2)
    assert int(w[0, 0]) & 0xFFFFFFFF == 0xFEA98710  # nibbles 0,1,7,8,9,A,E,F from the LSB up
    assert int(w[0, 1]) == 0xB


def _ct_compress(w_bf16):
    """Run compressed-tensors' own quantization + pack-quantized compressor on one weight."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    groups = w_bf16.unflatten(-1, (-1, 32))
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    state = {"weight": w_bf16, "weight_scale": scale, "weight_zero_point": zp}
    compressed = PackedQuantizationCompressor.compress(state, scheme)
    dense = PackedQuantizationCompressor.decompress(dict(compressed), scheme)["weight"]
    return compressed, dense


def test_compressed_tensors_quantizer_roundtrip(ct):
    experts = []
    dense = []
    for _ in range(3):
        w = (torch.randn(32, 128) * 0.05).to(torch.bfloat16)
        w[1, :32] = 0  # zero group: the library stores eps, not 0
        c, d = _ct_compress(w)
        assert set(c) == {"weight_packed", "weight_scale", "weight_shape"}  # symmetric: no zero point
        assert c["weight_packed"].shape == (32, 16) and c["weight_scale"].shape == (32, 4)
        experts.append(c)
        dense.append(d)
    # one expert
    one = F.from_compressed_tensors(experts[0]["weight_packed"], experts[0]["weight_scale"], experts[0]["weight_shape"])
    assert one.num_experts == 1
    assert torch.equal(one.dequantize()[0].to(torch.bfloat16), dense[0])
    assert int(one.q.min()) == -8  # the library's absmax/7.5 scale produces -8 codes
    # stacked experts (dicts, as read from a checkpoint)
    packed, scale, shape = F.stack_compressed_tensors_experts(experts)
    assert packed.shape == (3, 32, 16) and scale.shape == (3, 32, 4) and shape.tolist() == [32, 128]
    qe = F.from_compressed_tensors(packed, scale, shape)
    assert torch.equal(qe.dequantize().to(torch.bfloat16), torch.stack(dense))
    # straight to the kernel layout == via the plain form
    p_direct = F.pack_experts_from_compressed_tensors(packed, scale, shape)
    p_plain = F.pack_experts(qe)
    assert torch.equal(p_direct.qweight, p_plain.qweight) and torch.equal(p_direct.scales, p_plain.scales)
    # tuples and a [E, 2] weight_shape work too
    packed2, _, _ = F.stack_compressed_tensors_experts([(c["weight_packed"], c["weight_scale"], c["weight_shape"]) for c in experts])
    assert torch.equal(packed2, packed)
    qe2 = F.from_compressed_tensors(packed, scale, torch.stack([c["weight_shape"] for c in experts]))
    assert torch.equal(qe2.q, qe.q)
    # vLLM's float [E, 2] weight_shape parameter
    p_vllm = F.pack_experts_from_compressed_tensors(packed, scale, torch.tensor([[32.0, 128.0]] * 3))
    assert torch.equal(p_vllm.qweight, p_plain.qweight)


def test_quantize_divisor_7_5_matches_library_scales(ct):
    w = (torch.randn(16, 128) * 0.05).to(torch.bfloat16)
    c, _ = _ct_compress(w)
    ours = F.quantize_int4_g32(w, divisor=7.5)
    assert torch.equal(ours.scales[0], c["weight_scale"])


@pytest.mark.parametrize("shape", [(1, 16, 64), (3, 48, 192), (2, 80, 320)], ids=lambda s: "x".join(map(str, s)))
def test_pack_from_compressed_tensors_equals_plain_path(shape):
    q, s = rand_q(*shape), rand_scales(shape[0], shape[1], shape[2] // 32)
    words = F.pack_compressed_tensors(q)
    p = F.pack_experts_from_compressed_tensors(words, s, torch.tensor(shape[1:]))
    ref = F.pack_experts(q, s)
    assert torch.equal(p.qweight, ref.qweight) and torch.equal(p.scales, ref.scales)
    one = F.pack_experts_from_compressed_tensors(words[0], s[0], shape[1:])
    assert torch.equal(one.qweight, ref.qweight[:1])


def test_fp16_scales_are_rounded_with_warning():
    q = rand_q(1, 16, 64)
    words = F.pack_compressed_tensors(q)
    exact = torch.tensor([0.5, 0.25]).repeat(1, 16, 1).to(torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qe = F.from_compressed_tensors(words, exact, (16, 64))
    assert qe.scales.dtype == torch.bfloat16
    inexact = torch.full((1, 16, 2), 0.1, dtype=torch.float16)
    with pytest.warns(UserWarning, match="rounded to bf16"):
        F.from_compressed_tensors(words, inexact, (16, 64))


# ----------------------------------------------------------------------------------------
# error paths: exception type and the argument name in the message
# ----------------------------------------------------------------------------------------

_q = rand_q(1, 16, 64)
_s = rand_scales(1, 16, 2)
_w = F.pack_compressed_tensors(_q)

ERRORS = [
    ("pack q dtype", lambda: F.pack_experts(_q.int(), _s), TypeError, "'q'"),
    ("pack scales dtype", lambda: F.pack_experts(_q, _s.float()), TypeError, "'scales'"),
    ("pack scales missing", lambda: F.pack_experts(_q), TypeError, "'scales'"),
    ("pack q type", lambda: F.pack_experts(_q.numpy(), _s), TypeError, "'q'"),
    ("pack rank", lambda: F.pack_experts(_q[0, 0], _s[0, 0]), ValueError, "'q'"),
    ("pack K % 64", lambda: F.pack_experts(rand_q(1, 16, 96), rand_scales(1, 16, 3)), ValueError, "divisible by 64"),
    ("pack N % 16", lambda: F.pack_experts(rand_q(1, 24, 64), rand_scales(1, 24, 2)), ValueError, "divisible by 16"),
    ("pack scales shape", lambda: F.pack_experts(_q, rand_scales(1, 16, 4)), ValueError, "'scales'"),
    ("pack q range", lambda: F.pack_experts(torch.full((1, 16, 64), 9, dtype=torch.int8), _s), ValueError, "[-8, 7]"),
    ("pack both forms", lambda: F.pack_experts(F.QuantizedExperts(_q, _s), _s), ValueError, "'scales'"),
    ("unpack type", lambda: F.unpack_experts(_q), TypeError, "'p'"),
    ("quantize group", lambda: F.quantize_int4_g32(torch.randn(16, 128), group_size=128), ValueError, "'group_size'"),
    ("quantize dtype", lambda: F.quantize_int4_g32(torch.ones(16, 64, dtype=torch.int32)), TypeError, "'w'"),
    ("quantize rank", lambda: F.quantize_int4_g32(torch.randn(64)), ValueError, "'w'"),
    ("quantize K", lambda: F.quantize_int4_g32(torch.randn(16, 48)), ValueError, "'w'"),
    ("quantize nan", lambda: F.quantize_int4_g32(torch.full((16, 32), float("nan"))), ValueError, "non-finite"),
    ("quantize divisor", lambda: F.quantize_int4_g32(torch.randn(16, 32), divisor=0), ValueError, "'divisor'"),
    ("dequantize dtype", lambda: F.dequantize(_q.float(), _s), TypeError, "'q'"),
    ("dequantize shape", lambda: F.dequantize(_q, _s[..., :1]), ValueError, "'scales'"),
    ("QE dtype", lambda: F.QuantizedExperts(_q.int(), _s), TypeError, "'q'"),
    ("QE scales dtype", lambda: F.QuantizedExperts(_q, _s.half()), TypeError, "'scales'"),
    ("QE rank", lambda: F.QuantizedExperts(_q[0], _s[0]), ValueError, "'q'"),
    ("QE shape", lambda: F.QuantizedExperts(_q, _s[:, :8]), ValueError, "'scales'"),
    ("ct pack dtype", lambda: F.pack_compressed_tensors(_q.int()), TypeError, "'q'"),
    ("ct pack range", lambda: F.pack_compressed_tensors(torch.tensor([8], dtype=torch.int8)), ValueError, "[-8, 7]"),
    ("ct unpack dtype", lambda: F.unpack_compressed_tensors(_w.long(), 64), TypeError, "'words'"),
    ("ct unpack k", lambda: F.unpack_compressed_tensors(_w, 72), ValueError, "'words'"),
    ("ct unpack bad k", lambda: F.unpack_compressed_tensors(_w, -1), ValueError, "'k'"),
    ("ct load packed dtype", lambda: F.from_compressed_tensors(_w.long(), _s, (16, 64)), TypeError, "'weight_packed'"),
    ("ct load scale dtype", lambda: F.from_compressed_tensors(_w, _s.float(), (16, 64)), TypeError, "'weight_scale'"),
    ("ct load shape mismatch", lambda: F.from_compressed_tensors(_w, _s, (16, 128)), ValueError, "'weight_packed'"),
    ("ct load group 64", lambda: F.from_compressed_tensors(_w, _s[..., :1], (16, 64)), ValueError, "group size 64"),
    ("ct load shape type", lambda: F.from_compressed_tensors(_w, _s, "16x64"), TypeError, "'weight_shape'"),
    ("ct load shape rank", lambda: F.from_compressed_tensors(_w, _s, torch.tensor([16, 64, 1])), ValueError, "'weight_shape'"),
    ("ct load float shape", lambda: F.from_compressed_tensors(_w, _s, torch.tensor([16.5, 64.0])), TypeError, "'weight_shape'"),
    ("ct load shape per expert", lambda: F.from_compressed_tensors(torch.stack([_w[0]] * 2), torch.stack([_s[0]] * 2), torch.tensor([[16, 64], [16, 128]])), ValueError, "'weight_shape'"),
    ("ct load rank", lambda: F.from_compressed_tensors(_w[0, 0], _s[0, 0], (16, 64)), ValueError, "'weight_packed'"),
    ("ct load K % 32", lambda: F.from_compressed_tensors(torch.zeros(16, 2, dtype=torch.int32), _s[0], (16, 16)), ValueError, "'weight_shape'"),
    ("ct to swap16 N", lambda: F.pack_experts_from_compressed_tensors(torch.zeros(8, 8, dtype=torch.int32), rand_scales(8, 2), (8, 64)), ValueError, "divisible by 16"),
    ("ct to swap16 K", lambda: F.pack_experts_from_compressed_tensors(torch.zeros(16, 4, dtype=torch.int32), rand_scales(16, 1), (16, 32)), ValueError, "divisible by 64"),
    ("stack empty", lambda: F.stack_compressed_tensors_experts([]), ValueError, "'experts'"),
    ("stack key", lambda: F.stack_compressed_tensors_experts([{"weight_packed": _w[0]}]), ValueError, "'experts'"),
    ("stack mismatch", lambda: F.stack_compressed_tensors_experts([(_w[0], _s[0], (16, 64)), (_w[0, :8], _s[0, :8], (8, 64))]), ValueError, "'experts'"),
]


@pytest.mark.parametrize("call,exc,needle", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(call, exc, needle):
    with pytest.raises(exc) as info:
        call()
    # "'name'": the argument the message must name, in chord.checks' form "<function>: <name> ..."
    want = f": {needle[1:-1]}" if needle.startswith("'") and needle.endswith("'") else needle
    assert want in str(info.value), (want, str(info.value))


@requires_gpu
@pytest.mark.gpu
def test_pack_on_cuda_matches_cpu():
    q, s = rand_q(3, 48, 192), rand_scales(3, 48, 6)
    p_cpu = F.pack_experts(q, s)
    p_gpu = F.pack_experts(q.cuda(), s.cuda())
    assert p_gpu.qweight.is_cuda
    assert torch.equal(p_gpu.qweight.cpu(), p_cpu.qweight) and torch.equal(p_gpu.scales.cpu(), p_cpu.scales)
    assert torch.equal(F.unpack_experts(p_gpu).q.cpu(), q)
    w = F.pack_compressed_tensors(q)
    p2 = F.pack_experts_from_compressed_tensors(w.cuda(), s.cuda(), (48, 192))
    assert torch.equal(p2.qweight.cpu(), p_cpu.qweight)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_pack_experts_refuses_non_finite_scales(bad):
    """A damaged checkpoint's NaN/Inf scale would poison outputs silently: refused at load."""
    from chord import formats as F

    q = torch.ones(2, 16, 64, dtype=torch.int8)
    s = torch.ones(2, 16, 2, dtype=torch.bfloat16)
    s[1, 3, 1] = bad
    with pytest.raises(ValueError, match=r"scales.*1 non-finite group scales.*\[1, 3, 1\]"):
        F.pack_experts(q, s)


def test_packed_weights_keep_their_tile_group_whatever_the_environment(monkeypatch):
    """G is read from the weights (qweight's dimension 3), never from CHORD_TILE_GROUP, once they
    are packed: weights packed under one cap stay valid (.to, re-wrapping) under another."""
    q, s = rand_q(2, 256, 128), rand_scales(2, 256, 4)
    monkeypatch.setenv("CHORD_TILE_GROUP", "2")
    p2 = F.pack_experts(q, s)
    monkeypatch.delenv("CHORD_TILE_GROUP")
    p8 = F.pack_experts(q, s)
    assert (p2.qweight.shape[3], p8.qweight.shape[3]) == (2, 8)
    monkeypatch.setenv("CHORD_TILE_GROUP", "1")
    for p in (p2, p8):
        again = F.PackedExperts(p.qweight, p.scales, 2, 256, 128).to("cpu")
        assert torch.equal(F.unpack_experts(again).q, q)
    with pytest.raises(ValueError, match=r"^PackedExperts: qweight must be \[E, N/16/G, K/64, G, 32, 4\] with G in"):
        F.PackedExperts(p8.qweight.reshape(2, 1, 2, 16, 32, 4), p8.scales, 2, 256, 128)


def test_tile_group_refuses_a_bad_n():
    for bad in (0, -16, 8, 24.0, True):
        with pytest.raises(ValueError, match="^tile_group: n must"):
            F.tile_group(bad)
    assert [F.tile_group(n) for n in (16, 32, 48, 64, 96, 128, 4096)] == [1, 2, 1, 4, 2, 8, 8]


def test_compressed_tensors_packer_refuses_non_finite_scales():
    q = rand_q(2, 32, 128)
    s = rand_scales(2, 32, 4)
    s[1, 5, 2] = float("nan")
    with pytest.raises(ValueError, match="^pack_experts_from_compressed_tensors: weight_scale holds 1 non-finite"):
        F.pack_experts_from_compressed_tensors(F.pack_compressed_tensors(q), s, (32, 128))
