"""One decision, whoever calls: every suite point gets the same schedule through `chord bench`
(the scenario's deployment profile), `chord.ops` (`profile_for`, what the wrappers use) and the
vLLM path (`humming.tune` tuning rows looked up with `valid_shape_m` = the routed rows)."""
import pytest

from chord.lab.bench.suite import load_suite
from chord.schedule import Problem, load_profile, profile_for, select

POINTS = [(sc, fam, gemm) for sc in load_suite().scenarios for fam in sc.families for gemm in ("gate_up", "down")]


@pytest.mark.parametrize("sc, family, gemm", POINTS, ids=lambda v: getattr(v, "id", v))
def test_same_schedule_for_bench_ops_and_vllm(sc, family, gemm):
    from humming import tune

    n, k, top_k = (sc.n_gate_up, sc.k_gate_up, sc.top_k) if gemm == "gate_up" else (sc.n_down, sc.k_down, 1)
    prob = Problem(family, sc.experts, n, k, sc.rows, top_k if family == "indexed" else 1)
    bench = select(load_profile(f"h200:{sc.profile_deployment}"), prob).id
    ops = select(profile_for(family, sc.experts, n, k), prob).id
    vllm = tune.row_for(tune.rows_for(family, sc.experts, n, k), sc.rows)["schedule"]
    assert bench == ops == vllm, (bench, ops, vllm)


def test_ep8_merged_rules_switch_from_decode_to_prefill():
    from chord.schedule import EP8_DECODE_MAX_ROWS_PER_EXPERT as T

    dec, pre = load_profile("h200:ep8-decode"), load_profile("h200:ep8-prefill")
    prof = profile_for("indexed", 48, 4096, 7168)
    for rpe, want in ((1, dec), (32, dec), (T, dec), (T + 1, pre), (64, pre), (512, pre)):
        p = Problem("indexed", 48, 4096, 7168, int(round(rpe * 48)), 8)
        assert select(prof, p) == select(want, p), rpe
