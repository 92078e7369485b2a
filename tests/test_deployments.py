"""Deployments as data (profile `covers`), the serving role, and `chord tune` for any shape (CPU)."""
import json
import logging

import pytest

from chord import cost, deployments as D
from chord.lab import tune
from chord.lab.bench.suite import load_suite, shape_suite
from chord.schedule import Problem, Schedule, explain, load_profile, profile_for, select


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for var in ("CHORD_ROLE", "CHORD_DEPLOYMENT", "CHORD_PROFILE", "CHORD_PROFILE_DIR", "CHORD_POLICY"):
        monkeypatch.delenv(var, raising=False)
    D.clear_caches()
    yield
    D.clear_caches()


def test_committed_profile_names_its_deployments_and_shapes():
    deps = D.deployments("h200")
    assert {"EP8", "TP8"} <= set(deps)
    assert deps["EP8"].experts == (48,) and deps["TP8"].experts == (384,)
    assert dict(deps["EP8"].entries) == {"decode": "ep8-decode", "prefill": "ep8-prefill"}
    assert D.deployment_for(48, 4096, 7168) == "EP8" and D.deployment_for(48, 7168, 2048) == "EP8"
    assert D.deployment_for(384, 512, 7168) == "TP8"


def test_a_shape_no_profile_covers_is_custom_and_runs_the_heuristic_once_logged(caplog):
    # 48 experts of another shape are not EP8's any more, nor is every count below 256
    assert D.deployment_for(48, 256, 512) == D.CUSTOM
    assert D.deployment_for(16, 3072, 4096) == D.CUSTOM
    prob = Problem("indexed", 16, 3072, 4096, 16 * 4, 8)
    with caplog.at_level(logging.WARNING, logger="chord"):
        prof = profile_for("indexed", 16, 3072, 4096)
        profile_for("indexed", 16, 3072, 4096)
    said = [r for r in caplog.records if "no deployment" in r.getMessage()]
    assert len(said) == 1 and "chord tune --experts 16" in said[0].getMessage()
    dec = explain(prof, prob)
    assert dec.deployment == "custom" and dec.reason.startswith("heuristic")
    assert dec.schedule == explain(prof, prob, "heuristic").schedule


def test_explicit_deployment_wins_and_is_checked(monkeypatch):
    monkeypatch.setenv("CHORD_DEPLOYMENT", "ep8")  # case-insensitive
    assert D.deployment_for(16, 3072, 4096) == "EP8"
    dec = explain(profile_for("indexed", 16, 3072, 4096), Problem("indexed", 16, 3072, 4096, 64, 8))
    assert dec.deployment == "EP8" and not dec.reason.startswith("heuristic")
    monkeypatch.setenv("CHORD_DEPLOYMENT", "EP64")
    with pytest.raises(ValueError, match=r"CHORD_DEPLOYMENT='EP64'.*EP8"):
        D.deployment_for(48, 4096, 7168)
    monkeypatch.setenv("CHORD_DEPLOYMENT", "custom")
    assert D.deployment_for(48, 4096, 7168) == D.CUSTOM
    with pytest.raises(ValueError, match="deployment='nope'"):
        D.deployment_for(48, 4096, 7168, deployment="nope")


def test_role_selects_the_rules(monkeypatch):
    # 100 rows per expert: the prefill rules under both/prefill, the decode rules' last under decode
    prob = Problem("indexed", 48, 4096, 7168, 4800, 8)
    both = select(profile_for("indexed", 48, 4096, 7168), prob)
    pre = select(load_profile("h200:ep8-prefill"), prob)
    dec = select(load_profile("h200:ep8-decode"), prob)
    assert both == pre
    monkeypatch.setenv("CHORD_ROLE", "decode")
    d = explain(profile_for("indexed", 48, 4096, 7168), prob)
    assert d.schedule == dec and d.role == "decode" and d.deployment == "EP8"
    assert select(profile_for("indexed", 48, 4096, 7168, role="prefill"), prob) == pre
    monkeypatch.setenv("CHORD_ROLE", "Decoder")
    with pytest.raises(ValueError, match="CHORD_ROLE"):
        D.current_role()
    with pytest.raises(ValueError, match="role must be one of"):
        profile_for("indexed", 48, 4096, 7168, role="train")
    # TP8 has one entry for every batch, whatever the role
    monkeypatch.setenv("CHORD_ROLE", "prefill")
    p = Problem("indexed", 384, 512, 7168, 8, 8)
    assert select(profile_for("indexed", 384, 512, 7168), p) == select(load_profile("h200:tp8"), p)


