"""Chord's ``humming`` module root: vLLM 0.33's Humming MoE backend, running Chord's kernels.

vLLM imports this package through its lazy facade (``vllm.utils.humming``) when a model is
served with ``--quantization humming`` or ``--moe-backend humming``. Every name of that facade
resolves here; only W4A16 (4-bit symmetric integer weights, group 32 along K, bf16 scales,
bf16 activations) is served, everything else raises at load time naming the scheme.

Importing this package is light: no torch, no CUDA initialisation, no kernel compilation.
Submodules (``humming.config``, ``humming.schema``, ...) import torch when vLLM reaches them;
kernels compile on first use (or ahead of time with ``chord precompile``).

This package owns the import name ``humming``. It cannot be installed next to upstream
``humming-kernels``, which owns the same name; that is checked here, at import.
"""
from __future__ import annotations

import importlib.metadata as _metadata

_UPSTREAM_DIST = "humming-kernels"


def _upstream_version() -> str | None:
    try:
        return _metadata.version(_UPSTREAM_DIST)
    except _metadata.PackageNotFoundError:
        return None


def _check_not_coinstalled() -> None:
    upstream = _upstream_version()
    if upstream is not None:
        raise ImportError(
            f"chord-moe and {_UPSTREAM_DIST} {upstream} are both installed, and both provide the Python "
            "package 'humming'; they cannot be installed together (files of one overwrite the other). "
            f"Run `pip uninstall -y {_UPSTREAM_DIST} chord-moe && pip install chord-moe` to serve with Chord, "
            f"or `pip uninstall -y chord-moe` to use upstream Humming. To benchmark upstream Humming next to "
            f"Chord, install it into its own folder (`pip install --no-deps --target DIR {_UPSTREAM_DIST}`) "
            "and run it in a subprocess with PYTHONPATH=DIR."
        )


_check_not_coinstalled()


def _own_version() -> str:
    try:
        return _metadata.version("chord-moe")
    except _metadata.PackageNotFoundError:
        return "0.0.0+chord.source"


__version__ = _own_version()

#: What this ``humming`` is (vLLM never reads it; people and bug reports do).
BACKEND = "chord"

__all__ = ["__version__", "BACKEND"]
