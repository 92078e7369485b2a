"""Pure functions from rows (chord.lab.workbench.explore) or a bench result to plotly figures.

plotly is imported inside each function (an optional dependency: `pip install chord-moe[workbench]`).
"""
from __future__ import annotations

import html


def decision_html(row: dict) -> str:
    """The decision of one shape, as the notebook shows it under the slider."""
    cands = ", ".join(html.escape(c) for c in row["candidates"])
    return (f"<b>{html.escape(row['deployment'])} {html.escape(row['family'])} {html.escape(row['gemm'])}</b> at "
            f"{row['tok_e']:g} rows/expert ({row['rows']} routed rows): <code>{html.escape(row['schedule'])}</code>"
            f" — {html.escape(row['reason'])}<br>tiles {row['tiles']} on {row['waves']} wave(s), wave efficiency "
            f"{100 * row['wave_efficiency']:.0f} %, padding {100 * row['padding']:.0f} %<br>"
            f"<small>profile {html.escape(row['profile'])} (deployment {html.escape(str(row.get('covered_by', '')))}, "
            f"role {html.escape(str(row.get('role', '')))}); candidates: {cands}</small>")


def sweep_figure(rows: list[dict], marker: dict | None = None, widget: bool = False):
    """block_m, padding and wave efficiency over tokens per expert; `marker` (a decision row) is
    drawn as the "selected" point, the slider's position."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [r["tok_e"] for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=x, y=[r["block_m"] for r in rows], name="block_m", mode="lines+markers",
                             line_shape="hv", text=[r["schedule"] for r in rows],
                             hovertemplate="tok_e %{x}<br>block_m %{y}<br>%{text}<extra></extra>"),
                  secondary_y=False)
    fig.add_trace(go.Scatter(x=x, y=[100 * r["padding"] for r in rows], name="padding %", mode="lines"),
                  secondary_y=True)
    fig.add_trace(go.Scatter(x=x, y=[100 * r["wave_efficiency"] for r in rows], name="wave efficiency %",
                             mode="lines"), secondary_y=True)
    wg = [r["tok_e"] for r in rows if r["mainloop"] == "wgmma"]
    if wg:  # a filled trace in data coordinates (layout shapes on a log axis render inconsistently)
        fig.add_trace(go.Scatter(x=[min(wg), max(wg)], y=[105, 105], fill="tozeroy", mode="none",
                                 fillcolor="rgba(0,128,0,0.10)", name="wgmma main loop", hoverinfo="skip"),
                      secondary_y=True)
    fig.update_xaxes(type="log", title="rows per expert (tok_e)")
    fig.update_yaxes(title="block_m", type="log", secondary_y=False)
    fig.update_yaxes(title="%", range=[0, 105], tickmode="linear", tick0=0, dtick=20, showgrid=False,
                     secondary_y=True)
    fig.update_layout(title=f"{rows[0]['deployment']} {rows[0]['family']} {rows[0]['gemm']}: schedule over tok_e"
                      if rows else "schedule over tok_e", legend=dict(orientation="h", y=-0.3), height=460)
    fig.add_trace(go.Scatter(x=[marker["tok_e"]] if marker else [], y=[marker["block_m"]] if marker else [],
                             name="selected", mode="markers", marker=dict(size=16, symbol="star"),
                             text=[marker["schedule"]] if marker else [],
                             hovertemplate="%{text}<extra>selected</extra>"), secondary_y=False)
    return go.FigureWidget(fig) if widget else fig


def suite_figures(result: dict):
    """The bench's two figures (time per scenario with floors, % of floor) for a result dict."""
    from chord.lab.bench.report import figures

    return figures(result)


def speedup_figure(result: dict):
    """Chord vs Humming speed-up per scenario (> 1: Chord faster)."""
    import plotly.graph_objects as go

    from chord.lab.bench.report import pivot

    cells = [c for c in pivot(result) if c.get("speedup")]
    fig = go.Figure(go.Bar(x=[f"{c['scenario']}<br>{c['family']}" for c in cells],
                           y=[c["speedup"] for c in cells],
                           marker_color=["seagreen" if c["speedup"] >= 1 else "indianred" for c in cells]))
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title="speed-up over humming-kernels 0.1.20 (Humming time / Chord time)",
                      yaxis_title="speed-up")
    return fig


def ablation_figure(rows: list[dict], labels: list[str], title: str):
    """Grouped bars of `<label>_us` per GEMM point (rows from `chord.lab.workbench.data.best_by` or
    live `chord.lab.tune.time_schedules` results pivoted the same way)."""
    import plotly.graph_objects as go

    x = [f"{r['scenario']}<br>{r['family']} {r['gemm']}" for r in rows]
    fig = go.Figure()
    for label in labels:
        fig.add_bar(name=label, x=x, y=[r.get(f"{label}_us") for r in rows],
                    text=[r.get(f"{label}_schedule") for r in rows],
                    hovertemplate="%{x}<br>%{y:.1f} us<br>%{text}<extra>" + label + "</extra>")
    fig.update_layout(title=title, barmode="group", yaxis_title="us (one GEMM, do_bench median)", yaxis_type="log")
    return fig


def capture_figure(cap: dict):
    """Bars of GPU time per call for each `chord/<op>[<schedule id>]` range of a capture
    (chord.lab.capture.Capture.as_dict(), live or from chord.lab.workbench.recorded_capture)."""
    import plotly.graph_objects as go

    rows = [r for r in cap["ranges"] if not r["range"].startswith("chord/profile")]
    fig = go.Figure()
    fig.add_bar(x=[r["range"] for r in rows], y=[r["gpu_us_per_call"] for r in rows],
                text=[f"{r['calls']} calls" for r in rows],
                hovertemplate="%{x}<br>%{y:.1f} us GPU per call<br>%{text}<extra></extra>")
    fig.update_layout(title=f"{cap['scenario']} {cap['family']}: GPU time per call in each Chord range "
                            f"({cap['tool']} capture, {cap['iters']} iterations)",
                      yaxis_title="us of GPU time per call")
    return fig