def _write(tmp_path, deployments_body, name="h200"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"gpu": "t", "deployments": deployments_body}))
    return path


RULE = [{"max_rows_per_expert": None, "block_m": 8, "block_n": 128, "warps": 4, "stages": 4}]


def test_profile_files_refuse_bad_deployment_metadata(tmp_path, monkeypatch):
    from chord.schedule import load_profile_file

    monkeypatch.setenv("CHORD_PROFILE_DIR", str(tmp_path))
    bad = {
        "role": ({"d": {"role": "train", "families": {"indexed": RULE}}}, "'role'"),
        "covers": ({"d": {"covers": {"experts": [0]}, "families": {"indexed": RULE}}}, "covers.experts"),
        "gemms": ({"d": {"covers": {"experts": [4], "gemms": [[128]]}, "families": {"indexed": RULE}}}, "gemms"),
        "field": ({"d": {"rol": "decode", "families": {"indexed": RULE}}}, "unknown fields"),
        "custom": ({"d": {"deployment": "custom", "families": {"indexed": RULE}}}, "other than 'custom'"),
    }
    for key, (body, match) in bad.items():
        _write(tmp_path, body)
        D.clear_caches()
        with pytest.raises(ValueError, match=match):
            load_profile_file("h200")
    # two deployments covering one shape, and a 'both' entry beside a decode one
    cov = {"experts": [4], "gemms": [[256, 512]]}
    _write(tmp_path, {"a": {"deployment": "A", "covers": cov, "families": {"indexed": RULE}},
                      "b": {"deployment": "B", "covers": cov, "families": {"indexed": RULE}}})
    D.clear_caches()
    with pytest.raises(ValueError, match="both cover"):
        D.deployments("h200")
    _write(tmp_path, {"a": {"deployment": "A", "role": "both", "covers": cov, "families": {"indexed": RULE}},
                      "b": {"deployment": "A", "role": "decode", "covers": cov, "families": {"indexed": RULE}}})
    D.clear_caches()
    with pytest.raises(ValueError, match="role 'both' beside others"):
        D.deployments("h200")


def test_shape_suite_and_tune_selection_arguments():
    import argparse

    from chord.lab.cli import tune_selection

    s = shape_suite("EP16", 16, 3072, 4096, 4096, 1536, tok_e=[64, 1, 32])
    assert [x.id for x in s.scenarios] == ["ep16-decode-tok1", "ep16-decode-tok32", "ep16-prefill-tok64"]
    assert [x.role for x in s.scenarios] == ["decode", "decode", "prefill"]
    assert s.scenarios[0].families == ("indexed", "grouped_masked")
    t = shape_suite("tpx", 64, 512, 2048, 2048, 256, tokens=[1, 16])
    assert [x.role for x in t.scenarios] == ["both", "both"] and t.scenarios[0].families == ("indexed",)
    with pytest.raises(ValueError, match="exactly one"):
        shape_suite("x", 4, 256, 512, 512, 128)
    with pytest.raises(ValueError, match="positive ints"):
        shape_suite("x", 4, 256, 512, 512, 128, tok_e=[0])

    def ns(**kw):
        base = dict(experts=None, n_gate_up=None, k_gate_up=None, n_down=None, k_down=None, tok_e=None, tokens=None,
                    top_k=8, deployment=None, suite=None, scenarios=None, families=None)
        base.update(kw)
        return argparse.Namespace(**base)

    shape = dict(experts=16, n_gate_up=3072, k_gate_up=4096, n_down=4096, k_down=1536)
    suite, sel = tune_selection(ns(**shape, tok_e="1,4", deployment="EP16"))
    assert [sc.id for sc, _ in sel] == ["ep16-decode-tok1", "ep16-decode-tok4"]
    for kw, match in ((dict(experts=16), "missing --n-gate-up"), (dict(shape, deployment="X"), "exactly one of"),
                      (dict(shape, tok_e="1", tokens="2", deployment="X"), "exactly one of"),
                      (dict(shape, tok_e="1"), "--deployment"), (dict(shape, tok_e="a", deployment="X"), "--tok-e"),
                      (dict(shape, tok_e="1", deployment="X", suite="kimi_k2_h200"), "not both"),
                      (dict(deployment="X"), "carry their own")):
        with pytest.raises(ValueError, match=match):
            tune_selection(ns(**kw))
    suite, sel = tune_selection(ns(suite="kimi_k2_h200_large_ep"))
    assert len(sel) == 16 and {sc.deployment for sc, _ in sel} == {"EP16", "EP32"}


