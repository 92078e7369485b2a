"""Chord: W4A16 Mixture-of-Experts GEMM kernels for Kimi K2.x on NVIDIA Hopper.

Light at import: torch only. Kernels compile on first use (or with `chord precompile`).
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
