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
