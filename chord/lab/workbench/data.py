"""Where a notebook's numbers come from: a live GPU, or the recorded H200 results.

The recorded data the notebooks read ships inside the package (a wheel carries it): the `chord
bench` / `chord tune` / A/B timing / capture files in ``chord/data/results/`` and the notebooks'
measured tables in ``chord/data/notebooks/``. Every other raw result of the project's H200 runs
lives in the source repository's top-level ``results/`` folder (``results/index.json``).
"""
from __future__ import annotations

import json
from pathlib import Path

from chord import _env
PACKAGE_DATA = Path(__file__).resolve().parents[2] / "data"
RESULTS_DIR = PACKAGE_DATA / "results"


def shown(path: Path) -> str:
    """How a recorded file is named to a reader: its path inside the package (``chord/data/...``)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(PACKAGE_DATA.parent.parent))
    except ValueError:
        return str(path)


def recorded_file(name: str) -> str:
    """The shown path of the recorded result file `name` (``chord/data/results/<name>``)."""
    return shown(RESULTS_DIR / name)


def gpu_available() -> bool:
    """True when Chord's kernels can run here (a CUDA device of compute capability 9.0)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0))


def _run_order(path: Path) -> tuple:
    """Date in the name, then the run's own timestamp (several runs of one day differ only by
    commit hash), then the name."""
    stamp = ""
    if "tuning" not in path.name:
        try:
            stamp = str(json.loads(path.read_text()).get("meta", {}).get("timestamp", ""))
        except (OSError, ValueError):
            stamp = ""
    return path.name[:10], stamp, path.name


def _committed(name: str | None, pattern: str, what: str) -> Path:
    """chord/data/results/<name>.json, or the newest file matching `pattern` when name is None."""
    if name is None:
        kinds = ("tuning", "capture", "policy", "layout", "timing")  # other result kinds share the folder
        own = [k for k in kinds if k in pattern]
        runs = sorted((p for p in RESULTS_DIR.glob(pattern) if own or not any(k in p.name for k in kinds)),
                      key=_run_order)
        if not runs:
            raise FileNotFoundError(f"no committed H200 {what} in {RESULTS_DIR}")
        return runs[-1]
    path = RESULTS_DIR / (name if name.endswith(".json") else f"{name}.json")
    if not path.is_file():
        raise FileNotFoundError(f"no committed {what} {path.name} in {RESULTS_DIR}")
    return path


#: the suite whose newest committed run `recorded_results` shows by default
DEFAULT_SUITE_NAME = "kimi-k2-h200"


def _suite_of(path: Path) -> str:
    try:
        return str(json.loads(path.read_text()).get("meta", {}).get("suite_name", ""))
    except (OSError, ValueError):
        return ""


def recorded_results(name: str | None = None, suite: str | None = None) -> dict:
    """A committed `chord bench` result (``{"meta", "rows"}``): the newest H200 run of `suite`
    (a suite's name, default the Kimi K2 H200 suite; ``kimi-k2-h200-large-ep`` for EP16 / EP32),
    or ``chord/data/results/<name>.json``."""
    if name is None:
        want = suite or DEFAULT_SUITE_NAME
        kinds = ("tuning", "capture", "policy", "layout", "timing")
        runs = sorted((p for p in RESULTS_DIR.glob("*-h200-*.json")
                       if not any(k in p.name for k in kinds) and _suite_of(p) == want), key=_run_order)
        if not runs:
            raise FileNotFoundError(f"no committed H200 bench results of suite {want!r} in {RESULTS_DIR}")
        name = runs[-1].name
    path = _committed(name, "*-h200-*.json", "bench results")
    data = json.loads(path.read_text())
    data.setdefault("meta", {})["file"] = path.name
    return data


def where_results_come_from(result: dict) -> str:
    """One line for the notebook to print above a table or figure."""
    meta = result.get("meta", {})
    if meta.get("file"):
        why = "; no sm_90 GPU here, so nothing was measured live" if not gpu_available() else \
            " (the committed suite run, shown as recorded)"
        return (f"recorded: {meta.get('gpu', '?')}, commit {meta.get('commit', '?')}, {meta.get('timestamp', '?')} "
                f"({recorded_file(meta['file'])}){why}")
    return f"live: {meta.get('gpu', '?')}, commit {meta.get('commit', '?')}, {meta.get('timestamp', '?')}"


def recorded_tuning(name: str | None = None) -> list[dict]:
    """The points of a committed `chord tune` run (every candidate's time per suite GEMM): the
    newest H200 one by default, or ``chord/data/results/<name>.json``."""
    path = _committed(name, "*-h200-tuning.json", "tuning points")
    points = json.loads(path.read_text())
    for p in points:
        p["file"] = path.name
    return points


def recorded_timing(name: str) -> list[dict]:
    """The rows of a committed Chord-only A/B timing file (``chord/data/results/<name>.json``:
    ``{"about", "code", "runs": [{"run", "rows"}]}``, each run one machine instance), each row with
    its ``run`` and ``file``: compare rows of one run only."""
    path = _committed(name, "", "A/B timings")
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"recorded_timing: {path.name} is not an A/B timing file (no 'runs' list)")
    return [{**r, "run": run["run"], "file": path.name} for run in data["runs"] for r in run["rows"]]


