"""The command line reports bad profiles, cache folders and compilers as one message and exit 2."""
from chord import cli


def run(argv, capsys):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    return rc, err


def test_precompile_unknown_profile(capsys, monkeypatch):
    monkeypatch.setenv("CHORD_PROFILE", "no-such-gpu")
    rc, err = run(["precompile", "--quiet"], capsys)
    assert rc == 2 and "profile 'no-such-gpu' not found" in err and "Traceback" not in err


def test_precompile_reads_chord_profile_and_the_flag(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{broken")
    rc, err = run(["precompile", "--quiet", "--profile", str(bad)], capsys)
    assert rc == 2 and str(bad) in err and "not valid JSON" in err


def test_precompile_unwritable_cache(capsys, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("CHORD_CACHE_DIR", str(blocker / "sub"))
    rc, err = run(["precompile", "--quiet"], capsys)
    assert rc == 2 and "CHORD_CACHE_DIR" in err


def test_precompile_missing_nvcc(capsys, monkeypatch, tmp_path):
    from chord import jit

    jit.nvcc_version.cache_clear()
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CHORD_NVCC", str(tmp_path / "no-nvcc"))
    rc, err = run(["precompile", "--quiet"], capsys)
    assert rc == 2 and "no-nvcc" in err
    jit.nvcc_version.cache_clear()


def test_tune_refuses_bad_timing_flags_before_looking_for_a_gpu(capsys):
    rc, err = run(["tune", "--warmup-ms", "-1"], capsys)
    assert rc == 2 and "warmup_ms must be a non-negative number" in err and "--warmup-ms" in err
    rc, err = run(["tune", "--rep-ms", "0"], capsys)
    assert rc == 2 and "rep_ms must be a positive number" in err and "Traceback" not in err


# ------------------------------------------------------------------ every flag checked before anything runs

import os  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import chord  # noqa: E402
from chord.lab.bench.suite import FAMILIES, load_suite  # noqa: E402

SUITE_IDS = load_suite().ids


@pytest.fixture(params=["without-cuda", "with-cuda"])
def nothing_runs(request, monkeypatch):
    """The GPU answer either way, and every command's work replaced by a failure: a check that
    lets a bad value through reaches the work and the test fails."""
    import torch

    from chord.lab.bench import host_time, layout_ablation, one_gemm, runner, timing
    from chord.lab import capture, limits, precompile, tune, variant

    has_gpu = request.param == "with-cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: has_gpu)
    monkeypatch.setattr(timing, "cuda_available", lambda: has_gpu)

    def ran(*a, **k):
        raise AssertionError("the command ran although an argument was bad")

    for mod, name in ((runner, "main"), (tune, "tune_suite"), (precompile, "build"), (precompile, "pack"),
                      (capture, "capture"), (limits, "run"), (one_gemm, "run"), (host_time, "measure"),
                      (layout_ablation, "run"), (variant, "write")):
        monkeypatch.setattr(mod, name, ran)
    for var in [k for k in os.environ if k.startswith("CHORD_") and k != "CHORD_CACHE_DIR"]:
        monkeypatch.delenv(var)
    return has_gpu


def refused(argv, capsys, *named):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    assert rc == 2, (argv, cap.out, cap.err)
    assert "Traceback" not in cap.err
    for text in named:
        assert text in cap.err, (text, cap.err)
    return cap.err


@pytest.mark.parametrize("command", ["bench", "tune", "limits", "precompile"])
def test_unknown_scenario_and_family_list_the_valid_ones(command, nothing_runs, capsys):
    err = refused([command, "--scenarios", f"{SUITE_IDS[0]},nope"], capsys, "--scenarios", "'nope'")
    assert all(i in err for i in SUITE_IDS)
    err = refused([command, "--families", "indexed,nope"], capsys, "--families", "'nope'")
    assert all(f in err for f in FAMILIES)


@pytest.mark.parametrize("command", ["bench", "tune", "limits"])
def test_unknown_suite(command, nothing_runs, capsys, tmp_path):
    refused([command, "--suite", "/missing.json"], capsys, "'/missing.json'", "kimi_k2_h200")
    broken = tmp_path / "broken.json"
    broken.write_text("{broken")
    refused([command, "--suite", str(broken)], capsys, str(broken), "not valid JSON", "kimi_k2_h200")


def test_a_selection_left_empty_is_refused(nothing_runs, capsys):
    refused(["bench", "--scenarios", "tp8-m1", "--families", "grouped_masked"], capsys, "grouped_masked",
            "these scenarios run: indexed")


@pytest.mark.parametrize("command", ["bench", "tune", "limits", "precompile"])
def test_unknown_profile_by_flag_or_environment(command, nothing_runs, capsys, monkeypatch):
    refused([command, "--profile", "nonsense"], capsys, "--profile 'nonsense'", "h200", "h200-nofold")
    monkeypatch.setenv("CHORD_PROFILE", "nonsense")
    refused([command], capsys, "CHORD_PROFILE='nonsense'", "h200")


@pytest.mark.parametrize("command", ["bench", "tune", "limits", "precompile"])
def test_unknown_policy_in_the_environment(command, nothing_runs, capsys, monkeypatch):
    monkeypatch.setenv("CHORD_POLICY", "bogus")
    refused([command], capsys, "CHORD_POLICY='bogus'", "profile", "batch_invariant", "heuristic")
    monkeypatch.setenv("CHORD_POLICY", "heuristic,-nope")
    refused([command], capsys, "CHORD_POLICY='heuristic,-nope'", "wave_aware_bn")


def test_unknown_policy_flag(nothing_runs, capsys):
    refused(["bench", "--policy", "bogus"], capsys, "--policy 'bogus'", "batch_invariant", "tok_e_block_m")
    refused(["bench", "--policy", "profile,-wave_aware_bn"], capsys, "--policy", "heuristic")


@pytest.mark.parametrize("command", ["bench", "tune", "limits", "capture"])
def test_unwritable_out(command, nothing_runs, capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    extra = ["--scenario", "tp8-m1"] if command == "capture" else []
    refused([command, *extra, "--out", str(blocker / "sub")], capsys, "--out", str(blocker), "is a file")
    refused([command, *extra, "--out", str(blocker)], capsys, "--out", "is a file, not a folder")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        refused([command, *extra, "--out", str(ro / "x")], capsys, "--out", "not writable")


def test_missing_humming_dir_by_flag_or_environment(nothing_runs, capsys, tmp_path, monkeypatch):
    refused(["bench", "--humming-dir", "/nonexistent"], capsys, "--humming-dir '/nonexistent'", "is not a folder",
            "humming-kernels==0.1.20")
    refused(["bench", "--humming-dir", str(tmp_path)], capsys, "--humming-dir", "holds no 'humming' package")
    monkeypatch.setenv("CHORD_HUMMING_DIR", "/nonexistent")
    refused(["bench"], capsys, "CHORD_HUMMING_DIR='/nonexistent'", "is not a folder")


@pytest.mark.parametrize("var,value", [("CHORD_NVTX", "maybe"), ("CHORD_TILE_GROUP", "3"),
                                       ("CHORD_PROFILE_DIR", "/nonexistent")])
def test_bad_environment_values(var, value, nothing_runs, capsys, monkeypatch):
    monkeypatch.setenv(var, value)
    for command in ("bench", "tune", "precompile"):
        refused([command], capsys, var, value)
    rc = cli.main(["info"])
    out = capsys.readouterr().out
    assert rc == 2 and "INVALID" in out and var in out


def test_tune_checks_its_arguments_before_saying_it_needs_a_gpu(nothing_runs, capsys):
    err = refused(["tune", "--scenarios", "nope"], capsys, "--scenarios", "'nope'")
    assert "GPU" not in err


def test_capture_scenario_and_family_and_iters(nothing_runs, capsys):
    refused(["capture", "--scenario", "nope"], capsys, "--scenario 'nope'", SUITE_IDS[-1])
    refused(["capture", "--scenario", "tp8-m1", "--family", "grouped_masked"], capsys, "--family", "indexed")
    refused(["capture", "--scenario", "tp8-m1", "--iters", "0"], capsys, "--iters", "positive")


def test_bench_check_rows(nothing_runs, capsys):
    refused(["bench", "--check-rows", "0"], capsys, "--check-rows", "positive")


def test_valid_arguments_reach_the_command(capsys, monkeypatch, tmp_path):
    """The checks let good values through, resolved: the default profile and policy's name."""
    from chord.lab.bench import runner

    from chord.selection import current_policy, parse_policy

    seen = {}
    monkeypatch.setattr(runner, "main", lambda opts: seen.update(opts=opts, policy=current_policy()) or 0)
    monkeypatch.setenv("CHORD_PROFILE", "h200-nofold")
    monkeypatch.setenv("CHORD_POLICY", "profile")
    assert cli.main(["bench", "--scenarios", "tp8-m1", "--families", "indexed", "--policy", "heuristic",
                     "--out", str(tmp_path / "new" / "dir")]) == 0
    assert seen["opts"].profile_file == "h200-nofold" and seen["opts"].scenarios == "tp8-m1"
    assert seen["policy"] == parse_policy("heuristic")  # every select() of the run saw --policy
    assert os.environ["CHORD_POLICY"] == "profile" and current_policy() == parse_policy("profile")  # not exported
    assert not (tmp_path / "new").exists()  # checking creates nothing


def test_version_matches_the_package(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert capsys.readouterr().out.strip() == f"chord {chord.__version__}" == f"chord {pyproject['project']['version']}"


def test_every_subcommand_has_a_summary_a_description_and_shows_defaults(capsys):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(helps) == set(sub.choices)
    for name, p in sub.choices.items():
        assert helps[name] and "\n" not in helps[name], name
        assert p.description, name
        formatter = p._get_formatter()
        for a in p._actions:
            if a.option_strings and a.default not in (None, False) and a.dest != "help":
                assert "default" in formatter._get_help_string(a).lower(), (name, a.dest)
        has_options = any(a.option_strings and a.dest != "help" for a in p._actions)
        assert "(default: " in " ".join(p.format_help().split()) or not has_options, name  # wrapped anywhere
