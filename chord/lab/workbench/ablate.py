"""A notebook's measured ablation: suite GEMM points x variants of the schedule decision.

A *variant* is a label and how to get a schedule for a point: a selection policy
(``"profile"``, ``"heuristic"``, ``"heuristic,-wave_aware_bn"``: `chord.schedule.select` with
that policy) or an optimization of `chord.optimizations` switched off on the profile's
schedule. Every distinct schedule of a point is timed once by `chord.lab.tune.time_schedules` (the
inputs `chord tune` uses, do_bench median of a CUDA-graph replay, output compared with the
first variant's). Live on an sm_90 GPU (and saved as ``chord/data/notebooks/<name>.csv`` when
$CHORD_NOTEBOOK_DATA_OUT is set), else the committed table of the same name.
"""
from __future__ import annotations

from chord.lab.workbench.data import live_or_recorded


def policy(text: str):
    """Variant: the schedule `select` gives under the policy `text` (checked here, not at the
    first point)."""
    from chord.schedule import parse_policy, select

    pol = parse_policy(text)
    return lambda prof, prob: select(prof, prob, pol)


def rule_variants(rule: str, off_label: str) -> tuple[list[str], dict]:
    """(labels, variants) of a heuristic rule's ablation: the heuristic policy, the same with
    `rule` switched off (labelled `off_label`) and the tuned profile, in that order."""
    from chord.schedule import POLICY_RULES

    if rule not in POLICY_RULES:
        raise ValueError(f"ablate.rule_variants: rule must be one of the heuristic's rules ({', '.join(POLICY_RULES)}), "
                         f"got {rule!r}")
    labels = ["heuristic", off_label, "profile"]
    return labels, {"heuristic": policy("heuristic"), off_label: policy(f"heuristic,-{rule}"),
                    "profile": policy("profile")}


def knob_off(name: str):
    """Variant: the profile's schedule with the optimization `name` switched off (None when the
    schedule does not use it: that point has no such variant)."""
    from chord import optimizations
    from chord.schedule import select

    o = optimizations.BY_NAME.get(name)
    if o is None or o.kind != "knob" or o.status != optimizations.IMPLEMENTED:
        knobs = sorted(x.name for x in optimizations.implemented_knobs())
        raise ValueError(f"ablate.knob_off: name must be an implemented knob optimization of chord.optimizations "
                         f"({', '.join(knobs)}), got {name!r}")

    def make(prof, prob):
        s = select(prof, prob, "profile")
        return o.switch_off(s) if o.is_on(s) else None

    return make


def _point(scenario: str, family: str, gemm: str):
    from chord.lab.bench.suite import load_suite
    from chord.schedule import profile_for

    sc = load_suite().scenario(scenario)
    n, k, prob = sc.gemm_problem(family, gemm)
    return sc, profile_for(family, sc.experts, n, k), prob


def schedules(points, variants: dict) -> list[dict]:
    """For each point (scenario, family, gemm) and variant label: the schedule id it gives (None:
    the variant does not apply). Pure: no GPU."""
    out = []
    for scenario, family, gemm in points:
        sc, prof, prob = _point(scenario, family, gemm)
        for label, make in variants.items():
            s = make(prof, prob)
            out.append({"scenario": scenario, "family": family, "gemm": gemm, "rows_per_expert": sc.rows_per_expert,
                        "variant": label, "schedule": s.id if s is not None else None})
    return out


def measure(points, variants: dict, rep_ms: float = 20.0) -> list[dict]:
    """Times every distinct schedule of each point once (sm_90 GPU): a row per (point, variant)
    with its µs, TFLOP/s and the output's agreement with the first variant's schedule."""
    from chord.lab import tune

    rows = schedules(points, variants)
    out = []
    for scenario, family, gemm in points:
        mine = [r for r in rows if (r["scenario"], r["family"], r["gemm"]) == (scenario, family, gemm)
                and r["schedule"] is not None]
        ids = list(dict.fromkeys(r["schedule"] for r in mine))
        timed = {t["schedule"]: t for t in tune.time_schedules(scenario, family, gemm, ids, rep_ms=rep_ms)}
        sc, _, prob = _point(scenario, family, gemm)
        flops = 2.0 * sc.rows * prob.n * prob.k
        for r in mine:
            t = timed[r["schedule"]]
            out.append({**r, "us": round(t["us"], 2), "TFLOP_per_s": round(flops / t["us"] / 1e6, 1),
                        "same_bits_as_first": bool(t["same_bits"]), "rel_err_vs_first": float(t["rel_err"])})
    return out


