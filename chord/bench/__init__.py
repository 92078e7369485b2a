"""Chord's benchmark: suites, timing, floors, the Humming comparison and reports.

Light at import (torch only, and only where a submodule needs it). The pieces:

* :mod:`chord.bench.suite`     -- load a suite JSON, pick scenarios by id and families
* :mod:`chord.bench.inputs`    -- a scenario's routing, activations and weights from a seed
* :mod:`chord.bench.ceilings`  -- measured copy bandwidth and dense bf16 matmul rate
* :mod:`chord.bench.floors`    -- memory / compute floors of a scenario
* :mod:`chord.bench.timing`    -- ``triton.testing.do_bench`` wrapper (p20/p50/p80)
* :mod:`chord.bench.humming_baseline` -- upstream Humming, driven as vLLM 0.33 drives it
  (run as a subprocess: ``python -m chord.bench.humming_baseline``)
* :mod:`chord.bench.runner`    -- ``chord bench``: run a suite, long-format result rows
* :mod:`chord.bench.report`    -- terminal table, JSON, HTML (plotly when installed)
"""
from __future__ import annotations

__all__ = ["suite", "inputs", "ceilings", "floors", "timing", "runner", "report", "humming_baseline"]
