"""Reports of a bench run: terminal table, JSON, HTML (plotly charts when plotly is installed).

Input is the runner's ``{"meta": {...}, "rows": [long-format rows]}``. Every view is a pure
function of that dict, so notebooks can rebuild them from a saved ``results.json``.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

CHORD = "chord"


def _fmt(v, spec: str = ".1f", none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, spec)


def pivot(result: dict) -> list[dict]:
    """One dict per (scenario, family), in run order: floor, chord and Humming p50s and checks."""
    rows = result.get("rows", [])
    order: list[tuple[str, str]] = []
    cells: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r.get("scenario"), r.get("family"))
        if key not in cells:
            order.append(key)
            cells[key] = {"scenario": key[0], "family": key[1], "rows_per_expert": r.get("rows_per_expert"),
                          "M": r.get("M")}
        c = cells[key]
        prov, metric, p50 = r.get("provider"), r.get("metric"), r.get("p50")
        side = "chord" if prov == CHORD else ("humming_committed" if "committed" in str(prov) else "humming")
        if metric == "time_us":
            c[f"{side}_us"] = p50
            c[f"{side}_p20"] = r.get("p20")
            c[f"{side}_p80"] = r.get("p80")
        elif metric == "pct_of_floor":
            c[f"{side}_pct"] = p50
        elif metric == "floor_us":
            c.setdefault("floor_committed_us" if side == "humming_committed" else "floor_us", p50)
        elif metric == "error":
            c[f"{side}_error"] = r.get("error")
        elif metric == "chain_us":
            c[f"{side}_chain_us"] = p50
        elif metric == "rel_err_act":
            c[f"{side}_act_err"] = p50
        if side == "chord" and metric == "time_us":
            c["chord_schedule"] = r.get("schedule_gate_up")
            c["chord_schedule_down"] = r.get("schedule_down")
        if side == "chord" and r.get("check"):
            c["chord_check"] = r.get("check")
        if side.startswith("humming") and r.get("block_m") is not None:
            c["humming_block_m"] = r.get("block_m")
        if side == "humming" and r.get("check"):
            c["humming_check"] = r.get("check")
    out = []
    for key in order:
        c = cells[key]
        if c.get("floor_us") is None and c.get("floor_committed_us") is not None:
            c["floor_us"] = c["floor_committed_us"]
        h_us = c.get("humming_us", c.get("humming_committed_us"))
        if c.get("chord_us") and h_us:
            c["speedup"] = h_us / c["chord_us"]
        out.append(c)
    return out


COLUMNS = [
    ("scenario", "scenario", "s"), ("family", "family", "s"), ("rows/exp", "rows_per_expert", ".1f"),
    ("floor us", "floor_us", ".1f"), ("chord us", "chord_us", ".1f"), ("chord %fl", "chord_pct", ".1f"),
    ("humming us", "h_us", ".1f"), ("hum %fl", "h_pct", ".1f"), ("speed-up", "speedup", ".2f"),
    ("chord check", "chord_check", "s"), ("chord schedule (gate_up)", "chord_schedule", "s"),
    ("hum block_m", "humming_block_m", "s"),
]


def _table_cells(result: dict) -> tuple[list[str], list[list[str]], bool]:
    live = bool(result.get("meta", {}).get("humming", {}).get("live"))
    header = [name for name, _, _ in COLUMNS]
    body = []
    for c in pivot(result):
        c = dict(c)
        c["h_us"] = c.get("humming_us") if live else c.get("humming_committed_us")
        c["h_pct"] = c.get("humming_pct") if live else c.get("humming_committed_pct")
        if c.get("chord_error"):
            c["chord_check"] = "ERROR"
        line = []
        for _, key, spec in COLUMNS:
            v = c.get(key)
            if spec == "s":
                line.append("-" if v is None else (",".join(map(str, v)) if isinstance(v, list) else str(v)))
            else:
                line.append(_fmt(v, spec))
        body.append(line)
    return header, body, live


def _render(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


NOTE = "times: do_bench median of gate_up + down (us); %fl = 100 * floor / time; speed-up = humming / chord"


def humming_line(result: dict) -> str:
    """How the Humming column was measured: in this run, in the recorded run shown (a result
    read from a file: ``meta["file"]``), or the committed baseline file's numbers."""
    meta = result.get("meta", {})
    if meta.get("humming", {}).get("live"):
        if meta.get("file"):
            return "Humming 0.1.20: measured in that recorded run, on the same GPU, same routing and seed"
        return "Humming 0.1.20: run in this run, on the same GPU, same routing and seed"
    return ("Humming 0.1.20: NOT run -- numbers of the committed baseline file (2026-11-29, another run and GPU: "
            "speed-up against them is indicative only), floors of that file for its %")


