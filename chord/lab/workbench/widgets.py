"""ipywidgets builders for the notebooks: a slider (and pickers) -> a decision -> figures updated
in place. ipywidgets and plotly are imported when a builder is called."""
from __future__ import annotations

from chord.lab.workbench.explore import KIMI, sweep_tok_e
from chord.lab.workbench.figures import decision_html, sweep_figure

TOK_E_GRID = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
POLICIES = ("profile", "heuristic", "heuristic,-tok_e_block_m", "heuristic,-wave_aware_bn", "heuristic,-split_k_gate")


def tok_e_explorer(deployment: str = "ep8", family: str = "indexed", gemm: str = "gate_up", tok_e: int = 64,
                   policy: str = "profile"):
    """A tok_e slider and deployment / family / GEMM / selection-policy pickers over the decision
    of `chord.schedule` (the policy picker switches the heuristic's rules off one at a time).

    Returns ``(box, state)``: ``box`` is the widget to display; ``state`` exposes the parts
    (``slider``, ``html``, ``figure``, ``row()``) so a notebook cell or a test can drive it.
    """
    import ipywidgets as W

    slider = W.SelectionSlider(options=list(TOK_E_GRID), value=tok_e, description="tok_e", continuous_update=False)
    dep = W.Dropdown(options=list(KIMI), value=deployment, description="deployment")
    fam = W.Dropdown(options=["indexed", "grouped_contiguous", "grouped_masked"], value=family, description="family")
    gem = W.Dropdown(options=["gate_up", "down"], value=gemm, description="GEMM")
    pol = W.Dropdown(options=list(POLICIES), value=policy, description="policy")
    role = W.Dropdown(options=["both", "decode", "prefill"], value="both", description="role")
    out = W.HTML()
    fig = sweep_figure(sweep_tok_e(deployment, family, gemm, TOK_E_GRID, policy=policy), widget=True)

    class State:
        pass

    state = State()
    state.slider, state.html, state.figure, state.policy = slider, out, fig, pol

    def current():
        return sweep_tok_e(dep.value, fam.value, gem.value, [slider.value], policy=pol.value, role=role.value)[0]

    def redraw_sweep(_=None):
        rows = sweep_tok_e(dep.value, fam.value, gem.value, TOK_E_GRID, policy=pol.value, role=role.value)
        fresh = sweep_figure(rows)
        with fig.batch_update():
            by_name = {t.name: t for t in fresh.data}
            for trace in fig.data:
                if trace.name in by_name and trace.name != "selected":
                    trace.x, trace.y = by_name[trace.name].x, by_name[trace.name].y
            fig.layout.title.text = fresh.layout.title.text
        refresh()

    def refresh(_=None):
        row = current()
        out.value = decision_html(row)
        selected = next(t for t in fig.data if t.name == "selected")
        with fig.batch_update():
            selected.x, selected.y, selected.text = [row["tok_e"]], [row["block_m"]], [row["schedule"]]

    state.row = current
    slider.observe(refresh, names="value")
    for w in (dep, fam, gem, pol, role):
        w.observe(redraw_sweep, names="value")
    refresh()
    state.role = role
    box = W.VBox([W.HBox([dep, fam, gem]), W.HBox([pol, role]), slider, out, fig])  # two rows: no scrollbar
    return box, state
