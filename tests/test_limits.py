"""chord.lab.limits / `chord limits` host logic: the ncu raw-page parser, the per-kernel reduction, the
manifest pairing and the refusals (the ncu run itself is on the H200)."""

import pytest

from chord import cli
from chord.lab import limits

HEAD = ["ID", "Process ID", "Kernel Name", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
        "dram__bytes_read.sum", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_bytes.sum",
        "sm__inst_issued.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps", "launch__waves_per_multiprocessor",
        "launch__registers_per_thread", "smsp__inst_executed.sum",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"]
UNITS = ["", "", "", "ns", "Hz", "byte", "%", "byte", "%", "%", "%", "%", "block", "block", "block", "", "register/thread",
         "inst", "", "", "", "", ""]


def _csv(rows):
    q = lambda r: ",".join(f'"{v}"' for v in r)  # noqa: E731 (ncu quotes every field)
    return "\n".join(["==PROF== Disconnected from process 123", q(HEAD), q(UNITS), *map(q, rows)]) + "\n"


def _row(i, dur_ns, dram_bytes, dram_pct, issue, gmma, regs_lim=3, smem_lim=2, name="chord_w4a16_kernel"):
    return [str(i), "77", name, f"{dur_ns:,.0f}", "1,710,000,000", f"{dram_bytes:,.0f}", str(dram_pct), "2,000,000,000",
            str(issue), str(gmma), "n/a", "24.5", str(regs_lim), str(smem_lim), "4", "2.91", "168", "93,000,000", "1.5",
            "0.4", "9.9", "6.25", "0.8"]


def test_raw_page_parse_drops_the_units_row_and_profiler_lines():
    rows = limits.parse_raw_csv(_csv([_row(0, 215_000, 800e6, 81.8, 40.0, 5.0)]))
    assert len(rows) == 1
    assert rows[0]["Kernel Name"] == "chord_w4a16_kernel"
    assert limits.parse_raw_csv("==PROF== nothing profiled\n") == []


def test_reduce_row_units_stalls_occupancy_and_limiter():
    raw = limits.parse_raw_csv(_csv([_row(0, 215_000, 800e6, 81.8, 40.0, 5.0)]))[0]
    r = limits.reduce_row(raw, "ep8-decode-tok1", "indexed", "gate_up", "idx-m8n256k64-w4-s8-c1", floor_bytes=792_000_000)
    assert r.duration_us == pytest.approx(215.0)
    assert r.sm_clock_ghz == pytest.approx(1.71)
    assert r.dram_read_mb == pytest.approx(800.0)
    assert r.dram_tb_s == pytest.approx(800e6 / 215e-6 / 1e12)
    assert r.traffic_ratio == pytest.approx(800 / 792)
    assert r.l2_mb == pytest.approx(2000.0)
    assert r.tensor_pct == 5.0 and r.tensor_metric.startswith("sm__pipe_tensor_op_gmma")  # n/a column skipped
    assert (r.ctas_per_sm, r.cta_limit) == (2, "shared_mem")
    assert r.registers == 168 and r.waves == pytest.approx(2.91)
    assert r.inst_executed_m == pytest.approx(93.0)
    # "selected" (the issuing cycle itself) is not a stall; the largest three remain, largest first
    assert [s[0] for s in r.stalls] == ["wait", "long_scoreboard", "math_pipe_throttle"]
    assert r.limiter == "hbm"


@pytest.mark.parametrize("dram,tensor,issue,want", [
    (80.0, 70.0, 70.0, "hbm"), (50.0, 65.0, 70.0, "tensor"), (50.0, 30.0, 61.0, "issue"),
    (50.0, 30.0, 30.0, "latency:wait"), (None, None, None, "latency:wait")])
def test_limiter_thresholds_in_order(dram, tensor, issue, want):
    assert limits.limiter(dram, tensor, issue, [["wait", 3.0], ["barrier", 1.0]]) == want
    assert limits.limiter(10.0, 10.0, 10.0, []) == "latency"


def test_manifest_pairs_by_launch_id_and_refuses_a_count_mismatch():
    text = _csv([_row(1, 107_000, 400e6, 76.0, 45.0, 4.0), _row(0, 215_000, 800e6, 81.8, 40.0, 5.0)])
    man = [{"scenario": "s", "family": "indexed", "gemm": g, "schedule": f"id-{g}", "floor_bytes": b}
           for g, b in (("gate_up", 792_000_000), ("down", 396_000_000))]
    rows = limits.match_manifest(limits.parse_raw_csv(text), man)
    assert [(r.gemm, round(r.duration_us)) for r in rows] == [("gate_up", 215), ("down", 107)]
    with pytest.raises(limits.LimitsError, match="holds 2 Chord kernels but the worker launched 1"):
        limits.match_manifest(limits.parse_raw_csv(text), man[:1])
    other = _csv([_row(0, 5_000, 1e6, 1.0, 1.0, 1.0, name="elementwise_kernel")])
    with pytest.raises(limits.LimitsError, match="expected chord_w4a16_kernel"):
        limits.match_manifest(limits.parse_raw_csv(other), man[:1])


def test_markdown_has_one_line_per_kernel_and_a_matching_separator():
    raw = limits.parse_raw_csv(_csv([_row(0, 215_000, 800e6, 81.8, 40.0, 5.0)]))[0]
    md = limits.markdown([limits.reduce_row(raw, "s", "indexed", "gate_up", "x")])
    head, sep, line = md.strip().splitlines()
    assert head.count("|") == sep.count("|") == line.count("|")
    assert "wait 6.2" in line and "| hbm |" in line


def test_points_follow_the_suite_and_bad_names_raise_before_any_gpu_check():
    pts = limits.select_points(None, "ep8-decode-tok1,tp8-m1", None)
    assert pts == [("ep8-decode-tok1", "indexed"), ("ep8-decode-tok1", "grouped_masked"), ("tp8-m1", "indexed")]
    with pytest.raises(ValueError, match="nope"):
        limits.select_points(None, "nope", None)
    with pytest.raises(ValueError, match="unknown families"):
        limits.select_points(None, None, "dense")


def test_cli_without_a_gpu_says_where_the_recorded_run_is(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a GPU machine
    assert cli.main(["limits", "--scenarios", "tp8-m1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs an sm_90" in err and "limits" in err
    assert not (tmp_path / "limits.json").exists()


def test_worker_arguments_round_trip(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(limits, "_worker", lambda pts, man, suite, prof: seen.update(pts=pts, man=man, prof=prof))
    assert limits.main(["--worker", "--manifest", str(tmp_path / "m.jsonl"), "--points",
                        "ep8-decode-tok1:indexed,tp8-m1:indexed", "--profile", "h200"]) == 0
    assert seen["pts"] == [("ep8-decode-tok1", "indexed"), ("tp8-m1", "indexed")] and seen["prof"] == "h200"


def test_clock_and_issue_fall_back_to_what_ncu_2025_reports():
    """ncu 2025.3's sections (seen on the H200) report the GPC clock and executed instructions per
    active cycle instead of the SM clock and issue-slot percentage: both are read from those."""
    raw = {"gpu__time_duration.sum": "11,100", "gpc__cycles_elapsed.avg.per_second": "1,690,000,000",
           "sm__inst_executed.avg.per_cycle_active": "2.96", "dram__bytes_read.sum": "16,500,000"}
    r = limits.reduce_row(raw, "tp8-m1", "indexed", "gate_up", "idx-m8n64k64-w4-s8-c1-sk8")
    assert r.sm_clock_ghz == pytest.approx(1.69)
    assert r.issue_pct == pytest.approx(74.0)
    assert r.limiter == "issue"
