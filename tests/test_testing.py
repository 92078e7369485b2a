"""chord.testing, the helpers the GPU tests share, on CPU: the cached random experts follow the
tile-group cap, check_rows tells written from unwritten rows, run_cases names every failed case."""
import pytest
import torch

from chord import formats, testing


def test_cached_random_experts_follow_the_tile_group_cap(monkeypatch):
    """CHORD_TILE_GROUP changes the packed layout (qweight dim 3 = G): a cache hit under another
    cap would hand out weights of the wrong G (the review's finding)."""
    monkeypatch.setattr(testing, "_EXPERTS", {})
    monkeypatch.delenv("CHORD_TILE_GROUP", raising=False)
    qe8, pw8 = testing.cached_random_experts(2, 256, 64, device="cpu")
    assert pw8.qweight.shape[3] == formats.tile_group(256) == 8
    assert testing.cached_random_experts(2, 256, 64, device="cpu")[1] is pw8  # still memoized
    monkeypatch.setenv("CHORD_TILE_GROUP", "2")
    qe2, pw2 = testing.cached_random_experts(2, 256, 64, device="cpu")
    assert pw2.qweight.shape[3] == 2 and tuple(pw2.qweight.shape) == formats.packed_shapes(2, 256, 64, 2)[0]
    assert torch.equal(formats.unpack_experts(pw2).q, qe8.q)  # same codes, other layout
    monkeypatch.setenv("CHORD_TILE_GROUP", "8")
    assert testing.cached_random_experts(2, 256, 64, device="cpu")[1] is pw8


def _poisoned_pair():
    ref = torch.full((6, 4), float("nan"))
    ref[:4] = torch.randn(4, 4)
    out = testing.poisoned(6, 4, device="cpu")
    out[:4] = ref[:4].bfloat16()
    return out, ref


def test_check_rows_passes_a_correct_output():
    out, ref = _poisoned_pair()
    assert testing.check_rows(out, ref) < testing.BF16_TOL  # valid rows from the reference's NaN rows
    valid = torch.tensor([True, True, True, True, False, False])
    assert testing.check_rows(out, ref, valid, "explicit") < testing.BF16_TOL
    empty = torch.zeros(6, dtype=torch.bool)
    assert testing.check_rows(testing.poisoned(6, 4, device="cpu"), ref, empty) == 0.0


@pytest.mark.parametrize("damage, message", [
    ("write a skipped row", "rows the routing does not name were written"),
    ("skip a routed row", "rows the routing names were not written"),
    ("wrong values", "rel_err"),
])
def test_check_rows_names_what_is_wrong(damage, message):
    out, ref = _poisoned_pair()
    if damage == "write a skipped row":
        out[5] = 0
    elif damage == "skip a routed row":
        out[2] = float("nan")
    else:
        out[:4] = -out[:4]
    with pytest.raises(AssertionError, match=f"^replay 3: {message}"):
        testing.check_rows(out, ref, what="replay 3")


def test_run_cases_runs_every_case_and_names_each_failure():
    calls = []

    def case(i):
        calls.append(i)
        if i == 2:
            raise AssertionError("e=3 n=256: rel_err 5e-02 >= 1e-02\nassert False")
        if i == 4:
            raise ValueError("bad schedule")

    ran, failed = testing.run_cases(case, 6, name=lambda i: f"case {i} (s{i})")
    assert ran == 6 and calls == list(range(6))
    assert failed == ["case 2 (s2): e=3 n=256: rel_err 5e-02 >= 1e-02", "case 4 (s4): ValueError: bad schedule"]
    synced = []
    assert testing.run_cases(lambda i: None, 3, after=lambda: synced.append(1)) == (3, []) and len(synced) == 3


def test_run_cases_stops_when_the_cuda_context_is_lost():
    def case(i):
        if i == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    ran, failed = testing.run_cases(case, 10)
    assert ran == 2 and failed == ["case 1: RuntimeError: CUDA error: an illegal memory access was encountered"]
