"""Writes (or checks) results/index.json: one entry per recorded result file of the project.

Recorded files live in two places: ``chord/data/results/`` (what the notebooks, the workbench
and ``chord bench`` read: shipped in the wheel) and ``results/`` (every other raw result of the
H200 runs, kept in the repository only). Each entry: the file's path, the date of the run (from
its name), the commit of the measured tree as the file records it (null where it records none),
the commit that added the file to the repository, the GPU, the kind and what it is.

    python tools/results_index.py          # rewrite results/index.json
    python tools/results_index.py --check  # exit 1 when the index is out of date
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("chord/data/results", "results")
INDEX = ROOT / "results" / "index.json"
NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-(h200|h100)-(.+)\.(json|md|txt)$")

GPUS = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}  # the name's <gpu>, for files that record none
KINDS = (  # (substring of the name, kind, what)
    ("capture-nsys", "capture", "`chord profile --tool nsys` summary: GPU time per NVTX range and per kernel"),
    ("capture", "capture", "`chord profile --tool torch` summary: GPU time per NVTX range and per kernel"),
    ("tuning", "tuning", "`chord tune` points: every candidate schedule's time per suite GEMM"),
    ("policy-heuristic", "suite run", "`chord bench` of the suite under `--policy heuristic`"),
    ("policy-profile", "suite run", "`chord bench` of the suite under `--policy profile` (paired with a heuristic run)"),
    ("profile-ab", "A/B suite run", "`chord bench` of a few scenarios under two profiles, Humming live (file's own meta)"),
    ("layout-ablation", "A/B timing", "tools/layout_ablation.py: tile-grouped vs tile-major weight layout"),
    ("eager-issue6", "suite run", "`chord bench --no-cuda-graph`: eager calls, host and launch time included"),
    ("timing", "A/B timing", "Chord-only timings of one question (file's own `about`)"),
    ("stamps", "stamps", "`chord stamps`: per-CTA time stamps of a gate_up + down graph (launch, ramp, span, tail)"),
    ("limits", "limits", "`chord limits` table: Nsight Compute counters and the limiter per suite GEMM"),
    ("host-time", "host time", "tools/host_time.py: host time per call, Chord and Humming"),
    ("table", "suite run", "`chord bench` terminal table of a repeat run of the suite"),
)


def _meta(path: Path) -> dict:
    if path.suffix != ".json":
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return {}
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    return {"commit": meta.get("commit") or data.get("commit"), "gpu": meta.get("gpu") or data.get("gpu"),
            "humming_live": (meta.get("humming") or {}).get("live") if isinstance(meta.get("humming"), dict) else None}


def _kind(rest: str) -> tuple[str, str]:
    for key, kind, what in KINDS:
        if (rest.startswith(key) if kind == "capture" else key in rest):  # "-after-capture-fix" is a suite run
            return kind, what
    return "suite run", "`chord bench` of the whole suite"


def added_in(path: Path) -> str | None:
    """The commit that added this file at its path, None without git history (a file moved here
    keeps the commit that first added it: the index's earlier entry is kept, see build)."""
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h", "--", str(path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else None


def entry(path: Path) -> dict:
    m = NAME.match(path.name)
    if not m:
        raise ValueError(f"{path}: a result file is named <YYYY-MM-DD>-<gpu>-<what>.<json|md|txt>")
    kind, what = _kind(m.group(3))
    meta = _meta(path)
    if meta.get("humming_live") is not None and kind == "suite run":
        what += "; Humming 0.1.20 " + ("run live on the same GPU" if meta["humming_live"] else "from the committed file")
    return {"file": str(path.relative_to(ROOT)), "date": m.group(1), "commit": meta.get("commit"),
            "gpu": meta.get("gpu") or GPUS[m.group(2)], "kind": kind, "what": what,
            "shipped": path.parent == ROOT / FOLDERS[0]}


def files() -> list[Path]:
    return sorted((p for f in FOLDERS for p in (ROOT / f).iterdir()
                   if p.is_file() and p.name not in ("index.json", "README.md")), key=lambda p: (p.name, str(p)))


def build(previous: dict | None = None, *, history: bool = True) -> list[dict]:
    """The index; `added_in` kept from `previous` entries, else from git (history=True)."""
    prev = {e["file"]: e for e in (previous or {}).get("files", [])}
    out = []
    for p in files():
        e = entry(p)
        e["added_in"] = prev.get(e["file"], {}).get("added_in") or (added_in(p) if history else None)
        out.append(e)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with results/index.json instead of writing it")
    a = ap.parse_args(argv)
    about = ("Recorded result files of Chord's H200 (and H100) runs. `commit`: the measured tree as the file records it "
             "(+dirty: with uncommitted changes; null: the file records none), `added_in`: the commit that added "
             "the file, `shipped`: in the wheel (chord/data/results, what the notebooks and the workbench read).")
    if a.check:
        old = json.loads(INDEX.read_text())
        new = build(old, history=False)
        if old.get("files") != new or old.get("about") != about:
            print("results/index.json is out of date: run python tools/results_index.py", file=sys.stderr)
            return 1
        return 0
    old = json.loads(INDEX.read_text()) if INDEX.is_file() else None
    INDEX.write_text(json.dumps({"about": about, "files": build(old)}, indent=1) + "\n")
    print(f"wrote {INDEX.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
