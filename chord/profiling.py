"""NVTX ranges in the `chord` domain, named `chord/<op>[<schedule id>]`.

Uses the `nvtx` package when present, else `torch.cuda.nvtx`, else nothing. Ranges are only
emitted when profiling is switched on (`CHORD_NVTX=1` or :func:`enable_nvtx`), so the serving
path pays one boolean test per call otherwise.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from chord._env import flag

DOMAIN = "chord"
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

            _backend = ("nvtx", nvtx.get_domain(DOMAIN))
        except Exception:  # noqa: BLE001 - optional dependency
            try:
                import torch

                _backend = ("torch", None) if torch.cuda.is_available() else ("none", None)
            except Exception:  # noqa: BLE001
                _backend = ("none", None)
    return _backend


def range_name(op: str, schedule_id: str | None = None) -> str:
    return f"chord/{op}[{schedule_id}]" if schedule_id else f"chord/{op}"


_record_function = False  # also open a torch.profiler range of the same name (chord.lab.capture)


def record_function_ranges(on: bool = True) -> None:
    """Mirror every NVTX range as a torch.profiler record_function range (torch.profiler does not
    see NVTX), so a torch trace shows the same `chord/<op>[<schedule id>]` ranges as Nsight."""
    global _record_function
    _record_function = on


@contextlib.contextmanager
def nvtx_range(op: str, schedule_id: str | None = None) -> Iterator[None]:
    if not _enabled:
        yield
        return
    if _record_function:
        import torch

        with torch.profiler.record_function(range_name(op, schedule_id)):
            with _nvtx_only(op, schedule_id):
                yield
        return
    with _nvtx_only(op, schedule_id):
        yield


@contextlib.contextmanager
def _nvtx_only(op: str, schedule_id: str | None) -> Iterator[None]:
    kind, domain = _resolve()
    name = range_name(op, schedule_id)
    if kind == "nvtx":
        import nvtx  # type: ignore

        # the package's public functions (its EventAttributes class is not exported at the
        # top level: nvtx 0.2.17 has it only in nvtx._lib)
        nvtx.push_range(message=name, domain=DOMAIN)
        try:
            yield
        finally:
            nvtx.pop_range(domain=DOMAIN)
    elif kind == "torch":
        import torch

        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
    else:
        yield