def terminal_table(result: dict) -> str:
    header, body, live = _table_cells(result)
    meta = result.get("meta", {})
    c = meta.get("ceilings", {})
    title = (f"{meta.get('suite_name', 'suite')} on {meta.get('gpu')} (commit {meta.get('commit')}, {meta.get('timestamp')}); "
             f"ceilings: copy {_fmt(c.get('copy_TB_per_s'), '.3f')} TB/s, bf16 {_fmt(c.get('bf16_matmul_TFLOP_per_s'), '.1f')} TFLOP/s")
    lines = [title, humming_line(result), NOTE, "", _render(header, body)]
    summary = speedup_summary(result)
    if summary:
        lines += ["", "geomean speed-up: " + "; ".join(
            f"{name} {g:.3f}x over {n} rows ({faster} faster)" for name, (g, n, faster) in summary.items())]
    chain = chain_table(result)
    if chain:
        lines += ["", CHAIN_NOTE, "", chain]
    return "\n".join(lines)


CHAIN_NOTE = ("the provider-owned chain, as vLLM 0.33 calls it through each library's humming root: gate_up, "
              "SiLU and mul (may_process_input), down, one CUDA-graph replay (us); outside = chain - gate_up - down "
              "timed together")
CHAIN_COLUMNS = [("scenario", "scenario", "s"), ("family", "family", "s"), ("chord chain us", "chord_chain_us", ".1f"),
                 ("chord outside us", "chord_outside", ".1f"), ("humming chain us", "humming_chain_us", ".1f"),
                 ("hum outside us", "humming_outside", ".1f"), ("chain speed-up", "chain_speedup", ".2f"),
                 ("act err chord / hum", "act_err", "s")]


def chain_table(result: dict) -> str:
    """The chain timings (metric chain_us) of both libraries, one line per (scenario, family) that has
    one; empty when the run timed none."""
    body = []
    for c in pivot(result):
        if c.get("chord_chain_us") is None and c.get("humming_chain_us") is None:
            continue
        c = dict(c)
        for side in ("chord", "humming"):
            if c.get(f"{side}_chain_us") is not None and c.get(f"{side}_us") is not None:
                c[f"{side}_outside"] = c[f"{side}_chain_us"] - c[f"{side}_us"]
        if c.get("chord_chain_us") and c.get("humming_chain_us"):
            c["chain_speedup"] = c["humming_chain_us"] / c["chord_chain_us"]
        c["act_err"] = f"{_fmt(c.get('chord_act_err'), '.1e')} / {_fmt(c.get('humming_act_err'), '.1e')}"
        body.append([("-" if c.get(k) is None else str(c.get(k))) if spec == "s" else _fmt(c.get(k), spec)
                     for _, k, spec in CHAIN_COLUMNS])
    return _render([name for name, _, _ in CHAIN_COLUMNS], body) if body else ""


def speedup_summary(result: dict) -> dict:
    """{"all" | deployment: (geomean speed-up, rows, rows faster than Humming)} over the rows with
    both a Chord and a Humming time (live Humming, else the committed baseline)."""
    import math

    dep_of = {r.get("scenario"): r.get("deployment") for r in result.get("rows", []) if r.get("deployment")}
    groups: dict = {}
    for c in pivot(result):
        sp = c.get("speedup")
        if not sp:
            continue
        for name in ("all", dep_of.get(c["scenario"])):
            if name:
                groups.setdefault(name, []).append(sp)
    return {name: (math.exp(sum(map(math.log, v)) / len(v)), len(v), sum(x > 1 for x in v))
            for name, v in groups.items()}


