"""`chord distributed` on the GPUs this machine has: NCCL, one GPU per rank, Chord's kernels behind the
humming root, every rank checked against the float32 reference (world 1, and 2 where there are two GPUs)."""
from __future__ import annotations

import pytest
import torch

from chord.lab import distributed as dist_lab
from chord.lab.bench.inputs import TOLERANCE

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]


# world 1, and 2 where this machine has two GPUs (one process per GPU)
WORLDS = [w for w in (1, 2) if w <= max(1, torch.cuda.device_count())]


@pytest.mark.parametrize("mode,family", [("ep", "grouped_masked"), ("ep", "grouped_contiguous"), ("tp", "indexed")])
@pytest.mark.parametrize("world", WORLDS)
def test_nccl_world_matches_the_reference(mode, family, world):
    cfg = dist_lab.Config(mode=mode, world_size=world, family=family, tokens=96, experts=16, hidden=256,
                          intermediate=256, top_k=4, iters=2, device="cuda")
    result = dist_lab.run(cfg)
    assert result["backend"] == "nccl" and result["multicast_env"] == dist_lab.MULTICAST_OFF
    for r in result["ranks"]:
        assert r["device"] == f"cuda:{r['rank']}" and r["family"] == family
        assert r["rel_err"] < TOLERANCE, r
    assert result["ok"]
