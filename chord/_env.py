"""Chord's environment switches, parsed one way everywhere.

A boolean switch (``CHORD_PTXAS_CHECK``, ``CHORD_DUMP_SASS``, ``CHORD_PRINT_SCHEDULES``,
``CHORD_NVTX``, ``CHORD_CHECK_ROUTING``, ``CHORD_HUMMING_CPU_REFERENCE``) is on for ``1``,
``true``, ``yes`` or ``on`` and off when unset, empty, ``0``, ``false``, ``no`` or ``off`` (any
case, surrounding spaces ignored); any other value raises a ``ValueError`` naming the variable,
so a typo never silently switches a feature on or off. ``CHORD_CHECK_ROUTING`` alone is on when
unset (routing values are checked unless switched off).

``CHORD_TILE_GROUP`` (1, 2, 4 or 8; default 8) caps the tile group G that ``chord.formats`` packs
the weight layout with, for the layout's ablation only; the weights carry their G (qweight's
dimension 3) and ``chord.ops`` launches the kernel built for it.
"""
from __future__ import annotations

import os

_ON = ("1", "true", "yes", "on")
#: the boolean switches Chord reads (``chord.cli`` checks them all before a command runs)
SWITCHES = ("CHORD_PTXAS_CHECK", "CHORD_DUMP_SASS", "CHORD_PRINT_SCHEDULES", "CHORD_NVTX", "CHORD_CHECK_ROUTING",
            "CHORD_HUMMING_CPU_REFERENCE", "CHORD_FAST_LAUNCH")
_OFF = ("", "0", "false", "no", "off")


def parse_flag(name: str, value: str | None) -> bool:
    """The boolean meaning of `value` for the environment variable `name`."""
    if value is None:
        return False
    v = value.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise ValueError(f"environment variable {name}={value!r}: expected one of "
                     f"{', '.join(_ON)} (on) or {', '.join(repr(x) for x in _OFF)} (off)")


def flag(name: str, default: bool = False) -> bool:
    """Whether the boolean switch `name` is on in the current environment (`default` when unset)."""
    value = os.environ.get(name)
    return default if value is None else parse_flag(name, value)


TILE_GROUPS = (1, 2, 4, 8)  # legal tile groups G of the weight layout (chord.formats)


def tile_group_max() -> int:
    """The cap of the weight layout's tile group, ``CHORD_TILE_GROUP`` (default 8)."""
    value = os.environ.get("CHORD_TILE_GROUP")
    if value is None or value.strip() == "":
        return 8
    try:
        g = int(value)
    except ValueError:
        g = 0
    if g not in TILE_GROUPS:
        raise ValueError(f"environment variable CHORD_TILE_GROUP={value!r}: expected one of 1, 2, 4, 8")
    return g
