"""The notebooks' capture cell: an NVTX-annotated profile of a notebook's own calls.

`capture_or_recorded(scenario, family)` runs `chord.lab.capture.capture(..., tool="torch")` on the
bench's calls for that scenario when an sm_90 GPU is here; otherwise it returns the committed
H200 capture of that scenario and family when there is one (else None), and in both cases the
`chord capture` commands that take the capture with torch.profiler, Nsight Systems or Nsight
Compute. A recorded capture says when, on which commit and with which schedules it was taken,
and is flagged when today's selection policy picks other schedules for the same calls
(`stale_schedules`): its times are then those of another decision.
"""
from __future__ import annotations

import tempfile

from chord.lab.workbench.data import gpu_available, recorded_capture, recorded_file
from chord.lab.workbench.explore import todays_schedules  # noqa: F401  (the notebooks' name for it here)


def capture_commands(scenario: str, family: str) -> list[str]:
    return [f"chord capture --scenario {scenario} --family {family} --tool {tool} --out prof-{tool}"
            for tool in ("torch", "nsys", "ncu")]


profile_commands = capture_commands  # its earlier name


def stale_schedules(cap: dict) -> dict:
    """``{gemm: (recorded id, today's id)}`` for each GEMM whose recorded schedule is not today's
    decision (empty: the capture shows today's schedules)."""
    today = todays_schedules(cap["scenario"], cap["family"])
    return {g: (cap["schedules"].get(g), sid) for g, sid in today.items() if cap["schedules"].get(g) != sid}


def _recorded_line(cap: dict) -> str:
    rec = cap.get("recorded", {})
    scheds = ", ".join(f"{g} {sid}" for g, sid in cap["schedules"].items())
    line = (f"recorded capture {recorded_file(cap['file'])}: {rec.get('gpu', 'H200')}, commit {rec.get('commit', '?')}, "
            f"{rec.get('date') or rec.get('timestamp') or cap['file'][:10]}; schedules {scheds} (no sm_90 GPU here, nothing ran live)")
    stale = stale_schedules(cap)
    if stale:
        line += ("\nrecorded under another decision: today's policy picks "
                 + ", ".join(f"{g} {now} (recorded {was})" for g, (was, now) in stale.items())
                 + "; these times are of the recorded schedules")
    return line


def capture_or_recorded(scenario: str, family: str = "indexed", iters: int = 2) -> tuple[dict | None, str]:
    """(capture dict or None, lines saying where it comes from and how to take one)."""
    how = "take one with: " + " | ".join(capture_commands(scenario, family))
    if gpu_available():
        from chord.lab import capture

        cap = capture.capture(scenario, family, tool="torch", out_dir=tempfile.mkdtemp(prefix="chord-prof-"),
                              iters=iters).as_dict()
        return cap, f"live torch.profiler capture ({cap['files'].get('trace')}); {how}"
    try:
        cap = recorded_capture(scenario, family)
    except FileNotFoundError:
        return None, f"no sm_90 GPU here and no committed capture of {scenario} {family}; {how}"
    return cap, f"{_recorded_line(cap)}\n{how}"


def show_capture(scenario: str, family: str = "indexed", iters: int = 2):
    """The capture cell of a notebook: prints where the capture comes from, shows its ranges
    (names whole), and returns the figure of GPU time per range (None when there is no capture)."""
    from chord.lab.workbench.figures import capture_figure
    from chord.lab.workbench.tables import show_rows

    cap, where = capture_or_recorded(scenario, family, iters)
    print(where)
    if cap is None:
        return None
    show_rows(cap["ranges"], ["range", "calls", "gpu_us_per_call", "gpu_us_total"])
    return capture_figure(cap)
