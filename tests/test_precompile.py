"""`chord precompile` on CPU: what it collects for a GPU machine's kernel cache, its flags (checked
before anything is built), the packing, and tools/device_cache.py forwarding to it."""
import tarfile

import pytest
from conftest import cli_refused, load_tool

from chord import cli
from chord.lab import precompile


@pytest.fixture(scope="module")
def collected():
    return precompile.collect("h200", tests=True)


def test_collects_the_profile_every_policy_and_the_gpu_tests(collected):
    import sys

    from chord import optimizations
    from chord.lab.bench.suite import load_suite
    from chord.schedule import POLICY_RULES, load_profile_file, select
    from chord.testing import profile_rule_schedules

    assert {s.id for s in load_profile_file("h200").all_schedules()} <= set(collected)
    for s in profile_rule_schedules(precompile.TEST_NS):
        assert s.id in collected
        assert all(off.id in collected for off in optimizations.ablations(s).values())
    sc = load_suite().scenario("tp8-m64")
    _, _, prob = sc.gemm_problem("indexed", "gate_up")
    for pol in ["heuristic", "batch_invariant", *(f"heuristic,-{r}" for r in POLICY_RULES)]:
        assert select("h200:tp8", prob, pol).id in collected, pol
    sys.path.insert(0, str(precompile.CHECKOUT / "tests" / "gpu"))
    try:
        from test_fuzz_gpu import fuzz_pool
    finally:
        sys.path.pop(0)
    assert {s.id for s in fuzz_pool("grouped_masked")} <= set(collected)
    assert "gmsk-m8n256k64-w4-s8-c1" in collected  # the decode profile's masked gate_up


def test_collects_the_schedules_of_the_notebook_tables(collected):
    import csv

    from chord.lab.workbench.data import DATA_DIR

    named = set()
    for f in DATA_DIR.glob("*.csv"):
        rows = (line for line in f.read_text().splitlines() if not line.startswith("#"))
        named |= {r["schedule"] for r in csv.DictReader(rows) if r.get("schedule")}
    assert named and named <= set(collected)


def test_each_option_widens_the_set(collected):
    from chord.lab import tune
    from chord.schedule import load_profile_file

    plain = precompile.collect("h200")
    assert set(plain) == {s.id for s in load_profile_file("h200").all_schedules()}
    wide = precompile.collect("h200", ablations=True)
    assert set(plain) < set(wide) < set(collected)
    cands = tune.tune_schedules(None, "tp8-m1", max_candidates=24)
    assert {s.id for s in cands} <= set(precompile.collect("h200", tune=cands))


def test_tests_need_a_checkout(tmp_path):
    assert precompile.checkout_missing() is None  # this one is
    why = precompile.checkout_missing(tmp_path)
    assert "tests/gpu" in why and "tools" in why
    with pytest.raises(FileNotFoundError, match="source checkout"):
        precompile.collect("h200", tests=True, root=tmp_path)


def test_pack_takes_the_cubins_with_their_logs_and_digests(tmp_path):
    d = tmp_path / "cache" / "cubin"
    d.mkdir(parents=True)
    for name in ("a-1", "b-2", "stale-3"):
        for ext in (".cubin", ".log", ".sha256"):
            (d / f"{name}{ext}").write_text(name)
    (d / "cubin.lock").write_text("")
    out = tmp_path / "out" / "c.tar.xz"
    assert precompile.pack([d / "a-1.cubin", d / "b-2.cubin", d / "a-1.cubin"], out) == 2
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
    assert names == sorted(f"cubin/{n}{e}" for n in ("a-1", "b-2") for e in (".cubin", ".log", ".sha256"))
    with pytest.raises(ValueError, match="nothing to pack"):
        precompile.pack([], out)


