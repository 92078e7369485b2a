"""chord.lab.workbench without a GPU: decision rows, figures from rows and results, the tok_e widget."""
import pytest

from chord.schedule import Problem, profile_for, select
from chord.lab.workbench import decision_row, gpu_available, recorded_results, sweep_tok_e, where_results_come_from
from chord.lab.workbench import figures as F

GRID = (1, 4, 12, 32, 64, 128, 512)


def test_decision_row_is_the_select_of_serving():
    for tok_e in GRID:
        r = decision_row("ep8", "indexed", "gate_up", tok_e)
        want = select(profile_for("indexed", 48, 4096, 7168), Problem("indexed", 48, 4096, 7168, 48 * tok_e, 8))
        assert r["schedule"] == want.id and r["block_m"] == want.block_m
        assert 0 <= r["padding"] < 1 and 0 < r["wave_efficiency"] <= 1 and r["tiles"] > 0


def test_tile_arithmetic_by_hand():
    r = decision_row("ep8", "grouped_contiguous", "gate_up", 512)
    # 48 experts x ceil(512 / block_m) token tiles x 4096 / block_n N blocks
    assert r["tiles"] == 48 * (512 // r["block_m"]) * (4096 // r["block_n"]) * r["split_k"]
    assert r["padding"] == 0.0
    r = decision_row("ep8", "indexed", "gate_up", 12)
    assert r["padding"] == pytest.approx(1 - 12 / r["block_m"])


def test_bad_deployment_and_gemm():
    with pytest.raises(ValueError, match="deployment"):
        decision_row("ep4", "indexed", "gate_up", 1)
    with pytest.raises(ValueError, match="gemm"):
        decision_row("ep8", "indexed", "up", 1)


def test_sweep_figure_and_decision_html():
    rows = sweep_tok_e("ep8", "indexed", "down", GRID)
    fig = F.sweep_figure(rows, marker=rows[-1])
    names = [t.name for t in fig.data]
    assert names == ["block_m", "padding %", "wave efficiency %", "wgmma main loop", "selected"]
    assert list(fig.data[0].y) == [r["block_m"] for r in rows]
    assert list(fig.data[-1].x) == [512]
    band = fig.data[3]
    assert (min(band.x), max(band.x)) == (min(r["tok_e"] for r in rows if r["mainloop"] == "wgmma"), 512)
    html = F.decision_html(rows[0])
    assert rows[0]["schedule"] in html and "rows/expert" in html


def test_recorded_results_and_figures():
    res = recorded_results()
    assert res["meta"]["gpu"] == "NVIDIA H200" and res["rows"]
    assert "recorded" in where_results_come_from(res)
    t, p = F.suite_figures(res)
    assert len(t.data) >= 2 and len(p.data) >= 1
    sp = F.speedup_figure(res)
    assert len(sp.data[0].x) == len(sp.data[0].y) > 10
    with pytest.raises(FileNotFoundError):
        recorded_results("no-such-run")


def test_gpu_predicate_is_false_here():
    import torch

    assert gpu_available() == (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0))


def test_tok_e_explorer_updates_decision_and_figure():
    from chord.lab.workbench.widgets import tok_e_explorer

    box, st = tok_e_explorer("ep8", "indexed", "gate_up", 64)
    before_html, before_x = st.html.value, tuple(st.figure.data[-1].x)
    st.slider.value = 512
    assert st.html.value != before_html and tuple(st.figure.data[-1].x) == (512,) != before_x
    assert st.row()["schedule"] in st.html.value
    assert st.figure.data[-1].y[0] == st.row()["block_m"]


def test_recorded_tuning_and_best_by():
    from chord.lab.workbench import best_by, recorded_tuning

    pts = recorded_tuning()
    assert pts and all("timings" in p for p in pts)
    rows = best_by(pts, {"mma": lambda s: s.mainloop == "mma", "wgmma": lambda s: s.mainloop == "wgmma"})
    tok512 = [r for r in rows if r["scenario"] == "ep8-prefill-tok512"]
    assert tok512 and all(r["wgmma_us"] < r["mma_us"] for r in tok512)  # what the profile relies on
    dec = [r for r in rows if r["scenario"] == "ep8-decode-tok1"]
    assert dec and all(r["wgmma_us"] is None and r["wgmma_schedule"] is None for r in dec)
    fig = F.ablation_figure(rows, ["mma", "wgmma"], "t")
    assert [t.name for t in fig.data] == ["mma", "wgmma"] and len(fig.data[0].x) == len(rows)
    with pytest.raises(FileNotFoundError):
        recorded_tuning("nope")


