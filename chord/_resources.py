"""Where the non-Python parts of Chord live (kernel headers, tuned profiles).

In a source checkout / editable install they are the top-level ``csrc/`` and ``profiles/``
folders; a wheel carries copies under ``chord/_data/`` (see setup.py).
"""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for cand in (_PKG / "_data" / name, _PKG.parent / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"chord resource folder {name!r} not found next to {_PKG}")


def csrc_dir() -> Path:
    return _find("csrc")


def profiles_dir() -> Path:
    return _find("profiles")