def ablation(name: str, points, variants: dict, what: str, rep_ms: float = 20.0) -> tuple[list[dict], str]:
    """(rows, where they come from): `measure` live, or the committed chord/data/notebooks/<name>.csv.
    A recorded table whose schedules are no longer what the variants select (a rule or the
    profile changed since it was measured) says so in `where`, naming the rows (:func:`stale_rows`)."""
    rows, where = live_or_recorded(name, lambda: measure(points, variants, rep_ms), what)
    if where.startswith("recorded"):
        stale = stale_rows(rows, points, variants)
        if stale:
            where += ("\nrecorded with other decisions than today's for: "
                      + "; ".join(f"{r['scenario']} {r['family']} {r['gemm']} {r['variant']} (recorded {r['recorded']}, "
                                  f"now {r['now']})" for r in stale))
    return rows, where


def stale_rows(rows: list[dict], points, variants: dict) -> list[dict]:
    """The (point, variant) rows of a recorded table whose schedule is not the one the variant
    selects now (pure: no GPU), each with its `recorded` and `now` schedule ids."""
    recorded = {(r["scenario"], r["family"], r["gemm"], r["variant"]): r["schedule"] for r in rows}
    out = []
    for r in schedules(points, variants):
        key = (r["scenario"], r["family"], r["gemm"], r["variant"])
        if key in recorded and r["schedule"] is not None and recorded[key] != r["schedule"]:
            out.append({"scenario": key[0], "family": key[1], "gemm": key[2], "variant": key[3],
                        "recorded": recorded[key], "now": r["schedule"]})
    return out


def rule_ablation(name: str, rule: str, off_label: str, points, what: str,
                  rep_ms: float = 20.0) -> tuple[list[dict], list[str]]:
    """A heuristic rule's ablation in one call, as the notebooks show it: the variants of
    :func:`rule_variants` on `points` (:func:`ablation`, live or the committed table `name`),
    printed with where they come from and as :func:`table`. Returns (rows, labels)."""
    labels, variants = rule_variants(rule, off_label)
    rows, where = ablation(name, points, variants, what, rep_ms)
    show_table(rows, labels, where)
    return rows, labels


def table_cells(rows: list[dict], labels: list[str]) -> tuple[list[str], list[list[str]]]:
    """(header, body): one row per point, µs and schedule id of each variant and each variant's
    time over the first's, every id and label whole (chord.lab.workbench.tables)."""
    from chord.lab.workbench.tables import cell

    keys = list(dict.fromkeys((r["scenario"], r["family"], r["gemm"]) for r in rows))
    header = ["scenario", "family", "gemm", *(f"{lb} us" for lb in labels),
              *(f"{lb} / {labels[0]}" for lb in labels[1:]), *(f"{lb} schedule" for lb in labels)]
    body = []
    for key in keys:
        by = {r["variant"]: r for r in rows if (r["scenario"], r["family"], r["gemm"]) == key}
        us = [by.get(lb, {}).get("us") for lb in labels]
        rel = [u / us[0] if u and us[0] else None for u in us[1:]]
        body.append([*key, *(cell(u) for u in us), *(cell(x, ".2f") for x in rel),
                     *(cell(by.get(lb, {}).get("schedule")) for lb in labels)])
    return header, body


def table(rows: list[dict], labels: list[str]) -> str:
    """:func:`table_cells` as aligned text."""
    from chord.lab.workbench.tables import text

    return text(*table_cells(rows, labels))


def show_table(rows: list[dict], labels: list[str], where: str | None = None) -> None:
    """:func:`table_cells` displayed (an HTML table in JupyterLab) under the line `where`."""
    from chord.lab.workbench.tables import show

    show(*table_cells(rows, labels), [where] if where else ())


def figure_rows(rows: list[dict], labels: list[str]) -> list[dict]:
    """The rows as `chord.lab.workbench.figures.ablation_figure` wants them (``<label>_us`` columns)."""
    keys = list(dict.fromkeys((r["scenario"], r["family"], r["gemm"]) for r in rows))
    out = []
    for key in keys:
        by = {r["variant"]: r for r in rows if (r["scenario"], r["family"], r["gemm"]) == key}
        row = {"scenario": key[0], "family": key[1], "gemm": key[2]}
        for lb in labels:
            row[f"{lb}_us"] = by.get(lb, {}).get("us")
        out.append(row)
    return out


# ---- pair ablations: the gate_up + down pair as the bench times it (an optimization whose
# effect is between the two calls, e.g. programmatic dependent launch, shows only there)


