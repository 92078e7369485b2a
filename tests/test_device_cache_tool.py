"""tools/device_cache.py on CPU: what it collects for a GPU session's kernel cache, and the packing."""
import tarfile

import pytest
from conftest import TOOLS_DIR, load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("device_cache")


@pytest.fixture(scope="module")
def collected(tool):
    return tool.collect(tests=True)


def test_collects_the_profile_every_policy_and_the_gpu_tests(tool, collected):
    import sys

    from chord import optimizations
    from chord.bench.suite import load_suite
    from chord.schedule import POLICY_RULES, select
    from chord.testing import profile_rule_schedules

    for s in profile_rule_schedules(tool.TEST_NS):
        assert s.id in collected
        assert all(off.id in collected for off in optimizations.ablations(s).values())
    sc = load_suite().scenario("tp8-m64")
    _, _, prob = sc.gemm_problem("indexed", "gate_up")
    for pol in ["heuristic", "batch_invariant", *(f"heuristic,-{r}" for r in POLICY_RULES)]:
        assert select("h200:tp8", prob, pol).id in collected, pol
    sys.path.insert(0, str(TOOLS_DIR.parent / "tests" / "gpu"))
    try:
        from test_fuzz_gpu import fuzz_pool
    finally:
        sys.path.pop(0)
    assert {s.id for s in fuzz_pool("grouped_masked")} <= set(collected)
    assert "gmsk-m8n256k64-w4-s8-c1" in collected  # the decode profile's masked gate_up


def test_collects_the_schedules_of_the_notebook_tables(collected):
    import csv

    from chord.workbench.data import DATA_DIR

    named = set()
    for f in DATA_DIR.glob("*.csv"):
        rows = (line for line in f.read_text().splitlines() if not line.startswith("#"))
        named |= {r["schedule"] for r in csv.DictReader(rows) if r.get("schedule")}
    assert named and named <= set(collected)


def test_no_tests_and_tune_change_the_set(tool, collected):
    small = tool.collect(tests=False)
    assert set(small) < set(collected)
    from chord import tune

    tuned = tool.collect(tests=False, tune_scenarios="tp8-m1")
    assert {s.id for s in tune.tune_schedules(None, "tp8-m1", max_candidates=24)} <= set(tuned)
    every = tool.collect(tests=False, tune_scenarios="tp8-m1", max_candidates=None)
    assert {s.id for s in tune.tune_schedules(None, "tp8-m1")} <= set(every)


def test_pack_takes_the_cubins_with_their_logs_and_digests(tool, tmp_path):
    d = tmp_path / "cache" / "cubin"
    d.mkdir(parents=True)
    for name in ("a-1", "b-2", "stale-3"):
        for ext in (".cubin", ".log", ".sha256"):
            (d / f"{name}{ext}").write_text(name)
    (d / "cubin.lock").write_text("")
    out = tmp_path / "out" / "c.tar.xz"
    assert tool.pack([d / "a-1.cubin", d / "b-2.cubin", d / "a-1.cubin"], out) == 2
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
    assert names == sorted(f"cubin/{n}{e}" for n in ("a-1", "b-2") for e in (".cubin", ".log", ".sha256"))
    with pytest.raises(SystemExit, match="nothing to pack"):
        tool.pack([], out)


def test_command_line(tool, capsys):
    assert tool.main(["--list", "--no-tests"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids == sorted(ids) and "gmsk-m8n256k64-w4-s8-c1" in ids
    with pytest.raises(SystemExit):
        tool.main(["--jobs", "0", "--list"])
    assert "--jobs must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(["--tune", "no-such-scenario", "--list"])
    assert "unknown scenario 'no-such-scenario'" in capsys.readouterr().err


def test_a_record_of_a_gpu_run_adds_its_kernels(tool, tmp_path, capsys):
    rec = tmp_path / "kernels.txt"
    rec.write_text("# kernels of a GPU run\nidx-m16n256k64-w4-s4-c1 8\nidx-m8n64k64-w4-s8-c1-sk2 8\n"
                   "gmsk-m8n256k64-w4-s8-c1 1\nidx-m16n256k64-w4-s4-c1 8\n")
    assert tool.read_record(rec) == [("idx-m16n256k64-w4-s4-c1", 8), ("idx-m8n64k64-w4-s8-c1-sk2", 8),
                                     ("gmsk-m8n256k64-w4-s8-c1", 1)]
    assert tool.main(["--list", "--no-tests", "--record", str(rec)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {"idx-m16n256k64-w4-s4-c1", "idx-m8n64k64-w4-s8-c1-sk2", "gmsk-m8n256k64-w4-s8-c1 1"} <= set(lines)
    bad = tmp_path / "bad.txt"
    bad.write_text("idx-m16n256k64-w4-s4-c1 8\nidx-m16n256k64-w4-s4-c1 3\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: .*tile group cap"):
        tool.read_record(bad)
    with pytest.raises(SystemExit):
        tool.main(["--list", "--record", str(bad)])
    assert "bad.txt:2" in capsys.readouterr().err


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
