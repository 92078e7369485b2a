"""The research workbench's building blocks: what the notebooks call.

* :mod:`chord.lab.workbench.explore` — pure functions of host integers: the schedule decision of a
  shape, sweeps over tokens per expert (block_m, padding, tiles vs SMs, wave efficiency),
  ablation schedules from :mod:`chord.optimizations`;
* :mod:`chord.lab.workbench.figures` — pure functions from those rows (or a bench result) to plotly
  figures, and the decision as HTML;
* :mod:`chord.lab.workbench.widgets` — ipywidgets builders: sliders -> decision -> a plotly
  ``FigureWidget`` updated in place;
* :mod:`chord.lab.workbench.data` — the one predicate that says whether live GPU cells can run, and
  the committed H200 results the notebooks fall back to without a GPU.

Nothing here holds a kernel, a heuristic or a timing loop of its own: decisions come from
``chord.schedule``, measurements from ``chord.lab.bench``.
"""
from chord.lab.workbench.data import (best_by, gpu_available, knob_pairs, recorded_capture, recorded_file,
                                      recorded_results, recorded_timing, recorded_tuning, where_results_come_from)
from chord.lab.workbench.explore import SMS_H200, decision_row, sweep_tok_e

__all__ = ["best_by", "gpu_available", "knob_pairs", "recorded_capture", "recorded_file", "recorded_results", "recorded_timing", "recorded_tuning", "where_results_come_from", "SMS_H200",
           "decision_row", "sweep_tok_e"]
