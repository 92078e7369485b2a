"""`chord tune` for a shape no profile covers, end to end on the GPU: 16 local experts, gate_up
[16, 3072, 4096], down [16, 4096, 1536]. The tune writes a profile with a named deployment; with
CHORD_PROFILE_DIR pointing at it and no code change, `chord.ops`' decision and the `humming` root
(vLLM's call sequence) run the tuned schedules, and the layer matches the float32 reference."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = ["--experts", "16", "--n-gate-up", "3072", "--k-gate-up", "4096", "--n-down", "4096", "--k-down", "1536"]


@pytest.mark.gpu
def test_a_custom_shape_tunes_end_to_end_and_the_humming_root_uses_it(tmp_path, monkeypatch):
    from chord import deployments as D
    from chord.cli import main
    from chord.schedule import Problem, explain, profile_for
    from humming import tune as htune
    from test_humming_vllm_sequence import run_scenario

    for var in ("CHORD_ROLE", "CHORD_DEPLOYMENT", "CHORD_PROFILE", "CHORD_PROFILE_DIR", "CHORD_POLICY"):
        monkeypatch.delenv(var, raising=False)
    D.clear_caches()
    assert D.deployment_for(16, 3072, 4096) == D.CUSTOM  # nothing covers it before the tune
    out = tmp_path / "prof"
    rc = main(["tune", *SHAPE, "--tok-e", "4", "--families", "indexed", "--deployment", "EP16T",
               "--max-candidates", "2", "--rep-ms", "5", "--warmup-ms", "5", "--no-timing-cache", "--quiet",
               "--out", str(out)])
    assert rc == 0
    prof = json.loads((out / "h200.json").read_text())
    entry = prof["deployments"]["ep16t-decode"]
    assert entry["deployment"] == "EP16T" and entry["covers"]["experts"] == [16]
    assert "chord tune" in entry["about"] and "driver" in entry["about"]
    tuned = json.loads((out / "tuning.json").read_text())
    assert {p["gemm"] for p in tuned} == {"gate_up", "down"}
    best = {p["gemm"]: p["best"] for p in tuned}

    monkeypatch.setenv("CHORD_PROFILE_DIR", str(out))
    D.clear_caches()
    htune._rows_for.cache_clear()
    assert D.deployment_for(16, 3072, 4096) == "EP16T"
    dec = explain(profile_for("indexed", 16, 3072, 4096), Problem("indexed", 16, 3072, 4096, 64, 8))
    assert dec.deployment == "EP16T" and dec.schedule.id == best["gate_up"]
    # vLLM's sequence through the humming root: 16 tokens, top-8 of 16 experts = 8 rows per expert
    err, experts, configs = run_scenario("cuda", family="indexed", num_local=16, num_global=16, hidden=4096,
                                         inter=1536, M=16, top_k=8)
    torch.cuda.synchronize()
    assert err < 1e-2
    assert configs["w13"].chord_deployment == "EP16T"
    rows = htune.get_heuristics_config(configs["w13"], gemm_type="indexed")
    assert best["gate_up"] in {cfg["schedule"] for _, _, cfg in rows}
