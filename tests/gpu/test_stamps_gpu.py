"""`chord stamps` on the H200: stamped builds (-DCHORD_STAMPS) of the profile's pairs give the same
bits as the plain kernels, and their records are whole and in order.

* tp8-m1 indexed: the mma loop with split-K through the workspace (a fix-up CTA per tile);
* ep8-decode-tok1 grouped_masked: the mma loop, masked rows (CTAs without rows leave early);
* ep8-prefill-tok64 indexed: the wgmma producer loop (ws1), gathered rows;
* tp8-m1 indexed through a profile copy with the direct loop's one-token candidates.
"""
from __future__ import annotations

import pytest
import torch

import json
from pathlib import Path

from chord import _resources
from chord.lab import stamps as S
from chord.schedule import Schedule

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]


@pytest.mark.parametrize("scenario,family", [("tp8-m1", "indexed"), ("ep8-decode-tok1", "grouped_masked"),
                                             ("ep8-prefill-tok64", "indexed")])
def test_stamped_pairs_give_the_same_bits_and_whole_records(scenario, family):
    _check_point(S.run_point(scenario, family, reps=2), f"{scenario} {family}")


def test_stamped_direct_pair_at_one_token(tmp_path):
    """The direct loop (warp-private rings) at TP8 one token, through a copy of the profile whose two
    one-token rules are the direct candidates: the same checks (its first K block is stamped after
    each warp's first block, its epilogue after the partials meet)."""
    prof = json.loads(Path(_resources.profiles_dir(), "h200.json").read_text())
    rules = prof["deployments"]["tp8"]["families"]["indexed"]
    assert rules[0].get("k_max") == 256 and "k_max" not in rules[1]  # down's one-token rule, then gate_up's
    common = {"max_rows_per_expert": rules[0]["max_rows_per_expert"], "block_m": 8, "ctas_per_sm": 1, "direct": 1,
              "why": "tests/gpu/test_stamps_gpu.py: the direct candidates"}
    rules[0] = dict(common, block_n=128, warps=4, stages=2, k_max=256)
    rules[1] = dict(common, block_n=32, warps=8, stages=8)
    path = tmp_path / "h200-direct.json"
    path.write_text(json.dumps(prof))
    res = S.run_point("tp8-m1", "indexed", reps=2, profile_file=str(path))
    assert res["schedules"] == {"gate_up": "idx-m8n32k64-w8-s8-c1-dr1", "down": "idx-m8n128k64-w4-s2-c1-dr1"}
    _check_point(res, "tp8-m1 indexed, direct")


def _check_point(res, what):
    assert res["same_bits"], f"{what}: the stamped kernels' outputs differ from the plain ones"
    for gemm in ("gate_up", "down"):
        sid = res["schedules"][gemm]
        recs = res["_last"][sid]
        assert recs, f"{sid}: no record"
        assert S.order_violations(recs) == []
        with_rows = [r for r in recs if r[S.ROWS_CLK]]
        assert with_rows, f"{sid}: no CTA had rows"
        # every CTA with rows ran its ring and an epilogue
        assert all(r[S.FIRST_CLK] != S.NONE and r[S.EPI_CLK] != S.NONE for r in with_rows)
        s = Schedule.from_id(sid)
        fixups = sum(1 for r in recs if r[S.FIXUP_CLK])
        if s.split_k > 1 and not s.split_cluster:
            assert fixups * s.split_k == len(with_rows), f"{sid}: one fix-up CTA per split tile"
        else:
            assert fixups == 0
        one = res["replays"][-1][gemm]
        assert one["ctas"] == len(recs) and one["span_us"] > 0 and one["launch_us"] > -1.0
    summ = res["summary"]
    assert summ["pair_us"] >= summ["gate_up"]["span_us"] + summ["down"]["span_us"]
