"""The GPU fuzz's schedule pool (tests/gpu/test_fuzz_gpu.py fuzz_pool), checked on CPU: every knob
with an off value is switched on by at least one schedule of every family it applies to, so a new
knob cannot land without fuzz cases (building the pool needs no GPU)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from chord.schedule import FAMILIES, KNOB


@pytest.fixture(scope="module")
def fuzz():
    path = Path(__file__).resolve().parent / "gpu" / "test_fuzz_gpu.py"
    spec = importlib.util.spec_from_file_location("fuzz_pool_of_the_gpu_fuzz", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("family", FAMILIES)
def test_pool_covers_every_knob(fuzz, family):
    pool = fuzz.fuzz_pool(family)
    for knob in KNOB.values():
        if knob.name == "tma_x" and family == "indexed":  # gathered rows: no tensor map (refused)
            continue
        if knob.name == "stream_k" and family != "indexed":  # the indexed family's (refused elsewhere)
            continue
        if knob.off is not None:
            assert any(getattr(s, knob.name) != knob.off for s in pool), (family, knob.name)
            if knob.name == "queue":  # on by default: its off side (the work queue) is the new kernel
                assert any(s.queue == knob.off for s in pool), family
