"""A capture as a timeline: events from a torch.profiler Chrome trace or from Nsight Systems'
CSV traces, drawn as one self-contained HTML page (inline SVG, hover titles; no plotly, no
network), one lane per kind (NVTX ranges, GPU kernels).

`chord.lab.capture` writes ``timeline.html`` next to every torch or nsys capture.
"""
from __future__ import annotations

import csv
import html
import json
from dataclasses import dataclass
from pathlib import Path

LANES = ("NVTX ranges", "GPU kernels")


@dataclass(frozen=True)
class Event:
    lane: str  # one of LANES
    name: str
    start_us: float
    dur_us: float


def from_chrome_trace(path: str | Path) -> list[Event]:
    """The chord NVTX ranges (as torch.profiler mirrors them: user annotations named ``chord/...``,
    their GPU projection when present) and the GPU kernels of a Chrome trace."""
    data = json.loads(Path(path).read_text())
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    out, gpu_ranges, cpu_ranges = [], [], []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name = str(e.get("cat", "")), str(e.get("name", ""))
        ts, dur = float(e["ts"]), float(e["dur"])
        if cat == "kernel":
            out.append(Event("GPU kernels", name, ts, dur))
        elif name.startswith("chord/"):
            (gpu_ranges if cat == "gpu_user_annotation" else cpu_ranges).append(Event("NVTX ranges", name, ts, dur))
    return out + (gpu_ranges or cpu_ranges)


def _num(v: str) -> float:
    return float(str(v).replace(",", ""))


def _column(header: list[str], *words: str) -> int:
    for i, h in enumerate(header):
        if all(w.lower() in h.lower() for w in words):
            return i
    raise ValueError(f"no column with {' '.join(words)!r} in {header}")


def read_csv_table(path: str | Path) -> list[dict]:
    """Rows of an ``nsys stats --format csv`` file (any notice lines before the header skipped)."""
    lines = Path(path).read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.count(",") >= 2), None)
    if start is None:
        return []
    return list(csv.DictReader(lines[start:]))


def from_nsys_traces(kernel_trace_csv: str | Path | None, nvtx_trace_csv: str | Path | None) -> list[Event]:
    """Events of ``nsys stats --report cuda_gpu_trace`` (kernels) and ``nvtx_gpu_proj_trace`` or
    ``nvtx_pushpop_trace`` (ranges) CSV files; times in ns there, µs here."""
    out = []
    for path, lane in ((kernel_trace_csv, "GPU kernels"), (nvtx_trace_csv, "NVTX ranges")):
        if not path or not Path(path).is_file():
            continue
        rows = read_csv_table(path)
        if not rows:
            continue
        header = list(rows[0].keys())
        s = header[_column(header, "start")]
        d = header[_column(header, "dur")]
        try:
            n = header[_column(header, "name")]
        except ValueError:
            n = header[_column(header, "range")]
        for r in rows:
            name = r[n]
            if lane == "NVTX ranges":
                if "chord/" not in name:
                    continue
                name = name[name.find("chord/"):]  # nsys prefixes the domain: "chord:chord/..."
            try:
                out.append(Event(lane, name, _num(r[s]) / 1e3, _num(r[d]) / 1e3))
            except (TypeError, ValueError):
                continue
    return out


def _short(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def write_html(events: list[Event], path: str | Path, title: str) -> Path:
    """One HTML page: a lane per kind, a bar per event (hover: name, start, duration), and a table
    of total time per name. Times are relative to the first event."""
    path = Path(path)
    if not events:
        path.write_text(f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                        f"<h3>{html.escape(title)}</h3><p>no events in this capture</p>\n")
        return path
    t0 = min(e.start_us for e in events)
    t1 = max(e.start_us + e.dur_us for e in events)
    span = max(t1 - t0, 1e-3)
    width, left, lane_h, top = 1200, 120, 34, 30
    colors = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d")
    names = list(dict.fromkeys(e.name for e in events))
    color = {nm: colors[i % len(colors)] for i, nm in enumerate(names)}
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 20}' height='{top + lane_h * len(LANES) + 40}'"
           " font-family='sans-serif' font-size='12'>"]
    for li, lane in enumerate(LANES):
        y = top + li * lane_h
        svg.append(f"<text x='4' y='{y + lane_h / 2 + 4}'>{lane}</text>")
        svg.append(f"<line x1='{left}' x2='{left + width}' y1='{y + lane_h}' y2='{y + lane_h}' stroke='#ddd'/>")
    for e in events:
        li = LANES.index(e.lane)
        x = left + (e.start_us - t0) / span * width
        w = max(e.dur_us / span * width, 0.5)
        y = top + li * lane_h + 4
        tip = html.escape(f"{e.name}\nstart {e.start_us - t0:.1f} us, {e.dur_us:.1f} us")
        svg.append(f"<rect x='{x:.2f}' y='{y}' width='{w:.2f}' height='{lane_h - 8}' fill='{color[e.name]}' "
                   f"opacity='0.85'><title>{tip}</title></rect>")
    for i in range(6):
        x = left + i * width / 5
        svg.append(f"<text x='{x:.1f}' y='{top + lane_h * len(LANES) + 16}' text-anchor='middle'>"
                   f"{i * span / 5:.0f} us</text>")
    svg.append("</svg>")
    totals: dict = {}
    for e in events:
        t = totals.setdefault((e.lane, e.name), [0, 0.0])
        t[0] += 1
        t[1] += e.dur_us
    rows = "".join(f"<tr><td>{html.escape(lane)}</td><td style='color:{color[nm]}'>{html.escape(_short(nm, 90))}</td>"
                   f"<td>{c}</td><td>{us:.1f}</td><td>{us / c:.1f}</td></tr>"
                   for (lane, nm), (c, us) in sorted(totals.items(), key=lambda kv: -kv[1][1]))
    page = (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<h3>{html.escape(title)}</h3><p>{len(events)} events over {span:.1f} us</p>{''.join(svg)}"
            "<table border='1' cellspacing='0' cellpadding='3'><tr><th>lane</th><th>name</th><th>count</th>"
            f"<th>total us</th><th>us each</th></tr>{rows}</table>\n")
    path.write_text(page)
    return path
