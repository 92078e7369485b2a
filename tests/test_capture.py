"""chord.lab.capture / `chord capture` host logic (the captures themselves run on the H200)."""
import pytest
import torch

from chord.lab import capture
from chord.cli import main
from chord.profiling import range_name


def test_expected_ranges_name_the_schedules():
    got = capture.expected_ranges("indexed", {"gate_up": "idx-m8n256k64-w4-s8-c1", "down": "idx-m8n128k64-w4-s6-c1"})
    assert got == {range_name("gemm_indexed", "idx-m8n256k64-w4-s8-c1"),
                   range_name("gemm_indexed", "idx-m8n128k64-w4-s6-c1")}
    assert capture.expected_ranges("grouped_masked", {"gate_up": "a", "down": "a"}) == {"chord/gemm_masked[a]"}


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(tool="perf"), ValueError, "tool must be one of"),
    (dict(iters=0), ValueError, "iters must be a positive int"),
    (dict(iters=True), ValueError, "iters must be a positive int"),
    (dict(cuda_graph=1), ValueError, "cuda_graph must be a bool"),
])
def test_bad_arguments_are_named(kw, exc, msg, tmp_path):
    with pytest.raises(exc, match=msg):
        capture.capture("tp8-m1", "indexed", out_dir=tmp_path, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_without_a_gpu_the_capture_says_where_the_recorded_ones_are(tmp_path, capsys):
    with pytest.raises(capture.CaptureError, match="needs an sm_90"):
        capture.capture("tp8-m1", "indexed", out_dir=tmp_path)
    assert main(["capture", "--scenario", "tp8-m1", "--out", str(tmp_path)]) == 2
    assert "recorded H200 captures" in capsys.readouterr().err


def test_missing_profiler_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(capture.shutil, "which", lambda name: None)
    monkeypatch.setattr(capture, "_TOOL_GLOBS", {"nsys": (), "ncu": ()})
    with pytest.raises(capture.CaptureError, match="nsys not found on PATH"):
        capture._tool_binary("nsys")


def test_record_function_mirror_is_off_unless_a_capture_turns_it_on():
    from chord import profiling

    assert profiling._record_function is False
    profiling.record_function_ranges(True)
    try:
        with profiling.nvtx_range("gemm_indexed", "x"):  # NVTX off: a no-op either way
            pass
    finally:
        profiling.record_function_ranges(False)


def test_capture_figure_and_the_recorded_capture_agree():
    from chord.lab.workbench import figures, recorded_capture

    cap = recorded_capture()
    fig = figures.capture_figure(cap)
    names = list(fig.data[0].x)
    assert names and all(n.startswith("chord/gemm_") for n in names)
    assert set(names) == capture.expected_ranges(cap["family"], cap["schedules"])


def test_nvtx_package_ranges_use_its_public_functions(monkeypatch):
    """With the `nvtx` package installed the ranges go through nvtx.push_range / pop_range in
    the `chord` domain (0.2.17 has no top-level EventAttributes: the old code crashed)."""
    import sys
    import types

    from chord import profiling

    calls = []
    fake = types.ModuleType("nvtx")
    fake.get_domain = lambda name: name
    fake.push_range = lambda message=None, domain=None, **kw: calls.append(("push", message, domain))
    fake.pop_range = lambda domain=None: calls.append(("pop", domain))
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    monkeypatch.setattr(profiling, "_backend", None)
    monkeypatch.setattr(profiling, "_enabled", True)
    with profiling.nvtx_range("gemm_indexed", "idx-m8n128k64-w4-s4-c1"):
        calls.append("body")
    assert calls == [("push", "chord/gemm_indexed[idx-m8n128k64-w4-s4-c1]", "chord"), "body", ("pop", "chord")]
    monkeypatch.setattr(profiling, "_backend", None)


def test_a_family_the_scenario_does_not_run_is_named_before_any_work():
    from chord.lab.bench import inputs as I

    with pytest.raises(ValueError, match="capture: scenario tp8-m1 runs families"):
        I.one_scenario(None, "tp8-m1", "grouped_masked", who="capture")


def test_tools_are_found_outside_path(monkeypatch, tmp_path):
    """nsys lives outside PATH on the GPU machine: $CUDA_HOME and the install folders count."""
    monkeypatch.setattr(capture.shutil, "which", lambda name: None)
    for v in ("2024.5.1", "2025.1.1"):
        d = tmp_path / f"nsight-systems-{v}" / "bin"
        d.mkdir(parents=True)
        (d / "nsys").write_text("#!/bin/sh\n")
        (d / "nsys").chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert capture.find_tool("nsys") == str(tmp_path / "nsight-systems-2025.1.1" / "bin" / "nsys")
    monkeypatch.setattr(capture, "_TOOL_GLOBS", {"nsys": (str(tmp_path / "none" / "nsys"),), "ncu": ()})
    assert capture.find_tool("nsys") is None


def test_a_bad_scenario_is_named_before_the_gpu_check(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        capture.capture("nope", "indexed", out_dir=tmp_path)
    with pytest.raises(ValueError, match="capture: scenario tp8-m1 runs families"):
        capture.capture("tp8-m1", "grouped_contiguous", out_dir=tmp_path)


@pytest.mark.parametrize("tool", ["nsys", "ncu"])
def test_cuda_graph_captures_ask_the_subprocess_and_the_tool_for_graph_replays(tool, monkeypatch, tmp_path):
    """`chord capture --cuda-graph`: the profiled subprocess replays one graph of the pair; nsys
    traces each kernel node of it (its default shows a graph launch as one range); ncu skips the
    capture's warm-up and first replay too."""
    from chord.cli import build_parser

    ran = []

    class Stop(Exception):
        pass

    def fake_run(cmd, log):
        ran.append(cmd)
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(capture, "_tool_binary", lambda name: name)
    monkeypatch.setattr(capture, "_run", fake_run)
    for graph in (True, False):
        with pytest.raises(Stop):
            capture.capture("tp8-m1", "indexed", tool, tmp_path, iters=5, cuda_graph=graph)
    with_graph, without = ran
    sub = with_graph[with_graph.index("capture", 2):]
    assert sub[-1] == "--cuda-graph" and "--cuda-graph" not in without
    args = build_parser().parse_args(sub)
    assert args.cuda_graph is True and args.tool == "none" and args.iters == 5
    if tool == "nsys":
        assert "--cuda-graph-trace=node" in with_graph and "--cuda-graph-trace=node" not in without
    else:
        assert with_graph[with_graph.index("--launch-skip") + 1] == "6" and without[without.index("--launch-skip") + 1] == "2"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_graph_capture_sees_every_replayed_kernel(tmp_path):
    """torch.profiler sees the kernels a graph replays: a torch capture (which also profiles the
    warm-up pair) of 4 replays has the eager capture's kernels plus the capture's warm-up pair and
    first replay."""
    def chord_kernels(cap):
        return sum(k["calls"] for k in cap.kernels if k["kernel"].startswith("chord"))

    eager = capture.capture("tp8-m1", "indexed", "torch", tmp_path / "eager", iters=4)
    cap = capture.capture("tp8-m1", "indexed", "torch", tmp_path / "graph", iters=4, cuda_graph=True)
    assert cap.cuda_graph and cap.as_dict()["cuda_graph"] is True and not eager.cuda_graph
    assert chord_kernels(eager) == 2 + 8, eager.kernels
    assert chord_kernels(cap) == chord_kernels(eager) + 4, (cap.kernels, eager.kernels)
    assert (tmp_path / "graph" / "timeline.html").exists()


def test_chord_profile_is_the_deprecated_name_of_chord_capture(capsys, monkeypatch, tmp_path):
    """`chord profile` still runs the capture, with a warning on stderr naming `chord capture`;
    `chord capture` says nothing of the kind, and `profile` is no longer listed."""
    from chord.lab import cli

    seen = []
    monkeypatch.setattr(capture, "capture", lambda *a, **k: seen.append((a, k)) or (_ for _ in ()).throw(
        capture.CaptureError("stop here")))
    for name in ("profile", "capture"):
        assert cli.main([name, "--scenario", "tp8-m1", "--iters", "2", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert ("deprecated" in err and "`chord capture`" in err) == (name == "profile"), err
        assert "chord capture: stop here" in err
    assert seen[0] == seen[1] and seen[0][0][:2] == ("tp8-m1", "indexed")
    assert "profile" not in cli.COMMANDS and cli.DEPRECATED_COMMANDS == {"profile": "capture"}
    assert cli._renamed(["--version"]) == ["--version"] and cli._renamed(["bench", "profile"]) == ["bench", "profile"]
