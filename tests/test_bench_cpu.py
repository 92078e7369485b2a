"""CPU tests of chord.lab.bench: suites, floors, the CPU fallback of `chord bench`, reports, and the
Humming baseline driver (argument parsing, refusal of a wrong `humming`, its flow on a fake)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from chord.lab.bench import floors as F
from chord.lab.bench import humming_baseline as HB
from chord.lab.bench import humming_worker as W
from chord.lab.bench import vllm_sequence as VS
from chord.lab.bench import inputs as I
from chord.lab.bench import report, runner, timing
from chord.lab.bench.ceilings import Ceilings, from_baseline_file
from chord.lab.bench.suite import DEFAULT_BASELINE, Scenario, cpu_scenarios, load_suite

REPO = Path(__file__).resolve().parents[1]
# the ceilings recorded with the committed Humming baseline (H200, 2026-11-29)
BASE_CEIL = Ceilings(4.248, 693.9, "test")


# ----------------------------------------------------------------------------- suites


def test_suite_loads_with_derived_numbers():
    s = load_suite()
    assert s.name == "kimi-k2-h200"
    assert len(s.scenarios) == 15 and len(set(s.ids)) == 15
    d = s.scenario("ep8-decode-tok1")
    assert (d.deployment, d.experts, d.top_k, d.m, d.rows, d.rows_per_expert) == ("EP8", 48, 8, 6, 48, 1.0)
    assert d.profile_deployment == "ep8-decode"
    p = s.scenario("ep8-prefill-tok512")
    assert (p.m, p.rows, p.profile_deployment) == (3072, 24576, "ep8-prefill")
    t = s.scenario("tp8-m16")
    assert (t.experts, t.n_gate_up, t.k_down, t.m, t.rows, t.profile_deployment) == (384, 512, 256, 16, 128, "tp8")
    assert d.weights_key == p.weights_key != t.weights_key


def test_suite_selection_by_ids_and_families():
    s = load_suite()
    sel = s.select("tp8-m1, ep8-decode-tok4", None)
    assert [(sc.id, f) for sc, f in sel] == [("ep8-decode-tok4", ("indexed", "grouped_masked")), ("tp8-m1", ("indexed",))]
    sel = s.select(None, "grouped_contiguous")
    assert [sc.id for sc, _ in sel] == ["ep8-prefill-tok64", "ep8-prefill-tok128", "ep8-prefill-tok256",
                                        "ep8-prefill-tok512"]
    assert all(f == ("grouped_contiguous",) for _, f in sel)
    assert s.select(["tp8-m1"], "grouped_masked") == []  # no family left -> dropped
    assert len(s.select()) == 15
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        s.select("nope")
    with pytest.raises(ValueError, match="unknown families"):
        s.select(None, "dense")


def test_suite_rejects_bad_scenarios(tmp_path):
    with pytest.raises(ValueError, match="exactly one of tok_e"):
        Scenario(id="x", deployment="EP8", experts=48, n_gate_up=4096, k_gate_up=7168, n_down=7168, k_down=2048)
    with pytest.raises(ValueError, match="balanced routing"):
        Scenario(id="x", deployment="EP8", experts=5, n_gate_up=64, k_gate_up=64, n_down=64, k_down=32, tok_e=1,
                 top_k=2)
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps({"name": "b", "scenarios": [{"id": "a", "deployment": "EP8", "experts": 8,
                                                           "n_gate_up": 64, "k_gate_up": 64, "n_down": 64,
                                                           "k_down": 32, "tok_e": 1, "wat": 1}]}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_suite(bad)
    with pytest.raises(ValueError, match="not found"):
        load_suite(tmp_path / "missing.json")


def test_routing_of_scenarios_is_seeded_and_balanced():
    s = load_suite()
    ep = s.scenario("ep8-decode-tok4")
    ids = I.make_topk_ids(ep, 0)
    assert ids.shape == (24, 8) and ids.dtype == torch.int32
    assert torch.bincount(ids.flatten().long(), minlength=48).tolist() == [4] * 48
    assert all(len(set(r)) == 8 for r in ids.tolist())
    assert torch.equal(ids, I.make_topk_ids(ep, 0))
    assert not torch.equal(ids, I.make_topk_ids(ep, 1))
    tp = s.scenario("tp8-m16")
    # seed 0 = the suite's rule (seeded by M)
    assert I.routing_seed(tp, 0) == 16
    assert I.describe_touched(I.make_topk_ids(tp, 0), 384)["experts_touched"] == 110


# ----------------------------------------------------------------------------- floors


def test_floor_ep8_decode_by_hand():
    sc = load_suite().scenario("ep8-decode-tok1")  # M = 6 tokens, 48 routed rows, 48 experts
    w13 = 48 * (4096 * 7168 // 2 + 4096 * (7168 // 32) * 2)  # 792,723,456 B
    w2 = 48 * (7168 * 2048 // 2 + 7168 * (2048 // 32) * 2)  # 396,361,728 B
    assert (w13, w2) == (792_723_456, 396_361_728)
    act_gu_indexed = 6 * 7168 * 2 + 48 * 4096 * 2  # tokens in, routed rows out
    act_dn = 48 * 2048 * 2 + 48 * 7168 * 2
    fl = F.scenario_floor(sc, BASE_CEIL, 48, "indexed")
    assert fl.gate_up.bytes == w13 + act_gu_indexed and fl.down.bytes == w2 + act_dn
    mem_us = (w13 + w2 + act_gu_indexed + act_dn) / 4.248e6  # B / (B per us)
    assert fl.gate_up.bound == fl.down.bound == "memory"
    assert fl.floor_us == pytest.approx(mem_us, rel=1e-12)
    assert fl.floor_us == pytest.approx(280.2378, abs=1e-3)
    # grouped families read the permuted [rows, K] input: the committed file's 280.4 us
    g = F.scenario_floor(sc, BASE_CEIL, 48, "grouped_masked")
    assert g.floor_us == pytest.approx((w13 + w2 + 48 * (7168 + 4096 + 2048 + 7168) * 2) / 4.248e6, rel=1e-12)
    assert round(g.floor_us, 1) == 280.4
    assert F.pct_of_floor(g.floor_us, 316.9) == pytest.approx(100 * g.floor_us / 316.9)


def test_floor_ep8_prefill_compute_bound_by_hand():
    sc = load_suite().scenario("ep8-prefill-tok512")  # 24576 routed rows
    fl = F.scenario_floor(sc, BASE_CEIL, 48, "grouped_contiguous")
    gu = 2 * 24576 * 4096 * 7168 / 693.9e6
    dn = 2 * 24576 * 7168 * 2048 / 693.9e6
    assert fl.bound == "compute"
    assert fl.floor_us == pytest.approx(gu + dn, rel=1e-12)
    assert round(fl.floor_us, 0) == round(3119.8, 0)


def test_floor_tp8_by_hand():
    s = load_suite()
    m1 = s.scenario("tp8-m1")  # 1 token, 8 experts touched
    per_expert = 512 * 7168 // 2 + 512 * 224 * 2 + 7168 * 256 // 2 + 7168 * 8 * 2
    assert per_expert == 3_096_576
    act = 1 * 7168 * 2 + 8 * 512 * 2 + 8 * 256 * 2 + 8 * 7168 * 2
    fl = F.scenario_floor(m1, BASE_CEIL, 8, "indexed")
    assert fl.floor_us == pytest.approx((8 * per_expert + act) / 4.248e6, rel=1e-12)
    assert round(fl.floor_us, 1) == 5.9  # the committed file's floor
    # mixed: gate_up compute-bound, down memory-bound -> the sum of per-GEMM maxima
    m4k = s.scenario("tp8-m4096")
    fl = F.scenario_floor(m4k, BASE_CEIL, 384, "indexed")
    rows = 4096 * 8
    gu_c = 2 * rows * 512 * 7168 / 693.9e6
    dn_m = (384 * (7168 * 256 // 2 + 7168 * 8 * 2) + rows * 256 * 2 + rows * 7168 * 2) / 4.248e6
    assert (fl.gate_up.bound, fl.down.bound, fl.bound) == ("compute", "memory", "mixed")
    assert fl.floor_us == pytest.approx(gu_c + dn_m, rel=1e-12)
    with pytest.raises(ValueError):
        F.scenario_floor(m1, BASE_CEIL, 385)


def test_ceilings_from_committed_file():
    c = from_baseline_file(DEFAULT_BASELINE)
    assert (c.copy_TB_per_s, c.bf16_matmul_TFLOP_per_s) == (4.248, 693.9)
    assert "not measured" in c.source


# ----------------------------------------------------------------------------- chord bench, no GPU


def test_chord_bench_cpu_fallback(tmp_path, monkeypatch, capsys):
    from chord import cli

    monkeypatch.setattr(timing, "cuda_available", lambda: False)
    rc = cli.main(["bench", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    first = out.splitlines()[0]
    assert first.startswith("chord bench: no CUDA GPU found")
    assert "float32 reference" in first
    for sc in cpu_scenarios():
        for fam in sc.families:
            assert any(sc.id in line and fam in line and line.rstrip().endswith("pass") for line in out.splitlines())
    data = json.loads((tmp_path / "cpu-reference.json").read_text())
    assert {r["check"] for r in data["rows"]} == {"pass"}


def test_chord_bench_cli_subprocess_without_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-m", "chord.cli", "bench", "--out", str(tmp_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].startswith("chord bench: no CUDA GPU found")


def test_cli_parser_registers_only_implemented_commands():
    from chord.lab import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == {"bench", "tune", "info", "doctor", "precompile", "capture", "limits", "stamps", "variant",
                                "distributed"}
    assert set(sub.choices) == set(cli.COMMANDS)
    if not __import__("torch").cuda.is_available():
        assert cli.main(["tune"]) == 2  # says plainly that tuning needs a GPU
    args = parser.parse_args(["bench", "--scenarios", "tp8-m1", "--quick", "--humming-dir", "/x"])
    assert (args.scenarios, args.quick, args.humming_dir, args.out) == ("tp8-m1", True, "/x", "bench-out")
    assert cli.main(["info"]) == 0


# ----------------------------------------------------------------------------- reports


def _synthetic_result(live: bool) -> dict:
    sel = load_suite().select("ep8-decode-tok1,tp8-m1", "indexed")
    common = {"gpu": "NVIDIA H200", "commit": "abc", "timestamp": "2026-11-29T00:00:00Z", "seed": 0}
    rows = []
    for sc, fams in sel:
        for fam in fams:
            fl = F.scenario_floor(sc, BASE_CEIL, min(sc.experts, sc.rows), fam)
            t = {"p20": fl.floor_us * 1.1, "p50": fl.floor_us * 1.2, "p80": fl.floor_us * 1.3}
            info = {"schedule_gate_up": "idx-m8n128k64-w4-s8-c2", "schedule_down": "idx-m8n128k64-w4-s8-c2",
                    "block_m": [8, 8], "check": "pass"}
            rows.append(runner.make_row("chord", sc, fam, "time_us", t["p20"], t["p50"], t["p80"], "us", common, **info))
            rows += runner.floor_rows("chord", sc, fam, fl, t, common, **info)
    if live:
        for sc, fams in sel:
            rows.append(runner.make_row(runner.PROVIDER_HUMMING, sc, "indexed", "time_us", 1.0, 400.0, 2.0, "us",
                                        common, block_m=[8, 8], check="pass"))
    else:
        crows, _ = runner.committed_baseline_rows(sel, DEFAULT_BASELINE, common)
        rows += crows
    return {"meta": {**common, "suite_name": "kimi-k2-h200", "ceilings": BASE_CEIL.as_dict(),
                     "humming": {"live": live}}, "rows": rows}


def test_committed_baseline_rows_are_labelled():
    res = _synthetic_result(live=False)
    committed = [r for r in res["rows"] if r["provider"] == runner.PROVIDER_COMMITTED]
    assert committed and all("committed" in r["provider"] for r in committed)
    t = {r["scenario"]: r["p50"] for r in committed if r["metric"] == "time_us"}
    assert t == {"ep8-decode-tok1": 316.9, "tp8-m1": 25.0}
    table = report.terminal_table(res)
    assert "NOT run" in table and "316.9" in table


def test_report_json_and_html(tmp_path, monkeypatch):
    res = _synthetic_result(live=True)
    paths = report.write_all(res, tmp_path)
    assert [p.name for p in paths] == ["results.json", "report.html", "table.txt"]
    back = json.loads((tmp_path / "results.json").read_text())
    assert back["rows"] == json.loads(json.dumps(res["rows"]))
    cells = report.pivot(res)
    assert [(c["scenario"], c["family"]) for c in cells] == [("ep8-decode-tok1", "indexed"), ("tp8-m1", "indexed")]
    assert cells[0]["speedup"] == pytest.approx(400.0 / cells[0]["chord_us"])
    assert cells[0]["chord_pct"] == pytest.approx(100 / 1.2)
    html_text = (tmp_path / "report.html").read_text()
    assert "<table>" in html_text and "ep8-decode-tok1" in html_text and "idx-m8n128k64-w4-s8-c2" in html_text

    def no_plotly(_):
        raise ImportError("no plotly")

    monkeypatch.setattr(report, "figures", no_plotly)
    p, used = report.write_html(_synthetic_result(live=False), tmp_path / "plain.html")
    text = p.read_text()
    assert not used and "plotly is not installed" in text and "committed baseline file" in text


def test_report_html_with_plotly(tmp_path):
    pytest.importorskip("plotly")
    _, used = report.write_html(_synthetic_result(live=True), tmp_path / "r.html")
    assert used and "plotly" in (tmp_path / "r.html").read_text().lower()


# ----------------------------------------------------------------------------- Humming baseline driver


def test_humming_baseline_arguments(monkeypatch):
    a = W.parse_args(["--humming-dir", "/opt/h", "--json-out", "o.json"])
    assert (a.humming_dir, a.json_out, a.seed, a.warmup_ms, a.rep_ms) == ("/opt/h", "o.json", 0, 50.0, 300.0)
    assert (a.codes, a.tuning_rows, a.no_cuda_graph, a.check_rows, a.scenarios) == ("full", "all", False, 512, None)
    a = W.parse_args(["--humming-dir", "/h", "--json-out", "o", "--scenarios", "tp8-m1", "--families", "indexed",
                       "--seed", "3", "--codes", "sym7", "--tuning-rows", "matching", "--no-cuda-graph"])
    assert (a.scenarios, a.families, a.seed, a.codes, a.tuning_rows, a.no_cuda_graph) == (
        "tp8-m1", "indexed", 3, "sym7", "matching", True)
    monkeypatch.setenv("CHORD_HUMMING_DIR", "/from/env")
    assert W.parse_args(["--json-out", "o"]).humming_dir == "/from/env"
    monkeypatch.delenv("CHORD_HUMMING_DIR")
    with pytest.raises(SystemExit):
        W.parse_args(["--json-out", "o"])  # no --humming-dir
    with pytest.raises(SystemExit):
        W.parse_args(["--humming-dir", "/h"])  # no --json-out
    with pytest.raises(SystemExit):
        W.parse_args(["--humming-dir", "/h", "--json-out", "o", "--codes", "int3"])


def _fake_upstream(root: Path, version: str = HB.UPSTREAM_VERSION) -> Path:
    pkg = root / "humming"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nimport humming.ops\n")
    (pkg / "ops" / "__init__.py").write_text("")
    return root


def test_humming_baseline_refuses_dir_without_humming(tmp_path):
    with pytest.raises(W.WrongHumming, match="holds no 'humming' package"):
        W.import_upstream_humming(tmp_path)
    p = subprocess.run([sys.executable, "-m", "chord.lab.bench.humming_worker", "--humming-dir", str(tmp_path),
                        "--json-out", str(tmp_path / "o.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == HB.EXIT_WRONG_HUMMING
    assert "refusing to run" in p.stderr


def test_humming_baseline_refuses_other_humming_already_imported(tmp_path, monkeypatch):
    up = _fake_upstream(tmp_path / "up")
    shim = types.ModuleType("humming")
    shim.__file__ = str(REPO / "humming" / "__init__.py")  # Chord's shim
    monkeypatch.setitem(sys.modules, "humming", shim)
    with pytest.raises(W.WrongHumming, match="resolves to .*not to the upstream install"):
        W.import_upstream_humming(up)


def test_humming_baseline_refuses_wrong_version(tmp_path):
    up = _fake_upstream(tmp_path / "up", version="0.1.19")
    p = subprocess.run([sys.executable, "-m", "chord.lab.bench.humming_worker", "--humming-dir", str(up),
                        "--json-out", str(tmp_path / "o.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == HB.EXIT_WRONG_HUMMING
    assert "version 0.1.19" in p.stderr


def test_humming_baseline_upstream_wins_over_the_shim_on_the_path(tmp_path):
    """Run from the repo root (whose humming/ is Chord's shim) with the shim first on PYTHONPATH:
    the script still imports the upstream package from --humming-dir."""
    up = _fake_upstream(tmp_path / "up")
    code = ("import sys; from chord.lab.bench import humming_worker as W; "
            f"h = W.import_upstream_humming({str(up)!r}); print(h.__file__)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()).resolve() == (up / "humming" / "__init__.py").resolve()


def test_runner_launches_humming_with_upstream_first(tmp_path):
    opts = runner.BenchOptions(humming_dir=str(tmp_path), seed=2, quick=True, cuda_graph=False)
    cmd = runner.humming_command(opts, "tp8-m1", "indexed", tmp_path / "h.json")
    assert cmd[:4] == [sys.executable, "-P", "-m", "chord.lab.bench.humming_worker"]
    assert cmd[cmd.index("--humming-dir") + 1] == str(tmp_path)
    assert cmd[cmd.index("--seed") + 1] == "2" and "--no-cuda-graph" in cmd
    env = HB.environment(str(tmp_path))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path.resolve())


class _FakeConfig:
    b_dtype = "uint4"
    input_quant_mode = types.SimpleNamespace(should_quantize=False)

    def to_str(self):
        return "{}"


def test_humming_baseline_flow_on_a_fake(tmp_path, monkeypatch):
    """The driver (weights per deployment, vLLM's block sizes and second alignment, layouts,
    reference check, rows) with a fake Humming whose forward is chord.reference."""
    from chord import reference as R
    from chord import routing

    def fake_build(name, q, scales, *, gated, families, device):
        # w13 and w2 pick different block sizes above 100 rows: exercises the second alignment
        big = 32 if name == "w13" else 16
        tables = {f: [[0, 100, {"block_shape": [8, 128, 64]}], [100, 1 << 30, {"block_shape": [big, 128, 64]}]]
                  for f in families}
        layer = VS.HummingLayer(name, _FakeConfig(), {"weight": q, "weight_scale": scales}, None, None, tables)
        layer.q, layer.s = q, scales
        return layer

    def fake_forward(layer, inputs, outputs, locks, **kw):
        fam = json.loads(kw["compute_config"])["gemm_type"]
        assert kw["valid_shape_m"] > 0
        if fam == "indexed":
            bm = layer.block_size(fam, kw["valid_shape_m"])
            r = routing.IndexedRouting(kw["sorted_ids"], kw["expert_ids"], kw["num_tokens_padded"], bm, kw["top_k"],
                                       inputs.shape[0] * kw["top_k"])
            ref = R.indexed_gemm_ref(inputs, layer.q, layer.s, r, kw["top_k"])
        elif fam == "grouped_contiguous":
            assert kw["expert_layout"].dtype == torch.int64
            ref = R.contiguous_gemm_ref(inputs, layer.q, layer.s, kw["expert_layout"])
        else:
            assert kw["expert_layout"].dtype == torch.int32
            e = layer.q.shape[0]
            ref = R.masked_gemm_ref(inputs.view(e, -1, inputs.shape[-1]), layer.q, layer.s, kw["expert_layout"])
            ref = ref.view(-1, layer.q.shape[1])
        outputs.copy_(ref.nan_to_num(0).to(outputs.dtype))

    monkeypatch.setattr(W, "import_upstream_humming",
                        lambda *a, **k: types.SimpleNamespace(__file__="/x/humming/__init__.py", __version__="0.1.20"))
    monkeypatch.setattr(W, "assert_still_upstream", lambda d: None)
    monkeypatch.setattr(VS, "build_layer", fake_build)
    monkeypatch.setattr(VS, "_forward", fake_forward)
    monkeypatch.setattr(timing, "bench", lambda fn, **k: (fn(), timing.Timing(1.0, 2.0, 3.0, "fake"))[1])
    scen = cpu_scenarios()
    suite = {"name": "mini", "model": {"top_k": 4},
             "scenarios": [{"id": s.id, "deployment": s.deployment, "experts": s.experts, "n_gate_up": s.n_gate_up,
                            "k_gate_up": s.k_gate_up, "n_down": s.n_down, "k_down": s.k_down, "tok_e": s.tok_e,
                            "families": list(s.families)} for s in scen]}
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    args = W.parse_args(["--humming-dir", "/x", "--suite", str(tmp_path / "suite.json"), "--json-out",
                          str(tmp_path / "h.json"), "--device", "cpu", "--tuning-rows", "matching", "--chain"])
    out = W.run(args)
    rows = json.loads((tmp_path / "h.json").read_text())["rows"]
    assert rows == json.loads(json.dumps(out["rows"], default=str))
    assert not [r for r in rows if r["metric"] == "error"]
    got = {(r["scenario"], r["family"]) for r in rows if r["metric"] == "time_us"}
    assert got == {(s.id, f) for s in scen for f in s.families}
    assert all(r["check"] == "pass" and r["provider"] == "humming-0.1.20" for r in rows)
    bm = {r["scenario"]: r["block_m"] for r in rows if r["family"] == "indexed" and r["metric"] == "time_us"}
    assert bm == {"cpu-ep8-decode-tok2": [8, 8], "cpu-ep8-prefill-tok24": [32, 16]}
    # the chain (gate_up, the root's SiLU and mul, down on its output): timed and its activation checked
    chain = {(r["scenario"], r["family"]) for r in rows if r["metric"] == "chain_us"}
    assert chain == got
    errs = [r["p50"] for r in rows if r["metric"] == "rel_err_act"]
    assert len(errs) == len(got) and max(errs) < 1e-2, errs


def test_chain_table_reports_both_libraries_and_the_time_outside_the_gemms():
    from chord.lab.bench.report import chain_table, terminal_table

    base = {"scenario": "tp8-m1", "family": "indexed", "deployment": "TP8"}
    rows = [dict(base, provider="chord", metric="time_us", p50=20.0),
            dict(base, provider="humming", metric="time_us", p50=24.0),
            dict(base, provider="chord", metric="chain_us", p50=23.0),
            dict(base, provider="humming", metric="chain_us", p50=27.6),
            dict(base, provider="chord", metric="rel_err_act", p50=1e-3)]
    result = {"meta": {"humming": {"live": True}}, "rows": rows}
    table = chain_table(result)
    line = table.splitlines()[2].split()
    assert line[:7] == ["tp8-m1", "indexed", "23.0", "3.0", "27.6", "3.6", "1.20"], line
    assert "SiLU and mul" in terminal_table(result)
    assert chain_table({"meta": {}, "rows": rows[:2]}) == ""


def test_matching_rows_pick_the_same_rows_as_the_whole_table():
    table = [[0, 8, {"block_shape": [8]}], [8, 64, {"block_shape": [16]}], [64, 300, {"block_shape": [24]}],
             [300, 1 << 30, {"block_shape": [64]}]]
    layer = VS.HummingLayer("w13", _FakeConfig(), {"weight": None, "weight_scale": None}, None, None,
                            {"indexed": table})
    layer.set_needed("indexed", [48, 2000])
    sub = json.loads(layer.tuning_config("indexed", 48, "matching"))
    assert [r[2]["block_shape"][0] for r in sub] == [16, 64]
    assert sub[0][0] == 0 and sub[-1][1] == 1 << 30 and sub[0][1] == sub[1][0]
    for v in (48, 2000):
        pick = next(r for r in sub if r[0] < v <= r[1])
        assert pick[2] == layer.row_for("indexed", v)[2]
    assert layer.tuning_config("indexed", 48, "all") == json.dumps(table)
    assert layer.block_size("indexed", 48) == 16 and layer.block_size("indexed", 0) == VS.DEFAULT_BLOCK


def test_family_layouts_cover_every_route_once():
    sc = cpu_scenarios()[1]
    data = I.scenario_data(sc, 0)
    for fam in ("indexed", "grouped_contiguous", "grouped_masked"):
        fi = I.family_inputs(fam, data)
        rr = fi.row_route.reshape(-1)
        assert sorted(rr[rr >= 0].tolist()) == list(range(sc.rows))
        rows = I.rows_of_routes(fi, torch.arange(sc.rows))
        assert torch.equal(rr[rows], torch.arange(sc.rows))
    assert I.rel_err(torch.ones(3), torch.ones(3)) == 0.0
    assert I.rel_err(torch.tensor([float("nan")]), torch.ones(1)) == float("inf")


def test_speedup_summary_is_the_geomean_per_deployment():
    from chord.lab.bench.report import speedup_summary, terminal_table

    def rows(scenario, dep, chord_us, hum_us):
        base = {"scenario": scenario, "family": "indexed", "deployment": dep, "metric": "time_us"}
        return [dict(base, provider="chord", p50=chord_us), dict(base, provider="humming", p50=hum_us)]

    result = {"meta": {"humming": {"live": True}},
              "rows": rows("a", "EP8", 100.0, 120.0) + rows("b", "EP8", 100.0, 80.0) + rows("c", "EP16", 50.0, 100.0)}
    s = speedup_summary(result)
    assert s["EP8"][1:] == (2, 1) and abs(s["EP8"][0] - (1.2 * 0.8) ** 0.5) < 1e-12
    assert s["EP16"] == (2.0, 1, 1) and s["all"][1:] == (3, 2)
    assert "geomean speed-up: all" in terminal_table(result)
