"""Chord's benchmark: suites, timing, floors, the Humming comparison and reports.

Light at import (torch only, and only where a submodule needs it). The pieces:

* :mod:`chord.lab.bench.suite`     -- load a suite JSON, pick scenarios by id and families
* :mod:`chord.lab.bench.inputs`    -- a scenario's routing, activations and weights from a seed
* :mod:`chord.lab.bench.ceilings`  -- measured copy bandwidth and dense bf16 matmul rate
* :mod:`chord.lab.bench.floors`    -- memory / compute floors of a scenario
* :mod:`chord.lab.bench.timing`    -- ``triton.testing.do_bench`` wrapper (p20/p50/p80)
* :mod:`chord.lab.bench.humming_baseline` -- upstream Humming as the baseline: spawns its worker
  (:mod:`chord.lab.bench.humming_worker`, a child process) and reads its rows; never imports ``humming``
* :mod:`chord.lab.bench.vllm_sequence` -- vLLM 0.33's load and call sequence over a ``humming`` root
* :mod:`chord.lab.bench.one_gemm`, :mod:`chord.lab.bench.host_time`, :mod:`chord.lab.bench.layout_ablation`
  -- ``chord bench --gemm``, ``--host-time``, ``--layout-ablation``
* :mod:`chord.lab.bench.runner`    -- ``chord bench``: run a suite, long-format result rows
* :mod:`chord.lab.bench.report`    -- terminal table, JSON, HTML (plotly when installed)
"""
from __future__ import annotations

__all__ = ["suite", "inputs", "ceilings", "floors", "timing", "runner", "report", "humming_baseline", "humming_worker",
           "vllm_sequence", "one_gemm", "host_time", "layout_ablation"]
