"""Fuzzed bad arguments (issue 7): 600 random single-argument mutations per family of a valid
call must each end in a TypeError or ValueError before any launch (on CPU the valid calls end
in the "must be a CUDA tensor" refusal) — never another exception, a crash or a hang — and a
mutation that breaks an argument outright (dtype, rank, contiguity, not a tensor, a bool for an
int) must be reported by that argument's name."""
import random

import pytest
import torch

from chord import formats as F

from chord import ops
from chord.schedule import Schedule

E, N, K = 3, 256, 512
CASES = 600


def _weights():
    return (torch.zeros(F.packed_shapes(E, N, K)[0], dtype=torch.int32),
            torch.ones(F.packed_shapes(E, N, K)[1], dtype=torch.bfloat16))


def _indexed():
    qw, sc = _weights()
    m, top_k, bm = 5, 2, 8
    return ops.gemm_indexed_raw, ["x", "qweight", "scales", "sorted_ids", "expert_ids", "num_tokens_post_padded",
                                  "out", "top_k", "block_m", "schedule"], dict(
        x=torch.randn(m, K).bfloat16(), qweight=qw, scales=sc,
        sorted_ids=torch.full((64,), m * top_k, dtype=torch.int32), expert_ids=torch.zeros(8, dtype=torch.int32),
        num_tokens_post_padded=torch.tensor([8], dtype=torch.int32),
        out=torch.empty(m * top_k, N, dtype=torch.bfloat16), top_k=top_k, block_m=bm,
        schedule=Schedule("indexed", bm, 128, 4, 4, 1).id)


def _contiguous():
    qw, sc = _weights()
    return ops.gemm_contiguous_raw, ["x", "qweight", "scales", "expert_offsets", "out", "schedule"], dict(
        x=torch.randn(20, K).bfloat16(), qweight=qw, scales=sc,
        expert_offsets=torch.tensor([0, 5, 9, 20], dtype=torch.int64), out=torch.empty(20, N, dtype=torch.bfloat16),
        schedule=Schedule("grouped_contiguous", 16, 128, 4, 4, 1).id)


def _masked():
    qw, sc = _weights()
    return ops.gemm_masked_raw, ["x", "qweight", "scales", "expert_num_tokens", "out", "schedule"], dict(
        x=torch.randn(E, 7, K).bfloat16(), qweight=qw, scales=sc,
        expert_num_tokens=torch.tensor([1, 7, 0], dtype=torch.int32), out=torch.empty(E, 7, N, dtype=torch.bfloat16),
        schedule=Schedule("grouped_masked", 16, 128, 4, 4, 1).id)


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool]


def _mutate(rng: random.Random, args: dict):
    """(name, new value, strict): strict mutations break the argument itself."""
    name = rng.choice(sorted(args))
    v = args[name]
    if isinstance(v, torch.Tensor):
        kind = rng.choice(["dtype", "rank_up", "rank_down", "noncontig", "not_tensor", "size", "size", "empty"])
        if kind == "dtype":
            d = rng.choice([d for d in DTYPES if d != v.dtype])
            return name, v.to(d), True
        if kind == "rank_up":
            return name, v.unsqueeze(rng.randrange(v.dim() + 1)), name not in ("num_tokens_post_padded",)
        if kind == "rank_down" and v.dim() > 1:
            return name, v.flatten(0, 1), name not in ("x", "out")  # 3-D x/out may legitimately become 2-D
        if kind == "noncontig" and v.dim() and v.shape[-1] > 1:
            return name, torch.cat([v, v], -1)[..., ::2], True
        if kind == "not_tensor":
            return name, rng.choice([None, 3, [1, 2], "x", 2.5]), True
        if kind == "empty":
            return name, v[:0], False
        d = rng.randrange(v.dim()) if v.dim() else None
        if d is None:
            return name, v.reshape(1), False
        shape = list(v.shape)
        shape[d] = max(0, shape[d] + rng.choice([-1, 1, shape[d]]))
        return name, torch.zeros(shape, dtype=v.dtype), False
    if isinstance(v, int):
        new = rng.choice([0, -1, v + 1, 2 * v, True, 1.0, "2", None])
        return name, new, isinstance(new, (bool, float, str)) or new is None or new <= 0
    # the schedule id
    return name, rng.choice(["", "nonsense", "idx-m8n7k64-w4-s4-c1", "gmsk-m16n128k64-w4-s4-c1",
                             "gcon-m16n128k64-w4-s4-c1", "idx-m16n128k64-w4-s4-c1", 7, None]), False


@pytest.mark.parametrize("family", [_indexed, _contiguous, _masked], ids=["indexed", "contiguous", "masked"])
def test_fuzzed_bad_arguments_get_a_clear_error(family):
    fn, order, base = family()
    rng = random.Random(1234)
    outcomes = {"named": 0, "refused": 0, "reached the device check": 0}
    mutated, named = set(), set()
    for case in range(CASES):
        name, value, strict = _mutate(rng, base)
        mutated.add(name)
        args = dict(base, **{name: value})
        try:
            fn(*[args[k] for k in order], check_routing=False)
        except (TypeError, ValueError) as exc:
            msg = str(exc)
            if "must be a CUDA tensor" in msg:
                assert not strict, f"case {case}: {name}={value!r} passed every check ({msg})"
                outcomes["reached the device check"] += 1
            elif strict:
                assert name in msg, f"case {case}: {name} broken, message does not name it: {msg}"
                outcomes["named"] += 1
                named.add(name)
            else:
                outcomes["refused"] += 1
        else:  # pragma: no cover - a CPU call can never launch
            pytest.fail(f"case {case}: {name}={value!r} returned without an error on CPU")
    # every argument was mutated, and every one but the schedule id (its mutations are bad ids, not
    # broken arguments) was broken outright at least once and named by its message
    assert mutated == set(order), sorted(set(order) - mutated)
    assert named == set(order) - {"schedule"}, sorted(set(order) - {"schedule"} - named)
    assert outcomes["named"] > CASES // 4, outcomes