def _points_for(suite, best_block_n=64):
    pts = []
    for sc, fams in suite.select(None, None):
        for fam in fams:
            for gemm in ("gate_up", "down"):
                n, k, prob = sc.gemm_problem(fam, gemm)
                best = Schedule(fam, 8, best_block_n, 4, 6, 1)
                dflt = Schedule(fam, 8, 128, 4, 4, 1)
                pts.append(tune.Point(sc.profile_deployment, fam, gemm, sc.id, sc.rows_per_expert, n, k, best, 10.0,
                                      dflt, 12.0, {best.id: 10.0, dflt.id: 12.0}, []))
    return pts


def test_a_tuned_custom_shape_is_picked_up_by_ops_bench_and_the_humming_root(tmp_path, monkeypatch):
    """What `chord tune --experts 16 --n-gate-up 3072 --k-gate-up 4096 ... --deployment EP16X` writes
    (here from synthetic points: the timing needs a GPU) is used without code changes once
    CHORD_PROFILE_DIR points at it."""
    suite = shape_suite("EP16X", 16, 3072, 4096, 4096, 1536, tok_e=[1, 4, 64])
    sel = suite.select(None, None)
    meta = tune.entry_meta(sel)
    assert set(meta) == {"ep16x-decode", "ep16x-prefill"}
    assert meta["ep16x-decode"]["covers"] == {"experts": [16], "gemms": [[3072, 4096], [4096, 1536]]}
    prof = tune.profile_from_points(_points_for(suite), "h200", gpu="h200", note="n", meta=meta,
                                    about="Tuned by `chord tune --experts 16 ...`")
    (tmp_path / "h200.json").write_text(json.dumps(prof))
    monkeypatch.setenv("CHORD_PROFILE_DIR", str(tmp_path))
    D.clear_caches()
    assert D.deployment_for(16, 3072, 4096) == "EP16X" and D.deployment_for(48, 4096, 7168) == "EP8"
    dec = explain(profile_for("indexed", 16, 3072, 4096), Problem("indexed", 16, 3072, 4096, 64, 8))
    assert dec.deployment == "EP16X" and dec.schedule.block_n == 64 and "tuned on ep16x" in dec.reason
    # the humming root: its layer config fixes the deployment at load and its rows come from it
    from humming import tune as htune
    from humming.config import LayerConfig

    htune._rows_for.cache_clear()
    cfg = LayerConfig(shape_n=3072, shape_k=4096, num_experts=16)
    assert (cfg.chord_deployment, cfg.chord_role) == ("EP16X", "both")
    rows = htune.get_heuristics_config(cfg, gemm_type="indexed")
    assert rows[0][2]["schedule"] == select(profile_for("indexed", 16, 3072, 4096), Problem(
        "indexed", 16, 3072, 4096, 1, 1)).id
    assert {r[2]["block_shape"][1] for r in rows} == {64}
    # chord bench's scenarios of that shape run under it too
    assert suite.scenarios[0].profile().deployment_name == "EP16X"


