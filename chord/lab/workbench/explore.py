"""Schedule decisions as rows, for sliders and sweeps. Pure functions of host integers.

Every number here comes from ``chord.schedule`` (the same `select` serving uses) and the Kimi
K2 shapes of the suite; nothing is measured. `todays_schedules` gives the schedules the policy in
use picks today for a suite scenario's calls (what `chord bench` and `chord capture` launch).
"""
from __future__ import annotations


from chord.schedule import SMS_H200, Problem, explain, profile_for
from chord.schedule import token_tiles as _token_tiles_for_rows
from chord.schedule import waves as _waves

KIMI = {
    # deployment: (experts, hidden K, gate_up N, down K), per GPU
    "ep8": (48, 7168, 4096, 2048),
    "ep16": (24, 7168, 4096, 2048),
    "ep32": (12, 7168, 4096, 2048),
    "tp8": (384, 7168, 512, 256),
}


def gemm_shape(deployment: str, gemm: str) -> tuple[int, int, int]:
    """(experts, N, K) of a Kimi K2 GEMM on one GPU."""
    if deployment not in KIMI:
        raise ValueError(f"deployment must be one of {sorted(KIMI)}, got {deployment!r}")
    e, hidden, n13, k2 = KIMI[deployment]
    if gemm == "gate_up":
        return e, n13, hidden
    if gemm == "down":
        return e, hidden, k2
    raise ValueError(f"gemm must be 'gate_up' or 'down', got {gemm!r}")


def token_tiles(experts: int, tok_e: float, block_m: int) -> int:
    """Token tiles when every expert gets `tok_e` rows (`tok_e * experts` routed rows, balanced
    routing as in the suite's EP8 scenarios; chord.schedule.token_tiles). The heuristic policy
    counts with uniformly random routes instead (chord.schedule.touched_experts: 48 rows over 48
    experts touch ~31), so near one row per expert its `reason` names fewer touched experts
    than this count."""
    return _token_tiles_for_rows(experts, int(round(tok_e * experts)), block_m)


def tile_count(experts: int, tok_e: float, block_m: int, n: int, block_n: int, split_k: int = 1) -> int:
    """CTAs that do work: token tiles (`token_tiles`) x N blocks of `block_n` (a CTA's features) x splits."""
    return token_tiles(experts, tok_e, block_m) * (n // block_n) * split_k


def waves(tiles: int, sms: int = SMS_H200, ctas_per_sm: int = 1) -> tuple[int, float]:
    """(waves, utilization of the last wave) of `tiles` CTAs on `sms` x `ctas_per_sm` slots."""
    return _waves(tiles, sms * ctas_per_sm)


def decision_row(deployment: str, family: str, gemm: str, tok_e: float, sms: int = SMS_H200,
                 policy: str | None = None, role: str | None = None) -> dict:
    """The schedule Chord picks for `tok_e` rows per expert (under the selection `policy`:
    default $CHORD_POLICY, see chord.schedule.parse_policy), and what that tile means on the GPU.

    ``tiles`` counts the CTAs that do work (token tiles of every expert x N blocks, x split_k);
    ``padding`` is the fraction of computed token rows that are padding (rows up to the tile
    size); ``waves`` and ``wave_efficiency`` = tiles / (waves x SMs x CTAs per SM).
    """
    e, n, k = gemm_shape(deployment, gemm)
    rows = int(round(tok_e * e))
    top_k = 8 if (family == "indexed" and gemm == "gate_up") else 1
    prob = Problem(family, e, n, k, rows, top_k)
    dec = explain(profile_for(family, e, n, k, role=role), prob, policy)
    s = dec.schedule
    m_tiles = token_tiles(e, tok_e, s.block_m)
    tiles = tile_count(e, tok_e, s.block_m, n, s.block_n_cta, s.split_k)
    slots = sms * s.ctas_per_sm
    n_waves, _ = waves(tiles, sms, s.ctas_per_sm)
    computed = m_tiles * s.block_m
    return {
        "deployment": deployment, "family": family, "gemm": gemm, "tok_e": tok_e, "rows": rows,
        "n": n, "k": k, "schedule": s.id, "block_m": s.block_m, "block_n": s.block_n, "mainloop": s.mainloop,
        "split_k": s.split_k, "ctas_per_sm": s.ctas_per_sm, "tiles": tiles, "waves": n_waves,
        "wave_efficiency": tiles / (n_waves * slots) if n_waves else 0.0,
        "padding": 1.0 - rows / computed if computed else 0.0,
        "profile": dec.profile, "reason": dec.reason, "candidates": [c.id for c in dec.candidates],
        "covered_by": dec.deployment, "role": dec.role,
    }


def sweep_tok_e(deployment: str, family: str, gemm: str, tok_e_values, sms: int = SMS_H200,
                policy: str | None = None, role: str | None = None) -> list[dict]:
    """`decision_row` for each tokens-per-expert value."""
    return [decision_row(deployment, family, gemm, t, sms, policy, role) for t in tok_e_values]


def todays_schedules(scenario: str, family: str, suite=None) -> dict:
    """``{"gate_up": id, "down": id}``: what the profile and selection policy in use pick today for
    this scenario's calls (the schedules `chord bench` and `chord capture` would launch)."""
    from chord.lab.bench.inputs import scenario_for
    from chord.lab.bench.runner import ChordAPI, scenario_schedules
    from chord.schedule import gpu_profile_name

    sc = scenario_for(suite, scenario, family, who="capture")
    gate_up, down = scenario_schedules(family, sc, ChordAPI.profile(gpu_profile_name(), sc))
    return {"gate_up": gate_up.id, "down": down.id}
