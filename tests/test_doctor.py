"""`chord doctor`: one PASS / FAIL / SKIP line per check, exit 1 on a failure; on a machine
without a GPU the forward runs on the float32 reference path and the kernel lines say SKIP."""
import io

import pytest
import torch

from chord import cli
from chord.lab import doctor


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    import os

    for var in [k for k in os.environ if k.startswith("CHORD_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU answer on any machine
    return tmp_path


def run():
    out = io.StringIO()
    rc = doctor.main(out)
    lines = out.getvalue().splitlines()
    by = {}
    for line in lines[:-1]:
        status, name = line[:4], line[6:21].strip()
        by[name] = (status, line)
    return rc, by, lines[-1]


def test_without_a_gpu_everything_passes_or_says_why_it_is_skipped(clean_env):
    rc, by, last = run()
    assert rc == 0
    assert by["chord"][0] == "INFO"
    for name in ("environment", "humming", "kernel cache", "profile", "forward"):
        assert by[name][0] == "PASS", by[name]
    assert by["GPU"][0] == "SKIP" and "no CUDA GPU found" in by["GPU"][1] and "cannot serve" in by["GPU"][1]
    assert by["forward"][1].count("float32 reference path") == 1
    assert by["forward kernels"][0] == "SKIP"
    assert "cannot serve on this machine" in last and "FAIL 0" in last
    assert by["kernel cache"][1].count("0 kernels") == 1


def test_the_cli_runs_it(clean_env, capsys):
    assert cli.main(["doctor"]) == 0
    assert "PASS  humming" in capsys.readouterr().out


def test_a_bad_environment_value_fails_and_exits_1(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("CHORD_POLICY", "bogus")
    rc, by, last = run()
    assert rc == 1 and by["environment"][0] == "FAIL" and "CHORD_POLICY='bogus'" in by["environment"][1]
    assert "fix the FAIL lines" in last
    assert cli.main(["doctor"]) == 1  # reported, not refused: every line still prints
    assert "SKIP  GPU" in capsys.readouterr().out


def test_unwritable_cache(clean_env, monkeypatch):
    blocker = clean_env / "file"
    blocker.write_text("x")
    monkeypatch.setenv("CHORD_CACHE_DIR", str(blocker / "sub"))
    rc, by, _ = run()
    assert rc == 1 and by["kernel cache"][0] == "FAIL" and "not writable" in by["kernel cache"][1]


def test_counts_the_cached_kernels(clean_env):
    cubins = clean_env / "cache" / "cubin"
    cubins.mkdir(parents=True)
    for i in range(3):
        (cubins / f"k{i}.cubin").write_bytes(b"")
    _, by, _ = run()
    assert "3 kernels" in by["kernel cache"][1]


def test_upstream_humming_installed_beside_it_fails(clean_env, monkeypatch):
    import importlib.metadata as md

    real = md.version
    monkeypatch.setattr(md, "version", lambda name: "0.1.20" if name == "humming-kernels" else real(name))
    rc, by, _ = run()
    assert rc == 1 and by["humming"][0] == "FAIL" and "humming-kernels 0.1.20" in by["humming"][1]


def test_nvcc_missing_or_old(clean_env, monkeypatch):
    from chord import jit

    monkeypatch.setenv("CHORD_NVCC", str(clean_env / "no-nvcc"))
    jit.nvcc_version.cache_clear()
    try:
        assert doctor.check_nvcc(has_gpu=False).status == "SKIP"
        missing = doctor.check_nvcc(has_gpu=True)
        assert missing.status == "FAIL" and "no-nvcc" in missing.detail
    finally:
        jit.nvcc_version.cache_clear()
    monkeypatch.setattr(jit, "nvcc_path", lambda: "/x/nvcc")
    monkeypatch.setattr(jit, "nvcc_version", lambda p: "Cuda compilation tools, release 12.1, V12.1.105")
    old = doctor.check_nvcc(has_gpu=True)
    assert old.status == "FAIL" and "12.3" in old.detail
    monkeypatch.setattr(jit, "nvcc_version", lambda p: "Build cuda_13.0.r13.0/compiler.36424714_0")
    assert doctor.check_nvcc(has_gpu=True).status == "PASS"


def test_a_gpu_that_is_not_sm90_fails_and_skips_the_forward(clean_env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(doctor, "_forward_error", lambda dev: pytest.fail("the forward ran on a non-sm_90 GPU"))
    rc, by, _ = run()
    assert rc == 1 and by["GPU"][0] == "FAIL" and "sm_80" in by["GPU"][1] and by["forward"][0] == "SKIP"


def test_a_wrong_forward_fails(clean_env, monkeypatch):
    """The reference path's answer is compared with float32 computed from the codes: a wrong GEMM
    (here every output row of the reference zeroed) is a FAIL."""
    from humming import _reference

    real = _reference.reference_contiguous
    monkeypatch.setattr(_reference, "reference_contiguous", lambda *a: real(*a) * 0)
    rc, by, _ = run()
    assert rc == 1 and by["forward"][0] == "FAIL" and "relative error 1.0e+00" in by["forward"][1]


def test_a_forward_that_raises_is_a_fail_not_a_traceback(clean_env, monkeypatch):
    def boom(device):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(doctor, "_forward_error", boom)
    rc, by, _ = run()
    assert rc == 1 and by["forward"][0] == "FAIL" and "RuntimeError: launch failed" in by["forward"][1]