def test_a_layer_loaded_for_one_role_is_refused_under_another(monkeypatch):
    from humming import tune as htune
    from humming.config import LayerConfig

    monkeypatch.setenv("CHORD_ROLE", "decode")
    cfg = LayerConfig(shape_n=4096, shape_k=7168, num_experts=48)
    assert cfg.chord_role == "decode" and cfg.chord_deployment == "EP8"
    htune.get_heuristics_config(cfg, gemm_type="indexed")
    monkeypatch.setenv("CHORD_ROLE", "prefill")
    with pytest.raises(ValueError, match="loaded for role 'decode'"):
        htune.get_heuristics_config(cfg, gemm_type="indexed")
    with pytest.raises(ValueError, match="chord_role"):
        LayerConfig(shape_n=4096, shape_k=7168, num_experts=48, chord_role="train")
    # an explicit role in the config is kept as given
    assert LayerConfig(shape_n=4096, shape_k=7168, num_experts=48, chord_role="prefill").chord_role == "prefill"


def test_cost_model_ranks_by_waves_bytes_in_flight_and_padding():
    p = Problem("indexed", 24, 4096, 7168, 24, 8)  # one row per expert: memory-bound
    deep = Schedule("indexed", 8, 256, 4, 6, 1)
    shallow = Schedule("indexed", 8, 64, 4, 2, 1)
    assert cost.estimate(deep, p).us < cost.estimate(shallow, p).us  # too few bytes in flight
    big = Problem("indexed", 24, 4096, 7168, 24 * 100, 8)  # 100 rows per expert: compute-bound
    tight = Schedule("indexed", 128, 128, 8, 3, 1, mainloop="wgmma")
    padded = Schedule("indexed", 256, 128, 8, 3, 1, mainloop="wgmma")
    assert cost.estimate(tight, big).padding < cost.estimate(padded, big).padding
    assert cost.estimate(tight, big).us < cost.estimate(padded, big).us
    cands = tune.candidates("indexed", 4096, 1.0, k=7168)
    ranked = cost.rank(cands, p)
    assert sorted(s.id for s in ranked) == sorted(s.id for s in cands)  # a permutation
    first = cost.rank(cands, p, limit=12, per_shape=2)
    shapes = {(s.block_m, s.block_n, s.warps) for s in first}
    assert len(first) == 12 and len(shapes) >= 4  # several shapes, not 12 variants of one


def test_tuning_candidates_put_the_seeds_first_and_cut_the_rest():
    # 20 experts of EP shapes: no deployment covers them; the nearest tuned one is EP16 (24 experts)
    prob = Problem("indexed", 20, 4096, 7168, 80, 8)
    default = select(profile_for("indexed", 20, 4096, 7168), prob)
    c = tune.tuning_candidates("indexed", prob, 4.0, default, "h200", 10)
    heur = explain("h200:ep16-decode", prob, "heuristic").schedule
    near = explain("h200:ep16-decode", prob, "profile").schedule  # the nearest tuned deployment's rule
    assert default == heur  # a custom shape's default is the heuristic's decision
    assert c[0] == default and near in c[:3] and near != heur
    assert len(c) >= 10 and len(set(c)) == len(c)
    split = [i for i, s in enumerate(c) if s.split_k > 1 or s.stream_k]
    assert split and min(split) > max(i for i, s in enumerate(c) if i not in split)  # the variants come last
    # precompile --tune builds exactly what the tune times
    sc = load_suite("kimi_k2_h200_large_ep").scenario("ep16-decode-tok4")
    n, k, p16 = sc.gemm_problem("indexed", "gate_up")
    c16 = tune.tuning_candidates("indexed", p16, sc.rows_per_expert, select(sc.profile(None, "indexed"), p16), "h200",
                                 10)
    built = set(tune.tune_schedules(suite=load_suite("kimi_k2_h200_large_ep"), scenario_ids="ep16-decode-tok4",
                                    families="indexed", max_candidates=10))
    assert set(c16) <= built


def test_timing_cache_round_trip(tmp_path):
    c = tune.TimingCache(tmp_path / "t.json")
    s = Schedule("indexed", 8, 128, 4, 4, 1)
    p = Problem("indexed", 24, 4096, 7168, 24, 8)
    key = c.key("NVIDIA H200", s, p, 100, 25)
    assert key not in c
    c[key] = 12.5
    c.save()
    again = tune.TimingCache(tmp_path / "t.json")
    assert key in again and again[key] == 12.5
    assert c.key("NVIDIA H100", s, p, 100, 25) != key  # another GPU is another measurement
    (tmp_path / "bad.json").write_text("{not json")
    assert tune.TimingCache(tmp_path / "bad.json").data == {}  # a damaged file is ignored, not fatal