def test_time_schedules_checks_its_arguments():
    from chord.lab import tune

    with pytest.raises(ValueError, match="at least one"):
        tune.time_schedules("ep8-prefill-tok64", "indexed", "gate_up", [])
    with pytest.raises(ValueError, match="gemm"):
        tune.time_schedules("ep8-prefill-tok64", "indexed", "up", ["idx-m64n128k64-w4-s4-c1"])
    with pytest.raises(ValueError, match="families"):
        tune.time_schedules("ep8-prefill-tok64", "grouped_masked", "gate_up", ["gmsk-m64n128k64-w4-s4-c1"])


def test_tile_count_and_waves():
    from chord.lab.workbench.explore import tile_count, waves

    assert tile_count(48, 512, 128, 4096, 256) == 48 * 4 * 16
    assert tile_count(48, 0, 128, 4096, 256) == 0
    assert tile_count(384, 8 / 384, 8, 512, 64, split_k=8) == 8 * 1 * 8 * 8  # one TP8 token: 8 experts
    assert waves(3072) == (24, pytest.approx(3072 / 132 - 23))
    assert waves(132) == (1, 1.0) and waves(0) == (0, 0.0) and waves(264, ctas_per_sm=2) == (1, 1.0)


# ---- measured ablations, notebook tables, the live comparison (CPU parts) -------------------

def test_ablation_variants_and_measure(monkeypatch):
    from chord.lab import tune
    from chord.lab.workbench import ablate

    points = [("ep8-decode-tok1", "indexed", "gate_up"), ("tp8-m256", "indexed", "down")]
    variants = {"profile": ablate.policy("profile"), "heuristic": ablate.policy("heuristic"),
                "n_tiles off": ablate.knob_off("multi-tile CTAs")}
    rows = ablate.schedules(points, variants)
    by = {(r["scenario"], r["variant"]): r["schedule"] for r in rows}
    assert by[("ep8-decode-tok1", "n_tiles off")] is None  # that schedule has one tile per CTA
    assert by[("tp8-m256", "n_tiles off")].endswith("-c1") or "-nt" not in by[("tp8-m256", "n_tiles off")]
    calls = []

    def fake(scenario, family, gemm, ids, rep_ms=20.0):
        calls.append((scenario, tuple(ids)))
        assert len(set(ids)) == len(ids), "each distinct schedule is timed once"
        return [{"schedule": sid, "us": 100.0 + i, "same_bits": i == 0, "rel_err": 0.0 if i == 0 else 1e-3}
                for i, sid in enumerate(ids)]

    monkeypatch.setattr(tune, "time_schedules", fake)
    got = ablate.measure(points, variants)
    assert len(calls) == 2 and len(got) == 5  # the decode point has no n_tiles variant
    first = next(r for r in got if r["scenario"] == "tp8-m256" and r["variant"] == "profile")
    assert first["us"] == 100.0 and first["same_bits_as_first"] and first["TFLOP_per_s"] > 0
    text = ablate.table(got, ["profile", "heuristic", "n_tiles off"])
    assert "tp8-m256" in text and "1.0" in text
    fr = ablate.figure_rows(got, ["profile", "n_tiles off"])
    assert fr[0]["n_tiles off_us"] is None and fr[1]["n_tiles off_us"] > 0