def cpu_table(rows: list[dict]) -> str:
    header = ["scenario", "family", "M", "rows", "E", "top_k", "gate_up NxK", "down NxK", "err gate_up",
              "err down", "padding NaN", "check"]
    body = [[r["scenario"], r["family"], str(r["M"]), str(r["rows"]), str(r["experts"]), str(r["top_k"]),
             r["gate_up"], r["down"], _fmt(r["err_gate_up"], ".1e"), _fmt(r["err_down"], ".1e"),
             "yes" if r["padding_untouched"] else "NO", r["check"]] for r in rows]
    return _render(header, body)


def write_json(result: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=1, default=str))
    return p


def _html_table(header: list[str], body: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in b) + "</tr>" for b in body)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def figures(result: dict):
    """Two plotly figures (time per scenario, % of floor); raises ImportError without plotly."""
    import plotly.graph_objects as go

    cells = pivot(result)
    labels = [f"{c['scenario']}<br>{c['family']}" for c in cells]
    live = bool(result.get("meta", {}).get("humming", {}).get("live"))
    hum_key = "humming" if live else "humming_committed"
    hum_name = "humming-0.1.20" if live else "humming-0.1.20 (committed file)"
    t = go.Figure()
    p = go.Figure()
    for key, name in (("chord", "chord"), (hum_key, hum_name)):
        y = [c.get(f"{key}_us") for c in cells]
        if not any(v is not None for v in y):
            continue
        lo = [(c[f"{key}_us"] - c[f"{key}_p20"]) if c.get(f"{key}_p20") is not None and c.get(f"{key}_us") else 0
              for c in cells]
        hi = [(c[f"{key}_p80"] - c[f"{key}_us"]) if c.get(f"{key}_p80") is not None and c.get(f"{key}_us") else 0
              for c in cells]
        t.add_bar(name=name, x=labels, y=y, error_y=dict(type="data", array=hi, arrayminus=lo))
        p.add_bar(name=name, x=labels, y=[c.get(f"{key}_pct") for c in cells])
    t.add_scatter(name="floor", x=labels, y=[c.get("floor_us") for c in cells], mode="markers",
                  marker=dict(symbol="line-ew-open", size=18, line=dict(width=2)))
    t.update_layout(title="gate_up + down time (us, median; whiskers p20-p80)", barmode="group",
                    yaxis_type="log", yaxis_title="us")
    p.update_layout(title="% of floor (100 = at the memory/compute floor)", barmode="group",
                    yaxis_title="% of floor", yaxis_range=[0, 105])
    return t, p


def write_html(result: dict, path: str | Path) -> tuple[Path, bool]:
    """HTML page; returns (path, used_plotly). Without plotly: a plain table and a note saying so."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    header, body, live = _table_cells(result)
    meta = result.get("meta", {})
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>chord bench</title>",
             "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}"
             ".note{color:#a33}</style></head><body>",
             f"<h2>chord bench: {html.escape(str(meta.get('suite_name', '')))} on {html.escape(str(meta.get('gpu')))}</h2>",
             f"<p>commit {html.escape(str(meta.get('commit')))}, {html.escape(str(meta.get('timestamp')))}; "
             f"ceilings {html.escape(json.dumps(meta.get('ceilings')))}</p>"]
    if not live:
        parts.append("<p class='note'>Humming was not run in these runs: its numbers come from the committed "
                     "baseline file (measured 2026-11-29), not from this run.</p>")
    used_plotly = False
    try:
        t, pf = figures(result)
        parts.append(t.to_html(full_html=False, include_plotlyjs=True))
        parts.append(pf.to_html(full_html=False, include_plotlyjs=False))
        used_plotly = True
    except ImportError:
        parts.append("<p class='note'>plotly is not installed: charts are left out, plain table only "
                     "(pip install plotly).</p>")
    parts.append(_html_table(header, body))
    parts.append("<p>times: triton do_bench median of gate_up + down (us); %fl = 100 * floor / time; "
                 "speed-up = humming / chord.</p></body></html>")
    p.write_text("\n".join(parts))
    return p, used_plotly


def write_all(result: dict, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    j = write_json(result, out_dir / "results.json")
    h, _ = write_html(result, out_dir / "report.html")
    (out_dir / "table.txt").write_text(terminal_table(result) + "\n")
    return [j, h, out_dir / "table.txt"]