def test_same_arithmetic_and_wave_fill_variants():
    base = Schedule("indexed", 8, 256, 4, 6, 2)
    assert tune.same_arithmetic(Schedule("indexed", 8, 128, 4, 8, 1), base)  # tiling and ring only
    for other in (Schedule("indexed", 8, 256, 4, 6, 2, fold=1), Schedule("indexed", 8, 256, 4, 6, 2, 2),
                  Schedule("indexed", 8, 256, 4, 6, 2, stream_k=1)):
        assert not tune.same_arithmetic(other, base)
    sc = load_suite("kimi_k2_h200_large_ep").scenario("ep16-decode-tok1")
    n, k, prob = sc.gemm_problem("indexed", "gate_up")
    ranked = cost.rank(tune.candidates("indexed", n, sc.rows_per_expert, k=k), prob, 24)
    extra = tune.wave_fill_variants("indexed", prob, ranked)
    assert extra and {s.split_k for s in extra} >= {2, 3, 4} and any(s.stream_k for s in extra)
    # every split with both fix-ups: the workspace and the cluster's shared memory
    splits = {(s.block_n, s.warps, s.stages, s.ctas_per_sm, s.fold, s.split_k): set() for s in extra if s.split_k > 1}
    for s in extra:
        if s.split_k > 1:
            splits[(s.block_n, s.warps, s.stages, s.ctas_per_sm, s.fold, s.split_k)].add(s.split_cluster)
    assert splits and all(v == {0, 1} for v in splits.values())
    assert all(cost.estimate(s, prob).units > 0 and (k // 64) // s.split_k >= 8 for s in extra)
    # a grid of many waves (EP8 down at 32 rows per expert) gets none
    big = Problem("indexed", 48, 7168, 2048, 48 * 32, 1)
    assert not tune.wave_fill_variants("indexed", big, [Schedule("indexed", 32, 64, 4, 4, 2)])


def test_a_deployment_tuned_for_one_role_serves_every_role(tmp_path, monkeypatch, caplog):
    """`chord tune --tok-e 4 ...` writes only a decode entry: role both uses it for every batch and
    role prefill uses it too, with a warning (the GPU run of the custom-shape tune found this)."""
    suite = shape_suite("ONE", 16, 3072, 4096, 4096, 1536, tok_e=[4])
    prof = tune.profile_from_points(_points_for(suite), "h200", gpu="h200", note="n", meta=tune.entry_meta(
        suite.select(None, None)))
    assert "one-prefill" not in prof["deployments"]
    (tmp_path / "h200.json").write_text(json.dumps(prof))
    monkeypatch.setenv("CHORD_PROFILE_DIR", str(tmp_path))
    D.clear_caches()
    prob = Problem("indexed", 16, 3072, 4096, 16 * 100, 8)
    both = explain(profile_for("indexed", 16, 3072, 4096), prob)
    assert both.deployment == "ONE" and both.role == "both" and both.schedule.block_n == 64
    with caplog.at_level(logging.WARNING, logger="chord"):
        pre = explain(profile_for("indexed", 16, 3072, 4096, role="prefill"), prob)
    assert pre.schedule == both.schedule and pre.role == "prefill"
    assert any("has no prefill rules" in r.getMessage() for r in caplog.records)


def test_tune_refuses_a_layer_shape_it_cannot_pack_or_that_is_not_a_gated_moe():
    import argparse

    from chord.lab.cli import tune_selection

    base = dict(experts=16, n_gate_up=3072, k_gate_up=4096, n_down=4096, k_down=1536, tok_e="4", tokens=None,
                top_k=8, deployment="X", suite=None, scenarios=None, families=None)
    for kw, match in ((dict(n_gate_up=3080, k_down=1540), "--n-gate-up must have N .* divisible by 16"),
                      (dict(k_gate_up=4100, n_down=4100), "--k-gate-up must have K .* divisible by 64"),
                      (dict(n_down=7168), "--n-down must equal --k-gate-up"),
                      (dict(k_down=2048), "--k-down half of --n-gate-up")):
        with pytest.raises(ValueError, match=match):
            tune_selection(argparse.Namespace(**dict(base, **kw)))
