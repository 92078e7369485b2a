"""The capture timeline (chord.lab.timeline) and the nsys table parsing of chord.lab.capture, on CPU from
synthetic trace files in the formats torch.profiler and `nsys stats --format csv` write."""
import json

from chord.lab import capture, timeline

RANGE = "chord/gemm_indexed[idx-m8n256k64-w4-s8-c1]"


def _chrome_trace(path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": RANGE, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": RANGE, "ts": 110.0, "dur": 42.0},
        {"ph": "X", "cat": "kernel", "name": "chord_w4a16_kernel", "ts": 112.0, "dur": 40.0},
        {"ph": "X", "cat": "kernel", "name": "chord_w4a16_kernel", "ts": 160.0, "dur": 20.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 90.0, "dur": 1.0},
        {"ph": "i", "name": "marker", "ts": 95.0},
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_chrome_trace_events_and_page(tmp_path):
    ev = timeline.from_chrome_trace(_chrome_trace(tmp_path / "trace.json"))
    assert [e.lane for e in ev].count("GPU kernels") == 2
    nvtx = [e for e in ev if e.lane == "NVTX ranges"]
    assert len(nvtx) == 1 and nvtx[0].dur_us == 42.0  # the GPU projection wins over the CPU range
    page = timeline.write_html(ev, tmp_path / "t.html", "test").read_text()
    assert page.count("<rect") == 3 and RANGE in page and "chord_w4a16_kernel" in page
    assert "80.0 us" in page or "events over 70.0 us" in page


def test_empty_timeline_says_so(tmp_path):
    assert "no events" in timeline.write_html([], tmp_path / "e.html", "x").read_text()


def test_nsys_csv_tables(tmp_path):
    kern = tmp_path / "stats_cuda_gpu_trace.csv"
    kern.write_text("Start (ns),Duration (ns),CorrId,GrdX,Name\n1000,40000,1,96,chord_w4a16_kernel\n"
                    "50000,\"20,000\",2,96,chord_w4a16_kernel\n")
    nvtx = tmp_path / "stats_nvtx_gpu_proj_trace.csv"
    nvtx.write_text(f"Name,Projected Start (ns),Projected Duration (ns),Orig Start (ns)\n:{RANGE},900,41000,800\n"
                    "other,0,5,0\n")
    ev = timeline.from_nsys_traces(kern, nvtx)
    assert [e.lane for e in ev] == ["GPU kernels", "GPU kernels", "NVTX ranges"]
    assert ev[1].dur_us == 20.0 and ev[2].dur_us == 41.0
    summ = tmp_path / "stats_nvtx_gpu_proj_sum.csv"
    summ.write_text("NOTICE: some line\nRange,Style,Total Proj Time (ns),Total Range Time (ns),Range Instances,Proj Avg (ns)\n"
                    f"chord:{RANGE},PushPop,84000,90000,2,42000\n:chord/profile[x indexed],PushPop,1,2,1,1\n:foo,PushPop,5,5,1,5\n")
    rows = capture._nsys_summary_rows(summ, "range", True)
    assert rows[0] == {"range": RANGE, "calls": 2, "gpu_us_total": 84.0, "gpu_us_per_call": 42.0}
    assert len(rows) == 2  # only chord/ ranges
    ksum = tmp_path / "stats_cuda_gpu_kern_sum.csv"
    ksum.write_text("Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
                    "100.0,60000,2,30000,30000,20000,40000,1,chord_w4a16_kernel\n")
    k = capture._nsys_summary_rows(ksum, "kernel", False)
    assert k == [{"kernel": "chord_w4a16_kernel", "calls": 2, "gpu_us_total": 60.0, "gpu_us_per_call": 30.0}]


def test_nsys_summary_without_the_expected_columns_is_a_clear_error(tmp_path):
    import pytest

    bad = tmp_path / "stats_nvtx_sum.csv"
    bad.write_text("Range,Style,Something\nchord/x,PushPop,1\n")
    with pytest.raises(capture.CaptureError, match="Instances"):
        capture._nsys_summary_rows(bad, "range", True)
