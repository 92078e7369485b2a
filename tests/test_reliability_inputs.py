"""Checks that cover what the kernels touch (issue 27): `out` against every input it could alias,
the memory checks on tensor subclasses, routing that is in range but inconsistent, the `humming`
root's layer config against its tensors and its top_k, non-finite compressed-tensors scales,
sizes bounded before allocation, and every JSON / profile / activation-expression error naming
the argument or file and what was expected. All on CPU: a call that passes every check ends in
the "must be a CUDA tensor" refusal, right before the launch."""
from __future__ import annotations

import json
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from chord import checks, formats, ops, routing
from chord.schedule import Schedule

E, N, K = 3, 256, 512
BF16 = torch.bfloat16
CUDA_ONLY = "must be a CUDA tensor"
SIDX = Schedule("indexed", 8, 128, 4, 4, 1).id
SCON = Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id
SMSK = Schedule("grouped_masked", 8, 128, 4, 4, 1).id


class Sub(torch.Tensor):
    """A tensor subclass (what `as_subclass` makes): real storage, not a plain tensor."""


def _weights(e=E, n=N, k=K):
    return (torch.zeros(formats.packed_shapes(e, n, k)[0], dtype=torch.int32),
            torch.ones(formats.packed_shapes(e, n, k)[1], dtype=BF16))


def _arena(*parts):
    """(raw, views): consecutive views of one byte buffer `raw`, each 16-byte aligned and
    contiguous; parts are (dtype, shape)."""
    sizes = [torch.Size(shape).numel() * torch.tensor([], dtype=d).element_size() for d, shape in parts]
    raw = torch.zeros(2 * sum(sizes) + 16 * len(parts) + 4096, dtype=torch.uint8)  # room for an out past the end
    at, views = (-raw.data_ptr()) % 16, []
    for (d, shape), size in zip(parts, sizes):
        views.append(raw[at:at + size].view(d).view(shape))
        at += size + (-(at + size)) % 16
    return raw, views


def _at(raw: torch.Tensor, t: torch.Tensor, dtype, shape) -> torch.Tensor:
    """A `dtype` view of `raw` of `shape` starting at t's first byte (t a view of raw)."""
    start = t.data_ptr() - raw.data_ptr()
    size = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
    return raw[start:start + size].view(dtype).view(shape)


def _indexed_args(**over):
    qw, sc = _weights()
    m, top_k = 5, 2
    sorted_ids = torch.full((64,), m * top_k, dtype=torch.int32)
    sorted_ids[:m * top_k] = torch.arange(m * top_k, dtype=torch.int32)
    a = dict(x=torch.randn(m, K).to(BF16), qweight=qw, scales=sc, sorted_ids=sorted_ids,
             expert_ids=torch.zeros(8, dtype=torch.int32), num_tokens_post_padded=torch.tensor([16], dtype=torch.int32),
             out=torch.empty(m * top_k, N, dtype=BF16), top_k=top_k, block_m=8, schedule=SIDX)
    a.update(over)
    return a


INDEXED = ("x", "qweight", "scales", "sorted_ids", "expert_ids", "num_tokens_post_padded", "out", "top_k", "block_m",
           "schedule")


def _call_indexed(a, **kw):
    ops.gemm_indexed_raw(*[a[k] for k in INDEXED], **kw)


# ---- out against every input it could alias ------------------------------------------------


def _aliased_indexed(victim: str):
    """Indexed arguments in one buffer whose out starts at `victim`'s first byte."""
    a = _indexed_args()
    names = ("x", "qweight", "scales", "sorted_ids", "expert_ids", "num_tokens_post_padded")
    raw, views = _arena(*[(a[n].dtype, tuple(a[n].shape)) for n in names], (BF16, (10, N)))
    for n, v in zip(names, views):
        v.copy_(a[n])
        a[n] = v
    a["out"] = _at(raw, a[victim], BF16, (10, N))
    a["_raw"] = raw
    return a


@pytest.mark.parametrize("victim", ["qweight", "scales", "sorted_ids", "expert_ids", "num_tokens_post_padded"])
def test_out_overlapping_any_indexed_input_is_refused_naming_both(victim):
    a = _aliased_indexed(victim)
    with pytest.raises(ValueError, match=f"^gemm_indexed: out must not overlap {victim} "):
        _call_indexed(a, check_routing=False)


