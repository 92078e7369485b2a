"""A notebook's own calls, Chord next to upstream humming-kernels 0.1.20.

`compare(scenario, family)` runs the bench (`chord.lab.bench.runner.run_gpu`) on just that scenario
and family: Chord in this process, upstream Humming in a worker subprocess with its own install
directory (both packages own the module name `humming`; the runner's baseline worker is the one
the suite bench uses). The result is the bench's long-format table (``provider`` column), so the
notebook shows it with the same pivot as `chord bench`. Without an sm_90 GPU it returns the
rows of the committed H200 suite run; without an upstream install it says how to get one and
the bench shows the committed baseline file, labelled as such.
"""
from __future__ import annotations

import io
import os
import tempfile

from chord import _env
from chord.lab.workbench.data import gpu_available, recorded_file, recorded_results

INSTALL_HINT = ("upstream Humming is not installed for the live comparison: "
                "pip install --no-deps --target ~/humming-0.1.20 humming-kernels==0.1.20 (or, offline, from a "
                "downloaded wheel: pip install --no-deps --target ~/humming-0.1.20 humming_kernels-0.1.20-*.whl), "
                "then set CHORD_HUMMING_DIR=~/humming-0.1.20 or pass humming_dir=...")


def _install_dir(given: str | None = None) -> str | None:
    """The upstream install to compare with: `given`, else $CHORD_HUMMING_DIR (None: not set)."""
    d = given or _env.get("CHORD_HUMMING_DIR")
    return os.path.expanduser(d) if d else None


def compare(scenario: str, family: str, *, humming_dir: str | None = None, quick: bool = True) -> tuple[dict, str]:
    """(bench result ``{"meta", "rows"}`` of `scenario` x `family`, one line saying where it comes
    from). Live with an sm_90 GPU, else the committed H200 run's rows of that cell."""
    from chord.lab.bench import runner
    from chord.lab.bench.inputs import scenario_for

    scenario_for(None, scenario, family, who="compare")  # a bad id or family is named here, GPU or not
    hd = _install_dir(humming_dir)
    if not gpu_available():
        rec = recorded_results()
        rows = [r for r in rec["rows"] if r.get("scenario") == scenario and r.get("family") == family]
        meta = rec["meta"]
        where = (f"recorded: the {scenario} {family} row of the suite run {recorded_file(meta['file'])} "
                 f"({meta.get('gpu', '?')}, commit {meta.get('commit', '?')}, {meta.get('timestamp', '?')}); "
                 "no sm_90 GPU here, so nothing ran live")
        return {"meta": meta, "rows": rows}, where
    opts = runner.BenchOptions(scenarios=scenario, families=family, humming_dir=hd, quick=quick,
                               out_dir=tempfile.mkdtemp(prefix="chord-compare-"), humming_tuning_rows="matching")
    log = io.StringIO()
    result = runner.run_gpu(opts, out=log)
    if hd:
        where = f"live on {result['meta']['gpu']}: Chord and upstream Humming ({hd}) in the same run"
    else:
        where = f"live on {result['meta']['gpu']}: Chord only; {INSTALL_HINT}"
    return result, where


def show_comparison(scenario: str, family: str, *, humming_dir: str | None = None, quick: bool = True):
    """The comparison cell of a notebook: shows where the numbers come from and the bench's table
    for that cell (chord.lab.workbench.tables), and returns the pivoted row (gate_up + down µs of
    each provider, speed-up)."""
    from chord.lab.bench import report
    from chord.lab.workbench.tables import show_bench

    result, where = compare(scenario, family, humming_dir=humming_dir, quick=quick)
    show_bench(result, where)
    cells = report.pivot(result)
    return cells[0] if cells else None
