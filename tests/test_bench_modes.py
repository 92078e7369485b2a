"""`chord bench --gemm / --host-time / --layout-ablation` on CPU: every flag checked by name before
any GPU work, the values that reach the run, and the tools/ scripts that forward to them."""
import pytest
from conftest import cli_refused, load_tool

from chord import cli
from chord.lab.bench import host_time, layout_ablation, one_gemm


@pytest.fixture
def gpu_runs(monkeypatch):
    """A GPU answered present, and each run replaced by a recorder: {mode: (args, kwargs)}."""
    import torch

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(one_gemm, "run", lambda *a, **k: seen.setdefault("gemm", (a, k)) and [])
    monkeypatch.setattr(host_time, "measure", lambda *a, **k: seen.setdefault("host", (a, k)) and [])
    monkeypatch.setattr(layout_ablation, "run", lambda *a, **k: seen.setdefault("layout", (a, k)) and 0)
    for var in ("CHORD_PROFILE", "CHORD_POLICY", "CHORD_HUMMING_DIR"):
        monkeypatch.delenv(var, raising=False)
    return seen


_refused = cli_refused


def test_gemm_reaches_the_run_with_its_scenario_family_and_schedules(gpu_runs, tmp_path):
    assert cli.main(["bench", "--scenarios", "ep8-prefill-tok512", "--families", "grouped_contiguous", "--gemm",
                     "down", "--schedule", "gcon-m128n256k64-w16-s5-c1-wgmma", "--rep-ms", "20",
                     "--out", str(tmp_path)]) == 0
    a, k = gpu_runs["gemm"]
    assert a == ("ep8-prefill-tok512", "grouped_contiguous", "down", ["gcon-m128n256k64-w16-s5-c1-wgmma"])
    assert k["profile"] == "h200" and k["rep_ms"] == 20.0 and k["warmup_ms"] is None
    gpu_runs.clear()
    assert cli.main(["bench", "--scenarios", "tp8-m1", "--gemm", "gate_up", "--out", str(tmp_path)]) == 0
    a, k = gpu_runs["gemm"]
    assert a == ("tp8-m1", "indexed", "gate_up", ()) and k["rep_ms"] == 50.0  # the scenario's first family


def test_gemm_flags_are_refused_by_name(gpu_runs, capsys):
    _refused(["bench", "--gemm", "gate_up"], capsys, "--gemm", "--scenarios must name exactly one")
    _refused(["bench", "--gemm", "gate_up", "--scenarios", "tp8-m1,tp8-m16"], capsys, "exactly one")
    _refused(["bench", "--gemm", "gate_up", "--scenarios", "tp8-m1", "--families", "grouped_masked"], capsys,
             "--families", "indexed")
    _refused(["bench", "--gemm", "gate_up", "--scenarios", "ep8-decode-tok4", "--families",
              "indexed,grouped_masked"], capsys, "--families must name one")
    _refused(["bench", "--gemm", "gate_up", "--scenarios", "tp8-m1", "--schedule", "nonsense"], capsys,
             "--schedule 'nonsense'")
    _refused(["bench", "--gemm", "gate_up", "--scenarios", "tp8-m1", "--schedule", "gmsk-m8n256k64-w4-s8-c1"],
             capsys, "--schedule", "for family grouped_masked, not indexed")
    _refused(["bench", "--gemm", "down", "--scenarios", "tp8-m1", "--schedule", "idx-m16n768k64-w4-s4-c1"], capsys,
             "--schedule", "does not divide N")
    _refused(["bench", "--gemm", "gate_up", "--scenarios", "tp8-m1", "--rep-ms", "0"], capsys, "--rep-ms")
    with pytest.raises(SystemExit) as info:  # argparse's own refusal of a choice
        cli.main(["bench", "--gemm", "sideways"])
    assert info.value.code == 2 and "argument --gemm: invalid choice: 'sideways'" in capsys.readouterr().err
    _refused(["bench", "--gemm", "gate_up", "--scenarios", "tp8-m1", "--humming-dir", "/x"], capsys,
             "--humming-dir applies")
    assert not gpu_runs


def test_flags_of_one_run_are_refused_in_another(gpu_runs, capsys):
    _refused(["bench", "--schedule", "idx-m16n128k64-w4-s4-c1"], capsys, "--schedule applies with --gemm only")
    _refused(["bench", "--rep-ms", "10"], capsys, "--rep-ms applies with --gemm or --layout-ablation only")
    _refused(["bench", "--calls", "10"], capsys, "--calls applies with --host-time only")
    _refused(["bench", "--parts"], capsys, "--parts applies with --host-time only")
    _refused(["bench", "--repeats", "3"], capsys, "--repeats applies with --layout-ablation only")
    _refused(["bench", "--host-time", "--gemm", "down", "--scenarios", "tp8-m1"], capsys,
             "--gemm and --host-time are different runs")
    _refused(["bench", "--host-time", "--schedule", "idx-m16n128k64-w4-s4-c1"], capsys, "--schedule")
    assert not gpu_runs


