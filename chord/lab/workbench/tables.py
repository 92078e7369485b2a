"""Tables a reader can read: every value whole (no id or header is ever cut), in JupyterLab an
HTML table whose cells do not wrap (a wide table scrolls sideways instead of folding each row
over two lines), elsewhere (a script, a terminal) the same table as aligned text.

``show(header, body)`` displays one; ``show_rows(rows)`` builds it from dicts;
``show_bench(result)`` is a ``chord bench`` result (its provenance, the Humming line and the
per-scenario table).
"""
from __future__ import annotations

import html
import math

CSS = ("border-collapse:collapse;font-family:var(--jp-code-font-family,monospace);"
       "font-size:var(--jp-code-font-size,12px)")
CELL = "white-space:nowrap;padding:1px 8px;text-align:left;border-bottom:1px solid #ddd"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel), False in a script."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the workbench extra
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def cell(v, spec: str = ".1f") -> str:
    """A value as the table shows it: floats with `spec`, None / NaN as '-', lists comma-joined."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return format(v, spec)
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


def text(header: list[str], body: list[list[str]], title_lines=()) -> str:
    """The table as aligned text, every column as wide as its widest value."""
    widths = [max([len(h), *(len(b[i]) for b in body)]) for i, h in enumerate(header)]
    lines = list(title_lines)
    if lines:
        lines.append("")
    lines += ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
              "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)).rstrip() for b in body]
    return "\n".join(lines)


def html_table(header: list[str], body: list[list[str]], title_lines=()) -> str:
    """The table as HTML: cells never wrap, a wide table scrolls sideways."""
    head = "".join(f"<th style='{CELL}'>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td style='{CELL}'>{html.escape(v)}</td>" for v in b) + "</tr>" for b in body)
    titles = "".join(f"<div style='white-space:pre-wrap'>{html.escape(t)}</div>" for t in title_lines)
    return (f"<div>{titles}<div style='overflow-x:auto'><table style='{CSS}'><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table></div></div>")


def show(header: list[str], body: list[list[str]], title_lines=()) -> None:
    """Display the table: HTML (with the text as its plain form) in a notebook, text elsewhere."""
    plain = text(header, body, title_lines)
    if in_notebook():
        from IPython.display import display

        display({"text/html": html_table(header, body, title_lines), "text/plain": plain}, raw=True)
    else:
        print(plain)


def rows_table(rows: list[dict], columns: list[str] | None = None, formats: dict | None = None):
    """(header, body) of dict rows: `columns` (default: every key, in first-seen order), floats
    formatted by `formats[column]` (default ``.1f``)."""
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    formats = formats or {}
    return columns, [[cell(r.get(c), formats.get(c, ".1f")) for c in columns] for r in rows]


def show_rows(rows: list[dict], columns: list[str] | None = None, title: str | None = None,
              formats: dict | None = None) -> None:
    header, body = rows_table(rows, columns, formats)
    show(header, body, [title] if title else ())


def bench_title(result: dict, where: str | None = None) -> list[str]:
    """The lines above a bench table: where the numbers come from (`where`, default
    chord.lab.workbench.data.where_results_come_from), the ceilings, how Humming was measured and
    what the columns mean."""
    from chord.lab.bench import report
    from chord.lab.workbench.data import where_results_come_from

    meta = result.get("meta", {})
    c = meta.get("ceilings", {})
    return [where or where_results_come_from(result),
            f"suite {meta.get('suite_name', '?')}; ceilings: copy {report._fmt(c.get('copy_TB_per_s'), '.3f')} TB/s, "
            f"bf16 {report._fmt(c.get('bf16_matmul_TFLOP_per_s'), '.1f')} TFLOP/s",
            report.humming_line(result), report.NOTE]


def _packaged_suite(name: str | None):
    """The packaged suite file whose name a result records (None: the default suite)."""
    from chord.lab.bench.suite import SUITES_DIR, load_suite

    for path in sorted(SUITES_DIR.glob("*.json")):
        if name and load_suite(path).name == name:
            return path
    return None


def decisions_since(result: dict) -> list[str]:
    """For a recorded result (``meta["file"]``): the rows whose Chord schedules are not what the
    selection policy in use picks today, as ``"<scenario> <family>: <gemm> <recorded> -> <today>"``
    (empty for a live result, or when every row is today's decision)."""
    from chord.lab.bench import report
    from chord.lab.workbench.explore import todays_schedules

    meta = result.get("meta", {})
    if not meta.get("file"):
        return []
    suite = _packaged_suite(meta.get("suite_name"))
    out = []
    for c in report.pivot(result):
        if not c.get("chord_schedule"):
            continue
        today = todays_schedules(c["scenario"], c["family"], suite)
        for gemm, was in (("gate_up", c.get("chord_schedule")), ("down", c.get("chord_schedule_down"))):
            if was and was != today[gemm]:
                out.append(f"{c['scenario']} {c['family']}: {gemm} {was} -> {today[gemm]}")
    return out


def show_bench(result: dict, where: str | None = None) -> None:
    """A `chord bench` result as one table (chord.lab.bench.report's columns) under its title lines;
    a recorded result also says whether its schedules are today's decisions (:func:`decisions_since`)."""
    from chord.lab.bench import report

    header, body, _ = report._table_cells(result)
    title = bench_title(result, where)
    if result.get("meta", {}).get("file"):
        changed = decisions_since(result)
        title.append("recorded under other decisions than today's for: " + "; ".join(changed) if changed else
                     "every recorded row ran the schedules today's policy picks")
    show(header, body, title)


def show_pairs(pairs: list[dict], on: str, off: str, title: str | None = None) -> None:
    """A recorded A/B's knob pairs (chord.lab.workbench.data.knob_pairs): per GEMM the schedule with
    the knob on, both times and the change, ids whole."""
    rows = [{"run": p["run"], "scenario": p["scenario"], "family": p["family"], "gemm": p["gemm"],
             f"{on} schedule": p[f"{on}_schedule"], f"{off} us": p[f"{off}_us"], f"{on} us": p[f"{on}_us"],
             "change": f"{p[f'{on}_us'] / p[f'{off}_us'] - 1:+.1%}", "same bits": p["same_bits"]} for p in pairs]
    show_rows(rows, title=title)
