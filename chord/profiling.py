"""NVTX ranges in the `chord` domain, named `chord/<op>[<schedule id>]`.

Uses the `nvtx` package when present, else `torch.cuda.nvtx`, else nothing. Ranges are only
emitted when profiling is switched on (`CHORD_NVTX=1` or :func:`enable_nvtx`), so the serving
path pays one boolean test per call otherwise.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from chord._env import flag

_enabled = flag("CHORD_NVTX")
_backend = None  # resolved lazily: ("nvtx", domain) | ("torch", None) | ("none", None)


def enable_nvtx(on: bool = True) -> None:
    global _enabled
    _enabled = on


def nvtx_enabled() -> bool:
    return _enabled


def _resolve():
    global _backend
    if _backend is None:
        try:
            import nvtx  # type: ignore

            _backend = ("nvtx", nvtx.get_domain("chord"))
        except Exception:  # noqa: BLE001 - optional dependency
            try:
                import torch

                _backend = ("torch", None) if torch.cuda.is_available() else ("none", None)
            except Exception:  # noqa: BLE001
                _backend = ("none", None)
    return _backend


def range_name(op: str, schedule_id: str | None = None) -> str:
    return f"chord/{op}[{schedule_id}]" if schedule_id else f"chord/{op}"


@contextlib.contextmanager
def nvtx_range(op: str, schedule_id: str | None = None) -> Iterator[None]:
    if not _enabled:
        yield
        return
    kind, domain = _resolve()
    name = range_name(op, schedule_id)
    if kind == "nvtx":
        import nvtx  # type: ignore

        attr = nvtx.EventAttributes(message=name)
        rng = domain.start_range(attr)
        try:
            yield
        finally:
            domain.end_range(rng)
    elif kind == "torch":
        import torch

        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
    else:
        yield