def test_a_record_of_a_gpu_run_adds_its_kernels(tmp_path, capsys):
    rec = tmp_path / "kernels.txt"
    rec.write_text("# kernels of a GPU run\nidx-m16n256k64-w4-s4-c1 8\nidx-m8n64k64-w4-s8-c1-sk2 8\n"
                   "gmsk-m8n256k64-w4-s8-c1 1\nidx-m16n256k64-w4-s4-c1 8\n")
    assert precompile.read_record(rec) == [("idx-m16n256k64-w4-s4-c1", 8), ("idx-m8n64k64-w4-s8-c1-sk2", 8),
                                           ("gmsk-m8n256k64-w4-s8-c1", 1)]
    assert cli.main(["precompile", "--list", "--record", str(rec)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == sorted(lines)
    assert {"idx-m16n256k64-w4-s4-c1", "idx-m8n64k64-w4-s8-c1-sk2", "gmsk-m8n256k64-w4-s8-c1 1"} <= set(lines)
    bad = tmp_path / "bad.txt"
    bad.write_text("idx-m16n256k64-w4-s4-c1 8\nidx-m16n256k64-w4-s4-c1 3\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: .*tile group cap"):
        precompile.read_record(bad)


_refused = cli_refused


def test_every_flag_is_checked_before_anything_is_built(tmp_path, capsys, monkeypatch):
    def ran(*a, **k):
        raise AssertionError("built although an argument was bad")

    monkeypatch.setattr(precompile, "build", ran)
    monkeypatch.setattr(precompile, "collect", ran)
    bad = tmp_path / "bad.txt"
    bad.write_text("idx-m16n256k64-w4-s4-c1 3\n")
    _refused(["precompile", "--record", str(bad)], capsys, "--record", "bad.txt:1", "tile group cap")
    _refused(["precompile", "--record", str(tmp_path / "missing.txt")], capsys, "--record", "missing.txt")
    _refused(["precompile", "--jobs", "0"], capsys, "--jobs", "positive")
    _refused(["precompile", "--out", str(tmp_path / "cache.zip")], capsys, "--out", ".tar.xz")
    _refused(["precompile", "--out", str(tmp_path)], capsys, "--out", "must name a .tar.xz")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _refused(["precompile", "--out", str(blocker / "c.tar.xz")], capsys, "--out", "is a file")
    _refused(["precompile", "--cache-dir", str(blocker)], capsys, "--cache-dir", "is a file")
    _refused(["precompile", "--scenarios", "tp8-m1"], capsys, "--scenarios", "add --tune")
    _refused(["precompile", "--experts", "16"], capsys, "--experts", "add --tune")
    _refused(["precompile", "--tune", "--experts", "16"], capsys, "--n-gate-up")
    _refused(["precompile", "--tune", "--max-candidates", "0"], capsys, "--max-candidates", "positive")
    monkeypatch.setattr(precompile, "checkout_missing", lambda root=None: "no checkout here")
    _refused(["precompile", "--tests"], capsys, "--tests", "no checkout here")


def test_builds_packs_and_says_how_to_unpack(tmp_path, capsys, monkeypatch):
    """The build itself stubbed (no nvcc needed): what reaches it, the archive and the message."""
    import types

    cubin = tmp_path / "cache" / "cubin" / "x-1.cubin"
    cubin.parent.mkdir(parents=True)
    cubin.write_text("x")
    seen = {}

    def fake_build(scheds, extra, *, jobs=None, progress=True):
        seen.update(n=len(scheds), extra=extra, jobs=jobs, progress=progress)
        return [types.SimpleNamespace(cubin=cubin, spill_bytes=0, wgmma_serialized=False)]

    monkeypatch.setattr(precompile, "build", fake_build)
    out = tmp_path / "carry" / "device.tar.xz"
    assert cli.main(["precompile", "--quiet", "--jobs", "3", "--out", str(out)]) == 0
    msg = capsys.readouterr().out
    assert seen["jobs"] == 3 and seen["progress"] is False and seen["n"] > 0 and seen["extra"] == []
    assert out.is_file() and "1 cubins packed into" in msg and "tar -xf device.tar.xz -C $CHORD_CACHE_DIR" in msg


def test_device_cache_tool_forwards_to_chord_precompile(tmp_path, capsys):
    tool = load_tool("device_cache")
    rec = tool.DEFAULT_RECORD
    plain = tool.translate([])
    assert plain[:5] == ["precompile", "--quiet", "--tests", "--out", str(tool.ROOT / ".cache" / "device.tar.xz")]
    assert (f"--record {rec}" in " ".join(plain)) == rec.is_file()
    assert tool.translate(["--no-tests", "--tune", "tp8-m1,tp8-m16", "--tune-suite", "kimi_k2_h200",
                           "--record", "r.txt", "--jobs", "4", "--list", "--out", "x.tar.xz"]) == [
        "precompile", "--quiet", "--ablations", "--out", "x.tar.xz", "--tune", "--scenarios", "tp8-m1,tp8-m16",
        "--suite", "kimi_k2_h200", "--record", "r.txt", "--jobs", "4", "--list"]
    assert tool.translate(["--tune", "all"])[5:6] == ["--tune"] and "--scenarios" not in tool.translate(["--tune", "all"])
    assert tool.main(["--list", "--no-tests", "--out", str(tmp_path / "c.tar.xz")]) == 0
    ids = capsys.readouterr().out.split()
    assert "gmsk-m8n256k64-w4-s8-c1" in ids
    assert tool.main(["--tune", "no-such-scenario", "--list"]) == 2
    assert "'no-such-scenario'" in capsys.readouterr().err


def test_chord_jit_records_each_kernel_once(tmp_path, monkeypatch):
    from chord import jit
    from chord.schedule import Schedule

    rec = tmp_path / "rec.txt"
    monkeypatch.setenv(jit.RECORD_ENV, str(rec))
    monkeypatch.setattr(jit, "_recorded", set())
    s = Schedule.from_id("idx-m16n256k64-w4-s4-c1")
    for _ in range(3):
        jit._record_kernel(s, 8)
    jit._record_kernel(s, 1)
    assert rec.read_text().splitlines() == ["idx-m16n256k64-w4-s4-c1 8", "idx-m16n256k64-w4-s4-c1 1"]
    monkeypatch.delenv(jit.RECORD_ENV)
    jit._record_kernel(Schedule.from_id("idx-m8n64k64-w4-s8-c1"), 8)  # unset: nothing written
    assert len(rec.read_text().splitlines()) == 2
    monkeypatch.setenv(jit.RECORD_ENV, str(tmp_path / "no-such-dir" / "rec.txt"))
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        jit._record_kernel(Schedule.from_id("idx-m8n64k64-w4-s8-c2"), 8)