def test_notebook_tables_round_trip(tmp_path, monkeypatch):
    from chord.lab.workbench import data

    rows = [{"scenario": "x", "us": 12.5, "same": True, "n": 3, "schedule": "idx-m8n128k64-w4-s8-c1"},
            {"scenario": "y", "us": 7.0, "same": False, "n": 4, "schedule": None}]
    assert data.save_table("t", rows, "what") is None  # no folder given, none in the environment
    path = data.save_table("t", rows, "a test table", out_dir=tmp_path)
    assert path.read_text().startswith("# ") and "a test table" in path.read_text().splitlines()[0]
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    back, where = data.recorded_table("t")
    assert back == rows and "recorded:" in where and "chord/data/notebooks/t.csv" in where
    with pytest.raises(FileNotFoundError, match="no committed notebook table"):
        data.recorded_table("missing")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="first line"):
        data.recorded_table("bad")
    monkeypatch.setattr(data, "gpu_available", lambda: False)
    assert data.live_or_recorded("t", lambda: 1 / 0, "w")[0] == rows  # no GPU: never measures


def test_comparison_without_a_gpu_is_the_recorded_cell():
    from chord.lab.workbench import compare

    result, where = compare.compare("ep8-decode-tok4", "grouped_masked")
    assert "recorded" in where and result["rows"]
    assert {r["scenario"] for r in result["rows"]} == {"ep8-decode-tok4"}
    assert {r["family"] for r in result["rows"]} == {"grouped_masked"}
    assert {r["provider"] for r in result["rows"]} >= {"chord"}
    with pytest.raises(ValueError, match="scenario"):
        compare.compare("no-such-scenario", "indexed")
    with pytest.raises(ValueError, match="runs families"):
        compare.compare("ep8-decode-tok4", "grouped_contiguous")


def test_ablation_variants_refuse_bad_names_at_once():
    from chord.lab.workbench import ablate

    with pytest.raises(ValueError, match="ablate.knob_off: name must be an implemented knob"):
        ablate.knob_off("no such optimization")
    with pytest.raises(ValueError, match="implemented knob"):
        ablate.knob_off("wave-aware BN")  # a policy rule: switched off with ablate.policy("heuristic,-...")
    with pytest.raises(ValueError, match="unknown rules"):
        ablate.policy("heuristic,-nope")
    with pytest.raises(ValueError, match="ablate.rule_variants: rule must be one of"):
        ablate.rule_variants("wave-aware BN", "off")  # the optimization's name, not its rule


def test_rule_variants_are_heuristic_rule_off_and_profile():
    from chord.schedule import Problem, select
    from chord.lab.workbench import ablate

    labels, variants = ablate.rule_variants("touched_estimate", "balanced")
    assert labels == ["heuristic", "balanced", "profile"] and list(variants) == labels
    p = Problem("indexed", 384, 512, 7168, 64 * 8, 8)
    prof = "h200:tp8"
    assert variants["heuristic"](prof, p) == select(prof, p, "heuristic")
    assert variants["balanced"](prof, p) == select(prof, p, "heuristic,-touched_estimate")
    assert variants["profile"](prof, p) == select(prof, p, "profile")


def test_ablate_refuses_a_mistyped_gemm_or_family():
    """A gemm name other than gate_up/down used to be taken as down, silently."""
    from chord.lab.workbench import ablate

    with pytest.raises(ValueError, match="gemm must be 'gate_up' or 'down', got 'gateup'"):
        ablate.schedules([("tp8-m64", "indexed", "gateup")], {"profile": ablate.policy("profile")})
    with pytest.raises(ValueError, match="scenario tp8-m64 runs families"):
        ablate.schedules([("tp8-m64", "grouped_contiguous", "down")], {"profile": ablate.policy("profile")})