def pair_schedules(points, variants: dict) -> list[dict]:
    """For each (scenario, family) point and variant label: the (gate_up, down) schedule ids of the
    profile's decision with the variant's knob values set (``variants``: label -> {knob: value};
    an empty dict is the profile itself). Pure: no GPU."""
    from chord.lab.bench import runner
    from chord.lab.bench.suite import load_suite
    from chord.schedule import gpu_profile_name, override

    out = []
    for scenario, family in points:
        sc = load_suite().scenario(scenario)
        if family not in sc.families:
            raise ValueError(f"pair_schedules: scenario {scenario} runs families {sc.families}, got {family!r}")
        prof = runner.ChordAPI.profile(gpu_profile_name(), sc)
        s1, s2 = runner.scenario_schedules(family, sc, prof)
        for label, knobs in variants.items():
            v1, v2 = override(s1, **knobs), override(s2, **knobs)
            out.append({"scenario": scenario, "family": family, "variant": label, "gate_up": v1.id, "down": v2.id})
    return out


def measure_pairs(points, variants: dict, rep_ms: float = 50.0, warmup_ms: float = 100.0) -> list[dict]:
    """Times each point's gate_up + down pair under every variant (sm_90 GPU), as `chord bench`
    does: the bench's inputs, do_bench median of a CUDA-graph replay of both calls, and eager
    calls (host and launch time counted); outputs compared bit for bit with the first variant's."""
    import torch

    from chord.lab.bench import inputs as I
    from chord.lab.bench import runner, timing
    from chord.schedule import Schedule

    plan = pair_schedules(points, variants)
    out = []
    for scenario, family in points:
        sc, w13, w2, data, fi = I.one_scenario(None, scenario, family, 0, "cuda", who="pair ablation")
        first = None
        for r in (r for r in plan if (r["scenario"], r["family"]) == (scenario, family)):
            s1, s2 = Schedule.from_id(r["gate_up"]), Schedule.from_id(r["down"])
            gate_up, down, gu, dn, _ = runner._chord_calls(family, sc, data, fi, w13, w2, None, schedules=(s1, s2))

            def both(gate_up=gate_up, down=down):
                gate_up()
                down()

            both()
            torch.cuda.synchronize()
            got = (gu.clone(), dn.clone())
            same = first is None or all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, first))
            first = first or got
            graph = timing.bench(both, warmup_ms=warmup_ms, rep_ms=rep_ms, graph=True)
            eager = timing.bench(both, warmup_ms=warmup_ms, rep_ms=rep_ms)
            out.append({**r, "graph_us": round(graph.p50, 2), "eager_us": round(eager.p50, 2),
                        "same_bits_as_first": bool(same)})
        del sc, w13, w2, data, fi
        torch.cuda.empty_cache()
    return out


def pair_ablation(name: str, points, variants: dict, what: str, rep_ms: float = 50.0) -> tuple[list[dict], str]:
    """(rows, where they come from): :func:`measure_pairs` live, or the committed
    chord/data/notebooks/<name>.csv; where neither exists (not yet run on an H200), no rows and a line
    saying so, never numbers from elsewhere."""
    try:
        return live_or_recorded(name, lambda: measure_pairs(points, variants, rep_ms), what)
    except FileNotFoundError:
        return [], (f"not measured on an H200 yet (no chord/data/notebooks/{name}.csv): run this notebook on one with "
                    f"$CHORD_NOTEBOOK_DATA_OUT set to record it; the schedules it would time are printed below")


def pair_table(rows: list[dict], labels: list[str]) -> str:
    """One line per (scenario, family): graph and eager µs of each variant and each over the first."""
    lines = []
    for key in dict.fromkeys((r["scenario"], r["family"]) for r in rows):
        mine = {r["variant"]: r for r in rows if (r["scenario"], r["family"]) == key}
        base = mine.get(labels[0])
        cells = []
        for lab in labels:
            r = mine.get(lab)
            if r is None:
                continue
            rel = "" if r is base or base is None else (f" ({r['graph_us'] / base['graph_us'] - 1:+.1%} graph, "
                                                        f"{r['eager_us'] / base['eager_us'] - 1:+.1%} eager)")
            cells.append(f"{lab}: {r['graph_us']:.1f} / {r['eager_us']:.1f} us{rel}"
                         + ("" if r["same_bits_as_first"] else " DIFFERENT BITS"))
        lines.append(f"{key[0]:20s} {key[1]:18s} " + "; ".join(cells))
    return "\n".join(lines)
