"""chord.checks: one argument-checking module and one message form ("<function>: <argument> must
<expected>, got <given>") for chord.formats, routing, reference, ops and the humming root; a
parametrized case per kind of bad input, all refused on the host before any launch."""
import pytest
import torch

from chord import checks, formats, ops, reference, routing
from chord.schedule import Schedule

E, N, K = 3, 256, 512


def test_message_form():
    with pytest.raises(ValueError, match=r"^f: x must be 3, got 4$"):
        checks.fail("f", "x", "be 3", 4)
    with pytest.raises(TypeError, match=r"^f: t must be a torch.Tensor, got list$"):
        checks.tensor("f", "t", [1])
    with pytest.raises(TypeError, match=r"^f: t must have dtype int32 or int64, got float32$"):
        checks.tensor("f", "t", torch.zeros(2), dtype=(torch.int32, torch.int64))
    with pytest.raises(ValueError, match=r"^f: t must be 2-D \[M, K\], got shape \(2,\)$"):
        checks.tensor("f", "t", torch.zeros(2), ndim=2, what="2-D [M, K]")
    with pytest.raises(ValueError, match=r"^f: t must be on meta \(like x\), got cpu$"):
        checks.tensor("f", "t", torch.zeros(2), device=torch.device("meta"))
    with pytest.raises(ValueError, match="must be contiguous"):
        checks.tensor("f", "t", torch.zeros(4, 4).t(), contiguous=True)
    with pytest.raises(ValueError, match="16-byte aligned"):
        checks.tensor("f", "t", torch.zeros(64, dtype=torch.bfloat16)[1:], aligned=True)
    checks.tensor("f", "t", None, optional=True)
    checks.tensor("f", "t", torch.zeros(64, dtype=torch.bfloat16)[8:], aligned=True)  # 16 bytes in: fine


@pytest.mark.parametrize("v, exc", [(True, ValueError), (1.5, ValueError), ("3", TypeError), (None, TypeError)])
def test_ints_refuse_bools_and_others(v, exc):
    with pytest.raises(exc, match="f: n must be an int"):
        checks.integer("f", "n", v)
    assert checks.integer("f", "n", 3, min=1) == 3
    with pytest.raises(ValueError, match="f: n must be >= 1, got 0"):
        checks.integer("f", "n", 0, min=1)


@pytest.mark.parametrize("v", [1, 0, "yes", None])
def test_bools_refuse_ints_and_others(v):
    with pytest.raises(TypeError, match="f: b must be a bool"):
        checks.boolean("f", "b", v)
    assert checks.boolean("f", "b", None, allow_none=True) is None and checks.boolean("f", "b", False) is False


# ---- every layer speaks the same form -------------------------------------------------------