def test_recorded_ablation_names_rows_measured_with_other_decisions(tmp_path, monkeypatch, capsys):
    """A committed table measured before a rule or the profile changed is shown, labelled stale
    row by row; one that matches today's decisions is not."""
    from chord.lab.workbench import ablate, data

    points = [("tp8-m1024", "indexed", "gate_up")]
    labels, variants = ablate.rule_variants("wide_warp_tiles", "wide tiles off")
    now = ablate.schedules(points, variants)
    rows = [{**r, "us": 100.0, "TFLOP_per_s": 1.0, "same_bits_as_first": True, "rel_err_vs_first": 0.0} for r in now]
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    monkeypatch.setattr(data, "gpu_available", lambda: False)
    data.save_table("fresh", rows, "today's decisions", out_dir=tmp_path)
    assert ablate.stale_rows(rows, points, variants) == []
    assert "other decisions" not in ablate.ablation("fresh", points, variants, "w")[1]
    old = [dict(r, schedule="idx-m32n128k64-w8-s8-c1-wgmma") if r["variant"] == "profile" else r for r in rows]
    data.save_table("old", old, "before the profile changed", out_dir=tmp_path)
    stale = ablate.stale_rows(old, points, variants)
    assert [(r["variant"], r["recorded"]) for r in stale] == [("profile", "idx-m32n128k64-w8-s8-c1-wgmma")]
    got, lab = ablate.rule_ablation("old", "wide_warp_tiles", "wide tiles off", points, "w")
    assert lab == labels and got == old
    out = capsys.readouterr().out
    assert "recorded with other decisions than today's for: tp8-m1024 indexed gate_up profile" in out


def test_recorded_timing_and_knob_pairs():
    """The committed A/B files read as rows with their run, and pair by one knob within a run."""
    from chord.lab.workbench import knob_pairs, recorded_timing

    rows = recorded_timing("2026-12-01-h200-timing-6d111f6-epilogue-tiles")
    assert rows and all({"run", "file", "schedule", "us"} <= set(r) for r in rows)
    pairs = knob_pairs(rows, "stmatrix", 0, "on", "off")
    assert pairs and all(p["on_schedule"] + "-stm0" == p["off_schedule"] for p in pairs)
    assert all(p["on_us"] > 0 and p["off_us"] > 0 for p in pairs)
    runs = {r["run"] for r in rows}
    assert all(p["run"] in runs for p in pairs)
    with pytest.raises(FileNotFoundError):
        recorded_timing("nope")
    with pytest.raises(ValueError, match="not an A/B timing file"):
        recorded_timing("2026-12-03-h200-9ad84e0")  # the shipped suite run


# ---- pair ablations (notebook 06: programmatic dependent launch)

def test_pair_schedules_set_the_variant_knobs_on_both_gemms():
    from chord.lab.workbench import ablate

    rows = ablate.pair_schedules([("tp8-m1", "indexed")], {"profile": {}, "pdl on": {"pdl": 1}})
    base, on = rows
    assert (base["variant"], on["variant"]) == ("profile", "pdl on")
    assert on["gate_up"] == base["gate_up"] + "-pd1" and on["down"] == base["down"] + "-pd1"
    with pytest.raises(ValueError, match="runs families"):
        ablate.pair_schedules([("tp8-m1", "grouped_masked")], {"profile": {}})


def test_pair_ablation_without_gpu_or_table_says_it_was_not_measured(monkeypatch):
    from chord.lab.workbench import ablate, data

    monkeypatch.setattr(data, "gpu_available", lambda: False)
    rows, where = ablate.pair_ablation("no_such_table", [("tp8-m1", "indexed")], {"profile": {}}, "x")
    assert rows == [] and where.startswith("not measured on an H200 yet")


def test_pair_table_relative_times_and_bit_flags():
    from chord.lab.workbench import ablate

    rows = [{"scenario": "tp8-m1", "family": "indexed", "variant": "profile", "graph_us": 20.0, "eager_us": 30.0,
             "same_bits_as_first": True},
            {"scenario": "tp8-m1", "family": "indexed", "variant": "pdl on", "graph_us": 18.0, "eager_us": 30.0,
             "same_bits_as_first": False}]
    line = ablate.pair_table(rows, ["profile", "pdl on"])
    assert "profile: 20.0 / 30.0 us" in line and "-10.0% graph" in line and "+0.0% eager" in line
    assert line.endswith("DIFFERENT BITS")


# ---- text a reader can read: whole ids, HTML tables in a notebook, provenance of captures

LONG_ID = "gcon-m256n128k64-w8-s4-c1-wgmma-r2-tx1-cn2"


