"""Chord: W4A16 Mixture-of-Experts GEMM kernels for Kimi K2.x on NVIDIA Hopper.

Light at import: torch only. Kernels compile on first use (or with `chord precompile`).

The kernel library is this package's core (`chord.ops`, `chord.schedule`, ...); what measures,
tunes and shows it is `chord.lab` (docs/architecture.md, "Core and lab").
"""
from __future__ import annotations

from chord import _moved

__version__ = "0.1.0"

_moved.install()  # the lab's earlier import paths (chord.bench, chord.workbench, ...) for one release

__all__ = ["__version__"]