def _weights():
    return (torch.zeros(formats.packed_shapes(E, N, K)[0], dtype=torch.int32),
            torch.ones(formats.packed_shapes(E, N, K)[1], dtype=torch.bfloat16))


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values one element past a 16-byte boundary (a contiguous view of a larger buffer)."""
    flat = torch.empty(t.numel() + 16, dtype=t.dtype)
    first = ((16 - flat.data_ptr() % 16) % 16) // t.element_size() + 1
    v = flat[first: first + t.numel()].view(t.shape)
    v.copy_(t)
    assert v.data_ptr() % 16 == t.element_size() and v.is_contiguous()
    return v


def _byte_misaligned(t: torch.Tensor, by: int = 1) -> torch.Tensor:
    """The same values `by` bytes past a 16-byte boundary (torch.frombuffer at an offset: no torch op
    makes such a view of an int32/int64 tensor, but a pointer from elsewhere can be one)."""
    raw = bytearray(t.numel() * t.element_size() + 32)
    base = torch.frombuffer(raw, dtype=torch.uint8).data_ptr()
    v = torch.frombuffer(raw, dtype=t.dtype, offset=(-base) % 16 + by, count=t.numel()).view(t.shape)
    v.copy_(t)
    v._raw = raw  # keep the buffer alive with the view
    assert v.data_ptr() % 16 == by and v.is_contiguous()
    return v


def _indexed(**over):
    qw, sc = _weights()
    a = dict(x=torch.randn(5, K).bfloat16(), qweight=qw, scales=sc, sorted_ids=torch.full((64,), 10, dtype=torch.int32),
             expert_ids=torch.zeros(8, dtype=torch.int32), num_tokens_post_padded=torch.tensor([8], dtype=torch.int32),
             out=torch.empty(10, N, dtype=torch.bfloat16), top_k=2, block_m=8,
             schedule=Schedule("indexed", 8, 128, 4, 4, 1).id)
    a.update(over)
    return lambda: ops.gemm_indexed_raw(a["x"], a["qweight"], a["scales"], a["sorted_ids"], a["expert_ids"],
                                        a["num_tokens_post_padded"], a["out"], a["top_k"], a["block_m"], a["schedule"],
                                        check_routing=False)


def _contiguous(**over):
    qw, sc = _weights()
    a = dict(x=torch.randn(9, K).bfloat16(), qweight=qw, scales=sc,
             expert_offsets=torch.tensor([0, 3, 3, 9], dtype=torch.int64), out=torch.empty(9, N, dtype=torch.bfloat16),
             schedule=Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id)
    a.update(over)
    return lambda: ops.gemm_contiguous_raw(a["x"], a["qweight"], a["scales"], a["expert_offsets"], a["out"],
                                           a["schedule"], check_routing=False)


def _masked(**over):
    qw, sc = _weights()
    a = dict(x=torch.randn(E, 4, K).bfloat16(), qweight=qw, scales=sc,
             expert_num_tokens=torch.tensor([1, 0, 4], dtype=torch.int32),
             out=torch.empty(E, 4, N, dtype=torch.bfloat16), schedule=Schedule("grouped_masked", 8, 128, 4, 4, 1).id)
    a.update(over)
    return lambda: ops.gemm_masked_raw(a["x"], a["qweight"], a["scales"], a["expert_num_tokens"], a["out"],
                                       a["schedule"], check_routing=False)


qw0, sc0 = _weights()
CASES = {
    # 16-byte alignment of every tensor a kernel moves in vectors
    "indexed x misaligned": (_indexed(x=_misaligned(torch.randn(5, K).bfloat16())), "gemm_indexed: x", "aligned"),
    "indexed out misaligned": (_indexed(out=_misaligned(torch.empty(10, N, dtype=torch.bfloat16))), "gemm_indexed: out",
                               "aligned"),
    "indexed qweight misaligned": (_indexed(qweight=_misaligned(qw0)), "gemm_indexed: qweight", "aligned"),
    "indexed scales misaligned": (_indexed(scales=_misaligned(sc0)), "gemm_indexed: scales", "aligned"),
    # routing tensors are read one element at a time (csrc/moe/rows.cuh): their element's alignment
    "indexed sorted_ids misaligned": (_indexed(sorted_ids=_byte_misaligned(torch.full((64,), 10, dtype=torch.int32))),
                                      "gemm_indexed: sorted_ids", "4-byte aligned address"),
    "indexed expert_ids misaligned": (_indexed(expert_ids=_byte_misaligned(torch.zeros(8, dtype=torch.int32), 2)),
                                      "gemm_indexed: expert_ids", "4-byte aligned address"),
    "indexed num_tokens_post_padded misaligned": (
        _indexed(num_tokens_post_padded=_byte_misaligned(torch.tensor([8], dtype=torch.int32), 3)),
        "gemm_indexed: num_tokens_post_padded", "4-byte aligned address"),
    "contiguous offsets misaligned": (_contiguous(expert_offsets=_byte_misaligned(torch.tensor([0, 3, 3, 9]), 4)),
                                      "gemm_contiguous: expert_offsets", "8-byte aligned address"),
    "masked counts misaligned": (_masked(expert_num_tokens=_byte_misaligned(torch.tensor([1, 0, 4], dtype=torch.int32))),
                                 "gemm_masked: expert_num_tokens", "4-byte aligned address"),
    # dtype, rank, shape, device, contiguity
    "indexed x dtype": (_indexed(x=torch.randn(5, K)), "gemm_indexed: x", "dtype bfloat16"),
    "indexed x rank": (_indexed(x=torch.randn(K).bfloat16()), "gemm_indexed: x", "2-D"),
    "indexed x on another device": (_indexed(x=torch.randn(5, K, device="meta").bfloat16()), "gemm_indexed: qweight",
                                    "like x"),
    "contiguous x not contiguous": (_contiguous(x=torch.randn(K, 9).bfloat16().t()), "gemm_contiguous: x", "contiguous"),
    "masked out dtype": (_masked(out=torch.empty(E, 4, N)), "gemm_masked: out", "dtype bfloat16"),
    # hidden size / K / N against the layout
    "indexed K mismatch": (_indexed(x=torch.randn(5, 256).bfloat16()), "gemm_indexed: x", "K=512"),
    "contiguous N mismatch": (_contiguous(out=torch.empty(9, 128, dtype=torch.bfloat16)), "gemm_contiguous: out", "N=256"),
    # routing buffers shorter than needed, top_k, aliasing, ints vs bools
    "indexed expert_ids short": (_indexed(expert_ids=torch.zeros(2, dtype=torch.int32)), "gemm_indexed: expert_ids",
                                 "one entry per block"),
    "contiguous offsets short": (_contiguous(expert_offsets=torch.tensor([0, 9], dtype=torch.int64)),
                                 "gemm_contiguous: expert_offsets", "E+1=4"),
    "masked counts short": (_masked(expert_num_tokens=torch.tensor([1], dtype=torch.int32)),
                            "gemm_masked: expert_num_tokens", "E=3"),
    "indexed top_k bool": (_indexed(top_k=True), "gemm_indexed: top_k", "positive int"),
    "indexed block_m bool": (_indexed(block_m=True), "gemm_indexed: block_m", "must be an int"),
    "indexed out too short": (_indexed(out=torch.empty(4, N, dtype=torch.bfloat16)), "gemm_indexed: out", "at least"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ops_refuse_with_function_and_argument(case):
    call, head, what = CASES[case]
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(head) and what in msg, msg


@pytest.mark.parametrize("call", [
    _indexed(sorted_ids=_misaligned(torch.full((64,), 10, dtype=torch.int32)),
             expert_ids=_misaligned(torch.zeros(8, dtype=torch.int32)),
             num_tokens_post_padded=_misaligned(torch.tensor([8], dtype=torch.int32))),
    _contiguous(expert_offsets=_misaligned(torch.tensor([0, 3, 3, 9]))),  # 8 bytes past 16: int64-aligned
    _masked(expert_num_tokens=_misaligned(torch.tensor([1, 0, 4], dtype=torch.int32))),
], ids=["indexed", "contiguous", "masked"])
def test_routing_views_at_their_element_alignment_are_accepted(call):
    """Routing tensors need only their element's alignment (4 bytes, 8 for int64 offsets): a view
    one element past a 16-byte boundary passes every check and reaches the CPU refusal."""
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        call()


def test_the_message_says_why_the_alignment_is_needed():
    with pytest.raises(ValueError, match=r"^f: t must start at a 4-byte aligned address \(the kernels read it "
                                         r"with 4-byte loads; .*got address offset 2$"):
        checks.tensor("f", "t", _byte_misaligned(torch.zeros(4, dtype=torch.int32), 2), aligned=4)
    with pytest.raises(ValueError, match="16-byte aligned address \\(the kernels move 16-byte vectors"):
        checks.tensor("f", "t", _misaligned(torch.zeros(8, dtype=torch.int32)), aligned=True)
    checks.tensor("f", "t", _misaligned(torch.zeros(8, dtype=torch.int32)), aligned=4)


def test_out_aliasing_x_names_the_op():
    x = torch.randn(10, N).bfloat16()  # K == N here so out can alias x
    qw = torch.zeros(formats.packed_shapes(E, N, N)[0], dtype=torch.int32)
    sc = torch.ones(formats.packed_shapes(E, N, N)[1], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^gemm_contiguous: out must not overlap x"):
        ops.gemm_contiguous_raw(x, qw, sc, torch.tensor([0, 3, 3, 10]), x, Schedule("grouped_contiguous", 16, 128, 4, 4,
                                                                                     1).id, check_routing=False)


@pytest.mark.parametrize("call, head", [
    (lambda: formats.pack_experts(torch.zeros(2, 16, 64)), "pack_experts: q"),
    (lambda: formats.QuantizedExperts(torch.zeros(2, 16, 64, dtype=torch.int8), torch.ones(2, 16, 3).bfloat16()),
     "QuantizedExperts: scales"),
    (lambda: routing.align_block_size(torch.zeros(3, 2), 8, 4), "align_block_size: topk_ids"),
    (lambda: routing.align_block_size(torch.zeros(3, 2, dtype=torch.int32), 8, True), "align_block_size: num_experts"),
    (lambda: reference.gemm_ref(torch.zeros(3, 64, dtype=torch.int32), torch.zeros(4, 64)), "gemm_ref: x"),
])
def test_other_layers_use_the_same_head(call, head):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert str(info.value).startswith(head), str(info.value)


def test_no_layer_keeps_its_own_helper_set():
    import inspect

    import chord.formats as F
    import chord.reference as Rf
    import chord.routing as R
    import humming.ops as H

    for mod in (F, R, Rf, ops, H):
        src = inspect.getsource(mod)
        for old in ("def _fn_arg(", "def _arg(", "def _require_tensor(", "def _require_dtype(", "def _check_tensor("):
            assert old not in src, (mod.__name__, old)
        assert "from chord import checks" in src or "import checks" in src, mod.__name__


def test_a_misaligned_call_after_an_aligned_one_is_still_refused():
    """The per-signature validation memo (chord.ops) keys on each pointer's 16-byte alignment too:
    the same shapes first aligned, then one element off, are refused the second time."""
    qw, sc = _weights()
    x = torch.randn(4, K).bfloat16()
    off = torch.tensor([0, 2, 4, 4], dtype=torch.int64)
    s = Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id
    with pytest.raises(ValueError, match="CUDA tensor"):  # validated, then refused on CPU only
        ops.gemm_contiguous_raw(x, qw, sc, off, torch.empty(4, N).bfloat16(), s, check_routing=False)
    with pytest.raises(ValueError, match="^gemm_contiguous: x must start at a 16-byte aligned address"):
        ops.gemm_contiguous_raw(_misaligned(x), qw, sc, off, torch.empty(4, N).bfloat16(), s, check_routing=False)


def test_parameters_are_checked_like_tensors():
    """vLLM's layer weights are nn.Parameters: they get the alignment check and the validation
    memo like plain tensors (before, only type(t) is torch.Tensor did)."""
    qw, sc = _weights()
    x = torch.randn(4, K).bfloat16()
    off = torch.tensor([0, 2, 4, 4], dtype=torch.int64)
    s = Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id
    bad = torch.nn.Parameter(_misaligned(qw), requires_grad=False)
    assert checks.plain(bad) and bad.data_ptr() % 16
    with pytest.raises(ValueError, match="^gemm_contiguous: qweight must start at a 16-byte aligned address"):
        ops.gemm_contiguous_raw(x, bad, sc, off, torch.empty(4, N).bfloat16(), s, check_routing=False)


def test_empty_weights_are_refused_by_name():
    x = torch.randn(4, K).bfloat16()
    with pytest.raises(ValueError, match="^gemm_contiguous: qweight must have the swap16g layout"):
        ops.gemm_contiguous_raw(x, torch.zeros(0, 2, K // 64, 8, 32, 4, dtype=torch.int32),
                                torch.ones(0, 2, K // 64, 8, 8, 2, 2, dtype=torch.bfloat16),
                                torch.zeros(1, dtype=torch.int64), torch.empty(4, N).bfloat16(),
                                Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id, check_routing=False)
