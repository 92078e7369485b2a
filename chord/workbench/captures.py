"""The notebooks' capture cell: an NVTX-annotated profile of a notebook's own calls.

`capture_or_recorded(scenario, family)` runs `chord.capture.capture(..., tool="torch")` on the
bench's calls for that scenario when an sm_90 GPU is here; otherwise it returns the committed
H200 capture of that scenario and family when there is one (else None), and in both cases the
`chord profile` commands that take the capture with torch.profiler, Nsight Systems or Nsight
Compute.
"""
from __future__ import annotations

import tempfile

from chord.workbench.data import gpu_available, recorded_capture, recorded_file


def profile_commands(scenario: str, family: str) -> list[str]:
    return [f"chord profile --scenario {scenario} --family {family} --tool {tool} --out prof-{tool}"
            for tool in ("torch", "nsys", "ncu")]


def capture_or_recorded(scenario: str, family: str = "indexed", iters: int = 2) -> tuple[dict | None, str]:
    """(capture dict or None, one line saying where it comes from and how to take one)."""
    how = "take one with: " + " | ".join(profile_commands(scenario, family))
    if gpu_available():
        from chord import capture

        cap = capture.capture(scenario, family, tool="torch", out_dir=tempfile.mkdtemp(prefix="chord-prof-"),
                              iters=iters).as_dict()
        return cap, f"live torch.profiler capture ({cap['files'].get('trace')}); {how}"
    try:
        cap = recorded_capture(scenario, family)
    except FileNotFoundError:
        return None, f"no sm_90 GPU here and no committed capture of {scenario} {family}; {how}"
    return cap, f"recorded H200 capture {recorded_file(cap['file'])} (no sm_90 GPU here); {how}"


def show_capture(scenario: str, family: str = "indexed", iters: int = 2):
    """The capture cell of a notebook: prints where the capture comes from and its ranges, and
    returns the figure of GPU time per range (None when there is no capture to show)."""
    from chord.workbench.figures import capture_figure

    cap, where = capture_or_recorded(scenario, family, iters)
    print(where)
    if cap is None:
        return None
    for r in cap["ranges"]:
        print(f"{r['range']:64s} {r['calls']:3d} calls {r['gpu_us_per_call']:10.1f} us GPU per call")
    return capture_figure(cap)