def test_out_overlapping_the_grouped_routing_is_refused():
    qw, sc = _weights()
    raw, (x, off) = _arena((BF16, (9, K)), (torch.int64, (E + 1,)))
    off.copy_(torch.tensor([0, 3, 3, 9]))
    with pytest.raises(ValueError, match="^gemm_contiguous: out must not overlap expert_offsets "):
        ops.gemm_contiguous_raw(x, qw, sc, off, _at(raw, off, BF16, (9, N)), SCON, check_routing=False)
    raw, (xm, cnt) = _arena((BF16, (E, 4, K)), (torch.int32, (E,)))
    cnt.copy_(torch.tensor([1, 0, 4]))
    with pytest.raises(ValueError, match="^gemm_masked: out must not overlap expert_num_tokens "):
        ops.gemm_masked_raw(xm, qw, sc, cnt, _at(raw, cnt, BF16, (E, 4, N)), SMSK, check_routing=False)


def test_aliasing_is_checked_on_every_call_not_only_the_first():
    """The validation memo keys on metadata; a second call of the same shapes whose out now aliases
    the weights is still refused (the pointers are compared on every call)."""
    a = _indexed_args()
    with pytest.raises(ValueError, match=CUDA_ONLY):
        _call_indexed(a, check_routing=False)
    b = _aliased_indexed("scales")
    with pytest.raises(ValueError, match=CUDA_ONLY):  # same metadata as b, separate buffers: fine
        _call_indexed(dict(b, out=torch.empty(10, N, dtype=BF16)), check_routing=False)
    with pytest.raises(ValueError, match="out must not overlap scales"):
        _call_indexed(b, check_routing=False)


def test_out_overlapping_the_split_k_workspace_is_refused(monkeypatch):
    s = Schedule("indexed", 8, 128, 4, 4, 1, split_k=2)
    out = torch.empty(10, N, dtype=BF16)
    p = out.data_ptr()
    monkeypatch.setattr(ops, "_split_buffers", lambda dev, floats, tiles: (p + 64, p + 10**9))
    with pytest.raises(ValueError, match="out must not overlap chord's split-K workspace"):
        ops._split_args(s, out, 2, 2, out=(p, out.nbytes, "gemm_indexed"))
    monkeypatch.setattr(ops, "_split_buffers", lambda dev, floats, tiles: (p + 10**9, p + 8))
    with pytest.raises(ValueError, match="out must not overlap chord's split-K counters"):
        ops._split_args(s, out, 2, 2, out=(p, out.nbytes, "gemm_indexed"))
    monkeypatch.setattr(ops, "_split_buffers", lambda dev, floats, tiles: (p + out.nbytes, p + 10**9))
    assert ops._split_args(s, out, 2, 2, out=(p, out.nbytes, "gemm_indexed"))["workspace"] == p + out.nbytes


# ---- tensor subclasses get the memory checks ------------------------------------------------


def _odd(t: torch.Tensor, by_elements: int = 1) -> torch.Tensor:
    """The same values `by_elements` elements past a 16-byte boundary (a contiguous view)."""
    flat = torch.empty(t.numel() + 16, dtype=t.dtype)
    first = ((16 - flat.data_ptr() % 16) % 16) // t.element_size() + by_elements
    v = flat[first:first + t.numel()].view(t.shape)
    v.copy_(t)
    return v


def test_subclass_x_at_a_two_byte_offset_is_refused():
    a = _indexed_args()
    x = _odd(a["x"]).as_subclass(Sub)
    assert type(x) is Sub and x.data_ptr() % 16 == 2 and not checks.plain(x) and checks.has_memory(x)
    with pytest.raises(ValueError, match="^gemm_indexed: x must start at a 16-byte aligned address"):
        _call_indexed(dict(a, x=x), check_routing=False)
    qw = _odd(a["qweight"]).as_subclass(Sub)
    with pytest.raises(ValueError, match="^gemm_indexed: qweight must start at a 16-byte aligned address"):
        _call_indexed(dict(a, qweight=qw), check_routing=False)


