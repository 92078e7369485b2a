"""Chord's lab: what measures, tunes, shows and reports on the kernel library, and the command line.

* :mod:`chord.lab.bench` -- suites, timing, floors, the upstream-Humming baseline, reports (``chord bench``)
* :mod:`chord.lab.tune` -- candidate schedules timed per GEMM, tuned profiles (``chord tune``)
* :mod:`chord.lab.capture`, :mod:`chord.lab.timeline` -- profiler captures and their timelines (``chord capture``)
* :mod:`chord.lab.limits` -- Nsight Compute counters per GEMM (``chord limits``)
* :mod:`chord.lab.precompile` -- the kernels a GPU run needs, built and packed (``chord precompile``)
* :mod:`chord.lab.variant` -- a profile with knobs set on every rule (``chord variant``)
* :mod:`chord.lab.doctor` -- will this installation serve (``chord doctor``)
* :mod:`chord.lab.workbench` -- what the notebooks call
* :mod:`chord.lab.cli`, :mod:`chord.lab._args` -- the ``chord`` command and its flag checks (the
  console script's entry is :mod:`chord.cli`)

The lab imports the core (``chord.ops``, ``chord.schedule``, ...); nothing outside ``chord/lab``
imports the lab, except the command's entry ``chord.cli`` (docs/architecture.md, "Core and lab").
The earlier import paths (``chord.bench``, ``chord.workbench``, ``chord.tune``, ...) still work
for one release, with a DeprecationWarning naming the new one (:mod:`chord._moved`).
"""