def test_tables_never_cut_a_value_and_do_not_wrap_in_html(capsys):
    from chord.lab.workbench import tables

    header, body = tables.rows_table([{"scenario": "ep8-prefill-tok512", "family": "grouped_contiguous",
                                       "schedule": LONG_ID, "us": 3216.71}])
    text = tables.text(header, body, ["title"])
    assert LONG_ID in text and "grouped_contiguous" in text and "3216.7" in text and text.startswith("title")
    page = tables.html_table(header, body)
    assert LONG_ID in page and "white-space:nowrap" in page and "overflow-x:auto" in page
    assert not tables.in_notebook()  # a test is no Jupyter kernel: the text is printed
    tables.show(header, body)
    assert LONG_ID in capsys.readouterr().out


def test_ablation_table_keeps_ids_and_labels_whole():
    from chord.lab.workbench import ablate

    rows = [{"scenario": "ep8-prefill-tok512", "family": "grouped_contiguous", "gemm": "gate_up", "variant": v,
             "schedule": LONG_ID + ("" if v == "profile" else "-x"), "us": us}
            for v, us in (("profile", 100.0), ("tok_e rule off under heuristic", 125.0))]
    text = ablate.table(rows, ["profile", "tok_e rule off under heuristic"])
    assert LONG_ID in text and LONG_ID + "-x" in text and "grouped_contiguous" in text
    assert "tok_e rule off under heuristic / profile" in text and "1.25" in text


def test_humming_line_says_live_only_of_live_data():
    from chord.lab.bench import report

    live = {"meta": {"humming": {"live": True}}}
    recorded = {"meta": {"humming": {"live": True}, "file": "x.json"}}
    committed = {"meta": {"humming": {"live": False}}}
    assert "in this run" in report.humming_line(live)
    assert "recorded run" in report.humming_line(recorded) and "live" not in report.humming_line(recorded)
    assert "NOT run" in report.humming_line(committed)


def test_a_recorded_capture_says_when_and_what_and_is_flagged_when_today_differs(monkeypatch):
    from chord.lab.workbench import captures

    cap, where = captures.capture_or_recorded("ep8-prefill-tok128", "indexed")
    assert cap["recorded"]["commit"] in where and cap["recorded"]["date"] in where
    assert all(sid in where for sid in cap["schedules"].values())
    today = captures.todays_schedules("ep8-prefill-tok128", "indexed")
    stale = captures.stale_schedules(cap)
    assert set(stale) == {g for g in today if today[g] != cap["schedules"][g]}
    assert ("recorded under another decision" in where) == bool(stale)
    same = dict(cap, schedules=dict(today))
    assert captures.stale_schedules(same) == {}
    monkeypatch.setattr(captures, "recorded_capture", lambda s, f: dict(same, file=cap["file"]))
    _, where_today = captures.capture_or_recorded("ep8-prefill-tok128", "indexed")
    assert "another decision" not in where_today


def test_the_comparison_cell_does_not_repeat_the_suite_provenance_line(capsys):
    from chord.lab.workbench import compare, where_results_come_from, recorded_results

    compare.show_comparison("tp8-m1", "indexed")
    out = capsys.readouterr().out
    assert where_results_come_from(recorded_results()) not in out
    assert out.count("recorded:") == 1 and "tp8-m1 indexed row" in out and "idx-m8n64k64-w4-s8-c1-sk8" in out


def test_a_recorded_bench_table_says_whether_its_schedules_are_todays(capsys):
    from chord.lab.workbench import recorded_results, tables

    rec = recorded_results()
    assert tables.decisions_since(dict(rec, meta={k: v for k, v in rec["meta"].items() if k != "file"})) == []
    first = next(r for r in rec["rows"] if r["provider"] == "chord" and r["metric"] == "time_us")
    changed = [dict(r, schedule_gate_up="idx-m8n64k64-w4-s8-c1") if r is first else r for r in rec["rows"]]
    diffs = tables.decisions_since(dict(rec, rows=changed))
    assert any(d.startswith(f"{first['scenario']} {first['family']}: gate_up idx-m8n64k64-w4-s8-c1 -> ") for d in diffs)
    tables.show_bench(dict(rec, rows=changed))
    assert "recorded under other decisions than today's" in capsys.readouterr().out