def test_host_time_defaults_and_checks(gpu_runs, capsys, monkeypatch, tmp_path):
    """The scenario tp8-m1 and the library's default profile ($CHORD_PROFILE, else h200), which the
    run sees as CHORD_PROFILE too (Chord's humming root decides with it)."""
    import shutil

    from chord import _env
    from chord._resources import profiles_dir

    monkeypatch.setattr(host_time, "measure",
                        lambda *a, **k: gpu_runs.setdefault("host", (a, k, _env.get("CHORD_PROFILE"))) and [])
    assert cli.main(["bench", "--host-time", "--out", str(tmp_path)]) == 0
    a, k, env_profile = gpu_runs.pop("host")
    assert a == ("tp8-m1",) and k["profile"] == env_profile == "h200" and k["calls"] == 2000
    assert not k["parts"] and not k["cprofile"] and k["humming_dir"] is None
    shutil.copy(profiles_dir() / "h200.json", tmp_path / "mygpu.json")
    monkeypatch.setenv("CHORD_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("CHORD_PROFILE", "mygpu")
    assert cli.main(["bench", "--host-time", "--scenarios", "tp8-m16", "--calls", "10", "--parts",
                     "--out", str(tmp_path)]) == 0
    a, k, env_profile = gpu_runs.pop("host")
    assert a == ("tp8-m16",) and k["profile"] == env_profile == "mygpu" and k["calls"] == 10 and k["parts"]
    _refused(["bench", "--host-time", "--profile", "no-such-gpu"], capsys, "--profile 'no-such-gpu'")
    _refused(["bench", "--host-time", "--calls", "0"], capsys, "--calls", "positive")
    _refused(["bench", "--host-time", "--scenarios", "ep8-decode-tok4", "--families", "grouped_masked"], capsys,
             "--families", "indexed")
    _refused(["bench", "--host-time", "--humming-dir", str(tmp_path)], capsys, "--humming-dir",
             "holds no 'humming' package")
    assert not gpu_runs


def test_layout_ablation_reaches_the_run(gpu_runs, capsys, tmp_path):
    assert cli.main(["bench", "--layout-ablation", "--repeats", "3", "--out", str(tmp_path)]) == 0
    _, k = gpu_runs.pop("layout")
    assert k["repeats"] == 3 and k["rep_ms"] == 30.0 and k["out_file"] == tmp_path / "layout.json"
    _refused(["bench", "--layout-ablation", "--scenarios", "tp8-m1"], capsys, "leave out --suite, --scenarios")
    _refused(["bench", "--layout-ablation", "--repeats", "0"], capsys, "--repeats", "positive")
    assert not gpu_runs


def test_without_a_gpu_each_run_says_so_after_its_checks(monkeypatch, capsys, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "--gemm", "gate_up", "--scenarios", "tp8-m1", "--out", str(tmp_path)]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().out


def test_the_layout_table_pairs_the_two_layouts():
    rows = [{"repeat": 0, "scenario": "s", "family": "indexed", "gemm": "down", "schedule": "idx", "tile_group": g,
             "us": us, "same_bits": 1} for g, us in ((8, 10.0), (1, 12.0))]
    lines = layout_ablation.table(rows, [("s", "indexed", "down")])
    assert "G=8" in lines[0] and "OUTPUT DIFFERS" not in "".join(lines)
    assert lines[-1].split()[-3:] == ["10.0", "12.0", "1.200"]
    rows[1]["same_bits"] = 0
    assert "OUTPUT DIFFERS FROM G=8" in layout_ablation.table(rows, [("s", "indexed", "down")])[1]


def test_tools_forward_to_chord_bench(gpu_runs, tmp_path):
    og = load_tool("one_gemm")
    assert og.translate(["--scenario", "tp8-m1", "--gemm", "down", "--schedule", "a", "--schedule", "b",
                         "--rep-ms", "40"]) == ["bench", "--scenarios", "tp8-m1", "--gemm", "down", "--schedule", "a",
                                                "--schedule", "b", "--rep-ms", "40"]
    assert og.main(["--scenario", "tp8-m1", "--family", "indexed"]) == 0
    assert gpu_runs.pop("gemm")[0] == ("tp8-m1", "indexed", "gate_up", ())
    ht = load_tool("host_time")
    assert ht.translate([]) == ["bench", "--host-time"]
    assert ht.translate(["--scenario", "tp8-m16", "--calls", "5", "--profile", "h200", "--parts", "--cprofile"]) == [
        "bench", "--host-time", "--scenarios", "tp8-m16", "--calls", "5", "--profile", "h200", "--cprofile", "--parts"]
    assert ht.main(["--calls", "7"]) == 0 and gpu_runs.pop("host")[1]["calls"] == 7
    la = load_tool("layout_ablation")
    assert la.translate(["--repeats", "1", "--out", "x.json"]) == (["bench", "--layout-ablation", "--repeats", "1"],
                                                                   "x.json")
    assert la.main(["--repeats", "1"]) == 0 and gpu_runs.pop("layout")[1]["repeats"] == 1