def test_subclass_out_overlapping_x_is_refused():
    qw, sc = _weights(E, N, N)  # K == N: out can be x
    x = torch.randn(10, N).to(BF16)
    off = torch.tensor([0, 3, 3, 10])
    with pytest.raises(ValueError, match="^gemm_contiguous: out must not overlap x"):
        ops.gemm_contiguous_raw(x.as_subclass(Sub), qw, sc, off, x.as_subclass(Sub), SCON, check_routing=False)
    with pytest.raises(ValueError, match="^gemm_contiguous: out must not overlap qweight"):
        ops.gemm_contiguous_raw(x, qw, sc, off, qw.view(BF16).view(-1)[:10 * N].view(10, N).as_subclass(Sub), SCON,
                                check_routing=False)


def test_subclasses_that_are_fine_reach_the_device_check():
    a = _indexed_args()
    sub = {k: (v.as_subclass(Sub) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    with pytest.raises(ValueError, match=CUDA_ONLY):
        _call_indexed(sub, check_routing=False)


def test_has_memory_kinds():
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = torch.zeros(4)
    assert checks.has_memory(t) and checks.has_memory(torch.nn.Parameter(t)) and checks.has_memory(t.as_subclass(Sub))
    assert not checks.has_memory(torch.zeros(4, device="meta")) and not checks.has_memory([1])
    with FakeTensorMode():
        assert not checks.has_memory(torch.zeros(4))


# ---- routing that is in range but inconsistent (the checked path) ---------------------------


def _routing(m=7, e=4, top_k=2, bm=8, seed=0, **kw):
    ids = routing.random_topk_ids(m, e, top_k, seed=seed)
    return routing.align_block_size(ids, bm, e, **kw)


def _raw(r: routing.IndexedRouting, top_k=None, block_m=None, e=4, **kw):
    top_k = r.top_k if top_k is None else top_k
    qw, sc = _weights(e)
    m = r.num_rows // r.top_k
    x = torch.randn(m if top_k == r.top_k else r.num_rows, K).to(BF16)
    bm = r.block_m if block_m is None else block_m
    ops.gemm_indexed_raw(x, qw, sc, r.sorted_ids, r.expert_ids, r.num_tokens_post_padded,
                         torch.empty(x.shape[0] * top_k, N, dtype=BF16), top_k, bm, Schedule("indexed", bm, 128, 4, 4,
                                                                                           1).id, **kw)


def test_consistent_routing_passes_the_check(routing_check):
    for kw in ({}, {"max_num_tokens_padded": routing.sorted_ids_capacity(14, 8, 4) + 40}):
        with pytest.raises(ValueError, match=CUDA_ONLY):
            _raw(_routing(**kw))
    emap = torch.tensor([1, -1, 0, -1, 2, -1], dtype=torch.int32)
    ids = routing.random_topk_ids(9, 6, 2, seed=2)
    for ignore in (False, True):
        r = routing.align_block_size(ids, 8, 6, expert_map=emap, ignore_invalid_experts=ignore)
        with pytest.raises(ValueError, match=CUDA_ONLY):
            _raw(r, e=3)


def test_a_route_in_two_blocks_is_refused(routing_check):
    r = _routing()
    used = int(r.num_tokens_post_padded[0])
    first_real = int(r.sorted_ids[0])
    last = (r.sorted_ids[:used] < r.num_rows).nonzero().flatten()[-1]
    r.sorted_ids[last] = first_real  # the route is now in two places (two tiles race on its row)
    with pytest.raises(ValueError, match=f"each route id at most once .* got route {first_real} 2 times"):
        _raw(r)
    with pytest.raises(ValueError, match=CUDA_ONLY):  # trusted: the values are not read
        _raw(r, check_routing=False)


def test_a_route_replaced_by_the_sentinel_is_refused(routing_check):
    r = _routing(m=9, e=2)
    blocks = r.sorted_ids[:int(r.num_tokens_post_padded[0])].view(-1, 8)
    full = int((blocks < r.num_rows).all(1).nonzero()[0])  # a block with 8 routes
    r.sorted_ids[full * 8 + 3] = r.num_rows  # a hole in the middle: a route after the padding
    with pytest.raises(ValueError, match=f"block {full} holds a route after the padding"):
        _raw(r, e=2)
    r2 = _routing(m=9, e=2)
    r2.sorted_ids[full * 8 + 7] = r2.num_rows  # the end of a full block that its expert continues
    with pytest.raises(ValueError, match=f"block {full} holds padding, but block {full + 1} continues"):
        _raw(r2, e=2)


def test_the_last_route_of_an_expert_replaced_needs_all_routes(routing_check):
    """Replacing an expert's last route with the sentinel leaves a routing that looks like one with
    a route fewer; only knowing that no route is dropped (IndexedRouting.all_routes, set by
    align_block_size without an expert_map) tells it apart. chord.ops.gemm_indexed passes it on."""
    r = _routing(m=9)
    assert r.all_routes
    ids = r.sorted_ids
    real = (ids < r.num_rows).nonzero().flatten()
    victim = int(real[-1])
    route = int(ids[victim])
    ids[victim] = r.num_rows
    with pytest.raises(ValueError, match=CUDA_ONLY):  # the raw op cannot know
        _raw(r)
    with pytest.raises(ValueError, match=f"every route id in \\[0, 18\\) .* the first {route}"):
        _raw(r, all_routes=True)
    w = formats.pack_experts(torch.zeros(4, N, K, dtype=torch.int8), torch.ones(4, N, K // 32).to(BF16))
    with pytest.raises(ValueError, match="every route id"):
        ops.gemm_indexed(torch.randn(9, K).to(BF16), w, r)
    with pytest.raises(ValueError, match=CUDA_ONLY):
        ops.gemm_indexed(torch.randn(9, K).to(BF16), w, r, check_routing=False)


def test_a_block_of_padding_alone_is_refused(routing_check):
    r = _routing(m=3, e=2)
    used = int(r.num_tokens_post_padded[0])
    r.sorted_ids[used - 8:used] = r.num_rows  # the last live block: padding only
    with pytest.raises(ValueError, match="holds padding only"):
        _raw(r, e=2)


def test_routing_aligned_for_another_block_m_is_refused(routing_check):
    """Routing padded for block_m=8 handed to a block_m=16 schedule: its expert runs end mid-block."""
    ids = torch.tensor([[0], [0], [0], [1], [1], [2], [2], [2], [2], [2], [3]], dtype=torch.int32)
    r8 = routing.align_block_size(ids, 8, 4)  # runs of 8: 32 rows, a multiple of 16 too
    with pytest.raises(ValueError, match=CUDA_ONLY):
        _raw(r8, e=4)
    # the same tensors claimed to be block_m=16 (what a tuning row of another block size would do)
    r16 = routing.IndexedRouting(r8.sorted_ids, r8.expert_ids, r8.num_tokens_post_padded, 16, 1, 11)
    with pytest.raises(ValueError, match="must be padded for block_m=16 .* block 0 holds a route after the padding"):
        _raw(r16, e=4)
    odd = routing.align_block_size(ids[:10], 8, 4)  # 24 rows: not even a multiple of 16
    with pytest.raises(ValueError, match="num_tokens_post_padded=24 must be a multiple of block_m=16"):
        _raw(routing.IndexedRouting(odd.sorted_ids, odd.expert_ids, odd.num_tokens_post_padded, 16, 1, 10), e=4)
    # routing padded for 16 handed to 8 (its expert ids stretched to the 8-row blocks): padding inside a run
    r16b = routing.align_block_size(torch.zeros(20, 1, dtype=torch.int32), 16, 1)
    wrong = routing.IndexedRouting(r16b.sorted_ids, r16b.expert_ids.repeat_interleave(2), r16b.num_tokens_post_padded,
                                   8, 1, 20)
    with pytest.raises(ValueError, match="padded for block_m=8 .* block 2 holds padding, but block 3 continues"):
        _raw(wrong, e=1)


def test_a_padded_block_continued_by_its_expert_is_refused(routing_check):
    sorted_ids = torch.tensor([0, 1, 2, 6, 6, 6, 6, 6, 3, 4, 5, 6, 6, 6, 6, 6], dtype=torch.int32)
    r = routing.IndexedRouting(sorted_ids, torch.tensor([1, 1], dtype=torch.int32), torch.tensor([16], dtype=torch.int32),
                               8, 1, 6)
    with pytest.raises(ValueError, match="block 0 holds padding, but block 1 continues expert 1"):
        _raw(r, e=2)
    r2 = routing.IndexedRouting(sorted_ids, torch.tensor([1, 0], dtype=torch.int32), r.num_tokens_post_padded, 8, 1, 6)
    with pytest.raises(ValueError, match=CUDA_ONLY):  # two experts: consistent
        _raw(r2, e=2)


def test_the_checked_read_has_no_host_sync_but_the_last():
    """The device pass: no op among its torch ops reads a value back to the host (no .item(), no
    bincount / nonzero / unique, which size their output from the data); one stack is read at the end."""
    r = _routing(m=33, e=6)
    calls = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    with Watch():
        ops._check_indexed_values("f", r.sorted_ids, r.expert_ids, r.num_tokens_post_padded, 6, 8, r.num_rows, True)
    syncing = [c for c in calls if any(s in c for s in ("_local_scalar_dense", "bincount", "nonzero", "unique",
                                                          "masked_select"))]
    assert not syncing, syncing
    assert sum("stack" in c for c in calls) == 1


def test_expert_map_must_be_injective():
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    emap = torch.tensor([0, 0, 1, -1], dtype=torch.int32)  # global 0 and 1 both on local 0
    x = torch.randn(2, 64).to(BF16)
    for call in (lambda: routing.align_block_size(ids, 8, 4, expert_map=emap),
                 lambda: routing.align_block_size(ids, 8, 4, expert_map=emap, ignore_invalid_experts=True),
                 lambda: routing.contiguous_layout(x, ids, 4, expert_map=emap),
                 lambda: routing.masked_layout(x, ids, 4, expert_map=emap, check_ids=False)):
        with pytest.raises(ValueError, match=r"expert_map must map each local expert from one global expert .* "
                                             r"local id 0 for global experts \[0, 1\]"):
            call()
    dense_but_shared = torch.tensor([0, 0, 2, -1], dtype=torch.int32)  # 3 local, max 2: passed the old density check
    with pytest.raises(ValueError, match="injective"):
        routing.contiguous_layout(x, ids, 4, expert_map=dense_but_shared, check_ids=False)


# ---- the humming root: layer config against its tensors, top_k -----------------------------


def _native(e, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (e, n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(e, n, k // 32, generator=g) * 0.02 + 0.001).to(BF16)
    return {"weight": formats.pack_compressed_tensors(q), "weight_scale": scale}


def _layer(e, n, k, pad_n=256, seed=0):
    from humming.schema import HummingWeightSchema
    from humming.transform import prepare_and_transform_humming_tensors

    return prepare_and_transform_humming_tensors(_native(e, n, k, seed), n, k, HummingWeightSchema(
        weight_scale_group_size=32), num_experts=e, pad_n_to_multiple=pad_n, pad_k_to_multiple=128)


def _forward(cfg, w, **kw):
    from humming.forward import humming_forward

    x = torch.randn(3, cfg.k).to(BF16)
    base = dict(compute_config={"gemm_type": "grouped_contiguous"}, outputs=torch.empty(3, cfg.n, dtype=BF16),
                expert_layout=torch.tensor([0] + [3] * cfg.num_experts, dtype=torch.int64))
    base.update(kw)
    return humming_forward(cfg, x, w["weight"], w["weight_scale"], **base)


def test_humming_refuses_a_weight_of_another_expert_count():
    from humming import _chord

    cfg4, w4 = _layer(4, 256, 128)
    cfg8, _ = _layer(8, 256, 128)
    with pytest.raises(ValueError, match="^humming_forward: weight must be this layer's, with 8 experts .* got 4"):
        _forward(cfg8, w4)
    with _chord.cpu_reference_backend():
        assert _forward(cfg4, w4).shape == (3, 256)  # its own weights: runs


def test_humming_refuses_another_layers_weights_of_the_padded_size():
    from humming import _chord
    from humming.layer import HummingLayer

    cfg_pad, w_pad = _layer(2, 128, 128)  # N = 128 padded to 256
    cfg_full, w_full = _layer(2, 256, 128, seed=1)  # N = 256: the same kernel shapes
    assert (cfg_pad.shape_n, cfg_pad.pad_shape_n) == (256, 128) and cfg_full.shape_n == 256
    with pytest.raises(ValueError, match="weight_scale must be zero in the N padding of this layer"):
        _forward(cfg_pad, w_full)
    with pytest.raises(ValueError, match="^HummingLayer: weight_scale must be zero in the N padding"):
        HummingLayer(cfg_pad, w_full["weight"], w_full["weight_scale"])
    with _chord.cpu_reference_backend():
        assert _forward(cfg_pad, w_pad).shape == (3, 128)
    HummingLayer(cfg_pad, w_pad["weight"], w_pad["weight_scale"])
    cfg_k, _ = _layer(2, 256, 256)
    with pytest.raises(ValueError, match="with 256 K \\(padded\\)"):
        HummingLayer(cfg_k, w_full["weight"], w_full["weight_scale"])


def test_the_humming_fast_path_never_takes_another_layers_weights(monkeypatch):
    """humming_forward's launch-plan path (a repeated call) compares the expert count of the weight
    with the config before offering the call to a plan (shapes of N and K are in the plan's
    signature already, through inputs and outputs)."""
    from humming import _chord, forward

    cfg8, _ = _layer(8, 256, 128)
    _, w4 = _layer(4, 256, 128)
    offered = []
    monkeypatch.setattr(_chord, "try_planned_grouped", lambda *a: offered.append(a) or True)
    decision = ("grouped_contiguous", SCON, 16)
    args = (torch.zeros(3, 128).to(BF16), w4["weight"], w4["weight_scale"], torch.empty(3, 256).to(BF16), None, None,
            None, torch.zeros(9, dtype=torch.int64), 1)
    assert forward._launched(decision, cfg8, *args) is None and not offered  # not offered: the path below refuses it
    _, w8 = _layer(8, 256, 128)
    assert forward._launched(decision, cfg8, args[0], w8["weight"], w8["weight_scale"], *args[3:]) is True and offered


@pytest.mark.parametrize("top_k", [True, 2.7, 0, -1, "2"])
def test_humming_refuses_top_k_the_way_chord_ops_does(top_k):
    cfg, w = _layer(2, 256, 128)
    with pytest.raises(ValueError, match=f"^humming_forward: top_k must be a positive int, got {top_k!r}"):
        _forward(cfg, w, top_k=top_k)
    with pytest.raises(ValueError, match=f"^gemm_indexed: top_k must be a positive int, got {top_k!r}"):
        _call_indexed(_indexed_args(top_k=top_k), check_routing=False)


# ---- compressed-tensors import: non-finite scales ------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_compressed_tensors_import_refuses_non_finite_scales(bad, dtype):
    packed = torch.zeros(2, 16, 8, dtype=torch.int32)
    scale = torch.ones(2, 16, 2, dtype=dtype)
    scale[1, 5, 1] = bad
    with pytest.raises(ValueError, match=r"^from_compressed_tensors: weight_scale holds 1 non-finite .* \[1, 5, 1\]"):
        formats.from_compressed_tensors(packed, scale, (16, 64))
    with pytest.raises(ValueError, match="^pack_experts_from_compressed_tensors: weight_scale holds 1 non-finite"):
        formats.pack_experts_from_compressed_tensors(packed, scale, (16, 64))


# ---- sizes bounded before allocation ---------------------------------------------------------


@pytest.mark.parametrize("call, head", [
    (lambda: routing.align_block_size(torch.zeros(4, 2, dtype=torch.int32), 16, 10**9),
     "align_block_size: num_experts must be <= 65536"),
    (lambda: routing.contiguous_layout(torch.zeros(4, 64), torch.zeros(4, 2, dtype=torch.int32), 10**9),
     "contiguous_layout: num_experts must be <= 65536"),
    (lambda: routing.masked_layout(torch.zeros(4, 64), torch.zeros(4, 2, dtype=torch.int32), 10**9),
     "masked_layout: num_experts must be <= 65536"),
    (lambda: routing.masked_layout(torch.zeros(4, 64), torch.zeros(4, 2, dtype=torch.int32), 16, max_rows=10**8),
     "masked_layout: max_rows must be <= max(M * top_k, 4096) = 4096"),
    (lambda: routing.align_block_size(torch.zeros(4, 2, dtype=torch.int32), 16, 8, max_num_tokens_padded=10**10),
     "align_block_size: max_num_tokens_padded must be <= 2^31 - 1"),
    (lambda: routing.align_block_size(torch.zeros(4, 2, dtype=torch.int32), 8 * 10**6, 8),
     "align_block_size: block_m must be a positive multiple of 8 up to 1024"),
    (lambda: routing.contiguous_layout(torch.zeros(4, 64), torch.zeros(4, 2, dtype=torch.int32), 8, alignment=10**9,
                                       static_rows=True), "contiguous_layout: alignment must be a positive int up to"),
    (lambda: routing.random_topk_ids(4, 10**9, 2), "random_topk_ids: num_experts must be <= 65536"),
    (lambda: routing.balanced_topk_ids(10**9, 10**9, 1, 1), "balanced_topk_ids: num_experts must be <= 65536"),
], ids=["align-experts", "contiguous-experts", "masked-experts", "masked-max_rows", "align-capacity",
        "align-block_m", "contiguous-alignment", "random-experts", "balanced-experts"])
def test_sizes_are_bounded_before_any_allocation(call, head, monkeypatch):
    big = []
    real_full, real_zeros = torch.full, torch.zeros

    def watch(factory):
        def f(*a, **k):
            size = a[0] if a else k.get("size")
            n = torch.Size(size if isinstance(size, (tuple, list, torch.Size)) else (size,)).numel()
            if n > 10**7:
                big.append(n)
                raise MemoryError(f"test: an allocation of {n} elements was attempted")
            return factory(*a, **k)
        return f

    monkeypatch.setattr(torch, "full", watch(real_full))
    monkeypatch.setattr(torch, "zeros", watch(real_zeros))
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(head), str(err.value)
    assert not big


def test_masked_max_rows_may_cover_a_fixed_buffer():
    lay = routing.masked_layout(torch.zeros(4, 64), torch.zeros(4, 2, dtype=torch.int32), 4, max_rows=4096)
    assert lay.max_rows == 4096


def test_layer_config_bounds_and_types():
    from humming.config import LayerConfig

    with pytest.raises(ValueError, match="num_experts must be an int in \\[0, 65536\\]"):
        LayerConfig(shape_n=256, shape_k=128, num_experts=10**9)
    with pytest.raises(ValueError, match="^LayerConfig: shape_n must be an int, got '256' \\(str\\)"):
        LayerConfig(shape_n="256", shape_k=128)


# ---- JSON, profiles, schedule ids, activation expressions ---------------------------------


@pytest.mark.parametrize("compute, tuning, word", [
    ("{gemm_type: indexed", None, "compute_config must be a JSON object .* not valid JSON"),
    ("[1, 2]", None, "compute_config must be a JSON object"),
    (None, "[[1, 2", "tuning_config must be a JSON list of \\[min_m, max_m, config\\] rows .* not valid JSON"),
    (None, "[[1, 2]]", "tuning_config row 0 must be \\[min_m, max_m, config\\], got \\[1, 2\\]"),
    (None, "[5]", "tuning_config row 0 must be \\[min_m, max_m, config\\]"),
    (None, "7", "tuning_config must be a JSON list"),
    (None, "[]", "tuning_config must be a JSON list"),
    (None, '[["a", 9, {"schedule": "x"}]]', "tuning_config row 0 must start with two ints min_m < max_m"),
    (None, '[[-1, 9, "x"]]', "tuning_config row 0: config must be a JSON object"),
    (None, '[[-1, 9, {"schedule": "nope", "block_shape": [16, 128, 64]}]]',
     "tuning_config row 0: schedule must be a Chord schedule id"),
    (None, '[[-1, 9, {"schedule": "gcon-m16n128k64-w4-s4-c1"}]]', "tuning_config row 0: block_shape must be a list"),
    (None, '[[-1, 2147483647, {"schedule": "gcon-m16n128k64-w4-s4-c1", "block_shape": [32, 128, 64]}]]',
     "tuning_config row 0: block_shape\\[0\\]=32 .* must equal schedule gcon-m16n128k64-w4-s4-c1's block_m=16"),
    (None, '[[-1, 2147483647, {"schedule": "idx-m16n128k64-w4-s4-c1", "block_shape": [16, 128, 64]}]]',
     "tuning_config was made for the indexed family"),
])
def test_malformed_json_configs_name_the_argument(compute, tuning, word):
    cfg, w = _layer(2, 256, 128)
    kw = {"tuning_config": tuning}
    if compute is not None:
        kw["compute_config"] = compute
    else:
        kw["compute_config"] = json.dumps({"gemm_type": "grouped_contiguous"})
    with pytest.raises(ValueError, match="^humming_forward: " + word):
        _forward(cfg, w, **kw)


def test_layer_config_json_errors_name_what_was_expected():
    from humming.config import LayerConfig
    from humming.tune import get_heuristics_config

    with pytest.raises(ValueError, match="^LayerConfig.from_str: text must be a JSON object .* not valid JSON"):
        LayerConfig.from_str("{shape_n: 1")
    with pytest.raises(ValueError, match="unknown LayerConfig fields \\['shape_m'\\]"):
        LayerConfig.from_str('{"shape_m": 256, "shape_k": 128}')
    with pytest.raises(ValueError, match="^get_heuristics_config: layer_config has unknown LayerConfig fields"):
        get_heuristics_config(layer_config={"shape_n": 256, "shape_k": 128, "experts": 4}, gemm_type="indexed")


@pytest.mark.parametrize("rule, word", [
    ('"block_m": "sixteen"', "block_m must be an int \\(one of 8..256 in steps of 8\\), got 'sixteen' \\(str\\)"),
    ('"block_m": 16, "warps": null', "warps must be an int \\(one of 1, 2, 4, 8, 12, 16\\), got None"),
    ('"block_m": 16.5', "block_m must be an int .* got 16.5 \\(float\\)"),
    ('"block_m": 16, "mainloop": 3', "mainloop must be a string, one of 'mma', 'wgmma'; got 3 \\(int\\)"),
    ('"block_m": 16, "swap": true', "swap must be an int .* got True \\(bool\\)"),
    ('"block_m": 16, "k_min": "x"', "k_min must be an int, got 'x' \\(str\\)"),
])
def test_a_profile_rule_with_a_string_for_a_number_names_file_rule_and_field(tmp_path, rule, word):
    from chord.schedule import load_profile_file

    path = tmp_path / "p.json"
    path.write_text('{"gpu": "t", "deployments": {"d": {"families": {"indexed": [{"max_rows_per_expert": null, '
                    + rule + "}]}}}}")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: d/indexed rule 0: {word}"):
        load_profile_file(str(path))
    bound = tmp_path / "q.json"
    bound.write_text('{"gpu": "t", "deployments": {"d": {"families": {"indexed": [{"max_rows_per_expert": "ten", '
                     '"block_m": 8}]}}}}')
    with pytest.raises(ValueError, match="max_rows_per_expert must be a number or null, got 'ten'"):
        load_profile_file(str(bound))


@pytest.mark.parametrize("sid, knob", [("idx-m16n128k64-w4-s4-c1-sk2-sk4", "split_k"),
                                       ("idx-m16n128k64-w8-s4-c1-wgmma-wgmma", "mainloop"),
                                       ("gcon-m16n128k64-w4-s4-c1-r8-r8", "raster")])
def test_a_repeated_schedule_id_part_is_named_as_such(sid, knob):
    with pytest.raises(ValueError, match=f"{knob} given twice"):
        Schedule.from_id(sid)


def test_schedule_knobs_refuse_a_string_for_a_number():
    with pytest.raises(TypeError, match="^Schedule.block_m must be an int, got '16' \\(str\\)"):
        Schedule("indexed", "16", 128)
    with pytest.raises(TypeError, match="^Schedule.mainloop must be a str, got 1"):
        Schedule("indexed", 16, 128, mainloop=1)


@pytest.mark.parametrize("text, word", [
    ("(" * 5000 + "a" + ")" * 5000, "nesting deeper than 64 levels"),
    ("-" * 5000 + "a", "nesting deeper than 64 levels"),
    ("expf(" * 100 + "a" + ")" * 100, "nesting deeper than 64 levels"),
    ("+".join(["a"] * 3000), "more than 256 operations"),
    ("a" * 20000, "at most 16384 characters"),
], ids=["parentheses", "unary", "calls", "chain", "length"])
def test_a_pathological_activation_expression_is_a_clear_error(text, word):
    from humming import _cexpr
    from humming.ops import process_input

    with pytest.raises(ValueError, match=f"activation expression.*{word}"):
        _cexpr.evaluate(text, torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match=word):
        process_input(torch.zeros(4, 16, dtype=BF16), activation_type="binary_split", activation_impl=text)


def test_activation_expressions_at_the_bounds_still_evaluate():
    from humming import _cexpr

    assert float(_cexpr.evaluate("(" * 63 + "a" + ")" * 63, torch.ones(1))[0]) == 1.0
    assert float(_cexpr.evaluate("+".join(["a"] * 257), torch.ones(1))[0]) == 257.0


@pytest.mark.parametrize("text, word", [("{scenarios: [", "not valid JSON"), ("[1, 2]", "must be a JSON object")])
def test_a_malformed_suite_file_is_named(tmp_path, text, word):
    from chord.lab.bench.suite import load_suite

    path = tmp_path / "suite.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^suite file {re.escape(repr(str(path)))}.*{word}"):
        load_suite(path)