def knob_pairs(rows: list[dict], knob: str, off_value, on_label: str = "on", off_label: str = "off") -> list[dict]:
    """Rows of an A/B timing (:func:`recorded_timing`) paired by one knob: each schedule with
    `knob` on next to its twin with `knob` = `off_value` timed in the same run, one row per pair
    (scenario, family, gemm, run, ``<label>_us``, ``<label>_schedule``, ``same_bits``: both timed
    against one first schedule and bit-identical to it, and the ``file`` they were read from), the
    form `figures.ablation_figure` draws."""
    from chord.schedule import Schedule, override

    by = {(r["run"], r["scenario"], r["family"], r["gemm"], r["schedule"]): r for r in rows}
    out, seen = [], set()
    for (run, sc, fam, gemm, sid), r in by.items():
        try:
            s = Schedule.from_id(sid)
        except ValueError:  # a schedule an earlier version of the kernels allowed (e.g. a smaller static smem)
            continue
        if getattr(s, knob) == off_value:
            continue
        try:
            twin_id = override(s, **{knob: off_value}).id
        except ValueError:  # no valid twin
            continue
        twin = by.get((run, sc, fam, gemm, twin_id))
        if twin is None or (run, sc, fam, gemm, sid) in seen:
            continue
        seen.add((run, sc, fam, gemm, sid))
        out.append({"scenario": sc, "family": fam, "gemm": gemm, "run": run,
                    f"{on_label}_us": r["us"], f"{on_label}_schedule": sid,
                    f"{off_label}_us": twin["us"], f"{off_label}_schedule": twin_id,
                    "same_bits": bool(r.get("same_bits")) and bool(twin.get("same_bits")), "file": r.get("file")})
    return out


def recorded_capture(scenario: str | None = None, family: str | None = None) -> dict:
    """A committed `chord capture --tool torch` summary (chord.lab.capture.Capture.as_dict): the newest
    H200 one for `scenario` / `family` (any when None)."""
    pattern = f"*-h200-capture-{scenario or '*'}-{family or '*'}.json"
    path = _committed(None, pattern, f"capture for {scenario or 'any scenario'} {family or ''}".strip())
    data = json.loads(path.read_text())
    data["file"] = path.name
    return data


def best_by(points: list[dict], groups: dict) -> list[dict]:
    """Per tuning point, the fastest timed schedule of each group: ``groups`` maps a label to a
    predicate on a `chord.schedule.Schedule` (e.g. ``{"mma": lambda s: s.mainloop == "mma"}``).
    A row per point: scenario, family, gemm, rows_per_expert, then ``<label>_us`` and
    ``<label>_schedule`` (None where no candidate of that group was timed)."""
    from chord.schedule import Schedule

    rows = []
    for p in points:
        row = {k: p[k] for k in ("scenario", "family", "gemm", "rows_per_expert")}
        timed = [(Schedule.from_id(sid), us) for sid, us in p["timings"].items()]
        for label, pred in groups.items():
            cand = [(us, s.id) for s, us in timed if pred(s)]
            best = min(cand) if cand else (None, None)
            row[f"{label}_us"], row[f"{label}_schedule"] = best
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# chord/data/notebooks: the tables a notebook measured live on an H200, committed as CSV so the same
# notebook shows them without a GPU

DATA_DIR = PACKAGE_DATA / "notebooks"
DATA_OUT_ENV = "CHORD_NOTEBOOK_DATA_OUT"  # a folder: live notebook runs write their tables there


def _cell(v: str):
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return {"True": True, "False": False, "": None}.get(v, v)


def save_table(name: str, rows: list[dict], what: str, out_dir: str | Path | None = None) -> Path | None:
    """Writes `rows` (dicts with the same keys) to ``<out_dir>/<name>.csv`` with a first comment
    line: GPU, commit, UTC time and `what` was measured. `out_dir` defaults to
    $CHORD_NOTEBOOK_DATA_OUT; with neither, nothing is written (returns None)."""
    import csv
    import datetime

    out_dir = out_dir or _env.get(DATA_OUT_ENV)
    if not out_dir or not rows:
        return None
    import torch

    from chord.lab.bench.runner import git_commit

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = Path(out_dir) / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        f.write(f"# {gpu}, commit {git_commit()}, {stamp}: {what}\n")
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in keys})
    return path


def recorded_table(name: str) -> tuple[list[dict], str]:
    """(rows, the file's provenance line) of the committed ``chord/data/notebooks/<name>.csv``."""
    import csv

    path = DATA_DIR / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no committed notebook table {path.name} in {DATA_DIR}")
    with path.open(newline="") as f:
        first = f.readline()
        if not first.startswith("# "):
            raise ValueError(f"{path}: the first line must be '# <gpu>, commit <sha>, <time>: <what>'")
        rows = [{k: _cell(v) for k, v in r.items()} for r in csv.DictReader(f)]
    return rows, f"recorded: {first[2:].strip()} (chord/data/notebooks/{path.name}); no sm_90 GPU here, so nothing ran live"


def live_or_recorded(name: str, measure, what: str) -> tuple[list[dict], str]:
    """The one switch of a notebook's measured table: with an sm_90 GPU, ``measure()`` (its rows
    are also saved by :func:`save_table` when $CHORD_NOTEBOOK_DATA_OUT is set); without one, the
    committed ``chord/data/notebooks/<name>.csv``. Returns (rows, where they come from)."""
    if gpu_available():
        rows = measure()
        import torch

        path = save_table(name, rows, what)
        return rows, f"live: {torch.cuda.get_device_name()}" + (f" (saved to {path})" if path else "")
    return recorded_table(name)
