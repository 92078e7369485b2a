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

from chord.lab import stamps as S
from chord.schedule import Schedule
from chord.testing import DIRECT_ONE_TOKEN, direct_one_token_profile

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
    res = S.run_point("tp8-m1", "indexed", reps=2, profile_file=direct_one_token_profile(tmp_path / "h200-direct.json"))
    assert (res["schedules"]["gate_up"], res["schedules"]["down"]) == DIRECT_ONE_TOKEN
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
